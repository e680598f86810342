//! Issue 28 (review incentives-and-proof-2, findings B, C, D, G): a network
//! that pays only for proven work, on the sans-IO core.
//!
//! - B: an unconfirmed hard failure costs the miner its weight at once, with
//!   one validator (nothing can confirm it); it does not ban.
//! - C: a pass contradicted by the coordinator's own re-check flags the
//!   validator that passed it, never the prover; only a member of the
//!   miner's committee may refute.
//! - D (coordinator side): only whole groups count as work.
//! - G: a claim on a digest the store lacks is void; a claim from outside the
//!   committee cannot hold a miner `Suspect` once its prover passed it.

use coordinator::core::{Access, Core};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{FailedCheck, FailureEvidence, Figures, MinerStanding, VerdictBody};

const LEN: u64 = 1_000;
const GROUP: u32 = 4;

fn key(n: u8) -> PublicKey {
    Keypair::from_seed([n; 32]).public()
}

/// Validators are keys 100, 101, ...; the trainer 77; the coordinator 99.
fn core(validators: u8) -> Core {
    let cfg = coordinator::testing::core_config(Access {
        validators: (0..validators).map(|i| key(100 + i)).collect(),
        trainer: Some(key(77)),
        ..Access::default()
    });
    let mut core = Core::new(cfg);
    core.set_coordinator(key(99));
    core
}

fn at(window: WindowId) -> u64 {
    10_000 + window * LEN + 1
}

/// After window `w` closed and its challenge was fixed.
fn closed(w: WindowId) -> u64 {
    at(w + 2)
}

/// Stores `indices` of `m`'s group `g` in window `w`; returns their digests.
fn store(core: &mut Core, w: WindowId, m: PublicKey, g: u32, indices: std::ops::Range<u32>) -> Vec<[u8; 32]> {
    indices
        .map(|i| {
            let c = coordinator::testing::candidate(core, w, m, g, i, 2000);
            core.admit(at(w), &m, &c).expect("admitted");
            core.commit(&c);
            c.digest
        })
        .collect()
}

/// Stores `groups` whole groups of `m` in window `w`.
fn store_groups(core: &mut Core, w: WindowId, m: PublicKey, groups: u32) -> Vec<[u8; 32]> {
    (0..groups).flat_map(|g| store(core, w, m, g, 0..GROUP)).collect()
}

fn evidence(digest: [u8; 32], check: FailedCheck) -> FailureEvidence {
    FailureEvidence { digest, group: 0, rollout: 0, check, hard: true, position: Some(44), figures: Figures::None }
}

/// `by`'s verdict on `m` in `w`: `passed` proved passing, `failed` failing `check`.
fn verdict(
    w: WindowId,
    m: PublicKey,
    by: PublicKey,
    passed: &[[u8; 32]],
    failed: &[([u8; 32], FailedCheck)],
) -> VerdictBody {
    let mut v = VerdictBody::empty(w, m, by);
    v.checked = (passed.len() + failed.len()) as u32;
    v.valid = passed.len() as u32;
    v.estimated_valid = if failed.is_empty() { v.valid } else { 0 };
    v.hard_failure = !failed.is_empty();
    for d in passed {
        v.add_passed(*d);
    }
    for (d, c) in failed {
        v.add_evidence(evidence(*d, *c));
    }
    v
}

fn weight(core: &Core, upto: WindowId, m: PublicKey) -> f64 {
    core.weights(upto, key(99)).weights.iter().find(|(k, _)| *k == m).map_or(0.0, |(_, w)| *w)
}

fn standing(core: &Core, w: WindowId, m: PublicKey) -> Option<MinerStanding> {
    core.standing(w).into_iter().find(|(k, _)| *k == m).map(|(_, s)| s)
}

