//! The checkpoint relay end to end on loopback, with real llama.cpp miners on
//! the tiny model: miners follow published checkpoints by deltas, a late
//! miner catches up from a full anchor, and a corrupted delta is refused and
//! recovered from by a full download.

use edge_miner::run::RunEvent;
use edge_miner::sync::SyncEvent;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::delta;
use tributary_protocol::wire::Frame;
use tributary_tests::{Miner, Net, id_of, perturbed, publish, trainer_session, within};

/// Waits until the miner submits a group generated with `id` (every submission acknowledged).
async fn generates_on(m: &mut Miner, id: ContentId) {
    m.wait_for(60, |e| match e {
        RunEvent::Submitted { checkpoint, refused, .. } => {
            assert!(tributary_tests::honest_refusals(refused), "{refused:?}");
            *checkpoint == id
        }
        _ => false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_miners_follow_three_checkpoints() {
    let net = Net::start(2_500, 500, 1, 2).await;
    let mut miners: Vec<Miner> = (0..3).map(|i| Miner::spawn(net.miner(&format!("m{i}"), true))).collect();
    for m in &mut miners {
        generates_on(m, net.genesis).await;
    }
    let mut t = trainer_session(&net).await;
    let mut prev = net.genesis_bytes.clone();
    let mut prev_id = net.genesis;
    let mut published = vec![];
    for k in 1..=3u32 {
        let next = perturbed(&prev, k, 300);
        let id = id_of(&next);
        let d = delta::encode_gguf(&prev, &next, delta::DEFAULT_LEVEL).unwrap();
        let window = net.window();
        let ans = publish(&mut t, window, id, Some(prev_id), &d).await.unwrap();
        assert!(matches!(ans, Frame::CheckpointStored(ref s) if s.id == id), "{ans:?}");
        // Publishing the same checkpoint again is idempotent; another one for the window is refused.
        assert!(matches!(publish(&mut t, window, id, Some(prev_id), &d).await, Ok(Frame::CheckpointStored(_))));
        for m in &mut miners {
            // Staged by delta before the window uses it, then generating on it.
            m.wait_for(
                60,
                |e| matches!(e, RunEvent::Sync(SyncEvent::Staged { id: s, by_delta: true, .. }) if *s == id),
            )
            .await;
            generates_on(m, id).await;
        }
        published.push((id, d.len() as u64));
        prev = next;
        prev_id = id;
    }
    // A second, different checkpoint for a window already published is refused.
    let other = perturbed(&prev, 99, 10);
    let last_window = net.node.shared.relay.entry(&prev_id).unwrap().window;
    let d = delta::encode_gguf(&prev, &other, delta::DEFAULT_LEVEL).unwrap();
    let ans = within(30, async {
        let mut t2 = trainer_session(&net).await;
        publish(&mut t2, last_window, id_of(&other), Some(prev_id), &d).await
    })
    .await;
    assert!(
        matches!(&ans, Err(tributary_net::NetError::Refused(_, detail)) if detail.contains("already has checkpoint")),
        "{ans:?}"
    );
    // Operators see every checkpoint with its sizes, and each miner's checkpoint.
    let entries = net.node.shared.relay.entries();
    assert_eq!(entries.len(), 4);
    for (id, len) in &published {
        let e = entries.iter().find(|e| e.id == *id).unwrap();
        assert_eq!(e.delta.map(|d| d.1), Some(*len));
        assert!(*len < e.full_len / 10, "delta {len} of a {} byte model", e.full_len);
    }
    let peers = net.node.shared.relay.peers();
    for m in miners {
        assert_eq!(peers[&m.key.public()].generating, Some(prev_id));
        m.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_miner_catches_up_from_a_full_anchor() {
    let net = Net::start(2_500, 500, 1, 2).await;
    let mut t = trainer_session(&net).await;
    let mut prev = net.genesis_bytes.clone();
    let mut prev_id = net.genesis;
    for k in 1..=3u32 {
        let next = perturbed(&prev, k, 300);
        let id = id_of(&next);
        let d = delta::encode_gguf(&prev, &next, delta::DEFAULT_LEVEL).unwrap();
        let ans = publish(&mut t, net.window() + u64::from(k) - 1, id, Some(prev_id), &d).await.unwrap();
        assert!(matches!(ans, Frame::CheckpointStored(_)), "{ans:?}");
        prev = next;
        prev_id = id;
    }
    // A miner with no model at all: the relay sends the full latest checkpoint.
    let mut m = Miner::spawn(net.miner("late", false));
    let e = m.wait_for(60, |e| matches!(e, RunEvent::Sync(SyncEvent::Staged { .. }))).await;
    let RunEvent::Sync(SyncEvent::Staged { id, by_delta, bytes, .. }) = e else { unreachable!() };
    assert_eq!(id, prev_id);
    assert!(!by_delta);
    assert_eq!(bytes, net.genesis_bytes.len() as u64);
    generates_on(&mut m, prev_id).await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_delta_is_refused_and_recovered() {
    let net = Net::start(2_500, 500, 1, 2).await;
    let mut t = trainer_session(&net).await;
    let next = perturbed(&net.genesis_bytes, 7, 300);
    let id = id_of(&next);
    let d = delta::encode_gguf(&net.genesis_bytes, &next, delta::DEFAULT_LEVEL).unwrap();
    assert!(matches!(publish(&mut t, net.window(), id, Some(net.genesis), &d).await, Ok(Frame::CheckpointStored(_))));
    // The relay's stored copy of the delta rots on disk.
    let path = net.relay_dir().join("delta").join(format!("{}-{id}.delta", net.genesis));
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    // A miner on genesis is offered the delta, refuses it, falls back to the
    // full checkpoint, and only ever generates on verified models.
    let mut m = Miner::spawn(net.miner("m", true));
    m.wait_for(60, |e| matches!(e, RunEvent::Sync(SyncEvent::Refused { id: r, .. }) if *r == id)).await;
    let e = m.wait_for(60, |e| matches!(e, RunEvent::Sync(SyncEvent::Staged { .. }))).await;
    assert!(matches!(e, RunEvent::Sync(SyncEvent::Staged { id: s, by_delta: false, .. }) if s == id));
    generates_on(&mut m, id).await;
    m.stop().await;
}
