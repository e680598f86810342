//! Issue 29 item 5 (network-security review 2, finding 5): the core's books
//! are pruned as windows close. Over 240 windows of an honest network (three
//! miners storing whole groups, a validator passing them) under a standing
//! Sybil load (40 fresh keys a window, half admitted once, half refused),
//! with `Core::prune` run as each window closes (what the server's upkeep
//! does every 30 s), every map of the core holds no more entries at the end
//! than once the rules' span was first full: memory is flat, not growing
//! with the windows or with the keys that ever knocked.

use coordinator::core::{Access, Core, Footprint};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::VerdictBody;

const LEN: u64 = 1_000;
const GROUP: u32 = 4;
const WINDOWS: u64 = 240;

fn key(n: u64) -> PublicKey {
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&n.to_le_bytes());
    seed[31] = 9;
    Keypair::from_seed(seed).public()
}

fn core() -> Core {
    let mut cfg = coordinator::testing::core_config(Access { validators: [key(100)].into(), ..Access::default() });
    cfg.max_window_bytes = 1 << 30;
    cfg.max_window_miners = 24;
    cfg.committee = 1;
    let mut core = Core::new(cfg);
    core.set_coordinator(key(99));
    core
}

fn at(window: WindowId) -> u64 {
    10_000 + window * LEN + 1
}

/// Each field of `now` is at most `then`'s.
fn no_larger(now: &Footprint, then: &Footprint) -> bool {
    let f = |x: &Footprint| {
        [
            x.books,
            x.book_keys,
            x.miners,
            x.failures,
            x.verdicts,
            x.set_aside,
            x.tribunal,
            x.submitted,
            x.beacon,
            x.disputed,
            x.committees,
        ]
    };
    f(now).iter().zip(f(then)).all(|(a, b)| *a <= b)
}

#[test]
fn the_cores_books_stay_flat_over_240_windows_of_sybil_load() {
    let mut core = core();
    let honest: Vec<PublicKey> = (1..=3).map(key).collect();
    let mut sybil = 1_000_000u64;
    let mut steady: Option<Footprint> = None;
    let mut peak = None::<Footprint>;
    for w in 1..=WINDOWS {
        let t = at(w);
        for h in &honest {
            let mut passed = Vec::new();
            for g in 0..2 {
                for i in 0..GROUP {
                    let c = coordinator::testing::candidate(&core, w, *h, g, i, 1000);
                    core.admit(t, h, &c).expect("an honest rollout");
                    core.commit(&c);
                    passed.push(c.digest);
                }
            }
            // The validator proves the previous window's work during this one.
            let _ = passed;
        }
        if w >= 2 {
            for h in &honest {
                let mut v = VerdictBody::empty(w - 1, *h, key(100));
                v.checked = 2 * GROUP;
                v.valid = 2 * GROUP;
                v.estimated_valid = 2 * GROUP;
                for g in 0..2 {
                    for i in 0..GROUP {
                        v.add_passed(coordinator::testing::candidate(&core, w - 1, *h, g, i, 1000).digest);
                    }
                }
                core.record_verdict(t + 200, &v, true).expect("the validator's pass");
            }
        }
        // The Sybil load: 40 fresh keys, one rollout each (the window's cap
        // lets some in, refuses the rest as window_full), and a refused
        // unassigned rollout from each.
        for _ in 0..40 {
            sybil += 1;
            let s = key(sybil);
            let c = coordinator::testing::candidate(&core, w, s, 0, 0, 1000);
            if core.admit(t, &s, &c).is_ok() {
                core.commit(&c);
            }
            let mut bad = coordinator::testing::candidate(&core, w, s, 0, 1, 1000);
            bad.task_id ^= 1;
            let _ = core.admit(t, &s, &bad);
        }
        // The window closed: the server's upkeep prunes.
        core.prune(at(w + 1) + 1);
        let fp = core.footprint();
        if w == 40 {
            steady = Some(fp);
        }
        if w > 40 {
            let s = steady.expect("set at window 40");
            assert!(no_larger(&fp, &s), "window {w}: {fp:?} grew past {s:?}");
        }
        peak = Some(fp);
    }
    let s = steady.expect("steady state");
    eprintln!("footprint at window 40: {s:?}\nat window {WINDOWS}: {:?}", peak.expect("last"));
    // Not pruned to nothing: what the rules read is still there.
    assert!(s.verdicts >= 3 * 12 && s.submitted >= 3 * 12, "{s:?}");
    assert!(core.weights(WINDOWS - 1, key(99)).weights.iter().any(|(k, _)| *k == honest[0]));
}
