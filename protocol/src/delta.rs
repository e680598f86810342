//! Sparse, lossless checkpoint deltas.
//!
//! A delta turns one checkpoint (the *base*) into the next (the *result*)
//! by storing, for every tensor, the **new values of exactly the elements
//! whose bits changed** (exact comparison of the `u16` BF16/F16 or `u32` F32
//! bit patterns), so reconstruction is bit-exact. At RL learning rates
//! only a few percent of BF16 weights change per step (SmolLM2-135M at lr
//! 3e-5: 3–6 %, each by one or two ulps), so a delta is a small fraction of
//! a full checkpoint (61–112× smaller there, docs/benchmarks.md §1).
//!
//! Both checkpoints must have the same GGUF layout (byte-identical header:
//! same metadata, tensor names, types, dims and offsets); only tensor data
//! may differ. A receiver applies the delta **in place** to a writable copy
//! of the base file ([`apply_in_place`]): it checks the base content id
//! first, writes only the changed elements, checks the result content id
//! and, on mismatch, restores the base bytes and refuses the delta.
//!
//! # Format (version 2)
//!
//! ```text
//! magic    b"TRBDELTA"          8 bytes
//! version  u8 = 2
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
//!   varint stream_len           then exactly stream_len bytes, the end of the body:
//!   stream                      one binary range-coded stream over the T tensors
//! ```
//!
//! The stream codes, for every element of every listed tensor in order,
//! whether it changed, and for each change the zigzag difference of the bit
//! patterns (`new − old` as a signed 16- or 32-bit integer). Both are coded
//! with adaptive binary models whose contexts the receiver computes from the
//! **base** it already holds: the changed bit by the base value's exponent
//! and whether the two previous elements changed; the difference (Elias-gamma
//! shaped: its bit length in unary, then its lower bits) by the exponent's
//! bucket, the length and the bit's position. At RL learning rates an update
//! moves a BF16 value by about lr / ulp units in the last place, and ulp is
//! fixed by the exponent, so the exponent predicts both whether a value moved
//! and how far (mostly ±1 ulp): a delta costs close to the conditional
//! entropy of positions and differences, which is the floor for any lossless
//! coding that knows only the base (see docs/benchmarks.md §1 for the
//! measured figures). Reconstruction is still exact: the receiver adds the
//! difference to the base bits, and the result's content id is checked.
//!
//! Varints are unsigned LEB128, at most 10 bytes, minimal. Decoding checks
//! every count against the bytes actually present before allocating, and
//! applying checks every count against the target's header, so hostile input
//! yields a [`DeltaError`], never a panic or an allocation beyond the
//! target's size. Version 1 (absolute new values, index gaps, zstd) is no
//! longer read: a relay holding version-1 deltas serves the full checkpoint.

use std::io::Read;

use crate::checkpoint::{Checkpoint, ContentId, content_id_of};
use crate::gguf::{self, GgmlType, GgufError, GgufHeader, TensorInfo};

/// First bytes of every delta.
pub const MAGIC: [u8; 8] = *b"TRBDELTA";
/// Format version written by [`encode`].
pub const VERSION: u8 = 2;
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

/// One tensor's entry in a delta: which tensor, and how many of its
/// elements change (their positions and values are in [`Delta::stream`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDelta {
    /// GGUF tensor name.
    pub name: String,
    /// Element width.
    pub elem: ElemKind,
    /// Element count of the tensor.
    pub n_elements: u64,
    /// Changed elements, `1 ..= n_elements`.
    pub changed: u64,
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
    /// The range-coded changes of `tensors`, in order; decodable only
    /// against the base (see the module documentation).
    pub stream: Vec<u8>,
}

impl Delta {
    /// Total changed elements.
    pub fn changed_elements(&self) -> u64 {
        self.tensors.iter().map(|t| t.changed).sum()
    }

