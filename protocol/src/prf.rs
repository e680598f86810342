//! Domain-separated pseudo-random functions on BLAKE3.
//!
//! Every piece of protocol randomness (task assignment, sketch coefficients,
//! challenged positions, the uniform draws of seeded sampling) is a PRF of a
//! coordinator-issued [`Seed`] and public context, so any two roles derive the
//! same values and nobody can choose them.
//!
//! Construction: `blake3::Hasher::new_derive_key(`[`PRF_CONTEXT`]`)`, then the
//! label and every part, each written as its length (`u64`, little-endian)
//! followed by its bytes; the output is read from the BLAKE3 XOF. Length
//! prefixes make the framing injective: `("ab", "c")` and `("a", "bc")` give
//! unrelated outputs.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// BLAKE3 key-derivation context shared by every PRF call in the protocol.
pub const PRF_CONTEXT: &str = crate::domain::context::PRF;

/// The labels (domains) used by the protocol. One label per purpose; never
/// reuse a label for a new purpose.
pub mod labels {
    /// Per-(window, miner, group) task seed ([`crate::env::task_seed`]).
    pub const TASK: &str = "task";
    /// Sketch coefficient vector ([`crate::sketch::SketchKey::derive`]).
    pub const SKETCH_COEFFS: &str = "sketch-coeffs";
    /// Challenged positions of a rollout ([`crate::sketch::challenged_positions`]).
    pub const CHALLENGE: &str = "challenge";
    /// Uniform draws of seeded sampling ([`crate::sampling::draw_u`]).
    pub const SAMPLING: &str = "sampling";
    /// Random stream of a procedural environment ([`crate::env`]).
    pub const ENV: &str = "env";
}

/// 32 bytes of randomness issued by the coordinator (window seed, sampling
/// seed, challenge secret). Displays and parses as 64 lowercase hex digits;
/// serializes as a hex string in human-readable formats and as 32 raw bytes
/// otherwise.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Seed(pub [u8; 32]);

impl Seed {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A seed derived from this one for a sub-purpose: `PRF(label, [self, parts...])`.
    pub fn derive(&self, label: &str, parts: &[&[u8]]) -> Seed {
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&self.0);
        all.extend_from_slice(parts);
        prf_seed(label, &all)
    }
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Seed({self})")
    }
}

/// Error parsing a [`Seed`] from hex.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SeedParseError {
    /// Not hex, or not exactly 64 hex digits.
    #[error("a seed is 64 hex digits: {0}")]
    Hex(#[from] hex::FromHexError),
}

impl FromStr for Seed {
    type Err = SeedParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out)?;
        Ok(Seed(out))
    }
}

impl Serialize for Seed {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(&self.to_string())
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Seed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let s = String::deserialize(deserializer)?;
            s.parse().map_err(serde::de::Error::custom)
        } else {
            <[u8; 32]>::deserialize(deserializer).map(Seed)
        }
    }
}

