//! The hidden-state sketch: a 31-bit commitment to the model's final hidden
//! state at every position of a rollout (grail's GRAIL proof, §1 of
//! `grail.md`, with our own randomness schedule and constants).
//!
//! For a hidden vector `h ∈ ℝᵈ` (the final, post-RMSNorm state that feeds the
//! LM head):
//! 1. take the `top_k` coordinates by `|h_i|` (ties: lower index first; NaN
//!    ranks below every number, ±∞ above every finite value);
//! 2. map each selected value to a signed logarithmic bucket
//!    ([`bucket`]: `±⌊log2(|x|+1)·B/10⌋`, clamped to `B−1`);
//! 3. `sketch = Σ bucket(h_i)·r_i  mod Q`, `Q = 2³¹−1`, where `r ∈ [−127, 127]ᵈ`
//!    is the coefficient vector of a [`SketchKey`].
//!
//! **Difference from grail:** grail multiplies the j-th selected value (in rank
//! or index order) by the j-th coefficient, so one coordinate entering or
//! leaving the top-k set shifts the pairing of every later coefficient and
//! moves the sketch by thousands. Here the coefficient belongs to the *hidden
//! dimension* (`r` has one entry per dimension), so a coordinate swapping
//! across the top-k boundary moves the sketch by at most
//! `(|b_out| + |b_in|)·127` and a bucket flip by `127·Δb`; rank order is
//! irrelevant. That lets the tolerance stay tight while honest drift
//! (different kernels, quantized activations) is absorbed.
//!
//! **Randomness schedule.** A miner commits a sketch at *every* position
//! (prompt included) while generating, before anyone knows which positions
//! will be checked:
//! - the coefficient vector comes from the window's **sampling seed**, which
//!   the coordinator publishes when the window opens (the miner needs it to
//!   compute sketches at all): [`SketchKey::derive`];
//! - the **challenged positions** come from the coordinator's **challenge
//!   secret**, revealed only after submissions close, and the rollout's digest:
//!   [`challenged_positions`]. A miner therefore cannot know which positions
//!   will be checked, and must commit honestly everywhere. Grail lets the
//!   miner choose the coefficient seed and never checks it; here neither value
//!   is chosen by the miner, and the validator re-derives both.
//!
//! Wire form: [`encode_sketches`] writes each sketch as its signed residue in
//! `(−Q/2, Q/2]`, zigzag, LEB128 — 3 bytes for every honest value with the
//! default parameters (|Σ| ≤ 32·15·127 = 60 960).

use std::collections::BTreeMap;

use crate::prf::{PrfStream, Seed, labels};

/// The sketch modulus `Q = 2³¹ − 1`.
pub const Q: u32 = 2_147_483_647;

/// Largest supported `top_k` (the selection runs in a stack buffer of this size).
pub const MAX_TOP_K: usize = 64;

/// Number of challenged completion positions per checked rollout.
pub const CHALLENGE_K: usize = 32;

/// Parameters of the sketch and its tolerance.
///
/// [`SketchParams::DEFAULT`] is the single place the constants live: grail's
/// v1-era k = 32 and 16 buckets per sign. Calibration (`docs/calibration.md`):
/// honest llama.cpp-vs-libtorch distance was 0 at every challenged position
/// (plain f32 on both sides: hidden states agree to ~5e-6 relative), so the
/// tolerance is not set by drift but by the rare honest event it must absorb:
/// one coordinate swapping across the top-k boundary, `(|b_out| + |b_in|)·|r|`
/// ≤ ~1000 for the bucket values found at the boundary. Every required cheater
/// is rejected by the sampling check regardless.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SketchParams {
    /// Number of coordinates (largest `|h_i|`) that enter the sketch.
    pub top_k: usize,
    /// Buckets per sign `B`; bucket values lie in `[−(B−1), B−1]`, and the
    /// bucket width is `10/B` octaves of `|x|+1`.
    pub buckets: u8,
    /// Tolerance at position 0, in sketch units.
    pub tol_base: u32,
    /// Tolerance growth: `τ(p) = tol_base + ⌊tol_growth·√p⌋`.
    pub tol_growth: f32,
}

impl SketchParams {
    /// The protocol's current parameters.
    pub const DEFAULT: SketchParams = SketchParams { top_k: 32, buckets: 16, tol_base: 1000, tol_growth: 10.0 };