    /// Serialise with zstd level `level` (the inverse of [`decode`]).
    pub fn to_bytes(&self, level: i32) -> Result<Vec<u8>, DeltaError> {
        let mut body = Vec::new();
        put_varint(&mut body, self.tensors.len() as u64);
        for t in &self.tensors {
            write_entry(&mut body, t);
        }
        put_varint(&mut body, self.stream.len() as u64);
        body.extend_from_slice(&self.stream);
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
    /// coded stream never legitimately needs more than 3 bytes per base
    /// byte (a change costs at most about 40 bits), plus the tensor table.
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
    let mut entries = Vec::new();
    let mut rc = RangeEncoder::default();
    let mut model = Model::new();
    for t in tensors {
        let range = bh.tensor_range(t);
        let (old, cur) = (&base[range.clone()], &new[range]);
        if old == cur {
            continue;
        }
        let elem = ElemKind::of(t.ty).ok_or_else(|| DeltaError::UnsupportedType { name: t.name.clone(), ty: t.ty })?;
        let changed = model.encode_tensor(&mut rc, elem, old, cur);
        entries.push(TensorDelta { name: t.name.clone(), elem, n_elements: t.n_elements(), changed });
    }
    let delta = Delta { base: base_id, result: new_id, tensors: entries, stream: rc.finish() };
    delta.to_bytes(level)
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

fn write_entry(out: &mut Vec<u8>, t: &TensorDelta) {
    put_varint(out, t.name.len() as u64);
    out.extend_from_slice(t.name.as_bytes());
    out.push(t.elem.code());
    put_varint(out, t.n_elements);
    put_varint(out, t.changed);
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
    // Every entry takes at least 4 bytes: check before allocating.
    if count.saturating_mul(4) > r.remaining() as u64 {
        return Err(DeltaError::Truncated("tensor table"));
    }
    let mut tensors: Vec<TensorDelta> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let t = r.tensor()?;
        if let Some(prev) = tensors.last()
            && prev.name.as_bytes() >= t.name.as_bytes()
        {
            return Err(DeltaError::Malformed(format!("tensor {:?} out of order or repeated", t.name)));
        }
        tensors.push(t);
    }
    let stream_len = r.varint()?;
    if stream_len > r.remaining() as u64 {
        return Err(DeltaError::Truncated("stream"));
    }
    let stream = r.take(stream_len as usize, "stream")?.to_vec();
    if r.pos != body.len() {
        return Err(DeltaError::Malformed(format!("{} trailing bytes", body.len() - r.pos)));
    }
    Ok(Delta { base: h.base, result: h.result, tensors, stream })
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
        let changed = self.varint()?;
        if changed == 0 || changed > n_elements {
            return Err(DeltaError::Malformed(format!("tensor {name:?}: {changed} changes of {n_elements} elements")));
        }
        Ok(TensorDelta { name, elem, n_elements, changed })
    }
}

// ------------------------------------------------------------------ apply

