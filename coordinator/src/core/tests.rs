//! The core's unit tests.

use super::*;
use tributary_protocol::beacon;
use tributary_protocol::env::task_seed;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{
    BeaconCommit, BeaconReveal, CheckpointBody, MinerStanding, NetworkId, RejectReason, TrainerStatsBody,
    TrainerStatsError,
};

const LEN: u64 = 1_000;

fn cfg() -> CoreConfig {
    let validator = Keypair::from_seed([100; 32]).public();
    let mut c =
        crate::testing::core_config(Access { validators: [validator].into_iter().collect(), ..Access::default() });
    c.soft_failure_threshold = 2;
    c
}

fn miner(n: u8) -> PublicKey {
    Keypair::from_seed([n; 32]).public()
}

/// A candidate of 2000 bytes within the core's contract.
fn cand(core: &Core, window: WindowId, m: PublicKey, group: u32, index: u32) -> Candidate {
    crate::testing::candidate(core, window, m, group, index, 2000)
}

fn at(window: WindowId) -> u64 {
    10_000 + window * LEN + 1
}

fn verdict(window: WindowId, m: PublicKey, valid: u32, hard: bool) -> VerdictBody {
    VerdictBody {
        window,
        miner: m,
        validator: Keypair::from_seed([100; 32]).public(),
        checked: valid.max(1),
        valid,
        estimated_valid: valid,
        hard_failure: hard,
        soft_failures: 0,
        reasons: vec![],
        passed: vec![],
        evidence: vec![],
    }
}

#[test]
fn window_transitions_and_reveal_ordering() {
    let core = Core::new(cfg());
    assert_eq!(core.current_window(9_999), None);
    assert!(core.window_info(0, 9_999).is_none());
    let info = core.window_info(2, at(2)).unwrap();
    assert_eq!(info.window, 2);
    assert_eq!(info.closes_at_ms, 10_000 + 3 * LEN + 100);
    // The commitment is public at open; the secret only after close.
    assert!(core.reveal(2, at(2)).is_none());
    assert!(core.reveal(2, info.closes_at_ms - 1).is_none());
    let reveal = core.reveal_frame(2, info.closes_at_ms).unwrap();
    assert!(tributary_protocol::window::verify_reveal(2, &info.commitment, &reveal.secret));
    let challenge = beacon::check_reveal(&reveal, &core.network(), &info.commitment).unwrap();
    assert_eq!(core.reveal(2, info.closes_at_ms), Some(challenge));
    // A restarted core with the same master secret re-derives the same window.
    assert_eq!(Core::new(cfg()).window_info(2, at(2)).unwrap(), info);
}

#[test]
fn assignment_is_deterministic_and_per_miner() {
    let core = Core::new(cfg());
    let a = core.assigned_task(1, &miner(1), 0);
    assert_eq!(a, Core::new(cfg()).assigned_task(1, &miner(1), 0));
    assert_ne!(a, core.assigned_task(1, &miner(2), 0));
    assert_ne!(a, core.assigned_task(1, &miner(1), 1));
    assert_ne!(a, core.assigned_task(2, &miner(1), 0));
    assert_eq!(a, task_seed(&core.window_info(1, at(1)).unwrap().seed, miner(1).as_bytes(), 0));
}

#[test]
fn admission_rules() {
    let mut core = Core::new(cfg());
    let m = miner(1);
    let ok = cand(&core, 1, m, 0, 0);
    assert_eq!(core.admit(at(1), &m, &ok), Ok(()));
    core.commit(&ok);
    // Same bytes again, same slot with other bytes.
    assert_eq!(core.admit(at(1), &m, &ok), Err(RejectReason::Duplicate));
    let mut same_slot = ok.clone();
    same_slot.digest = [9; 32];
    same_slot.content = [9; 32];
    assert_eq!(core.admit(at(1), &m, &same_slot), Err(RejectReason::Duplicate));
    // The same content in another slot of the same miner (an honest group
    // whose rollouts coincide), or under another key (validators judge copies), is admitted.
    let mut twin = cand(&core, 1, m, 1, 3);
    twin.content = ok.content;
    assert_eq!(core.admit(at(1), &m, &twin), Ok(()));
    core.abort(&twin);
    let other = miner(2);
    let mut copy = cand(&core, 1, other, 0, 0);
    copy.content = ok.content;
    assert_eq!(core.admit(at(1), &other, &copy), Ok(()));
    core.abort(&copy);
    // Submitted by a peer other than the signer.
    assert_eq!(core.admit(at(1), &other, &cand(&core, 1, m, 0, 1)), Err(RejectReason::WrongMiner));
    // Window not open (future, and closed past the grace).
    assert_eq!(core.admit(at(1), &m, &cand(&core, 2, m, 0, 1)), Err(RejectReason::WrongWindow));
    assert_eq!(core.admit(at(2) + 100, &m, &cand(&core, 1, m, 0, 1)), Err(RejectReason::WrongWindow));
    // Within the grace the old window still accepts.
    assert_eq!(core.admit(at(2) + 50, &m, &cand(&core, 1, m, 0, 1)), Ok(()));
    // Unassigned: group out of range, index out of range, wrong task id.
    assert_eq!(core.admit(at(1), &m, &cand(&core, 1, m, 2, 0)), Err(RejectReason::Unassigned));
    assert_eq!(core.admit(at(1), &m, &cand(&core, 1, m, 0, 4)), Err(RejectReason::Unassigned));
    let mut wrong_task = cand(&core, 1, m, 1, 0);
    wrong_task.task_id ^= 1;
    assert_eq!(core.admit(at(1), &m, &wrong_task), Err(RejectReason::Unassigned));
    // Stale checkpoint and wrong env.
    let mut stale = cand(&core, 1, m, 1, 0);
    stale.checkpoint = ContentId([7; 32]);
    assert_eq!(core.admit(at(1), &m, &stale), Err(RejectReason::StaleCheckpoint));
    let mut env = cand(&core, 1, m, 1, 0);
    env.env = EnvId::Sat;
    assert_eq!(core.admit(at(1), &m, &env), Err(RejectReason::WrongEnv));
    let stats = &core.miners()[&m];
    assert_eq!(stats.accepted, 1);
    assert_eq!(stats.rejected["duplicate"], 2);
    assert_eq!(stats.rejected["internal"], 1);
    assert_eq!(stats.rejected["unassigned"], 3);
    assert_eq!(core.progress(1, &m), vec![(0, 0), (0, 1)]);
}

#[test]
fn abort_releases_reservation() {
    let mut core = Core::new(cfg());
    let m = miner(1);
    let c = cand(&core, 1, m, 0, 0);
    core.admit(at(1), &m, &c).unwrap();
    core.abort(&c);
    assert_eq!(core.admit(at(1), &m, &c), Ok(()));
}