    /// Checks that the parameters are usable.
    pub fn validate(&self) -> Result<(), SketchError> {
        if self.top_k == 0 || self.top_k > MAX_TOP_K {
            return Err(SketchError::BadParams("top_k must be in 1..=64"));
        }
        if self.buckets == 0 || self.buckets > 127 {
            return Err(SketchError::BadParams("buckets must be in 1..=127"));
        }
        if !self.tol_growth.is_finite() || self.tol_growth < 0.0 {
            return Err(SketchError::BadParams("tol_growth must be finite and non-negative"));
        }
        Ok(())
    }
}

impl Default for SketchParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Errors of sketch computation (programming or configuration errors; the
/// inputs are the validator's or miner's own model outputs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SketchError {
    /// The hidden vector's length differs from the key's dimension.
    #[error("hidden vector has {got} entries, sketch key is for {expected}")]
    DimMismatch {
        /// The key's dimension.
        expected: usize,
        /// The hidden vector's length.
        got: usize,
    },
    /// Unusable [`SketchParams`].
    #[error("bad sketch parameters: {0}")]
    BadParams(&'static str),
}

/// Errors decoding the sketch wire form (untrusted bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SketchWireError {
    /// The bytes end inside a varint.
    #[error("truncated sketch varint at byte {0}")]
    Truncated(usize),
    /// A varint longer than 5 bytes, or with a redundant trailing zero byte.
    #[error("malformed sketch varint at byte {0}")]
    Malformed(usize),
    /// A decoded value outside the encodable range.
    #[error("sketch value out of range at byte {0}")]
    OutOfRange(usize),
    /// More values than the caller allows.
    #[error("more than {0} sketches")]
    TooMany(usize),
}

/// The per-window coefficient vector: one coefficient in `[−127, 127]` per
/// hidden dimension, derived from the window's sampling seed only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SketchKey {
    coeffs: Vec<i8>,
}

impl SketchKey {
    /// `r_i = below(255) − 127` for `i = 0..hidden_dim`, read from
    /// `PrfStream(SKETCH_COEFFS, [sampling_seed, hidden_dim as u32 LE])`.
    pub fn derive(sampling_seed: &Seed, hidden_dim: usize) -> Self {
        Self { coeffs: coefficients(sampling_seed, hidden_dim) }
    }

    /// A key from explicit coefficients (tests, calibration).
    pub fn from_coefficients(coeffs: Vec<i8>) -> Self {
        Self { coeffs }
    }

    /// The coefficient vector.
    pub fn coefficients(&self) -> &[i8] {
        &self.coeffs
    }

    /// The hidden dimension this key is for.
    pub fn dim(&self) -> usize {
        self.coeffs.len()
    }
}

/// The coefficient vector for `hidden_dim` dimensions (see [`SketchKey::derive`]).
pub fn coefficients(sampling_seed: &Seed, hidden_dim: usize) -> Vec<i8> {
    let dim = u32::try_from(hidden_dim).unwrap_or(u32::MAX);
    let mut st = PrfStream::new(labels::SKETCH_COEFFS, &[&sampling_seed.0, &dim.to_le_bytes()]);
    (0..hidden_dim).map(|_| (st.below(255) as i16 - 127) as i8).collect()
}

/// Signed logarithmic bucket of one value with `buckets` buckets per sign
/// (grail.md §1.2, computed in `f64`):
/// NaN → 0; ±∞ → ±(B−1); `|x| < 1e-6` → 0; otherwise
/// `b = clamp(⌊log2(|x|+1)·B/10⌋, 0, B−1)`, `+b` if `x ≥ 0` else `−b`.
pub fn bucket(x: f32, buckets: u8) -> i32 {
    let top = i32::from(buckets.max(1)) - 1;
    if x.is_nan() {
        return 0;
    }
    if x.is_infinite() {
        return if x > 0.0 { top } else { -top };
    }
    let a = f64::from(x).abs();
    if a < 1e-6 {
        return 0;
    }
    let scale = f64::from(buckets) / 10.0;
    let b = ((a + 1.0).log2() * scale).floor();
    let b = if b < 0.0 {
        0
    } else if b >= f64::from(top) {
        top
    } else {
        b as i32
    };
    if x >= 0.0 { b } else { -b }
}