/// Apply `delta` in place to `target`, the bytes of the base checkpoint's
/// GGUF file (typically a writable memory map of a copy of it).
///
/// Checks the base content id and validates every tensor entry against the
/// target's header before writing anything, then decodes the stream against
/// the base values while writing the changed elements, then checks the
/// result content id. On any error after the first write (a stream that
/// does not decode to the announced counts, or a result mismatch) the
/// original bytes are restored; on any other error nothing was written.
pub fn apply_in_place(delta: &Delta, target: &mut [u8]) -> Result<(), DeltaError> {
    let header = gguf::parse_header(target)?;
    let found = content_id_of(&header, target);
    if found != delta.base {
        return Err(DeltaError::WrongBase { expected: delta.base, found });
    }
    let mut ranges = Vec::with_capacity(delta.tensors.len());
    for (k, t) in delta.tensors.iter().enumerate() {
        let mismatch = |reason: String| DeltaError::TensorMismatch { name: t.name.clone(), reason };
        let info = header.tensor(&t.name).ok_or_else(|| mismatch("not in the target".into()))?;
        if ElemKind::of(info.ty) != Some(t.elem) {
            return Err(mismatch(format!("target type {:?} does not match {:?} elements", info.ty, t.elem)));
        }
        if info.n_elements() != t.n_elements {
            return Err(mismatch(format!("target has {} elements, delta says {}", info.n_elements(), t.n_elements)));
        }
        if t.changed == 0 || t.changed > t.n_elements {
            return Err(mismatch(format!("{} changes of {} elements", t.changed, t.n_elements)));
        }
        if k > 0 && delta.tensors[k - 1].name.as_bytes() >= t.name.as_bytes() {
            return Err(mismatch("tensors out of order or repeated".into()));
        }
        ranges.push(header.tensor_range(info));
    }
    // What was overwritten, to restore the base on failure: per tensor, the
    // changed element indices and their old bytes (bounded by the announced
    // counts, themselves bounded by the target's tensors).
    let mut undo: Vec<Undo> = Vec::with_capacity(delta.tensors.len());
    let decoded = (|| {
        let mut dec = RangeDecoder::new(&delta.stream)?;
        let mut model = Model::new();
        for (t, range) in delta.tensors.iter().zip(&ranges) {
            let mut log = Undo::default();
            let r = model.decode_tensor(&mut dec, t, &mut target[range.clone()], &mut log);
            undo.push(log);
            r?;
        }
        dec.finish()
    })();
    let restore = |target: &mut [u8], undo: &[Undo]| {
        for ((t, range), log) in delta.tensors.iter().zip(&ranges).zip(undo) {
            let data = &mut target[range.clone()];
            let size = t.elem.size();
            for (&i, v) in log.indices.iter().zip(log.old.chunks_exact(size)) {
                let at = i * size;
                data[at..at + size].copy_from_slice(v);
            }
        }
    };
    if let Err(e) = decoded {
        restore(target, &undo);
        return Err(e);
    }
    let got = content_id_of(&header, target);
    if got != delta.result {
        restore(target, &undo);
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

// ------------------------------------------------------------------ coding

/// Probabilities are 16-bit fixed point (P(bit = 0) · 2^16), adapted by
/// 1/2^ADAPT of the error after each bit.
const PROB_BITS: u32 = 16;
const PROB_INIT: u16 = 1 << (PROB_BITS - 1);
const ADAPT: u32 = 5;
/// The range is renormalised below 2^24, so `(range >> 16) · p` keeps ≥ 8 bits.
const TOP: u32 = 1 << 24;

fn update(p: &mut u16, bit: bool) {
    let q = u32::from(*p);
    // Stays within [31, 2^16 − 31]: never 0, never 2^16.
    *p = if bit { q - (q >> ADAPT) } else { q + (((1 << PROB_BITS) - q) >> ADAPT) } as u16;
}

/// LZMA-style binary range encoder (carry propagation through a cache byte).
struct RangeEncoder {
    low: u64,
    range: u32,
    cache: u8,
    cache_size: u64,
    out: Vec<u8>,
}

impl Default for RangeEncoder {
    fn default() -> Self {
        RangeEncoder { low: 0, range: u32::MAX, cache: 0, cache_size: 1, out: Vec::new() }
    }
}

impl RangeEncoder {
    fn bit(&mut self, p: &mut u16, bit: bool) {
        let bound = (self.range >> PROB_BITS) * u32::from(*p);
        if bit {
            self.low += u64::from(bound);
            self.range -= bound;
        } else {
            self.range = bound;
        }
        update(p, bit);
        while self.range < TOP {
            self.range <<= 8;
            self.shift_low();
        }
    }

    fn shift_low(&mut self) {
        if self.low < 0xFF00_0000 || self.low >= 1 << 32 {
            let carry = (self.low >> 32) as u8;
            let mut b = self.cache;
            loop {
                self.out.push(b.wrapping_add(carry));
                b = 0xFF;
                self.cache_size -= 1;
                if self.cache_size == 0 {
                    break;
                }
            }
            self.cache = (self.low >> 24) as u8;
        }
        self.cache_size += 1;
        self.low = (self.low & 0x00FF_FFFF) << 8;
    }

    fn finish(mut self) -> Vec<u8> {
        for _ in 0..5 {
            self.shift_low();
        }
        self.out
    }
}

/// The decoder of [`RangeEncoder`]'s streams. Reading past the end yields
/// zeros and is reported by [`RangeDecoder::finish`]; any bytes decode to
/// some bits, so a corrupt stream is caught by the counts and the content id.
struct RangeDecoder<'a> {
    buf: &'a [u8],
    pos: usize,
    range: u32,
    code: u32,
}

impl<'a> RangeDecoder<'a> {
    fn new(buf: &'a [u8]) -> Result<Self, DeltaError> {
        if buf.len() < 5 {
            return Err(DeltaError::Truncated("stream"));
        }
        if buf[0] != 0 {
            return Err(DeltaError::Malformed("stream does not start with 0".into()));
        }
        let code = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
        Ok(RangeDecoder { buf, pos: 5, range: u32::MAX, code })
    }

    fn bit(&mut self, p: &mut u16) -> bool {
        let bound = (self.range >> PROB_BITS) * u32::from(*p);
        let bit = self.code >= bound;
        if bit {
            self.code -= bound;
            self.range -= bound;
        } else {
            self.range = bound;
        }
        update(p, bit);
        while self.range < TOP {
            self.range <<= 8;
            let b = self.buf.get(self.pos).copied().unwrap_or(0);
            self.pos = self.pos.saturating_add(1);
            self.code = (self.code << 8) | u32::from(b);
        }
        bit
    }

    /// The stream must have been read exactly to its end.
    fn finish(&self) -> Result<(), DeltaError> {
        match self.pos.cmp(&self.buf.len()) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Greater => Err(DeltaError::Truncated("stream")),
            std::cmp::Ordering::Less => {
                Err(DeltaError::Malformed(format!("{} bytes after the stream", self.buf.len() - self.pos)))
            }
        }
    }
}

