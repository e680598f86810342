//! Loopback QUIC: every list answer is paged and capped by bytes. With the
//! list cap forced down to a few entries, a validator reads back a closed
//! window's whole index (each miner's rollout count, bytes and groups), a
//! window's whole standing and a whole weights document across many pages;
//! a fetch by miner reads only that miner's rollouts (review W3: validators
//! fetch only the miners they judge); the trainer's index leaves out a miner
//! banned in the window.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{rollout, within};
use coordinator::net::Session;
use coordinator::node::{self, Config, Node};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::*;

async fn start(dir: &std::path::Path, window_ms: u64) -> Node {
    let mut cfg = Config::dev(dir.to_path_buf());
    cfg.window_ms = window_ms;
    cfg.grace_ms = 100;
    cfg.penalties_per_sec = 10_000;
    cfg.connections_per_sec = 10_000;
    cfg.max_connections_per_address = 10_000;
    within(node::start(&cfg, ContentId([1; 32]))).await.unwrap()
}

async fn window(s: &mut Session) -> WindowInfo {
    match within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap() {
        Frame::WindowInfo(w) => w,
        f => panic!("unexpected {f:?}"),
    }
}

async fn wait_closed(info: &WindowInfo) {
    let now = coordinator::server::now_ms();
    tokio::time::sleep(std::time::Duration::from_millis(info.closes_at_ms.saturating_sub(now) + 150)).await;
}

async fn validator(node: &Node) -> Session {
    let key = tributary_protocol::dev::key(Role::Validator);
    within(Session::connect(node.quic, &node.fingerprint, &key, Role::Validator)).await.unwrap()
}

#[tokio::test]
async fn window_index_lists_every_miner_across_pages_and_a_fetch_by_miner_reads_only_that_miner() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), 4_000).await;
    // Twelve miners; miner i stores groups 0..=(i % 3), two rollouts each
    // (8 completion tokens, so each miner's bytes differ a little).
    let mut want: BTreeMap<PublicKey, (u32, u64, Vec<u32>)> = BTreeMap::new();
    let mut info = None;
    let mut banned = None;
    for i in 0..12u8 {
        let key = Keypair::from_seed([100 + i; 32]);
        let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
        let w = window(&mut s).await;
        let groups: Vec<u32> = (0..=u32::from(i % 3)).collect();
        let mut bytes = 0u64;
        for &g in &groups {
            for k in 0..2 {
                let r = rollout(&w, &key, g, k, 8 + usize::from(i)).encode();
                bytes += r.len() as u64;
                let ans = within(s.request(&Frame::Submit(Submit { seq: u64::from(g * 2 + k), rollout: Blob(r) })))
                    .await
                    .unwrap();
                assert!(matches!(ans, Frame::Ack(_)), "{ans:?}");
            }
        }
        want.insert(key.public(), (groups.len() as u32 * 2, bytes, groups));
        if i == 0 {
            // Then a rollout signed over its own key that does not verify: a
            // door penalty, which bans it in this window.
            let mut r = rollout(&w, &key, 3, 0, 8);
            r.signature[0] ^= 1;
            let ans = within(s.request(&Frame::Submit(Submit { seq: 99, rollout: Blob(r.encode()) }))).await.unwrap();
            assert!(matches!(ans, Frame::Refused(_)), "{ans:?}");
            banned = Some(key.public());
        }
        info = Some(w);
    }
    let info = info.unwrap();
    let mut v = validator(&node).await;
    // Before the window closes: not yet.
    let early = within(v.request(&Frame::GetWindowIndex(GetWindowIndex { window: info.window, after: None }))).await;
    assert!(matches!(early, Err(coordinator::net::NetError::Refused(ErrorCode::NotYet, _))), "{early:?}");
    wait_closed(&info).await;
    // About three entries a page.
    node.shared.set_list_answer_bytes(200);
    let mut got: BTreeMap<PublicKey, (u32, u64, Vec<u32>)> = BTreeMap::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = match within(v.request(&Frame::GetWindowIndex(GetWindowIndex { window: info.window, after })))
            .await
            .unwrap()
        {
            Frame::WindowIndex(p) => p,
            f => panic!("expected an index page, got {f:?}"),
        };
        pages += 1;
        assert!(!page.miners.is_empty(), "a page moves on");
        for m in &page.miners {
            assert!(after.is_none_or(|a| m.miner > a), "ascending, no repeats");
            assert!(got.insert(m.miner, (m.rollouts, m.bytes, m.groups.clone())).is_none());
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert!(pages >= 4, "the small cap pages the index ({pages} pages)");
    assert_eq!(got, want, "each miner's rollouts, bytes and groups");

    // The trainer's index leaves out the miner banned in the window (its fetches do too).
    let banned = banned.unwrap();
    assert!(node.shared.core().is_banned(&banned, info.window));
    let trainer = tributary_protocol::dev::key(Role::Trainer);
    let mut t = within(Session::connect(node.quic, &node.fingerprint, &trainer, Role::Trainer)).await.unwrap();
    let mut seen = BTreeSet::new();
    let mut after = None;
    loop {
        match within(t.request(&Frame::GetWindowIndex(GetWindowIndex { window: info.window, after }))).await.unwrap() {
            Frame::WindowIndex(p) => {
                seen.extend(p.miners.iter().map(|m| m.miner));
                match p.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            f => panic!("expected an index page, got {f:?}"),
        }
    }
    let mut others: BTreeSet<PublicKey> = want.keys().copied().collect();
    others.remove(&banned);
    assert_eq!(seen, others, "every miner but the banned one");

    // A fetch by miner reads that miner's rollouts and no other's.
    for (m, (n, _, _)) in &want {
        let read_before = node.shared.store.rows_read();
        let mut items = Vec::new();
        let mut after = None;
        loop {
            let req = FetchRollouts { window: info.window, miner: Some(*m), after, limit: 3 };
            match within(v.request(&Frame::FetchRollouts(req))).await.unwrap() {
                Frame::Rollouts(r) => {
                    items.extend(r.items);
                    match r.next {
                        Some(d) => after = Some(d),
                        None => break,
                    }
                }
                f => panic!("expected rollouts, got {f:?}"),
            }
        }
        assert_eq!(items.len() as u32, *n);
        for b in &items {
            assert_eq!(PublicKey(Rollout::decode(&b.0, &RolloutLimits::DEFAULT).unwrap().miner), *m);
        }
        assert_eq!(node.shared.store.rows_read() - read_before, u64::from(*n), "only its rows were read");
    }
}

#[tokio::test]
async fn standing_is_read_back_whole_across_small_pages() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), 600_000).await;
    // Fourteen keys each send one rollout signed over their own key that does
    // not verify: a door penalty, so each stands Failed in the window.
    let mut w = 0;
    for i in 0..14u8 {
        let key = Keypair::from_seed([40 + i; 32]);
        let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
        let info = window(&mut s).await;
        w = info.window;
        let mut r = rollout(&info, &key, 0, 0, 8);
        r.signature[0] ^= 1;
        let ans = within(s.request(&Frame::Submit(Submit { seq: 0, rollout: Blob(r.encode()) }))).await.unwrap();
        assert!(matches!(ans, Frame::Refused(Refused { reason: RejectReason::BadSignature, .. })), "{ans:?}");
    }
    let mut want = node.shared.core().standing(w);
    want.sort_unstable_by_key(|(m, _)| *m);
    assert_eq!(want.len(), 14);
    node.shared.set_list_answer_bytes(100);
    let mut v = validator(&node).await;
    let mut got = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        match within(v.request(&Frame::GetStanding(GetStanding { window: w, after }))).await.unwrap() {
            Frame::Standing(s) => {
                pages += 1;
                assert!(!s.miners.is_empty() && s.miners.len() <= 3, "{} entries", s.miners.len());
                got.extend(s.miners);
                match s.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            f => panic!("expected standing, got {f:?}"),
        }
    }
    assert!(pages >= 5, "{pages} pages");
    assert_eq!(got, want);
    assert!(got.iter().all(|(_, s)| *s == MinerStanding::Failed));
}

