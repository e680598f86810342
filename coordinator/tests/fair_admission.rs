//! Issue 29 item 1 (network-security review 2, finding 1): admission that
//! honest miners win. A window's caps (distinct keys, bytes) are shared by a
//! rule a Sybil cannot buy with keys alone: keys with proven work have slots
//! reserved, and each key's byte share is fixed (the window's bytes over its
//! key cap), whatever arrived first or stored in the last window.
//!
//! Each test reproduces the probe's shape at test scale and asserts what
//! the honest party gets; on the old rule (first come, first served; a share
//! from the keys seen) each fails.

use coordinator::core::{Access, Core};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{RejectReason, VerdictBody};

const LEN: u64 = 1_000;
const GROUP: u32 = 4;
const VALIDATOR: u8 = 100;

fn key(n: u32) -> PublicKey {
    let mut seed = [0u8; 32];
    seed[..4].copy_from_slice(&n.to_le_bytes());
    seed[31] = 7;
    Keypair::from_seed(seed).public()
}

/// One validator (key 100); `miners` keys and `bytes` per window.
fn core(miners: u32, bytes: u64) -> Core {
    let mut cfg =
        coordinator::testing::core_config(Access { validators: [key(VALIDATOR as u32)].into(), ..Access::default() });
    cfg.max_window_bytes = bytes;
    cfg.max_window_miners = miners;
    cfg.committee = 1;
    let mut core = Core::new(cfg);
    core.set_coordinator(key(99));
    core
}

fn at(window: WindowId) -> u64 {
    10_000 + window * LEN + 1
}

/// `m`'s rollout (`group`, `index`) of `bytes` bytes in `w`, admitted and stored if the door lets it.
fn submit(core: &mut Core, w: WindowId, m: PublicKey, group: u32, index: u32, bytes: u32) -> Result<(), RejectReason> {
    let c = coordinator::testing::candidate(core, w, m, group, index, bytes);
    core.admit(at(w), &m, &c)?;
    core.commit(&c);
    Ok(())
}

/// Makes `m` proven: a whole group stored in `w` and the validator's pass on it.
fn prove(core: &mut Core, w: WindowId, m: PublicKey) {
    for i in 0..GROUP {
        submit(core, w, m, 0, i, 1000).expect("an honest rollout in a quiet window");
    }
    let digests: Vec<[u8; 32]> =
        (0..GROUP).map(|i| coordinator::testing::candidate(core, w, m, 0, i, 1000).digest).collect();
    let mut v = VerdictBody::empty(w, m, key(VALIDATOR as u32));
    v.checked = GROUP;
    v.valid = GROUP;
    v.estimated_valid = GROUP;
    for d in digests {
        v.add_passed(d);
    }
    core.record_verdict(at(w + 2), &v, true).expect("the validator's pass");
}

/// Finding 1, slots: the cap is 50 keys; three honest miners proved work in
/// window 1; in window 4, 60 new keys each submit a rollout the moment it
/// opens, before any honest miner has one. The honest miners still store
/// every rollout of their assignment; the new keys get the 47 slots left.
#[test]
fn a_sybil_wave_at_window_open_does_not_lock_out_proven_miners() {
    let mut core = core(50, 1 << 30);
    let honest: Vec<PublicKey> = (1..=3).map(key).collect();
    for h in &honest {
        prove(&mut core, 1, *h);
    }
    let w = 4;
    let mut sybils_in = 0;
    for s in 1000..1060 {
        match submit(&mut core, w, key(s), 0, 0, 220) {
            Ok(()) => sybils_in += 1,
            Err(r) => assert_eq!(r, RejectReason::WindowFull, "a refusal says: next window"),
        }
    }
    assert_eq!(sybils_in, 47, "new keys take the cap minus the proven keys' reserve");
    for h in &honest {
        for g in 0..2 {
            for i in 0..GROUP {
                assert_eq!(submit(&mut core, w, *h, g, i, 1000), Ok(()), "honest {} ({g}, {i})", h.short());
            }
        }
    }
    // The reserve never lets the window past its cap.
    assert_eq!(core.window_usage(w).1, 50);
    assert_eq!(submit(&mut core, w, key(2000), 0, 0, 220), Err(RejectReason::WindowFull));
}

/// Finding 1, bytes: after an empty window the first key could fill the
/// whole byte budget (1 MiB in 0.7 s) and a 950-byte honest rollout was
/// refused. Each key's share is now the budget over the key cap, whatever
/// the last window held: the attacker's key stores 1 of its 100 KB
/// rollouts and a new honest key's rollout fits.
#[test]
fn the_first_key_after_an_empty_window_cannot_fill_the_byte_budget() {
    let mut core = core(10, 1 << 20);
    let w = 5;
    let attacker = key(66);
    let mut taken = 0;
    for slot in 0..2 * GROUP {
        match submit(&mut core, w, attacker, slot / GROUP, slot % GROUP, 100_000) {
            Ok(()) => taken += 1,
            Err(r) => assert_eq!(r, RejectReason::WindowFull),
        }
    }
    assert_eq!(taken, 1, "one key's share is 1 MiB / 10");
    assert_eq!(submit(&mut core, w, key(5), 0, 0, 950), Ok(()), "the honest newcomer's rollout fits");
}

/// The runbook's arithmetic (docs/runbook.md, "Admission"): with P proven
/// keys and a cap of M, new keys get M − min(P, ⌊3M/4⌋) slots, so new keys
/// alone can never take a proven key's slot; past ¾M proven keys, the
/// rest compete with new keys for the last quarter.
#[test]
fn the_reserve_follows_the_runbooks_arithmetic() {
    for (m, p) in [(8u32, 0u32), (8, 2), (8, 6), (8, 8), (20, 15), (20, 17)] {
        let mut core = core(m, 1 << 30);
        for i in 0..p {
            prove(&mut core, 1, key(i + 1));
        }
        let w = 3;
        let mut new_in = 0;
        for s in 0..2 * m {
            if submit(&mut core, w, key(5000 + s), 0, 0, 220).is_ok() {
                new_in += 1;
            }
        }
        let reserved = p.min(m * 3 / 4);
        assert_eq!(new_in, m - reserved, "M {m} P {p}");
        let mut proven_in = 0;
        for i in 0..p {
            if submit(&mut core, w, key(i + 1), 0, 0, 220).is_ok() {
                proven_in += 1;
            }
        }
        assert_eq!(proven_in, reserved, "every reserved slot goes to a proven key (M {m} P {p})");
    }
}

/// A proven key that later fails loses its reserve: a failure held against
/// it (the validator's hard failure on a stored rollout) makes it a new
/// key again.
#[test]
fn a_failure_ends_the_reserve() {
    let mut core = core(4, 1 << 30);
    let h = key(1);
    prove(&mut core, 1, h);
    assert!(core.proven_miners(at(3), 3).contains(&h));
    for i in 0..GROUP {
        submit(&mut core, 2, h, 0, i, 1000).expect("stored");
    }
    let d = coordinator::testing::candidate(&core, 2, h, 0, 0, 1000).digest;
    let mut v = VerdictBody::empty(2, h, key(VALIDATOR as u32));
    v.checked = 1;
    v.hard_failure = true;
    v.add_evidence(tributary_protocol::wire::FailureEvidence {
        digest: d,
        group: 0,
        rollout: 0,
        check: tributary_protocol::wire::FailedCheck::Sampling,
        hard: true,
        position: Some(3),
        figures: tributary_protocol::wire::Figures::None,
    });
    core.record_verdict(at(4), &v, true).expect("the failure");
    assert!(!core.proven_miners(at(5), 5).contains(&h));
}
