//! The whole mesh in one process over several windows: the trainer trains on
//! each closed window once and publishes, the checkpoint advances and every
//! miner follows it; a trainer killed mid-run resumes without training any
//! window twice; the status API reports it all.

use std::collections::BTreeSet;

use edge_miner::run::RunEvent;
use tributary_tests::{AlternateReward, Mesh, MeshConfig, MinerSpec, NetConfig, TrainerHandle, http_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_advances_every_window_and_miners_follow() {
    // The random tiny model never answers right: the reward hook gives the
    // trainer a learning signal (no validator runs in this mesh).
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 16, ..NetConfig::new(4_000, 600, 2, 4) },
        miners: vec![MinerSpec::with("a", AlternateReward), MinerSpec::with("b", AlternateReward)],
        trainer: true,
        validator: false,
    })
    .await;
    let mut trained = BTreeSet::new();
    let mut published = Vec::new();
    for k in 0..4 {
        if k == 2 {
            // Kill the trainer (not a polite stop) and start it again on its folder.
            let t = mesh.trainer.take().expect("trainer");
            let cfg = t.kill().await;
            mesh.trainer = Some(TrainerHandle::spawn(cfg));
        }
        let (windows, window, id) = mesh.trainer.as_mut().expect("trainer").next_published(120).await;
        for w in &windows {
            assert!(trained.insert(*w), "window {w} trained twice");
        }
        if let Some((prev_window, _)) = published.last() {
            assert!(window > *prev_window, "one publication per window");
        }
        published.push((window, id));
        for m in &mut mesh.miners {
            m.wait_for(120, |e| match e {
                RunEvent::Submitted { checkpoint, refused, .. } => {
                    assert!(tributary_tests::honest_refusals(refused), "{refused:?}");
                    *checkpoint == id
                }
                _ => false,
            })
            .await;
        }
    }
    // Trained windows are consecutive and each was trained on once.
    let first = *trained.first().expect("trained");
    assert_eq!(trained.iter().copied().collect::<Vec<_>>(), (first..first + trained.len() as u64).collect::<Vec<_>>());
    // The coordinator relays genesis and every publication; the status API shows them.
    let status = http_json(mesh.net.node.http, "/api/status").await;
    let ids: Vec<String> = status["checkpoints"].as_array().expect("checkpoints").iter().map(|c| c["id"].as_str().unwrap_or("").to_string()).collect();
    for (_, id) in &published {
        assert!(ids.contains(&id.to_string()), "{id} not in {ids:?}");
    }
    assert_eq!(status["miners"].as_array().expect("miners").len(), 2);
    let closed: Vec<&serde_json::Value> =
        status["windows"].as_array().expect("windows").iter().filter(|w| w["closed"] == true && w["rollouts"].as_u64() > Some(0)).collect();
    assert!(closed.len() >= 3, "{closed:?}");
    for w in closed {
        // AlternateReward: half of each group scores 1.
        assert_eq!(w["mean_reward"].as_f64(), Some(0.5), "{w}");
    }
    for m in status["miners"].as_array().expect("miners") {
        assert!(m["accepted"].as_u64() > Some(0));
        assert!(m["rollouts_per_min"].as_f64() > Some(0.0));
    }
    mesh.stop().await;
}
