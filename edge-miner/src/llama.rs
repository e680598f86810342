//! The llama.cpp generation backend (`llama-cpp-2`).
//!
//! One decode returns, for every output row, both the full logits and the
//! post-final-RMSNorm hidden state (`with_embeddings(true)` plus
//! `LlamaPoolingType::None`), so sketches cost no extra forward pass.
//!
//! It follows the shared [`schedule`](crate::schedule) with prefill chunks of
//! [`PREFILL_CHUNK`] tokens: every row is an output, so prompt row `i` gives
//! the state at position `i` (its sketch) and row `P-1` the logits of the
//! first completion token; the prompt's KV cache is then copied to the other
//! sequences and each step decodes one pending token per sequence.
//!
//! Reproducibility (see `shared/reference/llamacpp.md` §4b): `n_ubatch` is
//! [`N_UBATCH`] (< 64, so prefill and decode take the same attention path) and
//! each sequence's attention sees exactly its prompt and completion.
//!
//! Memory: the KV cache is one unified buffer ([`kv_cells`]) in which the G
//! sequences of a group share the prompt's cells (llama.cpp's sequence copy
//! in a unified cache tags the cells with the new sequence instead of
//! copying them) and each adds its completion: P + G·N cells, rounded up to
//! llama.cpp's 256, where a cache per sequence holds G·(P + N), each
//! sequence rounded up to 256. The F32 cache the numerics need is twice
//! llama.cpp's default F16 per cell; sharing the prompt and one rounding
//! instead of G is what keeps the miner's peak memory near raw llama.cpp's
//! (`docs/benchmarks.md` §4). The attention kernel skips the cells of other
//! sequences (masked), so what it computes is unchanged; the vendored
//! change 4 (`vendor/README.md`) gathers a query position's unmasked cells
//! once for all its heads and takes those heads back to back, so the shared
//! layout costs no speed either (test `unified_cache`: bit for bit what a
//! cache per sequence computes). With layers
//! offloaded to a GPU the cache stays one per sequence: there attention runs
//! without flash attention, and a group's decode step would become one
//! matmul of G query rows over every cell — above 8 rows, ggml-vulkan's
//! tiled kernel, which upstream feeds an f16 copy of the non-contiguous F32
//! cache view (`docs/gpu-backends.md` §1; with the vendored change 3 and the
//! switches of [`pin_exact_gpu_kernels`] the copy is F32, but a unified
//! cache on a GPU has not been calibrated), where a cache per sequence keeps
//! one row per matmul.
//!
//! Numerics: the computation is plain f32, like the validator's libtorch
//! reference and the wgpu backend (measured: honest |Δ logprob| ≤ 3.5e-5,
//! sketch distance ≤ 0.12 × tolerance; `docs/calibration.md`). Three settings
//! make it so, each read off `ggml-cpu`:
//! - a BF16 checkpoint's matrices stay BF16 in memory, as published, and the
//!   vendored ggml (`vendor/README.md`) multiplies them with the f32
//!   activations in f32, widening each weight exactly in the dot product —
//!   bit for bit what the same matrix widened to F32 gives. Upstream ggml
//!   rounds the activations to bf16 first (`vec_dot_type` of BF16), and those
//!   roundings are chaotic: two implementations of the same rounding that
//!   differ only by f32 summation order end up 0.5 % apart in the final
//!   hidden state, enough to move the sampling CDF by 1e-2. With layers
//!   offloaded to a GPU, whose BF16 kernels are not calibrated, the
//!   checkpoint is widened to F32 at load instead ([`Bf16Weights`]);
//! - the KV cache is F32 (an F16 cache rounds K and V, and the attention
//!   kernels then round Q and the softmax or the `V·softmax` accumulator to
//!   f16 too: honest |Δ logprob| up to 2.7e-2, measured);
//! - flash attention is on, on the CPU ([`with_exact_numerics`]): the vendored
//!   llama.cpp (`vendor/README.md`) hands an F32 cache to the CPU kernel as
//!   F32 (upstream casts it to F16), which runs an f32 online softmax and
//!   skips masked cells — as fast as llama.cpp's default F16 flash attention,
//!   where attention without it (a `KQ` matmul and softmax over every padded
//!   cell) costs 11 %. With layers offloaded to a GPU it stays off.

use std::num::NonZeroU32;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

use crate::backend::{Backend, BackendError, GeneratedSeq, GroupRequest};
use crate::schedule::{self, Row};
use tributary_protocol::sketch::{SketchKey, SketchParams};

/// Micro-batch size: below 64 so llama.cpp's CPU flash attention takes the
/// same code path in prefill and in single-token decode (bit-exact replay).
pub const N_UBATCH: u32 = 32;
/// Prompt tokens per prefill `decode` call (a multiple of [`N_UBATCH`]; bounds
/// the logits buffer to `PREFILL_CHUNK × vocab` floats).
pub const PREFILL_CHUNK: usize = 256;