/// Selection key: NaN ranks below everything (−1), otherwise `|x|` (∞ on top).
#[inline]
fn magnitude(x: f32) -> f32 {
    if x.is_nan() { -1.0 } else { x.abs() }
}

/// Indices of the `k` largest `|h_i|` (ties → lower index first), written to
/// `out[..k]` in rank order; returns `k' = min(k, h.len(), MAX_TOP_K)`.
/// Allocation-free.
pub fn top_k_indices(h: &[f32], k: usize, out: &mut [u32; MAX_TOP_K]) -> usize {
    let k = k.min(h.len()).min(MAX_TOP_K);
    if k == 0 {
        return 0;
    }
    let mut mags = [0f32; MAX_TOP_K];
    let mut n = 0usize;
    for (i, &x) in h.iter().enumerate() {
        let m = magnitude(x);
        if n == k {
            // Equal magnitude never displaces an earlier (lower) index.
            if m <= mags[k - 1] {
                continue;
            }
            n -= 1;
        }
        // Insert after every entry with magnitude >= m (stable by index).
        let mut p = n;
        while p > 0 && mags[p - 1] < m {
            mags[p] = mags[p - 1];
            out[p] = out[p - 1];
            p -= 1;
        }
        mags[p] = m;
        out[p] = i as u32;
        n += 1;
    }
    n
}

/// The raw (unreduced) sketch dot product `Σ bucket(h_i)·r_i` over the top-k.
pub fn sketch_dot(h: &[f32], key: &SketchKey, params: &SketchParams) -> Result<i64, SketchError> {
    params.validate()?;
    if h.len() != key.coeffs.len() {
        return Err(SketchError::DimMismatch { expected: key.coeffs.len(), got: h.len() });
    }
    let mut idx = [0u32; MAX_TOP_K];
    let n = top_k_indices(h, params.top_k, &mut idx);
    Ok(idx[..n]
        .iter()
        .map(|&i| i64::from(bucket(h[i as usize], params.buckets)) * i64::from(key.coeffs[i as usize]))
        .sum())
}

/// The sketch of one hidden vector, in `[0, Q)`.
pub fn sketch(h: &[f32], key: &SketchKey, params: &SketchParams) -> Result<u32, SketchError> {
    sketch_dot(h, key, params).map(reduce)
}

/// Sketches of `rows` hidden vectors stored row-major in `hidden`
/// (`hidden.len() == rows · key.dim()`).
pub fn sketch_rows(hidden: &[f32], key: &SketchKey, params: &SketchParams) -> Result<Vec<u32>, SketchError> {
    let d = key.dim();
    if d == 0 || !hidden.len().is_multiple_of(d) {
        return Err(SketchError::DimMismatch { expected: d, got: hidden.len() });
    }
    hidden.chunks_exact(d).map(|row| sketch(row, key, params)).collect()
}

/// `x mod Q` in `[0, Q)`.
pub fn reduce(x: i64) -> u32 {
    x.rem_euclid(i64::from(Q)) as u32
}

/// Modular distance `min(|a−b|, Q−|a−b|)` of two sketches (each reduced mod Q
/// first, so out-of-field values from untrusted input are handled).
pub fn distance(a: u32, b: u32) -> u32 {
    let (a, b) = (a % Q, b % Q);
    let d = a.abs_diff(b);
    d.min(Q - d)
}

/// Tolerance at absolute position `pos` (prompt included):
/// `τ(p) = tol_base + ⌊tol_growth·√p⌋` (saturating).
pub fn tolerance(pos: usize, params: &SketchParams) -> u32 {
    let grow = (f64::from(params.tol_growth) * (pos as f64).sqrt()).floor();
    // `as` saturates (and maps NaN to 0).
    params.tol_base.saturating_add(grow as u32)
}

/// Whether a committed sketch matches the validator's within `τ(pos)`.
pub fn sketch_matches(committed: u32, reference: u32, pos: usize, params: &SketchParams) -> bool {
    distance(committed, reference) <= tolerance(pos, params)
}

