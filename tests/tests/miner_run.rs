//! `edge-miner run` against a `--dev` coordinator, both in-process: the
//! miner's rollouts are acknowledged over several windows.

use std::collections::BTreeSet;

use edge_miner::run::RunEvent;
use tributary_tests::{Miner, Net, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn miner_mines_several_windows() {
    let net = Net::start(2_500, 500, 2, 4).await;
    let mut m = Miner::spawn(net.miner("m1", true));
    let mut windows = BTreeSet::new();
    while windows.len() < 3 {
        if let RunEvent::Submitted { window, checkpoint, stored, refused } =
            m.wait_for(30, |e| matches!(e, RunEvent::Submitted { .. })).await
        {
            assert_eq!(checkpoint, net.genesis);
            assert!(tributary_tests::honest_refusals(&refused), "{refused:?}");
            assert_eq!(stored + refused.len(), 4);
            windows.insert(window);
        }
    }
    let key = m.key.public();
    let s = m.stop().await;
    assert!(s.stored >= 3 * 3, "{s:?}");
    let stats = net.node.shared.core().miners()[&key].clone();
    assert_eq!(stats.accepted, s.stored);
    assert!(stats.rejected.keys().all(|r| *r == "replayed_content"), "{:?}", stats.rejected);
    // The operator sees the miner's checkpoint.
    let body = within(10, http_get(net.node.http, "/api/miners")).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v[key.to_string()]["checkpoint"], net.genesis.to_string());
}

/// A minimal HTTP/1.0 GET (the mesh factory's).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}
