//! The transformer of the supported GGUF architectures (`llama`: SmolLM2 and
//! Llama 3.x; `qwen2`; `qwen3`) in libtorch, reproducing llama.cpp's graphs.
//!
//! Parameters live in a [`tch::nn::VarStore`] under their GGUF names
//! (`token_embd.weight`, `blk.7.attn_q.weight`, ...), as f32 by default, so
//! the trainer can optimise exactly the tensors the validator runs.
//!
//! Layout conventions (they reproduce llama.cpp's `llama` graph):
//! - a GGUF matrix with `ne = [in, out]` is a row-major `[out, in]` tensor, so
//!   `x.linear(w)` computes `x · wᵀ` directly on the file's data;
//! - RoPE for `llama` is llama.cpp's `LLAMA_ROPE_TYPE_NORM`: adjacent pairs
//!   `(x[2i], x[2i+1])` rotate by `pos · θ^(-2i/head_dim)`. GGUF files made by
//!   `convert_hf_to_gguf.py` already carry Q/K rows permuted for that layout, so
//!   no permutation is applied here (an HF export would need the inverse);
//!   `qwen2`/`qwen3` use `LLAMA_ROPE_TYPE_NEOX`: `(x[i], x[i + hd/2])` rotate
//!   (the converter does not permute them). With `rope_freqs.weight` (Llama 3
//!   scaling) frequency i is divided by its factor, as ggml's `rope_ext` does;
//! - `qwen2` adds the Q/K/V biases, `qwen3` RMS-normalises each query and key
//!   head (`attn_q_norm`, `attn_k_norm`) before RoPE and its heads need not
//!   tile the width (`attn_q` is `[n_head · head_dim, d]`);
//! - the hidden state returned is the post-final-RMSNorm state
//!   `rmsnorm(x) · output_norm.weight`, the LM head's input, like llama.cpp's
//!   `result_norm` embeddings;
//! - without `output.weight` the LM head is tied to `token_embd.weight`.

use tch::{Device, Kind, Tensor, nn};

use tributary_protocol::checkpoint::{Checkpoint, ModelConfig};
use tributary_protocol::gguf::GgmlType;

use crate::PolicyError;

/// Checks the shape constraints the forward pass relies on.
fn validate(c: &ModelConfig) -> Result<(), PolicyError> {
    let bad = |why: &str| Err(PolicyError::Config(why.to_owned()));
    if c.n_layer == 0 || c.d_model == 0 || c.n_head == 0 || c.n_head_kv == 0 {
        return bad("zero layers, width or heads");
    }
    if c.d_ff == 0 || c.vocab_size == 0 || c.context_length == 0 {
        return bad("zero feed-forward width, vocabulary or context");
    }
    if c.key_length.is_none() && !c.d_model.is_multiple_of(c.n_head) {
        return bad("d_model is not a multiple of n_head");
    }
    if !c.n_head.is_multiple_of(c.n_head_kv) {
        return bad("n_head is not a multiple of n_head_kv");
    }
    if c.head_dim() == 0 || !c.head_dim().is_multiple_of(2) {
        return bad("head_dim is odd (RoPE rotates pairs)");
    }
    if !(c.rms_eps.is_finite() && c.rms_eps > 0.0) {
        return bad("rms_eps must be positive");
    }
    if !(c.rope_theta.is_finite() && c.rope_theta > 1.0) {
        return bad("rope_theta must be > 1");
    }
    if c.vocab_size > i64::MAX as usize / 2 {
        return bad("vocabulary too large");
    }
    Ok(())
}

/// The GGUF tensor names the model reads, with their shapes in torch
/// (row-major) order; `output.weight` is listed only when `untied`. Biases
/// (`qkv_bias`), q/k norms (`qwen3`) and `rope_freqs.weight` (Llama 3
/// scaling; a constant, not trained) follow the config.
pub fn tensor_shapes(c: &ModelConfig, untied: bool) -> Vec<(String, Vec<i64>)> {
    let (d, f, v) = (c.d_model as i64, c.d_ff as i64, c.vocab_size as i64);
    let (q, kv, hd) = (c.q_dim() as i64, c.kv_dim() as i64, c.head_dim() as i64);
    let mut out = vec![("token_embd.weight".to_owned(), vec![v, d])];
    for l in 0..c.n_layer {
        for (t, shape) in [
            ("attn_norm", vec![d]),
            ("attn_q", vec![q, d]),
            ("attn_k", vec![kv, d]),
            ("attn_v", vec![kv, d]),
            ("attn_output", vec![d, q]),
            ("ffn_norm", vec![d]),
            ("ffn_gate", vec![f, d]),
            ("ffn_up", vec![f, d]),
            ("ffn_down", vec![d, f]),
        ] {
            out.push((format!("blk.{l}.{t}.weight"), shape));
        }
        if c.qkv_bias {
            for (t, n) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                out.push((format!("blk.{l}.{t}.bias"), vec![n]));
            }
        }
        if c.arch.qk_norm() {
            for t in ["attn_q_norm", "attn_k_norm"] {
                out.push((format!("blk.{l}.{t}.weight"), vec![hd]));
            }
        }
    }
    out.push(("output_norm.weight".to_owned(), vec![d]));
    if untied {
        out.push(("output.weight".to_owned(), vec![v, d]));
    }
    if c.rope_freqs {
        out.push((ROPE_FREQS.to_owned(), vec![hd / 2]));
    }
    out
}

