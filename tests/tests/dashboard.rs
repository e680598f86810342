//! The coordinator's live status page, loaded from a running mesh in headless
//! Chromium: after its script ran, the DOM shows the window, the miners with
//! their counts, the reward chart and the checkpoint/delta history.

use std::process::Command;
use std::time::Duration;

use edge_miner::run::RunEvent;
use tributary_protocol::delta;
use tributary_protocol::wire::Frame;
use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, id_of, perturbed, publish, trainer_session, within};

/// Headless Chromium's DOM of `url` after `budget_ms` of virtual time.
fn dump_dom(url: &str, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().expect("profile folder");
    let out = Command::new("timeout")
        .arg("90")
        .arg(std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into()))
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("running chromium (installed by scripts/setup.sh)");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_renders_a_running_mesh() {
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 16, ..NetConfig::new(3_000, 500, 1, 4) },
        miners: vec![MinerSpec::honest("a")],
        trainer: false,
        validator: false,
    })
    .await;
    // A published checkpoint (a delta) so the history has one.
    let next = perturbed(&mesh.net.genesis_bytes, 3, 300);
    let id = id_of(&next);
    let d = delta::encode_gguf(&mesh.net.genesis_bytes, &next, delta::DEFAULT_LEVEL).expect("delta");
    let mut t = trainer_session(&mesh.net).await;
    let ans = publish(&mut t, mesh.net.window(), id, Some(mesh.net.genesis), &d).await.expect("published");
    assert!(matches!(ans, Frame::CheckpointStored(_)), "{ans:?}");
    // Wait for a closed window with the miner's rollouts.
    let miner = mesh.miners[0].key.public();
    let first = match mesh.miners[0].wait_for(60, |e| matches!(e, RunEvent::Submitted { .. })).await {
        RunEvent::Submitted { window, .. } => window,
        _ => unreachable!(),
    };
    mesh.net.wait_window(30, first + 2).await;
    let url = format!("http://{}/", mesh.net.node.http);
    let dom = within(120, tokio::task::spawn_blocking(move || dump_dom(&url, 3_000))).await.expect("chromium task");
    assert!(!dom.contains("connecting…"), "the script never filled the page: {dom}");
    let key = miner.to_string();
    assert!(dom.contains(&format!("<code>{}</code>", &key[..12])), "miner row missing: {dom}");
    assert!(dom.contains("aria-label=\"mean reward per window\""), "reward chart missing");
    assert!(dom.contains(&id.to_string()[..12]), "published checkpoint missing");
    assert!(dom.contains("time left"));
    let accepted = mesh.stats(&miner).accepted;
    assert!(accepted > 0);
    // The window number the page shows is the coordinator's.
    let w = mesh.net.window();
    assert!(dom.contains(&format!("<b id=\"window\">{w}</b>")) || dom.contains(&format!("<b id=\"window\">{}</b>", w.saturating_sub(1))), "{dom}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    mesh.stop().await;
}
