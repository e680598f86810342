//! Issue 15 item 1 on the mesh (review proof-soundness finding 1): the
//! validator samples one group per miner (not `--all`), and an attacker
//! tampers every group outside the sample — it knows the sample in advance:
//! the coordinator's secret, as an operator does (finding 10), and on a
//! `--dev` network, whose validator and trainer keys are public, every
//! contribution to the challenge (`protocol::beacon`) — so its verdicts pass. Its tampered
//! rollouts (fake `[1e30, -1e30]` rewards, another prompt, an edited
//! log-prob, an EOS mid-completion, a sequence longer than the context)
//! reach the trainer; none of them reaches a GRPO batch (the trainer's batch
//! records), the trainer's proof records each one it examined, it rejects no
//! honest rollout, and no trainer round fails.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};

use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::window::WindowSecrets;
use tributary_protocol::wire::{NetworkId, Role, WindowInfo};
use tributary_tests::{
    Mesh, MeshConfig, MinerSpec, NetConfig, TrainerEvent, ValidatorHandle, validator_config, within,
};

const GROUPS: u32 = 5;

/// The mesh's master secret (`tributary_tests` seeds it from the net seed).
fn master(seed: u64) -> [u8; 32] {
    *blake3::Hasher::new_derive_key("tributary tests master secret v1")
        .update(&seed.to_le_bytes())
        .finalize()
        .as_bytes()
}

/// The group a validator assigned one group of `miner` proves: the first in
/// the assignment's order (`protocol::assign::group_order`).
fn sampled_group(challenge: &Seed, window: u64, miner: &[u8; 32], groups: u32) -> u32 {
    let all = (0..groups).collect();
    tributary_protocol::assign::group_order(challenge, window, &PublicKey(*miner), &all)[0]
}

fn to_hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone)]
struct Tampered {
    window: u64,
    digests: Vec<[u8; 32]>,
}

struct OutsideTheSample {
    master: [u8; 32],
    /// The mesh's network (its coordinator's key is made at start).
    network: Arc<OnceLock<NetworkId>>,
    eos: u32,
    log: Arc<Mutex<Vec<Tampered>>>,
}

