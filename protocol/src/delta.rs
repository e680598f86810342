//! Sparse, lossless checkpoint deltas.
//!
//! A delta turns one checkpoint (the *base*) into the next (the *result*)
//! by storing, for every tensor, the **new values of exactly the elements
//! whose bits changed** (exact comparison of the `u16` BF16/F16 or `u32` F32
//! bit patterns), so reconstruction is bit-exact. At RL learning rates
//! (~1e-6) only a small fraction of BF16 weights change per step, so a delta
//! is a small fraction of a full checkpoint.
//!
//! Both checkpoints must have the same GGUF layout (byte-identical header:
//! same metadata, tensor names, types, dims and offsets); only tensor data
//! may differ. A receiver applies the delta **in place** to a writable copy
//! of the base file ([`apply_in_place`]): it checks the base content id
//! first, writes only the changed elements, checks the result content id
//! and, on mismatch, restores the base bytes and refuses the delta.
//!
//! # Format (version 1)
//!
//! ```text
//! magic    b"TRBDELTA"          8 bytes
//! version  u8 = 1
//! base     [u8; 32]             content id of the base checkpoint
//! result   [u8; 32]             content id the delta reconstructs
//! len      u64 LE               payload length
//! hash     [u8; 32]             blake3(payload)
//! payload  zstd frame (with checksum) of the body, exactly `len` bytes
//!
//! body:
//!   varint T                    tensors with changes, names strictly increasing
//!   T times:
//!     varint name_len, name     UTF-8
//!     u8 elem                   1 = 16-bit elements (BF16/F16), 2 = 32-bit (F32)
//!     varint n_elements         the tensor's element count (checked on apply)
//!     varint n                  changed elements, 1 ..= n_elements
//!     n varints                 first index, then gaps (index − previous − 1)
//!     n·size bytes              the new values as byte planes: byte 0 of
//!                               every value, then byte 1, ... (little-endian)
//! ```
//!
//! Varints are unsigned LEB128, at most 10 bytes, minimal. Decoding checks
//! every count against the bytes actually present before allocating, so
//! hostile input yields a [`DeltaError`], never a panic or a huge allocation.

use std::io::Read;

use crate::checkpoint::{Checkpoint, ContentId, content_id_of};
use crate::gguf::{self, GgmlType, GgufError, GgufHeader, TensorInfo};

/// First bytes of every delta.
pub const MAGIC: [u8; 8] = *b"TRBDELTA";
/// Format version written by [`encode`].
pub const VERSION: u8 = 1;
/// Size of the fixed header before the payload.
pub const HEADER_LEN: usize = 8 + 1 + 32 + 32 + 8 + 32;
/// Largest zstd window (log2 bytes) a decoder accepts; levels up to 19 stay below.
pub const MAX_WINDOW_LOG: u32 = 23;
/// zstd level used by [`encode`].
pub const DEFAULT_LEVEL: i32 = 3;

/// Errors from encoding, decoding or applying a delta.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeltaError {
    /// A checkpoint's GGUF container is malformed.
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
    /// Base and new checkpoints do not share a GGUF layout.
    #[error("checkpoints differ in layout: {0}")]
    LayoutMismatch(String),
    /// A changed tensor has a type deltas cannot express.
    #[error("tensor {name:?} of type {ty:?} changed; only BF16, F16 and F32 tensors may change")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// The bytes end before the structure does.
    #[error("delta truncated ({0})")]
    Truncated(&'static str),
    /// The magic bytes are wrong.
    #[error("not a delta (bad magic)")]
    BadMagic,
    /// Unknown format version.
    #[error("unsupported delta version {0}")]
    UnsupportedVersion(u8),
    /// The payload does not match its announced length or hash.
    #[error("payload hash or length mismatch")]
    PayloadMismatch,
    /// A size limit was exceeded.
    #[error("{what} exceeds the limit ({got} > {max})")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        got: u64,
        /// The limit.
        max: u64,
    },
    /// zstd could not decompress the payload.
    #[error("decompression: {0}")]
    Decompress(String),
    /// The decompressed body is malformed.
    #[error("malformed delta body: {0}")]
    Malformed(String),
    /// The target's content id is not the delta's base.
    #[error("delta applies to {expected}, target is {found}")]
    WrongBase {
        /// The delta's base id.
        expected: ContentId,
        /// The target's id.
        found: ContentId,
    },
    /// The delta names a tensor the target lacks or describes it wrongly.
    #[error("tensor {name:?}: {reason}")]
    TensorMismatch {
        /// Tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// After applying, the content id is not the announced result; the
    /// target was restored to the base.
    #[error("result is {found}, delta announced {expected}; target restored")]
    ResultMismatch {
        /// The announced id.
        expected: ContentId,
        /// The id obtained.
        found: ContentId,
    },
    /// File I/O failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Width of a tensor's elements as the delta sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemKind {
    /// 16-bit elements (BF16, F16).
    U16,
    /// 32-bit elements (F32).
    U32,
}

