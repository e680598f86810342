//! The window's storage budget is shared fairly between keys: one key that
//! submits first cannot take the whole per-window budget before the miners
//! that stored in the previous window submit. Each key may store at most the
//! budget divided among the keys storing in this window or the previous one
//! (never less than an even split among `max_window_miners`).

use coordinator::core::{Candidate, Core};
use coordinator::node::{self, Config};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::wire::RejectReason;

/// A rollout of 100 KB claimed by `m` in `window` (open at `now`), slot (`group`, `index`).
fn cand(core: &Core, now: u64, window: u64, m: PublicKey, group: u32, index: u32) -> Candidate {
    core.window_info(window, now).expect("window open");
    coordinator::testing::candidate(core, window, m, group, index, 100_000)
}

#[tokio::test]
async fn one_key_cannot_take_the_window_budget_from_the_miners_of_the_last_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().into());
    cfg.window_ms = 600_000;
    // 1 MiB a window: ten of these rollouts.
    cfg.max_window_mib = 1;
    let node = node::start(&cfg, ContentId([1; 32])).await.unwrap();
    let mut core = node.shared.core();
    let schedule = *core.schedule();
    let w = schedule.window_at(coordinator::server::now_ms()).unwrap() + 1;
    let (t0, t1) = (schedule.opens_at(w) + 1, schedule.opens_at(w + 1) + 1);
    let honest: Vec<PublicKey> = (1..=3u8).map(|i| Keypair::from_seed([i; 32]).public()).collect();
    // Window w: three honest miners store a rollout each.
    for h in &honest {
        let c = cand(&core, t0, w, *h, 0, 0);
        assert_eq!(core.admit(t0, h, &c), Ok(()));
    }
    // Window w + 1: an attacker's key submits first, as much as it may.
    let attacker = Keypair::from_seed([66; 32]).public();
    let mut taken = 0;
    for slot in 0..16u32 {
        let c = cand(&core, t1, w + 1, attacker, slot / 4, slot % 4);
        match core.admit(t1, &attacker, &c) {
            Ok(()) => taken += 1,
            Err(r) => {
                assert_eq!(r, RejectReason::RateLimited);
                break;
            }
        }
    }
    eprintln!("the attacker's key stored {taken} of the window's 10 rollouts of 100 KB");
    assert!(taken >= 1, "a new key still gets its share");
    // The honest miners still get theirs.
    for h in &honest {
        for slot in 0..2u32 {
            let c = cand(&core, t1, w + 1, *h, 0, slot);
            assert_eq!(core.admit(t1, h, &c), Ok(()), "honest {}", h.short());
        }
    }
    // Each key stays within its share: the budget among the four keys.
    assert!(taken <= 2, "the attacker took {taken} × 100 KB of 1 MiB shared by four keys");
}