#[test]
fn allow_and_deny_lists() {
    let mut c = cfg();
    c.access.miner_deny.insert(miner(3));
    c.access.miner_allow = Some([miner(1), miner(3)].into_iter().collect());
    let mut core = Core::new(c);
    let cand2 = cand(&core, 1, miner(2), 0, 0);
    assert_eq!(core.admit(at(1), &miner(2), &cand2), Err(RejectReason::NotAllowed));
    let cand3 = cand(&core, 1, miner(3), 0, 0);
    assert_eq!(core.admit(at(1), &miner(3), &cand3), Err(RejectReason::NotAllowed));
    let cand1 = cand(&core, 1, miner(1), 0, 0);
    assert_eq!(core.admit(at(1), &miner(1), &cand1), Ok(()));
    assert!(!core.access().permits(Role::Trainer, &miner(1)));
}

#[test]
fn checkpoint_takes_effect_next_window() {
    let mut core = Core::new(cfg());
    let body = CheckpointBody {
        id: ContentId([2; 32]),
        kind: tributary_protocol::wire::CheckpointKind::Full,
        len: 0,
        payload_hash: [0; 32],
        window: 1,
        trainer: miner(9),
    };
    assert_eq!(core.publish_checkpoint(at(1), &body), 2);
    assert_eq!(core.checkpoint_for(1), ContentId([1; 32]));
    assert_eq!(core.checkpoint_for(2), ContentId([2; 32]));
    assert_eq!(core.checkpoint_for(9), ContentId([2; 32]));
    // A rollout of window 2 made with the old checkpoint is stale.
    let m = miner(1);
    let mut c = cand(&core, 2, m, 0, 0);
    c.checkpoint = ContentId([1; 32]);
    assert_eq!(core.admit(at(2), &m, &c), Err(RejectReason::StaleCheckpoint));
}

#[test]
fn the_door_enforces_the_generation_contract() {
    let mut core = Core::new(cfg());
    let m = miner(1);
    let base = cand(&core, 1, m, 0, 0);
    let mut bad: Vec<(&str, Candidate)> = Vec::new();
    let mut c = base.clone();
    c.shape.sampling.temperature = 1.0;
    bad.push(("temperature", c));
    let mut c = base.clone();
    c.shape.sampling.temperature = f32::from_bits(0.7f32.to_bits() + 1);
    bad.push(("temperature off by one ulp", c));
    let mut c = base.clone();
    c.shape.sampling.max_new_tokens = 16_384;
    bad.push(("max_new_tokens claimed", c));
    let mut c = base.clone();
    c.shape.completion_len = 33;
    bad.push(("completion past max_new_tokens", c));
    let mut c = base.clone();
    c.shape.prompt_len = 257;
    bad.push(("prompt too long", c));
    let mut c = base.clone();
    c.shape.max_token = 1000;
    bad.push(("token outside the vocabulary", c));
    for (what, c) in &bad {
        assert_eq!(core.admit(at(1), &m, c), Err(RejectReason::Schema), "{what}");
    }
    assert_eq!(core.admit(at(1), &m, &base), Ok(()));
    // Without a known vocabulary only the other bounds apply.
    let mut c = cfg();
    c.vocab_size = None;
    let mut core = Core::new(c);
    let mut big = cand(&core, 1, m, 0, 0);
    big.shape.max_token = u32::MAX;
    assert_eq!(core.admit(at(1), &m, &big), Ok(()));
}

/// network-security E3: a window's storage is bounded in bytes and in
/// distinct miners, whatever the number of keys; each key's byte share is
/// the window's bytes over `max_window_miners`; an aborted rollout gives
/// its bytes back; a refusal is `WindowFull` (retry next window).
#[test]
fn a_window_has_a_storage_budget() {
    let mut c = cfg();
    c.max_window_bytes = 12_000;
    c.max_window_miners = 3;
    let mut core = Core::new(c);
    let (a, b) = (miner(1), miner(2));
    let x = cand(&core, 1, a, 0, 0);
    assert_eq!(core.admit(at(1), &a, &x), Ok(()));
    assert_eq!(core.admit(at(1), &a, &cand(&core, 1, a, 0, 1)), Ok(()));
    // a's share (12 000 / 3) is used.
    assert_eq!(core.admit(at(1), &a, &cand(&core, 1, a, 1, 0)), Err(RejectReason::WindowFull));
    assert_eq!(core.window_usage(1), (4_000, 1));
    core.abort(&x);
    assert_eq!(core.admit(at(1), &a, &cand(&core, 1, a, 1, 0)), Ok(()));
    assert_eq!(core.admit(at(1), &b, &cand(&core, 1, b, 0, 0)), Ok(()));
    // Another window has its own budget.
    assert_eq!(core.admit(at(2), &b, &cand(&core, 2, b, 0, 0)), Ok(()));
    // Distinct miners: the third key fits, the fourth does not.
    let mut c = cfg();
    c.max_window_miners = 3;
    let mut core = Core::new(c);
    for n in 1..=3 {
        assert_eq!(core.admit(at(1), &miner(n), &cand(&core, 1, miner(n), 0, 0)), Ok(()));
    }
    assert_eq!(core.admit(at(1), &miner(4), &cand(&core, 1, miner(4), 0, 0)), Err(RejectReason::WindowFull));
    assert_eq!(core.admit(at(1), &miner(1), &cand(&core, 1, miner(1), 0, 1)), Ok(()));
}

/// proof-soundness finding 3: the announcement's frame was read in window
/// 1 and its upload became durable in window 2, after window 2's
/// parameters were handed out; window 2 keeps its checkpoint.
#[test]
fn a_publication_never_changes_an_opened_window() {
    let mut core = Core::new(cfg());
    let m = miner(1);
    let info = core.window_info(2, at(2)).unwrap();
    assert_eq!(info.checkpoint, ContentId([1; 32]));
    let body = CheckpointBody {
        id: ContentId([2; 32]),
        kind: tributary_protocol::wire::CheckpointKind::Full,
        len: 0,
        payload_hash: [0; 32],
        window: 1,
        trainer: miner(9),
    };
    // A stale clock reading (taken when the announcement arrived).
    assert_eq!(core.publish_checkpoint(at(1) + 990, &body), 3);
    assert_eq!(core.window_info(2, at(2) + 1).unwrap().checkpoint, info.checkpoint);
    let c = cand(&core, 2, m, 0, 0);
    assert_eq!(c.checkpoint, ContentId([1; 32]));
    assert_eq!(core.admit(at(2) + 2, &m, &c), Ok(()));
    assert_eq!(core.checkpoint_for(3), ContentId([2; 32]));
    // Made durable as from window 3, but window 3 opened before the
    // caller re-read the clock: refused, to be stored again from window 4.
    let mut core = Core::new(cfg());
    let from = core.checkpoint_from(at(2), &body);
    assert_eq!(from, 3);
    assert!(!core.publish_checkpoint_from(at(3), from, &body));
    assert_eq!(core.checkpoint_for(3), ContentId([1; 32]));
    assert!(core.publish_checkpoint_from(at(3), 4, &body));
    assert_eq!(core.checkpoint_for(4), ContentId([2; 32]));
}

