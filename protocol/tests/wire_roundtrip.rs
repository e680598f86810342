//! Property tests for the wire protocol: every frame round-trips, and no byte
//! string makes the decoder panic or accept a truncated/extended frame.

use proptest::prelude::*;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::{PublicKey, Signature};
use tributary_protocol::prf::Seed;
use tributary_protocol::window::Schedule;
use tributary_protocol::wire::*;

fn key() -> impl Strategy<Value = PublicKey> {
    any::<[u8; 32]>().prop_map(PublicKey)
}

fn sig() -> impl Strategy<Value = Signature> {
    (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(a, b)| {
        let mut s = [0u8; 64];
        s[..32].copy_from_slice(&a);
        s[32..].copy_from_slice(&b);
        Signature(s)
    })
}

fn beacon_commit() -> impl Strategy<Value = BeaconCommit> {
    (any::<[u8; 32]>(), any::<u64>(), key(), any::<[u8; 32]>(), sig()).prop_map(
        |(network, window, party, commitment, signature)| BeaconCommit {
            network: NetworkId(network),
            body: BeaconCommitBody { window, party, commitment },
            signature,
        },
    )
}

fn blob(max: usize) -> impl Strategy<Value = Blob> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Blob)
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Miner), Just(Role::Validator), Just(Role::Trainer)]
}

