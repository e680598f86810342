//! The wgpu generation backend: the llama forward pass in WGSL compute
//! shaders, for GPUs without CUDA (AMD, Intel, Apple, NVIDIA through
//! Vulkan/Metal/DX12) and, in CI, Mesa's lavapipe.
//!
//! Kernels (`shaders/`): embedding lookup, RMSNorm, BF16 matrix
//! multiplication with f32 accumulation (a 4-row kernel for decode and a
//! 32×64 tiled kernel for prefill, same summation order), RoPE in llama.cpp's
//! NORM layout from a CPU-computed f64 table, grouped-query attention over a
//! per-layer KV cache, SwiGLU, and the LM head. Sampling runs on the host
//! with the protocol's exact rule ([`tributary_protocol::sampling`]) on the
//! read-back logits.
//!
//! Same contract and schedule as the llama.cpp backend
//! ([`crate::llama`], [`crate::backend`]): the prompt is prefilled once as
//! sequence 0 (chunks of [`PREFILL_ROWS`] rows, one hidden state per
//! position), its KV cache is copied to the other sequences, then each step
//! feeds every pending token of the group in one batch; `sketches[i]` is the
//! post-norm state at position `i`, `logprobs` are raw (T = 1), tokens are
//! drawn with the protocol's seeded inverse-CDF at their absolute position,
//! and a rollout stops after sampling an end-of-generation token (kept).

mod gpu;
mod model;

use std::path::{Path, PathBuf};

use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::sketch::{self, SketchKey, SketchParams};

use crate::backend::{Backend, BackendError, GeneratedSeq, GroupRequest, SeqState};
pub use gpu::{AdapterSummary, list_adapters};
pub use model::{ForwardOut, RowSpec, WgpuModel};

/// Prompt rows per prefill forward (bounds the attention scratch to
/// `PREFILL_ROWS × n_head × positions` floats).
pub const PREFILL_ROWS: usize = 64;

/// What can go wrong on the wgpu path.
#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    /// No (matching) adapter.
    #[error("no adapter: {0}")]
    NoAdapter(String),
    /// Device request, validation, mapping or out-of-memory error.
    #[error("device: {0}")]
    Device(String),
    /// The checkpoint cannot be run by this backend.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The checkpoint could not be opened or read.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A buffer would exceed the adapter's limits.
    #[error("{what}: {bytes} bytes exceed the adapter's limit of {limit}")]
    TooLarge {
        /// The buffer.
        what: String,
        /// Its size.
        bytes: u64,
        /// The adapter's binding limit.
        limit: u64,
    },
    /// A malformed forward or workspace request.
    #[error("invalid request: {0}")]
    Request(String),
}

impl From<WgpuError> for BackendError {
    fn from(e: WgpuError) -> Self {
        match e {
            WgpuError::NoAdapter(_) | WgpuError::Device(_) => BackendError::Init(e.to_string()),
            WgpuError::Unsupported(_) | WgpuError::Checkpoint(_) => BackendError::Load(e.to_string()),
            WgpuError::TooLarge { .. } => BackendError::Context(e.to_string()),
            WgpuError::Request(_) => BackendError::InvalidRequest(e.to_string()),
        }
    }
}

/// How to load a model on wgpu.
#[derive(Debug, Clone)]
pub struct WgpuConfig {
    /// BF16 GGUF checkpoint.
    pub model: PathBuf,
    /// Use the adapter whose name contains this (case-insensitive); default:
    /// the most capable (discrete, integrated, virtual, then CPU).
    pub adapter: Option<String>,
}

impl WgpuConfig {
    /// Defaults for `model`: adapter from `TRIBUTARY_WGPU_ADAPTER` if set.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self { model: model.into(), adapter: std::env::var("TRIBUTARY_WGPU_ADAPTER").ok().filter(|s| !s.is_empty()) }
    }
}

/// A checkpoint on a wgpu device, ready to generate groups.
#[derive(Debug)]
pub struct WgpuBackend {
    model: WgpuModel,
    path: PathBuf,
}

impl WgpuBackend {
    /// Opens `cfg.model` and uploads it.
    pub fn load(cfg: &WgpuConfig) -> Result<Self, BackendError> {
        let ckpt = Checkpoint::open(&cfg.model).map_err(|e| BackendError::Load(format!("{}: {e}", cfg.model.display())))?;
        Self::from_checkpoint(&ckpt, cfg.adapter.as_deref(), cfg.model.clone())
    }

    /// Uploads an opened checkpoint (`path` is only reported).
    pub fn from_checkpoint(ckpt: &Checkpoint, adapter: Option<&str>, path: PathBuf) -> Result<Self, BackendError> {
        Ok(Self { model: WgpuModel::load(ckpt, adapter)?, path })
    }

    /// The model file this backend runs.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The device model (forward passes, tensor updates).
    pub fn model(&mut self) -> &mut WgpuModel {
        &mut self.model
    }

    /// The adapter in use.
    pub fn adapter(&self) -> &AdapterSummary {
        self.model.adapter()
    }

