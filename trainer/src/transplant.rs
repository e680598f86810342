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
//! - `qwen3`: `general.architecture = qwen3`, the keys renamed, the
//!   `qwen2` pre-tokenizer, the rows un-permuted as for `qwen2`, no biases,
//!   per-head q/k RMSNorm (`attn_q_norm`, `attn_k_norm`), and heads widened
//!   by [`QWEN3_EXTRA_DIMS`] (SmolLM2's 64 to 128, `key_length`, Qwen3's own
//!   head size), built as below.
//!
//! Rows are moved as bytes, so a BF16 (or quantized) source keeps its values
//! exactly (`qwen3` needs BF16 or F32 matrices: it adds rows).
//!
//! **`qwen3`.** Qwen3 divides each query and key head by its RMS before RoPE
//! and multiplies it by a per-dimension weight shared by the layer's heads,
//! so a head's score `q·k` becomes `Σ_i w_q[i] w_k[i] q_i k_i / (rms(q)
//! rms(k))`. SmolLM2's queries and keys vary in norm from token to token,
//! and norm weights alone cannot restore that: the best constant weights
//! (below, with no added dimensions) cost SmolLM2-135M 2.4 nats per token
//! (`tests/transplant.rs`). So the transplant widens every head by `m`
//! dimensions that set its RMS instead of the query or key does:
//! - the added rows compute `α · Uᵀ x̂`, where `x̂ = x / rms(x)` is the
//!   layer's normalised residual (the rows are `α · Uᵀ diag(1/g)` on the
//!   attention input `h = x̂ ⊙ g`) and `U` its top `m` principal directions
//!   (uncentred) on a few prompts: `|Uᵀx̂|²` is 91–96 % of `|x̂|² = d` on
//!   SmolLM2, nearly the same at every token; `α² · mean |Uᵀx̂|²` is 16 times
//!   the mean squared norm of a query (key) head, so `rms(q, e) ≈ const`
//!   and the normalised original dimensions keep the query's norm;
//! - the norm weights are 0 on the added dimensions (they never reach a
//!   score) and on the original ones `√(c · r̄_q / r̄_k)` and
//!   `√(c · r̄_k / r̄_q)`, where `r̄` is the mean RMS of the widened heads
//!   and `c = Σ s·ŝ / Σ ŝ²` the least-squares scale from the normalised
//!   scores `ŝ` to the source's `s = q·k`, over every causal (query, key)
//!   pair and head (scores after RoPE, which keeps norms), times
//!   `√(hd'/hd)` because the wider head's attention divides by `√hd'`
//!   (without that factor the model gave the end of turn 0.10 of
//!   probability before the first token of a GSM8K answer, SmolLM2 4e-9,
//!   and ended 69 % of its rollouts within 32 tokens); rounded to BF16;
//! - values get `m` zero rows and `attn_output` `m` zero columns a head;
//! - RoPE's base becomes `θ^((64 + m)/64)`, so frequency `i` of the wider
//!   head equals the source's (`rope.dimension_count` the new head size);
//!   the added pairs sit after the source's in each NEOX half.
//!
//! Every statistic comes from the source's own forward on [`QWEN3_PROMPTS`]
//! (ChatML turns as the environments render them, with answers). The model
//! is a different function from SmolLM2 (measured in `tests/transplant.rs`)
//! with 161 M parameters instead of 135 M.

use std::path::Path;

use tch::{Device, Kind, Tensor};
use tributary_policy::{PolicyError, ReferenceModel};
use tributary_protocol::checkpoint::{Arch, Checkpoint, CheckpointError, ContentId};
use tributary_protocol::env::{NUMERIC_SYSTEM_PROMPT, SAT_SYSTEM_PROMPT};
use tributary_protocol::gguf::{GgmlType, GgufError, GgufWriter, MetaValue};
use tributary_protocol::tokenizer::{Tokenizer, TokenizerError};
use tributary_protocol::{chat, quant, tiny};

/// The layout to re-express the source in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `qwen2`: Q/K/V biases, NEOX RoPE.
    Qwen2,
    /// `llama` with Llama 3's RoPE frequency scaling.
    Llama3,
    /// `qwen3`: per-head q/k RMSNorm, NEOX RoPE, `key_length`.
    Qwen3,
}

