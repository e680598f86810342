//! Round trips, limits and signatures of every frame.

use super::*;
use crate::checkpoint::ContentId;
use crate::env::EnvId;
use crate::identity::{self, PublicKey};
use crate::prf::Seed;
use crate::rollout::SamplingParams;

/// The network the tests' documents are signed for.
const NET: NetworkId = NetworkId([0x4e; 32]);

#[test]
fn tags_are_unique_and_limits_bounded() {
    let mut seen = std::collections::HashSet::new();
    for t in Tag::ALL {
        assert!(seen.insert(*t as u16), "duplicate tag {t:?}");
        assert_eq!(Tag::from_u16(*t as u16), Some(*t));
        assert!(t.max_body_len() <= MAX_BODY_LEN);
    }
}

#[test]
fn header_checks() {
    let f = Frame::GetReveal(GetReveal { window: 7 });
    let bytes = f.encode();
    assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
    assert_eq!(Frame::decode(&bytes[..3]), Err(WireError::Incomplete { needed: HEADER_LEN }));
    let mut unknown = bytes.clone();
    unknown[4] = 0xEE;
    assert!(matches!(Frame::decode(&unknown), Err(WireError::UnknownTag(_))));
    let mut big = bytes.clone();
    big[..4].copy_from_slice(&(SMALL + 1).to_le_bytes());
    assert!(matches!(Frame::decode(&big), Err(WireError::Oversized { .. })));
    let mut trailing = bytes.clone();
    trailing[0] += 1;
    trailing.push(0);
    assert!(matches!(Frame::decode(&trailing), Err(WireError::TrailingBytes { .. })));
}

#[test]
fn signed_documents_verify_and_detect_tampering() {
    let v = identity::Keypair::from_seed([2; 32]);
    let mut verdict = Verdict::sign(
        VerdictBody {
            window: 3,
            miner: identity::Keypair::from_seed([3; 32]).public(),
            validator: v.public(),
            checked: 10,
            valid: 9,
            estimated_valid: 90,
            hard_failure: false,
            soft_failures: 1,
            reasons: vec!["Distribution: median 0.2".into()],
            passed: vec![[8; 32]],
            evidence: vec![],
        },
        &v,
        &NET,
    );
    verdict.verify(&NET).unwrap();
    // The same document on another network: refused whatever its signature.
    let elsewhere = NetworkId::of(&identity::Keypair::from_seed([12; 32]).public());
    assert_eq!(verdict.verify(&elsewhere), Err(SignedError::WrongNetwork { expected: elsewhere, got: NET }));
    let mut moved = verdict.clone();
    moved.network = elsewhere;
    assert_eq!(moved.verify(&elsewhere), Err(SignedError::BadSignature), "the network is under the signature");
    verdict.body.valid = 10;
    assert_eq!(verdict.verify(&NET), Err(SignedError::BadSignature));
}

#[test]
fn weights_document_verifies_by_coordinator_and_detects_tampering() {
    let c = identity::Keypair::from_seed([4; 32]);
    let other = identity::Keypair::from_seed([5; 32]);
    let m = identity::Keypair::from_seed([6; 32]).public();
    let doc = WeightsDoc::sign(
        WeightsBody { window: 7, weights: vec![(m, 1.0)], coordinator: c.public() },
        &c,
        &NetworkId::of(&c.public()),
    );
    let bytes = doc.encode();
    assert_eq!(WeightsDoc::decode_verified(&bytes, &c.public()), Ok(doc.clone()));
    // Another expected key, a re-signed copy naming another coordinator, a flipped byte, junk.
    assert_eq!(WeightsDoc::decode_verified(&bytes, &other.public()), Err(WeightsDocError::WrongCoordinator));
    let mut tampered = doc.clone();
    tampered.body.weights[0].1 = 0.5;
    assert_eq!(WeightsDoc::decode_verified(&tampered.encode(), &c.public()), Err(WeightsDocError::BadSignature));
    let mut flipped = bytes.clone();
    flipped[1] ^= 1;
    assert!(WeightsDoc::decode_verified(&flipped, &c.public()).is_err());
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(WeightsDoc::decode_verified(&trailing, &c.public()), Err(WeightsDocError::Wire(_))));
}

