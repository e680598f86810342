//! Loopback QUIC, `SubmitBatch`: each rollout of a batch is checked as a
//! single submission would be, the batch is answered once with every
//! outcome in order, only after the accepted ones are durable; refused ones
//! leave nothing behind; a batch over the bound closes the connection; and
//! `kill -9` between batch answers loses nothing that was answered `Stored`.

mod common;

use common::{other_checkpoint, rollout, spawn, within};
use coordinator::net::{NetError, Session};
use coordinator::node::{self, Config};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::*;

async fn window(s: &mut Session) -> WindowInfo {
    match within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap() {
        Frame::WindowInfo(w) => w,
        f => panic!("unexpected {f:?}"),
    }
}

async fn batch(s: &mut Session, seq: u64, items: Vec<Vec<u8>>) -> BatchAnswer {
    match within(s.request(&Frame::SubmitBatch(SubmitBatch { seq, rollouts: items.into_iter().map(Blob).collect() })))
        .await
        .unwrap()
    {
        Frame::BatchAnswer(b) => b,
        f => panic!("expected a batch answer, got {f:?}"),
    }
}

#[tokio::test]
async fn batch_outcomes_in_order_and_nothing_refused_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 600_000;
    cfg.max_new_tokens = 512;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let key = Keypair::from_seed([21; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let info = window(&mut s).await;

    // Good rollouts across two batches in flight at once: answered in order.
    let good: Vec<_> = (0..8).map(|i| rollout(&info, &key, i / 4, i % 4, 512)).collect();
    for (k, chunk) in good.chunks(4).enumerate() {
        let items = chunk.iter().map(|r| Blob(r.encode())).collect();
        within(s.send(&Frame::SubmitBatch(SubmitBatch { seq: 10 + 4 * k as u64, rollouts: items }))).await.unwrap();
    }
    for (k, chunk) in good.chunks(4).enumerate() {
        let Frame::BatchAnswer(b) = within(s.recv()).await.unwrap() else { panic!("expected a batch answer") };
        assert_eq!(b.seq, 10 + 4 * k as u64);
        let want: Vec<Outcome> = chunk.iter().map(|r| Outcome::Stored(r.digest())).collect();
        assert_eq!(b.outcomes, want);
    }
    assert_eq!(node.shared.store.rollout_count().unwrap(), 8);

    // One batch mixing good and bad: each refused with its own reason.
    let fresh = rollout(&info, &key, 2, 0, 64);
    let mut unassigned = rollout(&info, &key, 2, 2, 64);
    unassigned.task_id ^= 1;
    unassigned.sign(&key);
    let same_slot = {
        let mut r = rollout(&info, &key, 2, 0, 64);
        r.reward = 0.25;
        r.sign(&key);
        r
    };
    let fresh2 = rollout(&info, &key, 2, 1, 64);
    let items = vec![
        fresh.encode(),
        good[0].encode(),                        // stored earlier
        vec![1, 2, 3],                           // junk
        unassigned.encode(),                     // assignment
        same_slot.encode(),                      // the slot the first item of this batch took
        vec![0; (MAX_ROLLOUT_LEN + 1) as usize], // too large for a rollout
        fresh2.encode(),
    ];
    let b = batch(&mut s, 100, items).await;
    assert_eq!(b.seq, 100);
    assert_eq!(
        b.outcomes,
        vec![
            Outcome::Stored(fresh.digest()),
            Outcome::Refused(RejectReason::Duplicate),
            Outcome::Refused(RejectReason::Malformed),
            Outcome::Refused(RejectReason::Unassigned),
            Outcome::Refused(RejectReason::Duplicate),
            Outcome::Refused(RejectReason::Oversized),
            Outcome::Stored(fresh2.digest()),
        ]
    );
    // Only the two accepted are stored; the refusals are counted by reason.
    assert_eq!(node.shared.store.rollout_count().unwrap(), 10);
    let m = node.shared.core().miners()[&key.public()].clone();
    assert_eq!(m.accepted, 10);
    for (reason, n) in [("duplicate", 2), ("malformed", 1), ("unassigned", 1), ("oversized", 1)] {
        assert_eq!(m.rejected.get(reason).copied(), Some(n), "{reason}");
    }
    // The single-rollout frame still works on the same connection.
    let one = rollout(&info, &key, 2, 3, 64);
    match within(s.request(&Frame::Submit(Submit { seq: 200, rollout: Blob(one.encode()) }))).await.unwrap() {
        Frame::Ack(a) => assert_eq!((a.seq, a.digest), (200, one.digest())),
        f => panic!("{f:?}"),
    }
    // An empty batch is answered with no outcomes.
    assert_eq!(batch(&mut s, 300, vec![]).await.outcomes, vec![]);

    // A refusal only the sender can have caused (its own signature failing,
    // a stale checkpoint) bans it for the window at once: the rest of the
    // batch is refused too, as it would be in a stream of single submissions.
    for (seed, reason) in [(23u8, RejectReason::BadSignature), (24, RejectReason::StaleCheckpoint)] {
        let k = Keypair::from_seed([seed; 32]);
        let mut p = within(Session::connect(node.quic, &node.fingerprint, &k, Role::Miner)).await.unwrap();
        let before = rollout(&info, &k, 0, 0, 64);
        let mut bad = rollout(&info, &k, 0, 1, 64);
        if reason == RejectReason::BadSignature {
            bad.reward = 0.5; // changed after signing
        } else {
            bad.checkpoint = other_checkpoint();
            bad.sign(&k);
        }
        let after = rollout(&info, &k, 0, 2, 64);
        let b = batch(&mut p, 0, vec![before.encode(), bad.encode(), after.encode()]).await;
        assert_eq!(
            b.outcomes,
            vec![Outcome::Stored(before.digest()), Outcome::Refused(reason), Outcome::Refused(RejectReason::Banned)]
        );
    }
    assert_eq!(node.shared.store.rollout_count().unwrap(), 13);

    // A batch over the bound is a malformed frame: refused, connection closed.
    let mut body = Vec::new();
    body.push(0); // seq
    body.extend_from_slice(&[0x81, 0x02]); // 257 rollouts
    body.extend(std::iter::repeat_n(0u8, MAX_BATCH_ROLLOUTS + 1)); // each empty
    let mut raw = (body.len() as u32).to_le_bytes().to_vec();
    raw.extend_from_slice(&(Tag::SubmitBatch as u16).to_le_bytes());
    raw.extend_from_slice(&body);
    within(s.send.write_all(&raw)).await.unwrap();
    assert!(matches!(within(s.recv()).await, Err(NetError::Refused(ErrorCode::Malformed, _))));
    assert_eq!(node.shared.store.rollout_count().unwrap(), 13);
}

#[tokio::test]
async fn batches_answered_stored_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let key = Keypair::from_seed([22; 32]);
    let mut first = spawn(dir.path());
    let mut s = within(Session::connect(first.quic, &first.fingerprint, &key, Role::Miner)).await.unwrap();
    let info = window(&mut s).await;
    let rollouts: Vec<_> = (0..4)
        .flat_map(|g| (0..4).map(move |i| (g, i)))
        .map(|(g, i)| rollout(&info, &key, g, i, info.sampling.max_new_tokens as usize))
        .collect();
    // Pipeline every batch, read the first answer, then kill -9 mid-stream.
    for (k, chunk) in rollouts.chunks(4).enumerate() {
        let items = chunk.iter().map(|r| Blob(r.encode())).collect();
        within(s.send(&Frame::SubmitBatch(SubmitBatch { seq: 4 * k as u64, rollouts: items }))).await.unwrap();
    }
    let Frame::BatchAnswer(b) = within(s.recv()).await.unwrap() else { panic!("expected a batch answer") };
    let acked: Vec<[u8; 32]> = b
        .outcomes
        .iter()
        .map(|o| match o {
            Outcome::Stored(d) => *d,
            o => panic!("{o:?}"),
        })
        .collect();
    assert_eq!(acked.len(), 4);
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();

    let second = spawn(dir.path());
    let mut s = within(Session::connect(second.quic, &second.fingerprint, &key, Role::Miner)).await.unwrap();
    let Frame::Progress(p) = within(s.request(&Frame::GetProgress(GetProgress { window: info.window }))).await.unwrap()
    else {
        panic!()
    };
    for d in &acked {
        let r = rollouts.iter().find(|r| r.digest() == *d).unwrap();
        assert!(p.slots.contains(&(r.group, r.rollout)), "acknowledged rollout lost");
    }
    // Resubmitting everything in one batch: what is stored is a duplicate, the rest is accepted.
    let b = batch(&mut s, 0, rollouts.iter().map(|r| r.encode()).collect()).await;
    for (r, o) in rollouts.iter().zip(&b.outcomes) {
        if p.slots.contains(&(r.group, r.rollout)) {
            assert_eq!(*o, Outcome::Refused(RejectReason::Duplicate));
        } else {
            assert_eq!(*o, Outcome::Stored(r.digest()));
        }
    }
}