static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();

/// The process-wide llama.cpp backend (initialised once). llama.cpp's own log
/// goes into `tracing` (target `llama-cpp-2`), so `RUST_LOG` decides what of
/// it is shown.
pub fn llama_backend() -> Result<&'static LlamaBackend, BackendError> {
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| BackendError::Init(e.clone()))
}

/// The context settings that make llama.cpp's forward plain f32 (module
/// docs): an F32 KV cache, and flash attention on the CPU — the vendored
/// llama.cpp (`vendor/README.md`) hands an F32 cache in host memory to the CPU
/// flash-attention kernel as F32, which then runs an exact f32 online softmax
/// and skips masked cells. With layers offloaded to a GPU, whose kernels would
/// round K and V to f16, flash attention stays off. With none offloaded, op
/// offload is off too: a GPU build otherwise runs every op of ≥ 32 rows (a
/// prefill micro-batch) on the GPU's default kernels even at 0 GPU layers,
/// which rejected every honest rollout on Vulkan (|Δ logprob| 1.2e-2;
/// docs/gpu-backends.md).
pub fn with_exact_numerics(params: LlamaContextParams, offloaded: bool) -> LlamaContextParams {
    let policy = if offloaded {
        llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED
    } else {
        llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED
    };
    params
        .with_flash_attention_policy(policy)
        .with_type_k(KvCacheType::F32)
        .with_type_v(KvCacheType::F32)
        .with_op_offload(offloaded)
}

/// The ggml-vulkan switches that keep every matmul input f32 when layers are
/// offloaded (docs/gpu-backends.md §1): the `_fp32` shader variants, no
/// matrix cores, and (with the vendored change 3, vendor/README.md) the
/// prefill attention's K/V views staged as F32. ggml reads them once, when it
/// initialises a device.
pub const EXACT_VULKAN_ENV: [&str; 3] = ["GGML_VK_DISABLE_F16", "GGML_VK_DISABLE_COOPMAT", "GGML_VK_DISABLE_COOPMAT2"];

/// Sets [`EXACT_VULKAN_ENV`] in a miner built with Vulkan (nothing in other
/// builds) and returns the variables it set, so the miner's offloaded forward
/// is the calibrated one whatever its operator's environment says. With no
/// layer offloaded the switches change nothing: op offload is off
/// ([`with_exact_numerics`]).
///
/// # Safety
/// Writes the process environment: call it before any other thread starts
/// (first thing in `main`).
pub unsafe fn pin_exact_gpu_kernels() -> Vec<&'static str> {
    if !cfg!(feature = "vulkan") {
        return Vec::new();
    }
    let mut set = Vec::new();
    for var in EXACT_VULKAN_ENV {
        if std::env::var_os(var).is_none() {
            // SAFETY: the caller guarantees no other thread reads or writes
            // the environment.
            unsafe { std::env::set_var(var, "1") };
            set.push(var);
        }
    }
    set
}

/// KV cells a group needs in the miner's unified cache: `n_seq` sequences
/// sharing a `prompt`-token prefix, each adding at most `new` tokens
/// (llama.cpp rounds the context up to a multiple of 256). `None` on
/// overflow.
pub fn kv_cells(n_seq: usize, prompt: usize, new: usize) -> Option<usize> {
    n_seq.checked_mul(new)?.checked_add(prompt)
}

/// Number of CPU threads to use by default: the cores this process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How to load and run a model with llama.cpp.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// GGUF file.
    pub model: PathBuf,
    /// CPU threads for decode and prefill (never more than the free cores:
    /// oversubscribed OpenMP barriers are catastrophically slow).
    pub threads: usize,
    /// Layers to offload to the GPU (only meaningful with `cuda`/`metal`/`vulkan`).
    pub gpu_layers: u32,
}

impl LlamaConfig {
    /// CPU defaults for `model`: [`default_threads`] threads, no offload.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self { model: model.into(), threads: default_threads(), gpu_layers: 0 }
    }
}

/// How the matrices of a BF16 checkpoint are held in memory (other types
/// are loaded as they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Weights {
    /// BF16, as published (the file is mapped): the vendored ggml's CPU
    /// matmul widens each weight exactly and accumulates in f32 (module docs).
    AsPublished,
    /// Widened exactly to F32 in a temporary copy at load: twice the memory
    /// and the bytes read per token, for backends without that matmul (GPU
    /// offload; same values on the CPU).
    WidenedToF32,
}

/// A model loaded into llama.cpp, ready to generate groups.
pub struct LlamaCppBackend {
    model: LlamaModel,
    threads: i32,
    offloaded: bool,
    n_vocab: usize,
    n_embd: usize,
    n_ctx_train: usize,
    path: PathBuf,
}

