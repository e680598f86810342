//! `trainer run` against a `--dev` coordinator with a real miner: the trainer
//! pulls the miner's rollouts of each closed window, takes a GRPO step on the
//! tiny model, publishes, and the miner swaps to the published checkpoint.

use std::time::Duration;

use edge_miner::run::RunEvent;
use trainer::service::{Service, ServiceConfig};
use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_tests::{Miner, Net, NetConfig, within};

/// A `--dev` trainer of `net` (the genesis written to the net's folder, a
/// high learning rate for the tiny model) with `select`.
fn service_config(net: &Net, select: trainer::select::SelectConfig) -> ServiceConfig {
    let genesis = net.dir.path().join("genesis.gguf");
    std::fs::write(&genesis, &net.genesis_bytes).unwrap();
    ServiceConfig {
        coordinator: net.node.quic,
        fingerprint: net.node.fingerprint.clone(),
        coordinator_key: tributary_net::KeyPin::Any,
        key: tributary_protocol::dev::key(tributary_protocol::wire::Role::Trainer),
        dir: net.dir.path().join("trainer"),
        genesis,
        train: trainer::train::TrainConfig { lr: 1e-3, warmup_steps: 1, ..Default::default() },
        select,
        full_every: 8,
        trust_unjudged: true,
        poll: Duration::from_millis(200),
        device: tch::Device::Cpu,
        keep_publications: 8,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainer_publishes_and_miners_follow() {
    // The random tiny model never answers right: the practice level's
    // partial credit (shorter wrong answers earn more) gives the groups the
    // reward variance a step needs. (A miner hook that rewrote the rewards
    // used to stand in for it; the trainer now recomputes every reward.)
    let net =
        Net::with(NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(3_000, 500, 2, 4) })
            .await;
    let mut m = Miner::spawn(net.miner("m", true));
    let cfg = service_config(&net, trainer::select::SelectConfig::new(49152));
    let mut s = within(30, Service::open(cfg.clone())).await.unwrap();
    // Rounds until a checkpoint is published (needs a closed window with a
    // group whose rewards differ; the tiny model rarely answers right, so allow time).
    let published = within(90, async {
        loop {
            let r = s.round().await.unwrap();
            if let Some(p) = r.published {
                // A stepping round times each of its phases (the
                // histogram and its log line); the proof is part of taking.
                let t = r.times;
                assert!(t.take > 0.0 && t.step > 0.0 && t.export > 0.0 && t.save > 0.0 && t.upload > 0.0, "{t:?}");
                assert!(t.prove > 0.0 && t.prove <= t.take, "{t:?}");
                return p;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    drop(s);
    // The miner swaps to it and generates on it.
    m.wait_for(60, |e| matches!(e, RunEvent::Submitted { checkpoint, .. } if *checkpoint == published.1)).await;
    // Resumable: a restarted service keeps its progress and never republishes the window.
    let s2 = within(30, Service::open(cfg)).await.unwrap();
    assert_eq!(s2.progress().uploaded, Some(published.0));
    m.stop().await;
}

/// `min_train_groups`: a round whose proven groups are fewer than the floor
/// publishes nothing and keeps them (on disk: a restarted service keeps them
/// too); the step that reaches the floor trains on them with the later
/// windows' groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waits_for_its_floor_of_groups_across_windows_and_restarts() {
    const FLOOR: usize = 3;
    let net =
        Net::with(NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(3_000, 500, 2, 4) })
            .await;
    let m = Miner::spawn(net.miner("m", true));
    let cfg = service_config(
        &net,
        trainer::select::SelectConfig { min_train_groups: FLOOR, ..trainer::select::SelectConfig::new(49152) },
    );
    let dir = cfg.dir.clone();
    let mut s = within(30, Service::open(cfg.clone())).await.unwrap();
    // Windows whose groups were kept, and whether the service was restarted
    // while it kept some.
    let mut kept_windows = Vec::new();
    let mut restarted = false;
    let (round, published) = within(150, async {
        loop {
            let r = s.round().await.unwrap();
            if let Some(p) = r.published {
                return (r, p);
            }
            if r.pending > 0 {
                assert!(r.pending < FLOOR, "{} groups kept below a floor of {FLOOR}", r.pending);
                assert!(dir.join("pending.postcard").exists());
                kept_windows.extend(r.windows.iter().copied());
                if !restarted {
                    // The kept groups survive a restart.
                    drop(s);
                    s = within(30, Service::open(cfg.clone())).await.unwrap();
                    restarted = true;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(round.groups >= FLOOR, "a step on {} groups, below the floor of {FLOOR}", round.groups);
    assert!(restarted, "no round kept groups below the floor (each window holds at most 2 of the 3 a step needs)");
    assert!(!dir.join("pending.postcard").exists(), "the step left its kept groups behind");
    // The step trained on the kept windows' groups, across the restart.
    let batch = trainer::service::batch_records(&dir).unwrap().into_iter().find(|b| b.window == published.0).unwrap();
    assert!(batch.trained.len() >= 2, "one window cannot hold {FLOOR} groups: trained {:?}", batch.trained);
    assert!(
        kept_windows.iter().any(|w| batch.trained.contains(w)),
        "the step took none of the kept windows {kept_windows:?}: trained {:?}",
        batch.trained
    );
    assert_eq!(batch.digests.len(), round.groups * 4);
    m.stop().await;
}
