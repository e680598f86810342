//! Network identity (network-security review E6 second half, W11): a
//! signature made for one network is never valid on another, a client
//! refuses a coordinator whose key is not the one it pinned (or that cannot
//! prove it holds the key it names), and a signed document is accepted only
//! from the peer that signed it.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::within;
use coordinator::net::{self, Session};
use coordinator::node::{self, Config, Node};
use coordinator::server::now_ms;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::*;

fn cfg(dir: &std::path::Path, validators: &[&Keypair]) -> Config {
    let mut cfg = Config::dev(dir.to_path_buf());
    cfg.window_ms = 1_000;
    cfg.grace_ms = 100;
    cfg.validators = validators.iter().map(|k| k.public().to_string()).collect();
    cfg
}

async fn start(cfg: &Config) -> Node {
    within(node::start(cfg, ContentId([1; 32]))).await.unwrap()
}

/// Sleeps until `node`'s window 0 has closed (verdicts are taken only then).
async fn after_window_zero(node: &Node) {
    let closes = node.shared.core().schedule().closes_at(0);
    let now = now_ms();
    if closes + 50 > now {
        tokio::time::sleep(Duration::from_millis(closes + 50 - now)).await;
    }
}

fn body(validator: &Keypair) -> VerdictBody {
    VerdictBody {
        window: 0,
        miner: Keypair::from_seed([77; 32]).public(),
        validator: validator.public(),
        checked: 4,
        valid: 0,
        estimated_valid: 0,
        hard_failure: true,
        soft_failures: 0,
        reasons: vec!["test".into()],
        passed: vec![],
        evidence: vec![],
    }
}

/// E6 (network id): one validator key serves two networks. A verdict it
/// signed on network A, replayed to network B, is refused there (and would
/// have banned the miner on B). Before: B stored it (VerdictAck).
#[tokio::test]
async fn a_verdict_signed_for_another_network_is_refused() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let validator = Keypair::from_seed([61; 32]);
    let a = start(&cfg(da.path(), &[&validator])).await;
    let b = start(&cfg(db.path(), &[&validator])).await;
    let sa = within(Session::connect(a.quic, &a.fingerprint, &validator, Role::Validator)).await.unwrap();
    let signed_on_a = Verdict::sign(body(&validator), &validator, &sa.network());
    after_window_zero(&a).await;
    after_window_zero(&b).await;
    let mut sb = within(Session::connect(b.quic, &b.fingerprint, &validator, Role::Validator)).await.unwrap();
    let answer = within(sb.request(&Frame::PostVerdict(signed_on_a.clone()))).await;
    assert!(
        matches!(answer, Err(net::NetError::Refused(ErrorCode::BadSignature, _))),
        "network B took network A's verdict: {answer:?}"
    );
    assert!(!b.shared.core().is_banned(&body(&validator).miner, 1));
    // On A, where it was signed, it is taken.
    let mut sa = sa;
    let answer = within(sa.request(&Frame::PostVerdict(signed_on_a))).await.unwrap();
    assert!(matches!(answer, Frame::VerdictAck(_)), "{answer:?}");
}

/// W11: a validator posts another configured validator's verdict (an old
/// one, to overwrite a newer one or re-ban after an unban). The coordinator
/// takes verdicts only from the validator that signed them. Before: stored.
#[tokio::test]
async fn a_validator_cannot_post_another_validators_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = (Keypair::from_seed([62; 32]), Keypair::from_seed([63; 32]));
    let node = start(&cfg(dir.path(), &[&v1, &v2])).await;
    after_window_zero(&node).await;
    let mut s1 = within(Session::connect(node.quic, &node.fingerprint, &v1, Role::Validator)).await.unwrap();
    let by_v2 = Verdict::sign(body(&v2), &v2, &s1.network());
    let answer = within(s1.request(&Frame::PostVerdict(by_v2))).await;
    assert!(
        matches!(answer, Err(net::NetError::Refused(ErrorCode::BadSignature, _))),
        "a validator posted another's verdict: {answer:?}"
    );
    let own = Verdict::sign(body(&v1), &v1, &s1.network());
    assert!(matches!(within(s1.request(&Frame::PostVerdict(own))).await.unwrap(), Frame::VerdictAck(_)));
}

