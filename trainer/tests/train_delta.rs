//! A real GRPO step on the tiny model, exported as BF16 and published as a
//! sparse delta: bit-exact reconstruction, hostile deltas refused.

use tch::{Device, Kind};
use trainer::train::{Sample, TrainConfig, Trainer};
use tributary_assets as assets;
use tributary_policy::{ReferenceModel, pad_batch};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::delta::{self, DeltaError, DeltaLimits};
use tributary_protocol::tiny;

fn tiny_ckpt(dir: &std::path::Path, seed: u64) -> Checkpoint {
    let src = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 GGUF (run scripts/setup.sh)");
    let path = dir.join(format!("tiny-{seed}.gguf"));
    tiny::write_tiny(seed, &src, &path).unwrap();
    Checkpoint::open(&path).unwrap()
}

/// Groups of sequences with pseudo-random completions whose "old" log-probs
/// are the model's own (what an honest miner reports), plus varied rewards.
fn batch(model: &ReferenceModel, groups: usize, per_group: usize) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut x = 12345u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for g in 0..groups {
        let prompt: Vec<u32> = (0..6).map(|_| (next() % 49152) as u32).collect();
        let rewards: Vec<f32> = (0..per_group).map(|i| ((i + g) % 3) as f32 / 2.0).collect();
        let adv = trainer::grpo::group_advantages(&rewards, 1e-8);
        for (r, a) in rewards.iter().zip(adv) {
            let n = 3 + (next() % 10) as usize;
            let mut tokens = prompt.clone();
            tokens.extend((0..n).map(|_| (next() % 49152) as u32));
            out.push(Sample {
                tokens,
                prompt_len: prompt.len(),
                temperature: 1.0,
                old_logprobs: vec![],
                advantage: a,
                reward: *r,
            });
        }
    }
    // Old log-probs from the model itself.
    tch::no_grad(|| {
        for s in &mut out {
            let (t, _) = pad_batch(&[&s.tokens], 49152, 0, Device::Cpu).unwrap();
            let logits = model.forward(&t).unwrap().logits.squeeze_dim(0).log_softmax(-1, Kind::Float);
            s.old_logprobs = (s.prompt_len..s.tokens.len())
                .map(|p| logits.double_value(&[p as i64 - 1, i64::from(s.tokens[p])]) as f32)
                .collect();
        }
    });
    out
}

#[test]
fn grpo_step_publishes_a_bit_exact_delta() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_ckpt(dir.path(), 0);
    let cfg = TrainConfig { lr: 1e-4, warmup_steps: 1, ..TrainConfig::default() };
    let mut tr = Trainer::from_checkpoint(&base, Device::Cpu, cfg).unwrap();

    // Exporting untrained weights reproduces the checkpoint byte for byte.
    let same = tr.export_checkpoint(&base).unwrap();
    assert!(same == base.bytes(), "BF16 → FP32 → BF16 is exact");

    let samples = batch(tr.model(), 4, 4);
    let st = tr.step(&samples).unwrap();
    eprintln!("{st:?}");
    assert_eq!(st.step, 1);
    assert!(st.loss.is_finite() && st.grad_norm > 0.0);
    // Old log-probs are the model's own: every ratio is 1 (to f32 rounding).
    assert!((st.ratio_mean - 1.0).abs() < 1e-4, "ratio {}", st.ratio_mean);
    assert_eq!((st.clip_low_frac, st.clip_high_frac, st.cap_frac), (0.0, 0.0, 0.0));

    let new_bytes = tr.export_checkpoint(&base).unwrap();
    let new = Checkpoint::from_bytes(new_bytes.clone()).unwrap();
    let (changed, total) = delta::change_stats(base.bytes(), new.bytes()).unwrap();
    eprintln!("changed {changed} of {total} elements");
    assert!(changed > 0 && changed < total);

    let bytes = delta::encode(&base, &new).unwrap();
    eprintln!("delta {} bytes, checkpoint {} bytes", bytes.len(), new_bytes.len());
    assert!(bytes.len() < new_bytes.len() / 4);
    let limits = DeltaLimits::for_base_len(base.bytes().len() as u64);

    // Receiver: apply in place to a copy of the base.
    let d = delta::decode(&bytes, &limits).unwrap();
    assert_eq!(d.changed_elements(), changed);
    let mut target = base.bytes().to_vec();
    delta::apply_in_place(&d, &mut target).unwrap();
    assert!(target == new_bytes, "bit-exact");
    assert_eq!(Checkpoint::from_bytes(target).unwrap().content_id(), new.content_id());

    // A second step chains: delta against the previously published checkpoint.
    tr.step(&samples).unwrap();
    let third = Checkpoint::from_bytes(tr.export_checkpoint(&base).unwrap()).unwrap();
    let d2 = delta::decode(&delta::encode(&new, &third).unwrap(), &limits).unwrap();
    let mut t2 = new_bytes.clone();
    delta::apply_in_place(&d2, &mut t2).unwrap();
    assert!(t2 == third.bytes());

    // Corrupted: flip one byte (sampled positions over the whole delta) → refused.
    for i in (0..bytes.len()).step_by((bytes.len() / 200).max(1)).chain([bytes.len() - 1]) {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        let mut t = base.bytes().to_vec();
        let res = delta::decode(&bad, &limits).and_then(|d| delta::apply_in_place(&d, &mut t));
        assert!(res.is_err(), "flip at {i} accepted");
        assert!(t == base.bytes());
    }
    // Truncated → refused.
    for len in [0, 10, delta::HEADER_LEN, bytes.len() / 2, bytes.len() - 1] {
        assert!(delta::decode(&bytes[..len], &limits).is_err());
    }
    // Wrong base (another tiny model, and the result itself) → refused, untouched.
    let other = tiny_ckpt(dir.path(), 1);
    let mut t = other.bytes().to_vec();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::WrongBase { .. })));
    assert!(t == other.bytes());
    let mut t = new_bytes.clone();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::WrongBase { .. })));
}

#[test]
fn a_learning_rate_of_1e_6_changes_few_bf16_weights() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_ckpt(dir.path(), 0);
    let cfg = TrainConfig { lr: 1e-6, warmup_steps: 1, ..TrainConfig::default() };
    let mut tr = Trainer::from_checkpoint(&base, Device::Cpu, cfg).unwrap();
    let samples = batch(tr.model(), 4, 4);
    tr.step(&samples).unwrap();
    let new = tr.export_checkpoint(&base).unwrap();
    let (changed, total) = delta::change_stats(base.bytes(), &new).unwrap();
    let frac = changed as f64 / total as f64;
    eprintln!("lr 1e-6: {changed} of {total} changed ({:.4}%)", 100.0 * frac);
    assert!(changed > 0, "an update must change something");
    assert!(frac < 0.05, "most BF16 weights unchanged at lr 1e-6");
}
