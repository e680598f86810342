//! Dequantization of ggml tensor data to `f32`, and `f32` → BF16.
//!
//! Block layouts (ggml `ggml-common.h`), all little-endian:
//! - `Q4_0`: 32 elements in 18 bytes: f16 scale `d`, then 16 bytes of
//!   nibbles; byte `j` holds element `j` in its low nibble and element `j+16`
//!   in its high nibble; `x = (q - 8) * d`.
//! - `Q4_1`: 32 elements in 20 bytes: f16 `d`, f16 min `m`, 16 nibble bytes
//!   as above; `x = q * d + m`.
//! - `Q8_0`: 32 elements in 34 bytes: f16 `d`, 32 × i8; `x = q * d`.
//! - `F32`, `F16`, `BF16`: plain little-endian element arrays.

use half::{bf16, f16};

use crate::gguf::GgmlType;

/// Errors from dequantization.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantError {
    /// This type cannot be dequantized here.
    #[error("dequantization of {0:?} is not supported")]
    Unsupported(GgmlType),
    /// The byte length does not match the element count.
    #[error("{ty:?}: {n} elements need {expected} bytes, got {got}")]
    Length {
        /// Element type.
        ty: GgmlType,
        /// Element count requested.
        n: usize,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// Whether [`dequantize`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Dequantize `bytes` of type `ty` into `out` (one `f32` per element).
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let n = out.len();
    let expected = ty.bytes_for(n as u64).map(|b| b as usize);
    if expected != Some(bytes.len()) {
        return Err(QuantError::Length { ty, n, expected: expected.unwrap_or(usize::MAX), got: bytes.len() });
    }
    let h16 = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = h16(c);
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(18)) {
                let d = h16(&b[0..2]);
                for (j, &q) in b[2..18].iter().enumerate() {
                    o[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
                    o[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(20)) {
                let d = h16(&b[0..2]);
                let m = h16(&b[2..4]);
                for (j, &q) in b[4..20].iter().enumerate() {
                    o[j] = f32::from(q & 0x0f) * d + m;
                    o[j + 16] = f32::from(q >> 4) * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(34)) {
                let d = h16(&b[0..2]);
                for (oj, &q) in o.iter_mut().zip(&b[2..34]) {
                    *oj = f32::from(q as i8) * d;
                }
            }
        }
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// Dequantize `bytes` of type `ty` holding `n` elements.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    // Check the length before allocating `n` floats.
    let expected = ty.bytes_for(n as u64).map(|b| b as usize);
    if expected != Some(bytes.len()) {
        return Err(QuantError::Length { ty, n, expected: expected.unwrap_or(usize::MAX), got: bytes.len() });
    }
    let mut out = vec![0f32; n];
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

/// `f32` → BF16 with round-to-nearest-even (NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// Encode `f32` values as little-endian BF16 bytes (round-to-nearest-even).
pub fn f32_to_bf16_bytes(xs: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(xs.len() * 2);
    for &x in xs {
        out.extend_from_slice(&bf16::from_f32(x).to_le_bytes());
    }
    out
}

/// Encode `f32` values as little-endian F32 bytes.
pub fn f32_to_le_bytes(xs: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(xs.len() * 4);
    for &x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_0_block() {
        let mut b = Vec::new();
        b.extend_from_slice(&h(0.5));
        // byte j: low nibble j % 16, high nibble 15 - j
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let v = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(v[j + 16], ((15 - j) as f32 - 8.0) * 0.5);
        }
    }

    #[test]
    fn q4_1_block() {
        let mut b = Vec::new();
        b.extend_from_slice(&h(0.25));
        b.extend_from_slice(&h(-1.0));
        for j in 0..16u8 {
            b.push((j % 16) | (((j + 3) % 16) << 4));
        }
        let v = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], j as f32 * 0.25 - 1.0);
            assert_eq!(v[j + 16], ((j + 3) % 16) as f32 * 0.25 - 1.0);
        }
    }

    #[test]
    fn q8_0_two_blocks() {
        let mut b = Vec::new();
        for (d, base) in [(2.0f32, -16i32), (-0.125, 90)] {
            b.extend_from_slice(&h(d));
            for j in 0..32 {
                b.push((base + j) as i8 as u8);
            }
        }
        let v = dequantize(GgmlType::Q8_0, &b, 64).unwrap();
        for j in 0..32 {
            assert_eq!(v[j], (-16 + j as i32) as f32 * 2.0);
            assert_eq!(v[32 + j], (90 + j as i32) as f32 * -0.125);
        }
    }

    #[test]
    fn plain_types() {
        let xs = [1.5f32, -0.0, 3.0e-3, 65504.0];
        let f32b = f32_to_le_bytes(&xs);
        assert_eq!(dequantize(GgmlType::F32, &f32b, 4).unwrap(), xs);
        let f16b: Vec<u8> = xs.iter().flat_map(|&x| h(x)).collect();
        let v = dequantize(GgmlType::F16, &f16b, 4).unwrap();
        assert_eq!(v[0], 1.5);
        assert_eq!(v[3], 65504.0);
        let bfb = f32_to_bf16_bytes(&xs);
        let v = dequantize(GgmlType::BF16, &bfb, 4).unwrap();
        assert_eq!(v[0], 1.5);
        assert_eq!(v[1].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly half-way between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)).to_f32(), 1.0);
        // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)).to_f32(), 1.0 + 2f32.powi(-6));
        // Just above half-way rounds up.
        assert_eq!(f32_to_bf16(f32::from_bits(1.0f32.to_bits() + 0x8001)).to_f32(), 1.0 + 2f32.powi(-7));
        assert!(f32_to_bf16(f32::NAN).is_nan());
    }

    #[test]
    fn bad_lengths_and_types() {
        assert!(matches!(dequantize(GgmlType::Q4_1, &[0; 19], 32), Err(QuantError::Length { .. })));
        assert!(matches!(dequantize(GgmlType::Q4_1, &[0; 20], 31), Err(QuantError::Length { .. })));
        assert!(matches!(dequantize(GgmlType::F32, &[0; 4], usize::MAX), Err(QuantError::Length { .. })));
        assert_eq!(dequantize(GgmlType::Q6_K, &[0; 210], 256), Err(QuantError::Unsupported(GgmlType::Q6_K)));
    }
}
