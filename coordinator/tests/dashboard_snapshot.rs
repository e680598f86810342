//! network-security W8: the dashboard's answers are snapshots. `/api/status`
//! reads the verdicts of the windows it shows (not every verdict ever) and
//! decodes each stored rollout once (not the open windows' again on every
//! call), and requests within a second share one answer. Before: every call
//! read the whole verdict table and every rollout of the open windows.

mod common;

use std::sync::Arc;

use common::rollout;
use coordinator::core::{Candidate, Shape};
use coordinator::dashboard::{HISTORY_WINDOWS, History};
use coordinator::node::{self, Config};
use coordinator::server::Shared;
use coordinator::store::StoredRollout;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{Role, Verdict, VerdictBody, WindowInfo};

fn store_rollouts(sh: &Shared, info: &WindowInfo, keys: &[Keypair], per_key: u32, first_index: u32) {
    let mut rows = Vec::new();
    for key in keys {
        for i in first_index..first_index + per_key {
            let r = rollout(info, key, 0, i, 8);
            let bytes = r.encode();
            let digest = *blake3::hash(&bytes).as_bytes();
            let candidate = Candidate {
                window: info.window,
                checkpoint: info.checkpoint,
                env: info.env,
                group: 0,
                index: i,
                task_id: r.task_id,
                miner: key.public(),
                digest,
                content: digest,
                shape: Shape::RESTORED,
            };
            rows.push(StoredRollout { candidate, bytes });
        }
    }
    sh.store.put_rollouts(&rows).unwrap();
}

fn store_verdict(sh: &Shared, window: u64, miner: u8) {
    let validator = tributary_protocol::dev::key(Role::Validator);
    let body = VerdictBody {
        checked: 4,
        valid: 3,
        ..VerdictBody::empty(window, Keypair::from_seed([miner; 32]).public(), validator.public())
    };
    sh.store.put_verdict(&Verdict::sign(body, &validator, &sh.network())).unwrap();
}

#[tokio::test]
async fn the_status_is_a_bounded_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("data"));
    cfg.window_ms = 600_000;
    let node = node::start(&cfg, ContentId([1; 32])).await.unwrap();
    let sh = node.shared.clone();
    let w = 100u64;
    let now = sh.core().schedule().opens_at(w) + 1_000;
    let (open, closed) = {
        let core = sh.core();
        (core.window_info(w, now).unwrap(), core.window_info(w - 1, now).unwrap())
    };
    let keys: Vec<Keypair> = (1..=3u8).map(|i| Keypair::from_seed([i; 32])).collect();
    store_rollouts(&sh, &open, &keys, 2, 0);
    store_rollouts(&sh, &closed, &keys[..2], 2, 0);
    // 200 verdicts on windows long before the status's history, 6 on recent ones.
    let old = 200u64;
    for i in 0..old {
        store_verdict(&sh, i % (w - HISTORY_WINDOWS - 1), (i % 250) as u8);
    }
    for i in 0..6u64 {
        store_verdict(&sh, w - 1 - i % 3, i as u8);
    }

    let history = History::default();
    let before = sh.store.rows_read();
    let s = history.status(&sh, now).unwrap();
    let cost = sh.store.rows_read() - before;
    assert!(cost <= 6 + 10, "one status read {cost} rows for 6 recent verdicts and 10 rollouts");
    let row =
        |s: &coordinator::dashboard::Status, win: u64| s.windows.iter().find(|r| r.window == win).cloned().unwrap();
    assert_eq!(row(&s, w).rollouts, 6);
    assert_eq!(row(&s, w - 1).rollouts, 4);
    assert_eq!(row(&s, w - 1).verdicts.verdicts, 2);
    assert_eq!((s.verdicts.verdicts, s.verdicts.checked, s.verdicts.valid), (6, 24, 18));

    // Within a second: the same answer, nothing read.
    let before = sh.store.rows_read();
    let again = history.status(&sh, now + 500).unwrap();
    assert!(Arc::ptr_eq(&s, &again));
    assert_eq!(sh.store.rows_read(), before);

    // A second later: recomputed; of the rollouts only the new one is decoded.
    store_rollouts(&sh, &open, &keys[..1], 1, 10);
    store_verdict(&sh, w - 1, 77);
    let before = sh.store.rows_read();
    let s = history.status(&sh, now + 1_500).unwrap();
    let cost = sh.store.rows_read() - before;
    assert!(cost <= 1 + 7, "the next status read {cost} rows for 1 new rollout and 7 recent verdicts");
    assert_eq!(row(&s, w).rollouts, 7);
    assert_eq!(row(&s, w).by_miner[&keys[0].public().to_string()], 3);
    assert_eq!(s.verdicts.verdicts, 7);

    // The miners' answer too: one snapshot per second, whatever the requests.
    let m = history.miners(&sh, now);
    assert!(Arc::ptr_eq(&m, &history.miners(&sh, now + 999)));
    assert!(!Arc::ptr_eq(&m, &history.miners(&sh, now + 1_000)));
}
