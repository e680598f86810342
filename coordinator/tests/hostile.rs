//! The coordinator against hostile peers (network-security review E2, E4,
//! E6, W1, W2; review 2 finding 3; proof-soundness findings 3 and 9): each test is a finding's
//! reproduction over loopback QUIC, asserting the bound that holds now.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{oversized, rollout, within};
use coordinator::core::{Candidate, Shape};
use coordinator::net::{self, NetError, Session};
use coordinator::node::{self, Config, Node};
use coordinator::server::now_ms;
use coordinator::store::StoredRollout;
use tributary_protocol::checkpoint::{Checkpoint, ContentId};
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::wire::*;

fn dev(dir: &std::path::Path) -> Config {
    let mut cfg = Config::dev(dir.to_path_buf());
    cfg.window_ms = 600_000;
    cfg
}

async fn start(cfg: &Config) -> Node {
    within(node::start(cfg, ContentId([1; 32]))).await.unwrap()
}

async fn window(s: &mut Session) -> WindowInfo {
    match within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap() {
        Frame::WindowInfo(w) => w,
        f => panic!("unexpected {f:?}"),
    }
}

async fn submit(s: &mut Session, seq: u64, r: &Rollout) -> Frame {
    within(s.request(&Frame::Submit(Submit { seq, rollout: Blob(r.encode()) }))).await.unwrap()
}

async fn sleep_until(ms: u64) {
    let now = now_ms();
    if ms > now {
        tokio::time::sleep(Duration::from_millis(ms - now)).await;
    }
}

/// Every rollout of a closed window, paged as a validator pages (asking for 256 at a time).
async fn fetch_all(s: &mut Session, window: u64) -> Result<Vec<Vec<u8>>, NetError> {
    let (mut out, mut after) = (Vec::new(), None);
    loop {
        let f = FetchRollouts { window, miner: None, after, limit: 256 };
        match within(s.request(&Frame::FetchRollouts(f))).await? {
            Frame::Rollouts(r) => {
                out.extend(r.items.into_iter().map(|b| b.0));
                match r.next {
                    Some(n) => after = Some(n),
                    None => return Ok(out),
                }
            }
            f => panic!("unexpected {f:?}"),
        }
    }
}

/// A raw QUIC connection pinned to the coordinator, with no stream opened.
async fn raw_connect(node: &Node) -> (quinn::Endpoint, Result<quinn::Connection, quinn::ConnectionError>) {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(net::client_config(&node.fingerprint).unwrap());
    let c = within(ep.connect(node.quic, "localhost").unwrap()).await;
    (ep, c)
}