/// The challenged positions of one rollout: `min(k, n)` distinct absolute
/// positions in the completion `[prompt_len, total_len)`, sorted ascending.
///
/// Derivation: `n = total_len − prompt_len`; if `k ≥ n` every completion
/// position; otherwise a partial Fisher–Yates shuffle of `0..n` driven by
/// `PrfStream(CHALLENGE, [challenge_secret, rollout_digest])`
/// (`for i in 0..k: j = i + below(n − i); swap(i, j)`), the first `k` entries
/// sorted and offset by `prompt_len`.
pub fn challenged_positions(
    challenge_secret: &Seed,
    rollout_digest: &[u8; 32],
    prompt_len: usize,
    total_len: usize,
    k: usize,
) -> Vec<usize> {
    let n = total_len.saturating_sub(prompt_len);
    if k >= n {
        return (prompt_len..total_len).collect();
    }
    let mut st = PrfStream::new(labels::CHALLENGE, &[&challenge_secret.0, rollout_digest]);
    // Virtual array a[i] = i, with swapped entries kept in a map.
    let mut moved: BTreeMap<u64, u64> = BTreeMap::new();
    let mut picked = Vec::with_capacity(k);
    let n = n as u64;
    for i in 0..k as u64 {
        let j = i + st.below(n - i);
        let ai = *moved.get(&i).unwrap_or(&i);
        let aj = *moved.get(&j).unwrap_or(&j);
        moved.insert(j, ai);
        picked.push(aj as usize + prompt_len);
    }
    picked.sort_unstable();
    picked
}

const HALF: i64 = (Q / 2) as i64; // 1_073_741_823; Q = 2·HALF + 1

fn to_signed(s: u32) -> i64 {
    let s = i64::from(s);
    let q = i64::from(Q);
    if s <= HALF {
        s
    } else if s < q {
        s - q
    } else {
        // Out-of-field values (never produced by `sketch`) get their own range
        // so the encoding stays injective over all of u32.
        s - q + HALF + 1
    }
}

fn from_signed(v: i64) -> Option<u32> {
    let q = i64::from(Q);
    let max_extra = HALF + 1 + (i64::from(u32::MAX) - q);
    let s = if (-HALF..0).contains(&v) {
        v + q
    } else if (0..=HALF).contains(&v) {
        v
    } else if (HALF + 1..=max_extra).contains(&v) {
        v - HALF - 1 + q
    } else {
        return None;
    };
    u32::try_from(s).ok()
}