#[test]
fn trainer_stats_sign_check_and_round_trip() {
    let t = identity::Keypair::from_seed([7; 32]);
    let body = TrainerStatsBody {
        window: 9,
        checkpoint: ContentId([1; 32]),
        first_trained: 7,
        last_trained: 8,
        step: 3,
        lr: 1e-3,
        loss: -0.25,
        pg_loss: -0.3,
        kl: 0.05,
        entropy: 2.5,
        clip_low_frac: 0.0,
        clip_high_frac: 0.1,
        grad_norm: 1.5,
        reward_mean: 0.4,
        reward_std: 0.2,
        seqs: 8,
        tokens: 128,
        groups_kept: 2,
        groups_dropped: 1,
        groups_held: 0,
        payload_bytes: 1000,
        checkpoint_bytes: 10_000,
        delta: true,
        change_fraction: Some(0.3),
        trainer: t.public(),
    };
    assert_eq!(body.check(), Ok(()));
    let s = TrainerStats::sign(body.clone(), &t, &NET);
    s.verify(&NET).unwrap();
    let f = Frame::PostTrainerStats(s.clone());
    let bytes = f.encode();
    assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
    let mut tampered = s.clone();
    tampered.body.loss = 0.0;
    assert!(tampered.verify(&NET).is_err());
    let mut b = body.clone();
    b.loss = f64::NAN;
    assert_eq!(b.check(), Err(TrainerStatsError::NotFinite("loss")));
    let mut b = body.clone();
    b.clip_high_frac = 1.5;
    assert_eq!(b.check(), Err(TrainerStatsError::NotAFraction("clip_high_frac")));
    let mut b = body;
    b.last_trained = 10;
    assert_eq!(b.check(), Err(TrainerStatsError::Windows));
}

proptest::proptest! {
    #[test]
    fn contract_standing_and_verdict_frames_round_trip(
        window in proptest::prelude::any::<u64>(),
        temp in 0.0f32..4.0,
        max_new in proptest::prelude::any::<u32>(),
        difficulty in proptest::prelude::any::<u32>(),
        dataset in proptest::option::of(proptest::prelude::any::<[u8; 32]>()),
        standings in proptest::collection::vec((proptest::prelude::any::<[u8; 32]>(), 0u8..3), 0..8),
        reasons in proptest::collection::vec(".{0,400}", 0..10),
        passed in proptest::collection::vec(proptest::prelude::any::<[u8; 32]>(), 0..300),
        evidence in proptest::collection::vec(failure_evidence(), 0..12),
        junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
    ) {
        let info = WindowInfo {
            window,
            opens_at_ms: 1,
            closes_at_ms: 2,
            seed: Seed([3; 32]),
            commitment: [4; 32],
            checkpoint: ContentId([5; 32]),
            env: EnvId::Gsm8k,
            groups_per_miner: 2,
            group_size: 4,
            sampling: SamplingParams { temperature: temp, max_new_tokens: max_new },
            difficulty,
            dataset,
            reward: crate::env::RewardRule::ALL[(window % 3) as usize],
        };
        let miners = standings
            .iter()
            .map(|(k, s)| (PublicKey(*k), [MinerStanding::Passed, MinerStanding::Failed, MinerStanding::Suspect][*s as usize]))
            .collect();
        let mut body = VerdictBody {
            window,
            miner: PublicKey([1; 32]),
            validator: PublicKey([2; 32]),
            checked: 3,
            valid: 1,
            estimated_valid: 1,
            hard_failure: true,
            soft_failures: 0,
            reasons: vec![],
            passed: vec![],
            evidence: vec![],
        };
        for r in &reasons {
            body.add_reason(r);
        }
        for d in &passed {
            body.add_passed(*d);
        }
        let hard = evidence.iter().filter(|e| e.hard).count();
        for e in evidence {
            body.add_evidence(e);
        }
        proptest::prop_assert!(body.passed.len() <= MAX_VERDICT_PASSED);
        proptest::prop_assert!(body.evidence.len() <= MAX_VERDICT_EVIDENCE);
        // Hard failures are kept before soft ones when the list is full.
        proptest::prop_assert_eq!(body.hard_failed().count(), hard.min(MAX_VERDICT_EVIDENCE));
        proptest::prop_assert!(body.reasons.len() <= MAX_VERDICT_REASONS);
        proptest::prop_assert!(body.reasons.iter().all(|r| r.len() <= MAX_REASON_LEN));
        let key = identity::Keypair::from_seed([9; 32]);
        for f in [
            Frame::WindowInfo(info),
            Frame::GetStanding(GetStanding { window, after: Some(PublicKey([7; 32])) }),
            Frame::Standing(Standing { window, miners, next: Some(PublicKey([8; 32])) }),
            Frame::PostVerdict(Verdict::sign(body, &key, &NET)),
        ] {
            let bytes = f.encode();
            proptest::prop_assert!(bytes.len() - HEADER_LEN <= f.tag().max_body_len() as usize);
            proptest::prop_assert_eq!(Frame::decode(&bytes).unwrap(), (f.clone(), bytes.len()));
            // Garbage bodies under the same tag are an error, never a panic.
            let _ = Frame::decode_body(f.tag(), &junk);
        }
    }
}

