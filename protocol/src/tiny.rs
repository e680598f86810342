//! A tiny random llama checkpoint for fast tests: same format, tokenizer and
//! code paths as the real model, deterministic from a seed.
//!
//! Shape: 2 layers, `d_model` 64, 4 query heads and 2 KV heads (GQA like
//! SmolLM2), `d_ff` 128, SmolLM2's 49152-token vocabulary, tied embeddings,
//! BF16 matrices, F32 norms, RoPE base 100000, context 2048.
//!
//! Weights come from ChaCha20 seeded with the seed: each value is an
//! Irwin–Hall sum of four 16-bit integers (approximately normal), centred in
//! integer arithmetic, converted exactly to `f32`, multiplied once by an `f32`
//! scale and rounded to BF16. Each step is exact or a single correctly
//! rounded IEEE operation, so the bytes (and the content id) are the same on
//! every machine.
//!
//! Scales: embeddings have RMS 1, so the tied LM head gives logits with a
//! standard deviation of about 8 (the final RMSNorm makes the hidden state's
//! norm about `sqrt(64)`): a peaked, not uniform, next-token distribution.
//! The blocks' output projections are large enough that the residual stream
//! is dominated by context rather than by the current token's embedding (so
//! the model does not simply repeat its input), and the EOS embedding is
//! scaled up by 2.5 so that EOS is sampled now and then (measured on seed 0
//! with a reference forward pass: logit std ~8, mean P(EOS) ~1.7% per step).

use std::path::Path;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::checkpoint::{Checkpoint, CheckpointError, ContentId, FILE_TYPE_MOSTLY_BF16};
use crate::gguf::{GgmlType, GgufError, GgufWriter, MetaValue};
use crate::quant;

/// Layers in the tiny model.
pub const TINY_N_LAYER: u32 = 2;
/// Residual width.
pub const TINY_D_MODEL: u32 = 64;
/// Query heads.
pub const TINY_N_HEAD: u32 = 4;
/// Key/value heads.
pub const TINY_N_HEAD_KV: u32 = 2;
/// MLP width.
pub const TINY_D_FF: u32 = 128;
/// Context length.
pub const TINY_CONTEXT: u32 = 2048;
/// RoPE base.
pub const TINY_ROPE_THETA: f32 = 100_000.0;
/// RMSNorm epsilon.
pub const TINY_RMS_EPS: f32 = 1e-5;
/// Scale of the EOS row of the embedding relative to the others.
const EOS_SCALE: f64 = 2.5;

/// Deterministic approximately-normal generator.
struct Gauss(ChaCha20Rng);

impl Gauss {
    /// Fill `n` values with standard deviation `std` (and mean `mean`).
    fn fill(&mut self, n: usize, std: f64, mean: f32) -> Vec<f32> {
        // Sum of 4 uniform u16: variance 4 * (65536^2 - 1) / 12. The centred
        // value 2*s - 4*65535 is an odd integer below 2^19, exact in f32.
        // Its standard deviation is 2 * sqrt(4 * (65536^2 - 1) / 12) ~= 65536 * 2 / sqrt(3).
        let unit = 3f64.sqrt() / (2.0 * 65536.0);
        let scale = (std * unit) as f32;
        (0..n)
            .map(|_| {
                let r = self.0.next_u64();
                let s: i64 = (0..4).map(|k| ((r >> (16 * k)) & 0xffff) as i64).sum();
                let c = (2 * s - 4 * 65535) as f32;
                c * scale + mean
            })
            .collect()
    }
}

/// A model family of the tiny test model: the plain `llama` tiny model
/// ([`write_tiny`], byte-identical to what it always was) or one exercising
/// another architecture's features at the same scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyFamily {
    /// `llama`, adjacent-pair RoPE, no scaling: [`write_tiny`].
    Llama,
    /// `llama` with Llama 3's RoPE frequency scaling (`rope_freqs.weight`,
    /// factor 8, low/high frequency factors 1/4, original context 64 so the
    /// three bands all occur at 16-dim heads) and the `llama-bpe` pre-tokenizer.
    Llama3,
    /// `qwen2`: Q/K/V biases, NEOX RoPE, the `qwen2` pre-tokenizer.
    Qwen2,
    /// `qwen3`: q/k RMSNorm per head, 32-dim heads (so `n_head · head_dim` =
    /// 128 ≠ width 64), NEOX RoPE, the `qwen2` pre-tokenizer.
    Qwen3,
}