/// The Llama 3 RoPE frequency factors' tensor: read, never trained.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// One transformer block's parameters (shallow handles into the VarStore).
#[derive(Debug)]
struct Block {
    attn_norm: Tensor,
    attn_q: Tensor,
    attn_k: Tensor,
    attn_v: Tensor,
    attn_output: Tensor,
    ffn_norm: Tensor,
    ffn_gate: Tensor,
    ffn_up: Tensor,
    ffn_down: Tensor,
    /// Q, K, V biases (`qwen2`, or any file that has them).
    qkv_bias: Option<[Tensor; 3]>,
    /// Per-head RMSNorm weights of queries and keys (`qwen3`).
    qk_norm: Option<[Tensor; 2]>,
}

/// Output of a teacher-forced forward pass.
#[derive(Debug)]
pub struct ForwardOutput {
    /// Post-final-norm hidden states, `[B, L, d_model]`.
    pub hidden: Tensor,
    /// LM-head logits, `[B, L, vocab]`.
    pub logits: Tensor,
}

/// Keys and values (RoPE applied, `[1, n_head_kv, P, head_dim]`) of the
/// positions a sequence has decoded so far, one pair per block: the state of
/// [`ReferenceModel::decode`].
#[derive(Debug)]
pub struct KvCache {
    kv: Vec<(Tensor, Tensor)>,
    len: i64,
}