/// Coordinator key pinning: a client configured with another coordinator
/// key refuses this coordinator before it signs anything, with an error
/// naming both keys; configured with the right key, it connects.
#[tokio::test]
async fn a_client_refuses_a_coordinator_whose_key_is_not_the_pinned_one() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&cfg(dir.path(), &[])).await;
    let miner = Keypair::from_seed([64; 32]);
    let other = Keypair::from_seed([65; 32]).public();
    let pin = net::KeyPin::Exact(other);
    let r = within(Session::connect_pinned(node.quic, &node.fingerprint, &pin, &miner, Role::Miner)).await;
    let e = r.map(|_| "connected").unwrap_err();
    assert!(matches!(e, net::NetError::CoordinatorKey { .. }), "{e:?}");
    assert!(e.is_final(), "a wrong coordinator key is not retried");
    let msg = e.to_string();
    assert!(msg.contains(&other.to_string()) && msg.contains(&node.shared.key.public().to_string()), "{msg}");
    let pin = net::KeyPin::Exact(node.shared.key.public());
    within(Session::connect_pinned(node.quic, &node.fingerprint, &pin, &miner, Role::Miner)).await.unwrap();
}

/// Coordinator key pinning, trust on first use: with no configured key the
/// first coordinator key seen is written to the pin file, and a coordinator
/// with another key is refused afterwards.
#[tokio::test]
async fn an_unconfigured_client_pins_the_first_coordinator_key_it_sees() {
    let (da, db, dc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(&cfg(da.path(), &[])).await;
    let b = start(&cfg(db.path(), &[])).await;
    let miner = Keypair::from_seed([66; 32]);
    let file = dc.path().join(net::COORDINATOR_PIN_FILE);
    let pin = net::KeyPin::resolve(None, Some(dc.path()), false).unwrap();
    within(Session::connect_pinned(a.quic, &a.fingerprint, &pin, &miner, Role::Miner)).await.unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), a.shared.key.public().to_string());
    let pin = net::KeyPin::resolve(None, Some(dc.path()), false).unwrap();
    let e = within(Session::connect_pinned(b.quic, &b.fingerprint, &pin, &miner, Role::Miner)).await.unwrap_err();
    assert!(matches!(e, net::NetError::CoordinatorKey { .. }), "{e:?}");
    // A configured key wins over the file, and `--dev` pins nothing.
    let pin = net::KeyPin::resolve(Some(&b.shared.key.public().to_string()), Some(dc.path()), false).unwrap();
    within(Session::connect_pinned(b.quic, &b.fingerprint, &pin, &miner, Role::Miner)).await.unwrap();
    assert!(matches!(net::KeyPin::resolve(None, Some(dc.path()), true).unwrap(), net::KeyPin::Any));
}

/// A server that names another coordinator's key in its challenge (a
/// network operator impersonating a network whose key its client pinned or
/// will pin) cannot sign for that key: the client refuses before it signs
/// its own handshake. Before: the client signed and sent `Auth`, and went
/// on to sign documents for the network the impostor named.
#[tokio::test]
async fn an_impostor_naming_another_coordinators_key_gets_no_signature() {
    let dir = tempfile::tempdir().unwrap();
    let real = start(&cfg(dir.path(), &[])).await;
    let claimed = real.shared.key.public();
    let (cert, key_der) = net::self_signed().unwrap();
    let pin = net::fingerprint(&cert);
    let server = net::server_endpoint("127.0.0.1:0".parse().unwrap(), cert, key_der).unwrap();
    let addr: SocketAddr = server.local_addr().unwrap();
    let impostor = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let _hello = net::read_frame(&mut recv).await.unwrap().unwrap();
        // Its own signature cannot be the claimed key's.
        let fake = Keypair::from_seed([67; 32]);
        let nonce = [9u8; 32];
        let proof = fake.sign(tributary_protocol::domain::sign::COORDINATOR_HANDSHAKE, &nonce);
        let c = Challenge { nonce, coordinator: claimed, proof };
        net::write_frame(&mut send, &Frame::Challenge(c)).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(3), net::read_frame(&mut recv)).await;
        let signed = matches!(got, Ok(Ok(Some(Frame::Auth(_)))));
        (signed, server, conn)
    });
    let miner = Keypair::from_seed([68; 32]);
    let r = within(Session::connect_pinned(addr, &pin, &net::KeyPin::Any, &miner, Role::Miner)).await;
    let e = r.map(|_| "connected").unwrap_err();
    assert!(matches!(e, net::NetError::CoordinatorKey { .. }), "{e:?}");
    let (signed, _server, _conn) = within(impostor).await.unwrap();
    assert!(!signed, "the client signed its handshake for an impostor");
}