impl Layout {
    /// The layout named `name` (`qwen2`, `llama3`, `qwen3`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen2" => Some(Self::Qwen2),
            "llama3" => Some(Self::Llama3),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    /// Its name, as [`Layout::from_name`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen2 => "qwen2",
            Self::Llama3 => "llama3",
            Self::Qwen3 => "qwen3",
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
    /// Running the source to measure its queries and keys (`qwen3`).
    #[error("measuring the source's queries and keys: {0}")]
    Measure(String),
}

impl From<PolicyError> for TransplantError {
    fn from(e: PolicyError) -> Self {
        Self::Measure(e.to_string())
    }
}

impl From<tch::TchError> for TransplantError {
    fn from(e: tch::TchError) -> Self {
        Self::Measure(e.to_string())
    }
}

impl From<TokenizerError> for TransplantError {
    fn from(e: TokenizerError) -> Self {
        Self::Measure(e.to_string())
    }
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

/// The prompts the `qwen3` norms are measured on: ChatML turns as the
/// environments render them, each with an answer (not the passage
/// `tests/transplant.rs` evaluates on).
pub const QWEN3_PROMPTS: [(&str, &str, &str); 3] = [
    (
        NUMERIC_SYSTEM_PROMPT,
        "A baker makes 36 muffins in the morning and twice as many in the afternoon. He sells 75 of them. \
How many muffins are left?",
        "In the afternoon he makes 2 * 36 = 72 muffins.\nIn total he makes 36 + 72 = 108 muffins.\n\
After selling 75, he has 108 - 75 = 33 muffins left.\nAnswer: 33",
    ),
    (
        NUMERIC_SYSTEM_PROMPT,
        "Compute (17 + 25) * 3 - 48 / 6.",
        "First, 17 + 25 = 42. Then 42 * 3 = 126. Next, 48 / 6 = 8. Finally, 126 - 8 = 118.\nAnswer: 118",
    ),
    (
        SAT_SYSTEM_PROMPT,
        "Variables: x1, x2, x3.\nClauses:\n(x1 OR NOT x2)\n(x2 OR x3)\n(NOT x1 OR NOT x3)",
        "Try x1 = 1. Then NOT x3 must hold, so x3 = 0, and x2 OR x3 needs x2 = 1. \
The first clause holds since x1 = 1.\nAnswer: 1 1 0",
    ),
];

/// Head dimensions the `qwen3` transplant adds to each query, key and value
/// head (module doc): SmolLM2's 64 become 128, Qwen3's own head size.
pub const QWEN3_EXTRA_DIMS: usize = 64;

/// How much larger the added dimensions' mean squared norm is than a query
/// (key) head's, so that they set the head's RMS: a query of `k` times the
/// mean squared norm keeps `√(k / (1 + (k − 1)/17))` of its relative norm
/// (a fifth of the mean: 0.46 of 0.45; five times: 2.01 of 2.24).
const QWEN3_EXTRA_WEIGHT: f64 = 16.0;

/// The `qwen3` transplant's parameters for one layer (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3Layer {
    /// `attn_q_norm` on the source's dimensions (0 on the added ones).
    pub norm_q: f32,
    /// `attn_k_norm` on the source's dimensions (0 on the added ones).
    pub norm_k: f32,
    /// The added query rows, `extra × d` row-major (the same for every head).
    pub extra_q: Vec<f32>,
    /// The added key rows, `extra × d` row-major (the same for every KV head).
    pub extra_k: Vec<f32>,
}