/// B: one validator; miners m and h store 2 groups each; the prover posts a
/// sampling failure for m and a pass for h. m's failure cannot be confirmed
/// (one validator: no second committee member) and bans nobody, but m is not
/// paid for the window: m's weight is below h's (it was 0.5 each).
#[test]
fn an_unconfirmed_hard_failure_costs_the_weight_with_one_validator() {
    let mut core = core(1);
    let (m, h, v) = (key(1), key(2), key(100));
    let dm = store_groups(&mut core, 1, m, 2);
    let dh = store_groups(&mut core, 1, h, 2);
    core.record_verdict(closed(1), &verdict(1, m, v, &dm[1..], &[(dm[0], FailedCheck::Sampling)]), true)
        .expect("m's verdict");
    core.record_verdict(closed(1), &verdict(1, h, v, &dh, &[]), true).expect("h's verdict");
    assert!(!core.is_banned(&m, 2), "one validator's model-based failure is no ban");
    let (wm, wh) = (weight(&core, 1, m), weight(&core, 1, h));
    assert!(wm < wh, "m {wm} h {wh}");
    assert_eq!(wm, 0.0, "a hard failure costs the window's weight at once");
}

/// B (the rest of item 2): a miner with nothing proven is not paid, and the
/// score counts only what passed a proof — the trainer's passing proof counts
/// like a validator's.
#[test]
fn only_proven_work_is_paid() {
    let mut core = core(1);
    let (a, b, c, v) = (key(1), key(2), key(3), key(100));
    let da = store_groups(&mut core, 1, a, 2);
    let db = store_groups(&mut core, 1, b, 2);
    store_groups(&mut core, 1, c, 2);
    core.record_verdict(closed(1), &verdict(1, a, v, &da, &[]), true).expect("a");
    // b: judged by the trainer's proof only.
    core.record_verdict(closed(1), &verdict(1, b, key(77), &db[..GROUP as usize], &[]), true).expect("b");
    // c: a verdict that proved nothing (checked nothing).
    core.record_verdict(closed(1), &VerdictBody::empty(1, c, v), true).expect("c");
    assert!(weight(&core, 1, a) > 0.0);
    assert!((weight(&core, 1, a) / weight(&core, 1, b) - 1.0).abs() < 1e-12, "the trainer's proof pays too");
    assert_eq!(weight(&core, 1, c), 0.0, "nothing proven, nothing paid");
}

/// C: three validators, L outside m's committee; the prover claims Reward on
/// d and the coordinator's re-check confirms it; L posts passed=[d]. The
/// prover is not flagged, L is (it was the reverse). The same with L's pass
/// first.
#[test]
fn a_pass_against_the_coordinators_recheck_flags_the_passer() {
    for pass_first in [false, true] {
        let mut core = core(3);
        let m = key(1);
        let dm = store_groups(&mut core, 1, m, 2);
        let d = dm[0];
        let duty = core.duty(1, &m).expect("m's duty");
        let prover = duty.committee[0];
        let outsider = (100..103).map(key).find(|k| !duty.committee.contains(k)).expect("a validator outside");
        let pass = verdict(1, m, outsider, &[d], &[]);
        if pass_first {
            core.record_verdict(closed(1), &pass, true).expect("L's pass");
        }
        core.record_verdict(closed(1), &verdict(1, m, prover, &dm[1..], &[(d, FailedCheck::Reward)]), true)
            .expect("the prover's claim");
        // The server's model-free re-check: the coordinator's own verdict.
        let mut own = verdict(1, m, key(99), &[], &[(d, FailedCheck::Reward)]);
        own.checked = 1;
        core.apply_verdict(&own);
        if !pass_first {
            core.record_verdict(closed(1), &pass, true).expect("L's pass");
        }
        assert!(!core.is_flagged(&prover), "pass first {pass_first}: the prover was flagged");
        assert!(core.is_flagged(&outsider), "pass first {pass_first}: L was not flagged");
        assert!(core.is_banned(&m, 2), "the coordinator's re-check confirms");
        assert_eq!(weight(&core, 1, m), 0.0);
    }
}