/// Changed-bit contexts: element kind × base exponent × the two previous bits.
const POS_CTX: usize = 2 * 256 * 4;
/// Difference contexts: element kind × exponent bucket × bit length (1..=32).
const EXP_BUCKETS: usize = 32;
const LEN_CTX: usize = 2 * EXP_BUCKETS * 33;
/// Lower bits of a difference: element kind × bit length × bit position (the
/// lowest 3 positions also by exponent bucket: they carry the sign and the
/// small steps).
const LOW_CTX: usize = 2 * 33 * 32 * EXP_BUCKETS;

/// What applying one tensor overwrote: element indices and their old bytes.
#[derive(Default)]
struct Undo {
    indices: Vec<usize>,
    old: Vec<u8>,
}

/// The adaptive models of one stream (shared by its tensors, in order).
struct Model {
    pos: Vec<u16>,
    len: Vec<u16>,
    low: Vec<u16>,
}

/// What the receiver knows about an element before decoding it: its kind
/// and its base bits.
#[derive(Clone, Copy)]
struct Ctx {
    kind: usize,
    exponent: usize,
}

impl Ctx {
    fn of(elem: ElemKind, old: u32) -> Ctx {
        match elem {
            ElemKind::U16 => Ctx { kind: 0, exponent: ((old >> 7) & 0xFF) as usize },
            ElemKind::U32 => Ctx { kind: 1, exponent: ((old >> 23) & 0xFF) as usize },
        }
    }

    fn bucket(self) -> usize {
        self.exponent * EXP_BUCKETS / 256
    }
}

fn read_elem(bytes: &[u8], elem: ElemKind, i: usize) -> u32 {
    match elem {
        ElemKind::U16 => u32::from(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
        ElemKind::U32 => u32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]),
    }
}

/// Zigzag of the wrapping difference `new − old` at the element's width.
fn zigzag_diff(elem: ElemKind, old: u32, new: u32) -> u32 {
    match elem {
        ElemKind::U16 => {
            let d = new.wrapping_sub(old) as u16 as i16;
            u32::from(((d << 1) ^ (d >> 15)) as u16)
        }
        ElemKind::U32 => {
            let d = new.wrapping_sub(old) as i32;
            ((d << 1) ^ (d >> 31)) as u32
        }
    }
}

/// Inverse of [`zigzag_diff`]: the new bits.
fn unzigzag_apply(elem: ElemKind, old: u32, z: u32) -> u32 {
    let d = (z >> 1) ^ (z & 1).wrapping_neg();
    match elem {
        ElemKind::U16 => u32::from((old as u16).wrapping_add(d as u16)),
        ElemKind::U32 => old.wrapping_add(d),
    }
}