fn reason() -> impl Strategy<Value = RejectReason> {
    proptest::sample::select(RejectReason::ALL.to_vec())
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u16>(), role(), key()).prop_map(|(version, role, key)| Frame::Hello(Hello { version, role, key })),
        (any::<[u8; 32]>(), key(), sig()).prop_map(|(nonce, coordinator, proof)| Frame::Challenge(Challenge {
            nonce,
            coordinator,
            proof
        })),
        sig().prop_map(|signature| Frame::Auth(Auth { signature })),
        (any::<u64>(), 0u64..1 << 50, 1u64..1 << 30).prop_map(|(now_ms, g, l)| Frame::Welcome(Welcome {
            now_ms,
            schedule: Schedule::new(g, l, l / 2).unwrap()
        })),
        ".{0,40}".prop_map(|detail| Frame::Error(ErrorFrame { code: ErrorCode::NotYet, detail })),
        any::<Option<u64>>().prop_map(|window| Frame::GetWindow(GetWindow { window })),
        (
            any::<u64>(),
            any::<[u8; 32]>(),
            any::<[u8; 32]>(),
            proptest::sample::select(vec![EnvId::Arith, EnvId::Sat, EnvId::Gsm8k]),
            any::<u32>()
        )
            .prop_map(|(window, seed, commitment, env, groups)| Frame::WindowInfo(WindowInfo {
                window,
                opens_at_ms: window,
                closes_at_ms: window.wrapping_add(1),
                seed: Seed(seed),
                commitment,
                checkpoint: ContentId(seed),
                env,
                groups_per_miner: groups,
                group_size: 16,
                sampling: tributary_protocol::rollout::SamplingParams { temperature: 0.7, max_new_tokens: groups },
                difficulty: groups % 7,
                dataset: Some(seed),
                reward: tributary_protocol::env::RewardRule::ALL[groups as usize % 3],
            })),
        any::<u64>().prop_map(|window| Frame::GetReveal(GetReveal { window })),
        (
            (any::<u64>(), any::<[u8; 32]>(), proptest::collection::vec(key(), 0..40), any::<(u32, u32)>()),
            (
                proptest::collection::vec((beacon_commit(), any::<[u8; 32]>()), 0..8),
                proptest::collection::vec(beacon_commit(), 0..4),
                any::<[u8; 32]>(),
                proptest::option::of(key()),
            ),
        )
            .prop_map(
                |((window, secret, validators, (committee, budget)), (contributions, withheld, challenge, trainer))| {
                    Frame::Reveal(Reveal {
                        window,
                        secret,
                        contributions: contributions
                            .into_iter()
                            .map(|(commit, secret)| Contribution { commit, secret })
                            .collect(),
                        withheld,
                        challenge,
                        trainer,
                        assign: tributary_protocol::assign::Spec { validators, committee, budget },
                    })
                }
            ),
        beacon_commit().prop_map(Frame::PostBeaconCommit),
        (any::<u64>(), any::<[u8; 32]>())
            .prop_map(|(window, secret)| Frame::PostBeaconReveal(BeaconReveal { window, secret })),
        any::<u64>().prop_map(|window| Frame::BeaconAck(BeaconAck { window })),
        (any::<u64>(), blob(4096)).prop_map(|(seq, rollout)| Frame::Submit(Submit { seq, rollout })),
        (any::<u64>(), any::<[u8; 32]>()).prop_map(|(seq, digest)| Frame::Ack(Ack { seq, digest })),
        (any::<u64>(), reason()).prop_map(|(seq, reason)| Frame::Refused(Refused { seq, reason })),
        any::<u64>().prop_map(|window| Frame::GetProgress(GetProgress { window })),
        (any::<u64>(), proptest::collection::vec(any::<(u32, u32)>(), 0..50))
            .prop_map(|(window, slots)| Frame::Progress(Progress { window, slots })),
        (any::<u64>(), proptest::option::of(key()), any::<Option<[u8; 32]>>(), any::<u32>()).prop_map(
            |(window, miner, after, limit)| Frame::FetchRollouts(FetchRollouts { window, miner, after, limit })
        ),
        (any::<u64>(), proptest::collection::vec(blob(256), 0..8), any::<Option<[u8; 32]>>())
            .prop_map(|(window, items, next)| Frame::Rollouts(Rollouts { window, items, next })),
        (any::<u64>(), key(), key(), any::<[u32; 4]>(), any::<bool>(), sig()).prop_map(
            |(window, miner, validator, n, hard, signature)| {
                Frame::PostVerdict(Verdict {
                    network: NetworkId([3; 32]),
                    body: VerdictBody {
                        window,
                        miner,
                        validator,
                        checked: n[0],
                        valid: n[1],
                        estimated_valid: n[2],
                        hard_failure: hard,
                        soft_failures: n[3],
                        reasons: vec![format!("Sketch: {}", n[0])],
                        passed: vec![[n[0] as u8; 32]],
                        evidence: vec![],
                    },
                    signature,
                })
            }
        ),
        (any::<u64>(), key()).prop_map(|(window, miner)| Frame::VerdictAck(VerdictAck { window, miner })),
        (any::<Option<u64>>(), any::<u64>())
            .prop_map(|(window, offset)| Frame::GetWeights(GetWeights { window, offset })),
        (any::<u64>(), proptest::collection::vec((key(), 0.0f64..1.0), 0..10), key(), sig(), any::<u64>()).prop_map(
            |(window, weights, coordinator, signature, offset)| {
                let doc = WeightsDoc {
                    network: NetworkId([3; 32]),
                    body: WeightsBody { window, weights, coordinator },
                    signature,
                };
                let bytes = doc.encode();
                Frame::Weights(WeightsPart { window, len: bytes.len() as u64, offset, data: Blob(bytes) })
            }
        ),
        (any::<u64>(), proptest::option::of(key()))
            .prop_map(|(window, after)| Frame::GetWindowIndex(GetWindowIndex { window, after })),
        (
            any::<u64>(),
            proptest::collection::vec(
                (key(), any::<u32>(), any::<u64>(), proptest::collection::vec(any::<u32>(), 0..8)),
                0..6
            ),
            proptest::option::of(key())
        )
            .prop_map(|(window, miners, next)| Frame::WindowIndex(WindowIndex {
                window,
                miners: miners
                    .into_iter()
                    .map(|(miner, rollouts, bytes, groups)| MinerWork { miner, rollouts, bytes, groups })
                    .collect(),
                next,
            })),
        (any::<[u8; 32]>(), any::<Option<[u8; 32]>>(), any::<u64>(), key(), sig()).prop_map(
            |(id, base, len, trainer, signature)| {
                Frame::PublishCheckpoint(PublishCheckpoint {
                    network: NetworkId([3; 32]),
                    body: CheckpointBody {
                        id: ContentId(id),
                        kind: base.map_or(CheckpointKind::Full, |base| CheckpointKind::Delta { base: ContentId(base) }),
                        len,
                        payload_hash: id,
                        window: len,
                        trainer,
                    },
                    signature,
                })
            }
        ),
        (any::<[u8; 32]>(), any::<u64>(), blob(2048))
            .prop_map(|(id, offset, data)| Frame::CheckpointChunk(CheckpointChunk { id: ContentId(id), offset, data })),
        (any::<[u8; 32]>(), any::<u64>())
            .prop_map(|(id, offset)| Frame::GetCheckpoint(GetCheckpoint { id: ContentId(id), offset })),
        any::<[u8; 32]>().prop_map(|id| Frame::CheckpointStored(CheckpointStored { id: ContentId(id) })),
        (any::<Option<[u8; 32]>>(), any::<Option<[u8; 32]>>()).prop_map(|(have, want)| Frame::GetCheckpointPath(
            GetCheckpointPath { have: have.map(ContentId), want: want.map(ContentId) }
        )),
        (
            any::<[u8; 32]>(),
            any::<u64>(),
            proptest::collection::vec((any::<[u8; 32]>(), any::<Option<[u8; 32]>>(), any::<u64>()), 0..MAX_PATH_STEPS)
        )
            .prop_map(|(target, from_window, steps)| Frame::CheckpointPath(CheckpointPath {
                target: ContentId(target),
                from_window,
                steps: steps
                    .into_iter()
                    .map(|(id, base, len)| PathStep {
                        id: ContentId(id),
                        base: base.map(ContentId),
                        len,
                        payload_hash: id
                    })
                    .collect(),
                announcement: None,
                store_url: Some("https://cdn.example/tributary".into()),
            })),
        (any::<[u8; 32]>(), any::<[u8; 32]>(), any::<u64>()).prop_map(|(base, id, offset)| Frame::GetDelta(GetDelta {
            base: ContentId(base),
            id: ContentId(id),
            offset
        })),
        (any::<u64>(), proptest::collection::vec(blob(512), 0..8))
            .prop_map(|(seq, rollouts)| Frame::SubmitBatch(SubmitBatch { seq, rollouts })),
        (any::<u64>(), proptest::collection::vec(outcome(), 0..16))
            .prop_map(|(seq, outcomes)| Frame::BatchAnswer(BatchAnswer { seq, outcomes })),
        (trainer_stats_body(), sig()).prop_map(|(body, signature)| Frame::PostTrainerStats(TrainerStats {
            network: NetworkId([3; 32]),
            body,
            signature
        })),
        any::<u64>().prop_map(|window| Frame::TrainerStatsAck(TrainerStatsAck { window })),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![any::<[u8; 32]>().prop_map(Outcome::Stored), reason().prop_map(Outcome::Refused)]
}