/// C: only a member of the miner's committee refutes a claim; the trainer's
/// failures are recorded as claims, and a validator's pass of one flags it.
#[test]
fn only_the_committee_refutes_and_the_trainers_failure_is_a_claim() {
    let mut core = core(3);
    let m = key(1);
    let dm = store_groups(&mut core, 1, m, 2);
    let duty = core.duty(1, &m).expect("m's duty");
    let (prover, confirmer) = (duty.committee[0], duty.committee[1]);
    let outsider = (100..103).map(key).find(|k| !duty.committee.contains(k)).expect("a validator outside");
    core.record_verdict(closed(1), &verdict(1, m, prover, &[], &[(dm[0], FailedCheck::Sampling)]), true)
        .expect("claim");
    core.record_verdict(closed(1), &verdict(1, m, outsider, &[dm[0]], &[]), true).expect("outsider's pass");
    assert!(!core.is_flagged(&prover), "an outsider's pass refuted a committee member");
    assert!(core.pending(1, &m));
    core.record_verdict(closed(1), &verdict(1, m, confirmer, &[dm[0]], &[]), true).expect("confirmer's pass");
    assert!(core.is_flagged(&prover), "the committee's own pass refutes");

    // The trainer proves a rollout failing that a validator passed: the validator is flagged.
    let mut core = self::core(3);
    let dm = store_groups(&mut core, 1, m, 2);
    let prover = core.duty(1, &m).expect("duty").committee[0];
    core.record_verdict(closed(1), &verdict(1, m, prover, &dm, &[]), true).expect("pass");
    core.record_verdict(closed(1), &verdict(1, m, key(77), &[], &[(dm[2], FailedCheck::Sampling)]), true)
        .expect("the trainer's failure");
    assert!(core.is_flagged(&prover), "a pass contradicted by the trainer's proof");
    assert!(core.is_banned(&m, 2));
}

/// C, the dispute (netsim: an honest validator ended flagged in 1 of 4
/// three-validator runs): a colluding committee member L's pass of the
/// rollout the honest prover P cited (a model-based check, before or after
/// P's claim) refuted P on L's word alone, and P stayed flagged unless the
/// trainer happened to prove that miner in that window. The coordinator asks
/// the third validator T to prove the disputed rollout; T's failure outvotes
/// L's pass: L is flagged, P is not, and m is paid nothing (an unconfirmed
/// failure). The other way round, a lying claimant stays refuted when T passes.
#[test]
fn a_disputed_rollout_goes_to_a_third_validator_and_the_majority_decides() {
    for pass_first in [true, false] {
        let mut core = core(3);
        let m = key(1);
        let dm = store_groups(&mut core, 1, m, 2);
        let d = dm[0];
        let duty = core.duty(1, &m).expect("m's duty");
        let (p, l) = (duty.committee[0], duty.committee[1]);
        let t = (100..103).map(key).find(|k| !duty.committee.contains(k)).expect("a validator outside");
        let pass = verdict(1, m, l, &dm, &[]);
        if pass_first {
            core.record_verdict(closed(1), &pass, true).expect("L's pass");
        }
        core.record_verdict(closed(1), &verdict(1, m, p, &dm[1..], &[(d, FailedCheck::Sampling)]), true)
            .expect("P's claim");
        if !pass_first {
            core.record_verdict(closed(1), &pass, true).expect("L's pass");
        }
        assert!(core.is_flagged(&p), "pass first {pass_first}: L's pass refutes P until a tie-breaker");
        let asked = core.confirmations(&t, None, 10);
        assert_eq!(asked.items.len(), 1, "pass first {pass_first}: T is asked to break the tie: {asked:?}");
        assert_eq!(asked.items[0].digests, vec![d]);
        assert!(core.confirmations(&l, None, 10).items.iter().all(|c| !c.digests.contains(&d)));
        core.record_verdict(closed(1), &verdict(1, m, t, &[], &[(d, FailedCheck::Sampling)]), true)
            .expect("T's failure");
        assert!(!core.is_flagged(&p), "pass first {pass_first}: P stayed flagged");
        assert!(core.is_flagged(&l), "pass first {pass_first}: L was not flagged");
        assert!(!core.is_flagged(&t));
        assert_eq!(weight(&core, 1, m), 0.0, "pass first {pass_first}: m is paid");
        assert!(core.confirmations(&t, None, 10).items.is_empty(), "the tie is broken");
    }

    // A lying claimant L against honest h: P passes, T passes too.
    let mut core = core(3);
    let h = key(2);
    let dh = store_groups(&mut core, 1, h, 2);
    let duty = core.duty(1, &h).expect("h's duty");
    let (p, l) = (duty.committee[0], duty.committee[1]);
    let t = (100..103).map(key).find(|k| !duty.committee.contains(k)).expect("a validator outside");
    core.record_verdict(closed(1), &verdict(1, h, l, &[], &[(dh[2], FailedCheck::Sampling)]), true)
        .expect("L's false claim");
    core.record_verdict(closed(1), &verdict(1, h, p, &dh, &[]), true).expect("P's pass");
    assert!(core.is_flagged(&l));
    assert_eq!(core.confirmations(&t, None, 10).items.len(), 1, "T is asked");
    core.record_verdict(closed(1), &verdict(1, h, t, &[dh[2]], &[]), true).expect("T's pass");
    assert!(core.is_flagged(&l) && !core.is_flagged(&p) && !core.is_flagged(&t));
    assert!(weight(&core, 1, h) > 0.0);
}

