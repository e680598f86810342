//! Checkpoints: GGUF files of the `llama`, `qwen2` or `qwen3` architecture
//! ([`Arch`], read from `general.architecture`) that llama.cpp loads natively,
//! with BF16 (or F32) weight matrices and F32 norms and biases, carrying the
//! tokenizer and chat template. This module opens and validates them, dequantizes
//! tensors, computes the [`ContentId`] every role agrees on, and converts a
//! quantized file into the BF16 base checkpoint.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::gguf::{self, GgmlType, GgufError, GgufHeader, GgufWriter, MetaValue, TensorInfo};
use crate::quant::{self, QuantError};

/// `general.file_type` value for "mostly BF16" (`LLAMA_FTYPE_MOSTLY_BF16`).
pub const FILE_TYPE_MOSTLY_BF16: u32 = 32;
/// Domain string that starts the content-id serialisation.
pub const CONTENT_ID_DOMAIN: &[u8] = crate::domain::context::CONTENT_ID.as_bytes();

/// Errors from opening, reading or writing checkpoints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("I/O on {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The GGUF container is malformed.
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
    /// `general.architecture` is missing or names a family the project
    /// does not run (see [`Arch`]).
    #[error("architecture {0:?} is not supported (supported: llama, qwen2, qwen3)")]
    UnknownArchitecture(Option<String>),
    /// A required metadata key is missing or has the wrong type.
    #[error("metadata key {0:?} missing or of the wrong type")]
    MissingKey(String),
    /// The file asks for something the project does not compute (a RoPE
    /// scaling type, partial rotary, an attention scale, experts, ...).
    #[error("unsupported model setting: {0}")]
    Unsupported(String),
    /// A tensor the architecture does not use (llama.cpp might, so running
    /// without it would silently compute another model).
    #[error("tensor {0:?} is not part of the architecture")]
    UnexpectedTensor(String),
    /// Hyperparameters are inconsistent or out of range.
    #[error("invalid config: {0}")]
    BadConfig(String),
    /// A required tensor is missing.
    #[error("tensor {0:?} missing")]
    MissingTensor(String),
    /// A tensor has the wrong shape for the config.
    #[error("tensor {name:?} has dims {got:?}, expected {expected:?}")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Expected dims (ggml order).
        expected: Vec<u64>,
        /// Found dims.
        got: Vec<u64>,
    },
    /// A tensor cannot be dequantized.
    #[error("tensor {name:?}: {source}")]
    Quant {
        /// Tensor name.
        name: String,
        /// The cause.
        source: QuantError,
    },
}

impl CheckpointError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        CheckpointError::Io { path: path.display().to_string(), source }
    }
}

/// A model family the project runs, named by GGUF `general.architecture`.
/// Every role reads it from the checkpoint; nothing assumes one family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// `llama`: SmolLM2, Llama 2/3.x. Adjacent-pair RoPE (Q/K rows permuted by
    /// the converter), optional `rope_freqs` (Llama 3 frequency scaling).
    #[default]
    Llama,
    /// `qwen2`: Qwen2/Qwen2.5. Q/K/V biases, NEOX (split-half) RoPE.
    Qwen2,
    /// `qwen3`: Qwen3 (dense). Per-head q/k RMSNorm, NEOX RoPE, a head size
    /// (`key_length`) independent of the width.
    Qwen3,
}

impl Arch {
    /// Every architecture the project supports.
    pub const ALL: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

    /// The `general.architecture` value (also the prefix of its metadata keys).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    /// The architecture named `name`, if supported.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether RoPE rotates the two halves of a head (`x[i]`, `x[i + hd/2]`),
    /// llama.cpp's `LLAMA_ROPE_TYPE_NEOX` (qwen2, qwen3), rather than adjacent
    /// pairs (`LLAMA_ROPE_TYPE_NORM`, llama).
    pub fn rope_neox(self) -> bool {
        matches!(self, Arch::Qwen2 | Arch::Qwen3)
    }