/// A second authorised validator (key 101) and the trainer (key 77).
fn cfg_two_validators() -> CoreConfig {
    let mut c = cfg();
    c.access.validators.insert(second().validator);
    c.access.trainer = Some(Keypair::from_seed([77; 32]).public());
    c
}

/// `v` as signed by the second validator.
fn by(signer: u8, mut v: VerdictBody) -> VerdictBody {
    v.validator = Keypair::from_seed([signer; 32]).public();
    v
}

fn second() -> VerdictBody {
    by(101, verdict(0, miner(0), 0, false))
}

/// A hard failure of rollout `digest` with its evidence (sampling, model-based).
fn failing(window: WindowId, m: PublicKey, digest: [u8; 32]) -> VerdictBody {
    let mut v = verdict(window, m, 0, true);
    v.checked = 2;
    v.add_evidence(tributary_protocol::wire::FailureEvidence {
        digest,
        group: 0,
        rollout: 1,
        check: tributary_protocol::wire::FailedCheck::Sampling,
        hard: true,
        position: Some(44),
        figures: tributary_protocol::wire::Figures::Sampling { u: 0.5, lo: 0.1, hi: 0.2, outside: 1 },
    });
    v
}

/// The digest of `m`'s stored rollout number `n` in window `w` (slot
/// `n mod groups·size`, in group order): evidence counts only on stored
/// digests (issue 28 item 7).
fn dig(core: &Core, w: WindowId, m: PublicKey, n: u32) -> [u8; 32] {
    let (groups, size) = (core.config().groups_per_miner, core.config().group_size);
    let n = n % (groups * size);
    cand(core, w, m, n / size, n % size).digest
}

/// `v` listing every rollout of its miner and window the store holds as
/// proved passing: only proven work is paid (issue 28 item 2).
fn proving(core: &Core, mut v: VerdictBody) -> VerdictBody {
    let (groups, size) = (core.config().groups_per_miner, core.config().group_size);
    for n in 0..groups * size {
        let d = dig(core, v.window, v.miner, n);
        if core.holds(v.window, &v.miner, &d) {
            v.add_passed(d);
        }
    }
    v
}

#[test]
fn verdicts_bans_and_weights() {
    let mut core = Core::new(cfg_two_validators());
    let (a, b, c) = (miner(1), miner(2), miner(3));
    let closed = at(2) + 200;
    // Before close: refused.
    assert_eq!(core.record_verdict(at(1), &verdict(1, a, 10, false), true), Err(VerdictError::NotClosed));
    // Wrong signer / bad signature.
    let mut forged = verdict(1, a, 10, false);
    forged.validator = miner(50);
    assert_eq!(core.record_verdict(closed, &forged, true), Err(VerdictError::Unauthorized));
    assert_eq!(core.record_verdict(closed, &verdict(1, a, 10, false), false), Err(VerdictError::BadSignature));
    // a stored twice what b did; c a group.
    store(&mut core, 1, a, 2);
    store(&mut core, 1, b, 1);
    core.record_verdict(closed, &proving(&core, verdict(1, a, 8, false)), true).unwrap();
    core.record_verdict(closed, &proving(&core, verdict(1, b, 4, false)), true).unwrap();
    // Confirmations come from the miner's committee: c stored a group.
    store(&mut core, 1, c, 1);
    let cited = dig(&core, 1, c, 1);
    core.record_verdict(closed, &failing(1, c, cited), true).unwrap();
    // One validator's failure waits for a second party.
    assert!(!core.is_banned(&c, 2) && core.pending(1, &c));
    assert!(core.standing(1).contains(&(c, MinerStanding::Suspect)));
    core.record_verdict(closed, &by(101, failing(1, c, cited)), true).unwrap();
    assert!(core.standing(1).contains(&(c, MinerStanding::Failed)));
    // c is banned for windows 2..=4, and not in window 5.
    assert!(core.is_banned(&c, 2) && core.is_banned(&c, 4));
    assert!(!core.is_banned(&c, 5));
    let cc = cand(&core, 3, c, 0, 0);
    assert_eq!(core.admit(at(3), &c, &cc), Err(RejectReason::Banned));
    let w = core.weights(1, miner(99));
    let get = |k| w.weights.iter().find(|(m, _)| *m == k).map(|(_, w)| *w);
    // stored^4: 8^4 / (8^4 + 4^4) = 16/17.
    assert!((get(a).unwrap() - 16.0 / 17.0).abs() < 1e-12);
    assert!((get(b).unwrap() - 1.0 / 17.0).abs() < 1e-12);
    assert_eq!(get(c), None);
    // Soft failures ban only past the binomial gate: of 10 checked, 6 is
    // within an honest miner's reach at p = 1e-6 (the floor of 2 is not
    // enough), 7 is not.
    assert_eq!(core.soft_ban_threshold(10), 7);
    assert_eq!(core.soft_ban_threshold(4), 5, "4 checked rollouts never soft-ban");
    let d = miner(4);
    store(&mut core, 1, d, 1);
    let mut soft = verdict(1, d, 10, false);
    soft.soft_failures = 6;
    core.record_verdict(closed, &soft, true).unwrap();
    core.record_verdict(closed, &by(101, soft.clone()), true).unwrap();
    assert!(!core.is_banned(&d, 2), "6 soft failures of 10 are within honest reach");
    soft.soft_failures = 7;
    core.record_verdict(closed, &soft, true).unwrap();
    assert!(!core.is_banned(&d, 2), "one validator's soft failures wait for a second");
    core.record_verdict(closed, &by(101, soft), true).unwrap();
    assert!(core.is_banned(&d, 2));
}

