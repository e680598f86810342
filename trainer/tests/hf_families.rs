//! The model families (issue 30) in the trainer's roles, each against an
//! independent oracle: Hugging Face `transformers` builds a tiny random-weight
//! model of the family from its config (`scripts/hf_oracle.py`, no download),
//! the project converts it to GGUF (`trainer::hf::import`), and then
//! - the reference model's log-probabilities agree with transformers' to
//!   ≤ 1e-4 over 1,040 positions × 32 vocabulary entries;
//! - one GRPO step on it publishes a BF16 checkpoint whose sparse delta
//!   rebuilds it bit for bit, and whose HF export loads back in
//!   transformers with the reference's log-probabilities (≤ 1e-4).
//!
//! The miner's side (llama.cpp against the same oracle) is
//! `tests/tests/families.rs`.
//!
//! Families: `llama` (SmolLM2's layout), `llama3` (Llama 3 RoPE frequency
//! scaling), `qwen2` (Q/K/V biases, NEOX RoPE), `qwen3` (q/k norms, head size
//! independent of the width, untied head). The oracle needs `transformers`
//! and `safetensors` in the project's venv (`.cache/venv`).

use std::path::{Path, PathBuf};
use std::process::Command;

use tch::{Device, Kind, Tensor};
use trainer::hf;
use trainer::train::{Sample, TrainConfig, Trainer};
use tributary_assets as assets;
use tributary_policy::{ReferenceModel, pad_batch};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::delta::{self, DeltaLimits};

/// The bound of the issue: |Δ log p| against transformers.
const TOL: f64 = 1e-4;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

fn python() -> PathBuf {
    let venv = std::env::var_os("TRIBUTARY_VENV").map(PathBuf::from).unwrap_or_else(|| assets::home().join("venv"));
    venv.join("bin").join("python")
}

