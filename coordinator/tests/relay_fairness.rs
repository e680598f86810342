//! Issue 29 items 2 and 7 (network-security review 2, findings 2 and 7):
//! the relay budget cannot be starved by connections that never read, a
//! peer that stops reading is cut off at the write deadline and frees what
//! it held, and a framing error before login closes with a reason.

mod common;

use std::time::Duration;

use common::within;
use coordinator::net::{self, Session};
use coordinator::node::{self, Config, Node};
use coordinator::relay::CHUNK_LEN;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::*;

/// A relay payload of `len` bytes served as checkpoint `id`.
fn relay_payload(node: &Node, id: ContentId, len: u64) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
    node.shared.relay.insert_unannounced(id, 5, &data).unwrap();
    data
}

/// Connects as a miner with a fresh key.
async fn miner(node: &Node, seed: u8) -> Session {
    within(Session::connect(node.quic, &node.fingerprint, &Keypair::from_seed([seed; 32]), Role::Miner)).await.unwrap()
}

/// Downloads the whole payload chunk by chunk, as a miner resumes.
async fn download(s: &mut Session, id: ContentId, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        let offset = out.len() as u64;
        match s.request(&Frame::GetCheckpoint(GetCheckpoint { id, offset })).await.unwrap() {
            Frame::CheckpointChunk(c) => {
                assert_eq!(c.offset, offset);
                assert!(!c.data.0.is_empty());
                out.extend_from_slice(&c.data.0);
            }
            f => panic!("unexpected {f:?}"),
        }
    }
    out
}

/// The probe's shape at test scale: a relay budget of 8 MiB (two 4 MiB
/// chunks), 4 keys × 2 connections that each ask for 2 chunks and never
/// read (QUIC flow control then blocks the server's writes). Before, the
/// first two writers took the whole budget for as long as their peers did
/// not read (no write deadline): an honest miner's GetCheckpoint got no
/// answer. Now each key holds at most its share, a writer holds one piece
/// at a time, and the honest download completes while the attackers still
/// hold their connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_download_completes_while_unread_relay_connections_are_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 600_000;
    cfg.relay_inflight_mib = 8;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let id = ContentId([9; 32]);
    let len = 3 * CHUNK_LEN as u64 + 1000;
    let data = relay_payload(&node, id, len);

    let mut attackers = Vec::new();
    for k in 0..4u8 {
        for _ in 0..2 {
            let mut s = miner(&node, 40 + k).await;
            for c in 0..2u64 {
                let offset = c * CHUNK_LEN as u64;
                within(s.send(&Frame::GetCheckpoint(GetCheckpoint { id, offset }))).await.unwrap();
            }
            attackers.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut honest = miner(&node, 99).await;
    let got = within(download(&mut honest, id, len)).await;
    assert!(got == data, "the honest miner got other bytes");
    // The attackers are still connected, holding what they hold.
    assert!(attackers.iter().all(|s| s.conn.close_reason().is_none()), "an attacker was disconnected");
    let held = node.shared.relay_inflight_kib();
    println!("8 unread connections hold {held} KiB of the relay budget (8192 KiB)");
    assert!(held <= 4 * 1024, "unread connections hold {held} KiB of 8192");
}

/// A peer that stops reading is disconnected once a write has waited past
/// the deadline, with a reason, and its share of the budget is free again.
/// Before: no write deadline, the chunk and its permit were held for as
/// long as the connection lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_cut_off_at_the_write_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 600_000;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    node.shared.relay_budget().set_write_deadline(Duration::from_millis(500));
    let id = ContentId([9; 32]);
    relay_payload(&node, id, 2 * CHUNK_LEN as u64);
    let mut s = miner(&node, 40).await;
    for c in 0..2u64 {
        within(s.send(&Frame::GetCheckpoint(GetCheckpoint { id, offset: c * CHUNK_LEN as u64 }))).await.unwrap();
    }
    let closed = within(s.conn.closed()).await;
    match closed {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(&c.reason[..], b"relay write deadline", "{c:?}");
        }
        e => panic!("closed otherwise: {e:?}"),
    }
    within(async {
        while node.shared.relay_inflight_kib() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // An honest miner is served in full.
    let mut honest = miner(&node, 99).await;
    match within(honest.request(&Frame::GetCheckpoint(GetCheckpoint { id, offset: 0 }))).await.unwrap() {
        Frame::CheckpointChunk(c) => assert_eq!(c.data.0.len(), CHUNK_LEN),
        f => panic!("unexpected {f:?}"),
    }
}

/// Review finding 7: a framing error before login (an unknown tag in place
/// of Hello) closes the connection with an error code and a reason the
/// peer can read, after a typed error frame. Before: code 0, no reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framing_error_before_login_closes_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 600_000;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(net::client_config(&node.fingerprint).unwrap());
    let conn = within(ep.connect(node.quic, "localhost").unwrap()).await.unwrap();
    let (mut send, mut recv) = within(conn.open_bi()).await.unwrap();
    // A header with an unknown tag (0xEEEE) and a 4-byte body.
    send.write_all(&[4, 0, 0, 0, 0xEE, 0xEE, 1, 2, 3, 4]).await.unwrap();
    let answer = within(net::read_frame(&mut recv)).await;
    assert!(
        matches!(&answer, Ok(Some(Frame::Error(e))) if e.code == ErrorCode::Malformed),
        "a typed error expected: {answer:?}"
    );
    match within(conn.closed()).await {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_ne!(u64::from(c.error_code), 0, "{c:?}");
            assert_eq!(&c.reason[..], b"malformed frame", "{c:?}");
        }
        e => panic!("closed otherwise: {e:?}"),
    }
}

/// Review 2, finding 6: `requests_per_sec` counted requests, not bytes (one
/// key pulled 100 MiB with 25 requests). A miner key now pulls checkpoint
/// bytes at most at `relay_kib_per_sec` (burst: one second's worth): at 1 MiB/s
/// a key's 6 MiB take at least 5 s, and another key's download is not held
/// behind it (it completes while the first is still pulling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_pulls_checkpoint_bytes_at_its_rate_and_others_are_not_held_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 600_000;
    cfg.relay_kib_per_sec = 1024;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let id = ContentId([9; 32]);
    let len = 6 << 20;
    let data = relay_payload(&node, id, len);
    let started = std::time::Instant::now();
    let mut greedy = miner(&node, 41).await;
    let pull = tokio::spawn(async move {
        let got = download(&mut greedy, id, len).await;
        (got, std::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut other = miner(&node, 42).await;
    let small = ContentId([8; 32]);
    let small_data = relay_payload(&node, small, 512 << 10);
    let got = within(download(&mut other, small, 512 << 10)).await;
    let other_done = std::time::Instant::now();
    assert!(got == small_data);
    let (got, greedy_done) = tokio::time::timeout(Duration::from_secs(60), pull).await.unwrap().unwrap();
    assert!(got == data, "the greedy key got other bytes");
    assert!(other_done < greedy_done, "the other key's download waited for the greedy key's");
    // An upper bound on the rate (a slow machine only makes it slower):
    // 6 MiB at 1 MiB/s with 1 MiB of burst take at least 5 s.
    let took = greedy_done - started;
    assert!(took >= Duration::from_secs(5), "6 MiB at 1 MiB/s in {took:?}");
}
