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
use std::collections::HashSet;
use std::io::Write;

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
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STR: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
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

// ---------------------------------------------------------------- reading

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { what, offset: self.pos as u64, needed: n, available: self.remaining() });
        }
        let n = n as usize; // n <= remaining, so it fits
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let at = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| GgufError::InvalidUtf8(at))
    }

    /// Check that `count` items of at least `min_size` bytes each could fit.
    fn check_count(&self, count: u64, min_size: u64, what: &'static str) -> Result<usize, GgufError> {
        let fits = count.checked_mul(min_size).is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(GgufError::CountTooLarge { what, count, remaining: self.remaining() });
        }
        Ok(count as usize) // count * min_size <= remaining <= usize::MAX
    }

    fn fixed_vec<T, const N: usize>(
        &mut self,
        count: u64,
        what: &'static str,
        conv: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let n = self.check_count(count, N as u64, what)?;
        let bytes = self.take(n as u64 * N as u64, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }

    fn bool(&mut self) -> Result<bool, GgufError> {
        let at = self.pos as u64;
        match self.array::<1>("bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::InvalidBool { offset: at, value }),
        }
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<MetaValue, GgufError> {
        Ok(match ty {
            vt::U8 => MetaValue::U8(self.array::<1>("u8")?[0]),
            vt::I8 => MetaValue::I8(i8::from_le_bytes(self.array::<1>("i8")?)),
            vt::U16 => MetaValue::U16(u16::from_le_bytes(self.array("u16")?)),
            vt::I16 => MetaValue::I16(i16::from_le_bytes(self.array("i16")?)),
            vt::U32 => MetaValue::U32(self.u32("u32")?),
            vt::I32 => MetaValue::I32(i32::from_le_bytes(self.array("i32")?)),
            vt::F32 => MetaValue::F32(f32::from_le_bytes(self.array("f32")?)),
            vt::BOOL => MetaValue::Bool(self.bool()?),
            vt::STR => MetaValue::Str(self.string("string")?),
            vt::ARRAY => MetaValue::Array(self.meta_array(depth + 1)?),
            vt::U64 => MetaValue::U64(self.u64("u64")?),
            vt::I64 => MetaValue::I64(i64::from_le_bytes(self.array("i64")?)),
            vt::F64 => MetaValue::F64(f64::from_le_bytes(self.array("f64")?)),
            other => return Err(GgufError::UnknownValueType(other)),
        })
    }

    fn meta_array(&mut self, depth: usize) -> Result<MetaArray, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep);
        }
        let ty = self.u32("array type")?;
        let count = self.u64("array count")?;
        Ok(match ty {
            vt::U8 => MetaArray::U8(self.fixed_vec::<_, 1>(count, "u8 array", |a| a[0])?),
            vt::I8 => MetaArray::I8(self.fixed_vec::<_, 1>(count, "i8 array", i8::from_le_bytes)?),
            vt::U16 => MetaArray::U16(self.fixed_vec(count, "u16 array", u16::from_le_bytes)?),
            vt::I16 => MetaArray::I16(self.fixed_vec(count, "i16 array", i16::from_le_bytes)?),
            vt::U32 => MetaArray::U32(self.fixed_vec(count, "u32 array", u32::from_le_bytes)?),
            vt::I32 => MetaArray::I32(self.fixed_vec(count, "i32 array", i32::from_le_bytes)?),
            vt::F32 => MetaArray::F32(self.fixed_vec(count, "f32 array", f32::from_le_bytes)?),
            vt::U64 => MetaArray::U64(self.fixed_vec(count, "u64 array", u64::from_le_bytes)?),
            vt::I64 => MetaArray::I64(self.fixed_vec(count, "i64 array", i64::from_le_bytes)?),
            vt::F64 => MetaArray::F64(self.fixed_vec(count, "f64 array", f64::from_le_bytes)?),
            vt::BOOL => {
                let n = self.check_count(count, 1, "bool array")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool()?);
                }
                MetaArray::Bool(v)
            }
            vt::STR => {
                // Each string needs at least its 8-byte length.
                let n = self.check_count(count, 8, "string array")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string("array string")?);
                }
                MetaArray::Str(v)
            }
            vt::ARRAY => {
                // Each nested array needs at least its type and count.
                let n = self.check_count(count, 12, "nested array")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(depth + 1)?);
                }
                MetaArray::Array(v)
            }
            other => return Err(GgufError::UnknownValueType(other)),
        })
    }
}