impl std::fmt::Debug for LlamaCppBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaCppBackend")
            .field("path", &self.path)
            .field("threads", &self.threads)
            .field("n_vocab", &self.n_vocab)
            .field("n_embd", &self.n_embd)
            .finish_non_exhaustive()
    }
}

impl LlamaCppBackend {
    /// Loads `cfg.model` (memory-mapped). BF16 matrices stay BF16 on the
    /// CPU; with layers offloaded to a GPU they are first widened to F32 in
    /// a temporary file (removed once mapped), so the forward pass is plain
    /// f32 either way (module docs).
    pub fn load(cfg: &LlamaConfig) -> Result<Self, BackendError> {
        let weights = if cfg.gpu_layers > 0 { Bf16Weights::WidenedToF32 } else { Bf16Weights::AsPublished };
        Self::load_with(cfg, weights)
    }

    /// [`load`](Self::load) with the BF16 matrices held as `weights` says.
    pub fn load_with(cfg: &LlamaConfig, weights: Bf16Weights) -> Result<Self, BackendError> {
        let backend = llama_backend()?;
        if !cfg.model.is_file() {
            return Err(BackendError::Load(format!("{} is not a file", cfg.model.display())));
        }
        let threads =
            i32::try_from(cfg.threads.max(1)).map_err(|_| BackendError::Config(format!("{} threads", cfg.threads)))?;
        let params = LlamaModelParams::default().with_n_gpu_layers(cfg.gpu_layers);
        let widened = match weights {
            Bf16Weights::AsPublished => None,
            Bf16Weights::WidenedToF32 => widen_bf16_to_f32(&cfg.model)?,
        };
        let file = widened.as_ref().map_or(cfg.model.as_path(), |w| w.0.as_path());
        let model = LlamaModel::load_from_file(backend, file, &params)
            .map_err(|e| BackendError::Load(format!("{}: {e}", cfg.model.display())))?;
        drop(widened);
        let n_vocab = usize::try_from(model.n_vocab()).unwrap_or(0);
        let n_embd = usize::try_from(model.n_embd_out()).unwrap_or(0);
        if n_vocab == 0 || n_embd == 0 {
            return Err(BackendError::Load(format!("{}: empty vocabulary or embedding", cfg.model.display())));
        }
        let n_ctx_train = model.n_ctx_train() as usize;
        Ok(Self {
            model,
            threads,
            offloaded: cfg.gpu_layers > 0,
            n_vocab,
            n_embd,
            n_ctx_train,
            path: cfg.model.clone(),
        })
    }

    /// The model file this backend runs.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Vocabulary size (rows of the logits).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Width of the hidden state sketched at each position.
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// The underlying llama.cpp model.
    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// llama.cpp's own tokenization (`add_special = false, parse_special = true`);
    /// the reference for [`tributary_protocol::tokenizer::Tokenizer`].
    pub fn llama_tokenize(&self, text: &str) -> Vec<u32> {
        // llama.cpp ids are non-negative and below n_vocab.
        self.model.vocab().tokenize(text.as_bytes(), false, true).iter().map(|t| t.0 as u32).collect()
    }

    /// llama.cpp's end-of-generation test.
    pub fn llama_is_eog(&self, id: u32) -> bool {
        i32::try_from(id).is_ok_and(|i| self.model.vocab().is_eog(LlamaToken(i)))
    }

    fn token(&self, id: u32) -> Result<LlamaToken, BackendError> {
        match i32::try_from(id) {
            Ok(i) if (id as usize) < self.n_vocab => Ok(LlamaToken(i)),
            _ => Err(BackendError::InvalidRequest(format!("token id {id} outside vocabulary of {}", self.n_vocab))),
        }
    }

