//! The coordinator's live status page, loaded from a running mesh (a miner
//! and the real trainer) in headless Chromium: after its script ran, the DOM
//! shows the window, the miners with their counts, the reward chart, the
//! training loss curve with a point per step the trainer reported, and the
//! checkpoint/delta history. The signed weights document fetched from
//! `/api/weights` verifies with the coordinator's key; tampered copies do not.
//!
//! With `DASHBOARD_SCREENSHOT=PATH` the test also saves a screenshot of the
//! page (how `docs/dashboard.png` is made); `DASHBOARD_STEPS=N` waits for N
//! training steps instead of 2 first.

use std::process::Command;

use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::wire::{WeightsDoc, WeightsDocError};
use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, http_json, within};

/// Runs headless Chromium on `url` with `budget_ms` of virtual time and `extra` arguments.
fn chromium(url: &str, budget_ms: u32, extra: &[&str]) -> std::process::Output {
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
        .args(extra)
        .arg(url)
        .output()
        .expect("running chromium (installed by scripts/setup.sh)");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Headless Chromium's DOM of `url` after `budget_ms` of virtual time.
fn dump_dom(url: &str, budget_ms: u32) -> String {
    String::from_utf8_lossy(&chromium(url, budget_ms, &["--dump-dom"]).stdout).into_owned()
}

/// The `<svg …>…</svg>` element labelled `label` in `dom`.
fn svg<'a>(dom: &'a str, label: &str) -> &'a str {
    let at = dom.find(&format!("aria-label=\"{label}\"")).unwrap_or_else(|| panic!("chart {label} missing: {dom}"));
    let start = dom[..at].rfind("<svg").expect("svg start");
    let end = at + dom[at..].find("</svg>").expect("svg end");
    &dom[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_renders_a_running_mesh() {
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(3_000, 500, 2, 4) },
        miners: vec![MinerSpec::honest("a")],
        trainer: true,
        validator: false,
    })
    .await;
    let miner = mesh.miners[0].key.public();
    let coordinator = mesh.net.node.shared.key.public();
    // Training steps, each published and reported to the coordinator (the
    // trainer sends its report before the round ends).
    let want: usize = std::env::var("DASHBOARD_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2).max(2);
    let trainer = mesh.trainer.as_mut().expect("trainer");
    let (_, first_window, _) = trainer.next_published(120).await;
    let (mut last_window, mut last_id) = (first_window, mesh.net.genesis);
    for _ in 1..want {
        (_, last_window, last_id) = trainer.next_published(120).await;
    }
    assert!(last_window > first_window);
    let training = http_json(mesh.net.node.http, "/api/training").await;
    let steps = training.as_array().expect("training reports");
    assert!(steps.len() >= 2, "{training}");
    let last = steps
        .iter()
        .find(|s| s["window"] == last_window)
        .unwrap_or_else(|| panic!("no report for {last_window}: {training}"));
    assert_eq!(last["checkpoint"], last_id.to_string());
    let loss = last["loss"].as_f64().expect("loss");
    assert!(loss.is_finite() && last["groups_kept"].as_u64() > Some(0), "{last}");
    assert!(steps.windows(2).all(|p| p[0]["step"].as_u64() < p[1]["step"].as_u64()), "{training}");
    // The miner's rollouts were stored (the reward curve has points).
    assert!(mesh.stats(&miner).accepted > 0);

    let url = format!("http://{}/", mesh.net.node.http);
    let page = url.clone();
    let before = mesh.net.window();
    let dom = within(120, tokio::task::spawn_blocking(move || dump_dom(&page, 3_000))).await.expect("chromium task");
    let after = mesh.net.window();
    assert!(!dom.contains("connecting…"), "the script never filled the page: {dom}");
    let key = miner.to_string();
    assert!(dom.contains(&format!("<code>{}</code>", &key[..12])), "miner row missing: {dom}");
    assert!(svg(&dom, "mean reward per window").contains("<circle"), "reward chart without points");
    // The loss curve: one point per reported step, drawn from real reports.
    let curve = svg(&dom, "training loss per window");
    let points = curve.matches("class=\"pt\"").count();
    assert!(points >= 2, "loss curve has {points} points: {curve}");
    assert!(curve.contains(&format!("data-points=\"{points}\"")), "{curve}");
    assert!(curve.contains("<path d=\"M"), "{curve}");
    assert!(svg(&dom, "entropy and clipping per window").matches("class=\"pt\"").count() >= 2 * 2);
    // The steps table shows the last report's loss (4 decimals) and the published checkpoint.
    assert!(dom.contains(&format!("<td>{loss:.4}</td>")), "loss {loss:.4} not in the steps table: {dom}");
    assert!(dom.contains(&last_id.to_string()[..12]), "published checkpoint missing");
    assert!(dom.contains("time left"));
    // The page explains itself: why a miner's weight is what it is, and what
    // "mean reward" and "solved" mean.
    assert!(dom.contains(">earning<") || dom.contains(">weight 0: "), "no weight reason in the miners table: {dom}");
    assert!(dom.contains("mean reward: the average reward") && dom.contains("solved: the share of"), "{dom}");
    // The trainer downloads checkpoints too, but it is not a miner.
    let trainer_key = tributary_protocol::dev::key(tributary_protocol::wire::Role::Trainer).public().to_string();
    let miners = http_json(mesh.net.node.http, "/api/miners").await;
    assert!(miners.get(&trainer_key).is_none(), "the trainer is listed as a miner: {miners}");
    assert!(miners.get(&key).is_some(), "{miners}");
    // Nothing overflows a 1,280 px wide window (the page records its scroll width).
    let page = url.clone();
    let narrow = within(
        120,
        tokio::task::spawn_blocking(move || {
            String::from_utf8_lossy(&chromium(&page, 3_000, &["--window-size=1280,900", "--dump-dom"]).stdout)
                .into_owned()
        }),
    )
    .await
    .expect("chromium task");
    let width: u32 = narrow
        .split_once("data-scroll-width=\"")
        .and_then(|(_, r)| r.split('"').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no scroll width recorded: {narrow}"));
    assert!(width <= 1280, "the page is {width} px wide at 1,280 px");
    // The window number the page shows is the coordinator's while it
    // rendered (3 s windows: under load chromium takes several).
    let shown: u64 = dom
        .split_once("<b id=\"window\">")
        .and_then(|(_, r)| r.split('<').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no window number: {dom}"));
    assert!((before.saturating_sub(1)..=after).contains(&shown), "window {shown} shown, {before}..={after}: {dom}");
    if let Ok(path) = std::env::var("DASHBOARD_SCREENSHOT") {
        let shot = format!("--screenshot={path}");
        within(120, tokio::task::spawn_blocking(move || chromium(&url, 3_000, &["--window-size=1280,1750", &shot])))
            .await
            .expect("screenshot task");
    }

    // The weights document of the latest interval, fetched over HTTP, verifies
    // with the coordinator's key (as the status page names it too).
    let doc_json = http_json(mesh.net.node.http, "/api/weights/signed").await;
    let hex = doc_json["document"].as_str().expect("document");
    let bytes: Vec<u8> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    let doc = WeightsDoc::decode_verified(&bytes, &coordinator).expect("the fetched document verifies");
    assert_eq!(doc_json["window"], doc.body.window);
    assert_eq!(doc_json["signature"], doc.signature.to_string());
    // The status is a snapshot at most a second old (dashboard::SNAPSHOT_MS):
    // it names the same interval once it is renewed.
    let mut status = http_json(mesh.net.node.http, "/api/status").await;
    for _ in 0..30 {
        if status["weights_interval"] == doc.body.window {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        status = http_json(mesh.net.node.http, "/api/status").await;
    }
    assert_eq!(status["coordinator"], coordinator.to_string());
    assert_eq!(status["weights_interval"], doc.body.window);
    assert!(doc.body.window + 2 <= mesh.net.window(), "interval {} signed early", doc.body.window);
    let same = http_json(mesh.net.node.http, &format!("/api/weights/signed?window={}", doc.body.window)).await;
    assert_eq!(same["document"], doc_json["document"]);
    // The operators' flat map (miner key → weight) is the latest document's.
    let flat = http_json(mesh.net.node.http, "/api/weights").await;
    assert_eq!(flat, doc_json["weights"]);
    // Tampered: the interval, a byte of the signature, or checked against another key.
    let mut moved = doc.clone();
    moved.body.window += 1;
    assert_eq!(WeightsDoc::decode_verified(&moved.encode(), &coordinator), Err(WeightsDocError::BadSignature));
    let mut flipped = bytes.clone();
    let n = flipped.len();
    flipped[n - 1] ^= 1;
    assert_eq!(WeightsDoc::decode_verified(&flipped, &coordinator), Err(WeightsDocError::BadSignature));
    assert_eq!(WeightsDoc::decode_verified(&bytes, &miner), Err(WeightsDocError::WrongCoordinator));
    mesh.stop().await;
}
