//! Closed windows on object storage (issue 21): a coordinator configured with
//! an archive writes each window, once its submissions close, to the store;
//! retention then deletes it from redb, and a reader with no coordinator
//! running reads exactly the acknowledged rollouts back.

mod common;

use std::time::Duration;

use common::{rollout, within};
use coordinator::archive::{self, Archive};
use coordinator::net::Session;
use coordinator::node::{self, Config};
use coordinator::server::now_ms;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_windows_reach_the_object_store_and_outlive_the_coordinator() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("coordinator=info").try_init();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("coord"));
    cfg.window_ms = 2_000;
    cfg.grace_ms = 200;
    cfg.keep_windows = 1;
    cfg.archive = Some("objects".into());
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let key = Keypair::from_seed([9; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let Frame::WindowInfo(info) = within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap()
    else {
        panic!("no window")
    };
    let rollouts: Vec<Rollout> =
        (0..2).flat_map(|g| (0..2).map(move |i| (g, i))).map(|(g, i)| rollout(&info, &key, g, i, 8)).collect();
    let mut acked = Vec::new();
    for (seq, r) in rollouts.iter().enumerate() {
        let answer =
            within(s.request(&Frame::Submit(Submit { seq: seq as u64, rollout: Blob(r.encode()) }))).await.unwrap();
        match answer {
            Frame::Ack(a) => acked.push(a.digest),
            f => panic!("{f:?}"),
        }
    }
    assert_eq!(acked.len(), 4);
    drop(s);

    // The window closes, the archiver (every 5 s) writes it.
    let store = Archive::open(dir.path().join("coord/objects").to_str().unwrap()).unwrap();
    let w = info.window;
    let archived = within(async {
        loop {
            if let Some(m) = store.manifest(w).await.unwrap() {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert_eq!(archived.rollouts, 4);
    assert!(archive::archived_upto(&node.shared.store).unwrap().is_some_and(|u| u > w));

    // Retention (keep 1 window) deletes the window from redb only now that it is archived.
    let closes = node.shared.core().schedule().closes_at(w + 1);
    if closes + 100 > now_ms() {
        tokio::time::sleep(Duration::from_millis(closes + 100 - now_ms())).await;
    }
    node.shared.apply_retention(now_ms());
    assert_eq!(node.shared.store.rollouts(w, None, None, 256).unwrap().0.len(), 0, "window {w} still in redb");
    drop(node);

    // With the coordinator gone, a reader gets exactly the acknowledged rollouts.
    let reader = Archive::open(&format!("file://{}", dir.path().join("coord/objects").display())).unwrap();
    let bytes = reader.read_window(w).await.unwrap().expect("window archived");
    let mut got: Vec<[u8; 32]> = bytes
        .iter()
        .map(|b| Rollout::decode(b, &RolloutLimits::DEFAULT).expect("a stored rollout decodes").digest())
        .collect();
    got.sort();
    acked.sort();
    assert_eq!(got, acked);
}

/// Submits 4 rollouts in the current window; returns the window.
async fn submit_four(node: &node::Node) -> u64 {
    let key = Keypair::from_seed([9; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let Frame::WindowInfo(info) = within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap()
    else {
        panic!("no window")
    };
    for (seq, (g, i)) in (0..2).flat_map(|g| (0..2).map(move |i| (g, i))).enumerate() {
        let r = rollout(&info, &key, g, i, 8);
        let answer =
            within(s.request(&Frame::Submit(Submit { seq: seq as u64, rollout: Blob(r.encode()) }))).await.unwrap();
        assert!(matches!(answer, Frame::Ack(_)), "{answer:?}");
    }
    info.window
}

/// While archiving is on, retention never deletes a window the archive has
/// not reached (here no archiver runs, so it never does), and deletes it
/// once the archive's progress passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_waits_for_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("coord"));
    cfg.window_ms = 1_000;
    cfg.grace_ms = 100;
    cfg.keep_windows = 1;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    node.shared.set_archiving();
    let w = submit_four(&node).await;
    let closes = node.shared.core().schedule().closes_at(w + 1);
    if closes + 100 > now_ms() {
        tokio::time::sleep(Duration::from_millis(closes + 100 - now_ms())).await;
    }
    assert_eq!(node.shared.apply_retention(now_ms()), 0, "deleted before the archive had it");
    node.shared.store.put_meta(archive::ARCHIVED_UPTO, &w.to_le_bytes()).unwrap();
    assert_eq!(node.shared.apply_retention(now_ms()), 0, "deleted the window the archive is at");
    node.shared.store.put_meta(archive::ARCHIVED_UPTO, &(w + 1).to_le_bytes()).unwrap();
    assert_eq!(node.shared.apply_retention(now_ms()), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_archive_retention_is_unchanged_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("coord"));
    cfg.window_ms = 1_000;
    cfg.grace_ms = 100;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(archive::archived_upto(&node.shared.store).unwrap(), None);
    assert!(!dir.path().join("coord/objects").exists());
}

/// Issue 29 item 4: whoever can write to the object store cannot get its
/// content signed by the coordinator. A forged manifest (and segment, with a
/// rollout of a key the coordinator never saw) planted for a future window
/// is never handed to a reader; when that window closes the archiver writes
/// the coordinator's own record over it and goes on with later windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_planted_in_the_store_is_never_signed_and_later_windows_still_archive() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("coordinator=info").try_init();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("coord"));
    cfg.window_ms = 1_000;
    cfg.grace_ms = 100;
    cfg.archive = Some("objects".into());
    cfg.store_url = Some("http://127.0.0.1:9/objects/".into());
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let now = now_ms();
    let forged_window = node.shared.core().current_window(now).expect("a window is open") + 2;

    // Someone with write access to the store plants a whole window.
    let forger = Archive::open(dir.path().join("coord/objects").to_str().unwrap()).unwrap();
    let stranger = Keypair::from_seed([77; 32]).public();
    let forged = forger.put_window(forged_window, vec![(stranger, vec![5; 300])]).await.unwrap();
    assert_eq!(forged.rollouts, 1);

    let vkey = tributary_protocol::dev::key(Role::Validator);
    let mut v = within(Session::connect(node.quic, &node.fingerprint, &vkey, Role::Validator)).await.unwrap();
    let ask = |w| Frame::GetWindowManifest(GetWindowManifest { window: w });
    let Frame::WindowManifest(ans) = within(v.request(&ask(forged_window))).await.unwrap() else { panic!() };
    assert_eq!(ans.manifest, None, "the coordinator signed a manifest it never wrote");

    // The forged window closes; it and the one after it are archived.
    within(async {
        loop {
            if archive::archived_upto(&node.shared.store).unwrap().is_some_and(|u| u > forged_window + 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // Readers now get the coordinator's own record (nothing was submitted),
    // and the store holds it too.
    let Frame::WindowManifest(ans) = within(v.request(&ask(forged_window))).await.unwrap() else { panic!() };
    let signed = ans.checked(forged_window, &node.shared.key.public()).unwrap().expect("archived window signed");
    assert_eq!(signed.body.rollouts, 0);
    assert_eq!(forger.manifest(forged_window).await.unwrap().map(|m| m.rollouts), Some(0));
}
