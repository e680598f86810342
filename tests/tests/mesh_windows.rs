//! The whole mesh in one process over several windows: honest miners on the
//! practice level (the random tiny model earns a shaped reward the validator
//! recomputes), the validator proves every rollout and posts verdicts, the
//! trainer trains on each closed window once, only on verified rollouts, and
//! publishes; the checkpoint advances and every miner follows it; a trainer
//! killed mid-run resumes without training any window twice; the status API
//! reports it all.

use std::collections::BTreeSet;

use edge_miner::run::RunEvent;
use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::wire::MinerStanding;
use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, http_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_advances_every_window_and_miners_follow() {
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(4_000, 600, 2, 4) },
        miners: vec![MinerSpec::honest("a"), MinerSpec::honest("b")],
        trainer: true,
        validator: true,
    })
    .await;
    let keys: Vec<_> = mesh.miners.iter().map(|m| m.key.public()).collect();
    let mut trained = BTreeSet::new();
    let mut published = Vec::new();
    for k in 0..4 {
        if k == 2 {
            // Kill the trainer (not a polite stop) and start it again on its folder.
            mesh.trainer.as_mut().expect("trainer").restart().await;
        }
        let (windows, window, id) = mesh.trainer.as_mut().expect("trainer").next_published(120).await;
        for w in &windows {
            assert!(trained.insert(*w), "window {w} trained twice");
        }
        if let Some((prev_window, _)) = published.last() {
            assert!(window > *prev_window, "one publication per window");
        }
        // Every miner follows: it generates with this checkpoint or a newer
        // one (a publication can be superseded before its window opens).
        let older: BTreeSet<_> = std::iter::once(mesh.net.genesis).chain(published.iter().map(|(_, id)| *id)).collect();
        published.push((window, id));
        for m in &mut mesh.miners {
            m.wait_for(120, |e| match e {
                RunEvent::Submitted { checkpoint, refused, .. } => {
                    assert!(tributary_tests::honest_refusals(refused), "{refused:?}");
                    !older.contains(checkpoint)
                }
                _ => false,
            })
            .await;
        }
    }
    // Trained windows are consecutive and each was trained on once.
    let first = *trained.first().expect("trained");
    assert_eq!(trained.iter().copied().collect::<Vec<_>>(), (first..first + trained.len() as u64).collect::<Vec<_>>());
    // What was trained on was verified: every miner with rollouts in a trained
    // window has the validator's passing verdict on it.
    {
        let core = mesh.net.node.shared.core();
        let mut judged = 0;
        for w in &trained {
            for k in &keys {
                if core.progress(*w, k).is_empty() {
                    continue;
                }
                assert!(
                    core.standing(*w).contains(&(*k, MinerStanding::Passed)),
                    "window {w} miner {} not passed",
                    k.short()
                );
                judged += 1;
            }
        }
        assert!(judged >= 4, "{judged} verified (window, miner) pairs trained on");
    }
    // The coordinator relays genesis and every publication; the status API shows them.
    let status = http_json(mesh.net.node.http, "/api/status").await;
    let ids: Vec<String> = status["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| c["id"].as_str().unwrap_or("").to_string())
        .collect();
    for (_, id) in &published {
        assert!(ids.contains(&id.to_string()), "{id} not in {ids:?}");
    }
    assert_eq!(status["miners"].as_array().expect("miners").len(), 2);
    let closed: Vec<&serde_json::Value> = status["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .filter(|w| w["closed"] == true && w["rollouts"].as_u64() > Some(0))
        .collect();
    assert!(closed.len() >= 3, "{closed:?}");
    for w in closed {
        // The practice reward: a credit in (0, 1/2] for every wrong answer, 1 for a right one.
        let mean = w["mean_reward"].as_f64().expect("mean reward");
        assert!(mean > 0.0 && mean <= 1.0, "{w}");
    }
    for m in status["miners"].as_array().expect("miners") {
        assert!(m["accepted"].as_u64() > Some(0));
        assert!(m["rollouts_per_min"].as_f64() > Some(0.0));
    }
    mesh.stop().await;
}