    /// A context for `n_seq` sequences sharing a prompt of `prompt` tokens,
    /// each followed by at most `new` more: on the CPU one unified cache of
    /// [`kv_cells`], with layers offloaded one cache per sequence (module
    /// docs).
    fn new_context(&self, n_seq: usize, prompt: usize, new: usize) -> Result<LlamaContext<'_>, BackendError> {
        let backend = llama_backend()?;
        let unified = !self.offloaded;
        let cells = if unified {
            kv_cells(n_seq, prompt, new)
        } else {
            prompt.checked_add(new).and_then(|p| p.checked_mul(n_seq))
        };
        let n_ctx = cells
            .and_then(|c| u32::try_from(c).ok())
            .and_then(NonZeroU32::new)
            .ok_or_else(|| BackendError::InvalidRequest(format!("context of {n_seq} × ({prompt} + {new}) tokens")))?;
        let n_batch = u32::try_from(PREFILL_CHUNK.max(n_seq))
            .map_err(|_| BackendError::InvalidRequest(format!("{n_seq} sequences")))?;
        let params = LlamaContextParams::default()
            .with_n_ctx(Some(n_ctx))
            .with_n_batch(n_batch)
            .with_n_ubatch(N_UBATCH)
            .with_n_seq_max(n_seq as u32)
            .with_kv_unified(unified)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads)
            .with_embeddings(true)
            .with_pooling_type(self.pooling());
        let params = with_exact_numerics(params, self.offloaded);
        self.model.new_context(backend, params).map_err(|e| BackendError::Context(e.to_string()))
    }

    /// No pooling (a hidden state per row), said the quiet way: a model
    /// without a `{arch}.pooling_type` key (every causal LM) gets none from
    /// `Unspecified` (llama-context.cpp), where naming `None` made llama.cpp
    /// warn "model default pooling_type is [-1]" at every context; a model
    /// that names a pooling type is overridden with `None` as before.
    fn pooling(&self) -> LlamaPoolingType {
        let declared = self
            .model
            .meta_val_str("general.architecture")
            .is_ok_and(|arch| self.model.meta_val_str(&format!("{arch}.pooling_type")).is_ok());
        if declared { LlamaPoolingType::None } else { LlamaPoolingType::Unspecified }
    }

    fn run_group(&self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        req.validate()?;
        req.check_model(self.n_ctx_train, self.n_embd)?;
        for &t in req.prompt {
            self.token(t)?;
        }
        let g = req.group_size;
        let mut st = LlamaStepper::new(self, g, req.prompt.len(), req.max_new_tokens, PREFILL_CHUNK.max(g))?;
        schedule::generate(&mut st, req, PREFILL_CHUNK)
    }

    /// Teacher-forced forward over `tokens` (one sequence, prefilled in chunks
    /// of [`PREFILL_CHUNK`] with the generation schedule), calling
    /// `visit(position, hidden_state, logits)` for every position in order:
    /// the post-norm state computed from `tokens[0..=position]` and the logits
    /// it gives for `tokens[position + 1]`. With the same build and thread
    /// count it reproduces generation's states and logits bit for bit, except
    /// after a decode step that fed a single sequence with 512 or more cached
    /// positions: llama.cpp then splits that attention across threads (its
    /// split-KV path), which sums in another order — equal up to f32
    /// rounding, which the validator's tolerances absorb like any other.
    pub fn forward_each(
        &self,
        tokens: &[u32],
        visit: impl FnMut(usize, &[f32], &[f32]) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let mut st = self.replay_stepper(tokens)?;
        schedule::forward_each(&mut st, tokens, PREFILL_CHUNK, visit)
    }

    /// [`forward_each`](Self::forward_each) reduced to what a rollout records:
    /// the sketch at every position and the raw log-probability of every token
    /// at positions `1..tokens.len()` (`logprobs[i-1]` is that of `tokens[i]`).
    pub fn teacher_forced(
        &self,
        tokens: &[u32],
        key: &SketchKey,
        params: &SketchParams,
    ) -> Result<(Vec<u32>, Vec<f32>), BackendError> {
        let mut st = self.replay_stepper(tokens)?;
        schedule::teacher_forced(&mut st, tokens, PREFILL_CHUNK, key, params)
    }

    /// Greedy completions of several prompts decoded together (an
    /// evaluation's decoding, not a rollout: no draws, no sketches, no
    /// log-probs): each prompt is its own sequence in one unified cache,
    /// prefilled in the generation schedule's chunks, and every step feeds
    /// the pending token of every sequence that has not finished (an
    /// end-of-generation token in `eog`, or `max_new_tokens`). A row's
    /// arithmetic does not depend on the other rows of its batch, so each
    /// completion is the one [`Backend::generate_group`] gives its prompt
    /// alone at temperature 0 (test `greedy_many_is_each_prompt_alone`); a
    /// step costs little more for several rows than for one, which is what
    /// makes a batch of problems cheaper than one at a time. The prompts'
    /// common prefix (few-shot examples, a system prompt), cut to a multiple
    /// of [`N_UBATCH`] and short of the shortest prompt, is prefilled once as
    /// sequence 0 and shared by the others; every micro-batch llama.cpp
    /// computes then starts where it starts for the prompt alone, so the
    /// sharing changes no bit (the same test, with a shared prefix).
    pub fn greedy_many(
        &self,
        prompts: &[Vec<u32>],
        max_new_tokens: usize,
        eog: &[u32],
    ) -> Result<Vec<Vec<u32>>, BackendError> {
        let mut out = vec![Vec::new(); prompts.len()];
        if prompts.is_empty() || max_new_tokens == 0 {
            return Ok(out);
        }
        for p in prompts {
            if p.is_empty() || p.len() + max_new_tokens > self.n_ctx_train {
                return Err(BackendError::InvalidRequest(format!(
                    "a prompt of {} tokens with {max_new_tokens} new in a context of {}",
                    p.len(),
                    self.n_ctx_train
                )));
            }
            for &t in p {
                self.token(t)?;
            }
        }
        let greedy = |l: &[f32]| tributary_protocol::sampling::sample_with_logprob(l, 0.0, 0.0).token;
        let k = prompts.len();
        let total: usize = prompts.iter().map(Vec::len).sum();
        let mut st = LlamaStepper::new(self, k, total, max_new_tokens, PREFILL_CHUNK.max(k))?;
        let mut rows = Vec::with_capacity(PREFILL_CHUNK.max(k));
        let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
        let common = prompts
            .iter()
            .skip(1)
            .fold(prompts[0].len(), |n, p| n.min(prompts[0].iter().zip(p).take_while(|(a, b)| a == b).count()));
        let ubatch = N_UBATCH as usize;
        let shared = if k > 1 { common.min(shortest - 1) / ubatch * ubatch } else { 0 };
        // Prefill `tokens` of sequence `seq` from position `from` in chunks.
        let mut prefill = |st: &mut LlamaStepper<'_>, tokens: &[u32], from: usize, seq: usize| {
            for (c, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
                rows.clear();
                rows.extend(chunk.iter().enumerate().map(|(j, &token)| Row {
                    token,
                    pos: (from + c * PREFILL_CHUNK + j) as u32,
                    seq: seq as u32,
                }));
                schedule::Stepper::step(st, &rows, rows.len() - 1..rows.len())?;
            }
            Ok::<usize, BackendError>(rows.len())
        };
        if shared > 0 {
            prefill(&mut st, &prompts[0][..shared], 0, 0)?;
            schedule::Stepper::copy_prompt(&mut st, 1..k, shared)?;
        }
        for (s, p) in prompts.iter().enumerate() {
            let last = prefill(&mut st, &p[shared..], shared, s)?;
            out[s].push(greedy(schedule::Stepper::logits(&st, last - 1)?));
        }
        let done = |c: &Vec<u32>| c.len() >= max_new_tokens || c.last().is_some_and(|t| eog.contains(t));
        let mut live: Vec<usize> = (0..k).filter(|&s| !done(&out[s])).collect();
        while !live.is_empty() {
            rows.clear();
            rows.extend(live.iter().map(|&s| Row {
                token: *out[s].last().expect("a first token"),
                pos: (prompts[s].len() + out[s].len() - 1) as u32,
                seq: s as u32,
            }));
            schedule::Stepper::step(&mut st, &rows, 0..rows.len())?;
            for (j, &s) in live.iter().enumerate() {
                let t = greedy(schedule::Stepper::logits(&st, j)?);
                out[s].push(t);
            }
            live.retain(|&s| !done(&out[s]));
        }
        Ok(out)
    }

    /// A one-sequence context for a teacher-forced replay of `tokens`.
    fn replay_stepper(&self, tokens: &[u32]) -> Result<LlamaStepper<'_>, BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::InvalidRequest("no tokens".into()));
        }
        if tokens.len() > self.n_ctx_train {
            return Err(BackendError::InvalidRequest(format!("{} tokens exceed the context", tokens.len())));
        }
        LlamaStepper::new(self, 1, tokens.len(), 0, PREFILL_CHUNK)
    }

    fn embedding<'c>(&self, ctx: &'c LlamaContext<'_>, row: i32) -> Result<&'c [f32], BackendError> {
        let h = ctx.embeddings_ith(row).map_err(|e| BackendError::Decode(format!("hidden state of row {row}: {e}")))?;
        if h.len() != self.n_embd {
            return Err(BackendError::Decode(format!("hidden state of width {} (expected {})", h.len(), self.n_embd)));
        }
        Ok(h)
    }
}