/// The default (soft_failure_threshold 0): soft failures are a statistic.
/// An honest SAT miner fails the distribution check on 17-30 % of its
/// rollouts (docs/calibration.md §5b); with the binomial gate at the
/// calibrated arith rate, both committee members' verdicts of 24 soft
/// failures in 64 banned it (as `verdicts_bans_and_weights` shows for the
/// gate) and its weight fell with every soft failure.
#[test]
fn soft_failures_neither_ban_nor_weigh_by_default() {
    let mut c = cfg_two_validators();
    c.soft_failure_threshold = 0;
    let mut core = Core::new(c);
    let closed = at(2) + 200;
    let (sat, twin) = (miner(5), miner(6));
    for m in [sat, twin] {
        store(&mut core, 1, m, 1);
    }
    let mut soft = proving(&core, verdict(1, sat, 40, false));
    soft.checked = 64;
    soft.soft_failures = 24;
    core.record_verdict(closed, &soft, true).unwrap();
    core.record_verdict(closed, &by(101, soft), true).unwrap();
    let mut clean = proving(&core, verdict(1, twin, 64, false));
    clean.checked = 64;
    core.record_verdict(closed, &clean, true).unwrap();
    core.record_verdict(closed, &by(101, clean), true).unwrap();
    assert!(!core.is_banned(&sat, 2), "an honest SAT miner's soft failures banned it");
    assert!(core.standing(1).contains(&(sat, MinerStanding::Passed)), "{:?}", core.standing(1));
    let w = core.weights(1, miner(99));
    let get = |k| w.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
    assert!(get(sat) > 0.0 && (get(sat) / get(twin) - 1.0).abs() < 1e-12, "{} vs {}", get(sat), get(twin));
}