/// Parse and validate the header of a GGUF file held in `bytes`.
///
/// Every tensor's byte range is checked against `bytes.len()`: after this
/// returns, [`GgufHeader::tensor_range`] of any tensor is a valid index range
/// into `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let magic = r.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;

    // Key (8-byte length) + type (4) + smallest value (1) = 13 bytes minimum.
    let n_kv = r.check_count(n_kv, 13, "metadata")?;
    let mut metadata = Vec::with_capacity(n_kv);
    let mut keys = HashSet::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = r.string("metadata key")?;
        let ty = r.u32("metadata type")?;
        let value = r.value(ty, 0)?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => return Err(GgufError::BadAlignment(v.as_u64().unwrap_or(0))),
    };

    // Name (8) + n_dims (4) + type (4) + offset (8) = 24 bytes minimum.
    let n_tensors = r.check_count(n_tensors, 24, "tensor")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = HashSet::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = r.string("tensor name")?;
        let n_dims = r.u32("tensor n_dims")?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDims { name, dims: vec![], reason: "more than 4 dims" });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64("tensor dim")?);
        }
        let id = r.u32("tensor type")?;
        let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownTensorType { name: name.clone(), id })?;
        let offset = r.u64("tensor offset")?;
        check_dims(&name, &dims, ty)?;
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        tensors.push(TensorInfo { name, dims, ty, offset });
    }

    let data_offset = align_up(r.pos as u64, alignment).ok_or(GgufError::BadAlignment(alignment))?;
    let data_len = (bytes.len() as u64).saturating_sub(data_offset);
    if !tensors.is_empty() && data_offset > bytes.len() as u64 {
        return Err(GgufError::Truncated {
            what: "padding before tensor data",
            offset: r.pos as u64,
            needed: data_offset - r.pos as u64,
            available: r.remaining(),
        });
    }
    let mut ranges = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor { name: t.name.clone(), offset: t.offset, alignment });
        }
        let end = t.offset.checked_add(t.byte_len()).filter(|&e| e <= data_len);
        let Some(end) = end else {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(t.byte_len()),
                len: data_len,
            });
        };
        ranges.push((t.offset, end, i));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let (_, end_a, a) = w[0];
        let (start_b, end_b, b) = w[1];
        // Empty tensors never overlap anything.
        if start_b < end_a && end_b > start_b {
            return Err(GgufError::OverlappingTensors(tensors[a].name.clone(), tensors[b].name.clone()));
        }
    }
    Ok(GgufHeader { version, metadata, tensors, alignment, data_offset })
}

fn check_dims(name: &str, dims: &[u64], ty: GgmlType) -> Result<(), GgufError> {
    let bad = |reason| GgufError::BadDims { name: name.to_owned(), dims: dims.to_vec(), reason };
    if dims.contains(&0) {
        return Err(bad("zero dim"));
    }
    let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| bad("element count overflows"))?;
    // ggml stores ne as int64; keep byte sizes within i64 too.
    if n > i64::MAX as u64 {
        return Err(bad("element count overflows"));
    }
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(ty.block_size()) {
        return Err(bad("row length is not a whole number of blocks"));
    }
    match ty.bytes_for(n) {
        Some(b) if b <= i64::MAX as u64 => Ok(()),
        _ => Err(bad("byte size overflows")),
    }
}

// ---------------------------------------------------------------- writing

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Append the GGUF encoding of a value's payload (without its type id).
pub(crate) fn encode_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::Str(s) => put_str(out, s),
        MetaValue::Array(a) => encode_array(out, a),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn encode_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&a.elem_type().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => le!(v),
        MetaArray::U16(v) => le!(v),
        MetaArray::I16(v) => le!(v),
        MetaArray::U32(v) => le!(v),
        MetaArray::I32(v) => le!(v),
        MetaArray::F32(v) => le!(v),
        MetaArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetaArray::Str(v) => v.iter().for_each(|s| put_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|a| encode_array(out, a)),
        MetaArray::U64(v) => le!(v),
        MetaArray::I64(v) => le!(v),
        MetaArray::F64(v) => le!(v),
    }
}

/// Append `key`, the value's type id and its payload (one GGUF key/value).
pub(crate) fn encode_kv(out: &mut Vec<u8>, key: &str, v: &MetaValue) {
    put_str(out, key);
    out.extend_from_slice(&v.type_id().to_le_bytes());
    encode_value(out, v);
}

