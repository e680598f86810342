//! Loopback QUIC: the trainer's signed step reports are taken only from the
//! configured trainer key; the coordinator signs a weights document per
//! interval, stores it once and serves it, and the document verifies with
//! the coordinator's key while a tampered copy does not.

mod common;

use common::within;
use coordinator::net::{NetError, Session};
use coordinator::node::{self, Config, Node};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::*;

async fn start(dir: &std::path::Path, window_ms: u64) -> Node {
    let mut cfg = Config::dev(dir.to_path_buf());
    cfg.window_ms = window_ms;
    cfg.grace_ms = 100;
    within(node::start(&cfg, ContentId([1; 32]))).await.unwrap()
}

fn body(window: u64, trainer: &Keypair) -> TrainerStatsBody {
    TrainerStatsBody {
        window,
        checkpoint: ContentId([2; 32]),
        first_trained: window.saturating_sub(1),
        last_trained: window.saturating_sub(1),
        step: 1,
        lr: 1e-3,
        loss: -0.125,
        pg_loss: -0.15,
        kl: 0.025,
        entropy: 3.5,
        clip_low_frac: 0.0,
        clip_high_frac: 0.25,
        grad_norm: 0.5,
        reward_mean: 0.5,
        reward_std: 0.25,
        seqs: 8,
        tokens: 100,
        groups_kept: 2,
        groups_dropped: 1,
        groups_held: 0,
        payload_bytes: 1234,
        checkpoint_bytes: 99_999,
        delta: true,
        change_fraction: Some(0.125),
        trainer: trainer.public(),
    }
}

fn error_code(r: Result<Frame, NetError>) -> ErrorCode {
    match r {
        Err(NetError::Refused(code, _)) => code,
        r => panic!("expected a refusal, got {r:?}"),
    }
}

#[tokio::test]
async fn only_the_trainer_key_reports_training() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), 600_000).await;
    let trainer = tributary_protocol::dev::key(Role::Trainer);
    let mut t = within(Session::connect(node.quic, &node.fingerprint, &trainer, Role::Trainer)).await.unwrap();
    let net = t.network();
    let stored = || node.shared.store.trainer_stats(0, u64::MAX).unwrap();

    // Another key (a miner's, the validator's) signing its own report, on the trainer's connection: refused.
    for other in [Keypair::from_seed([9; 32]), tributary_protocol::dev::key(Role::Validator)] {
        let forged = TrainerStats::sign(body(3, &other), &other, &net);
        forged.verify(&net).unwrap();
        let ans = within(t.request(&Frame::PostTrainerStats(forged))).await;
        assert_eq!(error_code(ans), ErrorCode::BadSignature);
    }
    // The trainer's key named, another key's signature: refused.
    let mut wrong_sig = TrainerStats::sign(body(3, &trainer), &trainer, &net);
    wrong_sig.signature = TrainerStats::sign(body(3, &trainer), &Keypair::from_seed([9; 32]), &net).signature;
    assert_eq!(error_code(within(t.request(&Frame::PostTrainerStats(wrong_sig))).await), ErrorCode::BadSignature);
    // A tampered figure: refused.
    let mut tampered = TrainerStats::sign(body(3, &trainer), &trainer, &net);
    tampered.body.loss = -10.0;
    assert_eq!(error_code(within(t.request(&Frame::PostTrainerStats(tampered))).await), ErrorCode::BadSignature);
    assert!(stored().is_empty(), "a refused report was stored");

    // The trainer's own report: stored and acknowledged, on the same connection.
    let good = TrainerStats::sign(body(3, &trainer), &trainer, &net);
    match within(t.request(&Frame::PostTrainerStats(good.clone()))).await.unwrap() {
        Frame::TrainerStatsAck(a) => assert_eq!(a.window, 3),
        f => panic!("expected an ack, got {f:?}"),
    }
    assert_eq!(stored(), vec![good.clone()]);
    let json = coordinator::dashboard::training(&node.shared, 0, u64::MAX).unwrap();
    assert_eq!((json.len(), json[0].loss, json[0].groups_dropped), (1, -0.125, 1));

    // A miner connection may not post reports at all, even one the trainer signed.
    let m = Keypair::from_seed([5; 32]);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &m, Role::Miner)).await.unwrap();
    let own = TrainerStats::sign(body(4, &m), &m, &net);
    assert_eq!(error_code(within(s.request(&Frame::PostTrainerStats(own))).await), ErrorCode::UnexpectedFrame);
    let mut s = within(Session::connect(node.quic, &node.fingerprint, &m, Role::Miner)).await.unwrap();
    let relayed = TrainerStats::sign(body(4, &trainer), &trainer, &net);
    assert_eq!(error_code(within(s.request(&Frame::PostTrainerStats(relayed))).await), ErrorCode::UnexpectedFrame);
    assert_eq!(stored(), vec![good]);
}