#[test]
fn door_penalties_fail_the_window_and_standing_reports_it() {
    let mut core = Core::new(cfg());
    let coord = miner(99);
    core.set_coordinator(coord);
    let (a, b) = (miner(1), miner(2));
    // Only signature and checkpoint refusals, only for an open window, once.
    assert!(core.door_penalty(at(1), 1, &a, RejectReason::Unassigned, coord).is_none());
    assert!(core.door_penalty(at(1), 7, &a, RejectReason::BadSignature, coord).is_none());
    let p = core.door_penalty(at(1), 1, &a, RejectReason::StaleCheckpoint, coord).unwrap();
    assert!(p.hard_failure && p.reasons == vec!["door: stale_checkpoint".to_string()]);
    core.apply_verdict(&p);
    assert!(core.door_penalty(at(1), 1, &a, RejectReason::BadSignature, coord).is_none());
    assert!(core.is_banned(&a, 2));
    store(&mut core, 1, b, 1);
    core.apply_verdict(&proving(&core, verdict(1, b, 4, false)));
    let st = core.standing(1);
    assert_eq!(
        st,
        vec![(a, MinerStanding::Failed), (b, MinerStanding::Passed)]
            .into_iter()
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
    // Window 2: a is unjudged but banned.
    assert_eq!(core.standing(2), vec![(a, MinerStanding::Suspect)]);
    let w = core.weights(1, coord);
    assert_eq!(w.weights.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![b]);
}

#[test]
fn trainer_stats_only_from_the_trainer_key() {
    let trainer = Keypair::from_seed([77; 32]);
    let mut c = cfg();
    c.access.trainer = Some(trainer.public());
    let core = Core::new(c);
    let mut body = TrainerStatsBody {
        window: 3,
        checkpoint: ContentId([2; 32]),
        first_trained: 1,
        last_trained: 2,
        step: 1,
        lr: 1e-3,
        loss: 0.1,
        pg_loss: 0.1,
        kl: 0.0,
        entropy: 1.0,
        clip_low_frac: 0.0,
        clip_high_frac: 0.0,
        grad_norm: 1.0,
        reward_mean: 0.5,
        reward_std: 0.1,
        seqs: 4,
        tokens: 64,
        groups_kept: 1,
        groups_dropped: 0,
        groups_held: 0,
        payload_bytes: 10,
        checkpoint_bytes: 100,
        delta: false,
        change_fraction: None,
        trainer: trainer.public(),
    };
    assert_eq!(core.check_trainer_stats(&body, true), Ok(()));
    assert_eq!(core.check_trainer_stats(&body, false), Err(StatsError::BadSignature));
    // A validator's or a miner's key is not the trainer's, even with a good signature.
    for k in [Keypair::from_seed([100; 32]).public(), miner(1)] {
        let mut other = body.clone();
        other.trainer = k;
        assert_eq!(core.check_trainer_stats(&other, true), Err(StatsError::Unauthorized));
    }
    // No trainer configured: nobody.
    assert_eq!(Core::new(cfg()).check_trainer_stats(&body, true), Err(StatsError::Unauthorized));
    body.loss = f64::INFINITY;
    assert_eq!(core.check_trainer_stats(&body, true), Err(StatsError::Malformed(TrainerStatsError::NotFinite("loss"))));
}

#[test]
fn weights_interval_waits_for_the_next_window_to_end() {
    let core = Core::new(cfg());
    assert_eq!(core.weights_interval(9_999), None);
    assert_eq!(core.weights_interval(at(0)), None);
    assert_eq!(core.weights_interval(at(1)), None);
    assert_eq!(core.weights_interval(at(2)), Some(0));
    assert_eq!(core.weights_interval(at(7)), Some(5));
}

#[test]
fn weights_cap() {
    let mut c = cfg();
    c.unique_cap_per_window = 4;
    c.weight_windows = 1;
    let mut core = Core::new(c);
    store(&mut core, 1, miner(1), 2);
    store(&mut core, 1, miner(2), 1);
    core.apply_verdict(&proving(&core, verdict(1, miner(1), 8, false)));
    core.apply_verdict(&proving(&core, verdict(1, miner(2), 4, false)));
    let w = core.weights(1, miner(99));
    assert_eq!(w.weights.len(), 2);
    assert!(w.weights.iter().all(|(_, x)| (*x - 0.5).abs() < 1e-12));
}

/// The core forgets verdicts no rule reads any more (the store keeps
/// them), so its memory per miner is bounded however long it runs.
#[test]
fn prune_forgets_verdicts_older_than_bans_and_weights_read() {
    let mut core = Core::new(cfg());
    let horizon = core.cfg.ban_windows.max(core.cfg.weight_windows) + 2;
    let last = horizon + 5;
    for w in 0..=last {
        core.apply_verdict(&verdict(w, miner(1), 4, false));
    }
    let before = core.weights(last, miner(99));
    let standing = core.standing(last);
    core.prune(at(last) + 1);
    assert!(core.verdicts_on(0, &miner(1)).is_empty(), "window 0 is past every rule's reach");
    assert!(core.verdicts_on(last - horizon - 1, &miner(1)).is_empty());
    for w in last - horizon..=last {
        assert_eq!(core.verdicts_on(w, &miner(1)).len(), 1, "window {w} is still read");
    }
    assert_eq!(core.verdicts.len() as u64, horizon + 1);
    assert_eq!(core.weights(last, miner(99)).weights, before.weights);
    assert_eq!(core.standing(last), standing);
}

/// issue 16: a validator posting a false failing verdict against an
/// honest miner bans nobody; another validator's passing proof of the
/// same rollout flags it, its verdicts stop counting (standing, bans,
/// confirmations) until an operator clears it.
#[test]
fn a_refuted_validator_is_flagged_and_its_verdicts_set_aside_until_cleared() {
    let mut core = Core::new(cfg_two_validators());
    let closed = at(2) + 200;
    let (honest, other) = (miner(1), miner(2));
    let liar = Keypair::from_seed([100; 32]).public();
    let good = second().validator;
    // Confirmations come from the committee of a miner that stored work.
    store(&mut core, 1, other, 1);
    store(&mut core, 1, honest, 2);
    let (d5, d6, d7) = (dig(&core, 1, honest, 5), dig(&core, 1, honest, 6), dig(&core, 1, other, 3));
    core.record_verdict(closed, &failing(1, honest, d5), true).unwrap();
    assert!(!core.is_banned(&honest, 2) && core.pending(1, &honest));
    assert!(!core.is_flagged(&liar));
    let mut pass = by(101, verdict(1, honest, 2, false));
    pass.add_passed(d5);
    pass.add_passed(d6);
    core.record_verdict(closed, &pass, true).unwrap();
    assert!(core.is_flagged(&liar) && !core.is_flagged(&good));
    assert!(!core.is_banned(&honest, 2) && !core.pending(1, &honest));
    assert_eq!(core.standing(1), vec![(honest, MinerStanding::Passed)]);
    assert_eq!(core.verdicts_on(1, &honest), vec![pass.clone()]);
    let st = core.validator_statuses();
    let s = st.iter().find(|s| s.key == liar.to_string()).unwrap();
    assert!(s.flagged && s.refuted == 1 && s.verdicts == 0, "{s:?}");
    assert_eq!(s.refutations[0].digest, hex::encode(d5));
    // While flagged, its failures confirm nothing: with the good
    // validator's failure on `other`, that one waits for another party.
    core.record_verdict(closed, &failing(1, other, d7), true).unwrap();
    core.record_verdict(closed, &by(101, failing(1, other, d7)), true).unwrap();
    assert!(!core.is_banned(&other, 2) && core.pending(1, &other));
    // Cleared: its verdicts count again, and the two failures on `other` ban.
    assert_eq!(core.clear_validator(&liar), 1);
    assert!(!core.is_flagged(&liar));
    assert!(core.is_banned(&other, 2));
    assert!(!core.is_banned(&honest, 2), "the refuted failure alone still bans nobody");
    // A restart replays the verdicts, then the operator's clear.
    let mut again = Core::new(cfg_two_validators());
    store(&mut again, 1, other, 1);
    store(&mut again, 1, honest, 2);
    for v in [failing(1, honest, d5), pass, failing(1, other, d7), by(101, failing(1, other, d7))] {
        again.apply_verdict(&v);
    }
    assert!(again.is_flagged(&liar));
    again.restore_clear(liar, 1);
    assert!(!again.is_flagged(&liar) && again.is_banned(&other, 2));
}

/// issue 16: the trainer's own proof failure bans alone (the trainer may
/// post verdicts), and is kept out of the validators' verdicts (weights);
/// its passing proof refutes a validator's sampling evidence.
#[test]
fn the_trainers_proof_confirms_a_failure_and_refutes_false_evidence() {
    let mut core = Core::new(cfg_two_validators());
    let closed = at(2) + 200;
    let (cheat, honest) = (miner(1), miner(2));
    store(&mut core, 1, cheat, 2);
    store(&mut core, 0, honest, 1);
    let d5 = dig(&core, 1, cheat, 5);
    core.record_verdict(closed, &failing(1, cheat, d5), true).unwrap();
    assert!(!core.is_banned(&cheat, 2));
    core.record_verdict(closed, &by(77, failing(1, cheat, d5)), true).unwrap();
    assert!(core.is_banned(&cheat, 2));
    assert_eq!(core.standing(1), vec![(cheat, MinerStanding::Failed)]);
    assert_eq!(core.verdicts_on(1, &cheat).len(), 1, "the trainer's verdict is not a validator's");
    // The trainer alone, on a window no validator judged: failed there.
    core.record_verdict(closed, &by(77, failing(0, honest, dig(&core, 0, honest, 0))), true).unwrap();
    assert!(core.standing(0).contains(&(honest, MinerStanding::Failed)));
    // A false sampling failure that the trainer proved passing flags its validator.
    let mut c = cfg_two_validators();
    c.access.validators.remove(&second().validator);
    let mut core = Core::new(c);
    store(&mut core, 1, honest, 2);
    let d9 = dig(&core, 1, honest, 1);
    core.record_verdict(closed, &failing(1, honest, d9), true).unwrap();
    let mut pass = by(77, verdict(1, honest, 1, false));
    pass.add_passed(d9);
    core.record_verdict(closed, &pass, true).unwrap();
    assert!(core.is_flagged(&Keypair::from_seed([100; 32]).public()));
    assert!(!core.is_banned(&honest, 2));
}

/// Stores `groups` full groups of `m` in window `w`.
fn store(core: &mut Core, w: WindowId, m: PublicKey, groups: u32) {
    for g in 0..groups {
        for i in 0..core.config().group_size {
            let c = cand(core, w, m, g, i);
            core.admit(at(w), &m, &c).unwrap();
            core.commit(&c);
        }
    }
}

/// proof-soundness finding 11: miner A judged in 1 window, B in 3, the
/// same work every window. Summing what was judged gave (3/1)⁴ = 81:1;
/// normalised by what was stored and what was checked, 1:1. A miner
/// that soft-fails past an honest miner's noise scores lower; honest
/// noise costs nothing.
#[test]
fn weights_are_normalised_by_what_was_asked_and_checked() {
    let mut c = cfg();
    c.weight_windows = 3;
    let mut core = Core::new(c);
    let (a, b, d) = (miner(1), miner(2), miner(3));
    for w in 1..=3 {
        for m in [a, b, d] {
            store(&mut core, w, m, 2);
        }
    }
    core.apply_verdict(&proving(&core, verdict(1, a, 8, false)));
    for w in 1..=3 {
        core.apply_verdict(&proving(&core, verdict(w, b, 8, false)));
    }
    // d: 32 checked in all, 8 of them soft failures (25 %, honest ≤ 6.7 %).
    for w in 1..=2 {
        let mut v = proving(&core, verdict(w, d, 16, false));
        v.valid = 12;
        v.soft_failures = 4;
        core.apply_verdict(&v);
    }
    let weights = core.weights(3, miner(99));
    let get = |k| weights.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
    assert!((get(a) / get(b) - 1.0).abs() < 1e-12, "{} vs {}", get(a), get(b));
    // q = 1 − (8 − 0.067·32 − 2·√(0.067·0.933·32)) / 32 ≈ 0.9
    let q = (get(d) / get(a)).powf(0.25);
    assert!((0.85..0.95).contains(&q), "q = {q}");
    // One soft failure in 8 (within honest noise) costs nothing.
    let mut v = proving(&core, verdict(2, a, 8, false));
    v.valid = 7;
    v.soft_failures = 1;
    core.apply_verdict(&v);
    let weights = core.weights(3, miner(99));
    let get = |k| weights.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
    assert!((get(a) / get(b) - 1.0).abs() < 1e-12);
    // The exponent is a setting.
    let mut c = cfg();
    c.weight_windows = 3;
    c.weight_exponent = 1;
    let mut lin = Core::new(c);
    store(&mut lin, 1, a, 2);
    store(&mut lin, 1, b, 1);
    lin.apply_verdict(&proving(&lin, verdict(1, a, 8, false)));
    lin.apply_verdict(&proving(&lin, verdict(1, b, 4, false)));
    let weights = lin.weights(1, miner(99));
    let get = |k| weights.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
    assert!((get(a) - 2.0 / 3.0).abs() < 1e-12 && (get(b) - 1.0 / 3.0).abs() < 1e-12);
}

/// Issue 16 item 1: the core recomputes the assignment of a closed
/// window from what was stored; with two validators and committees of
/// one, their shares differ and together cover every miner.
#[test]
fn the_assignment_covers_every_miner_that_stored() {
    let mut c = cfg();
    let (v1, v2) = (Keypair::from_seed([100; 32]).public(), Keypair::from_seed([101; 32]).public());
    c.access.validators = [v1, v2].into_iter().collect();
    c.committee = 1;
    let mut core = Core::new(c);
    // Distinct first bytes: the test candidates' digests are built from it.
    let mut firsts = BTreeSet::new();
    let miners: Vec<PublicKey> = (1..=60).map(miner).filter(|m| firsts.insert(m.0[0])).take(9).collect();
    for m in &miners {
        store(&mut core, 1, *m, 1 + u32::from(m.0[0] % 2));
    }
    assert!(core.assignment(1, at(2)).is_none(), "not before the reveal");
    let a = core.assignment(1, at(2) + 200).unwrap();
    let share = |v| a.of_validator(v).map(|(m, _)| *m).collect::<BTreeSet<_>>();
    let (s1, s2) = (share(&v1), share(&v2));
    assert!(s1.is_disjoint(&s2) && !s1.is_empty() && !s2.is_empty());
    assert_eq!(&s1 | &s2, miners.iter().copied().collect());
    assert_eq!(core.reveal_with_assignment(1, at(2) + 200).unwrap().1.validators, {
        let mut v = vec![v1, v2];
        v.sort();
        v
    });
}

/// `key`'s commitment to its contribution to `window` on `core`'s network.
fn commit_of(core: &Core, key: &Keypair, window: WindowId) -> BeaconCommit {
    beacon::commit(key, &core.network(), window)
}

fn reveal_of(core: &Core, key: &Keypair, window: WindowId) -> BeaconReveal {
    BeaconReveal { window, secret: beacon::contribution_secret(key, &core.network(), window) }
}

#[test]
fn a_reveal_must_open_its_commitment() {
    let mut core = Core::new(cfg_two_validators());
    core.set_coordinator(Keypair::from_seed([9; 32]).public());
    let (v, t) = (Keypair::from_seed([100; 32]), Keypair::from_seed([77; 32]));
    let closes = core.schedule().closes_at(1);
    // Commitments while the window is open (or up to two windows ahead), by authorised keys.
    assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 1), true), Ok(true));
    assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 1), true), Ok(false), "the same again");
    assert_eq!(core.record_commit(at(0), &commit_of(&core, &t, 1), true), Ok(true));
    assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 4), true), Err(BeaconRefusal::TooEarly));
    let outsider = Keypair::from_seed([55; 32]);
    assert_eq!(core.record_commit(at(1), &commit_of(&core, &outsider, 1), true), Err(BeaconRefusal::Unauthorized));
    assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 2), false), Err(BeaconRefusal::BadSignature));
    let elsewhere = beacon::commit(&v, &NetworkId([1; 32]), 2);
    assert_eq!(core.record_commit(at(1), &elsewhere, true), Err(BeaconRefusal::BadSignature));
    // No re-roll: another commitment for the same window is refused.
    let mut reroll = commit_of(&core, &v, 1);
    reroll.body.commitment = [5; 32];
    assert_eq!(core.record_commit(at(1), &reroll, true), Err(BeaconRefusal::Conflict));
    // No commitment once submissions close.
    let late = Keypair::from_seed([101; 32]);
    assert_eq!(core.record_commit(closes, &commit_of(&core, &late, 1), true), Err(BeaconRefusal::Closed));

    // Reveals only after the close, and only the committed secret.
    assert_eq!(core.record_reveal(closes - 1, &v.public(), &reveal_of(&core, &v, 1)), Err(BeaconRefusal::NotClosed));
    let wrong = BeaconReveal { window: 1, secret: beacon::contribution_secret(&v, &core.network(), 2) };
    assert_eq!(core.record_reveal(closes, &v.public(), &wrong), Err(BeaconRefusal::Mismatch));
    let wrong = BeaconReveal { window: 1, secret: [0; 32] };
    assert_eq!(core.record_reveal(closes, &v.public(), &wrong), Err(BeaconRefusal::Mismatch));
    // Another party's secret under one's own key opens nothing.
    assert_eq!(core.record_reveal(closes, &v.public(), &reveal_of(&core, &t, 1)), Err(BeaconRefusal::Mismatch));
    assert_eq!(
        core.record_reveal(closes, &late.public(), &reveal_of(&core, &late, 1)),
        Err(BeaconRefusal::NotCommitted)
    );
    assert!(core.beacon_book(1).unwrap().reveals.is_empty(), "nothing refused was recorded");
    assert_eq!(core.record_reveal(closes, &v.public(), &reveal_of(&core, &v, 1)), Ok(true));
    assert_eq!(core.record_reveal(closes, &v.public(), &reveal_of(&core, &v, 1)), Ok(false));
}