/// Per layer, the `qwen3` transplant's norm weights and added rows for
/// `src` (a `llama` checkpoint) with `extra` added dimensions per head,
/// measured on [`QWEN3_PROMPTS`] (module doc).
pub fn qwen3_fit(src: &Checkpoint, extra: usize) -> Result<Vec<Qwen3Layer>, TransplantError> {
    let c = *src.config();
    let tokenizer = Tokenizer::from_checkpoint(src)?;
    let model = ReferenceModel::load(src, Device::Cpu)?;
    let vars = model.var_store().variables();
    let get = |n: &str| -> Result<Tensor, TransplantError> {
        vars.get(n).map(Tensor::shallow_clone).ok_or_else(|| TransplantError::Measure(format!("no tensor {n}")))
    };
    let (d, hd) = (c.d_model as i64, c.head_dim() as i64);
    let (nh, nkv) = (c.n_head as i64, c.n_head_kv as i64);
    let (m, hd_new) = (extra as i64, (c.head_dim() + extra) as f64);
    if !extra.is_multiple_of(2) || extra > c.d_model {
        return Err(TransplantError::Measure(format!("{extra} added dimensions: must be even and at most the width")));
    }
    let eps = f64::from(c.rms_eps);
    let theta = f64::from(c.rope_theta);
    // Per prompt and layer: the normalised residual x̂ [L, d], |q|² [nh, L, 1],
    // |k|² [nkv, L, 1] and the causal scores [nh, L, L] (f64).
    let mut seen: Vec<Vec<[Tensor; 4]>> = (0..c.n_layer).map(|_| Vec::new()).collect();
    tch::no_grad(|| -> Result<(), TransplantError> {
        for (system, user, answer) in QWEN3_PROMPTS {
            let text = format!("{}{answer}{}", chat::chatml_prompt(Some(system), user), chat::IM_END);
            let ids: Vec<i64> = tokenizer.encode(&text)?.into_iter().map(i64::from).collect();
            let l = ids.len() as i64;
            let (cos, sin) = rope_tables(l, hd, theta);
            let causal = Tensor::ones([l, l], (Kind::Bool, Device::Cpu)).tril(0);
            let tokens = Tensor::from_slice(&ids).unsqueeze(0);
            let mut x = Tensor::embedding(&get("token_embd.weight")?, &tokens, -1, false, false);
            for (i, acc) in seen.iter_mut().enumerate() {
                let w = |t: &str| get(&format!("blk.{i}.{t}.weight"));
                let xhat = x.f_rms_norm::<&Tensor>([d], None, eps)?.to_kind(Kind::Double).view([l, d]);
                let h = x.f_rms_norm([d], Some(&w("attn_norm")?), eps)?;
                let heads = |t: Tensor, n: i64| t.view([1, l, n, hd]).transpose(1, 2);
                let q = heads(h.linear::<&Tensor>(&w("attn_q")?, None), nh);
                let k = heads(h.linear::<&Tensor>(&w("attn_k")?, None), nkv);
                let v = heads(h.linear::<&Tensor>(&w("attn_v")?, None), nkv);
                let q2 = q.square().sum_dim_intlist([-1i64].as_slice(), true, Kind::Double).squeeze_dim(0);
                let k2 = k.square().sum_dim_intlist([-1i64].as_slice(), true, Kind::Double).squeeze_dim(0);
                let (q, k) = (rope_pairs(&q, &cos, &sin), rope_pairs(&k, &cos, &sin));
                // Scores of every head against its KV head, causal pairs only.
                let k_rep = k.repeat_interleave_self_int(nh / nkv, Some(1), None);
                let s = q.to_kind(Kind::Double).matmul(&k_rep.to_kind(Kind::Double).transpose(-1, -2));
                let s = s.squeeze_dim(0).where_scalarother(&causal, 0.0);
                acc.push([xhat, q2, k2, s]);
                let att = Tensor::f_scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    None::<&Tensor>,
                    0.0,
                    true,
                    1.0 / (hd as f64).sqrt(),
                    nkv != nh,
                )?;
                let att = att.transpose(1, 2).reshape([1, l, nh * hd]);
                x += att.linear::<&Tensor>(&w("attn_output")?, None);
                let h = x.f_rms_norm([d], Some(&w("ffn_norm")?), eps)?;
                let ff = (h.linear::<&Tensor>(&w("ffn_gate")?, None).silu() * h.linear::<&Tensor>(&w("ffn_up")?, None))
                    .linear::<&Tensor>(&w("ffn_down")?, None);
                x += ff;
            }
        }
        Ok(())
    })?;
    let bf16 = |x: f64| half::bf16::from_f64(x).to_f32();
    let mut out = Vec::with_capacity(c.n_layer);
    for (i, acc) in seen.iter().enumerate() {
        let bad = |what: String| TransplantError::Measure(format!("layer {i}: {what}"));
        // The top `m` principal directions of x̂ (uncentred): |Uᵀx̂|² is most
        // of |x̂|² = d, nearly the same at every token.
        let xs = Tensor::cat(&acc.iter().map(|a| a[0].shallow_clone()).collect::<Vec<_>>(), 0);
        let n = xs.size()[0] as f64;
        let (_, vecs) = (xs.transpose(0, 1).matmul(&xs) / n).linalg_eigh("L");
        let u = vecs.narrow(1, d - m, m); // [d, m], eigenvalues ascending
        let e2 = |xhat: &Tensor| xhat.matmul(&u).square().sum_dim_intlist([-1i64].as_slice(), false, Kind::Double);
        let mean = |t: &Tensor| t.mean(Kind::Double).double_value(&[]);
        let cat = |j: usize| Tensor::cat(&acc.iter().map(|a| a[j].flatten(0, -1)).collect::<Vec<_>>(), 0);
        let (mq2, mk2) = (mean(&cat(1)), mean(&cat(2)));
        let me2 = if m > 0 { mean(&Tensor::cat(&acc.iter().map(|a| e2(&a[0])).collect::<Vec<_>>(), 0)) } else { 1.0 };
        let (aq2, ak2) =
            if m > 0 { (QWEN3_EXTRA_WEIGHT * mq2 / me2, QWEN3_EXTRA_WEIGHT * mk2 / me2) } else { (0.0, 0.0) };
        // RMS of each head with the added dimensions, and the scale that
        // best reproduces the scores from the normalised vectors.
        let (mut ss, mut s2, mut rq_sum, mut rk_sum, mut nq, mut nk) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for [xhat, q2, k2, s] in acc {
            let e =
                if m > 0 { e2(xhat).view([1, -1, 1]) } else { Tensor::zeros([1, 1, 1], (Kind::Double, Device::Cpu)) };
            let rq = ((q2 + &e * aq2) / hd_new).sqrt();
            let rk = ((k2 + &e * ak2) / hd_new).sqrt();
            let rk_rep = rk.repeat_interleave_self_int(nh / nkv, Some(0), None);
            let s_hat = s / rq.matmul(&rk_rep.transpose(-1, -2));
            ss += (s * &s_hat).sum(Kind::Double).double_value(&[]);
            s2 += s_hat.square().sum(Kind::Double).double_value(&[]);
            rq_sum += rq.sum(Kind::Double).double_value(&[]);
            rk_sum += rk.sum(Kind::Double).double_value(&[]);
            nq += rq.numel() as f64;
            nk += rk.numel() as f64;
        }
        // The widened head's attention divides its scores by √hd' instead of √hd.
        let (cs, rq, rk) = (ss / s2 * (hd_new / hd as f64).sqrt(), rq_sum / nq, rk_sum / nk);
        if !(cs.is_finite() && cs > 0.0 && rq > 0.0 && rk > 0.0) {
            return Err(bad(format!("scale {cs}, rms q {rq}, rms k {rk}")));
        }
        // Rows that give α·Uᵀx̂ from h = x̂ ⊙ g: α·Uᵀ diag(1/g).
        let g = get(&format!("blk.{i}.attn_norm.weight"))?.to_kind(Kind::Double);
        if m > 0 && g.abs().min().double_value(&[]) < 1e-6 {
            return Err(bad("attn_norm has a zero weight".into()));
        }
        let rows = |a2: f64| -> Result<Vec<f32>, TransplantError> {
            if m == 0 {
                return Ok(Vec::new());
            }
            let r = (u.transpose(0, 1) / g.unsqueeze(0) * a2.sqrt()).to_kind(Kind::Float).contiguous();
            Ok(Vec::<f32>::try_from(r.flatten(0, -1))?)
        };
        out.push(Qwen3Layer {
            norm_q: bf16((cs * rq / rk).sqrt()),
            norm_k: bf16((cs * rk / rq).sqrt()),
            extra_q: rows(aq2)?,
            extra_k: rows(ak2)?,
        });
    }
    Ok(out)
}