/// A llama.cpp context sized for one group, as a [`schedule::Stepper`]:
/// every row is an output (embeddings on), so each row has both its hidden
/// state and its logits.
struct LlamaStepper<'m> {
    backend: &'m LlamaCppBackend,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
}

impl<'m> LlamaStepper<'m> {
    fn new(
        backend: &'m LlamaCppBackend,
        n_seq: usize,
        prompt: usize,
        new: usize,
        rows: usize,
    ) -> Result<Self, BackendError> {
        let ctx = backend.new_context(n_seq, prompt, new)?;
        Ok(Self { backend, ctx, batch: LlamaBatch::new(rows, 1) })
    }
}

impl schedule::Stepper for LlamaStepper<'_> {
    fn step(&mut self, rows: &[Row], _lm: Range<usize>) -> Result<(), BackendError> {
        self.batch.clear();
        for r in rows {
            self.batch.add(self.backend.token(r.token)?, r.pos as i32, &[r.seq as i32], true)?;
        }
        self.ctx.decode(&mut self.batch)?;
        Ok(())
    }

    fn hidden(&self, row: usize) -> Result<&[f32], BackendError> {
        self.backend.embedding(&self.ctx, row as i32)
    }

    fn logits(&self, row: usize) -> Result<&[f32], BackendError> {
        Ok(self.ctx.get_logits_ith(row as i32))
    }

    fn copy_prompt(&mut self, seqs: Range<usize>, _len: usize) -> Result<(), BackendError> {
        // In the unified cache this tags the prompt's cells with sequence s
        // (no copy, no new cells).
        for s in seqs {
            self.ctx.copy_kv_cache_seq(0, s as i32, None, None).map_err(|e| BackendError::Context(e.to_string()))?;
        }
        Ok(())
    }
}