#[tokio::test]
async fn weights_document_per_interval_is_signed_stored_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let window_ms = 1_500;
    let node = start(dir.path(), window_ms).await;
    let validator = tributary_protocol::dev::key(Role::Validator);
    let mut v = within(Session::connect(node.quic, &node.fingerprint, &validator, Role::Validator)).await.unwrap();
    let coordinator = v.coordinator;
    assert_eq!(coordinator, node.shared.key.public());
    let schedule = v.welcome.schedule;
    let now = coordinator::server::now_ms;
    // A passing verdict on window 0 once its submissions closed (during window 1).
    let closes = schedule.closes_at(0);
    tokio::time::sleep(std::time::Duration::from_millis(closes.saturating_sub(now()) + 20)).await;
    let miner = Keypair::from_seed([6; 32]).public();
    // Only proven work is paid: the miner's stored group, proved passing.
    let passed = coordinator::testing::stored_groups(&mut node.shared.core(), 0, miner, 1);
    let verdict = Verdict::sign(
        VerdictBody {
            window: 0,
            miner,
            validator: validator.public(),
            checked: 4,
            valid: 4,
            estimated_valid: 4,
            hard_failure: false,
            soft_failures: 0,
            reasons: vec![],
            passed,
            evidence: vec![],
        },
        &validator,
        &v.network(),
    );
    assert!(matches!(within(v.request(&Frame::PostVerdict(verdict))).await.unwrap(), Frame::VerdictAck(_)));
    assert!(now() < schedule.opens_at(2), "the machine is too slow for {window_ms} ms windows");
    // Window 0's work is paid in the document of interval d (pay waits d
    // windows), signed once window d + 1 has ended; the earlier ones pay nobody.
    let d = coordinator::weights::PAY_DELAY_WINDOWS;
    let doc = coordinator::testing::signed_weights(&node.shared, d).await;
    assert!(now() >= schedule.opens_at(d + 2));
    assert_eq!(doc.body.window, d);
    assert_eq!(doc.body.weights, vec![(miner, 1.0)]);
    for w in 0..d {
        if let Some(x) = node.shared.store.weights_doc(w).unwrap() {
            assert!(x.body.weights.is_empty(), "interval {w} pays window 0's work early: {:?}", x.body);
        }
    }
    // Served over QUIC (the latest document) and verifiable with the key learnt in the handshake.
    let bytes = match within(v.request(&Frame::GetWeights(GetWeights { window: None, offset: 0 }))).await.unwrap() {
        Frame::Weights(p) if p.offset == 0 && p.data.0.len() as u64 == p.len => p.data.0,
        f => panic!("expected the whole (small) document in one part, got {f:?}"),
    };
    let checked = WeightsDoc::decode_verified(&bytes, &coordinator).unwrap();
    assert!(checked.body.window <= node.shared.core().weights_interval(now()).unwrap());
    assert_eq!(WeightsDoc::decode_verified(&doc.encode(), &coordinator), Ok(doc.clone()));
    // Tampering: a weight, the interval, the signer, one byte of the document.
    let mut t = doc.clone();
    t.body.weights[0].1 = 0.5;
    assert_eq!(WeightsDoc::decode_verified(&t.encode(), &coordinator), Err(WeightsDocError::BadSignature));
    let mut t = doc.clone();
    t.body.window = d + 1;
    assert_eq!(WeightsDoc::decode_verified(&t.encode(), &coordinator), Err(WeightsDocError::BadSignature));
    let impostor = Keypair::from_seed([8; 32]);
    let forged =
        WeightsDoc::sign(WeightsBody { coordinator: impostor.public(), ..doc.body.clone() }, &impostor, &v.network());
    assert_eq!(WeightsDoc::decode_verified(&forged.encode(), &coordinator), Err(WeightsDocError::WrongCoordinator));
    let mut flipped = doc.encode();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    assert!(WeightsDoc::decode_verified(&flipped, &coordinator).is_err());
    // One document per interval, never rewritten: a later verdict changes later intervals only.
    let next = within(async {
        loop {
            if let Some(x) = node.shared.store.weights_doc(d + 1).unwrap() {
                return x;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    next.verify_by(&coordinator).unwrap();
    assert_eq!(node.shared.store.weights_doc(d).unwrap(), Some(doc.clone()));
    let rewrite =
        WeightsDoc::sign(WeightsBody { weights: vec![], ..doc.body.clone() }, &node.shared.key, &node.shared.network());
    assert!(!node.shared.store.put_weights_doc(&rewrite).unwrap());
    assert_eq!(node.shared.store.weights_doc(d).unwrap(), Some(doc));
}
