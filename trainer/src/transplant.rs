//! `trainer transplant`: a trained `llama` checkpoint (SmolLM2) re-expressed
//! in another family's layout, so the family's code paths run on weights
//! that behave like a trained language model without a download (issue 30,
//! item 3).
//!
//! - `qwen2`: `general.architecture = qwen2`, the `llama.*` keys renamed,
//!   the `qwen2` pre-tokenizer, `attn_q`/`attn_k` rows un-permuted per head
//!   (llama.cpp's converter permutes them for the `llama` graph's
//!   adjacent-pair RoPE; `qwen2` rotates split halves on the rows as they
//!   are), and Q/K/V biases drawn from a seeded normal of standard deviation
//!   `bias_std` (0 gives the source's function exactly).
//! - `llama3`: the same `llama` file plus Llama 3's RoPE frequency scaling
//!   (`rope_freqs.weight` as the converter writes it, factor 8, low/high
//!   frequency factors 1/4, the original context the source's own) and the
//!   `llama-bpe` pre-tokenizer.
//!
//! Rows are moved as bytes, so a BF16 (or quantized) source keeps its values
//! exactly. `qwen3` is not offered: its per-head q/k RMSNorm changes what
//! the attention computes, so SmolLM2's weights would no longer behave like
//! a trained model.

use std::path::Path;

use tributary_protocol::checkpoint::{Arch, Checkpoint, CheckpointError, ContentId};
use tributary_protocol::gguf::{GgmlType, GgufError, GgufWriter, MetaValue};
use tributary_protocol::{quant, tiny};

/// The layout to re-express the source in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `qwen2`: Q/K/V biases, NEOX RoPE.
    Qwen2,
    /// `llama` with Llama 3's RoPE frequency scaling.
    Llama3,
}

impl Layout {
    /// The layout named `name` (`qwen2`, `llama3`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen2" => Some(Self::Qwen2),
            "llama3" => Some(Self::Llama3),
            _ => None,
        }
    }
}

/// How to transplant.
#[derive(Clone, Copy, Debug)]
pub struct TransplantOptions {
    /// The target layout.
    pub layout: Layout,
    /// Seed of the Q/K/V biases (`qwen2`).
    pub seed: u64,
    /// Standard deviation of the Q/K/V biases (`qwen2`; 0: no change of function).
    pub bias_std: f32,
}

/// What can go wrong transplanting.
#[derive(Debug, thiserror::Error)]
pub enum TransplantError {
    /// The source is not a plain `llama` checkpoint.
    #[error("the source must be a llama checkpoint without biases or rope_freqs (it is {0})")]
    Source(String),
    /// A bias standard deviation that is negative or not finite.
    #[error("bias standard deviation {0} must be finite and >= 0")]
    BiasStd(f32),
    /// Reading the source or checking the result.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing the result.
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// The default standard deviation of the `qwen2` Q/K/V biases: small enough
/// that the model still predicts text about as well as its source (0.02
/// cost SmolLM2-135M 0.19 nats per token on a GSM8K passage, with one token
/// 6.5 nats off; see `tests/transplant.rs`).
pub const DEFAULT_BIAS_STD: f32 = 0.005;

/// Llama 3 scaling of the `llama3` layout: factor, low and high frequency factors.
const LLAMA3_FACTORS: (f64, f64, f64) = (8.0, 1.0, 4.0);

/// `n` normal values of standard deviation `std` from a blake3 stream of `seed` and `name`.
fn seeded_normal(seed: u64, name: &str, n: usize, std: f32) -> Vec<f32> {
    let mut h = blake3::Hasher::new_derive_key("tributary transplant biases v1");
    h.update(&seed.to_le_bytes());
    h.update(name.as_bytes());
    let mut xof = h.finalize_xof();
    let mut buf = [0u8; 16];
    (0..n)
        .map(|_| {
            xof.fill(&mut buf);
            let u1 = (u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) >> 11) as f64 + 1.0;
            let u2 = (u64::from_le_bytes(buf[8..].try_into().expect("8 bytes")) >> 11) as f64;
            let (u1, u2) = (u1 / (1u64 << 53) as f64, u2 / (1u64 << 53) as f64);
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (z * f64::from(std)) as f32
        })
        .collect()
}

