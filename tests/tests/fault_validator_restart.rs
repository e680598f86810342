//! Issue #8 item 2: the validator is killed (its task aborted wherever it
//! is: fetching, proving or posting) mid-window and restarted on its folder.
//! It resumes from its saved progress: every window gets exactly one
//! verdict per miner from it, and no window is verified and posted twice.

use std::time::Duration;

use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, ValidatorHandle};
use validator::service::Progress;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_validator_restart() {
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 12, ..NetConfig::new(3_000, 500, 2, 2) },
        miners: vec![MinerSpec::honest("a"), MinerSpec::honest("b")],
        trainer: false,
        validator: true,
    })
    .await;
    let keys: Vec<_> = mesh.miners.iter().map(|m| m.key.public()).collect();
    let mut verified = vec![mesh.validator().next_report(90).await];
    // Kill it while the next window's verification is due or under way: just
    // after the window it verifies next closes.
    let due = mesh.net.node.shared.core().schedule().closes_at(verified[0].window + 1);
    let now = coordinator::server::now_ms();
    tokio::time::sleep(Duration::from_millis(due.saturating_sub(now) + 150)).await;
    let (cfg, unread) = mesh.validator.take().expect("validator").kill().await;
    verified.extend(unread);
    let saved = Progress::load(&cfg.dir).expect("progress.json").expect("progress saved");
    eprintln!(
        "killed; saved progress: next window {}, {} verdicts of it posted",
        saved.next_window,
        saved.posted.len()
    );
    let killed_in = mesh.net.window();

    let mut v = ValidatorHandle::spawn(cfg);
    while verified.last().is_none_or(|r| r.window < killed_in + 2) {
        verified.push(v.next_report(90).await);
    }
    mesh.validator = Some(v);
    // Every window verified once, in order, none skipped.
    let windows: Vec<u64> = verified.iter().map(|r| r.window).collect();
    let first = windows[0];
    assert_eq!(windows, (first..first + windows.len() as u64).collect::<Vec<_>>(), "windows verified: {windows:?}");
    let last = *windows.last().expect("windows");
    let validator_key = tributary_protocol::dev::key(tributary_protocol::wire::Role::Validator).public();
    {
        let core = mesh.net.node.shared.core();
        for w in first..=last {
            for k in &keys {
                if core.progress(w, k).is_empty() {
                    continue;
                }
                let vs = core.verdicts_on(w, k);
                assert_eq!(vs.len(), 1, "window {w} miner {}: {vs:?}", k.short());
                assert_eq!(vs[0].validator, validator_key);
                assert!(!vs[0].hard_failure && vs[0].valid == vs[0].checked && vs[0].checked > 0, "{:?}", vs[0]);
            }
        }
        // Both miners mined in every window after the first and were judged in them.
        for w in first + 1..=last {
            for k in &keys {
                assert!(!core.verdicts_on(w, k).is_empty(), "window {w}: no verdict on {}", k.short());
            }
        }
    }
    // The saved progress points past the last verified window.
    let (cfg, unread) = mesh.validator.take().expect("validator").kill().await;
    let after = Progress::load(&cfg.dir).expect("progress.json").expect("progress saved");
    let newest = unread.last().map_or(last, |r| r.window);
    assert_eq!(after.next_window, newest + 1);
    mesh.stop().await;
}