#[test]
fn the_challenge_waits_for_the_reveals_and_the_coordinator_alone_cannot_compute_it() {
    let mut core = Core::new(cfg_two_validators());
    core.set_coordinator(Keypair::from_seed([9; 32]).public());
    let (v1, v2, t) = (Keypair::from_seed([100; 32]), Keypair::from_seed([101; 32]), Keypair::from_seed([77; 32]));
    for k in [&v1, &v2, &t] {
        core.record_commit(at(1), &commit_of(&core, k, 1), true).unwrap();
    }
    let closes = core.schedule().closes_at(1);
    let deadline = closes + core.config().reveal_ms;
    // Closed, nothing revealed: not fixed (the coordinator's secret alone fixes nothing).
    assert!(core.reveal(1, closes).is_none());
    assert!(core.reveal_frame(1, closes).is_none());
    // A validator's verdict waits for the challenge (its assignment).
    assert_eq!(core.record_verdict(closes, &verdict(1, miner(1), 1, false), true), Err(VerdictError::NotClosed));
    core.record_reveal(closes, &v1.public(), &reveal_of(&core, &v1, 1)).unwrap();
    core.record_reveal(closes, &t.public(), &reveal_of(&core, &t, 1)).unwrap();
    assert!(core.reveal(1, closes + 1).is_none(), "v2 may still reveal");
    core.record_reveal(closes + 1, &v2.public(), &reveal_of(&core, &v2, 1)).unwrap();
    // All revealed: fixed before the deadline.
    let challenge = core.reveal(1, closes + 1).expect("every contribution revealed");
    assert_ne!(challenge, core.coordinator_only_challenge(1), "the operator could not compute it in advance");
    assert_ne!(challenge, core.secrets(1).challenge);
    // Anyone recomputes it from the public reveal.
    let r = core.reveal_frame(1, closes + 1).unwrap();
    assert_eq!(r.contributions.len(), 3);
    assert!(r.withheld.is_empty());
    let commitment = core.window_info(1, at(1)).unwrap().commitment;
    assert_eq!(beacon::check_reveal(&r, &core.network(), &commitment), Ok(challenge));
    assert_eq!(core.record_verdict(closes + 1, &verdict(1, miner(1), 1, false), true), Ok(()));

    // Window 2: v2 withholds. Fixed at the deadline without it, and listed.
    for k in [&v1, &v2, &t] {
        core.record_commit(at(2), &commit_of(&core, k, 2), true).unwrap();
    }
    let closes = core.schedule().closes_at(2);
    let deadline2 = closes + core.config().reveal_ms;
    core.record_reveal(closes, &v1.public(), &reveal_of(&core, &v1, 2)).unwrap();
    core.record_reveal(closes, &t.public(), &reveal_of(&core, &t, 2)).unwrap();
    assert!(core.reveal(2, deadline2 - 1).is_none());
    let r = core.reveal_frame(2, deadline2).expect("fixed at the deadline");
    assert_eq!(r.withheld.iter().map(|c| c.body.party).collect::<Vec<_>>(), vec![v2.public()]);
    assert_eq!(
        beacon::check_reveal(&r, &core.network(), &core.window_info(2, at(2)).unwrap().commitment).unwrap().0,
        r.challenge
    );
    assert_eq!(core.record_reveal(deadline2, &v2.public(), &reveal_of(&core, &v2, 2)), Err(BeaconRefusal::Fixed));
    assert_eq!(core.withheld(deadline2).get(&v2.public()), Some(&vec![2]));
    core.observe(deadline2);
    let st = core.validator_statuses();
    let shown = |k: &Keypair| st.iter().find(|s| s.key == k.public().to_string()).unwrap().beacon_withheld.clone();
    assert_eq!((shown(&v1), shown(&v2)), (vec![], vec![2]), "/api/validators shows who withheld");
    assert!(deadline > closes - LEN, "window 1's deadline came before window 2's close");
    // A restarted core with the stored books recomputes the same challenges.
    let mut again = Core::new(cfg_two_validators());
    again.set_coordinator(Keypair::from_seed([9; 32]).public());
    for w in [1, 2] {
        again.restore_beacon(w, core.beacon_book(w).cloned().unwrap());
    }
    assert_eq!(again.reveal(1, deadline2), Some(challenge));
    assert_eq!(again.reveal(2, deadline2).map(|s| s.0), Some(r.challenge));
}