impl TinyFamily {
    /// Every family.
    pub const ALL: [TinyFamily; 4] = [TinyFamily::Llama, TinyFamily::Llama3, TinyFamily::Qwen2, TinyFamily::Qwen3];

    /// Its name (`llama`, `llama3`, `qwen2`, `qwen3`).
    pub fn name(self) -> &'static str {
        match self {
            TinyFamily::Llama => "llama",
            TinyFamily::Llama3 => "llama3",
            TinyFamily::Qwen2 => "qwen2",
            TinyFamily::Qwen3 => "qwen3",
        }
    }

    /// The family named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    fn arch(self) -> &'static str {
        match self {
            TinyFamily::Llama | TinyFamily::Llama3 => "llama",
            TinyFamily::Qwen2 => "qwen2",
            TinyFamily::Qwen3 => "qwen3",
        }
    }
}

/// Llama 3 RoPE scaling parameters of [`TinyFamily::Llama3`]: factor,
/// low-frequency factor, high-frequency factor, original context.
pub const TINY_LLAMA3_SCALING: (f64, f64, f64, f64) = (8.0, 1.0, 4.0, 64.0);

/// Metadata key holding the Hugging Face `rope_scaling` object (JSON) of a
/// checkpoint whose RoPE frequencies are scaled by `rope_freqs.weight`: the
/// HF export needs the parameters, llama.cpp and the reference only the
/// tensor. Outside the content id (it does not change what the model computes).
pub const HF_ROPE_SCALING_KEY: &str = "tributary.hf.rope_scaling";