fn oracle(args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(repo().join("scripts/hf_oracle.py"))
        .args(args)
        .env("TRIBUTARY_CUDA_STUBS", assets::home().join("cuda-stubs"))
        .output()
        .expect("run scripts/hf_oracle.py with the project's venv");
    assert!(
        out.status.success(),
        "hf_oracle.py {args:?} failed (needs transformers and safetensors in the venv):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn read_st(path: &Path) -> std::collections::HashMap<String, Tensor> {
    Tensor::read_safetensors(path).expect("read safetensors").into_iter().collect()
}

/// max |Δ| between `ours` (`[B, L, K]` log-probs) and the oracle's, and the count compared.
fn max_diff(ours: &Tensor, theirs: &Tensor) -> (f64, i64) {
    assert_eq!(ours.size(), theirs.size());
    ((ours.to_kind(Kind::Double) - theirs.to_kind(Kind::Double)).abs().max().double_value(&[]), theirs.numel() as i64)
}

/// The reference's log-probs of `ids` after each position of `tokens`.
fn reference_logprobs(model: &ReferenceModel, tokens: &Tensor, ids: &Tensor) -> Tensor {
    tch::no_grad(|| {
        let logits = model.forward(tokens).unwrap().logits;
        logits.to_kind(Kind::Double).log_softmax(-1, Kind::Double).gather(-1, ids, false)
    })
}

/// Groups of random completions after prompts taken from `tokens`, with the
/// model's own old log-probs and varied rewards.
fn samples(model: &ReferenceModel, tokens: &Tensor) -> Vec<Sample> {
    let vocab = model.dims().vocab_size;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::new();
    for g in 0..3i64 {
        let prompt: Vec<u32> =
            Vec::<i64>::try_from(tokens.get(g).narrow(0, 0, 8)).unwrap().iter().map(|&t| t as u32).collect();
        let rewards: Vec<f32> = (0..4).map(|i| ((i + g as usize) % 3) as f32 / 2.0).collect();
        for (r, a) in rewards.iter().zip(trainer::grpo::group_advantages(&rewards, 1e-8)) {
            let mut t = prompt.clone();
            t.extend((0..4 + next() % 8).map(|_| (next() % vocab as u64) as u32));
            out.push(Sample {
                tokens: t,
                prompt_len: prompt.len(),
                temperature: 1.0,
                old_logprobs: vec![],
                advantage: a,
                reward: *r,
            });
        }
    }
    tch::no_grad(|| {
        for s in &mut out {
            let (t, _) = pad_batch(&[&s.tokens], vocab, 0, Device::Cpu).unwrap();
            let lp = model.forward(&t).unwrap().logits.squeeze_dim(0).log_softmax(-1, Kind::Float);
            s.old_logprobs = (s.prompt_len..s.tokens.len())
                .map(|p| lp.double_value(&[p as i64 - 1, i64::from(s.tokens[p])]) as f32)
                .collect();
        }
    });
    out
}

fn family_against_transformers(arch: &str, expect_class: &str) {
    tributary_policy::init_threads(Some(2));
    let dir = tempfile::tempdir().unwrap();
    let hf_dir = dir.path().join("hf");
    let made = oracle(&["make", "--arch", arch, "--out", hf_dir.to_str().unwrap(), "--seed", "3"]);
    eprintln!("{arch}: {made}");
    assert!(made.contains(expect_class), "{made}");
    let st = read_st(&hf_dir.join("oracle.safetensors"));
    let (tokens, ids, want) = (&st["tokens"], &st["ids"], &st["logprobs"]);

    // Convert (the project's own converter), then load as every role does.
    let gguf = dir.path().join(format!("{arch}.gguf"));
    let smol = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 GGUF (scripts/setup.sh)");
    hf::import(&hf_dir, &smol, &gguf, hf::ImportOptions::default()).unwrap();
    let ckpt = Checkpoint::open(&gguf).unwrap();
    eprintln!("{arch}: {:?}", ckpt.config());

    let reference = ReferenceModel::load(&ckpt, Device::Cpu).unwrap();
    let ours = reference_logprobs(&reference, tokens, ids);
    let (d_ref, n) = max_diff(&ours, want);
    let spread = want.std(true).double_value(&[]);
    eprintln!(
        "{arch}: {} positions x {} ids: max |Δ log p| reference-transformers {d_ref:.2e} (log p std {spread:.2})",
        tokens.numel(),
        ids.size()[2]
    );
    assert!(tokens.numel() >= 1000 && n >= 1000);
    assert!(spread > 1.0, "the oracle model is too flat to tell families apart (std {spread})");
    assert!(d_ref <= TOL, "{arch}: reference vs transformers {d_ref:.2e}");

    // GRPO step, BF16 publication as a sparse delta, HF export round trip.
    let cfg = TrainConfig { lr: 1e-3, warmup_steps: 1, ..TrainConfig::default() };
    let mut tr = Trainer::from_checkpoint(&ckpt, Device::Cpu, cfg).unwrap();
    assert!(tr.export_checkpoint(&ckpt).unwrap() == ckpt.bytes(), "{arch}: BF16 -> f32 -> BF16 is exact");
    let batch = samples(tr.model(), tokens);
    let stats = tr.step(&batch).unwrap();
    assert!(stats.loss.is_finite() && stats.grad_norm > 0.0, "{arch}: {stats:?}");
    assert!((stats.ratio_mean - 1.0).abs() < 1e-4, "{arch}: ratio {}", stats.ratio_mean);
    let new_bytes = tr.export_checkpoint(&ckpt).unwrap();
    let new = Checkpoint::from_bytes(new_bytes.clone()).unwrap();
    assert_eq!(new.config(), ckpt.config());
    let (changed, total) = delta::change_stats(ckpt.bytes(), new.bytes()).unwrap();
    assert!(changed > 0 && changed < total, "{arch}: {changed} of {total}");
    if ckpt.config().rope_freqs {
        assert_eq!(
            new.tensor_bytes("rope_freqs.weight"),
            ckpt.tensor_bytes("rope_freqs.weight"),
            "rope_freqs is not trained"
        );
    }
    let d = delta::decode(&delta::encode(&ckpt, &new).unwrap(), &DeltaLimits::for_base_len(ckpt.bytes().len() as u64))
        .unwrap();
    let mut rebuilt = ckpt.bytes().to_vec();
    delta::apply_in_place(&d, &mut rebuilt).unwrap();
    assert!(rebuilt == new_bytes, "{arch}: the delta rebuilds the checkpoint bit for bit");

    let export = dir.path().join("export");
    hf::export(&new, &export).unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(export.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], expect_class);
    assert_eq!(config["torch_dtype"], "bfloat16");
    let scored = dir.path().join("scored.safetensors");
    let out = oracle(&[
        "score",
        "--model",
        export.to_str().unwrap(),
        "--tokens",
        hf_dir.join("oracle.safetensors").to_str().unwrap(),
        "--out",
        scored.to_str().unwrap(),
    ]);
    assert!(out.contains(expect_class), "{out}");
    let trained = ReferenceModel::load(&new, Device::Cpu).unwrap();
    let ours = reference_logprobs(&trained, tokens, ids);
    let (d_export, _) = max_diff(&ours, &read_st(&scored)["logprobs"]);
    let (moved, _) = max_diff(&ours, want);
    eprintln!(
        "{arch}: after one step (moved up to {moved:.2e}): HF export in transformers vs reference {d_export:.2e}"
    );
    assert!(moved > 10.0 * TOL, "{arch}: the step did not change the model's log-probs ({moved:.2e})");
    assert!(d_export <= TOL, "{arch}: the HF export computes another model ({d_export:.2e})");
}

#[test]
fn llama_against_transformers() {
    family_against_transformers("llama", "LlamaForCausalLM");
}

#[test]
fn llama3_rope_scaling_against_transformers() {
    family_against_transformers("llama3", "LlamaForCausalLM");
}

#[test]
fn qwen2_against_transformers() {
    family_against_transformers("qwen2", "Qwen2ForCausalLM");
}

#[test]
fn qwen3_against_transformers() {
    family_against_transformers("qwen3", "Qwen3ForCausalLM");
}