/// Pay delayed (`Core::delayed_weights`, what netsim --economics measures
/// against a miner faking 1 % of its rollouts): the work of window 1 is paid
/// in the document of window 3, and a failure caught in windows 2 or 3
/// forfeits it; with no delay it was paid in window 1's document already.
#[test]
fn delayed_pay_is_forfeited_by_a_failure_caught_before_it_is_due() {
    let mut core = core(1);
    let (m, h, v) = (key(1), key(2), key(100));
    let dm = store_groups(&mut core, 1, m, 2);
    let dh = store_groups(&mut core, 1, h, 2);
    core.record_verdict(closed(1), &verdict(1, m, v, &dm, &[]), true).expect("m passes window 1");
    core.record_verdict(closed(1), &verdict(1, h, v, &dh, &[]), true).expect("h passes window 1");
    assert!(weight(&core, 1, m) > 0.0, "undelayed: m is paid for window 1 at once");
    let delayed = |core: &Core, upto: WindowId, k: PublicKey| {
        core.delayed_weights(upto, 2, key(99)).weights.iter().find(|(x, _)| *x == k).map_or(0.0, |(_, w)| *w)
    };
    assert!(core.delayed_weights(1, 2, key(99)).weights.is_empty(), "nothing is due before window 1 + 2");
    // Window 3: m's rollout fails (its 1 % of faked tokens caught).
    let dm3 = store_groups(&mut core, 3, m, 2);
    let dh3 = store_groups(&mut core, 3, h, 2);
    core.record_verdict(closed(3), &verdict(3, m, v, &dm3[1..], &[(dm3[0], FailedCheck::Sampling)]), true)
        .expect("m's failure");
    core.record_verdict(closed(3), &verdict(3, h, v, &dh3, &[]), true).expect("h passes window 3");
    assert_eq!(delayed(&core, 3, m), 0.0, "m's window-1 work is forfeited");
    assert_eq!(delayed(&core, 3, h), 1.0, "h's window-1 work is paid in window 3's document");
}