impl KvCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The reference model: a Llama transformer whose parameters are f32 (or
/// another float kind) tensors in a [`nn::VarStore`] named after the GGUF.
#[derive(Debug)]
pub struct ReferenceModel {
    vs: nn::VarStore,
    dims: ModelConfig,
    token_embd: Tensor,
    output: Option<Tensor>,
    output_norm: Tensor,
    blocks: Vec<Block>,
    /// Llama 3 RoPE frequency divisors, one per pair (`rope_freqs.weight`).
    rope_factors: Option<Vec<f64>>,
}

impl ReferenceModel {
    /// Loads a checkpoint (any tensor type the checkpoint can dequantize;
    /// a BF16 checkpoint converts to f32 exactly) onto `device` as f32.
    pub fn load(ckpt: &Checkpoint, device: Device) -> Result<Self, PolicyError> {
        Self::from_fn(*ckpt.config(), device, |name| {
            if ckpt.tensor_info(name).is_none() {
                return Ok(None);
            }
            ckpt.tensor_f32(name).map(Some).map_err(|e| PolicyError::Checkpoint(Box::new(e)))
        })
    }

    /// Loads a checkpoint whose matrices are all BF16 (every checkpoint the
    /// trainer publishes) holding them as BF16: 2 bytes a parameter instead
    /// of 4, for inference only (nothing is trainable). Each product widens
    /// its matrix to f32 first (exact: every BF16 value is an f32) and runs
    /// the same f32 kernels on the same values as [`Self::load`]'s model, so
    /// the hidden states and logits are the same bits; vectors (norms,
    /// biases) stay f32. A checkpoint with a matrix of another type is
    /// refused ([`PolicyError::Config`]): rounding it would change results.
    pub fn load_bf16_held(ckpt: &Checkpoint, device: Device) -> Result<Self, PolicyError> {
        if let Some(t) = ckpt.header().tensors.iter().find(|t| !Self::held_as_is(t)) {
            return Err(PolicyError::Config(format!(
                "{} is {:?}: only a checkpoint whose matrices are BF16 can be held as BF16",
                t.name, t.ty
            )));
        }
        Self::build(*ckpt.config(), device, true, |name| {
            if ckpt.tensor_info(name).is_none() {
                return Ok(None);
            }
            ckpt.tensor_f32(name).map(Some).map_err(|e| PolicyError::Checkpoint(Box::new(e)))
        })
    }

    /// Loads `ckpt` for inference in the least memory that keeps its bits:
    /// [held as BF16](Self::load_bf16_held) when every matrix is BF16 (every
    /// checkpoint the trainer publishes, and the BF16 base), else
    /// [in f32](Self::load) (e.g. a quantised file). Either way the forward
    /// computes the same f32 results. The validator and the trainer's proof
    /// load their reference models this way.
    pub fn load_for_inference(ckpt: &Checkpoint, device: Device) -> Result<Self, PolicyError> {
        if Self::can_hold_bf16(ckpt) { Self::load_bf16_held(ckpt, device) } else { Self::load(ckpt, device) }
    }

    /// Whether [`Self::load_bf16_held`] takes `ckpt`: every matrix is BF16.
    pub fn can_hold_bf16(ckpt: &Checkpoint) -> bool {
        ckpt.header().tensors.iter().all(Self::held_as_is)
    }

    fn held_as_is(t: &tributary_protocol::gguf::TensorInfo) -> bool {
        t.dims.len() < 2 || t.ty == GgmlType::BF16
    }

    /// An f32 copy of a model holding BF16 matrices (`None` when every
    /// parameter is already f32): the same values and so the same results,
    /// twice the memory, and no widening per product. For a run of many
    /// one-row steps ([`Self::decode`]), where widening every matrix at
    /// every step costs more than the products (SmolLM2, 2 threads: about
    /// 127 ms a decode step held as BF16, 54 ms as f32; calibration.md §6c).
    pub fn widened_copy(&self) -> Result<Option<Self>, PolicyError> {
        let vars = self.vs.variables();
        if !vars.values().any(|t| t.kind() == Kind::BFloat16) {
            return Ok(None);
        }
        let vs = nn::VarStore::new(self.device());
        let root = vs.root();
        for (name, t) in &vars {
            add_named(&root, name, widen(t)?, false);
        }
        Ok(Some(Self::from_var_store(vs, self.dims)?))
    }

    /// Bytes the parameters take on their device.
    pub fn parameter_bytes(&self) -> usize {
        self.vs.variables().values().map(|t| t.numel() * t.kind().elt_size_in_bytes()).sum()
    }

    /// Opens the checkpoint file at `path` and [loads](Self::load) it.
    pub fn open(path: &std::path::Path, device: Device) -> Result<Self, PolicyError> {
        let ckpt = Checkpoint::open(path).map_err(|e| PolicyError::Checkpoint(Box::new(e)))?;
        Self::load(&ckpt, device)
    }

    /// Builds the model from a tensor provider. `fetch(name)` returns the
    /// tensor's f32 elements in GGUF (ggml `ne`) order, or `None` if the
    /// checkpoint has no such tensor (only `output.weight` may be absent: the
    /// head is then tied to the embedding). Parameters are created on `device`
    /// as f32 and marked trainable; wrap inference in [`tch::no_grad`].
    pub fn from_fn<F>(dims: ModelConfig, device: Device, fetch: F) -> Result<Self, PolicyError>
    where
        F: FnMut(&str) -> Result<Option<Vec<f32>>, PolicyError>,
    {
        Self::build(dims, device, false, fetch)
    }

    /// [`Self::from_fn`], or with `bf16_matrices` every matrix held as BF16
    /// and nothing trainable ([`Self::load_bf16_held`]).
    fn build<F>(dims: ModelConfig, device: Device, bf16_matrices: bool, mut fetch: F) -> Result<Self, PolicyError>
    where
        F: FnMut(&str) -> Result<Option<Vec<f32>>, PolicyError>,
    {
        validate(&dims)?;
        let vs = nn::VarStore::new(device);
        let output_data = fetch("output.weight")?;
        let untied = output_data.is_some();
        let mut output_data = output_data;
        let root = vs.root();
        for (name, shape) in tensor_shapes(&dims, untied) {
            let data = if name == "output.weight" { output_data.take() } else { fetch(&name)? };
            let data = data.ok_or_else(|| PolicyError::MissingTensor(name.clone()))?;
            let expected: i64 = shape.iter().product();
            if data.len() as i64 != expected {
                return Err(PolicyError::TensorShape { name, expected: shape, found: data.len() });
            }
            let mut t = Tensor::f_from_slice(&data)?.f_reshape(&shape)?;
            drop(data);
            if bf16_matrices && shape.len() >= 2 {
                t = t.f_to_kind(Kind::BFloat16)?;
            }
            let t = t.f_to_device(device)?;
            add_named(&root, &name, t, name != ROPE_FREQS && !bf16_matrices);
        }
        Self::from_var_store(vs, dims)
    }

    /// Wraps an existing VarStore whose variables carry the GGUF names and
    /// torch-order shapes of [`tensor_shapes`] (e.g. one loaded from
    /// a safetensors file the trainer saved).
    pub fn from_var_store(vs: nn::VarStore, dims: ModelConfig) -> Result<Self, PolicyError> {
        validate(&dims)?;
        let vars = vs.variables();
        let untied = vars.contains_key("output.weight");
        for (name, shape) in tensor_shapes(&dims, untied) {
            let t = vars.get(&name).ok_or_else(|| PolicyError::MissingTensor(name.clone()))?;
            if t.size() != shape {
                let found = t.size().iter().product::<i64>().max(0) as usize;
                return Err(PolicyError::TensorShape { name, expected: shape, found });
            }
        }
        let get = |n: &str| -> Result<Tensor, PolicyError> {
            vars.get(n).map(Tensor::shallow_clone).ok_or_else(|| PolicyError::MissingTensor(n.to_owned()))
        };
        let blocks = (0..dims.n_layer)
            .map(|l| {
                let g = |t: &str| get(&format!("blk.{l}.{t}.weight"));
                Ok(Block {
                    attn_norm: g("attn_norm")?,
                    attn_q: g("attn_q")?,
                    attn_k: g("attn_k")?,
                    attn_v: g("attn_v")?,
                    attn_output: g("attn_output")?,
                    ffn_norm: g("ffn_norm")?,
                    ffn_gate: g("ffn_gate")?,
                    ffn_up: g("ffn_up")?,
                    ffn_down: g("ffn_down")?,
                    qkv_bias: if dims.qkv_bias {
                        let b = |t: &str| get(&format!("blk.{l}.{t}.bias"));
                        Some([b("attn_q")?, b("attn_k")?, b("attn_v")?])
                    } else {
                        None
                    },
                    qk_norm: if dims.arch.qk_norm() { Some([g("attn_q_norm")?, g("attn_k_norm")?]) } else { None },
                })
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        let rope_factors = if dims.rope_freqs {
            let t = get(ROPE_FREQS)?.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?;
            let v: Vec<f64> = Vec::try_from(&t)?;
            if v.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
                return Err(PolicyError::Config("rope_freqs must be finite and positive".into()));
            }
            Some(v)
        } else {
            None
        };
        Ok(Self {
            rope_factors,
            token_embd: get("token_embd.weight")?,
            output: if untied { Some(get("output.weight")?) } else { None },
            output_norm: get("output_norm.weight")?,
            blocks,
            vs,
            dims,
        })
    }

    /// The model's hyperparameters.
    pub fn dims(&self) -> &ModelConfig {
        &self.dims
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The parameter store (GGUF names), e.g. for an optimiser.
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// Mutable access to the parameter store (e.g. to load trained values).
    pub fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }

    /// Whether the LM head is tied to `token_embd.weight`.
    pub fn is_tied(&self) -> bool {
        self.output.is_none()
    }

    /// Every parameter rounded to BF16 bit patterns, sorted by name, in GGUF
    /// (`ne`) element order — what a BF16 GGUF checkpoint stores.
    pub fn export_bf16_tensors(&self) -> Result<Vec<(String, Vec<u16>)>, PolicyError> {
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| {
            vars.into_iter()
                .map(|(name, t)| {
                    let bits = t
                        .f_to_kind(Kind::BFloat16)?
                        .f_to_device(Device::Cpu)?
                        .f_contiguous()?
                        .f_view_dtype(Kind::Int16)?
                        .f_flatten(0, -1)?;
                    let v: Vec<i16> = Vec::try_from(&bits)?;
                    Ok((name, v.into_iter().map(|x| x as u16).collect()))
                })
                .collect()
        })
    }

    /// Checks that every id is inside the vocabulary. Call it on untrusted
    /// token ids before building the tensor for [`ReferenceModel::forward`].
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<(), PolicyError> {
        check_tokens(tokens, self.dims.vocab_size)
    }

    /// Teacher-forced forward of right-padded sequences `tokens` (`[B, L]`
    /// i64). Attention is causal, so the values at a sequence's real
    /// positions do not depend on what follows them: right padding (with any
    /// valid token id) never changes them, and no mask is needed. Returns
    /// the post-norm hidden states and the logits at every position.
    /// Differentiable; wrap in [`tch::no_grad`] for inference.
    pub fn forward(&self, tokens: &Tensor) -> Result<ForwardOutput, PolicyError> {
        let hidden = self.forward_hidden(tokens)?;
        let logits = self.lm_head(&hidden)?;
        Ok(ForwardOutput { hidden, logits })
    }

    /// The transformer body only: post-final-norm hidden states `[B, L, d]`.
    pub fn forward_hidden(&self, tokens: &Tensor) -> Result<Tensor, PolicyError> {
        let (tokens, _, l) = self.checked_batch(tokens, 0)?;
        let (cos, sin) = self.rope(0, l)?;
        let mut x = widen(&Tensor::f_embedding(&self.token_embd, &tokens, -1, false, false)?)?;
        for blk in &self.blocks {
            x = self.block(blk, &x, &cos, &sin, None)?.0;
        }
        rms_norm(&x, &self.output_norm, f64::from(self.dims.rms_eps))
    }

    /// Teacher-forced forward of `B` right-padded continuations `suffix`
    /// (`[B, S]` i64) of one shared `prefix` (`[1, P]` i64), e.g. the G
    /// rollouts of one prompt: the prefix runs once and every continuation
    /// attends to its keys and values. Returns the post-norm hidden states of
    /// the prefix `[1, P, d]` and of the continuations `[B, S, d]`, equal (up to
    /// rounding) to [`ReferenceModel::forward_hidden`] on the concatenations.
    pub fn forward_hidden_shared_prefix(
        &self,
        prefix: &Tensor,
        suffix: &Tensor,
    ) -> Result<(Tensor, Tensor), PolicyError> {
        let (prefix, pb, p) = self.checked_batch(prefix, 0)?;
        if pb != 1 {
            return Err(PolicyError::Request(format!("the prefix must be one sequence, got {pb}")));
        }
        let (suffix, b, s) = self.checked_batch(suffix, p)?;
        let (cos_p, sin_p) = self.rope(0, p)?;
        let (cos_s, sin_s) = self.rope(p, s)?;
        // Continuation row i sees every prefix position and suffix positions <= i.
        let mask = Tensor::f_ones([s, s], (Kind::Bool, self.device()))?.f_tril(0)?;
        let mask = Tensor::f_cat(&[Tensor::f_ones([s, p], (Kind::Bool, self.device()))?, mask], 1)?;
        let mut xp = widen(&Tensor::f_embedding(&self.token_embd, &prefix, -1, false, false)?)?;
        let mut xs = widen(&Tensor::f_embedding(&self.token_embd, &suffix, -1, false, false)?)?;
        for blk in &self.blocks {
            let (x, k, v) = self.block(blk, &xp, &cos_p, &sin_p, None)?;
            xp = x;
            let (k, v) = (k.f_expand([b, -1, -1, -1], false)?, v.f_expand([b, -1, -1, -1], false)?);
            xs = self.block(blk, &xs, &cos_s, &sin_s, Some((&k, &v, &mask)))?.0;
        }
        let eps = f64::from(self.dims.rms_eps);
        Ok((rms_norm(&xp, &self.output_norm, eps)?, rms_norm(&xs, &self.output_norm, eps)?))
    }

    /// Runs `prefix` (`[1, P]` i64) at positions `0..P` and returns each
    /// block's keys and values (`[1, n_head_kv, P, hd]`, RoPE applied), for
    /// [`ReferenceModel::forward_hidden_packed`]. Differentiable.
    pub fn prefix_kv(&self, prefix: &Tensor) -> Result<Vec<(Tensor, Tensor)>, PolicyError> {
        let (prefix, b, p) = self.checked_batch(prefix, 0)?;
        if b != 1 {
            return Err(PolicyError::Request(format!("the prefix must be one sequence, got {b}")));
        }
        let (cos, sin) = self.rope(0, p)?;
        let mut x = widen(&Tensor::f_embedding(&self.token_embd, &prefix, -1, false, false)?)?;
        let mut kv = Vec::with_capacity(self.blocks.len());
        for blk in &self.blocks {
            let (y, k, v) = self.block(blk, &x, &cos, &sin, None)?;
            x = y;
            kv.push((k, v));
        }
        Ok(kv)
    }

    /// Teacher-forced forward of one packed row `tokens` (`[1, N]` i64) that
    /// holds several sequences continuing a prefix whose keys and values are
    /// `past` ([`ReferenceModel::prefix_kv`], `P` positions; empty for none):
    /// row token `i` sits at position `positions[i]` and attends to every
    /// prefix position and to the row tokens `j` with `mask[i * N + j]`
    /// (row-major `[N, N]`). With a mask that lets each token see the tokens of
    /// its own sequence before it, the post-norm hidden states `[1, N, d]`
    /// equal (up to rounding) those of [`ReferenceModel::forward_hidden`] on
    /// each sequence with the prefix in front: no padding is run.
    pub fn forward_hidden_packed(
        &self,
        past: &[(Tensor, Tensor)],
        tokens: &Tensor,
        positions: &[i64],
        mask: &[bool],
    ) -> Result<Tensor, PolicyError> {
        let (tokens, b, n) = self.checked_batch(tokens, 0)?;
        if b != 1 {
            return Err(PolicyError::Request(format!("a packed row is one sequence, got {b}")));
        }
        if !past.is_empty() && past.len() != self.blocks.len() {
            return Err(PolicyError::Request(format!(
                "{} layers of past keys, want {}",
                past.len(),
                self.blocks.len()
            )));
        }
        let p = past.first().map_or(0, |(k, _)| k.size()[2]);
        if positions.len() != n as usize || mask.len() != (n * n) as usize {
            return Err(PolicyError::Request(format!(
                "{n} tokens need {n} positions and {} mask entries, got {} and {}",
                n * n,
                positions.len(),
                mask.len()
            )));
        }
        let max = positions.iter().copied().max().unwrap_or(0);
        if positions.iter().any(|&q| q < 0) || max as usize >= self.dims.context_length {
            return Err(PolicyError::TooLong { len: max as usize + 1, max: self.dims.context_length });
        }
        let device = self.device();
        let pos = Tensor::f_from_slice(positions)?.f_to_device(device)?;
        let (cos, sin) = self.rope(0, max + 1)?;
        let (cos, sin) = (cos.f_index_select(0, &pos)?, sin.f_index_select(0, &pos)?);
        let own = Tensor::f_from_slice(mask)?.f_view([n, n])?.f_to_device(device)?;
        let mask = Tensor::f_cat(&[Tensor::f_ones([n, p], (Kind::Bool, device))?, own], 1)?;
        let hd = self.dims.head_dim() as i64;
        let nkv = self.dims.n_head_kv as i64;
        let mut x = widen(&Tensor::f_embedding(&self.token_embd, &tokens, -1, false, false)?)?;
        let empty = Tensor::f_zeros([1, nkv, 0, hd], (x.kind(), device))?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let (k, v) = past.get(i).map_or((&empty, &empty), |(k, v)| (k, v));
            x = self.block(blk, &x, &cos, &sin, Some((k, v, &mask)))?.0;
        }
        rms_norm(&x, &self.output_norm, f64::from(self.dims.rms_eps))
    }

    /// An empty key/value cache for [`ReferenceModel::decode`].
    pub fn kv_cache(&self) -> KvCache {
        KvCache { kv: Vec::with_capacity(self.blocks.len()), len: 0 }
    }

    /// Incremental forward of one sequence: runs `tokens` at the positions
    /// after those already in `cache`, attending to the cached keys and
    /// values, appends their own, and returns the logits of the last one
    /// (`[vocab]`). Decoding a sequence a token at a time gives the logits
    /// [`ReferenceModel::forward`] gives at the same positions, up to
    /// rounding (libtorch blocks its GEMMs by row count), at the cost of one
    /// position a step instead of the whole prefix. Wrap in [`tch::no_grad`].
    /// On error the cache is unchanged.
    pub fn decode(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Tensor, PolicyError> {
        if tokens.is_empty() {
            return Err(PolicyError::Request("nothing to decode".to_owned()));
        }
        check_tokens(tokens, self.dims.vocab_size)?;
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let input = Tensor::f_from_slice(&ids)?.f_view([1, ids.len() as i64])?;
        let p = cache.len;
        let (input, _, l) = self.checked_batch(&input, p)?;
        let (cos, sin) = self.rope(p, l)?;
        let mask = if p == 0 {
            None
        } else {
            let own = Tensor::f_ones([l, l], (Kind::Bool, self.device()))?.f_tril(0)?;
            Some(Tensor::f_cat(&[Tensor::f_ones([l, p], (Kind::Bool, self.device()))?, own], 1)?)
        };
        let mut x = widen(&Tensor::f_embedding(&self.token_embd, &input, -1, false, false)?)?;
        let mut kv = Vec::with_capacity(self.blocks.len());
        for (i, blk) in self.blocks.iter().enumerate() {
            let past = match (&mask, cache.kv.get(i)) {
                (Some(m), Some((k, v))) => Some((k, v, m)),
                _ => None,
            };
            let (y, k, v) = self.block(blk, &x, &cos, &sin, past)?;
            x = y;
            kv.push(match cache.kv.get(i) {
                Some((pk, pv)) if p > 0 => (Tensor::f_cat(&[pk, &k], 2)?, Tensor::f_cat(&[pv, &v], 2)?),
                _ => (k, v),
            });
        }
        let last = x.f_select(1, l - 1)?;
        let logits = self.lm_head(&rms_norm(&last, &self.output_norm, f64::from(self.dims.rms_eps))?)?;
        cache.kv = kv;
        cache.len = p + l;
        Ok(logits.f_select(0, 0)?)
    }

    /// Validates a `[B, L]` i64 batch starting at position `offset` and moves
    /// it to the model's device; returns it with `B` and `L`.
    fn checked_batch(&self, tokens: &Tensor, offset: i64) -> Result<(Tensor, i64, i64), PolicyError> {
        let size = tokens.size();
        let &[b, l] = size.as_slice() else {
            return Err(PolicyError::Request(format!("tokens must be [B, L], got {size:?}")));
        };
        if tokens.kind() != Kind::Int64 {
            return Err(PolicyError::Request(format!("tokens must be Int64, got {:?}", tokens.kind())));
        }
        if b == 0 || l == 0 {
            return Err(PolicyError::Request("empty batch".to_owned()));
        }
        let total = (offset + l) as usize;
        if total > self.dims.context_length {
            return Err(PolicyError::TooLong { len: total, max: self.dims.context_length });
        }
        let tokens = tokens.f_to_device(self.device())?;
        let vocab = self.dims.vocab_size as i64;
        let (lo, hi) = (tokens.f_min()?.f_int64_value(&[])?, tokens.f_max()?.f_int64_value(&[])?);
        if lo < 0 || hi >= vocab {
            let id = if lo < 0 { lo } else { hi };
            return Err(PolicyError::TokenOutOfRange { id, index: None, vocab: self.dims.vocab_size });
        }
        Ok((tokens, b, l))
    }

    /// RoPE tables for positions `offset..offset + len`.
    fn rope(&self, offset: i64, len: i64) -> Result<(Tensor, Tensor), PolicyError> {
        let hd = self.dims.head_dim() as i64;
        let theta = f64::from(self.dims.rope_theta);
        let factors = self.rope_factors.as_deref();
        let (cos, sin) = rope_tables(offset + len, hd, theta, factors, self.output_norm.kind(), self.device())?;
        Ok((cos.f_narrow(0, offset, len)?, sin.f_narrow(0, offset, len)?))
    }

    /// The LM head: logits `[..., vocab]` from post-norm hidden states.
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor, PolicyError> {
        let w = self.output.as_ref().unwrap_or(&self.token_embd);
        Ok(hidden.f_linear::<&Tensor>(&widen(w)?, None)?)
    }

    /// One transformer block. With `past = (k, v, mask)` the rows of `x`
    /// also attend to earlier keys/values (`[B, n_head_kv, P, hd]`, RoPE
    /// applied) under the boolean `mask` `[L, P + L]`; otherwise attention is
    /// causal over `x` alone. Returns the output and this block's own keys
    /// and values (before the GQA repeat).
    fn block(
        &self,
        blk: &Block,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        past: Option<(&Tensor, &Tensor, &Tensor)>,
    ) -> Result<(Tensor, Tensor, Tensor), PolicyError> {
        let size = x.size();
        let (b, l) = (size[0], size[1]);
        let hd = self.dims.head_dim() as i64;
        let (nh, nkv) = (self.dims.n_head as i64, self.dims.n_head_kv as i64);

        let h = rms_norm(x, &blk.attn_norm, f64::from(self.dims.rms_eps))?;
        // [B, L, H*hd] -> [B, H, L, hd]
        let heads =
            |t: Tensor, n: i64| -> Result<Tensor, PolicyError> { Ok(t.f_view([b, l, n, hd])?.f_transpose(1, 2)?) };
        let bias = |i: usize| blk.qkv_bias.as_ref().map(|b| &b[i]);
        let (mut q, mut k) = (
            heads(h.f_linear(&widen(&blk.attn_q)?, bias(0))?, nh)?,
            heads(h.f_linear(&widen(&blk.attn_k)?, bias(1))?, nkv)?,
        );
        if let Some([qn, kn]) = &blk.qk_norm {
            let eps = f64::from(self.dims.rms_eps);
            q = rms_norm(&q, qn, eps)?;
            k = rms_norm(&k, kn, eps)?;
        }
        let rot = if self.dims.arch.rope_neox() { rope_neox } else { rope };
        let q = rot(&q, cos, sin)?;
        let k = rot(&k, cos, sin)?;
        let v = heads(h.f_linear(&widen(&blk.attn_v)?, bias(2))?, nkv)?;
        let (k_all, v_all) = match past {
            Some((pk, pv, _)) => (Tensor::f_cat(&[pk, &k], 2)?, Tensor::f_cat(&[pv, &v], 2)?),
            None => (k.shallow_clone(), v.shallow_clone()),
        };
        // Grouped-query attention without materialising repeated keys and
        // values: query head h reads key/value head h / (nh / nkv), the
        // layout `repeat_interleave` along the head axis would give.
        let scale = 1.0 / (hd as f64).sqrt();
        let mask = past.map(|(_, _, m)| m);
        let gqa = nkv != nh;
        let att = Tensor::f_scaled_dot_product_attention(&q, &k_all, &v_all, mask, 0.0, mask.is_none(), scale, gqa)?;
        let att = att.f_transpose(1, 2)?.f_reshape([b, l, nh * hd])?;
        let x = x.f_add(&att.f_linear::<&Tensor>(&widen(&blk.attn_output)?, None)?)?;

        let h = rms_norm(&x, &blk.ffn_norm, f64::from(self.dims.rms_eps))?;
        let gate = h.f_linear::<&Tensor>(&widen(&blk.ffn_gate)?, None)?.f_silu()?;
        let up = h.f_linear::<&Tensor>(&widen(&blk.ffn_up)?, None)?;
        let ff = gate.f_mul(&up)?.f_linear::<&Tensor>(&widen(&blk.ffn_down)?, None)?;
        Ok((x.f_add(&ff)?, k, v))
    }
}

/// Checks that every id is `< vocab`; the error names the first bad index.
pub fn check_tokens(tokens: &[u32], vocab: usize) -> Result<(), PolicyError> {
    match tokens.iter().position(|&t| t as usize >= vocab) {
        Some(i) => Err(PolicyError::TokenOutOfRange { id: i64::from(tokens[i]), index: Some(i), vocab }),
        None => Ok(()),
    }
}

/// Builds a right-padded `[B, L]` i64 batch (L = longest sequence) from
/// sequences of token ids, checking every id against `vocab` first. Padding
/// uses id `pad`. Returns the batch and each sequence's length.
pub fn pad_batch(seqs: &[&[u32]], vocab: usize, pad: u32, device: Device) -> Result<(Tensor, Vec<usize>), PolicyError> {
    if seqs.is_empty() || seqs.iter().any(|s| s.is_empty()) {
        return Err(PolicyError::Request("empty batch or empty sequence".to_owned()));
    }
    check_tokens(&[pad], vocab)?;
    for s in seqs {
        check_tokens(s, vocab)?;
    }
    let l = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut flat = Vec::with_capacity(seqs.len() * l);
    for s in seqs {
        flat.extend(s.iter().map(|&t| i64::from(t)));
        flat.extend(std::iter::repeat_n(i64::from(pad), l - s.len()));
    }
    let t = Tensor::f_from_slice(&flat)?.f_view([seqs.len() as i64, l as i64])?.f_to_device(device)?;
    Ok((t, seqs.iter().map(|s| s.len()).collect()))
}

/// Adds `t` to the store under its GGUF name (`blk.7.attn_q.weight`: one
/// path segment per dot).
fn add_named(root: &nn::Path<'_>, name: &str, t: Tensor, trainable: bool) {
    let mut path = root.clone();
    let mut parts: Vec<&str> = name.split('.').collect();
    let leaf = parts.pop().unwrap_or("weight");
    for p in parts {
        path = path.sub(p);
    }
    let _param = path.add(leaf, t, trainable);
}

/// `x / sqrt(mean(x²) + eps) * w` over the last dimension.
/// A BF16-held matrix ([`ReferenceModel::load_bf16_held`]) widened to f32
/// for one product (exact); any other tensor as it is.
fn widen(t: &Tensor) -> Result<Tensor, PolicyError> {
    Ok(if t.kind() == Kind::BFloat16 { t.f_to_kind(Kind::Float)? } else { t.shallow_clone() })
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor, PolicyError> {
    let d = *x.size().last().unwrap_or(&0);
    Ok(x.f_rms_norm([d], Some(w), eps)?)
}

/// cos/sin tables `[L, hd/2]` for RoPE, computed in f64; frequency i is
/// divided by `factors[i]` when given (Llama 3 scaling).
fn rope_tables(
    l: i64,
    hd: i64,
    theta: f64,
    factors: Option<&[f64]>,
    kind: Kind,
    device: Device,
) -> Result<(Tensor, Tensor), PolicyError> {
    let half = hd / 2;
    if factors.is_some_and(|f| f.len() as i64 != half) {
        return Err(PolicyError::Config(format!("rope_freqs must have {half} entries")));
    }
    let mut cos = Vec::with_capacity((l * half) as usize);
    let mut sin = Vec::with_capacity((l * half) as usize);
    for p in 0..l {
        for i in 0..half {
            let mut freq = theta.powf(-2.0 * i as f64 / hd as f64);
            if let Some(f) = factors {
                freq /= f[i as usize];
            }
            let a = p as f64 * freq;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    let mk = |v: &[f64]| -> Result<Tensor, PolicyError> {
        Ok(Tensor::f_from_slice(v)?.f_view([l, half])?.f_to_kind(kind)?.f_to_device(device)?)
    };
    Ok((mk(&cos)?, mk(&sin)?))
}

/// Adjacent-pair RoPE on `[B, H, L, hd]`: `(x[2i], x[2i+1])` rotated by the
/// angle of position × frequency i.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, PolicyError> {
    let s = x.size();
    let pairs = x.f_view([s[0], s[1], s[2], s[3] / 2, 2])?;
    let x0 = pairs.f_select(-1, 0)?;
    let x1 = pairs.f_select(-1, 1)?;
    let r0 = x0.f_mul(cos)?.f_sub(&x1.f_mul(sin)?)?;
    let r1 = x0.f_mul(sin)?.f_add(&x1.f_mul(cos)?)?;
    Ok(Tensor::f_stack(&[r0, r1], -1)?.f_view([s[0], s[1], s[2], s[3]])?)
}

/// NEOX RoPE on `[B, H, L, hd]`: `(x[i], x[i + hd/2])` rotated by the angle of
/// position × frequency i (llama.cpp's `LLAMA_ROPE_TYPE_NEOX`, HF's rotate-half).
fn rope_neox(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, PolicyError> {
    let half = x.size()[3] / 2;
    let x0 = x.f_narrow(-1, 0, half)?;
    let x1 = x.f_narrow(-1, half, half)?;
    let r0 = x0.f_mul(cos)?.f_sub(&x1.f_mul(sin)?)?;
    let r1 = x0.f_mul(sin)?.f_add(&x1.f_mul(cos)?)?;
    Ok(Tensor::f_cat(&[r0, r1], -1)?)
}