impl ElemKind {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            ElemKind::U16 => 2,
            ElemKind::U32 => 4,
        }
    }

    fn code(self) -> u8 {
        match self {
            ElemKind::U16 => 1,
            ElemKind::U32 => 2,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(ElemKind::U16),
            2 => Some(ElemKind::U32),
            _ => None,
        }
    }

    /// The element kind of a GGUF type, if deltas support it.
    pub fn of(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::BF16 | GgmlType::F16 => Some(ElemKind::U16),
            GgmlType::F32 => Some(ElemKind::U32),
            _ => None,
        }
    }
}

/// The changes to one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDelta {
    /// GGUF tensor name.
    pub name: String,
    /// Element width.
    pub elem: ElemKind,
    /// Element count of the tensor.
    pub n_elements: u64,
    /// Indices of the changed elements, strictly increasing, `< n_elements`.
    pub indices: Vec<u64>,
    /// New values, `indices.len() * elem.size()` bytes, little-endian,
    /// value `i` at `values[i*size..(i+1)*size]`.
    pub values: Vec<u8>,
}

impl TensorDelta {
    /// Number of changed elements.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// A decoded delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    /// Content id of the checkpoint it applies to.
    pub base: ContentId,
    /// Content id it reconstructs.
    pub result: ContentId,
    /// Changed tensors, sorted by name, none empty.
    pub tensors: Vec<TensorDelta>,
}

impl Delta {
    /// Total changed elements.
    pub fn changed_elements(&self) -> u64 {
        self.tensors.iter().map(|t| t.indices.len() as u64).sum()
    }

    /// Serialise with zstd level `level` (the inverse of [`decode`]).
    pub fn to_bytes(&self, level: i32) -> Result<Vec<u8>, DeltaError> {
        let mut body = Vec::new();
        put_varint(&mut body, self.tensors.len() as u64);
        for t in &self.tensors {
            write_tensor(&mut body, &t.name, t.elem, t.n_elements, &t.indices, &t.values);
        }
        finish(self.base, self.result, &body, level)
    }
}

/// Bounds for decoding untrusted deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaLimits {
    /// Largest accepted delta (header + compressed payload).
    pub max_bytes: u64,
    /// Largest accepted decompressed body.
    pub max_body: u64,
    /// Most tensors.
    pub max_tensors: u64,
}

impl DeltaLimits {
    /// Limits for deltas against a base checkpoint file of `len` bytes: the
    /// body can never legitimately need more than 3 bytes of index and
    /// value per base byte, plus names.
    pub fn for_base_len(len: u64) -> Self {
        let body = len.saturating_mul(3).saturating_add(1 << 20);
        DeltaLimits { max_bytes: body.saturating_add(HEADER_LEN as u64), max_body: body, max_tensors: 1 << 16 }
    }
}

// ------------------------------------------------------------------ encode

/// Encode the delta from `base` to `new` (zstd level [`DEFAULT_LEVEL`]).
pub fn encode(base: &Checkpoint, new: &Checkpoint) -> Result<Vec<u8>, DeltaError> {
    encode_gguf(base.bytes(), new.bytes(), DEFAULT_LEVEL)
}

/// Encode the delta between two GGUF files held in memory (any
/// architecture) with zstd level `level`.
pub fn encode_gguf(base: &[u8], new: &[u8], level: i32) -> Result<Vec<u8>, DeltaError> {
    let (bh, nh) = (gguf::parse_header(base)?, gguf::parse_header(new)?);
    check_same_layout(&bh, base, &nh, new)?;
    let (base_id, new_id) = (content_id_of(&bh, base), content_id_of(&nh, new));

    let mut tensors: Vec<&TensorInfo> = bh.tensors.iter().collect();
    tensors.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let mut body = Vec::new();
    let mut count = 0u64;
    let mut entries = Vec::new();
    let mut indices = Vec::new();
    let mut values = Vec::new();
    for t in tensors {
        let range = bh.tensor_range(t);
        let (old, cur) = (&base[range.clone()], &new[range]);
        if old == cur {
            continue;
        }
        let elem = ElemKind::of(t.ty).ok_or_else(|| DeltaError::UnsupportedType { name: t.name.clone(), ty: t.ty })?;
        let size = elem.size();
        indices.clear();
        values.clear();
        for (i, (a, b)) in old.chunks_exact(size).zip(cur.chunks_exact(size)).enumerate() {
            if a != b {
                indices.push(i as u64);
                values.extend_from_slice(b);
            }
        }
        write_tensor(&mut entries, &t.name, elem, t.n_elements(), &indices, &values);
        count += 1;
    }
    put_varint(&mut body, count);
    body.extend_from_slice(&entries);
    finish(base_id, new_id, &body, level)
}

