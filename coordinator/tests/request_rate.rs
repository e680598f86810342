//! Review W9: requests other than submissions were not rate limited at all
//! (a miner key could ask for the window, the reveal, weights, progress or
//! checkpoint paths as fast as it liked). Each miner key now has a budget of
//! `requests_per_sec` (burst: one second's worth); past it a request is
//! answered `RateLimited` and the connection stays up. The configured
//! validator is not limited.

mod common;

use common::within;
use coordinator::net::{NetError, Session};
use coordinator::node::{self, Config};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{ErrorCode, Frame, GetWindow, Role};

/// Sends `n` GetWindow requests; how many were refused as rate limited.
async fn flood(s: &mut Session, n: usize) -> usize {
    let mut limited = 0;
    for _ in 0..n {
        match within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await {
            Ok(Frame::WindowInfo(_)) => {}
            Err(NetError::Refused(ErrorCode::RateLimited, _)) => limited += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    limited
}

#[tokio::test]
async fn a_miner_key_flooding_requests_is_rate_limited_and_stays_connected() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().into());
    cfg.window_ms = 600_000;
    cfg.requests_per_sec = 20;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let key = Keypair::from_seed([3; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let limited = flood(&mut s, 200).await;
    eprintln!("miner: {limited} of 200 requests refused as rate limited");
    assert!(limited >= 100, "{limited} of 200 refused at 20/s");
    // Still connected: after a pause the next request is answered.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(flood(&mut s, 1).await, 0);
    // The configured validator is not limited.
    let v = tributary_protocol::dev::key(Role::Validator);
    let mut vs = within(Session::connect(node.quic, &node.fingerprint, &v, Role::Validator)).await.unwrap();
    assert_eq!(flood(&mut vs, 200).await, 0);
}