/// Issue 16 item 3: the second validator that confirms a failure must be
/// in the miner's committee for the window (three validators, committees
/// of two: a validator outside the committee confirms nothing).
#[test]
fn a_ban_needs_two_members_of_the_miners_committee() {
    let mut c = cfg_two_validators();
    let third = Keypair::from_seed([102; 32]).public();
    c.access.validators.insert(third);
    let mut core = Core::new(c);
    let m = miner(1);
    store(&mut core, 1, m, 2);
    let closed = at(2) + 200;
    let committee = core.assignment(1, closed).unwrap().miners[&m].committee.clone();
    assert_eq!(committee.len(), 2);
    let outsider = *core.config().access.validators.iter().find(|v| !committee.contains(v)).unwrap();
    let signer = |k: &PublicKey| (100..=102u8).find(|s| Keypair::from_seed([*s; 32]).public() == *k).unwrap();
    let cited = dig(&core, 1, m, 7);
    let claim = |k: &PublicKey| by(signer(k), failing(1, m, cited));
    core.record_verdict(closed, &claim(&committee[0]), true).unwrap();
    core.record_verdict(closed, &claim(&outsider), true).unwrap();
    assert!(!core.confirmed(1, &m), "a validator outside the committee does not confirm");
    assert!(!core.is_banned(&m, 2));
    assert_eq!(core.standing(1), vec![(m, MinerStanding::Suspect)]);
    core.record_verdict(closed, &claim(&committee[1]), true).unwrap();
    assert!(core.confirmed(1, &m) && core.is_banned(&m, 2), "two members of the committee confirm");
}
/// Issue 16's compute goal: only a miner's prover proves its groups
/// ahead of time. A failing verdict whose evidence needs the model waits
/// as a confirmation for the other member of the committee, which proves
/// only the cited rollouts: its failing verdict bans, its passing proof
/// refutes (and flags) the claimant. Evidence the coordinator re-checks
/// itself asks nobody, unless the coordinator cannot re-check.
#[test]
fn a_failure_waits_for_its_confirmer_and_only_the_confirming_verdict_bans() {
    let mut core = Core::new(cfg_two_validators());
    let (m, honest) = (miner(1), miner(2));
    store(&mut core, 1, m, 2);
    store(&mut core, 1, honest, 2);
    let closed = at(2) + 200;
    let signer = |k: &PublicKey| (100..=101u8).find(|s| Keypair::from_seed([*s; 32]).public() == *k).unwrap();
    let duty = core.duty(1, &m).unwrap();
    let (prover, confirmer) = (duty.committee[0], duty.committee[1]);
    assert_eq!(duty.confirmers(), [confirmer]);
    let (d7, d8) = (dig(&core, 1, m, 7), dig(&core, 1, m, 0));
    core.record_verdict(closed, &by(signer(&prover), failing(1, m, d7)), true).unwrap();
    assert!(!core.is_banned(&m, 2), "one model-based failure bans nobody");
    assert_eq!(core.standing(1), vec![(m, MinerStanding::Suspect)]);
    let page = core.confirmations(&confirmer, None, 10);
    assert_eq!(page.items.len(), 1, "a pending confirmation for the other member");
    let c = &page.items[0];
    assert_eq!((c.window, c.miner, c.digests.clone(), c.claimants.clone()), (1, m, vec![d7], vec![prover]));
    assert!(c.groups.is_empty());
    assert!(core.confirmations(&prover, None, 10).items.is_empty(), "nothing for the claimant itself");
    // A verdict of the confirmer that does not cover the cited rollout leaves it waiting.
    let mut unrelated = by(signer(&confirmer), verdict(1, m, 1, false));
    unrelated.add_passed(d8);
    core.record_verdict(closed, &unrelated, true).unwrap();
    assert!(!core.is_banned(&m, 2));
    assert_eq!(core.confirmations(&confirmer, None, 10).items.len(), 1);
    // The confirming verdict (the cited rollout fails for it too) bans.
    core.record_verdict(closed, &by(signer(&confirmer), failing(1, m, d7)), true).unwrap();
    assert!(core.is_banned(&m, 2), "the confirming verdict bans");
    assert!(core.confirmations(&confirmer, None, 10).items.is_empty(), "answered");

    // The confirmer proves the cited rollout passing: no ban, the claimant is flagged.
    let duty = core.duty(1, &honest).unwrap();
    let (prover, confirmer) = (duty.committee[0], duty.committee[1]);
    let d9 = dig(&core, 1, honest, 1);
    core.record_verdict(closed, &by(signer(&prover), failing(1, honest, d9)), true).unwrap();
    assert_eq!(core.confirmations(&confirmer, None, 10).items.len(), 1);
    let mut pass = by(signer(&confirmer), verdict(1, honest, 1, false));
    pass.add_passed(d9);
    core.record_verdict(closed, &pass, true).unwrap();
    assert!(!core.is_banned(&honest, 2));
    assert!(core.is_flagged(&prover), "refuted by the confirmer's proof");
    assert!(core.confirmations(&confirmer, None, 10).items.is_empty());

    // Model-free evidence: the coordinator re-checks it, nobody else is asked.
    let mut core = Core::new(cfg_two_validators());
    store(&mut core, 1, m, 2);
    let duty = core.duty(1, &m).unwrap();
    let mut reward = by(signer(&duty.committee[0]), failing(1, m, dig(&core, 1, m, 7)));
    reward.evidence[0].check = tributary_protocol::wire::FailedCheck::Reward;
    core.record_verdict(closed, &reward, true).unwrap();
    assert!(core.confirmations(&duty.committee[1], None, 10).items.is_empty());
    core.set_model_free_recheck(false);
    assert_eq!(core.confirmations(&duty.committee[1], None, 10).items.len(), 1, "unless it cannot re-check");
}