    /// After a delta swap: rewrites only `names`' buffers from `ckpt`.
    pub fn update_tensors<'n>(
        &mut self,
        ckpt: &Checkpoint,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<usize, BackendError> {
        Ok(self.model.update_tensors(ckpt, names)?)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), BackendError> {
        let vocab = self.model.config().vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(BackendError::InvalidRequest(format!("token id {t} outside vocabulary of {vocab}"))),
            None => Ok(()),
        }
    }

    /// Teacher-forced forward over `tokens` (one sequence, prefilled in
    /// chunks of [`PREFILL_ROWS`]), calling `visit(position, hidden, logits)`
    /// for every position in order.
    pub fn forward_each(
        &mut self,
        tokens: &[u32],
        mut visit: impl FnMut(usize, &[f32], &[f32]) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::InvalidRequest("no tokens".into()));
        }
        self.check_tokens(tokens)?;
        let (d, v) = (self.model.config().d_model, self.model.config().vocab_size);
        self.model.reserve(1, tokens.len(), PREFILL_ROWS, PREFILL_ROWS)?;
        for (c, chunk) in tokens.chunks(PREFILL_ROWS).enumerate() {
            let rows: Vec<RowSpec> = chunk
                .iter()
                .enumerate()
                .map(|(j, &t)| RowSpec { token: t, pos: (c * PREFILL_ROWS + j) as u32, seq: 0 })
                .collect();
            let out = self.model.forward(&rows, 0..rows.len())?;
            for j in 0..rows.len() {
                visit(c * PREFILL_ROWS + j, &out.hidden[j * d..(j + 1) * d], &out.logits[j * v..(j + 1) * v])?;
            }
        }
        Ok(())
    }

    /// [`forward_each`](Self::forward_each) reduced to sketches and the raw
    /// log-probabilities of `tokens[1..]`.
    pub fn teacher_forced(
        &mut self,
        tokens: &[u32],
        key: &SketchKey,
        params: &SketchParams,
    ) -> Result<(Vec<u32>, Vec<f32>), BackendError> {
        let mut sketches = Vec::with_capacity(tokens.len());
        let mut logprobs = Vec::with_capacity(tokens.len().saturating_sub(1));
        self.forward_each(tokens, |pos, h, logits| {
            sketches.push(sketch::sketch(h, key, params).map_err(|e| BackendError::Decode(e.to_string()))?);
            if let Some(&t) = tokens.get(pos + 1) {
                let lp = tributary_protocol::sampling::logprob_t1(logits, t as usize)
                    .ok_or_else(|| BackendError::Decode(format!("token {t} outside the logits")))?;
                logprobs.push(lp);
            }
            Ok(())
        })?;
        Ok((sketches, logprobs))
    }

    fn run_group(&mut self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        req.validate()?;
        let cfg = *self.model.config();
        let (g, p) = (req.group_size, req.prompt.len());
        let per_seq = p + req.max_new_tokens;
        if per_seq > cfg.context_length {
            return Err(BackendError::InvalidRequest(format!(
                "prompt {p} + max_new_tokens {} exceeds the model's context {}",
                req.max_new_tokens, cfg.context_length
            )));
        }
        if req.sketch_key.dim() != cfg.d_model {
            return Err(BackendError::InvalidRequest(format!(
                "sketch key for {} dimensions, model has {}",
                req.sketch_key.dim(),
                cfg.d_model
            )));
        }
        self.check_tokens(req.prompt)?;
        let (d, v) = (cfg.d_model, cfg.vocab_size);
        self.model.reserve(g, per_seq, PREFILL_ROWS.max(g), g)?;

        // 1. prefill (sequence 0): every prompt position's state; the last
        //    row's logits give every rollout's first token
        let mut prompt_sketches = Vec::with_capacity(p);
        let mut first = Vec::with_capacity(g);
        for (c, chunk) in req.prompt.chunks(PREFILL_ROWS).enumerate() {
            let rows: Vec<RowSpec> = chunk
                .iter()
                .enumerate()
                .map(|(j, &t)| RowSpec { token: t, pos: (c * PREFILL_ROWS + j) as u32, seq: 0 })
                .collect();
            let last_chunk = (c + 1) * PREFILL_ROWS >= p;
            let lm = if last_chunk { rows.len() - 1..rows.len() } else { 0..0 };
            let out = self.model.forward(&rows, lm)?;
            for j in 0..rows.len() {
                prompt_sketches.push(req.sketch(&out.hidden[j * d..(j + 1) * d])?);
            }
            if last_chunk {
                for s in 0..g {
                    first.push(req.choose(&out.logits[..v], s, p));
                }
            }
        }
        self.model.copy_sequence(0, 1..g, p)?;
        let mut seqs: Vec<SeqState> = first.into_iter().map(|choice| SeqState::start(choice, req)).collect();

        // 2. decode: feed every pending token; read its state and the next logits
        let mut rows: Vec<RowSpec> = Vec::with_capacity(g);
        let mut owners: Vec<usize> = Vec::with_capacity(g);
        loop {
            rows.clear();
            owners.clear();
            for (s, st) in seqs.iter_mut().enumerate() {
                if let Some(tok) = st.pending.take() {
                    let pos = (p + st.completion.len() - 1) as u32;
                    rows.push(RowSpec { token: tok, pos, seq: s as u32 });
                    owners.push(s);
                }
            }
            if rows.is_empty() {
                break;
            }
            // a finished row only needs its state; the LM head still runs on
            // it (the range is contiguous) and its logits are ignored
            let out = self.model.forward(&rows, 0..rows.len())?;
            for (row, &s) in owners.iter().enumerate() {
                let st = &mut seqs[s];
                st.sketches.push(req.sketch(&out.hidden[row * d..(row + 1) * d])?);
                if st.finished {
                    continue;
                }
                let pos = p + st.completion.len();
                let choice = req.choose(&out.logits[row * v..(row + 1) * v], s, pos);
                st.push(choice, req);
            }
        }
        Ok(seqs.into_iter().map(|st| st.finish(&prompt_sketches)).collect())
    }
}

impl Backend for WgpuBackend {
    fn generate_group(&mut self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        self.run_group(req)
    }

    fn hidden_size(&self) -> usize {
        self.model.config().d_model
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }
}
