//! One key floods the coordinator far beyond its rate limit while two honest
//! miners mine: the flood is refused as rate-limited and the honest miners
//! keep ≥ 99 % acceptance.

use std::time::Duration;

use edge_miner::run::RunEvent;
use tributary_net::Session;
use tributary_protocol::wire::{Blob, Frame, Role, Submit};
use tributary_tests::{Miner, Net, NetConfig, seeded_key, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_from_one_miner_does_not_hurt_the_others() {
    let mut cfg = NetConfig::new(3_000, 500, 1, 4);
    cfg.rollouts_per_sec = 40;
    let net = Net::with(cfg).await;
    let mut honest: Vec<Miner> =
        ["a", "b"].iter().map(|n| Miner::spawn(net.miner_with_key(n, seeded_key(0, n), true))).collect();
    for m in &mut honest {
        m.wait_for(60, |e| matches!(e, RunEvent::Submitted { .. })).await;
    }
    let start_window = net.window();
    // The flood: 4 KiB submissions as fast as the connection takes them, for two windows.
    let flooder = seeded_key(0, "flood");
    let mut s = within(30, Session::connect(net.node.quic, &net.node.fingerprint, &flooder, Role::Miner))
        .await
        .expect("connect");
    let flood = tokio::spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_secs(6);
        let mut sent = 0u64;
        while tokio::time::Instant::now() < until {
            for _ in 0..64 {
                let f = Frame::Submit(Submit { seq: sent, rollout: Blob(vec![0xAB; 4096]) });
                if s.send(&f).await.is_err() {
                    return sent;
                }
                sent += 1;
            }
            for _ in 0..64 {
                if s.recv().await.is_err() {
                    return sent;
                }
            }
        }
        sent
    });
    let sent = within(60, flood).await.expect("flood task");
    // The honest miners kept mining through the flood.
    net.wait_window(30, start_window + 2).await;
    for m in &mut honest {
        let w = start_window + 1;
        m.wait_for(60, |e| matches!(e, RunEvent::Submitted { window, .. } if *window >= w)).await;
    }
    let miners = net.node.shared.core().miners().clone();
    let f = &miners[&flooder.public()];
    let limited = f.rejected.get("rate_limited").copied().unwrap_or(0);
    assert!(sent > 1_000, "flood of {sent}");
    assert!(limited * 10 >= sent * 9, "{limited} of {sent} rate-limited: {:?}", f.rejected);
    assert_eq!(f.accepted, 0);
    for m in &honest {
        let st = &miners[&m.key.public()];
        // Identical completions of the random tiny model are refused as replays by
        // design; every other submission counts.
        let replays = st.rejected.get("replayed_content").copied().unwrap_or(0);
        let refused: u64 = st.rejected.values().sum::<u64>() - replays;
        let acceptance = st.accepted as f64 / (st.accepted + refused) as f64;
        assert!(acceptance >= 0.99, "acceptance {acceptance}: {:?}", st.rejected);
        assert!(st.accepted >= 8);
    }
    for m in honest {
        m.stop().await;
    }
}