/// Undo the converter's per-head Q/K row permutation: GGUF row `2j + s` of
/// a head is row `s · head_dim/2 + j` of the transformers matrix.
fn unpermute_rows(bytes: &[u8], n_head: usize, head_dim: usize) -> Vec<u8> {
    let rows = n_head * head_dim;
    let row_bytes = bytes.len() / rows;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_head {
        for s in 0..2 {
            for j in 0..head_dim / 2 {
                let (to, from) = (h * head_dim + s * head_dim / 2 + j, h * head_dim + 2 * j + s);
                out[to * row_bytes..(to + 1) * row_bytes]
                    .copy_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
}

/// Write `src` re-expressed in `opts.layout` to `out`; returns its content id.
pub fn transplant(src: &Checkpoint, opts: &TransplantOptions, out: &Path) -> Result<ContentId, TransplantError> {
    let c = *src.config();
    if c.arch != Arch::Llama || c.qkv_bias || c.rope_freqs || c.key_length.is_some_and(|k| k * c.n_head != c.d_model) {
        return Err(TransplantError::Source(format!(
            "{} (biases {}, rope_freqs {})",
            c.arch, c.qkv_bias, c.rope_freqs
        )));
    }
    if !(opts.bias_std.is_finite() && opts.bias_std >= 0.0) {
        return Err(TransplantError::BiasStd(opts.bias_std));
    }
    let hd = c.head_dim();
    let mut w = GgufWriter::new();
    let (arch, pre) = match opts.layout {
        Layout::Qwen2 => ("qwen2", "qwen2"),
        Layout::Llama3 => ("llama", "llama-bpe"),
    };
    for (key, v) in &src.header().metadata {
        let key = match key.strip_prefix("llama.") {
            Some(rest) => format!("{arch}.{rest}"),
            None => key.clone(),
        };
        w.set_meta(&key, v.clone());
    }
    w.set_meta("general.architecture", MetaValue::Str(arch.into()));
    let name = src.header().get_str("general.name").unwrap_or("model").to_owned();
    let layout = match opts.layout {
        Layout::Qwen2 => "qwen2",
        Layout::Llama3 => "llama3",
    };
    w.set_meta("general.name", MetaValue::Str(format!("{name} (transplanted to the {layout} layout)")));
    w.set_meta("tokenizer.ggml.pre", MetaValue::Str(pre.into()));

    let missing = |n: &str| CheckpointError::MissingTensor(n.to_owned());
    for t in &src.header().tensors {
        let bytes = src.tensor_bytes(&t.name).ok_or_else(|| missing(&t.name))?;
        let role = t.name.rsplit_once(".weight").map(|(stem, _)| stem.rsplit('.').next().unwrap_or(stem));
        match (opts.layout, role) {
            (Layout::Qwen2, Some("attn_q")) => {
                w.add_tensor(&t.name, t.ty, &t.dims, unpermute_rows(bytes, c.n_head, hd))?;
            }
            (Layout::Qwen2, Some("attn_k")) => {
                w.add_tensor(&t.name, t.ty, &t.dims, unpermute_rows(bytes, c.n_head_kv, hd))?;
            }
            _ => {
                w.add_tensor(&t.name, t.ty, &t.dims, bytes)?;
            }
        }
    }
    match opts.layout {
        Layout::Qwen2 => {
            for i in 0..c.n_layer {
                for (m, rows) in [("attn_q", c.n_head * hd), ("attn_k", c.n_head_kv * hd), ("attn_v", c.n_head_kv * hd)]
                {
                    let name = format!("blk.{i}.{m}.bias");
                    let b = seeded_normal(opts.seed, &name, rows, opts.bias_std);
                    w.add_tensor(&name, GgmlType::F32, &[rows as u64], quant::f32_to_le_bytes(&b))?;
                }
            }
        }
        Layout::Llama3 => {
            let (f, lo, hi) = LLAMA3_FACTORS;
            let ctx = c.context_length as f64;
            let freqs = tiny::llama3_rope_freqs(f64::from(c.rope_theta), hd, (f, lo, hi, ctx));
            w.add_tensor("rope_freqs.weight", GgmlType::F32, &[freqs.len() as u64], quant::f32_to_le_bytes(&freqs))?;
            let json = format!(
                "{{\"rope_type\":\"llama3\",\"factor\":{f:?},\"low_freq_factor\":{lo:?},\"high_freq_factor\":{hi:?},\"original_max_position_embeddings\":{}}}",
                c.context_length
            );
            w.set_meta(tiny::HF_ROPE_SCALING_KEY, MetaValue::Str(json));
        }
    }
    w.write_file(out)?;
    Ok(Checkpoint::open(out)?.content_id())
}