impl Model {
    fn new() -> Model {
        Model { pos: vec![PROB_INIT; POS_CTX], len: vec![PROB_INIT; LEN_CTX], low: vec![PROB_INIT; LOW_CTX] }
    }

    fn pos_index(c: Ctx, hist: usize) -> usize {
        (c.kind * 256 + c.exponent) * 4 + hist
    }

    fn len_index(c: Ctx, k: usize) -> usize {
        (c.kind * EXP_BUCKETS + c.bucket()) * 33 + k
    }

    fn low_index(c: Ctx, k: usize, bit: usize) -> usize {
        let b = if bit < 3 { c.bucket() } else { 0 };
        ((c.kind * 33 + k) * 32 + bit) * EXP_BUCKETS + b
    }

    /// Codes every element of one tensor; returns how many changed.
    fn encode_tensor(&mut self, rc: &mut RangeEncoder, elem: ElemKind, old: &[u8], new: &[u8]) -> u64 {
        let n = old.len() / elem.size();
        let width = 8 * elem.size();
        let (mut hist, mut changed) = (0usize, 0u64);
        for i in 0..n {
            let (a, b) = (read_elem(old, elem, i), read_elem(new, elem, i));
            let c = Ctx::of(elem, a);
            let moved = a != b;
            rc.bit(&mut self.pos[Self::pos_index(c, hist)], moved);
            hist = ((hist << 1) | usize::from(moved)) & 3;
            if !moved {
                continue;
            }
            changed += 1;
            let z = zigzag_diff(elem, a, b);
            // z ≥ 1; its bit length k in unary (k − 1 ones, then a zero unless k is the width).
            let k = (32 - z.leading_zeros()) as usize;
            for j in 1..k {
                rc.bit(&mut self.len[Self::len_index(c, j)], true);
            }
            if k < width {
                rc.bit(&mut self.len[Self::len_index(c, k)], false);
            }
            for bit in (0..k - 1).rev() {
                rc.bit(&mut self.low[Self::low_index(c, k, bit)], (z >> bit) & 1 == 1);
            }
        }
        changed
    }

    /// Decodes one tensor's elements against `data` (its base bytes),
    /// writing each change and logging what it overwrote.
    fn decode_tensor(
        &mut self,
        dec: &mut RangeDecoder<'_>,
        t: &TensorDelta,
        data: &mut [u8],
        log: &mut Undo,
    ) -> Result<(), DeltaError> {
        let elem = t.elem;
        let size = elem.size();
        let n = data.len() / size;
        let width = 8 * size;
        let mut hist = 0usize;
        let mut changed = 0u64;
        for i in 0..n {
            let a = read_elem(data, elem, i);
            let c = Ctx::of(elem, a);
            let moved = dec.bit(&mut self.pos[Self::pos_index(c, hist)]);
            hist = ((hist << 1) | usize::from(moved)) & 3;
            if !moved {
                continue;
            }
            changed += 1;
            if changed > t.changed {
                return Err(DeltaError::Malformed(format!("tensor {:?}: more than {} changes", t.name, t.changed)));
            }
            let mut k = 1;
            while k < width && dec.bit(&mut self.len[Self::len_index(c, k)]) {
                k += 1;
            }
            let mut z = 1u32;
            for bit in (0..k - 1).rev() {
                z = (z << 1) | u32::from(dec.bit(&mut self.low[Self::low_index(c, k, bit)]));
            }
            // z ≥ 1, so the new bits differ from the old.
            let b = unzigzag_apply(elem, a, z);
            let at = i * size;
            log.indices.push(i);
            log.old.extend_from_slice(&data[at..at + size]);
            data[at..at + size].copy_from_slice(&b.to_le_bytes()[..size]);
        }
        if changed != t.changed {
            return Err(DeltaError::Malformed(format!(
                "tensor {:?}: {changed} changes, {} announced",
                t.name, t.changed
            )));
        }
        Ok(())
    }
}
