//! GGUF codec: a strict reader for untrusted files and a writer.
//!
//! GGUF is llama.cpp's model container: a little-endian header (magic
//! `GGUF`, version, tensor count, metadata count), typed key/value metadata,
//! tensor descriptors (name, `ne` dims, ggml type, offset relative to the data
//! section), padding to `general.alignment` (default 32), then tensor data.
//!
//! [`parse_header`] reads versions 2 and 3 and checks everything it can
//! against the length of the buffer before trusting it: counts are never used
//! to pre-allocate more than the remaining bytes could hold, strings may not
//! run past the end, dims may not overflow, every tensor's byte range must be
//! aligned, lie inside the buffer and not overlap another. Every failure is a
//! [`GgufError`]; nothing panics.
//!
//! [`GgufWriter`] writes version 3 with metadata in the order given and every
//! tensor's data aligned (and padded) to the alignment, in the order given, so
//! a file written the usual way (llama.cpp, `gguf-py`) is reproduced byte for
//! byte by reading it and writing it back.

use std::borrow::Cow;

mod read;
mod write;

pub use read::parse_header;
pub use write::GgufWriter;

pub(crate) use write::encode_kv;

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version the writer produces.
pub const GGUF_VERSION: u32 = 3;
/// Alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Metadata key that overrides the data alignment (a `u32`).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_DIMS`: tensors have at most this many dims.
pub const MAX_DIMS: usize = 4;
/// Nesting limit for arrays of arrays (llama.cpp itself rejects any nesting
/// it does not know; we allow a little and stop there).
pub const MAX_ARRAY_DEPTH: usize = 4;

/// Errors from reading or writing GGUF.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("bad magic {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {0}")]
    UnsupportedVersion(u32),
    /// The buffer ended while reading `what`.
    #[error("truncated: needed {needed} bytes for {what} at offset {offset}, {available} available")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where it started.
        offset: u64,
        /// Bytes it needed.
        needed: u64,
        /// Bytes left in the buffer.
        available: u64,
    },
    /// A count claims more items than the remaining bytes could hold.
    #[error("{what} count {count} cannot fit in the {remaining} remaining bytes")]
    CountTooLarge {
        /// What was counted.
        what: &'static str,
        /// The claimed count.
        count: u64,
        /// Bytes left in the buffer.
        remaining: u64,
    },
    /// A string is not UTF-8.
    #[error("string at offset {0} is not valid UTF-8")]
    InvalidUtf8(u64),
    /// A bool byte other than 0 or 1.
    #[error("bool at offset {offset} has byte {value}, expected 0 or 1")]
    InvalidBool {
        /// Where it is.
        offset: u64,
        /// The byte found.
        value: u8,
    },
    /// Unknown metadata value type id.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("metadata arrays nested deeper than {MAX_ARRAY_DEPTH}")]
    ArrayTooDeep,
    /// The same metadata key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// `general.alignment` is not a non-zero power of two `u32`.
    #[error("invalid alignment {0}")]
    BadAlignment(u64),
    /// Unknown (or unsupported) ggml tensor type id.
    #[error("tensor {name:?}: unknown ggml type {id}")]
    UnknownTensorType {
        /// Tensor name.
        name: String,
        /// The type id found.
        id: u32,
    },
    /// The same tensor name appears twice.
    #[error("duplicate tensor {0:?}")]
    DuplicateTensor(String),
    /// Dims invalid: too many, zero, overflowing, or not a whole number of blocks.
    #[error("tensor {name:?}: invalid dims {dims:?}: {reason}")]
    BadDims {
        /// Tensor name.
        name: String,
        /// The dims found.
        dims: Vec<u64>,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// A tensor's offset is not a multiple of the alignment.
    #[error("tensor {name:?}: offset {offset} not aligned to {alignment}")]
    MisalignedTensor {
        /// Tensor name.
        name: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data runs past the end of the buffer.
    #[error("tensor {name:?}: bytes {start}..{end} of the data section run past its end ({len})")]
    TensorOutOfBounds {
        /// Tensor name.
        name: String,
        /// Start offset in the data section.
        start: u64,
        /// End offset in the data section.
        end: u64,
        /// Length of the data section.
        len: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error("tensors {0:?} and {1:?} overlap")]
    OverlappingTensors(String, String),
    /// The writer was given data of the wrong length for a tensor.
    #[error("tensor {name:?}: data is {got} bytes, type and dims need {expected}")]
    DataLength {
        /// Tensor name.
        name: String,
        /// Bytes required.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// I/O error while writing.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// ggml tensor types this codec knows the block layout of.
///
/// Only the plain and the classic/k-quant block types are listed; a file using
/// any other type (e.g. the IQ family) is refused with
/// [`GgufError::UnknownTensorType`]. Dequantization ([`crate::quant`]) covers
/// F32, F16, BF16, Q4_0, Q4_1 and Q8_0.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// 4-bit, blocks of 32, f16 scale.
    Q4_0,
    /// 4-bit, blocks of 32, f16 scale and min.
    Q4_1,
    /// 5-bit, blocks of 32.
    Q5_0,
    /// 5-bit with min, blocks of 32.
    Q5_1,
    /// 8-bit, blocks of 32, f16 scale.
    Q8_0,
    /// 8-bit with sum, blocks of 32.
    Q8_1,
    /// k-quant 2-bit, blocks of 256.
    Q2_K,
    /// k-quant 3-bit, blocks of 256.
    Q3_K,
    /// k-quant 4-bit, blocks of 256.
    Q4_K,
    /// k-quant 5-bit, blocks of 256.
    Q5_K,
    /// k-quant 6-bit, blocks of 256.
    Q6_K,
    /// k-quant 8-bit, blocks of 256.
    Q8_K,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// bfloat16.
    BF16,
}

impl GgmlType {
    /// Every known type.
    pub const ALL: [GgmlType; 20] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::BF16,
    ];

    /// The ggml type id (`enum ggml_type`).
    pub const fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::I8 => 24,
            GgmlType::I16 => 25,
            GgmlType::I32 => 26,
            GgmlType::I64 => 27,
            GgmlType::F64 => 28,
            GgmlType::BF16 => 30,
        }
    }

    /// The type with ggml id `id`, if known.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// Elements per block (1 for plain types).
    pub const fn block_size(self) -> u64 {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::Q8_1 => 32,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => 256,
            _ => 1,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> u64 {
        match self {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::I16 => 2,
            GgmlType::I8 => 1,
            GgmlType::I64 | GgmlType::F64 => 8,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
        }
    }

    /// Bytes needed for `n_elements` elements, or `None` if that is not a
    /// whole number of blocks or overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.block_bytes())
    }
}