    /// Whether queries and keys are RMS-normalised per head before RoPE
    /// (`attn_q_norm`, `attn_k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3)
    }

    /// Whether Q/K/V biases are required (qwen2); other families may carry
    /// them (llama.cpp loads them when present) but need not.
    pub fn requires_qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2)
    }

    /// Whether a `rope_freqs.weight` tensor (per-pair frequency divisors) is
    /// read: llama.cpp's `llama` graph uses it, the qwen graphs do not.
    pub fn reads_rope_freqs(self) -> bool {
        matches!(self, Arch::Llama)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = CheckpointError;
    fn from_str(s: &str) -> Result<Self, CheckpointError> {
        Arch::from_name(s).ok_or_else(|| CheckpointError::UnknownArchitecture(Some(s.to_owned())))
    }
}

/// Hyperparameters of a checkpoint, read from its GGUF metadata
/// (`<arch>.*` keys) and tensor list.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// Number of transformer blocks (`<arch>.block_count`).
    pub n_layer: usize,
    /// Residual width (`<arch>.embedding_length`).
    pub d_model: usize,
    /// Query heads (`<arch>.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`<arch>.attention.head_count_kv`, default `n_head`).
    pub n_head_kv: usize,
    /// MLP hidden width (`<arch>.feed_forward_length`).
    pub d_ff: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub vocab_size: usize,
    /// RMSNorm epsilon (`<arch>.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// RoPE base (`<arch>.rope.freq_base`, default 10000).
    pub rope_theta: f32,
    /// Training context length (`<arch>.context_length`).
    pub context_length: usize,
    /// The model family (`general.architecture`).
    #[serde(default, skip_serializing_if = "is_llama")]
    pub arch: Arch,
    /// Per-head size when the file gives it (`<arch>.attention.key_length`);
    /// otherwise `d_model / n_head`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_length: Option<usize>,
    /// Whether the blocks carry Q/K/V biases (`blk.N.attn_{q,k,v}.bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qkv_bias: bool,
    /// Whether RoPE frequencies are divided by the `rope_freqs.weight`
    /// factors (Llama 3's frequency scaling, as llama.cpp's converter writes it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub rope_freqs: bool,
}