/// W2 / E2: the largest rollout the door used to take (16 384 tokens of
/// 5-byte varints, ~229 KB, claiming `max_new_tokens` 16 384) and every other
/// break of the window's generation contract are refused at the door;
/// nothing of them is stored. Before: acknowledged and stored.
#[tokio::test]
async fn the_door_refuses_rollouts_outside_the_generation_contract() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dev(dir.path())).await;
    let key = Keypair::from_seed([31; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let info = window(&mut s).await;
    let max = info.sampling.max_new_tokens as usize;
    assert!(matches!(submit(&mut s, 0, &rollout(&info, &key, 0, 0, max)).await, Frame::Ack(_)));

    let n = 16_384usize;
    let huge = oversized(&info, &key, 0, 1, n);
    assert!(huge.encode().len() > 200_000);
    let mut bad = vec![("E2's 229 KB rollout", huge)];
    let mut r = rollout(&info, &key, 0, 2, max);
    r.sampling.temperature = 1.0;
    r.sign(&key);
    bad.push(("temperature", r));
    bad.push(("one completion token too many", rollout(&info, &key, 0, 3, max + 1)));
    let mut r = rollout(&info, &key, 1, 0, max);
    r.tokens = [vec![7u32; 2000], r.tokens[r.prompt_len as usize..].to_vec()].concat();
    r.sketches = vec![1; r.tokens.len()];
    r.prompt_len = 2000;
    r.sign(&key);
    bad.push(("a 2000-token prompt", r));
    for (i, (what, r)) in bad.iter().enumerate() {
        match submit(&mut s, 10 + i as u64, r).await {
            Frame::Refused(x) => assert_eq!(x.reason, RejectReason::Schema, "{what}"),
            f => panic!("{what}: expected a refusal, got {f:?}"),
        }
    }
    assert_eq!(node.shared.store.rollout_count().unwrap(), 1);
}

/// E2: a window holding 40 rollouts of 1 MiB (stored before the door
/// enforced the contract, or by a door bug): a validator asking for 256 at a
/// time gets pages under the frame limit and reaches every rollout. Before:
/// the first answer was 40 MiB, over the 32 MiB frame limit, and the
/// validator's fetch failed on every retry.
#[tokio::test]
async fn rollout_pages_stay_under_the_frame_limit() {
    let dir = tempfile::tempdir().unwrap();
    let validator = Keypair::from_seed([201; 32]);
    let mut cfg = dev(dir.path());
    cfg.window_ms = 1_000;
    cfg.grace_ms = 100;
    cfg.validators = vec![validator.public().to_string()];
    let node = start(&cfg).await;
    let schedule = *node.shared.core().schedule();
    let w = schedule.window_at(now_ms()).unwrap();
    let big = MAX_ROLLOUT_LEN as usize;
    let rows: Vec<StoredRollout> = (0..40u8)
        .map(|i| StoredRollout {
            candidate: Candidate {
                window: w,
                checkpoint: ContentId([1; 32]),
                env: tributary_protocol::env::EnvId::Arith,
                group: 0,
                index: u32::from(i),
                task_id: 0,
                miner: Keypair::from_seed([i; 32]).public(),
                digest: *blake3::hash(&[i]).as_bytes(),
                content: [i; 32],
                shape: Shape::RESTORED,
            },
            bytes: vec![i; big],
        })
        .collect();
    node.shared.store.put_rollouts(&rows).unwrap();
    sleep_until(schedule.closes_at(w) + 20).await;
    let mut v = within(Session::connect(node.quic, &node.fingerprint, &validator, Role::Validator)).await.unwrap();
    let all = fetch_all(&mut v, w).await.expect("every page fits a frame");
    assert_eq!(all.len(), 40);
}

/// proof-soundness finding 9: a rollout admitted before its window closed
/// but not yet durable when a validator fetches the closed window. The fetch
/// waits for the commit in progress, and a commit that starts after the
/// close leaves the rollout out (refused as `WrongWindow`): the validator and
/// a later reader (the trainer) see the same set, and every acknowledged
/// rollout is in it. Checked with the writer held (`hold_commits`); with the
/// seal switched off, the validator saw nothing and the later fetch the
/// acknowledged rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard stalls the writer thread (and blocking fetches), never an async worker.
#[allow(clippy::await_holding_lock)]
async fn a_closed_window_is_sealed_before_anyone_fetches_it() {
    let dir = tempfile::tempdir().unwrap();
    let validator = Keypair::from_seed([202; 32]);
    let mut cfg = dev(dir.path());
    cfg.window_ms = 1_500;
    cfg.grace_ms = 100;
    cfg.validators = vec![validator.public().to_string()];
    let node = start(&cfg).await;
    let key = Keypair::from_seed([32; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let mut info = window(&mut s).await;
    if info.closes_at_ms < now_ms() + 600 {
        sleep_until(info.closes_at_ms).await;
        info = window(&mut s).await;
    }
    let r = rollout(&info, &key, 0, 0, info.sampling.max_new_tokens as usize);
    let held = node.shared.hold_commits();
    // Admitted now (the window is open), durable only once the writer may commit.
    within(s.send(&Frame::Submit(Submit { seq: 1, rollout: Blob(r.encode()) }))).await.unwrap();
    sleep_until(info.closes_at_ms + 50).await;
    let (addr, pin, vk, w) = (node.quic, node.fingerprint.clone(), validator.clone(), info.window);
    let validator_view = tokio::spawn(async move {
        let mut v = within(Session::connect(addr, &pin, &vk, Role::Validator)).await.unwrap();
        fetch_all(&mut v, w).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held);
    let answer = within(s.recv()).await.unwrap();
    let seen = within(validator_view).await.unwrap();
    let mut v = within(Session::connect(node.quic, &node.fingerprint, &validator, Role::Validator)).await.unwrap();
    let later = fetch_all(&mut v, info.window).await.unwrap();
    assert_eq!(seen, later, "the validator and a later reader see the same rollouts");
    match answer {
        Frame::Ack(_) => assert_eq!(seen, vec![r.encode()]),
        Frame::Refused(x) => {
            assert_eq!(x.reason, RejectReason::WrongWindow);
            assert!(seen.is_empty());
        }
        f => panic!("unexpected {f:?}"),
    }
}

/// proof-soundness finding 3 at the server: a checkpoint announced in window
/// W whose upload is durable only after W+1 opened (and after a miner read
/// W+1's parameters) takes effect from W+2; the miner's W+1 rollouts made
/// with the old checkpoint are acknowledged and nobody is penalised.
/// Before: W+1's checkpoint flipped mid-window, the rollout was refused as
/// `StaleCheckpoint` and the miner banned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_uploaded_across_a_boundary_never_changes_an_open_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = dev(dir.path());
    cfg.window_ms = 2_500;
    cfg.grace_ms = 200;
    let genesis = node::prepare_genesis(&cfg).unwrap();
    let node = within(node::start(&cfg, genesis)).await.unwrap();
    let src = Checkpoint::open(&tributary_assets::smollm2_q4_1()).unwrap();
    let bytes = tributary_protocol::tiny::tiny_checkpoint_bytes(7, &src).unwrap();
    let id = Checkpoint::from_bytes(bytes.clone()).unwrap().content_id();
    assert_ne!(id, genesis);
    let trainer = tributary_protocol::dev::key(Role::Trainer);
    let mut t = within(Session::connect(node.quic, &node.fingerprint, &trainer, Role::Trainer)).await.unwrap();
    let key = Keypair::from_seed([33; 32]);
    let mut m = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let schedule = *node.shared.core().schedule();
    let mut w = schedule.window_at(now_ms()).unwrap();
    if schedule.opens_at(w + 1) < now_ms() + 1_000 {
        w += 1;
    }
    let boundary = schedule.opens_at(w + 1);
    sleep_until(boundary - 700).await;
    let body = CheckpointBody {
        id,
        kind: CheckpointKind::Full,
        len: bytes.len() as u64,
        payload_hash: *blake3::hash(&bytes).as_bytes(),
        window: w,
        trainer: trainer.public(),
    };
    within(t.send(&Frame::PublishCheckpoint(PublishCheckpoint::sign(body, &trainer, &t.network())))).await.unwrap();
    let chunk = 1 << 20;
    let last = (bytes.len() - 1) / chunk * chunk;
    for off in (0..last).step_by(chunk) {
        let data = Blob(bytes[off..off + chunk].to_vec());
        within(t.send(&Frame::CheckpointChunk(CheckpointChunk { id, offset: off as u64, data }))).await.unwrap();
    }
    // W+1 opens and a miner reads its parameters while the upload is unfinished.
    sleep_until(boundary + 100).await;
    let info = window(&mut m).await;
    assert_eq!((info.window, info.checkpoint), (w + 1, genesis));
    sleep_until(boundary + 300).await;
    let data = Blob(bytes[last..].to_vec());
    within(t.send(&Frame::CheckpointChunk(CheckpointChunk { id, offset: last as u64, data }))).await.unwrap();
    assert!(matches!(within(t.recv()).await.unwrap(), Frame::CheckpointStored(_)));
    let r = rollout(&info, &key, 0, 0, info.sampling.max_new_tokens as usize);
    assert!(matches!(submit(&mut m, 1, &r).await, Frame::Ack(_)), "an honest W+1 rollout is acknowledged");
    {
        let core = node.shared.core();
        assert!(core.verdicts_on(w + 1, &key.public()).is_empty(), "no door penalty");
        assert!(!core.is_banned(&key.public(), w + 1));
        assert_eq!(core.checkpoint_for(w + 1), genesis);
        assert_eq!(core.checkpoint_for(w + 2), id);
    }
    // Miners get the trainer's signed announcement with the path (W4).
    let Frame::CheckpointPath(path) =
        within(m.request(&Frame::GetCheckpointPath(GetCheckpointPath { have: Some(genesis), want: None })))
            .await
            .unwrap()
    else {
        panic!("expected a path")
    };
    let ann = path.announcement.expect("the announcement comes with the path");
    assert!(ann.verify(&node.shared.network()).is_ok());
    assert_eq!((ann.body.id, ann.body.trainer), (id, trainer.public()));
    // What a restart restores agrees.
    let stored = node.shared.store.checkpoints().unwrap();
    assert_eq!(stored.iter().map(|(from, a)| (*from, a.body.id)).collect::<Vec<_>>(), vec![(w + 2, id)]);
}

/// E4: a connection that never opens a stream is closed at the handshake
/// deadline, and the server takes no QUIC datagrams. Before: such a
/// connection stayed up for good (the server's keep-alives kept it alive),
/// and each could buffer 1.25 MB of datagrams before authenticating.
#[tokio::test]
async fn a_silent_connection_is_closed_and_takes_no_datagrams() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = dev(dir.path());
    cfg.handshake_timeout_ms = 300;
    let node = start(&cfg).await;
    let (_ep, c) = raw_connect(&node).await;
    let c = c.unwrap();
    assert_eq!(c.max_datagram_size(), None, "datagrams are off");
    assert!(c.send_datagram(vec![0u8; 100].into()).is_err());
    let closed = within(c.closed()).await;
    assert!(matches!(closed, quinn::ConnectionError::ApplicationClosed(_)), "{closed:?}");
    assert_eq!(node.shared.connections("127.0.0.1".parse().unwrap()), (0, 0));
}

/// E4: connections are capped per address and per key, and a silent miner
/// is dropped after the idle timeout. Before: no cap of either kind, and
/// no idle timeout.
#[tokio::test]
async fn connections_are_capped_per_address_and_per_key_and_idle_miners_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = dev(dir.path());
    cfg.max_connections_per_address = 3;
    cfg.max_connections_per_key = 2;
    cfg.idle_timeout_ms = 400;
    let node = start(&cfg).await;
    let key = Keypair::from_seed([34; 32]);
    let mut a = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let _b = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    match within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await {
        Err(NetError::Refused(ErrorCode::RateLimited, _)) => {}
        other => panic!("a third connection of one key: {:?}", other.map(|_| "logged in")),
    }
    let ip = "127.0.0.1".parse().unwrap();
    for _ in 0..50 {
        if node.shared.connections(ip) == (2, 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node.shared.connections(ip), (2, 2), "the refused connection is gone");
    let (_ep3, third) = raw_connect(&node).await;
    let _third = third.expect("the address's third connection");
    let (_ep4, fourth) = raw_connect(&node).await;
    assert!(fourth.is_err(), "the address's fourth connection is refused");
    // `a` keeps talking, `_b` stays silent past the idle timeout.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        window(&mut a).await;
    }
    let mut b = _b;
    assert!(within(b.request(&Frame::GetWindow(GetWindow { window: None }))).await.is_err(), "idle miner dropped");
}

/// E6: a server the miner dialled relays the miner's handshake to the real
/// coordinator. The coordinator's proof in the challenge is bound to the TLS
/// session it was made on, so the miner refuses the relayed challenge before
/// it signs anything; and a client signature made on another TLS session is
/// refused by the coordinator. Before: the relay was logged in as the miner,
/// and one bad-signature rollout under its key banned it.
#[tokio::test]
async fn a_relayed_handshake_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dev(dir.path())).await;
    let (cert, key_der) = net::self_signed().unwrap();
    let relay_pin = net::fingerprint(&cert);
    let relay = net::server_endpoint("127.0.0.1:0".parse().unwrap(), cert, key_der).unwrap();
    let relay_addr: SocketAddr = relay.local_addr().unwrap();
    let (coord, coord_pin) = (node.quic, node.fingerprint.clone());
    let mitm = tokio::spawn(async move {
        let victim = relay.accept().await.unwrap().await.unwrap();
        let (mut vs, mut vr) = victim.accept_bi().await.unwrap();
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(net::client_config(&coord_pin).unwrap());
        let real = ep.connect(coord, "localhost").unwrap().await.unwrap();
        let (mut cs, mut cr) = real.open_bi().await.unwrap();
        let hello = net::read_frame(&mut vr).await.unwrap().unwrap();
        net::write_frame(&mut cs, &hello).await.unwrap();
        let challenge = net::read_frame(&mut cr).await.unwrap().unwrap();
        net::write_frame(&mut vs, &challenge).await.unwrap();
        let auth = tokio::time::timeout(Duration::from_secs(3), net::read_frame(&mut vr)).await;
        let signed = matches!(auth, Ok(Ok(Some(Frame::Auth(_)))));
        (signed, ep, relay, victim)
    });
    let victim = Keypair::from_seed([35; 32]);
    let r = within(Session::connect(relay_addr, &relay_pin, &victim, Role::Miner)).await;
    assert!(matches!(r, Err(NetError::CoordinatorKey { .. })), "{:?}", r.map(|_| "logged in"));
    let (signed, _ep, _relay, _victim) = within(mitm).await.unwrap();
    assert!(!signed, "the miner signed a relayed challenge");

    // A client that signed anyway: its signature is bound to the session it
    // was made on, and the coordinator refuses it on any other.
    let (_e1, other) = raw_connect(&node).await;
    let (_e2, conn) = raw_connect(&node).await;
    let (other, conn) = (other.unwrap(), conn.unwrap());
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Hello { version: PROTOCOL_VERSION, role: Role::Miner, key: victim.public() };
    within(net::write_frame(&mut send, &Frame::Hello(hello.clone()))).await.unwrap();
    let Some(Frame::Challenge(c)) = within(net::read_frame(&mut recv)).await.unwrap() else { panic!("no challenge") };
    let elsewhere = net::handshake_message(&other, &c.nonce, &c.coordinator, &hello).unwrap();
    let signature = victim.sign(tributary_protocol::identity::domain::HANDSHAKE, &elsewhere);
    within(net::write_frame(&mut send, &Frame::Auth(Auth { signature }))).await.unwrap();
    match within(net::read_frame(&mut recv)).await.unwrap() {
        Some(Frame::Error(e)) => assert_eq!(e.code, ErrorCode::BadHandshake),
        f => panic!("the coordinator accepted a signature from another session: {f:?}"),
    }
}

