//! Honest miners at realistic completion lengths are never penalised (issue
//! 15): two honest miners generate 64-token completions for ten windows and
//! more, a validator that *samples* proves them (the soft distribution and
//! coverage checks only run past 30 tokens), and the trainer publishes
//! checkpoints meanwhile, so windows open across publications. No miner is
//! refused at the door for anything an honest miner can meet, none gets a
//! hard failure or a ban, and every judged (window, miner) passes.

use std::collections::BTreeMap;

use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::wire::MinerStanding;
use tributary_tests::{
    Mesh, MeshConfig, MinerSpec, NetConfig, TrainerHandle, ValidatorHandle, honest_refusals, trainer_config,
    validator_config,
};

/// Windows the test judges.
const WINDOWS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_miners_at_64_tokens_are_never_penalised() {
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 64, difficulty: PRACTICE_LEVEL, ..NetConfig::new(5_000, 800, 2, 4) },
        miners: vec![MinerSpec::honest("a"), MinerSpec::honest("b")],
        trainer: false,
        validator: false,
    })
    .await;
    // A sampling validator (half of each miner's rollouts, whole groups) and
    // a trainer that waits for verdicts, started by hand for those settings.
    let mut vc = validator_config(&mesh.net, mesh.net.window());
    vc.sample =
        validator::service::SampleConfig { miner_fraction: 1.0, min_miners: 2, max_miners: 2, rollouts_per_miner: 4 };
    mesh.validator = Some(ValidatorHandle::spawn(vc));
    let mut tc = trainer_config(
        mesh.net.node.quic,
        &mesh.net.node.fingerprint,
        &mesh.net.dir.path().join("trainer"),
        &mesh.net.genesis_bytes,
    );
    tc.trust_unjudged = false;
    mesh.trainer = Some(TrainerHandle::spawn(tc));
    let keys: Vec<_> = mesh.miners.iter().map(|m| m.key.public()).collect();

    let mut judged = 0;
    let mut soft: BTreeMap<String, u32> = BTreeMap::new();
    let mut windows = Vec::new();
    while windows.len() < WINDOWS {
        let r = mesh.validator().until(120, |r| r.miners.len() == keys.len()).await;
        for (miner, rep) in &r.miners {
            assert!(keys.contains(miner));
            assert!(rep.body.checked > 0, "window {}: miner {} was not judged", r.window, miner.short());
            for (name, n) in &rep.failed {
                *soft.entry(name.clone()).or_default() += n;
            }
            judged += 1;
        }
        windows.push(r.window);
    }
    eprintln!("judged {judged} (window, miner) pairs over windows {windows:?}; failed checks {soft:?}");

    // The trainer published while these windows ran, and what it trained on
    // was long enough for the soft checks to run (they start past 30 tokens).
    let stats = mesh.net.node.shared.store.trainer_stats(0, u64::MAX).expect("trainer stats");
    assert!(!stats.is_empty(), "the trainer never published during {WINDOWS} windows");
    let longest = stats.iter().map(|s| s.body.tokens as f64 / s.body.seqs.max(1) as f64).fold(0.0, f64::max);
    eprintln!("{} publications; most completion tokens per trained sequence {longest:.1}", stats.len());
    assert!(longest > 30.0, "completions averaged at most {longest:.1} tokens");

    {
        let core = mesh.net.node.shared.core();
        for k in &keys {
            let st = core.miners().get(k).cloned().unwrap_or_default();
            assert!(st.accepted > 0, "miner {} had nothing accepted", k.short());
            assert_eq!(st.banned_through, None, "honest miner {} banned: {st:?}", k.short());
            assert!(st.failures.is_empty(), "honest miner {} has hard failures: {st:?}", k.short());
            let refused: Vec<_> = st.rejected.iter().filter(|(_, n)| **n > 0).collect();
            assert!(
                st.rejected.iter().all(|(reason, n)| *n == 0 || *reason == "replayed_content"),
                "honest miner {} refused at the door: {refused:?}",
                k.short()
            );
            for w in &windows {
                if core.progress(*w, k).is_empty() {
                    continue;
                }
                assert!(
                    core.standing(*w).contains(&(*k, MinerStanding::Passed)),
                    "window {w}: honest miner {} did not pass: {:?}",
                    k.short(),
                    core.standing(*w)
                );
            }
        }
    }
    for m in &mut mesh.miners {
        for e in m.drain() {
            if let edge_miner::run::RunEvent::Submitted { refused, .. } = e {
                assert!(honest_refusals(&refused), "{refused:?}");
            }
        }
    }
    mesh.stop().await;
}
