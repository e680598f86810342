//! SIGTERM (systemd's stop) to the coordinator process while a miner
//! streams groups: it drains in order and exits 0 within seconds, and after
//! a restart on the same folder every rollout the miner got acknowledged is
//! in the store. Before the shared stop-signal handler, SIGTERM killed the
//! process (no exit status, nothing drained).

use std::path::Path;

use edge_miner::run::RunEvent;
use edge_miner::uplink::UplinkConfig;
use tributary_tests::{CoordinatorProcess, Miner, NetConfig, http_json, miner_config, seeded_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_coordinator_and_exits_0() {
    tributary_tests::test_tracing();
    let exe = Path::new(env!("CARGO_BIN_EXE_mesh-coordinator"));
    let dir = tempfile::tempdir().expect("temporary folder");
    let data = dir.path().join("coordinator");
    // Many small groups per window: the miner is submitting when the signal comes.
    let cfg = NetConfig { max_new_tokens: 8, ..NetConfig::new(6_000, 600, 400, 4) };
    let first = CoordinatorProcess::spawn(exe, &data, &cfg, 0);
    let (quic, fingerprint) = (first.quic, first.fingerprint.clone());
    let genesis_bytes = coordinator::node::dev_tiny_bytes().expect("tiny model");
    let key = seeded_key(0, "m");
    let rc =
        miner_config(dir.path(), UplinkConfig::new(quic, fingerprint.clone()), "m", key.clone(), Some(&genesis_bytes));
    let mut miner = Miner::spawn(rc);
    miner.wait_for(120, |e| matches!(e, RunEvent::Submitted { stored, .. } if *stored > 0)).await;

    let t = std::time::Instant::now();
    let status = first.terminate(20).await;
    eprintln!("SIGTERM to exit: {:?}", t.elapsed());
    assert!(status.success(), "SIGTERM: the coordinator ended with {status} (not an orderly exit 0)");
    // The database was closed, not left for redb to repair at the next open.
    let repaired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = repaired.clone();
    let db = redb::Builder::new()
        .set_repair_callback(move |_| flag.store(true, std::sync::atomic::Ordering::Relaxed))
        .create(data.join("coordinator.redb"))
        .expect("opening the database");
    drop(db);
    assert!(!repaired.load(std::sync::atomic::Ordering::Relaxed), "the database needed a repair after SIGTERM");
    // Every acknowledgement the miner got came before the exit.
    miner.drain();
    let acked = miner.acked;
    assert!(acked > 0);

    let second = CoordinatorProcess::spawn(exe, &data, &cfg, quic.port());
    assert_eq!(second.fingerprint, fingerprint, "same certificate after restart");
    let miners = http_json(second.http, "/api/miners").await;
    let restored = miners[key.public().to_string()]["accepted"].as_u64().unwrap_or(0);
    assert!(restored >= acked, "{acked} acknowledged, {restored} in the store after the restart");
    // The restarted coordinator stops the same way, idle or not.
    let status = second.terminate(20).await;
    assert!(status.success(), "second SIGTERM: {status}");
    // Its coordinator gone, the miner stops too (within its submit grace).
    let t = std::time::Instant::now();
    miner.stop().await;
    eprintln!("miner stop: {:?}", t.elapsed());
}
