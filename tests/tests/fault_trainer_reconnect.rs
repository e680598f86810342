//! Issue 15 leftover: `trainer run` ended on the first network error. Here
//! the real `Service::run` (not the mesh's handle, which reopens a failed
//! service) trains against a coordinator process that is killed with
//! `kill -9` and restarted on the same folder and port a few windows later:
//! the run keeps going through the outage, reconnects, and goes on consuming
//! windows. On the old loop the first round during the outage returned the
//! error and the run ended.

use std::path::Path;
use std::time::Duration;

use tributary_tests::{CoordinatorProcess, NetConfig, trainer_config, within};

/// The next window the trainer will train on, from its `service.json`.
fn next_window(state: &Path) -> u64 {
    std::fs::read(state.join("service.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["next_window"].as_u64())
        .unwrap_or(0)
}

async fn until_next_window(state: &Path, secs: u64, at_least: u64) {
    within(secs, async {
        while next_window(state) < at_least {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainer_run_reconnects_after_the_coordinator_restarts() {
    let exe = Path::new(env!("CARGO_BIN_EXE_mesh-coordinator"));
    let dir = tempfile::tempdir().expect("temporary folder");
    let data = dir.path().join("coordinator");
    let cfg = NetConfig::new(1_500, 200, 1, 2);
    let first = CoordinatorProcess::spawn(exe, &data, &cfg, 0);
    let (quic, fingerprint) = (first.quic, first.fingerprint.clone());
    let genesis_bytes = coordinator::node::dev_tiny_bytes().expect("tiny model");
    let tc = trainer_config(quic, &fingerprint, &dir.path().join("trainer"), &genesis_bytes);
    let state = tc.dir.clone();
    let mut service = within(60, trainer::service::Service::open(tc)).await.expect("trainer opens");
    let start = service.progress().next_window;
    let stop = tokio_util::sync::CancellationToken::new();
    let flag = stop.clone();
    let mut task = tokio::spawn(async move { service.run(flag).await });

    // Connected: it consumes closed windows (no rollouts, nothing to train).
    until_next_window(&state, 30, start + 1).await;
    first.kill9();
    // Several windows close while the coordinator is gone: rounds fail.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    if task.is_finished() {
        let r = (&mut task).await.expect("trainer task");
        panic!("trainer run ended while the coordinator was down: {r:?}");
    }
    let second = CoordinatorProcess::spawn(exe, &data, &cfg, quic.port());
    assert_eq!(second.fingerprint, fingerprint);
    let at_restart = next_window(&state);
    within(90, async {
        while next_window(&state) < at_restart + 2 {
            if task.is_finished() {
                let r = (&mut task).await.expect("trainer task");
                panic!("trainer run ended (the outage's error reached it on its stale connection): {r:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    stop.cancel();
    let r = within(60, task).await.expect("trainer task");
    assert!(r.is_ok(), "{r:?}");
    second.kill9();
}
