//! A miner dropped on the floor mid-window (its task aborted wherever it is:
//! generating or streaming a group) and restarted on its folder: nothing it
//! had acknowledged is lost, no slot is stored twice, and it finishes the window.

use std::time::Duration;

use edge_miner::run::RunEvent;
use tributary_tests::{Miner, Net, NetConfig, seeded_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn miner_dropped_mid_upload_resumes_without_duplicates() {
    let net = Net::with(NetConfig::new(9_000, 1_000, 4, 4)).await;
    let key = seeded_key(0, "m");
    let mut m = Miner::spawn(net.miner_with_key("m", key.clone(), true));
    let w = loop {
        // Start on a fresh window so the restarted miner has time to finish it.
        let e = m.wait_for(60, |e| matches!(e, RunEvent::Submitted { .. })).await;
        let RunEvent::Submitted { window, .. } = e else { unreachable!() };
        let left = net.node.shared.core().schedule().opens_at(window + 1).saturating_sub(coordinator::server::now_ms());
        if left > 5_000 {
            break window;
        }
    };
    // The next group is being generated or streamed: drop the miner now.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let acked = m.acked;
    m.abort().await;
    let before = net.node.shared.core().progress(w, &key.public());
    assert!(before.len() as u64 >= acked.min(16), "{} stored, {acked} acknowledged", before.len());

    let mut again = Miner::spawn(net.miner_with_key("m", key.clone(), true));
    net.wait_window(60, w + 2).await;
    let events = again.drain();
    assert!(
        events.iter().any(|e| matches!(e, RunEvent::Submitted { window, .. } if *window == w)),
        "restarted miner resumed window {w}: {events:?}"
    );
    let after = net.node.shared.core().progress(w, &key.public());
    // Nothing acknowledged was lost; every group of the window has rollouts stored.
    for s in &before {
        assert!(after.contains(s), "slot {s:?} lost");
    }
    for g in 0..4 {
        assert!(after.iter().any(|(group, _)| *group == g), "group {g} never stored");
    }
    // Exactly the stored slots are in the database: nothing twice.
    let (rows, _) = net.node.shared.store.rollouts(w, Some(&key.public()), None, 256).expect("store");
    assert_eq!(rows.len(), after.len());
    let stats = net.node.shared.core().miners()[&key.public()].clone();
    assert!(stats.rejected.keys().all(|r| *r == "replayed_content" || *r == "duplicate"), "{:?}", stats.rejected);
    again.stop().await;
}
