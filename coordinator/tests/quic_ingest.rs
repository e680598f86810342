//! Loopback QUIC: a miner streams rollouts and they are acknowledged; every
//! bad input is refused with its reason and nothing of it is stored.

mod common;

use common::{Logs, other_checkpoint, rollout, within};
use coordinator::net::{NetError, Session};
use coordinator::node::{self, Config, Node};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{self, Keypair};
use tributary_protocol::wire::*;

async fn start(dir: &std::path::Path, validator: &Keypair) -> Node {
    let mut cfg = Config::dev(dir.to_path_buf());
    cfg.window_ms = 600_000;
    cfg.max_new_tokens = 512;
    cfg.validators = vec![validator.public().to_string()];
    within(node::start(&cfg, ContentId([1; 32]))).await.unwrap()
}

async fn window(s: &mut Session) -> WindowInfo {
    match within(s.request(&Frame::GetWindow(GetWindow { window: None }))).await.unwrap() {
        Frame::WindowInfo(w) => w,
        f => panic!("unexpected {f:?}"),
    }
}

async fn submit(s: &mut Session, seq: u64, bytes: Vec<u8>) -> Frame {
    within(s.request(&Frame::Submit(Submit { seq, rollout: Blob(bytes) }))).await.unwrap()
}

fn refused(f: Frame) -> RejectReason {
    match f {
        Frame::Refused(r) => r.reason,
        f => panic!("expected a refusal, got {f:?}"),
    }
}

#[tokio::test]
async fn stream_ack_and_refuse_bad_input() {
    let logs = Logs::install();
    let dir = tempfile::tempdir().unwrap();
    let validator = Keypair::from_seed([200; 32]);
    let node = start(dir.path(), &validator).await;
    let key = Keypair::from_seed([1; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let info = window(&mut s).await;

    // Pipelined stream of good rollouts: every one acknowledged, in order.
    let good: Vec<_> = (0..4).map(|i| rollout(&info, &key, 0, i, 512)).collect();
    for (i, r) in good.iter().enumerate() {
        within(s.send(&Frame::Submit(Submit { seq: i as u64, rollout: Blob(r.encode()) }))).await.unwrap();
    }
    for (i, r) in good.iter().enumerate() {
        match within(s.recv()).await.unwrap() {
            Frame::Ack(a) => assert_eq!((a.seq, a.digest), (i as u64, r.digest())),
            f => panic!("expected ack, got {f:?}"),
        }
    }
    assert_eq!(node.shared.store.rollout_count().unwrap(), 4);

    // Same bytes again.
    assert_eq!(refused(submit(&mut s, 10, good[0].encode()).await), RejectReason::Duplicate);
    // Wrong window.
    let mut w = rollout(&info, &key, 1, 0, 64);
    w.window += 1;
    w.sign(&key);
    assert_eq!(refused(submit(&mut s, 12, w.encode()).await), RejectReason::WrongWindow);
    // Unassigned task.
    let mut t = rollout(&info, &key, 1, 0, 64);
    t.task_id ^= 1;
    t.sign(&key);
    assert_eq!(refused(submit(&mut s, 13, t.encode()).await), RejectReason::Unassigned);
    // Malformed bytes and schema violations.
    assert_eq!(refused(submit(&mut s, 15, vec![1, 2, 3]).await), RejectReason::Malformed);
    let mut sch = rollout(&info, &key, 1, 0, 64);
    sch.logprobs.pop();
    sch.sign(&key);
    assert_eq!(refused(submit(&mut s, 16, sch.encode()).await), RejectReason::Schema);
    // Another miner's rollout, re-signed by us: its task is not ours.
    let thief_victim = Keypair::from_seed([2; 32]);
    let mut stolen = rollout(&info, &thief_victim, 1, 0, 64);
    stolen.sign(&key);
    assert_eq!(refused(submit(&mut s, 17, stolen.encode()).await), RejectReason::Unassigned);
    // Another miner's rollout forwarded as is: not the authenticated peer.
    let theirs = rollout(&info, &thief_victim, 1, 0, 64);
    assert_eq!(refused(submit(&mut s, 18, theirs.encode()).await), RejectReason::WrongMiner);
    // Nothing of a refused rollout was stored.
    assert_eq!(node.shared.store.rollout_count().unwrap(), 4);
    // Progress lists exactly the stored slots.
    match within(s.request(&Frame::GetProgress(GetProgress { window: info.window }))).await.unwrap() {
        Frame::Progress(p) => assert_eq!(p.slots, vec![(0, 0), (0, 1), (0, 2), (0, 3)]),
        f => panic!("{f:?}"),
    }
    // The reveal is refused while submissions are open.
    assert!(matches!(
        within(s.request(&Frame::GetReveal(GetReveal { window: info.window }))).await,
        Err(NetError::Refused(ErrorCode::NotYet, _))
    ));
    // Counted per reason.
    {
        let core = node.shared.core();
        let m = &core.miners()[&key.public()];
        assert_eq!(m.accepted, 4);
        for r in ["duplicate", "wrong_window", "unassigned", "malformed", "schema", "wrong_miner"] {
            assert!(m.rejected.get(r).copied().unwrap_or(0) >= 1, "{r} not counted");
        }
    }

    // A bad signature over the submitter's own key, and a stale checkpoint id,
    // are refused and penalised at the door: the miner is banned, so what it
    // sends next is refused as banned. One fresh miner for each. The
    // coordinator, which decides the penalty, logs it at warn with the
    // reason, its figures and the ban (issue 19 item 4).
    for (seed, reason) in [(6u8, RejectReason::BadSignature), (7, RejectReason::StaleCheckpoint)] {
        let k = Keypair::from_seed([seed; 32]);
        let mut p = within(Session::connect(node.quic, &node.fingerprint, &k, Role::Miner)).await.unwrap();
        let mut r = rollout(&info, &k, 1, 0, 64);
        if reason == RejectReason::BadSignature {
            r.signature[0] ^= 1;
        } else {
            r.checkpoint = other_checkpoint();
            r.sign(&k);
        }
        assert_eq!(refused(submit(&mut p, 1, r.encode()).await), reason);
        let line = logs.line(&["WARN", "miner failed at the door", &k.public().short()]).expect("the penalty logged");
        assert!(line.contains(reason.as_str()) && line.contains("banned_through=Some("), "{line}");
        assert!(line.contains(&format!("window_checkpoint={}", info.checkpoint)), "{line}");
        if reason == RejectReason::StaleCheckpoint {
            assert!(line.contains(&other_checkpoint().to_string()), "the checkpoint the rollout named: {line}");
        }
        let next = rollout(&info, &k, 2, 0, 64);
        assert_eq!(refused(submit(&mut p, 2, next.encode()).await), RejectReason::Banned);
        let core = node.shared.core();
        assert!(core.miners()[&k.public()].rejected.get(reason.as_str()).copied().unwrap_or(0) >= 1);
    }
    assert_eq!(node.shared.store.rollout_count().unwrap(), 4);

    // Wrong role: a miner posting a verdict is refused and disconnected.
    let v = Verdict::sign(
        VerdictBody {
            window: 0,
            miner: key.public(),
            validator: key.public(),
            checked: 1,
            valid: 1,
            estimated_valid: 1,
            hard_failure: false,
            soft_failures: 0,
            reasons: vec![],
            passed: vec![],
            evidence: vec![],
        },
        &key,
        &s.network(),
    );
    let r = within(s.request(&Frame::PostVerdict(v))).await;
    assert!(matches!(r, Err(NetError::Refused(ErrorCode::UnexpectedFrame, _))), "{r:?}");

    // An unconfigured key cannot connect as a validator.
    let err = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Validator)).await.unwrap_err();
    assert!(matches!(err, NetError::Refused(ErrorCode::Unauthorized, _)), "{err:?}");
    // The configured validator can.
    within(Session::connect(node.quic, &node.fingerprint, &validator, Role::Validator)).await.unwrap();
    // A wrong certificate pin fails the TLS handshake.
    assert!(within(Session::connect(node.quic, &"00".repeat(32), &key, Role::Miner)).await.is_err());
}

