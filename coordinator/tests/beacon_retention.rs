//! Issue 16: each window's challenge contributions (`beacon/<window>` in the
//! store's meta table) are deleted with the window's rollouts by the
//! retention rule (`keep_windows`), except the windows whose committees a
//! restart still reads back (the ban and weight spans), which stay.

mod common;

use common::within;
use coordinator::node::{self, Config};
use tributary_protocol::checkpoint::ContentId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_windows_challenge_contributions_go_with_their_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("coord"));
    cfg.keep_windows = 2;
    cfg.ban_windows = 3;
    cfg.weight_windows = 3;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let sh = node.shared.clone();
    for w in 0..=32u64 {
        sh.store.put_meta(&format!("beacon/{w}"), &[1, 2, 3]).unwrap();
    }
    let now = sh.core().schedule().opens_at(30) + 1;
    sh.apply_retention(now);
    // Rollouts before 28 go (2 kept); a restart reads the contributions of
    // the windows from 30 − (max(3, 3) + 2) = 25 on, so those stay.
    for w in 0..=32u64 {
        let kept = w >= 25;
        assert_eq!(sh.store.meta(&format!("beacon/{w}")).unwrap().is_some(), kept, "beacon/{w}");
    }
    // Other meta records are not touched.
    assert!(sh.store.meta("master_secret").unwrap().is_some());
}