/// Confirmations are paged in (window, miner) order.
#[test]
fn confirmations_are_paged() {
    let mut core = Core::new(cfg_two_validators());
    let closed = at(3) + 200;
    let signer = |k: &PublicKey| (100..=101u8).find(|s| Keypair::from_seed([*s; 32]).public() == *k).unwrap();
    let confirmer = Keypair::from_seed([101; 32]).public();
    let mut want = Vec::new();
    for w in 1..=2 {
        for n in 1..=3 {
            store(&mut core, w, miner(n), 1);
        }
        for n in 1..=3 {
            let duty = core.duty(w, &miner(n)).unwrap();
            let cited = dig(&core, w, miner(n), u32::from(n));
            core.record_verdict(closed, &by(signer(&duty.committee[0]), failing(w, miner(n), cited)), true).unwrap();
            if duty.committee[1] == confirmer {
                want.push((w, miner(n)));
            }
        }
    }
    want.sort();
    let mut got = Vec::new();
    let mut after = None;
    loop {
        let page = core.confirmations(&confirmer, after, 1);
        assert!(page.items.len() <= 1);
        got.extend(page.items.iter().map(|c| (c.window, c.miner)));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(got, want);
    assert!(!want.is_empty());
}

/// Issue 16: a party that withholds its reveal `WITHHOLD_LIMIT` times
/// in a row stops counting: its commitments are refused, a validator's
/// verdicts are set aside and `/api/validators` flags it, until an
/// operator clears it. Fewer in a row (what a crash causes) change nothing.
#[test]
fn a_party_that_keeps_withholding_stops_counting_until_cleared() {
    let mut core = Core::new(cfg_two_validators());
    core.set_coordinator(Keypair::from_seed([9; 32]).public());
    let (v1, v2) = (Keypair::from_seed([100; 32]), Keypair::from_seed([101; 32]));
    let deadline = |core: &Core, w| core.schedule().closes_at(w) + core.config().reveal_ms;
    let limit = WITHHOLD_LIMIT as u64;
    // v2 commits to windows 1..=limit and reveals none; v1 reveals every one.
    for w in 1..=limit {
        for k in [&v1, &v2] {
            core.record_commit(at(w), &commit_of(&core, k, w), true).unwrap();
        }
        let closes = core.schedule().closes_at(w);
        core.record_reveal(closes, &v1.public(), &reveal_of(&core, &v1, w)).unwrap();
        core.observe(deadline(&core, w));
        let expect = w >= limit;
        assert_eq!(core.withholding(&v2.public(), deadline(&core, w)), expect, "after {w} withheld in a row");
        assert!(!core.withholding(&v1.public(), deadline(&core, w)));
    }
    let now = deadline(&core, limit);
    let next = limit + 1;
    assert_eq!(core.record_commit(now, &commit_of(&core, &v2, next + 1), true), Err(BeaconRefusal::Withholding));
    assert_eq!(core.record_commit(now, &commit_of(&core, &v1, next + 1), true), Ok(true));
    // Its verdicts stop counting (stored, set aside); /api/validators flags it.
    let m = miner(1);
    core.record_verdict(now, &by(101, verdict(limit, m, 1, false)), true).unwrap();
    assert!(core.verdicts_on(limit, &m).is_empty(), "a withholder's verdict is set aside");
    assert!(core.is_flagged(&v2.public()));
    let st = core.validator_statuses();
    let shown = st.iter().find(|s| s.key == v2.public().to_string()).unwrap();
    assert!(shown.flagged && shown.withholding, "{shown:?}");
    assert!(!st.iter().find(|s| s.key == v1.public().to_string()).unwrap().flagged);
    // An operator clears it: its verdicts count again, it may contribute again.
    core.clear_validator(&v2.public());
    assert!(!core.is_flagged(&v2.public()));
    assert_eq!(core.verdicts_on(limit, &m).len(), 1);
    assert_eq!(core.record_commit(now, &commit_of(&core, &v2, next + 1), true), Ok(true));
}
