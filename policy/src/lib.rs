//! The libtorch (`tch`) reference model shared by the validator and the trainer.
//!
//! - [`ReferenceModel`]: a Llama-architecture transformer (SmolLM2) whose
//!   parameters are named after the GGUF tensors in a `tch` VarStore; a
//!   batched, differentiable teacher-forced forward returning post-norm hidden
//!   states and logits, reproducing llama.cpp's `llama` graph.
//! - [`ReferenceModel::evidence`]: the per-position figures the validator's
//!   checks need (hidden rows, log-probabilities, CDF intervals, EOS
//!   probability), reduced on the device.
//!
//! Compute is f32 on CUDA when available, else CPU (the same code).
#![deny(missing_docs)]

mod evidence;
mod model;

pub use evidence::{EvidenceRequest, SequenceEvidence};
pub use model::{ForwardOutput, ReferenceModel, check_tokens, pad_batch, tensor_shapes};
pub use tributary_protocol::checkpoint::ModelConfig;

/// Errors of the reference model.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The checkpoint could not be read.
    #[error("checkpoint: {0}")]
    Checkpoint(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The hyperparameters are unusable.
    #[error("invalid model config: {0}")]
    Config(String),
    /// A tensor the architecture needs is missing.
    #[error("checkpoint has no tensor {0}")]
    MissingTensor(String),
    /// A tensor has the wrong number of elements.
    #[error("tensor {name}: expected shape {expected:?}, found {found} elements")]
    TensorShape {
        /// GGUF tensor name.
        name: String,
        /// Expected torch-order shape.
        expected: Vec<i64>,
        /// Elements found.
        found: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("token id {id}{} is outside the vocabulary of {vocab}", .index.map(|i| format!(" at index {i}")).unwrap_or_default())]
    TokenOutOfRange {
        /// The offending id.
        id: i64,
        /// Its index in the sequence, when known.
        index: Option<usize>,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A sequence is longer than the model's context.
    #[error("sequence of {len} tokens exceeds the context length {max}")]
    TooLong {
        /// Sequence length.
        len: usize,
        /// Context length.
        max: usize,
    },
    /// A malformed request (shapes, lengths, parameters).
    #[error("bad request: {0}")]
    Request(String),
    /// libtorch reported an error (including out-of-memory).
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
}

/// The device the reference model runs on: CUDA when libtorch sees a GPU,
/// else CPU.
pub fn default_device() -> tch::Device {
    tch::Device::cuda_if_available()
}

/// Sets libtorch's intra-op thread count to the cores available to this
/// process (or to `threads` if given) and returns the count used.
pub fn init_threads(threads: Option<usize>) -> usize {
    let n = threads.filter(|&n| n > 0).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    tch::set_num_threads(i32::try_from(n).unwrap_or(i32::MAX));
    n
}