fn check_same_layout(bh: &GgufHeader, base: &[u8], nh: &GgufHeader, new: &[u8]) -> Result<(), DeltaError> {
    let hdr = |h: &GgufHeader| usize::try_from(h.data_offset).unwrap_or(usize::MAX);
    if base.len() != new.len() {
        return Err(DeltaError::LayoutMismatch(format!("file sizes {} and {}", base.len(), new.len())));
    }
    if bh.data_offset != nh.data_offset || base.get(..hdr(bh)) != new.get(..hdr(nh)) {
        return Err(DeltaError::LayoutMismatch("GGUF headers (metadata or tensor table) differ".into()));
    }
    Ok(())
}

fn write_tensor(out: &mut Vec<u8>, name: &str, elem: ElemKind, n_elements: u64, indices: &[u64], values: &[u8]) {
    put_varint(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
    out.push(elem.code());
    put_varint(out, n_elements);
    put_varint(out, indices.len() as u64);
    let mut prev: Option<u64> = None;
    for &i in indices {
        put_varint(out, prev.map_or(i, |p| i - p - 1));
        prev = Some(i);
    }
    let size = elem.size();
    for plane in 0..size {
        out.extend(values.iter().skip(plane).step_by(size));
    }
}

fn finish(base: ContentId, result: ContentId, body: &[u8], level: i32) -> Result<Vec<u8>, DeltaError> {
    let mut enc = zstd::stream::Encoder::new(Vec::with_capacity(body.len() / 4 + 64), level)?;
    enc.include_checksum(true)?;
    enc.include_contentsize(true)?;
    enc.set_pledged_src_size(Some(body.len() as u64))?;
    std::io::Write::write_all(&mut enc, body)?;
    let payload = enc.finish()?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&base.0);
    out.extend_from_slice(&result.0);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(&payload).as_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

// ------------------------------------------------------------------ decode

/// The announced ids of a delta, read from its header without decompressing.
pub fn peek_ids(bytes: &[u8]) -> Result<(ContentId, ContentId), DeltaError> {
    let h = read_header(bytes)?;
    Ok((h.base, h.result))
}

struct Header<'a> {
    base: ContentId,
    result: ContentId,
    payload: &'a [u8],
}

fn read_header(bytes: &[u8]) -> Result<Header<'_>, DeltaError> {
    if bytes.len() < 9 {
        return Err(DeltaError::Truncated("header"));
    }
    if bytes[..8] != MAGIC {
        return Err(DeltaError::BadMagic);
    }
    if bytes[8] != VERSION {
        return Err(DeltaError::UnsupportedVersion(bytes[8]));
    }
    if bytes.len() < HEADER_LEN {
        return Err(DeltaError::Truncated("header"));
    }
    let id = |at: usize| {
        let mut b = [0u8; 32];
        b.copy_from_slice(&bytes[at..at + 32]);
        ContentId(b)
    };
    let (base, result) = (id(9), id(41));
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[73..81]);
    let len = u64::from_le_bytes(len);
    let payload = &bytes[HEADER_LEN..];
    if (payload.len() as u64) < len {
        return Err(DeltaError::Truncated("payload"));
    }
    if payload.len() as u64 != len || blake3::hash(payload).as_bytes()[..] != bytes[81..113] {
        return Err(DeltaError::PayloadMismatch);
    }
    Ok(Header { base, result, payload })
}

/// Decode an untrusted delta within `limits`.
pub fn decode(bytes: &[u8], limits: &DeltaLimits) -> Result<Delta, DeltaError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(DeltaError::TooLarge { what: "delta", got: bytes.len() as u64, max: limits.max_bytes });
    }
    let h = read_header(bytes)?;
    let body = decompress(h.payload, limits.max_body)?;
    let mut r = BodyReader { buf: &body, pos: 0 };
    let count = r.varint()?;
    if count > limits.max_tensors {
        return Err(DeltaError::TooLarge { what: "tensor count", got: count, max: limits.max_tensors });
    }
    let mut tensors: Vec<TensorDelta> = Vec::new();
    for _ in 0..count {
        let t = r.tensor()?;
        if let Some(prev) = tensors.last()
            && prev.name.as_bytes() >= t.name.as_bytes()
        {
            return Err(DeltaError::Malformed(format!("tensor {:?} out of order or repeated", t.name)));
        }
        tensors.push(t);
    }
    if r.pos != body.len() {
        return Err(DeltaError::Malformed(format!("{} trailing bytes", body.len() - r.pos)));
    }
    Ok(Delta { base: h.base, result: h.result, tensors })
}

