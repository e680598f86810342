//! Untrusted-bytes decoders of the proof layer: rollouts and compact sketches
//! round-trip, and garbage or mutated bytes never panic.

use proptest::prelude::*;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::rollout::{Rollout, RolloutLimits, SamplingParams};
use tributary_protocol::sketch::{decode_sketches, encode_sketches};

fn env() -> impl Strategy<Value = EnvId> {
    prop_oneof![Just(EnvId::Arith), Just(EnvId::Sat), Just(EnvId::Gsm8k)]
}

prop_compose! {
    fn rollout()(
        window in any::<u64>(),
        ck in any::<[u8; 32]>(),
        env in env(),
        group in any::<u32>(),
        idx in any::<u32>(),
        task_id in any::<u64>(),
        temperature in any::<f32>(),
        max_new_tokens in any::<u32>(),
        tokens in prop::collection::vec(any::<u32>(), 0..200),
        prompt_len in any::<u32>(),
        logprobs in prop::collection::vec(any::<f32>(), 0..200),
        sketches in prop::collection::vec(any::<u32>(), 0..200),
        reward in any::<f32>(),
        miner in any::<[u8; 32]>(),
        sig_a in any::<[u8; 32]>(),
        sig_b in any::<[u8; 32]>(),
    ) -> Rollout {
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&sig_a);
        signature[32..].copy_from_slice(&sig_b);
        Rollout {
            window, checkpoint: ContentId(ck), env, group, rollout: idx, task_id,
            sampling: SamplingParams { temperature, max_new_tokens },
            tokens, prompt_len, logprobs, sketches, reward, miner, signature,
        }
    }
}

proptest! {
    #[test]
    fn rollout_round_trips(r in rollout()) {
        let bytes = r.encode();
        let back = Rollout::decode(&bytes, &RolloutLimits::DEFAULT).unwrap();
        // Compare encodings: NaN fields make `==` on floats useless.
        prop_assert_eq!(back.encode(), bytes);
        prop_assert_eq!(back.digest(), r.digest());
        prop_assert_eq!(back.sketches, r.sketches);
        prop_assert_eq!(back.tokens, r.tokens);
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        let _ = Rollout::decode(&bytes, &RolloutLimits::DEFAULT);
        let mut v = bytes.clone();
        v.insert(0, 1);
        let _ = Rollout::decode(&v, &RolloutLimits::DEFAULT);
        let _ = decode_sketches(&bytes, 100);
    }

    #[test]
    fn mutations_never_panic(r in rollout(), pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut bytes = r.encode();
        let i = pos.index(bytes.len());
        bytes[i] = byte;
        if let Ok(d) = Rollout::decode(&bytes, &RolloutLimits::DEFAULT) {
            // Whatever decodes re-encodes to the same bytes or a canonical form that decodes again.
            prop_assert!(Rollout::decode(&d.encode(), &RolloutLimits::DEFAULT).is_ok());
        }
        let n = cut.index(bytes.len());
        let _ = Rollout::decode(&bytes[..n], &RolloutLimits::DEFAULT);
    }

    #[test]
    fn sketch_wire_round_trips(values in prop::collection::vec(any::<u32>(), 0..300)) {
        let mut buf = Vec::new();
        encode_sketches(&values, &mut buf);
        prop_assert!(buf.len() <= values.len() * 5);
        prop_assert_eq!(decode_sketches(&buf, values.len()).unwrap(), values);
    }

    #[test]
    fn limits_bound_decoding(n in 0usize..64) {
        let r = Rollout {
            window: 1, checkpoint: ContentId([0; 32]), env: EnvId::Arith, group: 0, rollout: 0, task_id: 0,
            sampling: SamplingParams { temperature: 1.0, max_new_tokens: 8 },
            tokens: vec![5; n], prompt_len: 1, logprobs: vec![-1.0; n], sketches: vec![3; n], reward: 0.0,
            miner: [0; 32], signature: [0; 64],
        };
        let lim = RolloutLimits { max_bytes: 1 << 20, max_tokens: 32 };
        prop_assert_eq!(Rollout::decode(&r.encode(), &lim).is_ok(), n <= 32);
    }
}
