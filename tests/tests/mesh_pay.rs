//! Issue 28 on loopback: a network pays only for proven work, even with one
//! validator. One honest miner and one that nudges its claimed rewards
//! inside the reward check's old tolerance of 1e-6 (review
//! incentives-and-proof-2 finding A: `[1e-6, 0, 0, 1e-6]` for a group whose
//! true rewards are all 0 made its advantages ±1). Rewards are computed by
//! the same deterministic f32 code in every role, so any nudge is a
//! model-free failure. Over a few windows the cheater's weight is 0 in every
//! signed weights document from the first window it was judged in, and none
//! of its rollouts reaches a GRPO batch (the trainer's batch records), while
//! the honest miner is paid.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use coordinator::weights::PAY_DELAY_WINDOWS;
use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::wire::{WeightsDoc, WindowInfo};
use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, TrainerEvent, within};

/// The largest reward above `r` within 1e-6 of it (the old tolerance; the
/// old check computed `|reported − recomputed| ≤ 1e-6` in f32).
fn nudged(r: f32) -> f32 {
    let n = r + 1e-6;
    if (n - r).abs() <= 1e-6 { n } else { f32::from_bits(n.to_bits() - 1) }
}

/// The first rollout of each group claims its reward nudged by up to 1e-6,
/// the last one its reward one f32 step up (the signature covers the nudged
/// rewards; every digest of the miner is logged).
struct Nudge {
    digests: Arc<Mutex<BTreeSet<[u8; 32]>>>,
}

impl edge_miner::run::Tamper for Nudge {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        let last = group.len().saturating_sub(1);
        for (i, r) in group.iter_mut().enumerate() {
            if i == 0 {
                r.reward = nudged(r.reward);
            } else if i == last {
                r.reward = f32::from_bits(r.reward.to_bits() + 1);
            }
        }
    }

    fn after_sign(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        self.digests.lock().expect("digest log").extend(group.iter().map(Rollout::digest));
    }
}

fn to_hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_nudge_is_inside_the_old_tolerance() {
    for r in [0.0f32, 0.125, 0.2, 0.5, 0.999, 1.0] {
        let n = nudged(r);
        assert!(n != r && (n - r).abs() <= 1e-6, "{r} -> {n}");
        let step = f32::from_bits(r.to_bits() + 1);
        assert!(step != r && (step - r).abs() <= 1e-6);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reward_nudging_miner_is_paid_nothing_and_never_trained_on() {
    let net = NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(4_000, 600, 2, 4) };
    let digests = Arc::new(Mutex::new(BTreeSet::new()));
    let mut mesh = Mesh::start(MeshConfig {
        net,
        miners: vec![MinerSpec::honest("honest"), MinerSpec::with("nudger", Nudge { digests: digests.clone() })],
        trainer: true,
        validator: true,
    })
    .await;
    let (h, c) = (mesh.miners[0].key.public(), mesh.miners[1].key.public());

    // The first window the validator judged the nudger in, then two more
    // windows in which it judged both.
    // Every honest rollout the validator checks passes (protocol 7's id cap
    // on the draw distance failed 2 of 16 in window 0 on the tiny model).
    let mut honest_seen: Vec<(u64, u32, u32)> = Vec::new();
    let mut note = |r: &validator::service::WindowReport| {
        if let Some(m) = r.miners.get(&h) {
            honest_seen.push((r.window, m.body.valid, m.body.checked));
        }
    };
    let first = mesh
        .validator()
        .until(150, |r| {
            note(r);
            r.miners.get(&c).is_some_and(|m| m.body.checked > 0)
        })
        .await
        .window;
    let mut judged = first;
    for _ in 0..2 {
        judged = mesh
            .validator()
            .until(150, |r| {
                note(r);
                r.window > judged
                    && r.miners.get(&h).is_some_and(|m| m.body.checked > 0)
                    && r.miners.get(&c).is_some_and(|m| m.body.checked > 0)
            })
            .await
            .window;
    }

    assert!(honest_seen.iter().any(|x| x.2 > 0), "the honest miner was judged: {honest_seen:?}");
    assert!(honest_seen.iter().all(|x| x.1 == x.2), "an honest rollout failed: {honest_seen:?}");

    // The trainer trains past the last judged window; no round fails.
    let t = mesh.trainer.as_mut().expect("trainer");
    let mut trained = BTreeSet::new();
    within(240, async {
        while trained.last().is_none_or(|&w| w <= judged) {
            match t.events.recv().await.expect("trainer task ended") {
                TrainerEvent::Published { trained: ws, .. } | TrainerEvent::Consumed(ws) => trained.extend(ws),
                TrainerEvent::Failed(e) => panic!("a trainer round failed: {e}"),
            }
        }
    })
    .await;
    let dir = t.config.dir.clone();

    // The signed weights documents of every interval from the first judged
    // window to the one that pays the last judged window's work (pay waits
    // PAY_DELAY_WINDOWS): the nudger is paid nothing in any of them, the
    // honest miner in the last.
    let coordinator = mesh.net.node.shared.key.public();
    let store = mesh.net.node.shared.store.clone();
    let docs: Vec<WeightsDoc> = within(60, async {
        loop {
            let docs: Vec<Option<WeightsDoc>> =
                (first..=judged + PAY_DELAY_WINDOWS).map(|w| store.weights_doc(w).expect("weights document")).collect();
            if docs.iter().all(Option::is_some) {
                break docs.into_iter().flatten().collect();
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    let weight = |d: &WeightsDoc, k: PublicKey| d.body.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, w)| *w);
    for d in &docs {
        let d = WeightsDoc::decode_verified(&d.encode(), &coordinator).expect("the signed document verifies");
        eprintln!("weights of interval {}: honest {} nudger {}", d.body.window, weight(&d, h), weight(&d, c));
        assert_eq!(weight(&d, c), 0.0, "the nudger is paid in interval {}: {:?}", d.body.window, d.body);
    }
    let last = docs.last().expect("a document");
    assert!(weight(last, h) > 0.0, "the honest miner is not paid: {:?}", last.body);

    // None of the nudger's rollouts reaches a batch; the honest miner's do.
    let nudged: BTreeSet<String> = digests.lock().expect("digest log").iter().map(to_hex).collect();
    assert!(!nudged.is_empty());
    let batches = trainer::service::batch_records(&dir).expect("batch records");
    assert!(!batches.is_empty(), "the trainer took steps");
    for b in &batches {
        for d in &b.digests {
            assert!(!nudged.contains(d), "a nudged rollout {d} reached the batch of window {}", b.window);
        }
    }
    mesh.stop().await;
}
