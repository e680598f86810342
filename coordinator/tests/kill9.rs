//! `kill -9` the coordinator process between acknowledgements, restart it on
//! the same data folder: every acknowledged rollout is there and the window
//! clock resumes where it was.

mod common;

use common::{rollout, spawn, within};
use coordinator::net::Session;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::*;

#[tokio::test]
async fn acknowledged_rollouts_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let key = Keypair::from_seed([7; 32]);
    let first = spawn(dir.path());
    let mut s = within(Session::connect(first.quic, &first.fingerprint, &key, Role::Miner)).await.unwrap();
    let Frame::WindowInfo(info) = within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap()
    else {
        panic!()
    };
    let rollouts: Vec<_> = (0..4)
        .flat_map(|g| (0..4).map(move |i| (g, i)))
        .map(|(g, i)| rollout(&info, &key, g, i, info.sampling.max_new_tokens as usize))
        .collect();
    // Pipeline every rollout, read some acknowledgements, then kill -9 mid-stream.
    for (seq, r) in rollouts.iter().enumerate() {
        within(s.send(&Frame::Submit(Submit { seq: seq as u64, rollout: Blob(r.encode()) }))).await.unwrap();
    }
    let mut acked = Vec::new();
    for _ in 0..6 {
        match within(s.recv()).await.unwrap() {
            Frame::Ack(a) => acked.push(a.digest),
            f => panic!("{f:?}"),
        }
    }
    let mut first = first;
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();

    let second = spawn(dir.path());
    assert_eq!(second.fingerprint, first.fingerprint, "same certificate after restart");
    let mut s = within(Session::connect(second.quic, &second.fingerprint, &key, Role::Miner)).await.unwrap();
    let Frame::WindowInfo(again) = within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap()
    else {
        panic!()
    };
    // The clock resumed: same window, same seed, same commitment.
    assert_eq!(
        (again.window, again.seed, again.commitment, again.opens_at_ms),
        (info.window, info.seed, info.commitment, info.opens_at_ms)
    );
    let Frame::Progress(p) = within(s.request(&Frame::GetProgress(GetProgress { window: info.window }))).await.unwrap()
    else {
        panic!()
    };
    for d in &acked {
        let r = rollouts.iter().find(|r| r.digest() == *d).unwrap();
        assert!(p.slots.contains(&(r.group, r.rollout)), "acknowledged rollout lost");
    }
    // Resume without duplicates: stored ones are refused as duplicates, the rest accepted.
    let mut accepted = 0;
    for (seq, r) in rollouts.iter().enumerate() {
        let stored = p.slots.contains(&(r.group, r.rollout));
        match within(s.request(&Frame::Submit(Submit { seq: seq as u64, rollout: Blob(r.encode()) }))).await.unwrap() {
            Frame::Ack(_) => {
                assert!(!stored);
                accepted += 1;
            }
            Frame::Refused(x) => {
                assert!(stored);
                assert_eq!(x.reason, RejectReason::Duplicate);
            }
            f => panic!("{f:?}"),
        }
    }
    assert_eq!(accepted + p.slots.len(), rollouts.len());
}
