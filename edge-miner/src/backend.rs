//! The generation-backend interface: what a miner asks of an inference engine
//! (llama.cpp today, wgpu later) and what it gets back.
//!
//! ## Positions, tokens and sketches
//! A rollout's `tokens` are the prompt's `P` ids followed by the completion's
//! ids. `sketches[i]` is the sketch of the post-final-norm hidden state at
//! position `i`, i.e. the state computed from `tokens[0..=i]` (the state that
//! predicts `tokens[i+1]`), for every `i` in `0..tokens.len()`: what a
//! teacher-forced forward over `tokens` returns at row `i`. The completion
//! token at absolute position `pos` is drawn from the logits of the state at
//! `pos - 1` with the uniform `u = draw(rollout, pos)`, and `logprobs[j]` is its
//! raw (temperature 1) log-probability, `j = pos - P`.

use tributary_protocol::prf::Seed;
use tributary_protocol::sampling::{self, Sampled};
use tributary_protocol::sketch::{self, SketchKey, SketchParams};

/// What can go wrong generating.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The inference engine could not be initialised.
    #[error("backend initialisation: {0}")]
    Init(String),
    /// The model could not be loaded.
    #[error("loading model: {0}")]
    Load(String),
    /// A bad configuration value (threads, layers).
    #[error("configuration: {0}")]
    Config(String),
    /// The engine could not create an inference context.
    #[error("creating context: {0}")]
    Context(String),
    /// A forward pass failed.
    #[error("decode: {0}")]
    Decode(String),
    /// The request cannot be served (empty prompt, id outside the vocabulary...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl From<llama_cpp_2::DecodeError> for BackendError {
    fn from(e: llama_cpp_2::DecodeError) -> Self {
        Self::Decode(e.to_string())
    }
}

impl From<llama_cpp_2::llama_batch::BatchAddError> for BackendError {
    fn from(e: llama_cpp_2::llama_batch::BatchAddError) -> Self {
        Self::Decode(e.to_string())
    }
}

/// The inputs of the protocol's per-position uniform draw
/// ([`tributary_protocol::sampling::draw_u`]) other than rollout and position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawKey {
    /// The window's sampling seed.
    pub sampling_seed: Seed,
    /// The miner's public key.
    pub miner: [u8; 32],
    /// The group's index within the miner's window.
    pub group: u32,
}

impl DrawKey {
    /// `u` for rollout `rollout` of the group at absolute position `position`.
    pub fn draw(&self, rollout: u32, position: u32) -> f64 {
        sampling::draw_u(&self.sampling_seed, &self.miner, self.group, rollout, position)
    }
}

/// One group to generate: `group_size` rollouts of one prompt, decoded together.
pub struct GroupRequest<'a> {
    /// Prompt token ids (ChatML-rendered and tokenized).
    pub prompt: &'a [u32],
    /// Rollouts in the group (G).
    pub group_size: usize,
    /// Most completion tokens per rollout (the end-of-generation token counts).
    pub max_new_tokens: usize,
    /// Sampling temperature; `0` means greedy (first maximal logit).
    pub temperature: f32,
    /// Inputs of the seeded uniform draw for each (rollout, position).
    pub draw: DrawKey,
    /// The window's sketch coefficients (one per hidden dimension).
    pub sketch_key: &'a SketchKey,
    /// Sketch parameters.
    pub sketch_params: SketchParams,
    /// End-of-generation ids: a rollout stops after sampling one (it is kept).
    pub eog: &'a [u32],
}