/// Metadata value type ids (`enum gguf_type`).
mod vt {
    pub(super) const U8: u32 = 0;
    pub(super) const I8: u32 = 1;
    pub(super) const U16: u32 = 2;
    pub(super) const I16: u32 = 3;
    pub(super) const U32: u32 = 4;
    pub(super) const I32: u32 = 5;
    pub(super) const F32: u32 = 6;
    pub(super) const BOOL: u32 = 7;
    pub(super) const STR: u32 = 8;
    pub(super) const ARRAY: u32 = 9;
    pub(super) const U64: u32 = 10;
    pub(super) const I64: u32 = 11;
    pub(super) const F64: u32 = 12;
}

/// A typed GGUF metadata array.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements (one byte each, 0 or 1).
    Bool(Vec<bool>),
    /// String elements.
    Str(Vec<String>),
    /// Nested arrays (rare; depth-limited).
    Array(Vec<MetaArray>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl MetaArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::Str(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type id.
    fn elem_type(&self) -> u32 {
        match self {
            MetaArray::U8(_) => vt::U8,
            MetaArray::I8(_) => vt::I8,
            MetaArray::U16(_) => vt::U16,
            MetaArray::I16(_) => vt::I16,
            MetaArray::U32(_) => vt::U32,
            MetaArray::I32(_) => vt::I32,
            MetaArray::F32(_) => vt::F32,
            MetaArray::Bool(_) => vt::BOOL,
            MetaArray::Str(_) => vt::STR,
            MetaArray::Array(_) => vt::ARRAY,
            MetaArray::U64(_) => vt::U64,
            MetaArray::I64(_) => vt::I64,
            MetaArray::F64(_) => vt::F64,
        }
    }
}

/// A GGUF metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Typed array.
    Array(MetaArray),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl MetaValue {
    /// The value type id.
    fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => vt::U8,
            MetaValue::I8(_) => vt::I8,
            MetaValue::U16(_) => vt::U16,
            MetaValue::I16(_) => vt::I16,
            MetaValue::U32(_) => vt::U32,
            MetaValue::I32(_) => vt::I32,
            MetaValue::F32(_) => vt::F32,
            MetaValue::Bool(_) => vt::BOOL,
            MetaValue::Str(_) => vt::STR,
            MetaValue::Array(_) => vt::ARRAY,
            MetaValue::U64(_) => vt::U64,
            MetaValue::I64(_) => vt::I64,
            MetaValue::F64(_) => vt::F64,
        }
    }

    /// Any integer value that fits in a `u64` (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An `f32` or `f64` value as `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dims in ggml `ne` order: `dims[0]` varies fastest (the row length).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the first byte relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of dims). Dims are checked not to
    /// overflow when parsed; for a hand-built info this saturates.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).unwrap_or(u64::MAX)
    }

    /// Size of the tensor's data in bytes (saturating for hand-built infos).
    pub fn byte_len(&self) -> u64 {
        self.ty.bytes_for(self.n_elements()).unwrap_or(u64::MAX)
    }

    /// Number of rows: product of all dims but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// A parsed GGUF header.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    /// File format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensor descriptors in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment (from `general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the data section in the file.
    pub data_offset: u64,
}

impl GgufHeader {
    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// An integer key as `u32` (any integer type that fits).
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u64().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer key as `u64` (any non-negative integer type).
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// An integer key as `i64` (any integer type that fits).
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// A float key as `f32` (`f32` or `f64`).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// A bool key.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An array key of any element type.
    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        self.get(key)?.as_array()
    }

    /// A string-array key, e.g. `tokenizer.ggml.tokens`.
    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            MetaArray::Str(v) => Some(v),
            _ => None,
        }
    }

    /// An `i32`-array key, e.g. `tokenizer.ggml.token_type`.
    pub fn get_i32_array(&self, key: &str) -> Option<&[i32]> {
        match self.get_array(key)? {
            MetaArray::I32(v) => Some(v),
            _ => None,
        }
    }

    /// An `f32`-array key, e.g. `tokenizer.ggml.scores`.
    pub fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        match self.get_array(key)? {
            MetaArray::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The descriptor of a tensor.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Absolute byte range of a tensor's data in the file.
    pub fn tensor_range(&self, t: &TensorInfo) -> std::ops::Range<usize> {
        let start = self.data_offset.saturating_add(t.offset);
        let end = start.saturating_add(t.byte_len());
        to_usize(start)..to_usize(end)
    }
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Round `v` up to a multiple of `align` (a power of two); `None` on overflow.
pub fn align_up(v: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    v.checked_add(mask).map(|x| x & !mask)
}
