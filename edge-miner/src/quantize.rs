//! Re-quantizing GGUF files with llama.cpp's own quantizer.

use std::ffi::CString;
use std::path::Path;

/// Target formats (`llama_ftype` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// Every matrix F16.
    F16,
    /// Every matrix BF16.
    Bf16,
    /// 4-bit, one scale per 32 values.
    Q4_0,
    /// 4-bit, scale and minimum per 32 values (the shipped SmolLM2 file).
    Q4_1,
    /// 8-bit, one scale per 32 values.
    Q8_0,
}

impl FileType {
    /// llama.cpp's `llama_ftype` number.
    pub fn llama_ftype(self) -> u32 {
        match self {
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 7,
            Self::Bf16 => 32,
        }
    }
}

/// Why quantization failed.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// The llama.cpp backend could not be initialised.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// A path is not valid UTF-8 or holds a NUL byte.
    #[error("unusable path {0}")]
    Path(String),
    /// llama.cpp returned a non-zero status.
    #[error("llama_model_quantize({input} -> {output}) failed with status {status}")]
    Failed {
        /// Input file.
        input: String,
        /// Output file.
        output: String,
        /// llama.cpp's status code.
        status: u32,
    },
}

fn c_path(p: &Path) -> Result<CString, QuantizeError> {
    p.to_str().and_then(|s| CString::new(s).ok()).ok_or_else(|| QuantizeError::Path(p.display().to_string()))
}

/// Writes `output`, a copy of the GGUF model `input` with its matrices in
/// `ftype` (norms stay F32), using `threads` threads (0: all cores).
pub fn quantize(input: &Path, output: &Path, ftype: FileType, threads: usize) -> Result<(), QuantizeError> {
    crate::llama::llama_backend()?;
    let inp = c_path(input)?;
    let out = c_path(output)?;
    // SAFETY: plain C call returning a struct by value.
    let mut params = unsafe { llama_cpp_sys_2::llama_model_quantize_default_params() };
    params.ftype = ftype.llama_ftype() as _;
    params.nthread = i32::try_from(threads).unwrap_or(0);
    params.allow_requantize = true;
    // SAFETY: both strings are valid NUL-terminated paths that outlive the
    // call, and `params` is a fully initialised value from the default constructor.
    let status = unsafe { llama_cpp_sys_2::llama_model_quantize(inp.as_ptr(), out.as_ptr(), &params) };
    if status != 0 {
        return Err(QuantizeError::Failed {
            input: input.display().to_string(),
            output: output.display().to_string(),
            status,
        });
    }
    Ok(())
}
