//! `kill -9` the coordinator process mid-window with a miner and the trainer
//! connected, restart it on the same folder and port: every acknowledged
//! rollout is still there, the miner and the trainer carry on, and no window
//! is trained twice.

use std::collections::BTreeSet;
use std::path::Path;

use edge_miner::run::RunEvent;
use edge_miner::uplink::UplinkConfig;
use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_tests::{
    CoordinatorProcess, Miner, NetConfig, TrainerHandle, http_json, miner_config, seeded_key, trainer_config,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_mid_window_loses_nothing() {
    tributary_tests::test_tracing();
    let exe = Path::new(env!("CARGO_BIN_EXE_mesh-coordinator"));
    let dir = tempfile::tempdir().expect("temporary folder");
    let data = dir.path().join("coordinator");
    // The practice level gives the honest miner's groups reward variance to train on.
    let cfg = NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(4_000, 600, 2, 4) };
    let first = CoordinatorProcess::spawn(exe, &data, &cfg, 0);
    let (quic, fingerprint, genesis) = (first.quic, first.fingerprint.clone(), first.genesis);
    let genesis_bytes = coordinator::node::dev_tiny_bytes().expect("tiny model");
    let key = seeded_key(0, "m");
    let rc =
        miner_config(dir.path(), UplinkConfig::new(quic, fingerprint.clone()), "m", key.clone(), Some(&genesis_bytes));
    let mut miner = Miner::spawn(rc);
    let mut trainer =
        TrainerHandle::spawn(trainer_config(quic, &fingerprint, &dir.path().join("trainer"), &genesis_bytes));
    let (mut trained, _, _) = trainer.next_published(120).await;
    // Mid-window: the miner is streaming this window's groups, generated with
    // a trained checkpoint (the first publication or a newer one).
    miner.wait_for(120, |e| matches!(e, RunEvent::Submitted { checkpoint, .. } if *checkpoint != genesis)).await;
    miner.drain();
    let acked_before = miner.acked;
    first.kill9();

    let second = CoordinatorProcess::spawn(exe, &data, &cfg, quic.port());
    assert_eq!(second.fingerprint, fingerprint, "same certificate after restart");
    assert_eq!(second.genesis, genesis);
    // Everything acknowledged before the kill was restored from the database.
    let miners = http_json(second.http, "/api/miners").await;
    let restored = miners[key.public().to_string()]["accepted"].as_u64().unwrap_or(0);
    assert!(acked_before > 0);
    assert!(restored >= acked_before, "{acked_before} acknowledged, {restored} restored");
    let status = http_json(second.http, "/api/status").await;
    let stored: u64 =
        status["windows"].as_array().expect("windows").iter().map(|w| w["rollouts"].as_u64().unwrap_or(0)).sum();
    assert_eq!(stored, restored, "the database holds exactly the counted rollouts");

    // Both carry on: the trainer publishes again and the miner follows (to
    // that checkpoint or a newer one: a publication can be superseded before
    // its window opens).
    let mut windows = BTreeSet::new();
    windows.extend(trained.drain(..));
    // Every checkpoint published before the kill (restored by the coordinator).
    let mut older: BTreeSet<String> = status["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter_map(|c| c["id"].as_str().map(str::to_string))
        .collect();
    assert!(older.contains(&genesis.to_string()) && older.len() >= 2, "{older:?}");
    for _ in 0..2 {
        let (t, _, id) = trainer.next_published(180).await;
        for w in t {
            assert!(windows.insert(w), "window {w} trained twice");
        }
        miner
            .wait_for(
                120,
                |e| matches!(e, RunEvent::Submitted { checkpoint, .. } if !older.contains(&checkpoint.to_string())),
            )
            .await;
        older.insert(id.to_string());
    }
    let status = http_json(second.http, "/api/status").await;
    let m = &status["miners"][0];
    assert_eq!(m["key"], key.public().to_string());
    // Refusals: at most re-sent slots the coordinator already held (stored but
    // not acknowledged when it died), identical completions, and groups
    // generated while it was down that arrived after their window closed.
    for (reason, _) in m["refused_by_reason"].as_object().expect("reasons") {
        assert!(["duplicate", "replayed_content", "wrong_window"].contains(&reason.as_str()), "{reason}");
    }
    trainer.kill().await;
    miner.stop().await;
}
