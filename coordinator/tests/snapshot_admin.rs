//! The dashboard's snapshots (`/api/status`, `/api/miners`, at most a
//! second old) never hide an operator's action: a live ban or unban through
//! the admin socket makes the next request build a new snapshot, even
//! within the same second.

use std::sync::Arc;

use coordinator::admin::{self, AdminCmd};
use coordinator::dashboard::History;
use coordinator::node::{self, Config};
use coordinator::server::now_ms;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::RejectReason;

async fn run(cmd: AdminCmd) -> String {
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        admin::cli(&cmd, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_ban_or_unban_shows_at_once_in_both_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cfg = Config::dev(data.clone());
    cfg.window_ms = 600_000;
    let node = node::start(&cfg, ContentId([1; 32])).await.unwrap();
    let _live = admin::serve_live(&data, node.shared.clone()).unwrap();
    let sh = Arc::clone(&node.shared);
    let key = Keypair::from_seed([7; 32]).public();
    sh.core().count_rejection(Some(&key), RejectReason::Malformed);
    let history = History::default();
    let banned = |history: &History, at: u64| {
        let s = history.status(&sh, at).unwrap();
        let m = history.miners(&sh, at);
        let in_status = s.miners.iter().find(|r| r.key == key.to_string()).expect("the miner is listed").banned;
        let in_miners = m.get(&key.to_string()).expect("the miner is listed").banned;
        (in_status, in_miners)
    };
    // The same instant throughout: every answer would come from the snapshot.
    let at = now_ms();
    assert_eq!(banned(&history, at), (false, false));
    let out = run(AdminCmd::Ban { data: data.clone(), key: key.to_string(), windows: 3, config: None }).await;
    assert!(out.contains("applied=live"), "{out}");
    assert_eq!(banned(&history, at), (true, true), "the ban shows in the next answers");
    let out = run(AdminCmd::Unban { data: data.clone(), key: key.to_string(), config: None }).await;
    assert!(out.contains("applied=live"), "{out}");
    assert_eq!(banned(&history, at), (false, false), "the unban shows in the next answers");
    // Without an admin action, the snapshot is served as before.
    let before = sh.store.rows_read();
    let _ = banned(&history, at);
    assert_eq!(sh.store.rows_read(), before);
}
