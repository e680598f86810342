//! network-security E1 (own test binary: it measures the process's memory).
//! A miner asks for checkpoint chunks and never reads its answers. Before,
//! each 39-byte request made the coordinator read a 4 MiB chunk into memory
//! and park it, up to 4 096 per connection (measured here: 192 requests,
//! +768 MiB). Now a chunk is read only when the connection's writer can send
//! it, within a global budget: the server holds at most one chunk per
//! connection, and an honest peer is still served meanwhile.

mod common;

use std::time::Duration;

use common::within;
use coordinator::net::Session;
use coordinator::node::{self, Config};
use coordinator::relay::CHUNK_LEN;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::*;

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_cannot_pin_relay_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 600_000;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    // A 64 MiB payload announced in the relay (its bytes are never parsed when served).
    let id = ContentId([9; 32]);
    let len = 64u64 << 20;
    node.shared.relay.insert_unannounced(id, 5, &vec![0x5a; len as usize]).unwrap();
    let before = rss_kib();
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &Keypair::from_seed([41; 32]), Role::Miner))
        .await
        .unwrap();
    let requests = 192u64;
    for k in 0..requests {
        let offset = (k % 16) * CHUNK_LEN as u64;
        within(s.send(&Frame::GetCheckpoint(GetCheckpoint { id, offset }))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown_mib = rss_kib().saturating_sub(before) / 1024;
    // An honest peer is served meanwhile.
    let mut h = within(Session::connect(node.quic, &node.fingerprint, &Keypair::from_seed([42; 32]), Role::Miner))
        .await
        .unwrap();
    match within(h.request(&Frame::GetCheckpoint(GetCheckpoint { id, offset: 0 }))).await.unwrap() {
        Frame::CheckpointChunk(c) => assert_eq!(c.data.0.len(), CHUNK_LEN),
        f => panic!("unexpected {f:?}"),
    }
    println!("192 unread chunk requests: coordinator process grew {grown_mib} MiB");
    assert!(grown_mib < 160, "grew {grown_mib} MiB for {requests} unread 4 MiB chunks");
    assert!(node.shared.relay_inflight_kib() <= 2 * (CHUNK_LEN >> 10), "{} KiB", node.shared.relay_inflight_kib());
}