fn hasher(label: &str, parts: &[&[u8]]) -> blake3::Hasher {
    let mut h = blake3::Hasher::new_derive_key(PRF_CONTEXT);
    h.update(&(label.len() as u64).to_le_bytes());
    h.update(label.as_bytes());
    for part in parts {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h
}

/// Fills `out` with `PRF(label, parts)`.
pub fn prf_bytes(label: &str, parts: &[&[u8]], out: &mut [u8]) {
    hasher(label, parts).finalize_xof().fill(out);
}

/// The first 8 output bytes of `PRF(label, parts)` as a little-endian `u64`.
pub fn prf_u64(label: &str, parts: &[&[u8]]) -> u64 {
    let mut b = [0u8; 8];
    prf_bytes(label, parts, &mut b);
    u64::from_le_bytes(b)
}

/// A uniform draw in `[0, 1)` with 53 bits of precision: `(prf_u64 >> 11) · 2⁻⁵³`.
pub fn prf_unit_f64(label: &str, parts: &[&[u8]]) -> f64 {
    unit_f64(prf_u64(label, parts))
}

/// 32 output bytes of `PRF(label, parts)` as a [`Seed`].
pub fn prf_seed(label: &str, parts: &[&[u8]]) -> Seed {
    let mut b = [0u8; 32];
    prf_bytes(label, parts, &mut b);
    Seed(b)
}

/// Maps 64 random bits to `[0, 1)` using the top 53 bits.
pub fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// An endless deterministic stream of random bits: the BLAKE3 XOF of
/// `PRF(label, parts)`. Its algorithms ([`PrfStream::below`]) are defined here,
/// not borrowed from a crate whose sampling algorithms could change between
/// versions, so procedural tasks stay identical forever.
pub struct PrfStream {
    reader: blake3::OutputReader,
}

impl PrfStream {
    /// Opens the stream for `(label, parts)`.
    pub fn new(label: &str, parts: &[&[u8]]) -> Self {
        Self { reader: hasher(label, parts).finalize_xof() }
    }

    /// The next 8 bytes as a little-endian `u64`.
    pub fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.reader.fill(&mut b);
        u64::from_le_bytes(b)
    }

    /// A uniform integer in `[0, n)` by rejection sampling (no modulo bias):
    /// draw `x`, accept when `x < ⌊2⁶⁴/n⌋·n`, answer `x mod n`. `n = 0` gives 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        let limit = (u64::MAX / n) * n;
        loop {
            let x = self.next_u64();
            if x < limit {
                return x % n;
            }
        }
    }

    /// A uniform integer in `[lo, hi]` (inclusive); `lo` when `hi < lo`.
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// A uniform draw in `[0, 1)` (53 bits).
    pub fn unit_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_is_injective() {
        let a = prf_u64("l", &[b"ab", b"c"]);
        let b = prf_u64("l", &[b"a", b"bc"]);
        let c = prf_u64("l", &[b"abc"]);
        let d = prf_u64("la", &[b"bc"]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        assert_ne!(c, d);
    }

    #[test]
    fn fixed_vectors_are_stable() {
        // Pinned outputs: a change here changes every derived task, coefficient
        // and draw in the protocol, which is a protocol version bump.
        let s = Seed([7u8; 32]);
        let x = prf_u64(labels::SAMPLING, &[&s.0, b"x"]);
        let again = prf_u64(labels::SAMPLING, &[&s.0, b"x"]);
        assert_eq!(x, again);
        let mut long = [0u8; 100];
        prf_bytes(labels::SAMPLING, &[&s.0, b"x"], &mut long);
        assert_eq!(u64::from_le_bytes(long[..8].try_into().unwrap()), x, "XOF prefix property");
        assert_eq!(format!("{:016x}", x), PINNED_SAMPLING_X);
    }

    const PINNED_SAMPLING_X: &str = "6477b5b0cc64cbc3";

    #[test]
    fn unit_is_in_range() {
        assert_eq!(unit_f64(0), 0.0);
        assert!(unit_f64(u64::MAX) < 1.0);
        for i in 0..1000u32 {
            let u = prf_unit_f64("t", &[&i.to_le_bytes()]);
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn seed_hex_and_serde_round_trip() {
        let s = Seed(core::array::from_fn(|i| i as u8));
        let text = s.to_string();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<Seed>().unwrap(), s);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<Seed>(&json).unwrap(), s);
        let bin = postcard::to_allocvec(&s).unwrap();
        assert_eq!(bin.len(), 32);
        assert_eq!(postcard::from_bytes::<Seed>(&bin).unwrap(), s);
        assert!("zz".parse::<Seed>().is_err());
        assert!("00".parse::<Seed>().is_err());
    }

    #[test]
    fn below_is_in_range_and_covers() {
        let mut st = PrfStream::new("t", &[b"below"]);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            let x = st.below(7);
            seen[x as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800 && c < 1200), "{seen:?}");
        assert_eq!(st.below(0), 0);
        assert_eq!(st.below(1), 0);
        assert_eq!(st.range_inclusive(5, 5), 5);
        let r = st.range_inclusive(3, 6);
        assert!((3..=6).contains(&r));
    }
}
