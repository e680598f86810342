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
        return Err(CheckpointError::MissingKey("tokenizer.ggml.model"));
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