fn is_llama(a: &Arch) -> bool {
    *a == Arch::Llama
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ModelConfig {
    /// Per-head width: `key_length` when given, else `d_model / n_head`.
    pub fn head_dim(&self) -> usize {
        self.key_length.unwrap_or(self.d_model / self.n_head.max(1))
    }

    /// Width of all query heads, `n_head · head_dim` (rows of `attn_q`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim()
    }

    /// Width of all key (or value) heads, `n_head_kv · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim()
    }

    /// Read and check the config from a header (looks at tensor names and
    /// the embedding's shape, not at tensor data). An architecture outside
    /// [`Arch::ALL`], a missing key, or a setting the project does not
    /// compute (partial rotary, an attention scale, RoPE scaling types other
    /// than Llama 3's `rope_freqs`, experts) is a typed error.
    pub fn from_header(h: &GgufHeader) -> Result<Self, CheckpointError> {
        let arch_name = h.get_str("general.architecture");
        let arch = arch_name
            .and_then(Arch::from_name)
            .ok_or_else(|| CheckpointError::UnknownArchitecture(arch_name.map(str::to_owned)))?;
        let p = arch.name();
        let key = |s: &str| format!("{p}.{s}");
        let req = |k: String| -> Result<usize, CheckpointError> {
            h.get_u64(&k).and_then(|v| usize::try_from(v).ok()).ok_or(CheckpointError::MissingKey(k))
        };
        let opt = |k: String| -> Result<Option<usize>, CheckpointError> {
            match h.get(&k) {
                None => Ok(None),
                Some(_) => req(k).map(Some),
            }
        };
        let n_layer = req(key("block_count"))?;
        let d_model = req(key("embedding_length"))?;
        let n_head = req(key("attention.head_count"))?;
        let n_head_kv = opt(key("attention.head_count_kv"))?.unwrap_or(n_head);
        let d_ff = req(key("feed_forward_length"))?;
        let context_length = req(key("context_length"))?;
        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = h.get_f32(&eps_key).ok_or(CheckpointError::MissingKey(eps_key))?;
        let theta_key = key("rope.freq_base");
        let rope_theta = match h.get(&theta_key) {
            None => 10_000.0,
            Some(v) => v.as_f32().ok_or(CheckpointError::MissingKey(theta_key))?,
        };
        let key_length = opt(key("attention.key_length"))?;
        let emb =
            h.tensor("token_embd.weight").ok_or_else(|| CheckpointError::MissingTensor("token_embd.weight".into()))?;
        let vocab_size = match emb.dims.as_slice() {
            [_, v] => usize::try_from(*v).map_err(|_| CheckpointError::BadConfig("vocab too large".into()))?,
            _ => {
                return Err(CheckpointError::BadShape {
                    name: emb.name.clone(),
                    expected: vec![d_model as u64, 0],
                    got: emb.dims.clone(),
                });
            }
        };
        let bad = |m: String| Err(CheckpointError::BadConfig(m));
        if n_layer == 0 || d_model == 0 || n_head == 0 || n_head_kv == 0 || d_ff == 0 || vocab_size == 0 {
            return bad(format!(
                "zero size in n_layer={n_layer} d_model={d_model} n_head={n_head} n_head_kv={n_head_kv} d_ff={d_ff} vocab={vocab_size}"
            ));
        }
        let head_dim = match key_length {
            Some(k) => k,
            None if d_model.is_multiple_of(n_head) => d_model / n_head,
            None => return bad(format!("heads do not divide: d_model={d_model} n_head={n_head}")),
        };
        if !n_head.is_multiple_of(n_head_kv) || head_dim == 0 || !head_dim.is_multiple_of(2) {
            return bad(format!("heads do not divide: n_head={n_head} n_head_kv={n_head_kv} head_dim={head_dim}"));
        }
        if n_head.checked_mul(head_dim).is_none_or(|q| q > 1 << 24) {
            return bad(format!("n_head={n_head} x head_dim={head_dim} too large"));
        }
        let positive = |x: f32| x.is_finite() && x > 0.0;
        if !positive(rms_eps) || !positive(rope_theta) {
            return bad(format!("rms_eps={rms_eps} rope_theta={rope_theta}"));
        }
        if let Some(v) = h.get_u64(&key("vocab_size"))
            && v != vocab_size as u64
        {
            return bad(format!("{p}.vocab_size={v} but token_embd has {vocab_size} rows"));
        }
        let unsupported = |m: String| Err(CheckpointError::Unsupported(m));
        if let Some(v) = opt(key("attention.value_length"))?
            && v != head_dim
        {
            return unsupported(format!("{p}.attention.value_length={v} differs from the head size {head_dim}"));
        }
        if let Some(n) = opt(key("rope.dimension_count"))?
            && n != head_dim
        {
            return unsupported(format!("partial rotary: {p}.rope.dimension_count={n}, head size {head_dim}"));
        }
        if let Some(t) = h.get(&key("rope.scaling.type"))
            && t.as_str() != Some("none")
        {
            return unsupported(format!("{p}.rope.scaling.type={t:?} (only Llama 3's rope_freqs tensor is supported)"));
        }
        for k in ["rope.scaling.factor", "rope.scale_linear", "attention.scale", "logit_scale", "expert_count"] {
            let k = key(k);
            if let Some(v) = h.get(&k) {
                let neutral = match k.rsplit('.').next() {
                    Some("expert_count") => v.as_u64() == Some(0),
                    Some("scale") if k.ends_with("attention.scale") => v.as_f32() == Some(0.0),
                    _ => v.as_f32() == Some(1.0),
                };
                if !neutral {
                    return unsupported(format!("{k}={v:?}"));
                }
            }
        }
        let qkv_bias = h.tensor("blk.0.attn_q.bias").is_some();
        if arch.requires_qkv_bias() && !qkv_bias {
            return Err(CheckpointError::MissingTensor("blk.0.attn_q.bias".into()));
        }
        let rope_freqs = arch.reads_rope_freqs() && h.tensor("rope_freqs.weight").is_some();
        Ok(ModelConfig {
            n_layer,
            d_model,
            n_head,
            n_head_kv,
            d_ff,
            vocab_size,
            rms_eps,
            rope_theta,
            context_length,
            arch,
            key_length,
            qkv_bias,
            rope_freqs,
        })
    }

    /// Every tensor a checkpoint of this config must hold, with its dims in
    /// ggml order (`[in, out]` for matrices). `output.weight` is optional
    /// (absent when the LM head is tied to the embedding) and not listed;
    /// a checkpoint holding any other tensor is refused.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (d, ff) = (self.d_model as u64, self.d_ff as u64);
        let (q, kv, hd) = (self.q_dim() as u64, self.kv_dim() as u64, self.head_dim() as u64);
        let mut v = vec![
            ("token_embd.weight".to_owned(), vec![d, self.vocab_size as u64]),
            ("output_norm.weight".to_owned(), vec![d]),
        ];
        for i in 0..self.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            v.push((p("attn_norm"), vec![d]));
            v.push((p("attn_q"), vec![d, q]));
            v.push((p("attn_k"), vec![d, kv]));
            v.push((p("attn_v"), vec![d, kv]));
            v.push((p("attn_output"), vec![q, d]));
            v.push((p("ffn_norm"), vec![d]));
            v.push((p("ffn_gate"), vec![d, ff]));
            v.push((p("ffn_up"), vec![d, ff]));
            v.push((p("ffn_down"), vec![ff, d]));
            if self.qkv_bias {
                let b = |s: &str| format!("blk.{i}.{s}.bias");
                v.push((b("attn_q"), vec![q]));
                v.push((b("attn_k"), vec![kv]));
                v.push((b("attn_v"), vec![kv]));
            }
            if self.arch.qk_norm() {
                v.push((p("attn_q_norm"), vec![hd]));
                v.push((p("attn_k_norm"), vec![hd]));
            }
        }
        if self.rope_freqs {
            v.push(("rope_freqs.weight".to_owned(), vec![hd / 2]));
        }
        v
    }
}