fn decompress(payload: &[u8], max_body: u64) -> Result<Vec<u8>, DeltaError> {
    let zerr = |e: std::io::Error| DeltaError::Decompress(e.to_string());
    let mut dec = zstd::stream::read::Decoder::with_buffer(payload).map_err(zerr)?.single_frame();
    // Bound the window a hostile frame can make the decoder allocate.
    dec.window_log_max(MAX_WINDOW_LOG).map_err(zerr)?;
    let mut body = Vec::new();
    (&mut dec).take(max_body.saturating_add(1)).read_to_end(&mut body).map_err(zerr)?;
    if body.len() as u64 > max_body {
        return Err(DeltaError::TooLarge { what: "decompressed body", got: body.len() as u64, max: max_body });
    }
    if !dec.finish().is_empty() {
        return Err(DeltaError::Malformed("bytes after the zstd frame".into()));
    }
    Ok(body)
}

struct BodyReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl BodyReader<'_> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], DeltaError> {
        if self.remaining() < n {
            return Err(DeltaError::Truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn varint(&mut self) -> Result<u64, DeltaError> {
        let mut v = 0u64;
        for k in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(DeltaError::Truncated("varint"))?;
            self.pos += 1;
            let bits = u64::from(b & 0x7f);
            if k == 9 && b > 1 {
                return Err(DeltaError::Malformed("varint overflows u64".into()));
            }
            v |= bits << (7 * k);
            if b & 0x80 == 0 {
                if b == 0 && k > 0 {
                    return Err(DeltaError::Malformed("non-minimal varint".into()));
                }
                return Ok(v);
            }
        }
        Err(DeltaError::Malformed("varint longer than 10 bytes".into()))
    }

    fn tensor(&mut self) -> Result<TensorDelta, DeltaError> {
        let name_len = self.varint()?;
        if name_len > self.remaining() as u64 {
            return Err(DeltaError::Truncated("tensor name"));
        }
        let name = std::str::from_utf8(self.take(name_len as usize, "tensor name")?)
            .map_err(|_| DeltaError::Malformed("tensor name is not UTF-8".into()))?
            .to_owned();
        let code = self.take(1, "element kind")?[0];
        let elem = ElemKind::from_code(code).ok_or_else(|| DeltaError::Malformed(format!("element kind {code}")))?;
        let n_elements = self.varint()?;
        let n = self.varint()?;
        if n == 0 || n > n_elements {
            return Err(DeltaError::Malformed(format!("tensor {name:?}: {n} changes of {n_elements} elements")));
        }
        // Every change needs at least one index byte and `size` value bytes:
        // check before allocating.
        let need = n.saturating_mul(1 + elem.size() as u64);
        if need > self.remaining() as u64 {
            return Err(DeltaError::Truncated("changes"));
        }
        let n = n as usize;
        let mut indices = Vec::with_capacity(n);
        let mut prev: Option<u64> = None;
        for _ in 0..n {
            let g = self.varint()?;
            let i = match prev {
                None => Some(g),
                Some(p) => p.checked_add(g).and_then(|x| x.checked_add(1)),
            };
            let i = i
                .filter(|&i| i < n_elements)
                .ok_or_else(|| DeltaError::Malformed(format!("tensor {name:?}: index out of range")))?;
            indices.push(i);
            prev = Some(i);
        }
        let size = elem.size();
        let planes = self.take(n * size, "values")?;
        let mut values = vec![0u8; n * size];
        for (plane, src) in planes.chunks_exact(n).enumerate() {
            for (k, &b) in src.iter().enumerate() {
                values[k * size + plane] = b;
            }
        }
        Ok(TensorDelta { name, elem, n_elements, indices, values })
    }
}

// ------------------------------------------------------------------ apply