/// Appends the compact wire form of `values` to `out` (see module docs).
/// Total over `u32`: even out-of-field values round-trip.
pub fn encode_sketches(values: &[u32], out: &mut Vec<u8>) {
    for &s in values {
        let v = to_signed(s);
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let byte = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
}

/// Decodes the wire form written by [`encode_sketches`], rejecting more than
/// `max_count` values, truncated or non-canonical varints and out-of-range
/// values. Never allocates more than `min(bytes.len(), max_count)` entries.
pub fn decode_sketches(bytes: &[u8], max_count: usize) -> Result<Vec<u32>, SketchWireError> {
    let mut out = Vec::with_capacity(bytes.len().min(max_count));
    let mut i = 0;
    while i < bytes.len() {
        if out.len() == max_count {
            return Err(SketchWireError::TooMany(max_count));
        }
        let start = i;
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            let Some(&b) = bytes.get(i) else {
                return Err(SketchWireError::Truncated(start));
            };
            i += 1;
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if b == 0 && i - start > 1 {
                    return Err(SketchWireError::Malformed(start));
                }
                break;
            }
            shift += 7;
            if shift >= 35 {
                return Err(SketchWireError::Malformed(start));
            }
        }
        let v = ((z >> 1) as i64) ^ -((z & 1) as i64);
        out.push(from_signed(v).ok_or(SketchWireError::OutOfRange(start))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_edges_and_sign() {
        // B = 16: edges at 2^(0.625 b) − 1: 0.542, 1.378, 2.668, ...
        assert_eq!(bucket(0.0, 16), 0);
        assert_eq!(bucket(5e-7, 16), 0);
        assert_eq!(bucket(-5e-7, 16), 0);
        assert_eq!(bucket(0.54, 16), 0);
        assert_eq!(bucket(0.55, 16), 1);
        assert_eq!(bucket(-0.55, 16), -1);
        assert_eq!(bucket(1.37, 16), 1);
        assert_eq!(bucket(1.38, 16), 2);
        assert_eq!(bucket(-1.38, 16), -2);
        assert_eq!(bucket(2.66, 16), 2);
        assert_eq!(bucket(2.67, 16), 3);
        assert_eq!(bucket(662.0, 16), 14);
        assert_eq!(bucket(664.0, 16), 15);
        assert_eq!(bucket(1e30, 16), 15);
        assert_eq!(bucket(-1e30, 16), -15);
        assert_eq!(bucket(f32::INFINITY, 16), 15);
        assert_eq!(bucket(f32::NEG_INFINITY, 16), -15);
        assert_eq!(bucket(f32::NAN, 16), 0);
        // B = 8 (grail v5): edges 1.378, 4.657, 12.45 ...
        assert_eq!(bucket(1.37, 8), 0);
        assert_eq!(bucket(1.38, 8), 1);
        assert_eq!(bucket(4.66, 8), 2);
        assert_eq!(bucket(-500.0, 8), -7);
        // Exact edge: log2(1+1)·1.6 = 1.6 → 1; |x| = 2^(1/1.6) − 1 is the edge of bucket 1.
        let edge = (2f64.powf(1.0 / 1.6) - 1.0) as f32;
        assert_eq!(bucket(edge * 1.0001, 16), 1);
        assert_eq!(bucket(edge * 0.9999, 16), 0);
    }

    #[test]
    fn top_k_tie_breaking_and_nan() {
        let mut out = [0u32; MAX_TOP_K];
        let h = [1.0, -3.0, 3.0, 2.0, -2.0, 0.5];
        let n = top_k_indices(&h, 3, &mut out);
        assert_eq!(&out[..n], &[1, 2, 3], "|−3| ties with 3: lower index first; |2| ties with |−2|: index 3");
        let n = top_k_indices(&h, 4, &mut out);
        assert_eq!(&out[..n], &[1, 2, 3, 4]);
        let h = [f32::NAN, 0.0, -0.0, f32::NEG_INFINITY, 1e-9];
        let n = top_k_indices(&h, 3, &mut out);
        assert_eq!(&out[..n], &[3, 4, 1], "∞ first, NaN last, 0 vs −0 tie by index");
        let n = top_k_indices(&h, 5, &mut out);
        assert_eq!(&out[..n], &[3, 4, 1, 2, 0]);
        let n = top_k_indices(&h, 100, &mut out);
        assert_eq!(n, 5);
        assert_eq!(top_k_indices(&[], 3, &mut out), 0);
        // Brute force agreement on a pseudo-random vector with many ties.
        let mut st = PrfStream::new("test", &[b"topk"]);
        let h: Vec<f32> = (0..576).map(|_| (st.below(41) as f32 - 20.0) / 4.0).collect();
        let n = top_k_indices(&h, 32, &mut out);
        let mut all: Vec<u32> = (0..h.len() as u32).collect();
        all.sort_by(|&a, &b| h[b as usize].abs().total_cmp(&h[a as usize].abs()).then(a.cmp(&b)));
        assert_eq!(&out[..n], &all[..32]);
    }

    #[test]
    fn sketch_fixed_vector() {
        let key = SketchKey::from_coefficients(vec![1, -2, 3, 127, -127, 5]);
        let p = SketchParams { top_k: 3, ..SketchParams::DEFAULT };
        // top-3 by |h|: idx 3 (−700 → −15), idx 4 (8 → 5), idx 1 (−1.5 → −2)
        let h = [0.1, -1.5, 0.2, -700.0, 8.0, 1.0];
        assert_eq!(bucket(8.0, 16), 5);
        let dot = -15 * 127 + 5 * -127 + -2 * -2;
        assert_eq!(sketch_dot(&h, &key, &p).unwrap(), dot);
        assert_eq!(sketch(&h, &key, &p).unwrap(), (i64::from(Q) + dot) as u32);
        assert!(matches!(sketch(&h[..5], &key, &p), Err(SketchError::DimMismatch { expected: 6, got: 5 })));
        let bad = SketchParams { top_k: 0, ..p };
        assert!(matches!(sketch(&h, &key, &bad), Err(SketchError::BadParams(_))));
        let rows = sketch_rows(&[h, h].concat(), &key, &p).unwrap();
        assert_eq!(rows, vec![reduce(dot); 2]);
    }

    #[test]
    fn coefficient_derivation() {
        let s = Seed([3; 32]);
        let a = coefficients(&s, 576);
        assert_eq!(a.len(), 576);
        assert!(a.iter().all(|&c| (-127..=127).contains(&c)));
        assert_eq!(a, coefficients(&s, 576));
        assert_ne!(a, coefficients(&Seed([4; 32]), 576));
        assert_ne!(a[..100], coefficients(&s, 100)[..], "dimension is bound into the stream");
        let distinct: std::collections::BTreeSet<i8> = a.iter().copied().collect();
        assert!(distinct.len() > 150);
    }

    #[test]
    fn distance_and_tolerance() {
        assert_eq!(distance(5, 3), 2);
        assert_eq!(distance(3, 5), 2);
        assert_eq!(distance(0, Q - 1), 1);
        assert_eq!(distance(Q - 1, 2), 3);
        assert_eq!(distance(Q, 0), 0);
        assert_eq!(distance(u32::MAX, 0), distance(u32::MAX % Q, 0));
        assert_eq!(distance(0, Q / 2), Q / 2);
        assert_eq!(distance(0, Q / 2 + 1), Q / 2);
        let p = SketchParams { tol_base: 100, tol_growth: 3.0, ..SketchParams::DEFAULT };
        assert_eq!(tolerance(0, &p), 100);
        assert_eq!(tolerance(100, &p), 130);
        assert_eq!(tolerance(99, &p), 129);
        let huge = SketchParams { tol_base: u32::MAX, ..p };
        assert_eq!(tolerance(1 << 40, &huge), u32::MAX);
        assert!(sketch_matches(reduce(-10), reduce(20), 0, &p));
        assert!(!sketch_matches(reduce(-100), reduce(20), 0, &p));
    }

    #[test]
    fn challenged_positions_properties() {
        let s = Seed([9; 32]);
        let d = [1u8; 32];
        let pos = challenged_positions(&s, &d, 20, 520, 32);
        assert_eq!(pos.len(), 32);
        assert!(pos.windows(2).all(|w| w[0] < w[1]));
        assert!(pos.iter().all(|&p| (20..520).contains(&p)));
        assert_eq!(pos, challenged_positions(&s, &d, 20, 520, 32));
        assert_ne!(pos, challenged_positions(&Seed([8; 32]), &d, 20, 520, 32));
        assert_ne!(pos, challenged_positions(&s, &[2; 32], 20, 520, 32));
        assert_eq!(challenged_positions(&s, &d, 20, 40, 32), (20..40).collect::<Vec<_>>());
        assert!(challenged_positions(&s, &d, 50, 40, 32).is_empty());
        let near = challenged_positions(&s, &d, 0, 33, 32);
        assert_eq!(near.len(), 32);
        // Roughly uniform coverage.
        let mut hits = [0u32; 10];
        for i in 0..2000u32 {
            let mut dg = [0u8; 32];
            dg[..4].copy_from_slice(&i.to_le_bytes());
            for p in challenged_positions(&s, &dg, 0, 100, 5) {
                hits[p / 10] += 1;
            }
        }
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
    }

    #[test]
    fn wire_round_trip_edges() {
        let vals = [0, 1, Q / 2, Q / 2 + 1, Q - 1, Q, Q + 1, u32::MAX, reduce(-60_960), reduce(60_960)];
        let mut buf = Vec::new();
        encode_sketches(&vals, &mut buf);
        assert_eq!(decode_sketches(&buf, 100).unwrap(), vals);
        let mut one = Vec::new();
        encode_sketches(&[reduce(-60_960)], &mut one);
        assert_eq!(one.len(), 3);
        one.clear();
        encode_sketches(&[reduce(60_960)], &mut one);
        assert_eq!(one.len(), 3);
        assert!(matches!(decode_sketches(&buf, 3), Err(SketchWireError::TooMany(3))));
        assert!(matches!(decode_sketches(&[0x80], 10), Err(SketchWireError::Truncated(0))));
        assert!(matches!(decode_sketches(&[0x81, 0x00], 10), Err(SketchWireError::Malformed(0))));
        assert!(matches!(decode_sketches(&[0xff; 6], 10), Err(SketchWireError::Malformed(0))));
        assert!(matches!(decode_sketches(&[0xff, 0xff, 0xff, 0xff, 0x7f], 10), Err(SketchWireError::OutOfRange(0))));
        assert_eq!(decode_sketches(&[], 0).unwrap(), Vec::<u32>::new());
    }
}