/// A checkpoint's content id: blake3 of its canonical serialisation.
///
/// Definition (all integers little-endian; `str(s)` = `u64` byte length then
/// UTF-8 bytes; `value(v)` = GGUF value type id as `u32` then the GGUF value
/// encoding, arrays as element type `u32`, count `u64`, elements):
///
/// ```text
/// blake3(
///   str("tributary/checkpoint/v1")
///   u64 M, then M times, keys sorted by byte order:  str(key) value(v)
///   u64 T, then T times, tensors sorted by name:     str(name) u32 ggml_type u32 n_dims
///                                                    u64 dims[n_dims] u64 n_bytes bytes[n_bytes]
/// )
/// ```
///
/// The metadata included is exactly the keys that change what the model
/// computes or how text maps to tokens: `general.architecture`, every key
/// starting with the architecture's name and a dot (`llama.`, `qwen2.`, ...)
/// and every key starting with `tokenizer.` (model, pre,
/// tokens, merges, token_type, bos/eos/unk/pad ids, add_bos flags, chat
/// template, ...). Everything else (`general.name`, `general.file_type`,
/// `general.alignment`, licences, ...) is ignored, as are metadata order,
/// tensor order and alignment padding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ContentId(pub [u8; 32]);

impl fmt::Display for ContentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ContentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// A content id string was not 64 hex digits.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("content id must be 64 hex digits")]
pub struct ParseContentIdError;

impl FromStr for ContentId {
    type Err = ParseContentIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| ParseContentIdError)?;
        Ok(ContentId(out))
    }
}