/// A temporary file, removed on drop (a mapped file stays readable after).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Folders for the widened copy, in order of preference: a memory file
/// system when there is one (the copy is read once, by the map, and never
/// needs the disk), else the temporary folder.
fn widen_dirs() -> Vec<PathBuf> {
    let shm = Path::new("/dev/shm");
    let mut dirs = Vec::new();
    if shm.is_dir() {
        dirs.push(shm.to_owned());
    }
    dirs.push(std::env::temp_dir());
    dirs
}

/// If `src` has BF16 tensors, writes a copy with each widened exactly to F32
/// (every other tensor and all metadata unchanged) to a temporary file.
///
/// The copy is streamed tensor by tensor (no second copy of the model in
/// memory) and never synced to disk: it is removed as soon as llama.cpp has
/// mapped it, so durability buys nothing and `fsync` of ~540 MB (SmolLM2)
/// costs seconds.
fn widen_bf16_to_f32(src: &Path) -> Result<Option<TempFile>, BackendError> {
    use tributary_protocol::gguf::{self, GgmlType};
    let err = |e: &dyn std::fmt::Display| BackendError::Load(format!("{}: widening to F32: {e}", src.display()));
    let file = std::fs::File::open(src).map_err(|e| err(&e))?;
    // SAFETY: read-only map of a checkpoint file nobody rewrites while the
    // miner loads it (delta application happens between loads).
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(&e))?;
    let header = gguf::parse_header(&bytes).map_err(|e| err(&e))?;
    if !header.tensors.iter().any(|t| t.ty == GgmlType::BF16) {
        return Ok(None);
    }
    let mut last = None;
    for dir in widen_dirs() {
        match write_widened(&header, &bytes, &dir) {
            Ok(tmp) => return Ok(Some(tmp)),
            // A full memory file system (a container's small /dev/shm): next folder.
            Err(e) => last = Some(e),
        }
    }
    Err(err(&last.map_or_else(|| "no temporary folder".to_owned(), |e| e.to_string())))
}

