//! Test scaffolding (feature `test-utils`; always in this crate's unit
//! tests): what several tests of the coordinator build the same way, so
//! each is written once. Not for production code: the helpers panic on a
//! failure, as a test would.

use std::time::Duration;

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{CheckpointBody, CheckpointKind, PublishCheckpoint, Role, WeightsDoc};

use crate::core::{Candidate, Core, Shape};
use crate::relay::{self, Entry};
use crate::server::Shared;

/// A rollout's admission facts for slot (`group`, `index`) of `miner`'s
/// assigned tasks in `window`, within `core`'s contract: the window's
/// checkpoint, the core's environment and sampling, the assigned task, a
/// prompt of 40 tokens and a completion of `max_new_tokens`, token ids
/// below 1000, `bytes` bytes; digest and content distinct per (window,
/// miner, group, index).
pub fn candidate(core: &Core, window: WindowId, miner: PublicKey, group: u32, index: u32, bytes: u32) -> Candidate {
    let cfg = core.config();
    let slot = [&window.to_le_bytes()[..], &miner.0, &group.to_le_bytes(), &index.to_le_bytes()].concat();
    Candidate {
        window,
        checkpoint: core.checkpoint_for(window),
        env: cfg.env,
        group,
        index,
        task_id: core.assigned_task(window, &miner, group),
        miner,
        digest: *blake3::hash(&slot).as_bytes(),
        content: *blake3::hash(&[&[1u8][..], &slot[..]].concat()).as_bytes(),
        shape: Shape {
            sampling: cfg.sampling,
            prompt_len: 40,
            completion_len: cfg.sampling.max_new_tokens,
            max_token: 999,
            bytes,
        },
    }
}

/// Milliseconds per window of [`core_config`]'s schedule (genesis at 10 000 ms, grace 100 ms).
pub const CORE_WINDOW_MS: u64 = 1_000;

/// A small core configuration the core's tests share: windows of
/// [`CORE_WINDOW_MS`], arith, 2 groups of 4 rollouts of at most 32 new
/// tokens, prompts of 256, a vocabulary of 1000, 1 GiB and 1000 keys a
/// window, bans of 3 windows, weights over 12, committees of 2, soft
/// failures a statistic only; `access` says who may do what.
pub fn core_config(access: crate::core::Access) -> crate::core::CoreConfig {
    crate::core::CoreConfig {
        schedule: tributary_protocol::window::Schedule::new(10_000, CORE_WINDOW_MS, 100).expect("schedule"),
        master: [42; 32],
        env: tributary_protocol::env::EnvId::Arith,
        groups_per_miner: 2,
        group_size: 4,
        sampling: tributary_protocol::rollout::SamplingParams { temperature: 0.7, max_new_tokens: 32 },
        max_prompt_tokens: 256,
        vocab_size: Some(1000),
        max_window_bytes: 1 << 30,
        max_window_miners: 1000,
        difficulty: 3,
        dataset: None,
        reward: tributary_protocol::env::RewardRule::Strict,
        genesis_checkpoint: ContentId([1; 32]),
        access,
        ban_windows: 3,
        soft_failure_threshold: 0,
        weight_windows: 12,
        unique_cap_per_window: 5000,
        weight_exponent: 4,
        committee: 2,
        validator_budget: 4096,
        reveal_ms: 300,
    }
}

/// Makes `core` hold `groups` whole groups of `miner` in `window` as if
/// they were stored ([`Core::restore`]: no door checks, nothing on disk)
/// and returns their digests: what a verdict lists as proved passing for
/// the miner to be paid (issue 28: weights count proven work on stored
/// digests only).
pub fn stored_groups(core: &mut Core, window: WindowId, miner: PublicKey, groups: u32) -> Vec<[u8; 32]> {
    let size = core.config().group_size;
    let mut digests = Vec::new();
    for g in 0..groups {
        for i in 0..size {
            let c = candidate(core, window, miner, g, i, 1000);
            core.restore(&c);
            digests.push(c.digest);
        }
    }
    digests
}

/// The content id of test publication `i` ([`store_publication`]).
pub fn publication_id(i: u8) -> ContentId {
    ContentId([10 + i; 32])
}

/// Publication `i` (id [`publication_id`]) for `window`, in force from
/// `from`: a full file of 4 KiB (every byte `i`) and, with a base, a delta
/// of 100 bytes (every byte `i ^ 0x55`), announced by the `--dev` trainer;
/// stored, restored into the core and made visible as the coordinator does
/// after an upload.
pub fn store_publication(sh: &Shared, i: u8, base: Option<u8>, window: WindowId, from: WindowId) -> Entry {
    let cid = publication_id(i);
    let full = sh.relay.full_path(&cid);
    std::fs::write(&full, vec![i; 4096]).expect("writing a full file");
    let (full_len, full_hash) = relay::hash_file(&full).expect("hashing a full file");
    let delta = base.map(|b| {
        let bytes = vec![i ^ 0x55; 100];
        std::fs::write(sh.relay.delta_path(&publication_id(b), &cid), &bytes).expect("writing a delta");
        (publication_id(b), 100, *blake3::hash(&bytes).as_bytes())
    });
    let entry = Entry { id: cid, seq: u64::from(i), window, from_window: from, full_len, full_hash, delta };
    let (kind, len, payload_hash) = match delta {
        Some((b, len, hash)) => (CheckpointKind::Delta { base: b }, len, hash),
        None => (CheckpointKind::Full, full_len, full_hash),
    };
    let trainer = tributary_protocol::dev::key(Role::Trainer);
    let body = CheckpointBody { id: cid, kind, len, payload_hash, window, trainer: trainer.public() };
    let ann = PublishCheckpoint::sign(body, &trainer, &sh.network());
    sh.store.put_checkpoint(from, &ann, &entry).expect("storing a checkpoint");
    sh.core().restore_checkpoint(from, cid);
    sh.relay.set_announcement(ann);
    sh.relay.insert(entry.clone());
    entry
}

/// Window `window`'s signed weights document, once the coordinator has
/// signed and stored it (polled every 50 ms, for at most 30 s).
pub async fn signed_weights(sh: &Shared, window: WindowId) -> WeightsDoc {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(d) = sh.store.weights_doc(window).expect("reading a weights document") {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the weights document within 30 s")
}