/// cos/sin `[L, hd/2]` of RoPE at positions `0..l` (f32, computed in f64).
fn rope_tables(l: i64, hd: i64, theta: f64) -> (Tensor, Tensor) {
    let angles: Vec<f64> =
        (0..l).flat_map(|p| (0..hd / 2).map(move |i| p as f64 * theta.powf(-2.0 * i as f64 / hd as f64))).collect();
    let t = Tensor::from_slice(&angles).view([l, hd / 2]);
    (t.cos().to_kind(Kind::Float), t.sin().to_kind(Kind::Float))
}

/// The `llama` graph's adjacent-pair RoPE on `[B, H, L, hd]` (the source's layout).
fn rope_pairs(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let s = x.size();
    let pairs = x.view([s[0], s[1], s[2], s[3] / 2, 2]);
    let (x0, x1) = (pairs.select(-1, 0), pairs.select(-1, 1));
    let r0 = &x0 * cos - &x1 * sin;
    let r1 = &x0 * sin + &x1 * cos;
    Tensor::stack(&[r0, r1], -1).view([s[0], s[1], s[2], s[3]])
}

/// Write `src` re-expressed in `opts.layout` to `out`; returns its content id.
pub fn transplant(src: &Checkpoint, opts: &TransplantOptions, out: &Path) -> Result<ContentId, TransplantError> {
    transplant_with(src, opts, QWEN3_EXTRA_DIMS, out)
}