/// Builds a GGUF v3 file.
///
/// Metadata is written in insertion order; tensors are laid out in insertion
/// order, each starting at a multiple of the alignment and followed by zero
/// padding up to the next multiple. The alignment is `general.alignment` if
/// that key is set (it must be a power-of-two `u32`), else 32.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(TensorInfo, Cow<'a, [u8]>)>,
}

impl<'a> GgufWriter<'a> {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer holding a parsed file's metadata and tensors (borrowing the
    /// tensor data from `bytes`), which writes that file back.
    pub fn from_parsed(header: &GgufHeader, bytes: &'a [u8]) -> Result<Self, GgufError> {
        let mut w = Self::new();
        for (k, v) in &header.metadata {
            w.set_meta(k, v.clone());
        }
        for t in &header.tensors {
            let range = header.tensor_range(t);
            let data = bytes.get(range).ok_or_else(|| GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(t.byte_len()),
                len: bytes.len() as u64,
            })?;
            w.add_tensor(&t.name, t.ty, &t.dims, Cow::Borrowed(data))?;
        }
        Ok(w)
    }

    /// Set a metadata key: replaces the value in place if the key exists,
    /// else appends it.
    pub fn set_meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Remove a metadata key if present.
    pub fn remove_meta(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// The metadata so far, in order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The tensor descriptors so far, with the offsets they will be written at.
    pub fn tensor_infos(&self) -> Result<Vec<TensorInfo>, GgufError> {
        let align = self.alignment()?;
        let mut off = 0u64;
        let mut out = Vec::with_capacity(self.tensors.len());
        for (t, _) in &self.tensors {
            out.push(TensorInfo { offset: off, ..t.clone() });
            off = align_up(off + t.byte_len(), align).ok_or(GgufError::BadAlignment(align))?;
        }
        Ok(out)
    }

    /// Add a tensor. `dims` are in ggml `ne` order; `data` must be exactly
    /// the size that type and dims imply.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self, GgufError> {
        if dims.len() > MAX_DIMS {
            return Err(GgufError::BadDims { name: name.to_owned(), dims: dims.to_vec(), reason: "more than 4 dims" });
        }
        check_dims(name, dims, ty)?;
        if self.tensors.iter().any(|(t, _)| t.name == name) {
            return Err(GgufError::DuplicateTensor(name.to_owned()));
        }
        let data = data.into();
        let info = TensorInfo { name: name.to_owned(), dims: dims.to_vec(), ty, offset: 0 };
        if info.byte_len() != data.len() as u64 {
            return Err(GgufError::DataLength {
                name: name.to_owned(),
                expected: info.byte_len(),
                got: data.len() as u64,
            });
        }
        self.tensors.push((info, data));
        Ok(self)
    }

    fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some((_, v)) => Err(GgufError::BadAlignment(v.as_u64().unwrap_or(0))),
        }
    }

    /// The header bytes, padded to the start of the data section.
    pub fn header_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let align = self.alignment()?;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            encode_kv(&mut out, k, v);
        }
        for t in self.tensor_infos()? {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&t.offset.to_le_bytes());
        }
        let padded = align_up(out.len() as u64, align).ok_or(GgufError::BadAlignment(align))?;
        out.resize(to_usize(padded), 0);
        Ok(out)
    }

    /// Write the whole file to `w`.
    pub fn write_to<W: Write>(&self, w: &mut W) -> Result<(), GgufError> {
        let align = self.alignment()?;
        w.write_all(&self.header_bytes()?)?;
        let zeros = vec![0u8; to_usize(align)];
        for (_, data) in &self.tensors {
            w.write_all(data)?;
            let len = data.len() as u64;
            let pad = align_up(len, align).ok_or(GgufError::BadAlignment(align))? - len;
            w.write_all(&zeros[..to_usize(pad)])?;
        }
        Ok(())
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Write the file to `path` atomically (a temporary file in the same
    /// folder, then a rename).
    pub fn write_file(&self, path: &std::path::Path) -> Result<(), GgufError> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(dir)?;
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
        let result = (|| {
            let f = std::fs::File::create(&tmp)?;
            let mut bw = std::io::BufWriter::with_capacity(1 << 20, f);
            self.write_to(&mut bw)?;
            let f = bw.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}