async fn genesis_path(node: &Node) -> (CheckpointPath, NetworkId) {
    let key = Keypair::from_seed([69; 32]);
    let mut m = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let get = Frame::GetCheckpointPath(GetCheckpointPath { have: None, want: None });
    match within(m.request(&get)).await.unwrap() {
        Frame::CheckpointPath(p) => (p, m.network()),
        f => panic!("expected a path, got {f:?}"),
    }
}

/// W4 for the first model: the genesis checkpoint's path carries the
/// trainer's signed announcement like every later checkpoint's. In `--dev`
/// the coordinator signs it with the public dev trainer key; with an own
/// trainer key there is none until the trainer announces the genesis file,
/// which is then stored. Before: the genesis path had no announcement, so the
/// coordinator alone named the first model every miner loads.
#[tokio::test]
async fn the_genesis_checkpoint_carries_the_trainers_signed_announcement() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::dev(dir.path().to_path_buf());
    let genesis = node::prepare_genesis(&cfg).unwrap();
    let node = within(node::start(&cfg, genesis)).await.unwrap();
    let (path, network) = genesis_path(&node).await;
    assert_eq!(path.target, genesis);
    let ann = path.announcement.expect("the --dev genesis path carries an announcement");
    ann.verify(&network).unwrap();
    let bytes = node::dev_tiny_bytes().unwrap();
    let dev_trainer = tributary_protocol::dev::key(Role::Trainer).public();
    assert_eq!((ann.body.id, ann.body.trainer, ann.body.kind), (genesis, dev_trainer, CheckpointKind::Full));
    assert_eq!((ann.body.len, ann.body.payload_hash), (bytes.len() as u64, *blake3::hash(&bytes).as_bytes()));

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().to_path_buf());
    let trainer = Keypair::from_seed([70; 32]);
    cfg.trainer = Some(trainer.public().to_string());
    let genesis = node::prepare_genesis(&cfg).unwrap();
    let node = within(node::start(&cfg, genesis)).await.unwrap();
    assert!(genesis_path(&node).await.0.announcement.is_none(), "no trainer has announced it yet");
    let mut t = within(Session::connect(node.quic, &node.fingerprint, &trainer, Role::Trainer)).await.unwrap();
    let body = CheckpointBody {
        id: genesis,
        kind: CheckpointKind::Full,
        len: bytes.len() as u64,
        payload_hash: *blake3::hash(&bytes).as_bytes(),
        window: 0,
        trainer: trainer.public(),
    };
    let ann = PublishCheckpoint::sign(body, &trainer, &t.network());
    within(t.send(&Frame::PublishCheckpoint(ann.clone()))).await.unwrap();
    for (i, c) in bytes.chunks(MAX_CHUNK_LEN as usize).enumerate() {
        let offset = (i * MAX_CHUNK_LEN as usize) as u64;
        let chunk = CheckpointChunk { id: genesis, offset, data: Blob(c.to_vec()) };
        within(t.send(&Frame::CheckpointChunk(chunk))).await.unwrap();
    }
    assert!(matches!(within(t.recv()).await.unwrap(), Frame::CheckpointStored(_)));
    let (path, _) = genesis_path(&node).await;
    assert_eq!(path.announcement.as_ref(), Some(&ann));
    assert_eq!(node.shared.relay.entries().len(), 1, "no second checkpoint");
    assert!(node.shared.store.meta(coordinator::node::GENESIS_ANNOUNCEMENT).unwrap().is_some(), "stored");
}
