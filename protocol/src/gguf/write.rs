//! The writer: [`GgufWriter`] (version 3, aligned tensor data).

use std::io::Write;

use super::read::check_dims;
use super::*;

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