/// Whether a metadata key takes part in the [`ContentId`] of a file whose
/// `general.architecture` is `arch` (its `<arch>.` keys, `tokenizer.*` and the
/// architecture itself).
pub fn key_in_content_id(key: &str, arch: Option<&str>) -> bool {
    key == "general.architecture"
        || key.starts_with("tokenizer.")
        || arch.and_then(|a| key.strip_prefix(a)).is_some_and(|rest| rest.starts_with('.'))
}

/// Content id of a GGUF file, memory-mapped rather than read into memory
/// (any well-formed GGUF; the model's configuration is not checked).
pub fn file_content_id(path: &Path) -> Result<ContentId, CheckpointError> {
    let f = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
    // SAFETY: the project never writes checkpoint files in place (writers
    // create a temporary file and rename it), and this map lives only for
    // the hash.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| CheckpointError::io(path, e))?;
    let header = gguf::parse_header(&map)?;
    Ok(content_id_of(&header, &map))
}

/// Compute the [`ContentId`] of a parsed GGUF held in `bytes` (see
/// [`ContentId`] for the definition). `header` must come from
/// [`gguf::parse_header`] on the same `bytes`.
pub fn content_id_of(header: &GgufHeader, bytes: &[u8]) -> ContentId {
    let mut h = blake3::Hasher::new();
    let put_str = |h: &mut blake3::Hasher, s: &[u8]| {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s);
    };
    put_str(&mut h, CONTENT_ID_DOMAIN);

    let arch = header.get_str("general.architecture");
    let mut meta: Vec<&(String, MetaValue)> =
        header.metadata.iter().filter(|(k, _)| key_in_content_id(k, arch)).collect();
    meta.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut buf = Vec::with_capacity(1 << 16);
    buf.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        gguf::encode_kv(&mut buf, k, v);
    }
    h.update(&buf);

    let mut tensors: Vec<&TensorInfo> = header.tensors.iter().collect();
    tensors.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    h.update(&(tensors.len() as u64).to_le_bytes());
    for t in tensors {
        put_str(&mut h, t.name.as_bytes());
        h.update(&t.ty.id().to_le_bytes());
        h.update(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            h.update(&d.to_le_bytes());
        }
        // parse_header validated every range against the buffer.
        let data = bytes.get(header.tensor_range(t)).unwrap_or(&[]);
        h.update(&(data.len() as u64).to_le_bytes());
        h.update(data);
    }
    ContentId(*h.finalize().as_bytes())
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An opened, validated checkpoint: the file's bytes (memory-mapped or
/// owned), its parsed header and its config.
pub struct Checkpoint {
    storage: Storage,
    header: GgufHeader,
    config: ModelConfig,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("bytes", &self.bytes().len())
            .field("tensors", &self.header.tensors.len())
            .field("config", &self.config)
            .finish()
    }
}