/// W6: the certificate key, the database (master secret) and the data folder
/// are private to the coordinator's user. Before: 0644 / 0755.
#[cfg(unix)]
#[tokio::test]
async fn secrets_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = dev(&data);
    let _node = start(&cfg).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    for f in ["cert.key.der", "coordinator.redb", "coordinator.key"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
}

/// W5: a configuration that authorises a public `--dev` role key is refused
/// outside `--dev` (and by `check-config`).
#[test]
fn dev_keys_are_refused_outside_dev() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Config::dev(dir.path().to_path_buf());
    assert!(node::refuse_dev_keys(&dev).is_err());
    let only_validator = Config { validators: dev.validators.clone(), ..Config::default() };
    assert!(node::refuse_dev_keys(&only_validator).is_err());
    let own = Config {
        validators: vec![Keypair::from_seed([7; 32]).public().to_string()],
        trainer: Some(Keypair::from_seed([8; 32]).public().to_string()),
        ..Config::default()
    };
    assert!(node::refuse_dev_keys(&own).is_ok());
}

/// Review 2, finding 3: 128 connections held by 16 miner keys refused the
/// validator and a new miner, and unauthenticated reconnects alone did the
/// same. Now miners share `max_connections − reserved_role_connections`,
/// the validator and the trainer may take every slot, and connections that
/// never authenticate have their own cap (the oldest closed past it).
#[tokio::test]
async fn miner_and_unauthenticated_floods_leave_the_validator_and_trainer_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = dev(dir.path());
    cfg.max_connections = 12;
    cfg.reserved_role_connections = 4;
    cfg.max_unauthenticated = 4;
    cfg.max_connections_per_address = 1000;
    cfg.max_connections_per_key = 8;
    cfg.connections_per_sec = 10_000;
    let node = start(&cfg).await;
    // Two miner keys take every miner slot (8 = 12 − 4).
    let mut held = Vec::new();
    for k in [61u8, 62] {
        for _ in 0..4 {
            let key = Keypair::from_seed([k; 32]);
            held.push(within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap());
        }
    }
    match within(Session::connect(node.quic, &node.fingerprint, &Keypair::from_seed([63; 32]), Role::Miner)).await {
        Err(NetError::Refused(ErrorCode::RateLimited, _)) => {}
        other => panic!("a ninth miner connection: {:?}", other.map(|_| "logged in")),
    }
    // And 20 connections that never authenticate.
    let mut silent = Vec::new();
    for _ in 0..20 {
        let (ep, c) = raw_connect(&node).await;
        silent.push((ep, c));
    }
    let validator = tributary_protocol::dev::key(Role::Validator);
    let trainer = tributary_protocol::dev::key(Role::Trainer);
    let mut v = within(Session::connect(node.quic, &node.fingerprint, &validator, Role::Validator))
        .await
        .expect("the validator gets in");
    let mut t =
        within(Session::connect(node.quic, &node.fingerprint, &trainer, Role::Trainer)).await.expect("the trainer too");
    window(&mut v).await;
    window(&mut t).await;
    // Unauthenticated connections never hold more than their cap.
    let (open, _) = node.shared.connections("127.0.0.1".parse().unwrap());
    assert!(open <= 8 + 2 + 4, "{open} open: 8 miners, 2 roles, at most 4 unauthenticated");
    // A miner connection that closes frees its slot for another miner.
    let gone = held.pop().expect("held");
    gone.conn.close(0u32.into(), b"done");
    gone.endpoint.wait_idle().await;
    let mut fresh = None;
    for _ in 0..50 {
        let key = Keypair::from_seed([63; 32]);
        if let Ok(s) = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await {
            fresh = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    window(fresh.as_mut().expect("a miner slot freed")).await;
}