/// A finite figure (NaN would not compare equal after the round trip).
fn fig() -> impl Strategy<Value = f64> {
    -1e9f64..1e9
}

fn trainer_stats_body() -> impl Strategy<Value = TrainerStatsBody> {
    let windows = (any::<u64>(), any::<[u8; 32]>(), any::<u64>(), any::<u64>(), any::<u64>(), key());
    let figures = (fig(), fig(), fig(), fig(), fig(), fig(), fig(), fig(), fig(), fig());
    let counts = (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>());
    let rest = (any::<bool>(), proptest::option::of(0.0f64..=1.0));
    (windows, figures, counts, rest).prop_map(
        |(
            (window, checkpoint, first_trained, last_trained, step, trainer),
            (lr, loss, pg_loss, kl, entropy, clip_low_frac, clip_high_frac, grad_norm, reward_mean, reward_std),
            (seqs, tokens, groups_kept, groups_dropped, groups_held, payload_bytes, checkpoint_bytes),
            (delta, change_fraction),
        )| TrainerStatsBody {
            window,
            checkpoint: ContentId(checkpoint),
            first_trained,
            last_trained,
            step,
            lr,
            loss,
            pg_loss,
            kl,
            entropy,
            clip_low_frac,
            clip_high_frac,
            grad_norm,
            reward_mean,
            reward_std,
            seqs,
            tokens,
            groups_kept,
            groups_dropped,
            groups_held,
            payload_bytes,
            checkpoint_bytes,
            delta,
            change_fraction,
            trainer,
        },
    )
}

proptest! {
    #[test]
    fn every_frame_round_trips(f in frame()) {
        let bytes = f.encode();
        let (back, used) = Frame::decode(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(back, f);
    }

    #[test]
    fn truncation_is_incomplete_never_a_frame(f in frame(), cut in any::<prop::sample::Index>()) {
        let bytes = f.encode();
        let n = cut.index(bytes.len());
        let incomplete = matches!(Frame::decode(&bytes[..n]), Err(WireError::Incomplete { .. }));
        prop_assert!(incomplete);
    }

    #[test]
    fn two_frames_back_to_back(a in frame(), b in frame()) {
        let mut bytes = a.encode();
        let first = bytes.len();
        bytes.extend(b.encode());
        let (fa, used) = Frame::decode(&bytes).unwrap();
        prop_assert_eq!(used, first);
        prop_assert_eq!(fa, a);
        prop_assert_eq!(Frame::decode(&bytes[used..]).unwrap().0, b);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Frame::decode(&bytes);
        for t in Tag::ALL {
            let _ = Frame::decode_body(*t, &bytes);
        }
    }

    #[test]
    fn flipped_byte_never_panics(f in frame(), at in any::<prop::sample::Index>(), x in 1u8..) {
        let mut bytes = f.encode();
        let i = at.index(bytes.len());
        bytes[i] ^= x;
        let _ = Frame::decode(&bytes);
    }
}
