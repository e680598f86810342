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
mod packed;

pub use evidence::{EvidenceRequest, SequenceEvidence};
pub use model::{ForwardOutput, KvCache, ROPE_FREQS, ReferenceModel, check_tokens, pad_batch, tensor_shapes};
pub use packed::{MIN_SHARED_PREFIX, PackedLayout, PrefixCache, common_prefix_len, packing_pays};
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

/// Where a role runs libtorch, as an operator writes it (`--device`, the
/// `device` config key): `cpu`, `cuda` (the first GPU), `cuda:N`, or `auto`
/// (the first GPU when libtorch sees one, else the CPU).
///
/// Matmuls stay f32 on every device: libtorch leaves TF32 off for matmuls by
/// default, and nothing here turns it on, because the proof's tolerances are
/// calibrated for f32 (docs/calibration.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The first GPU when libtorch sees one, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// GPU number N.
    Cuda(usize),
}

/// A `--device` value that is not `cpu`, `cuda`, `cuda:N` or `auto`, or a GPU
/// libtorch does not see.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    /// Not a device name.
    #[error("device `{0}`: expected cpu, cuda, cuda:N or auto")]
    Unknown(String),
    /// The GPU asked for is not there (or libtorch was built without CUDA).
    #[error(
        "device cuda:{asked}: libtorch sees {found} CUDA device(s) (a GPU needs the CUDA torch wheel and binaries built with --features tributary-policy/cuda: docs/runbook.md)"
    )]
    NoCuda {
        /// The ordinal asked for.
        asked: usize,
        /// How many libtorch sees.
        found: usize,
    },
}

impl std::str::FromStr for DeviceSpec {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, DeviceError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| DeviceError::Unknown(s.to_owned())),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl DeviceSpec {
    /// The libtorch device, checked against the GPUs libtorch sees.
    pub fn resolve(self) -> Result<tch::Device, DeviceError> {
        self.resolve_with(tch::Cuda::device_count().max(0) as usize)
    }

    /// [`DeviceSpec::resolve`] given `cuda_devices` GPUs.
    fn resolve_with(self, cuda_devices: usize) -> Result<tch::Device, DeviceError> {
        match self {
            DeviceSpec::Cpu => Ok(tch::Device::Cpu),
            DeviceSpec::Auto if cuda_devices > 0 => Ok(tch::Device::Cuda(0)),
            DeviceSpec::Auto => Ok(tch::Device::Cpu),
            DeviceSpec::Cuda(n) if n < cuda_devices => Ok(tch::Device::Cuda(n)),
            DeviceSpec::Cuda(asked) => Err(DeviceError::NoCuda { asked, found: cuda_devices }),
        }
    }
}

/// Sets libtorch's intra-op thread count to the cores available to this
/// process (or to `threads` if given) and returns the count used.
pub fn init_threads(threads: Option<usize>) -> usize {
    let n = threads.filter(|&n| n > 0).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    tch::set_num_threads(i32::try_from(n).unwrap_or(i32::MAX));
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_resolve() {
        for (text, spec) in [
            ("auto", DeviceSpec::Auto),
            ("cpu", DeviceSpec::Cpu),
            ("CPU", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(0)),
            ("cuda:3", DeviceSpec::Cuda(3)),
        ] {
            assert_eq!(text.parse::<DeviceSpec>(), Ok(spec), "{text}");
        }
        for bad in ["", "cuda:", "cuda:x", "mps", "cuda:-1"] {
            assert!(matches!(bad.parse::<DeviceSpec>(), Err(DeviceError::Unknown(_))), "{bad}");
        }
        assert_eq!(DeviceSpec::Cuda(2).to_string().parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(2)));
        assert_eq!(DeviceSpec::Auto.resolve_with(0), Ok(tch::Device::Cpu));
        assert_eq!(DeviceSpec::Auto.resolve_with(2), Ok(tch::Device::Cuda(0)));
        assert_eq!(DeviceSpec::Cuda(1).resolve_with(2), Ok(tch::Device::Cuda(1)));
        assert_eq!(DeviceSpec::Cuda(2).resolve_with(2), Err(DeviceError::NoCuda { asked: 2, found: 2 }));
        assert_eq!(DeviceSpec::Cpu.resolve_with(0), Ok(tch::Device::Cpu));
        // This machine's libtorch: a GPU asked for and absent is a typed error, never a silent CPU.
        let found = tch::Cuda::device_count().max(0) as usize;
        if found == 0 {
            assert_eq!(DeviceSpec::Cuda(0).resolve(), Err(DeviceError::NoCuda { asked: 0, found: 0 }));
            assert_eq!(DeviceSpec::Auto.resolve(), Ok(tch::Device::Cpu));
        }
    }
}