/// [`transplant`], with `extra` dimensions added to each `qwen3` head
/// instead of [`QWEN3_EXTRA_DIMS`] (0: the norms alone; for measurements).
pub fn transplant_with(
    src: &Checkpoint,
    opts: &TransplantOptions,
    extra: usize,
    out: &Path,
) -> Result<ContentId, TransplantError> {
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
    let (fit, m) = match opts.layout {
        Layout::Qwen3 => {
            if let Some(t) = src.header().tensors.iter().find(|t| {
                t.name.starts_with("blk.") && t.dims.len() == 2 && !matches!(t.ty, GgmlType::BF16 | GgmlType::F32)
            }) {
                return Err(TransplantError::Source(format!(
                    "{} is {:?}: qwen3 needs BF16 or F32 matrices",
                    t.name, t.ty
                )));
            }
            (qwen3_fit(src, extra)?, extra)
        }
        Layout::Qwen2 | Layout::Llama3 => (Vec::new(), 0),
    };
    let hd_new = hd + m;
    let mut w = GgufWriter::new();
    let (arch, pre) = match opts.layout {
        Layout::Qwen2 => ("qwen2", "qwen2"),
        Layout::Llama3 => ("llama", "llama-bpe"),
        Layout::Qwen3 => ("qwen3", "qwen2"),
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
    let layout = opts.layout.name();
    w.set_meta("general.name", MetaValue::Str(format!("{name} (transplanted to the {layout} layout)")));
    if opts.layout == Layout::Qwen3 {
        w.set_meta("qwen3.attention.key_length", MetaValue::U32(hd_new as u32));
        w.set_meta("qwen3.attention.value_length", MetaValue::U32(hd_new as u32));
        w.set_meta("qwen3.rope.dimension_count", MetaValue::U32(hd_new as u32));
        // Frequency i of the wider head, θ'^(−2i/hd'), is the source's θ^(−2i/hd).
        let theta = f64::from(c.rope_theta).powf(hd_new as f64 / hd as f64);
        w.set_meta("qwen3.rope.freq_base", MetaValue::F32(theta as f32));
    }
    w.set_meta("tokenizer.ggml.pre", MetaValue::Str(pre.into()));

    let missing = |n: &str| CheckpointError::MissingTensor(n.to_owned());
    let layer_of = |name: &str| -> usize {
        name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|i| i.parse().ok()).unwrap_or(0)
    };
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
            (Layout::Qwen3, Some(r @ ("attn_q" | "attn_k"))) => {
                let (n, rows) = match r {
                    "attn_q" => (c.n_head, &fit[layer_of(&t.name)].extra_q),
                    _ => (c.n_head_kv, &fit[layer_of(&t.name)].extra_k),
                };
                let data = widen_heads(&unpermute_rows(bytes, n, hd), t.ty, n, hd, &encode(t.ty, rows), m);
                w.add_tensor(&t.name, t.ty, &[t.dims[0], (n * hd_new) as u64], data)?;
            }
            (Layout::Qwen3, Some("attn_v")) => {
                let zeros = vec![0u8; m * bytes.len() / (c.n_head_kv * hd)];
                let row = bytes.len() / (c.n_head_kv * hd);
                let mut data = Vec::with_capacity(bytes.len() + c.n_head_kv * zeros.len());
                for h in 0..c.n_head_kv {
                    data.extend_from_slice(&bytes[h * hd * row..(h + 1) * hd * row]);
                    data.extend_from_slice(&zeros);
                }
                w.add_tensor(&t.name, t.ty, &[t.dims[0], (c.n_head_kv * hd_new) as u64], data)?;
            }
            (Layout::Qwen3, Some("attn_output")) => {
                // Each output row reads hd values per head, then m zeros.
                let es = elem_size(t.ty);
                let mut data = Vec::with_capacity(c.d_model * c.n_head * hd_new * es);
                for row in bytes.chunks_exact(c.n_head * hd * es) {
                    for h in 0..c.n_head {
                        data.extend_from_slice(&row[h * hd * es..(h + 1) * hd * es]);
                        data.extend(std::iter::repeat_n(0u8, m * es));
                    }
                }
                w.add_tensor(&t.name, t.ty, &[(c.n_head * hd_new) as u64, t.dims[1]], data)?;
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
        Layout::Qwen3 => {
            for (i, l) in fit.iter().enumerate() {
                for (name, v) in [("attn_q_norm", l.norm_q), ("attn_k_norm", l.norm_k)] {
                    // NEOX halves: the source's hd/2 pairs, then the m/2 added ones.
                    let half: Vec<f32> = (0..hd_new / 2).map(|j| if j < hd / 2 { v } else { 0.0 }).collect();
                    let b = quant::f32_to_le_bytes(&[half.as_slice(), half.as_slice()].concat());
                    w.add_tensor(&format!("blk.{i}.{name}.weight"), GgmlType::F32, &[hd_new as u64], b)?;
                }
            }
        }
    }
    w.write_file(out)?;
    Ok(Checkpoint::open(out)?.content_id())
}

