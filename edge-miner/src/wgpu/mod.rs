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
//! Same contract and schedule as the llama.cpp backend: the shared
//! [`schedule`](crate::schedule) with prefill chunks of [`PREFILL_ROWS`] rows
//! (the LM head runs on the prompt's last row only); `sketches[i]` is the
//! post-norm state at position `i`, `logprobs` are raw (T = 1), tokens are
//! drawn with the protocol's seeded inverse-CDF at their absolute position,
//! and a rollout stops after sampling an end-of-generation token (kept).

mod gpu;
mod model;

use std::ops::Range;
use std::path::{Path, PathBuf};

use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::sketch::{SketchKey, SketchParams};

use crate::backend::{Backend, BackendError, GeneratedSeq, GroupRequest};
pub use crate::schedule::Row;
use crate::schedule::{self, Stepper};
pub use gpu::{AdapterSummary, list_adapters};
pub use model::{ForwardOut, WgpuModel};

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
    /// The checkpoint's family needs computation these kernels lack (issue
    /// 30): refused by name at load, never computed as the `llama` graph.
    #[error("architecture {arch}: the wgpu backend has no {} (use the llama.cpp backend)", .missing.join(", "))]
    UnsupportedArch {
        /// `general.architecture`.
        arch: String,
        /// What the family needs and these kernels do not compute.
        missing: Vec<&'static str>,
    },
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
            WgpuError::Unsupported(_) | WgpuError::UnsupportedArch { .. } | WgpuError::Checkpoint(_) => {
                BackendError::Load(e.to_string())
            }
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
        let ckpt =
            Checkpoint::open(&cfg.model).map_err(|e| BackendError::Load(format!("{}: {e}", cfg.model.display())))?;
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
        visit: impl FnMut(usize, &[f32], &[f32]) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let mut st = self.replay_stepper(tokens)?;
        schedule::forward_each(&mut st, tokens, PREFILL_ROWS, visit)
    }

    /// [`forward_each`](Self::forward_each) reduced to sketches and the raw
    /// log-probabilities of `tokens[1..]`.
    pub fn teacher_forced(
        &mut self,
        tokens: &[u32],
        key: &SketchKey,
        params: &SketchParams,
    ) -> Result<(Vec<u32>, Vec<f32>), BackendError> {
        let mut st = self.replay_stepper(tokens)?;
        schedule::teacher_forced(&mut st, tokens, PREFILL_ROWS, key, params)
    }

    /// A one-sequence workspace for a teacher-forced replay of `tokens`.
    fn replay_stepper(&mut self, tokens: &[u32]) -> Result<WgpuStepper<'_>, BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::InvalidRequest("no tokens".into()));
        }
        self.check_tokens(tokens)?;
        self.model.reserve(1, tokens.len(), PREFILL_ROWS, PREFILL_ROWS)?;
        Ok(WgpuStepper::new(&mut self.model))
    }

    fn run_group(&mut self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        req.validate()?;
        let cfg = *self.model.config();
        req.check_model(cfg.context_length, cfg.d_model)?;
        self.check_tokens(req.prompt)?;
        let g = req.group_size;
        self.model.reserve(g, req.prompt.len() + req.max_new_tokens, PREFILL_ROWS.max(g), g)?;
        schedule::generate(&mut WgpuStepper::new(&mut self.model), req, PREFILL_ROWS)
    }
}

/// The device model as a [`Stepper`]: the last forward's read-back output.
struct WgpuStepper<'m> {
    model: &'m mut WgpuModel,
    out: ForwardOut,
    /// First row of the last forward's LM-head range (`out.logits` starts there).
    lm_start: usize,
}

impl<'m> WgpuStepper<'m> {
    fn new(model: &'m mut WgpuModel) -> Self {
        Self { model, out: ForwardOut { hidden: Vec::new(), logits: Vec::new() }, lm_start: 0 }
    }
}

impl Stepper for WgpuStepper<'_> {
    fn step(&mut self, rows: &[Row], lm: Range<usize>) -> Result<(), BackendError> {
        self.lm_start = lm.start;
        self.out = self.model.forward(rows, lm)?;
        Ok(())
    }

    fn hidden(&self, row: usize) -> Result<&[f32], BackendError> {
        let d = self.model.config().d_model;
        self.out
            .hidden
            .get(row * d..(row + 1) * d)
            .ok_or_else(|| BackendError::Decode(format!("no hidden state for row {row}")))
    }

    fn logits(&self, row: usize) -> Result<&[f32], BackendError> {
        let v = self.model.config().vocab_size;
        let i =
            row.checked_sub(self.lm_start).ok_or_else(|| BackendError::Decode(format!("no logits for row {row}")))?;
        self.out.logits.get(i * v..(i + 1) * v).ok_or_else(|| BackendError::Decode(format!("no logits for row {row}")))
    }

    fn copy_prompt(&mut self, seqs: Range<usize>, len: usize) -> Result<(), BackendError> {
        Ok(self.model.copy_sequence(0, seqs, len)?)
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