#[tokio::test]
async fn a_weights_document_is_read_back_whole_across_small_parts() {
    let dir = tempfile::tempdir().unwrap();
    let window_ms = 1_500;
    let node = start(dir.path(), window_ms).await;
    let key = tributary_protocol::dev::key(Role::Validator);
    let mut v = validator(&node).await;
    let schedule = v.welcome.schedule;
    let now = coordinator::server::now_ms;
    tokio::time::sleep(std::time::Duration::from_millis(schedule.closes_at(0).saturating_sub(now()) + 20)).await;
    // Passing verdicts on twenty miners of window 0.
    let miners: BTreeSet<PublicKey> = (0..20u8).map(|i| Keypair::from_seed([60 + i; 32]).public()).collect();
    for m in &miners {
        // Only proven work is paid: each miner's stored group, proved passing.
        let passed = coordinator::testing::stored_groups(&mut node.shared.core(), 0, *m, 1);
        let body =
            VerdictBody { checked: 4, valid: 4, estimated_valid: 4, passed, ..VerdictBody::empty(0, *m, key.public()) };
        let verdict = Verdict::sign(body, &key, &v.network());
        assert!(matches!(within(v.request(&Frame::PostVerdict(verdict))).await.unwrap(), Frame::VerdictAck(_)));
    }
    assert!(now() < schedule.opens_at(2), "the machine is too slow for {window_ms} ms windows");
    // The first document that pays window 0's work (pay waits PAY_DELAY_WINDOWS).
    let doc = coordinator::testing::signed_weights(&node.shared, coordinator::weights::PAY_DELAY_WINDOWS).await;
    assert_eq!(doc.body.weights.len(), 20);
    node.shared.set_list_answer_bytes(64);
    let mut bytes = Vec::new();
    let mut parts = 0;
    let mut window = Some(doc.body.window);
    loop {
        let get = GetWeights { window, offset: bytes.len() as u64 };
        match within(v.request(&Frame::GetWeights(get))).await.unwrap() {
            Frame::Weights(p) => {
                parts += 1;
                assert_eq!(p.offset, bytes.len() as u64);
                assert!(!p.data.0.is_empty() && p.data.0.len() <= 64);
                window = Some(p.window);
                bytes.extend(p.data.0);
                if bytes.len() as u64 >= p.len {
                    break;
                }
            }
            f => panic!("expected part of a weights document, got {f:?}"),
        }
    }
    assert!(parts >= 10, "{parts} parts");
    assert_eq!(WeightsDoc::decode_verified(&bytes, &v.coordinator), Ok(doc));
}