/// Apply `delta` in place to `target`, the bytes of the base checkpoint's
/// GGUF file (typically a writable memory map of a copy of it).
///
/// Checks the base content id, validates every tensor entry against the
/// target's header before writing anything, writes only the changed
/// elements, then checks the result content id. On a result mismatch the
/// original bytes are restored and [`DeltaError::ResultMismatch`] returned;
/// on any other error nothing was written.
pub fn apply_in_place(delta: &Delta, target: &mut [u8]) -> Result<(), DeltaError> {
    let header = gguf::parse_header(target)?;
    let found = content_id_of(&header, target);
    if found != delta.base {
        return Err(DeltaError::WrongBase { expected: delta.base, found });
    }
    let mut ranges = Vec::with_capacity(delta.tensors.len());
    for t in &delta.tensors {
        let mismatch = |reason: String| DeltaError::TensorMismatch { name: t.name.clone(), reason };
        let info = header.tensor(&t.name).ok_or_else(|| mismatch("not in the target".into()))?;
        if ElemKind::of(info.ty) != Some(t.elem) {
            return Err(mismatch(format!("target type {:?} does not match {:?} elements", info.ty, t.elem)));
        }
        if info.n_elements() != t.n_elements {
            return Err(mismatch(format!("target has {} elements, delta says {}", info.n_elements(), t.n_elements)));
        }
        if t.values.len() != t.indices.len() * t.elem.size()
            || t.indices.windows(2).any(|w| w[0] >= w[1])
            || t.indices.last().is_some_and(|&i| i >= t.n_elements)
        {
            return Err(mismatch("indices unsorted or out of range, or value count wrong".into()));
        }
        ranges.push(header.tensor_range(info));
    }
    let mut saved: Vec<Vec<u8>> = Vec::with_capacity(delta.tensors.len());
    for (t, range) in delta.tensors.iter().zip(&ranges) {
        let data = &mut target[range.clone()];
        let size = t.elem.size();
        let mut old = Vec::with_capacity(t.values.len());
        for (&i, v) in t.indices.iter().zip(t.values.chunks_exact(size)) {
            let at = i as usize * size;
            let dst = &mut data[at..at + size];
            old.extend_from_slice(dst);
            dst.copy_from_slice(v);
        }
        saved.push(old);
    }
    let got = content_id_of(&header, target);
    if got != delta.result {
        for ((t, range), old) in delta.tensors.iter().zip(&ranges).zip(&saved) {
            let data = &mut target[range.clone()];
            let size = t.elem.size();
            for (&i, v) in t.indices.iter().zip(old.chunks_exact(size)) {
                let at = i as usize * size;
                data[at..at + size].copy_from_slice(v);
            }
        }
        return Err(DeltaError::ResultMismatch { expected: delta.result, found: got });
    }
    Ok(())
}

/// Decode `bytes` and apply them to a copy of `base`, returning the new
/// file's bytes.
pub fn apply_to_copy(bytes: &[u8], base: &[u8]) -> Result<Vec<u8>, DeltaError> {
    let delta = decode(bytes, &DeltaLimits::for_base_len(base.len() as u64))?;
    let mut out = base.to_vec();
    apply_in_place(&delta, &mut out)?;
    Ok(out)
}

/// Decode `bytes`, apply them to a copy of the checkpoint file `base` and
/// write the result atomically to `out` (a temporary file in the same
/// folder, patched through a memory map, then renamed). Returns the result
/// content id.
pub fn apply_file(bytes: &[u8], base: &std::path::Path, out: &std::path::Path) -> Result<ContentId, DeltaError> {
    let len = std::fs::metadata(base)?.len();
    let delta = decode(bytes, &DeltaLimits::for_base_len(len))?;
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.delta.{}", std::process::id()));
    let result = (|| {
        std::fs::copy(base, &tmp)?;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&tmp)?;
        // SAFETY: `tmp` is a fresh private copy nobody else maps or writes.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }?;
        apply_in_place(&delta, &mut map)?;
        map.flush()?;
        drop(map);
        f.sync_all()?;
        std::fs::rename(&tmp, out)?;
        Ok(delta.result)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Change statistics between two same-layout GGUF files: `(changed
/// elements, total elements)` over BF16/F16/F32 tensors.
pub fn change_stats(base: &[u8], new: &[u8]) -> Result<(u64, u64), DeltaError> {
    let (bh, nh) = (gguf::parse_header(base)?, gguf::parse_header(new)?);
    check_same_layout(&bh, base, &nh, new)?;
    let (mut changed, mut total) = (0u64, 0u64);
    for t in &bh.tensors {
        let Some(elem) = ElemKind::of(t.ty) else { continue };
        let r = bh.tensor_range(t);
        total += t.n_elements();
        changed += base[r.clone()]
            .chunks_exact(elem.size())
            .zip(new[r].chunks_exact(elem.size()))
            .filter(|(a, b)| a != b)
            .count() as u64;
    }
    Ok((changed, total))
}