/// llama.cpp's converter's `rope_freqs` for Llama 3 scaling (per pair of a
/// `head_dim` head with base `theta`): 1 for high frequencies, `factor` for
/// low ones, a smooth blend between (`convert_hf_to_gguf.py`, `LlamaModel`).
pub fn llama3_rope_freqs(theta: f64, head_dim: usize, scaling: (f64, f64, f64, f64)) -> Vec<f32> {
    let (factor, low, high, old_ctx) = scaling;
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..head_dim / 2)
        .map(|i| {
            // As the converter: the frequency in f32 (torch), the rest in f64.
            let freq = f64::from(1.0f32 / (theta as f32).powf((2 * i) as f32 / head_dim as f32));
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// Write the tiny checkpoint of `family` for `seed` to `out` (atomically)
/// and return its content id. [`TinyFamily::Llama`] is [`write_tiny`].
pub fn write_tiny_family(
    family: TinyFamily,
    seed: u64,
    tokenizer_source: &Checkpoint,
    out: &Path,
) -> Result<ContentId, CheckpointError> {
    let w = match family {
        TinyFamily::Llama => tiny_writer(seed, tokenizer_source)?,
        other => family_writer(other, seed, tokenizer_source)?,
    };
    w.write_file(out).map_err(|e| match e {
        GgufError::Io(source) => CheckpointError::Io { path: out.display().to_string(), source },
        other => CheckpointError::Gguf(other),
    })?;
    Ok(Checkpoint::open(out)?.content_id())
}

/// Build the tiny checkpoint's bytes for `seed`, copying the tokenizer
/// metadata (every `tokenizer.*` key, chat template included) from
/// `tokenizer_source` (normally the SmolLM2 file).
pub fn tiny_checkpoint_bytes(seed: u64, tokenizer_source: &Checkpoint) -> Result<Vec<u8>, CheckpointError> {
    Ok(tiny_writer(seed, tokenizer_source)?.to_bytes()?)
}

/// Write the tiny checkpoint for `seed` to `out` (atomically) and return its content id.
pub fn write_tiny(seed: u64, tokenizer_source: &Checkpoint, out: &Path) -> Result<ContentId, CheckpointError> {
    tiny_writer(seed, tokenizer_source)?.write_file(out).map_err(|e| match e {
        GgufError::Io(source) => CheckpointError::Io { path: out.display().to_string(), source },
        other => CheckpointError::Gguf(other),
    })?;
    Ok(Checkpoint::open(out)?.content_id())
}

fn tiny_writer(seed: u64, src: &Checkpoint) -> Result<GgufWriter<'static>, CheckpointError> {
    let vocab = src.config().vocab_size;
    let (d, ff) = (TINY_D_MODEL as usize, TINY_D_FF as usize);
    let head_dim = d / TINY_N_HEAD as usize;
    let kv = TINY_N_HEAD_KV as usize * head_dim;

    let mut w = GgufWriter::new();
    w.set_meta("general.architecture", MetaValue::Str("llama".into()));
    w.set_meta("general.name", MetaValue::Str(format!("tributary-tiny-seed{seed}")));
    w.set_meta("general.file_type", MetaValue::U32(FILE_TYPE_MOSTLY_BF16));
    w.set_meta("llama.block_count", MetaValue::U32(TINY_N_LAYER));
    w.set_meta("llama.context_length", MetaValue::U32(TINY_CONTEXT));
    w.set_meta("llama.embedding_length", MetaValue::U32(TINY_D_MODEL));
    w.set_meta("llama.feed_forward_length", MetaValue::U32(TINY_D_FF));
    w.set_meta("llama.attention.head_count", MetaValue::U32(TINY_N_HEAD));
    w.set_meta("llama.attention.head_count_kv", MetaValue::U32(TINY_N_HEAD_KV));
    w.set_meta("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(TINY_RMS_EPS));
    w.set_meta("llama.rope.freq_base", MetaValue::F32(TINY_ROPE_THETA));
    w.set_meta("llama.rope.dimension_count", MetaValue::U32(head_dim as u32));
    w.set_meta("llama.vocab_size", MetaValue::U32(vocab as u32));
    let mut has_tokenizer = false;
    for (k, v) in &src.header().metadata {
        if k.starts_with("tokenizer.") {
            has_tokenizer = true;
            w.set_meta(k, v.clone());
        }
    }
    if !has_tokenizer {
        return Err(CheckpointError::MissingKey("tokenizer.ggml.model".into()));
    }

    let mut g = Gauss(ChaCha20Rng::seed_from_u64(seed));
    let bf16 = |v: Vec<f32>| quant::f32_to_bf16_bytes(&v);
    let f32b = |v: Vec<f32>| quant::f32_to_le_bytes(&v);
    let (d64, ff64, kv64, vocab64) = (d as u64, ff as u64, kv as u64, vocab as u64);

    let mut emb = g.fill(vocab * d, 1.0, 0.0);
    if let Some(eos) = src.header().get_u64("tokenizer.ggml.eos_token_id").map(|e| e as usize)
        && eos < vocab
    {
        let s = EOS_SCALE as f32;
        for x in &mut emb[eos * d..(eos + 1) * d] {
            *x *= s;
        }
    }
    w.add_tensor("token_embd.weight", GgmlType::BF16, &[d64, vocab64], bf16(emb))?;
    let in_std = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
    for i in 0..TINY_N_LAYER {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(&p("attn_norm"), GgmlType::F32, &[d64], f32b(g.fill(d, 0.05, 1.0)))?;
        // Queries/keys a bit larger than 1/sqrt(fan_in) so attention is not uniform.
        w.add_tensor(&p("attn_q"), GgmlType::BF16, &[d64, d64], bf16(g.fill(d * d, 2.0 * in_std(d), 0.0)))?;
        w.add_tensor(&p("attn_k"), GgmlType::BF16, &[d64, kv64], bf16(g.fill(kv * d, 2.0 * in_std(d), 0.0)))?;
        w.add_tensor(&p("attn_v"), GgmlType::BF16, &[d64, kv64], bf16(g.fill(kv * d, in_std(d), 0.0)))?;
        w.add_tensor(&p("attn_output"), GgmlType::BF16, &[d64, d64], bf16(g.fill(d * d, 2.0 * in_std(d), 0.0)))?;
        w.add_tensor(&p("ffn_norm"), GgmlType::F32, &[d64], f32b(g.fill(d, 0.05, 1.0)))?;
        w.add_tensor(&p("ffn_gate"), GgmlType::BF16, &[d64, ff64], bf16(g.fill(ff * d, in_std(d), 0.0)))?;
        w.add_tensor(&p("ffn_up"), GgmlType::BF16, &[d64, ff64], bf16(g.fill(ff * d, in_std(d), 0.0)))?;
        w.add_tensor(&p("ffn_down"), GgmlType::BF16, &[ff64, d64], bf16(g.fill(d * ff, 4.0 * in_std(ff), 0.0)))?;
    }
    w.add_tensor("output_norm.weight", GgmlType::F32, &[d64], f32b(g.fill(d, 0.05, 1.0)))?;
    Ok(w)
}

fn family_writer(family: TinyFamily, seed: u64, src: &Checkpoint) -> Result<GgufWriter<'static>, CheckpointError> {
    let vocab = src.config().vocab_size;
    let arch = family.arch();
    let d = TINY_D_MODEL as usize;
    let ff = TINY_D_FF as usize;
    let (n_head, n_kv) = (TINY_N_HEAD as usize, TINY_N_HEAD_KV as usize);
    let head_dim = if family == TinyFamily::Qwen3 { 32 } else { d / n_head };
    let (q, kv) = (n_head * head_dim, n_kv * head_dim);

    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.set_meta("general.architecture", MetaValue::Str(arch.into()));
    w.set_meta("general.name", MetaValue::Str(format!("tributary-tiny-{}-seed{seed}", family.name())));
    w.set_meta("general.file_type", MetaValue::U32(FILE_TYPE_MOSTLY_BF16));
    w.set_meta(&k("block_count"), MetaValue::U32(TINY_N_LAYER));
    w.set_meta(&k("context_length"), MetaValue::U32(TINY_CONTEXT));
    w.set_meta(&k("embedding_length"), MetaValue::U32(TINY_D_MODEL));
    w.set_meta(&k("feed_forward_length"), MetaValue::U32(TINY_D_FF));
    w.set_meta(&k("attention.head_count"), MetaValue::U32(TINY_N_HEAD));
    w.set_meta(&k("attention.head_count_kv"), MetaValue::U32(TINY_N_HEAD_KV));
    w.set_meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(TINY_RMS_EPS));
    w.set_meta(&k("rope.freq_base"), MetaValue::F32(TINY_ROPE_THETA));
    w.set_meta(&k("rope.dimension_count"), MetaValue::U32(head_dim as u32));
    if family == TinyFamily::Qwen3 {
        w.set_meta(&k("attention.key_length"), MetaValue::U32(head_dim as u32));
        w.set_meta(&k("attention.value_length"), MetaValue::U32(head_dim as u32));
    }
    w.set_meta(&k("vocab_size"), MetaValue::U32(vocab as u32));
    if family == TinyFamily::Llama3 {
        let (f, lo, hi, ctx) = TINY_LLAMA3_SCALING;
        let json = format!(
            "{{\"rope_type\":\"llama3\",\"factor\":{f:?},\"low_freq_factor\":{lo:?},\"high_freq_factor\":{hi:?},\"original_max_position_embeddings\":{}}}",
            ctx as u64
        );
        w.set_meta(HF_ROPE_SCALING_KEY, MetaValue::Str(json));
    }
    let mut has_tokenizer = false;
    for (key, v) in &src.header().metadata {
        if key.starts_with("tokenizer.") {
            has_tokenizer = true;
            w.set_meta(key, v.clone());
        }
    }
    if !has_tokenizer {
        return Err(CheckpointError::MissingKey("tokenizer.ggml.model".into()));
    }
    let pre = if family == TinyFamily::Llama3 { "llama-bpe" } else { "qwen2" };
    w.set_meta("tokenizer.ggml.pre", MetaValue::Str(pre.into()));

    // A different stream from the llama tiny model of the same seed.
    let stream = match family {
        TinyFamily::Llama | TinyFamily::Llama3 => 1,
        TinyFamily::Qwen2 => 2,
        TinyFamily::Qwen3 => 3,
    };
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut g = Gauss(rng);
    let bf16 = |v: Vec<f32>| quant::f32_to_bf16_bytes(&v);
    let f32b = |v: Vec<f32>| quant::f32_to_le_bytes(&v);
    let u = |x: usize| x as u64;

    let mut emb = g.fill(vocab * d, 1.0, 0.0);
    if let Some(eos) = src.header().get_u64("tokenizer.ggml.eos_token_id").map(|e| e as usize)
        && eos < vocab
    {
        let s = EOS_SCALE as f32;
        for x in &mut emb[eos * d..(eos + 1) * d] {
            *x *= s;
        }
    }
    w.add_tensor("token_embd.weight", GgmlType::BF16, &[u(d), u(vocab)], bf16(emb))?;
    let in_std = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
    for i in 0..TINY_N_LAYER {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(&p("attn_norm"), GgmlType::F32, &[u(d)], f32b(g.fill(d, 0.05, 1.0)))?;
        w.add_tensor(&p("attn_q"), GgmlType::BF16, &[u(d), u(q)], bf16(g.fill(q * d, 2.0 * in_std(d), 0.0)))?;
        w.add_tensor(&p("attn_k"), GgmlType::BF16, &[u(d), u(kv)], bf16(g.fill(kv * d, 2.0 * in_std(d), 0.0)))?;
        w.add_tensor(&p("attn_v"), GgmlType::BF16, &[u(d), u(kv)], bf16(g.fill(kv * d, in_std(d), 0.0)))?;
        w.add_tensor(&p("attn_output"), GgmlType::BF16, &[u(q), u(d)], bf16(g.fill(d * q, 2.0 * in_std(q), 0.0)))?;
        if family == TinyFamily::Qwen2 {
            let b = |s: &str| format!("blk.{i}.{s}.bias");
            w.add_tensor(&b("attn_q"), GgmlType::F32, &[u(q)], f32b(g.fill(q, 0.5, 0.0)))?;
            w.add_tensor(&b("attn_k"), GgmlType::F32, &[u(kv)], f32b(g.fill(kv, 0.5, 0.0)))?;
            w.add_tensor(&b("attn_v"), GgmlType::F32, &[u(kv)], f32b(g.fill(kv, 0.1, 0.0)))?;
        }
        if family == TinyFamily::Qwen3 {
            w.add_tensor(&p("attn_q_norm"), GgmlType::F32, &[u(head_dim)], f32b(g.fill(head_dim, 0.05, 1.0)))?;
            w.add_tensor(&p("attn_k_norm"), GgmlType::F32, &[u(head_dim)], f32b(g.fill(head_dim, 0.05, 1.0)))?;
        }
        w.add_tensor(&p("ffn_norm"), GgmlType::F32, &[u(d)], f32b(g.fill(d, 0.05, 1.0)))?;
        w.add_tensor(&p("ffn_gate"), GgmlType::BF16, &[u(d), u(ff)], bf16(g.fill(ff * d, in_std(d), 0.0)))?;
        w.add_tensor(&p("ffn_up"), GgmlType::BF16, &[u(d), u(ff)], bf16(g.fill(ff * d, in_std(d), 0.0)))?;
        w.add_tensor(&p("ffn_down"), GgmlType::BF16, &[u(ff), u(d)], bf16(g.fill(d * ff, 4.0 * in_std(ff), 0.0)))?;
    }
    w.add_tensor("output_norm.weight", GgmlType::F32, &[u(d)], f32b(g.fill(d, 0.05, 1.0)))?;
    if family == TinyFamily::Llama3 {
        let freqs = llama3_rope_freqs(f64::from(TINY_ROPE_THETA), head_dim, TINY_LLAMA3_SCALING);
        w.add_tensor("rope_freqs.weight", GgmlType::F32, &[u(head_dim / 2)], f32b(freqs))?;
    }
    Ok(w)
}
