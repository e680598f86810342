//! Checkpoint retention (issue 17, storage budget and retention): the relay
//! keeps the newest `keep_checkpoints` publications, the genesis checkpoint
//! and every checkpoint the open window or the window being verified uses;
//! older full files, deltas and relay records are deleted, durably, and a
//! restart finds the same relay. Real files in a temporary data folder.

use std::path::Path;
use std::time::Duration;

use coordinator::node::{self, Config, Node};
use coordinator::relay::{Entry, Payload};
use coordinator::testing::{publication_id as id, store_publication};
use coordinator::upkeep;
use tributary_protocol::checkpoint::ContentId;

const GENESIS: ContentId = ContentId([1; 32]);

fn config(dir: &Path) -> Config {
    let mut cfg = Config::dev(dir.to_path_buf());
    cfg.window_ms = 600_000;
    cfg
}

fn ids(entries: impl IntoIterator<Item = Entry>) -> Vec<ContentId> {
    let mut v: Vec<ContentId> = entries.into_iter().map(|e| e.id).collect();
    v.sort();
    v
}

fn start(cfg: &Config) -> (tokio::runtime::Runtime, Node) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // The previous coordinator's writer thread lets go of the database shortly after its runtime stops.
    for attempt in 0.. {
        match rt.block_on(node::start(cfg, GENESIS)) {
            Ok(n) => return (rt, n),
            Err(e) if attempt < 50 => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("start: {e:#}"),
        }
    }
    unreachable!()
}

/// Nine publications (full anchors 1 and 4, deltas between, 9 announced
/// ahead for window 11) at window 9 with `keep_checkpoints = 1`: 9 is the
/// newest, 8 is window 9's, 7 is window 8's (being verified); 1–6 go.
/// Before: every checkpoint was kept forever.
#[test]
fn old_checkpoints_are_deleted_and_what_a_window_uses_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("data"));
    let (rt, node) = start(&cfg);
    for i in 1..=8u8 {
        let base = (i != 1 && i != 4).then(|| i - 1);
        store_publication(&node.shared, i, base, u64::from(i), u64::from(i) + 1);
    }
    store_publication(&node.shared, 9, Some(8), 10, 11);
    let sh = node.shared.clone();
    let now = sh.core().schedule().opens_at(9) + 1_000;
    assert_eq!(sh.core().current_window(now), Some(9));

    // 0 keeps everything.
    assert!(upkeep::apply_retention(&sh, 0, now).unwrap().is_empty());
    assert_eq!(sh.relay.entries().len(), 9);

    let gone = upkeep::apply_retention(&sh, 1, now).unwrap();
    let mut gone_sorted = gone.clone();
    gone_sorted.sort();
    assert_eq!(gone_sorted, (1..=6).map(id).collect::<Vec<_>>());
    let kept: Vec<ContentId> = (7..=9).map(id).collect();
    assert_eq!(ids(sh.relay.entries()), kept);
    assert_eq!(ids(sh.store.relay_entries().unwrap()), kept);
    for i in 1..=9u8 {
        let present = i >= 7;
        assert_eq!(sh.relay.full_path(&id(i)).exists(), present, "full file of {i}");
        if i != 1 && i != 4 {
            assert_eq!(sh.relay.delta_path(&id(i - 1), &id(i)).exists(), present, "delta of {i}");
        }
        assert_eq!(sh.relay.announcement(&id(i)).is_some(), present, "announcement of {i}");
    }
    // The window → checkpoint history stays exact (a validator asking for an old window's checkpoint).
    assert_eq!(sh.store.checkpoints().unwrap().len(), 9);
    assert_eq!(sh.core().checkpoint_for(4), id(3));
    // A miner holding 6 (deleted) still gets deltas: 7's delta from 6 is 7's and kept.
    let p = sh.relay.path(Some(id(6)), None).unwrap();
    let steps: Vec<_> = p.steps.iter().map(|s| (s.id, s.base)).collect();
    assert_eq!(steps, vec![(id(7), Some(id(6))), (id(8), Some(id(7))), (id(9), Some(id(8)))]);
    assert_eq!(sh.relay.read(Payload::Delta { base: id(6), id: id(7) }, 0).unwrap().len(), 100);
    // One holding 2: the full file of the newest.
    let p = sh.relay.path(Some(id(2)), None).unwrap();
    assert_eq!(p.steps.iter().map(|s| (s.id, s.base)).collect::<Vec<_>>(), vec![(id(9), None)]);
    assert!(sh.relay.read(Payload::Full(id(3)), 0).is_err());
    // Nothing more to delete.
    assert!(upkeep::apply_retention(&sh, 1, now).unwrap().is_empty());

    // A crash between the records' deletion and the files': a file left behind.
    let orphan = sh.relay.full_path(&id(5));
    std::fs::write(&orphan, b"left behind").unwrap();
    drop(sh);
    drop(node);
    drop(rt);
    let (_rt, node) = start(&cfg);
    let sh = &node.shared;
    assert_eq!(ids(sh.relay.entries()), kept, "after a restart");
    assert!(!orphan.exists(), "a payload file no record names is deleted at start");
    assert!(sh.relay.full_path(&id(9)).exists());
    assert!(sh.relay.announcement(&id(9)).is_some());
    assert!(sh.relay.announcement(&id(3)).is_none(), "announcements of deleted checkpoints are not reloaded");
    assert_eq!(sh.core().checkpoint_for(9), id(8));
}