impl Checkpoint {
    /// Memory-map and validate a checkpoint file.
    ///
    /// The file must not be modified while the checkpoint is open (files are
    /// only ever replaced by rename, never written in place).
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let f = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        // SAFETY: the map is read-only; the project never writes checkpoint
        // files in place (writers create a temp file and rename it), so the
        // mapped bytes do not change underneath us.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| CheckpointError::io(path, e))?;
        Self::from_storage(Storage::Mmap(map))
    }

    /// Validate a checkpoint held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, CheckpointError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Self, CheckpointError> {
        let header = gguf::parse_header(storage.bytes())?;
        let config = ModelConfig::from_header(&header)?;
        let expected = config.expected_tensors();
        for (name, dims) in &expected {
            let t = header.tensor(name).ok_or_else(|| CheckpointError::MissingTensor(name.clone()))?;
            if t.dims != *dims {
                return Err(CheckpointError::BadShape {
                    name: name.clone(),
                    expected: dims.clone(),
                    got: t.dims.clone(),
                });
            }
        }
        if expected.len() + usize::from(header.tensor("output.weight").is_some()) != header.tensors.len() {
            let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
            if let Some(t) =
                header.tensors.iter().find(|t| t.name != "output.weight" && !known.contains(t.name.as_str()))
            {
                return Err(CheckpointError::UnexpectedTensor(t.name.clone()));
            }
        }
        if let Some(t) = header.tensor("output.weight") {
            let dims = vec![config.d_model as u64, config.vocab_size as u64];
            if t.dims != dims {
                return Err(CheckpointError::BadShape { name: t.name.clone(), expected: dims, got: t.dims.clone() });
            }
        }
        Ok(Checkpoint { storage, header, config })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// The hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The parsed GGUF header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The content id (see [`ContentId`]). Hashes every tensor byte, so
    /// cache it if needed often.
    pub fn content_id(&self) -> ContentId {
        content_id_of(&self.header, self.bytes())
    }

    /// Whether the LM head is tied to the embedding (no `output.weight`).
    pub fn tied_embeddings(&self) -> bool {
        self.header.tensor("output.weight").is_none()
    }

    /// A tensor's descriptor.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// A tensor's raw bytes.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.header.tensor(name)?;
        self.bytes().get(self.header.tensor_range(t))
    }

    /// A tensor dequantized to `f32`, in ggml order (row-major `[out][in]`
    /// for matrices). Supports F32, F16, BF16, Q4_0, Q4_1 and Q8_0.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        let t = self.header.tensor(name).ok_or_else(|| CheckpointError::MissingTensor(name.to_owned()))?;
        let bytes = self.bytes().get(self.header.tensor_range(t)).unwrap_or(&[]);
        let n = usize::try_from(t.n_elements()).unwrap_or(usize::MAX);
        quant::dequantize(t.ty, bytes, n).map_err(|source| CheckpointError::Quant { name: name.to_owned(), source })
    }
}

/// Convert `src` into a BF16 checkpoint at `out` (see [`convert_to_bf16_with_progress`]).
pub fn convert_to_bf16(src: &Checkpoint, out: &Path) -> Result<ContentId, CheckpointError> {
    convert_to_bf16_with_progress(src, out, |_, _| {})
}

/// Convert `src` into a BF16 checkpoint at `out`, written atomically.
///
/// All metadata is kept in order, except `general.file_type`, set to
/// [`FILE_TYPE_MOSTLY_BF16`]. Tensors keep their order and names;
/// 2-D+ tensors are dequantized and rounded to BF16 (nearest-even), 1-D
/// tensors (norms) become F32. A tied embedding stays tied. `progress(done,
/// total)` is called after each tensor. Returns the new file's content id.
pub fn convert_to_bf16_with_progress(
    src: &Checkpoint,
    out: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<ContentId, CheckpointError> {
    let mut w = GgufWriter::new();
    for (k, v) in &src.header.metadata {
        w.set_meta(k, v.clone());
    }
    w.set_meta("general.file_type", MetaValue::U32(FILE_TYPE_MOSTLY_BF16));
    let total = src.header.tensors.len();
    for (i, t) in src.header.tensors.iter().enumerate() {
        let (ty, data): (GgmlType, Cow<'_, [u8]>) = if t.dims.len() >= 2 {
            match t.ty {
                GgmlType::BF16 => (t.ty, Cow::Borrowed(src.tensor_bytes(&t.name).unwrap_or(&[]))),
                _ => (GgmlType::BF16, Cow::Owned(quant::f32_to_bf16_bytes(&src.tensor_f32(&t.name)?))),
            }
        } else {
            match t.ty {
                GgmlType::F32 => (t.ty, Cow::Borrowed(src.tensor_bytes(&t.name).unwrap_or(&[]))),
                _ => (GgmlType::F32, Cow::Owned(quant::f32_to_le_bytes(&src.tensor_f32(&t.name)?))),
            }
        };
        w.add_tensor(&t.name, ty, &t.dims, data)?;
        progress(i + 1, total);
    }
    w.write_file(out).map_err(|e| match e {
        GgufError::Io(io) => CheckpointError::io(out, io),
        other => CheckpointError::Gguf(other),
    })?;
    let written = Checkpoint::open(out)?;
    Ok(written.content_id())
}