impl std::fmt::Debug for GroupRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRequest")
            .field("prompt_len", &self.prompt.len())
            .field("group_size", &self.group_size)
            .field("max_new_tokens", &self.max_new_tokens)
            .field("temperature", &self.temperature)
            .field("draw", &self.draw)
            .field("sketch_params", &self.sketch_params)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl GroupRequest<'_> {
    /// Checks the request's shape.
    pub fn validate(&self) -> Result<(), BackendError> {
        if self.prompt.is_empty() {
            return Err(BackendError::InvalidRequest("empty prompt".into()));
        }
        if self.group_size == 0 {
            return Err(BackendError::InvalidRequest("group of 0 rollouts".into()));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(BackendError::InvalidRequest(format!("temperature {}", self.temperature)));
        }
        let total = self.prompt.len().saturating_add(self.max_new_tokens);
        if u32::try_from(total).is_err() || u32::try_from(self.group_size).is_err() {
            return Err(BackendError::InvalidRequest(format!("{total} positions × {} rollouts", self.group_size)));
        }
        self.sketch_params.validate().map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        Ok(())
    }

    /// Checks the request against a model of context `context` and hidden
    /// width `d_model`.
    pub fn check_model(&self, context: usize, d_model: usize) -> Result<(), BackendError> {
        let per_seq = self.prompt.len() + self.max_new_tokens;
        if per_seq > context {
            return Err(BackendError::InvalidRequest(format!(
                "prompt {} + max_new_tokens {} exceeds the model's context {context}",
                self.prompt.len(),
                self.max_new_tokens
            )));
        }
        if self.sketch_key.dim() != d_model {
            return Err(BackendError::InvalidRequest(format!(
                "sketch key for {} dimensions, model has {d_model}",
                self.sketch_key.dim()
            )));
        }
        Ok(())
    }

    /// The sketch of one hidden state.
    pub fn sketch(&self, h: &[f32]) -> Result<u32, BackendError> {
        sketch::sketch(h, self.sketch_key, &self.sketch_params).map_err(|e| BackendError::Decode(e.to_string()))
    }

    /// Whether `token` ends a rollout.
    pub fn is_eog(&self, token: u32) -> bool {
        self.eog.contains(&token)
    }

    /// Draws rollout `rollout`'s token at absolute position `pos` from `logits`
    /// (the row of the state at `pos - 1`), with its raw log-probability.
    /// `validate` bounds both indices by `u32::MAX`.
    pub fn choose(&self, logits: &[f32], rollout: usize, pos: usize) -> Sampled {
        let u = self.draw.draw(rollout as u32, pos as u32);
        sampling::sample_with_logprob(logits, self.temperature, u)
    }
}

/// One generated rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedSeq {
    /// Completion ids (the end-of-generation token included when sampled).
    pub completion: Vec<u32>,
    /// Raw (T = 1) log-probability of each completion token.
    pub logprobs: Vec<f32>,
    /// One sketch per position, prompt first: `prompt.len() + completion.len()` entries.
    pub sketches: Vec<u32>,
}

/// An inference engine that generates groups.
pub trait Backend {
    /// Generates `req.group_size` rollouts of `req.prompt`, all decoded together.
    fn generate_group(&mut self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError>;

    /// Width of the hidden state that is sketched.
    fn hidden_size(&self) -> usize;

    /// Vocabulary size.
    fn vocab_size(&self) -> usize;
}

/// Per-sequence bookkeeping of a group being generated, shared by every
/// backend so they follow one schedule: a sampled token stays pending until it
/// is fed back (its hidden state is the next sketch), and the sequence ends on
/// an end-of-generation token or at the length limit.
pub(crate) struct SeqState {
    pub(crate) completion: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    /// Sketches of the completion positions (the prompt's come first in the output).
    pub(crate) sketches: Vec<u32>,
    /// Token sampled but not yet fed to the model.
    pub(crate) pending: Option<u32>,
    pub(crate) finished: bool,
}

impl SeqState {
    /// A sequence whose first completion token is `first` (drawn from the
    /// prompt's last logits).
    pub(crate) fn start(first: Sampled, req: &GroupRequest<'_>) -> Self {
        let mut st = Self {
            completion: Vec::with_capacity(req.max_new_tokens),
            logprobs: Vec::with_capacity(req.max_new_tokens),
            sketches: Vec::with_capacity(req.max_new_tokens),
            pending: None,
            finished: req.max_new_tokens == 0,
        };
        if !st.finished {
            st.push(first, req);
        }
        st
    }

    /// Appends a sampled token.
    pub(crate) fn push(&mut self, choice: Sampled, req: &GroupRequest<'_>) {
        self.completion.push(choice.token);
        self.logprobs.push(choice.logprob_t1);
        self.pending = Some(choice.token);
        self.finished = req.is_eog(choice.token) || self.completion.len() >= req.max_new_tokens;
    }

    /// The finished sequence, the prompt's sketches first.
    pub(crate) fn finish(self, prompt_sketches: &[u32]) -> GeneratedSeq {
        let mut sketches = Vec::with_capacity(prompt_sketches.len() + self.sketches.len());
        sketches.extend_from_slice(prompt_sketches);
        sketches.extend(self.sketches);
        GeneratedSeq { completion: self.completion, logprobs: self.logprobs, sketches }
    }
}