#[tokio::test]
async fn malformed_frames_close_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), &Keypair::from_seed([200; 32])).await;
    let key = Keypair::from_seed([3; 32]);
    // Unknown tag.
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let mut unknown = Frame::GetWindow(GetWindow { window: None }).encode();
    unknown[4..6].copy_from_slice(&999u16.to_le_bytes());
    within(s.send.write_all(&unknown)).await.unwrap();
    assert!(matches!(within(s.recv()).await, Err(NetError::Refused(ErrorCode::Malformed, _))));
    assert!(within(s.conn.closed()).await.to_string().contains("malformed"));
    // Oversized: a header declaring more than the tag allows.
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let mut big = Vec::new();
    big.extend_from_slice(&(MAX_ROLLOUT_LEN + 1000).to_le_bytes());
    big.extend_from_slice(&(Tag::Submit as u16).to_le_bytes());
    within(s.send.write_all(&big)).await.unwrap();
    assert!(matches!(within(s.recv()).await, Err(NetError::Refused(ErrorCode::Malformed, _))));
    // Truncated body then end of stream.
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &key, Role::Miner)).await.unwrap();
    let f = Frame::GetWindow(GetWindow { window: Some(1) }).encode();
    within(s.send.write_all(&f[..f.len() - 1])).await.unwrap();
    s.send.finish().unwrap();
    assert!(within(s.recv()).await.is_err());
    // A handshake signed over the wrong bytes is refused.
    let hello_key = Keypair::from_seed([4; 32]);
    let forged = identity::Keypair::from_seed([5; 32]);
    let ep = {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(coordinator::net::client_config(&node.fingerprint).unwrap());
        ep
    };
    let conn = within(ep.connect(node.quic, "localhost").unwrap()).await.unwrap();
    let (mut send, mut recv) = within(conn.open_bi()).await.unwrap();
    let hello = Hello { version: PROTOCOL_VERSION, role: Role::Miner, key: hello_key.public() };
    within(coordinator::net::write_frame(&mut send, &Frame::Hello(hello.clone()))).await.unwrap();
    let Some(Frame::Challenge(ch)) = within(coordinator::net::read_frame(&mut recv)).await.unwrap() else { panic!() };
    let sig = forged.sign(identity::domain::HANDSHAKE, &handshake_bytes(&ch.nonce, &ch.coordinator, &hello));
    within(coordinator::net::write_frame(&mut send, &Frame::Auth(Auth { signature: sig }))).await.unwrap();
    match within(coordinator::net::read_frame(&mut recv)).await.unwrap() {
        Some(Frame::Error(e)) => assert_eq!(e.code, ErrorCode::BadHandshake),
        f => panic!("{f:?}"),
    }
}