/// Writes the F32-widened copy of the parsed checkpoint `bytes` into `dir`.
fn write_widened(header: &tributary_protocol::gguf::GgufHeader, bytes: &[u8], dir: &Path) -> Result<TempFile, String> {
    use std::io::Write;
    use tributary_protocol::gguf::{self, GgmlType, GgufWriter, align_up};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let wide_len = |t: &tributary_protocol::gguf::TensorInfo| {
        if t.ty == GgmlType::BF16 { t.byte_len() * 2 } else { t.byte_len() }
    };
    // The header is built over borrowed zeros of each tensor's final size
    // (never written: only its lengths and offsets are used), then the data
    // is streamed behind it.
    let max = header.tensors.iter().map(wide_len).max().unwrap_or(0);
    let zeros = vec![0u8; usize::try_from(max).map_err(|e| e.to_string())?];
    let mut w = GgufWriter::new();
    for (k, v) in &header.metadata {
        w.set_meta(k, v.clone());
    }
    let mut data = Vec::with_capacity(header.tensors.len());
    for t in &header.tensors {
        let src = bytes.get(header.tensor_range(t)).ok_or_else(|| format!("tensor {} out of bounds", t.name))?;
        let ty = if t.ty == GgmlType::BF16 { GgmlType::F32 } else { t.ty };
        w.add_tensor(&t.name, ty, &t.dims, &zeros[..wide_len(t) as usize]).map_err(|e| e.to_string())?;
        data.push((t.ty == GgmlType::BF16, src));
    }
    let head = w.header_bytes().map_err(|e| e.to_string())?;
    let align = header.get_u32("general.alignment").map_or(gguf::DEFAULT_ALIGNMENT, u64::from);
    drop(w);
    drop(zeros);

    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = TempFile(dir.join(format!("tributary-f32-{}-{n}.gguf", std::process::id())));
    let f = std::fs::File::create(&tmp.0).map_err(|e| format!("{}: {e}", tmp.0.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, f);
    let io = |e: std::io::Error| format!("{}: {e}", tmp.0.display());
    out.write_all(&head).map_err(io)?;
    const CHUNK: usize = 1 << 18;
    let mut buf = vec![0u8; 4 * CHUNK];
    let pad = vec![0u8; align as usize];
    for (bf16, src) in data {
        let written = if bf16 {
            // BF16 is the top half of an F32: little-endian bytes [0, 0, lo, hi].
            for part in src.chunks(2 * CHUNK) {
                let wide = &mut buf[..2 * part.len()];
                for (o, i) in wide.chunks_exact_mut(4).zip(part.chunks_exact(2)) {
                    o[0] = 0;
                    o[1] = 0;
                    o[2] = i[0];
                    o[3] = i[1];
                }
                out.write_all(wide).map_err(io)?;
            }
            2 * src.len() as u64
        } else {
            out.write_all(src).map_err(io)?;
            src.len() as u64
        };
        let padded = align_up(written, align).ok_or_else(|| format!("alignment {align}"))?;
        out.write_all(&pad[..(padded - written) as usize]).map_err(io)?;
    }
    out.flush().map_err(io)?;
    Ok(tmp)
}

impl Backend for LlamaCppBackend {
    fn generate_group(&mut self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        self.run_group(req)
    }

    fn hidden_size(&self) -> usize {
        self.n_embd
    }

    fn vocab_size(&self) -> usize {
        self.n_vocab
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_protocol::gguf::{self, GgmlType, GgufWriter, MetaValue};

    /// On the CPU path nothing may run on a GPU's kernels (op offload off);
    /// the cache is F32 either way.
    #[test]
    fn exact_numerics_keep_cpu_ops_on_the_cpu() {
        let cpu = with_exact_numerics(LlamaContextParams::default(), false);
        assert!(!cpu.op_offload(), "op offload would run prefill batches on a GPU build's default kernels");
        let gpu = with_exact_numerics(LlamaContextParams::default(), true);
        assert!(gpu.op_offload());
    }

    /// The tiny random model (seed 7, SmolLM2's tokenizer) on one thread,
    /// with the folder that holds its file.
    fn tiny_backend() -> (tempfile::TempDir, LlamaCppBackend) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let source =
            tributary_protocol::checkpoint::Checkpoint::open(&tributary_assets::smollm2_q4_1()).expect("SmolLM2 file");
        tributary_protocol::tiny::write_tiny(7, &source, &path).unwrap();
        let b = LlamaCppBackend::load(&LlamaConfig { threads: 1, ..LlamaConfig::new(&path) }).unwrap();
        (dir, b)
    }

    /// A group's KV cache is one unified buffer in which the sequences share
    /// the prompt's cells: P + G·N cells rounded up to 256 (2 304 for
    /// gen-bench's group of 16 with a 39-token prompt and 128 new tokens),
    /// where a cache per sequence took G·(P + N), each sequence rounded up to
    /// 256 (4 096). A full group of 16 then runs to its last token in fewer
    /// cells than 16 copies of the prompt would need (2 672).
    #[test]
    fn a_group_shares_the_prompts_kv_cells() {
        use crate::backend::{DrawKey, GroupRequest};
        use tributary_protocol::prf::Seed;

        let (_dir, mut b) = tiny_backend();
        let (g, p, n) = (16, 39, 128);
        assert_eq!(kv_cells(g, p, n), Some(2087));
        assert_eq!(b.new_context(g, p, n).unwrap().n_ctx(), 2304);
        assert_eq!(b.new_context(1, 300, 0).unwrap().n_ctx(), 512, "a replay holds its tokens");

        let prompt: Vec<u32> = (0..p as u32).map(|i| 100 + 7 * i).collect();
        let key = SketchKey::derive(&Seed([3; 32]), b.hidden_size());
        let req = GroupRequest {
            prompt: &prompt,
            group_size: g,
            max_new_tokens: n,
            temperature: 1.0,
            draw: DrawKey { sampling_seed: Seed([4; 32]), miner: [5; 32], group: 0 },
            sketch_key: &key,
            sketch_params: SketchParams::DEFAULT,
            eog: &[],
        };
        let seqs = b.generate_group(&req).unwrap();
        assert_eq!(seqs.len(), g);
        assert!(seqs.iter().all(|s| s.completion.len() == n && s.sketches.len() == p + n));
    }

    /// Prompts of different lengths decoded together give, token for
    /// token, the greedy completion each gives alone (one group of one at
    /// temperature 0), with early ends (an end-of-generation id) and the
    /// length limit.
    #[test]
    fn greedy_many_is_each_prompt_alone() {
        use crate::backend::{DrawKey, GroupRequest};
        use tributary_protocol::prf::Seed;

        let (_dir, mut b) = tiny_backend();
        let prompts: Vec<Vec<u32>> = [5usize, 40, 300, 17]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n as u32).map(|j| 50 + 13 * j + i as u32).collect())
            .collect();
        let key = SketchKey::derive(&Seed([3; 32]), b.hidden_size());
        let alone = |b: &mut LlamaCppBackend, p: &[u32], eog: &[u32], n: usize| {
            let req = GroupRequest {
                prompt: p,
                group_size: 1,
                max_new_tokens: n,
                temperature: 0.0,
                draw: DrawKey { sampling_seed: Seed([0; 32]), miner: [0; 32], group: 0 },
                sketch_key: &key,
                sketch_params: SketchParams::DEFAULT,
                eog,
            };
            b.generate_group(&req).unwrap().remove(0).completion
        };
        let n = 24;
        let free: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&mut b, p, &[], n)).collect();
        // An end-of-generation id that one completion meets early.
        let eog = [free[1][6]];
        let each: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&mut b, p, &eog, n)).collect();
        assert!(each.iter().any(|c| c.len() < n), "an early end: {each:?}");
        assert_eq!(b.greedy_many(&prompts, n, &eog).unwrap(), each);
        assert_eq!(b.greedy_many(&prompts, n, &[]).unwrap(), free);
        assert_eq!(b.greedy_many(&prompts, 0, &[]).unwrap(), vec![Vec::<u32>::new(); 4]);
        // A common prefix (shared: 96 tokens of it) before suffixes of 1, 7,
        // 40 and 230 tokens, one prompt entirely the prefix plus one token.
        let prefix: Vec<u32> = (0..100u32).map(|j| 900 + 7 * j).collect();
        let few_shot: Vec<Vec<u32>> = [1usize, 7, 40, 230]
            .iter()
            .enumerate()
            .map(|(i, &n)| prefix.iter().copied().chain((0..n as u32).map(|j| 60 + 11 * j + i as u32)).collect())
            .collect();
        let each: Vec<Vec<u32>> = few_shot.iter().map(|p| alone(&mut b, p, &[], n)).collect();
        assert_eq!(b.greedy_many(&few_shot, n, &[]).unwrap(), each);
        let same = vec![prefix.clone(), prefix.clone()];
        let one = alone(&mut b, &prefix, &[], n);
        assert_eq!(b.greedy_many(&same, n, &[]).unwrap(), vec![one.clone(), one]);
        assert!(b.greedy_many(&[vec![]], n, &[]).is_err(), "an empty prompt");
        assert!(b.greedy_many(&[vec![u32::MAX]], n, &[]).is_err(), "a token outside the vocabulary");
    }

    /// The streamed copy is exactly the file the GGUF writer makes of the
    /// same checkpoint with every BF16 tensor widened (tensors larger than a
    /// conversion chunk, odd lengths that need padding, a non-default
    /// alignment, other types left alone).
    #[test]
    fn widened_copy_is_the_f32_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        for align in [None, Some(64u32)] {
            let mut w = GgufWriter::new();
            w.set_meta("general.architecture", MetaValue::Str("llama".into()));
            if let Some(a) = align {
                w.set_meta("general.alignment", MetaValue::U32(a));
            }
            let bf16 = |n: usize, salt: u32| -> Vec<u8> {
                (0..n as u32).flat_map(|i| ((i.wrapping_mul(2_654_435_761) ^ salt) as u16).to_le_bytes()).collect()
            };
            let big = bf16(600 * 500, 1);
            let odd = bf16(7 * 3, 2);
            let f32s: Vec<u8> = (0..5u32).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
            w.add_tensor("big", GgmlType::BF16, &[600, 500], big.as_slice()).unwrap();
            w.add_tensor("odd", GgmlType::BF16, &[7, 3], odd.as_slice()).unwrap();
            w.add_tensor("plain", GgmlType::F32, &[5], f32s.as_slice()).unwrap();
            let src = dir.path().join("bf16.gguf");
            w.write_file(&src).unwrap();

            let widen = |b: &[u8]| -> Vec<u8> {
                b.chunks_exact(2)
                    .flat_map(|h| {
                        f32::from_bits(u32::from(u16::from_le_bytes([h[0], h[1]])) << 16).to_bits().to_le_bytes()
                    })
                    .collect()
            };
            let mut e = GgufWriter::new();
            for (k, v) in w.metadata() {
                e.set_meta(k, v.clone());
            }
            e.add_tensor("big", GgmlType::F32, &[600, 500], widen(&big)).unwrap();
            e.add_tensor("odd", GgmlType::F32, &[7, 3], widen(&odd)).unwrap();
            e.add_tensor("plain", GgmlType::F32, &[5], f32s.as_slice()).unwrap();
            let expected = e.to_bytes().unwrap();

            let tmp = widen_bf16_to_f32(&src).unwrap().expect("a BF16 file is widened");
            let got = std::fs::read(&tmp.0).unwrap();
            assert!(got == expected, "widened copy differs (alignment {align:?})");
            gguf::parse_header(&got).unwrap();
            let path = tmp.0.clone();
            drop(tmp);
            assert!(!path.exists(), "the copy is removed on drop");
        }
        // A checkpoint without BF16 tensors is loaded as it is.
        let mut w = GgufWriter::new();
        w.add_tensor("plain", GgmlType::F32, &[2], [0u8; 8].as_slice()).unwrap();
        let src = dir.path().join("f32.gguf");
        w.write_file(&src).unwrap();
        assert!(widen_bf16_to_f32(&src).unwrap().is_none());
    }
}