/// G: an outsider claims a failure on a digest never stored; h's prover
/// passes what it was assigned: h is not `Suspect` (it stayed so), and
/// nothing waits for a confirmation.
#[test]
fn a_claim_without_evidence_in_the_store_holds_nobody_suspect() {
    let mut core = core(3);
    let h = key(2);
    let dh = store_groups(&mut core, 1, h, 2);
    let duty = core.duty(1, &h).expect("h's duty");
    let outsider = (100..103).map(key).find(|k| !duty.committee.contains(k)).expect("a validator outside");
    core.record_verdict(closed(1), &verdict(1, h, outsider, &[], &[([0xee; 32], FailedCheck::Sampling)]), true)
        .expect("the outsider's claim");
    core.record_verdict(closed(1), &verdict(1, h, duty.committee[0], &dh, &[]), true).expect("the prover's pass");
    assert_eq!(standing(&core, 1, h), Some(MinerStanding::Passed), "{:?}", core.standing(1));
    assert!(!core.pending(1, &h));
    assert!(weight(&core, 1, h) > 0.0);
    // Even from a committee member, a claim on a digest the store lacks is void.
    let mut core = self::core(1);
    let dh = store_groups(&mut core, 1, h, 2);
    core.record_verdict(closed(1), &verdict(1, h, key(100), &dh, &[([0xee; 32], FailedCheck::Sampling)]), true)
        .expect("claim");
    assert_eq!(standing(&core, 1, h), Some(MinerStanding::Passed), "{:?}", core.standing(1));
    assert!(weight(&core, 1, h) > 0.0);
}

/// G: a claim from outside the committee on a stored digest does not make
/// the miner `Suspect` nor cost its weight; it is sent to the committee for
/// confirmation, and the prover's pass of the cited rollout refutes it.
#[test]
fn an_outsiders_claim_is_sent_to_the_committee() {
    let mut core = core(3);
    let h = key(2);
    let dh = store_groups(&mut core, 1, h, 2);
    let duty = core.duty(1, &h).expect("h's duty");
    let outsider = (100..103).map(key).find(|k| !duty.committee.contains(k)).expect("a validator outside");
    core.record_verdict(closed(1), &verdict(1, h, outsider, &[], &[(dh[3], FailedCheck::Sampling)]), true)
        .expect("the outsider's claim");
    assert_eq!(standing(&core, 1, h), Some(MinerStanding::Passed), "{:?}", core.standing(1));
    let asked = core.confirmations(&duty.committee[0], None, 10);
    assert_eq!(asked.items.len(), 1, "the prover is asked to prove the cited rollout");
    assert_eq!(asked.items[0].digests, vec![dh[3]]);
    core.record_verdict(closed(1), &verdict(1, h, duty.committee[0], &dh, &[]), true).expect("the prover's pass");
    assert!(core.is_flagged(&outsider));
    assert!(weight(&core, 1, h) > 0.0);
}

/// D (the coordinator's side): a group counts only whole. A miner that
/// stores a subset of a group is not paid for it, and a miner that stored
/// only subsets is not paid at all, though its stored rollouts passed.
#[test]
fn only_whole_groups_count() {
    let mut core = core(1);
    let (a, c, s, v) = (key(1), key(3), key(4), key(100));
    let da = store_groups(&mut core, 1, a, 2);
    let mut dc = store(&mut core, 1, c, 0, 0..GROUP);
    dc.extend(store(&mut core, 1, c, 1, 0..2));
    store(&mut core, 1, s, 0, 0..2);
    store(&mut core, 1, s, 1, 1..3);
    let ds: Vec<[u8; 32]> = (0..2u32)
        .flat_map(|g| (0..GROUP).map(move |i| (g, i)))
        .map(|(g, i)| coordinator::testing::candidate(&core, 1, s, g, i, 2000).digest)
        .collect();
    core.record_verdict(closed(1), &verdict(1, a, v, &da, &[]), true).expect("a");
    core.record_verdict(closed(1), &verdict(1, c, v, &dc, &[]), true).expect("c");
    core.record_verdict(closed(1), &verdict(1, s, v, &ds, &[]), true).expect("s");
    let ratio = weight(&core, 1, c) / weight(&core, 1, a);
    assert!((ratio - 0.5f64.powi(4)).abs() < 1e-12, "c ÷ a = {ratio}: the subset counted");
    assert_eq!(weight(&core, 1, s), 0.0);
}