impl edge_miner::run::Tamper for OutsideTheSample {
    fn tamper(&mut self, info: &WindowInfo, group: &mut Vec<Rollout>) {
        let Some((g, miner)) = group.first().map(|r| (r.group, r.miner)) else { return };
        let Some(network) = self.network.get() else { return };
        // The dev validator and trainer contribute; their keys are public.
        let contributions = [Role::Validator, Role::Trainer]
            .map(tributary_protocol::dev::key)
            .iter()
            .map(|k| (k.public(), tributary_protocol::beacon::contribution_secret(k, network, info.window)))
            .collect();
        let coordinator = WindowSecrets::derive(&self.master, info.window).challenge;
        let challenge = tributary_protocol::beacon::mix(network, info.window, &coordinator.0, &contributions);
        let sampled = sampled_group(&challenge, info.window, &miner, info.groups_per_miner);
        if g == sampled {
            return;
        }
        // The first group outside the sample always carries the fake rewards
        // (the check this test must see whichever group the challenge
        // samples: with group 0 sampled it used to see none); the others
        // keep their kind by number.
        let first_outside = u32::from(sampled == 0);
        let kind = if g == first_outside { 0 } else { g % 5 };
        match kind {
            0 => {
                for (r, x) in group.iter_mut().zip([1e30, -1e30]) {
                    r.reward = x;
                }
            }
            1 => {
                let r = &mut group[0];
                r.tokens.remove(0);
                r.sketches.remove(0);
                r.prompt_len -= 1;
            }
            2 => {
                let r = &mut group[0];
                let l = r.logprobs.len() as f32;
                r.logprobs[0] -= 5.0 * l;
            }
            3 => {
                for r in group.iter_mut().filter(|r| r.completion().len() >= 2) {
                    let at = r.prompt_len as usize;
                    r.tokens[at] = self.eos;
                }
            }
            _ => {
                let r = &mut group[0];
                let extra = 2100usize.saturating_sub(r.tokens.len());
                let pad = r.tokens[0];
                r.tokens.splice(0..0, std::iter::repeat_n(pad, extra));
                r.sketches.splice(0..0, std::iter::repeat_n(0, extra));
                r.prompt_len += extra as u32;
            }
        }
        let digests = group.iter().map(Rollout::digest).collect();
        self.log.lock().expect("tamper log").push(Tampered { window: info.window, digests });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_unchecked_groups_never_reach_a_gradient() {
    // One validator assigned one group (two rollouts) per miner: the
    // attacker's other groups are proven by nobody but the trainer.
    let net = NetConfig {
        max_new_tokens: 16,
        difficulty: PRACTICE_LEVEL,
        validator_budget: 2 * 2,
        ..NetConfig::new(4_000, 600, GROUPS, 2)
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let tok = tributary_protocol::tokenizer::Tokenizer::from_gguf_file(&tributary_assets::smollm2_q4_1())
        .expect("SmolLM2 tokenizer (run scripts/setup.sh)");
    let network = Arc::new(OnceLock::new());
    let attacker =
        OutsideTheSample { master: master(net.seed), network: network.clone(), eos: tok.eos_id(), log: log.clone() };
    let mut mesh = Mesh::start(MeshConfig {
        net,
        miners: vec![MinerSpec::honest("honest"), MinerSpec::with("attacker", attacker)],
        trainer: true,
        validator: false,
    })
    .await;
    let _ = network.set(mesh.net.node.shared.network());
    // A validator that proves its assignment and nothing more.
    let mut vc = validator_config(&mesh.net, mesh.net.window());
    vc.sample = validator::service::SampleConfig::ASSIGNED;
    mesh.validator = Some(ValidatorHandle::spawn(vc));
    let w0 = mesh.net.window();
    assert_eq!(
        mesh.net.node.shared.core().secrets(w0).challenge,
        WindowSecrets::derive(&master(net.seed), w0).challenge,
        "the attacker's knowledge of the challenge"
    );
    let a = mesh.miners[1].key.public();

    // A window in which the attacker's sample passed while it had tampered groups.
    let passed = mesh
        .validator()
        .until(150, |r| {
            r.miners.get(&a).is_some_and(|m| m.body.checked > 0 && !m.body.hard_failure)
                && log.lock().expect("log").iter().any(|t| t.window == r.window)
        })
        .await
        .window;

    // The trainer trains past that window; no round fails.
    let t = mesh.trainer.as_mut().expect("trainer");
    let mut trained = BTreeSet::new();
    within(180, async {
        while trained.last().is_none_or(|&w| w <= passed) {
            match t.events.recv().await.expect("trainer task ended") {
                TrainerEvent::Published { trained: ws, .. } | TrainerEvent::Consumed(ws) => trained.extend(ws),
                TrainerEvent::Failed(e) => panic!("a trainer round failed: {e}"),
            }
        }
    })
    .await;
    let dir = t.config.dir.clone();
    let tampered = log.lock().expect("log").clone();
    let bad: BTreeSet<String> = tampered.iter().flat_map(|t| t.digests.iter().map(to_hex)).collect();

    let batches = trainer::service::batch_records(&dir).expect("batch records");
    assert!(!batches.is_empty(), "the trainer took steps");
    let mut in_batches = 0;
    for b in &batches {
        for d in &b.digests {
            assert!(!bad.contains(d), "tampered rollout {d} reached the batch of window {}", b.window);
            in_batches += 1;
        }
    }
    let rejected = trainer::service::rejected_records(&dir).expect("rejected records");
    for r in &rejected {
        assert!(bad.contains(&r.digest), "an untampered rollout was rejected: {r:?}");
    }
    let checks: BTreeSet<&str> = rejected.iter().map(|r| r.check.as_str()).collect();
    eprintln!(
        "attacker passed window {passed}; trained windows {trained:?}; {} tampered groups; {in_batches} rollouts \
         in {} batches; rejected by check: {checks:?}",
        tampered.len(),
        batches.len()
    );
    assert!(checks.contains("reward"), "the fake rewards rank first and are caught: {rejected:?}");
    // The trainer posted a verdict with its evidence for each window it
    // rejected the attacker in: its own proof bans (issue 16 item 2).
    let first_rejected = rejected.iter().map(|r| r.window).min().expect("a rejection");
    assert!(rejected.iter().all(|r| r.evidence.as_ref().is_some_and(|e| to_hex(&e.digest) == r.digest)));
    {
        let core = mesh.net.node.shared.core();
        assert!(core.is_banned(&a, first_rejected + 1), "the trainer's proof failure did not ban the attacker");
        assert!(core.standing(first_rejected).contains(&(a, tributary_protocol::wire::MinerStanding::Failed)));
    }
    mesh.stop().await;
}
