//! The strict reader: [`parse_header`] over untrusted bytes.

use std::collections::HashSet;

use super::*;

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

pub(super) fn check_dims(name: &str, dims: &[u64], ty: GgmlType) -> Result<(), GgufError> {
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