/// Evidence records with every figure kind (finite figures: NaN is not equal to itself).
fn failure_evidence() -> impl proptest::strategy::Strategy<Value = FailureEvidence> {
    use proptest::prelude::*;
    let checks = [
        FailedCheck::Signature,
        FailedCheck::Environment,
        FailedCheck::Structure,
        FailedCheck::Context,
        FailedCheck::Prompt,
        FailedCheck::Reward,
        FailedCheck::Sketch,
        FailedCheck::Logprob,
        FailedCheck::Sampling,
        FailedCheck::SamplingCoverage,
        FailedCheck::Distribution,
        FailedCheck::Termination,
        FailedCheck::Copy,
    ];
    let figures = prop_oneof![
        Just(Figures::None),
        (0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0, any::<u32>()).prop_map(|(u, lo, hi, outside)| Figures::Sampling {
            u,
            lo,
            hi,
            outside
        }),
        (-50.0f32..0.0, proptest::option::of(-50.0f32..0.0), 0.0f64..50.0)
            .prop_map(|(claimed, reference, delta)| Figures::Logprob { claimed, reference, delta }),
        any::<(u32, u32, u32, u32)>().prop_map(|(distance, tolerance, failed, checked)| Figures::Sketch {
            distance,
            tolerance,
            failed,
            checked
        }),
        (-1e6f32..1e6, -1e6f32..1e6).prop_map(|(claimed, recomputed)| Figures::Reward { claimed, recomputed }),
        any::<(u32, u32)>().prop_map(|(expected_len, got_len)| Figures::Prompt { expected_len, got_len }),
        any::<[u8; 32]>().prop_map(|k| Figures::Copy { owner: PublicKey(k) }),
    ];
    (any::<[u8; 32]>(), any::<(u32, u32)>(), 0..checks.len(), any::<bool>(), any::<Option<u32>>(), figures).prop_map(
        move |(digest, (group, rollout), c, hard, position, figures)| FailureEvidence {
            digest,
            group,
            rollout,
            check: checks[c],
            hard,
            position,
            figures,
        },
    )
}

/// A verdict listing more evidence or passing digests than allowed is
/// refused at decode, before the list is allocated; the largest allowed one fits its frame.
#[test]
fn verdict_lists_are_bounded() {
    let key = identity::Keypair::from_seed([9; 32]);
    let e = FailureEvidence {
        digest: [1; 32],
        group: u32::MAX,
        rollout: u32::MAX,
        check: FailedCheck::Sampling,
        hard: true,
        position: Some(u32::MAX),
        figures: Figures::Sampling { u: 0.5, lo: 0.1, hi: 0.2, outside: u32::MAX },
    };
    let mut body = VerdictBody {
        window: u64::MAX,
        miner: PublicKey([1; 32]),
        validator: key.public(),
        checked: u32::MAX,
        valid: 0,
        estimated_valid: 0,
        hard_failure: true,
        soft_failures: u32::MAX,
        reasons: vec![],
        passed: (0..MAX_VERDICT_PASSED).map(|i| [i as u8; 32]).collect(),
        evidence: vec![e.clone(); MAX_VERDICT_EVIDENCE],
    };
    for _ in 0..MAX_VERDICT_REASONS {
        body.reasons.push("x".repeat(MAX_REASON_LEN));
    }
    let f = Frame::PostVerdict(Verdict::sign(body.clone(), &key, &NET));
    let bytes = f.encode();
    assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
    let mut more = body.clone();
    more.evidence.push(e);
    assert!(matches!(
        Frame::decode(&Frame::PostVerdict(Verdict::sign(more, &key, &NET)).encode()),
        Err(WireError::Malformed { tag: Tag::PostVerdict, .. })
    ));
    let mut more = body;
    more.reasons.clear();
    more.passed.push([0xee; 32]);
    assert!(matches!(
        Frame::decode(&Frame::PostVerdict(Verdict::sign(more, &key, &NET)).encode()),
        Err(WireError::Malformed { tag: Tag::PostVerdict, .. })
    ));
}