/// Bytes of one element of a BF16 or F32 matrix.
fn elem_size(ty: GgmlType) -> usize {
    if ty == GgmlType::BF16 { 2 } else { 4 }
}

/// `v` encoded as `ty` (BF16 or F32).
fn encode(ty: GgmlType, v: &[f32]) -> Vec<u8> {
    if ty == GgmlType::BF16 { quant::f32_to_bf16_bytes(v) } else { quant::f32_to_le_bytes(v) }
}

/// `n` heads of NEOX rows (`hd` each: the first rotary halves, then the
/// second) widened by the `m` rows of `extra`: per head the first halves,
/// `extra`'s first `m/2` rows, the second halves, its last `m/2`.
fn widen_heads(rows: &[u8], ty: GgmlType, n: usize, hd: usize, extra: &[u8], m: usize) -> Vec<u8> {
    if m == 0 {
        return rows.to_vec();
    }
    let rb = rows.len() / (n * hd);
    debug_assert_eq!(extra.len(), m * rb, "{ty:?}");
    let mut out = Vec::with_capacity(rows.len() + n * extra.len());
    for h in 0..n {
        let head = &rows[h * hd * rb..(h + 1) * hd * rb];
        out.extend_from_slice(&head[..hd / 2 * rb]);
        out.extend_from_slice(&extra[..m / 2 * rb]);
        out.extend_from_slice(&head[hd / 2 * rb..]);
        out.extend_from_slice(&extra[m / 2 * rb..]);
    }
    out
}