#[test]
fn batch_frames_round_trip_and_are_bounded() {
    let rollouts: Vec<Blob> = (0..MAX_BATCH_ROLLOUTS).map(|i| Blob(vec![i as u8; 40])).collect();
    let answer =
        BatchAnswer {
            seq: 9,
            outcomes: (0..MAX_BATCH_ROLLOUTS)
                .map(|i| {
                    if i % 2 == 0 { Outcome::Stored([i as u8; 32]) } else { Outcome::Refused(RejectReason::Duplicate) }
                })
                .collect(),
        };
    for f in
        [Frame::SubmitBatch(SubmitBatch { seq: 7, rollouts: rollouts.clone() }), Frame::BatchAnswer(answer.clone())]
    {
        let bytes = f.encode();
        assert!(bytes.len() - HEADER_LEN <= f.tag().max_body_len() as usize);
        assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
    }
    // One element more than allowed is refused, for both frames.
    let mut more = rollouts;
    more.push(Blob(vec![]));
    let f = Frame::SubmitBatch(SubmitBatch { seq: 7, rollouts: more });
    assert!(matches!(Frame::decode(&f.encode()), Err(WireError::Malformed { tag: Tag::SubmitBatch, .. })));
    let mut more = answer;
    more.outcomes.push(Outcome::Refused(RejectReason::Schema));
    let f = Frame::BatchAnswer(more);
    assert!(matches!(Frame::decode(&f.encode()), Err(WireError::Malformed { tag: Tag::BatchAnswer, .. })));
    // A claimed count far beyond the bound fails before any allocation.
    let mut huge = vec![7u8]; // seq
    huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // u32::MAX elements
    assert!(Frame::decode_body(Tag::SubmitBatch, &huge).is_err());
}

#[test]
fn beacon_frames_round_trip_and_a_reveal_of_256_validators_fits() {
    let keys: Vec<identity::Keypair> = (0..=255u8).map(|i| identity::Keypair::from_seed([i; 32])).collect();
    let commit = crate::beacon::commit(&keys[0], &NET, 5);
    commit.verify(&NET).unwrap();
    let contributions: Vec<Contribution> = keys
        .iter()
        .map(|k| Contribution {
            commit: crate::beacon::commit(k, &NET, 5),
            secret: crate::beacon::contribution_secret(k, &NET, 5),
        })
        .collect();
    let reveal = Reveal {
        window: 5,
        secret: [1; 32],
        contributions,
        withheld: vec![commit.clone()],
        challenge: [2; 32],
        trainer: Some(keys[1].public()),
        assign: crate::assign::Spec::new(keys.iter().map(identity::Keypair::public)),
    };
    for f in [
        Frame::PostBeaconCommit(commit),
        Frame::PostBeaconReveal(BeaconReveal { window: 5, secret: [3; 32] }),
        Frame::BeaconAck(BeaconAck { window: 5 }),
        Frame::Reveal(reveal),
    ] {
        let bytes = f.encode();
        assert!(bytes.len() - HEADER_LEN <= f.tag().max_body_len() as usize, "{:?}: {} bytes", f.tag(), bytes.len());
        assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
    }
}

#[test]
fn a_chunk_frame_is_its_prefix_then_its_data() {
    for len in [0usize, 1, 127, 128, 300, 16_384, 4 << 20] {
        let id = ContentId([len as u8; 32]);
        let offset = (len as u64) * 3 + 1;
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut bytes = CheckpointChunk::frame_prefix(id, offset, len);
        bytes.extend_from_slice(&data);
        let f = Frame::CheckpointChunk(CheckpointChunk { id, offset, data: Blob(data) });
        assert_eq!(bytes, f.encode(), "{len} bytes");
    }
}
