//! The rollout record: one completion of one task, with everything the
//! validator needs to prove it, and its compact binary encoding.
//!
//! Wire form ([`Rollout::encode`]):
//! `FORMAT_VERSION (1 byte) ‖ body ‖ signature (64 bytes)`, where `body` is
//! the postcard encoding of every field except the signature, with the
//! sketches in the compact form of [`crate::sketch::encode_sketches`]
//! (3 bytes per honest position instead of postcard's 5).
//!
//! Canonical bytes ([`Rollout::signing_bytes`]): `len(ROLLOUT_DOMAIN) as u32 LE ‖
//! ROLLOUT_DOMAIN ‖ body` — canonical, because `body` is re-encoded from the
//! decoded fields. [`Rollout::digest`] is BLAKE3 of the canonical bytes; it
//! names the rollout (dedupe) and seeds its challenged positions. The miner
//! signs the digest (ed25519 over
//! [`identity::domain_message`]`(identity::domain::ROLLOUT, digest)`), so a
//! verifier hashes the ~4 KiB rollout once, with BLAKE3, instead of twice
//! (BLAKE3 for the name, SHA-512 inside ed25519).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::checkpoint::ContentId;
use crate::env::EnvId;
use crate::identity::{self, IdentityError, Keypair};
use crate::sketch::{self, SketchWireError};

/// Domain of the signed bytes (equal to [`identity::domain::ROLLOUT`]).
pub const ROLLOUT_DOMAIN: &str = crate::domain::sign::ROLLOUT;

/// First byte of every encoded rollout.
pub const FORMAT_VERSION: u8 = 1;

/// Sampling parameters a rollout was generated with (set by the coordinator
/// per window; the validator requires equality).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy ([`crate::sampling`]).
    pub temperature: f32,
    /// Maximum number of completion tokens.
    pub max_new_tokens: u32,
}

/// One completion of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    /// Window the rollout belongs to.
    pub window: u64,
    /// Content id of the checkpoint that generated it.
    pub checkpoint: ContentId,
    /// Environment of the task.
    pub env: EnvId,
    /// Group index (which task of this miner in this window).
    pub group: u32,
    /// Index of this rollout within its group.
    pub rollout: u32,
    /// Task id ([`crate::env::task_seed`] of window, miner, group).
    pub task_id: u64,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Prompt tokens, then completion tokens.
    pub tokens: Vec<u32>,
    /// Number of prompt tokens at the start of `tokens`.
    pub prompt_len: u32,
    /// Raw-model (temperature 1) log-probability of each completion token.
    pub logprobs: Vec<f32>,
    /// One sketch per position (prompt included), `len == tokens.len()`.
    pub sketches: Vec<u32>,
    /// Reward the miner computed.
    pub reward: f32,
    /// The miner's ed25519 public key.
    pub miner: [u8; 32],
    /// Ed25519 signature over [`Rollout::digest`] (domain [`identity::domain::ROLLOUT`]).
    #[serde(with = "sig64")]
    pub signature: [u8; 64],
}

/// Bounds for decoding untrusted rollouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutLimits {
    /// Largest accepted encoding, in bytes.
    pub max_bytes: usize,
    /// Largest accepted number of tokens (and of log-probs and sketches).
    pub max_tokens: usize,
}

impl RolloutLimits {
    /// 16 384 tokens in at most 1 MiB.
    pub const DEFAULT: RolloutLimits = RolloutLimits { max_bytes: 1 << 20, max_tokens: 16_384 };
}

impl Default for RolloutLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why bytes are not a rollout.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RolloutError {
    /// Longer than the limit.
    #[error("encoded rollout is {len} bytes, limit {max}")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Shorter than version byte plus signature.
    #[error("encoded rollout is truncated")]
    Truncated,
    /// Unknown format version.
    #[error("unknown rollout format version {0}")]
    Version(u8),
    /// The body is not valid postcard for a rollout.
    #[error("malformed rollout body: {0}")]
    Body(postcard::Error),
    /// Bytes left between the body and the signature.
    #[error("{0} unexpected bytes after the rollout body")]
    Trailing(usize),
    /// More tokens, log-probs or sketches than the limit.
    #[error("{what}: {len} entries, limit {max}")]
    TooMany {
        /// Which list.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Malformed compact sketches.
    #[error("sketches: {0}")]
    Sketches(#[from] SketchWireError),
}

/// The body: every field but the signature, sketches compact.
#[derive(Serialize, Deserialize)]
struct Body<'a> {
    window: u64,
    checkpoint: ContentId,
    env: EnvId,
    group: u32,
    rollout: u32,
    task_id: u64,
    sampling: SamplingParams,
    tokens: Cow<'a, [u32]>,
    prompt_len: u32,
    logprobs: Cow<'a, [f32]>,
    sketches: Cow<'a, [u8]>,
    reward: f32,
    miner: [u8; 32],
}

impl Rollout {
    fn body(&self) -> Vec<u8> {
        let mut sk = Vec::with_capacity(self.sketches.len() * 3);
        sketch::encode_sketches(&self.sketches, &mut sk);
        let body = Body {
            window: self.window,
            checkpoint: self.checkpoint,
            env: self.env,
            group: self.group,
            rollout: self.rollout,
            task_id: self.task_id,
            sampling: self.sampling,
            tokens: Cow::Borrowed(&self.tokens),
            prompt_len: self.prompt_len,
            logprobs: Cow::Borrowed(&self.logprobs),
            sketches: Cow::Owned(sk),
            reward: self.reward,
            miner: self.miner,
        };
        // Serializing plain integers, floats and byte arrays into a Vec cannot fail.
        postcard::to_allocvec(&body).unwrap_or_default()
    }

    /// The compact binary encoding (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let body = self.body();
        let mut out = Vec::with_capacity(1 + body.len() + 64);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&body);
        out.extend_from_slice(&self.signature);
        out
    }

    /// Decodes untrusted bytes, enforcing `limits`. Never panics; allocation
    /// is bounded by the input size.
    pub fn decode(bytes: &[u8], limits: &RolloutLimits) -> Result<Self, RolloutError> {
        if bytes.len() > limits.max_bytes {
            return Err(RolloutError::TooLarge { len: bytes.len(), max: limits.max_bytes });
        }
        let (&version, rest) = bytes.split_first().ok_or(RolloutError::Truncated)?;
        if version != FORMAT_VERSION {
            return Err(RolloutError::Version(version));
        }
        let split = rest.len().checked_sub(64).ok_or(RolloutError::Truncated)?;
        let (body_bytes, sig) = rest.split_at(split);
        let (body, left): (Body<'_>, _) = postcard::take_from_bytes(body_bytes).map_err(RolloutError::Body)?;
        if !left.is_empty() {
            return Err(RolloutError::Trailing(left.len()));
        }
        let max = limits.max_tokens;
        for (what, len) in [("tokens", body.tokens.len()), ("logprobs", body.logprobs.len())] {
            if len > max {
                return Err(RolloutError::TooMany { what, len, max });
            }
        }
        let sketches = sketch::decode_sketches(&body.sketches, max).map_err(|e| match e {
            SketchWireError::TooMany(_) => RolloutError::TooMany { what: "sketches", len: max + 1, max },
            e => RolloutError::Sketches(e),
        })?;
        let mut signature = [0u8; 64];
        signature.copy_from_slice(sig);
        Ok(Rollout {
            window: body.window,
            checkpoint: body.checkpoint,
            env: body.env,
            group: body.group,
            rollout: body.rollout,
            task_id: body.task_id,
            sampling: body.sampling,
            tokens: body.tokens.into_owned(),
            prompt_len: body.prompt_len,
            logprobs: body.logprobs.into_owned(),
            sketches,
            reward: body.reward,
            miner: body.miner,
            signature,
        })
    }

    /// The canonical bytes whose BLAKE3 the miner signs (module docs).
    pub fn signing_bytes(&self) -> Vec<u8> {
        let body = self.body();
        let mut out = Vec::with_capacity(4 + ROLLOUT_DOMAIN.len() + body.len());
        out.extend_from_slice(&(ROLLOUT_DOMAIN.len() as u32).to_le_bytes());
        out.extend_from_slice(ROLLOUT_DOMAIN.as_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// BLAKE3 of [`Rollout::signing_bytes`]: the rollout's name, and what
    /// the miner signs.
    pub fn digest(&self) -> [u8; 32] {
        *blake3::hash(&self.signing_bytes()).as_bytes()
    }

    /// BLAKE3 over the prompt length and every token (little-endian u32s):
    /// what two miners' copies of one rollout share. The coordinator's door
    /// and the validator's copy detection both key on it.
    pub fn content_hash(&self) -> [u8; 32] {
        // one contiguous buffer, one hash call: the same bytes as feeding each
        // token to the hasher, at a fraction of the per-call cost
        let mut buf = Vec::with_capacity(4 * (1 + self.tokens.len()));
        buf.extend_from_slice(&self.prompt_len.to_le_bytes());
        for t in &self.tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        *blake3::hash(&buf).as_bytes()
    }

    /// Sets `miner` to `key`'s public key and signs the digest.
    pub fn sign(&mut self, key: &Keypair) {
        self.miner = key.public().0;
        self.signature = key.sign(identity::domain::ROLLOUT, &self.digest()).0;
    }

    /// Checks the signature against `miner`.
    pub fn verify_signature(&self) -> Result<(), IdentityError> {
        verify_digest(&self.miner, &self.digest(), &self.signature)
    }

    /// The prompt tokens (empty if `prompt_len` exceeds the token count).
    pub fn prompt(&self) -> &[u32] {
        self.tokens.get(..self.prompt_len as usize).unwrap_or(&[])
    }

    /// The completion tokens (empty if `prompt_len` exceeds the token count).
    pub fn completion(&self) -> &[u32] {
        self.tokens.get(self.prompt_len as usize..).unwrap_or(&[])
    }
}

/// Checks a rollout signature given the rollout's [`Rollout::digest`]:
/// exactly [`identity::PublicKey::verify`] (strict ed25519: weak keys and
/// non-canonical signatures refused) of the digest under
/// [`identity::domain::ROLLOUT`], for callers that computed the digest
/// anyway. Decompressed miner keys are cached per thread (a few dozen at
/// most), as every rollout of a miner is checked against the same key.
pub fn verify_digest(miner: &[u8; 32], digest: &[u8; 32], signature: &[u8; 64]) -> Result<(), IdentityError> {
    use std::cell::RefCell;
    const CACHED_KEYS: usize = 64;
    /// The next slot to replace once full, and the cached keys.
    type KeyCache = (usize, Vec<([u8; 32], ed25519_dalek::VerifyingKey)>);
    thread_local! {
        static KEYS: RefCell<KeyCache> = const { RefCell::new((0, Vec::new())) };
    }
    let key = KEYS.with(|cell| {
        let mut cache = cell.borrow_mut();
        if let Some((_, k)) = cache.1.iter().find(|(m, _)| m == miner) {
            return Ok(*k);
        }
        let k = ed25519_dalek::VerifyingKey::from_bytes(miner).map_err(|_| IdentityError::InvalidPublicKey)?;
        let (next, keys) = &mut *cache;
        if keys.len() < CACHED_KEYS {
            keys.push((*miner, k));
        } else {
            keys[*next] = (*miner, k);
            *next = (*next + 1) % CACHED_KEYS;
        }
        Ok(k)
    })?;
    let msg = identity::domain_message(identity::domain::ROLLOUT, digest);
    key.verify_strict(&msg, &ed25519_dalek::Signature::from_bytes(signature)).map_err(|_| IdentityError::BadSignature)
}

/// Serde for `[u8; 64]`: hex string in human-readable formats, bytes otherwise.
mod sig64 {
    use serde::de::Error as _;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8; 64], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() { s.serialize_str(&hex::encode(v)) } else { s.serialize_bytes(v) }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 64], D::Error> {
        let bytes: Vec<u8> = if d.is_human_readable() {
            let s: String = serde::Deserialize::deserialize(d)?;
            hex::decode(s).map_err(D::Error::custom)?
        } else {
            serde::Deserialize::deserialize(d)?
        };
        bytes.try_into().map_err(|_| D::Error::custom("signature must be 64 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Signature;

    fn sample() -> Rollout {
        Rollout {
            window: 7,
            checkpoint: ContentId([1; 32]),
            env: EnvId::Arith,
            group: 2,
            rollout: 3,
            task_id: 99,
            sampling: SamplingParams { temperature: 0.7, max_new_tokens: 64 },
            tokens: vec![1, 4093, 198, 49151, 2],
            prompt_len: 3,
            logprobs: vec![-0.5, -0.01],
            sketches: vec![0, 5, sketch::Q - 5, 60_000, 17],
            reward: 1.0,
            miner: [0; 32],
            signature: [0; 64],
        }
    }

    #[test]
    fn content_hash_names_the_tokens_only() {
        let a = sample();
        let mut copy = sample();
        copy.sign(&Keypair::from_seed([7; 32]));
        copy.window += 1;
        assert_ne!(a.digest(), copy.digest());
        assert_eq!(a.content_hash(), copy.content_hash(), "another miner's copy");
        let mut h = blake3::Hasher::new();
        h.update(&a.prompt_len.to_le_bytes());
        for t in &a.tokens {
            h.update(&t.to_le_bytes());
        }
        assert_eq!(a.content_hash(), *h.finalize().as_bytes(), "prompt_len then tokens, little-endian");
        let mut edited = sample();
        edited.tokens[0] ^= 1;
        assert_ne!(a.content_hash(), edited.content_hash());
    }

    #[test]
    fn encode_decode_sign() {
        let mut r = sample();
        let key = Keypair::from_seed([4; 32]);
        r.sign(&key);
        r.verify_signature().unwrap();
        let bytes = r.encode();
        let back = Rollout::decode(&bytes, &RolloutLimits::DEFAULT).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.digest(), r.digest());
        back.verify_signature().unwrap();
        let mut tampered = back.clone();
        tampered.reward = 0.5;
        assert!(tampered.verify_signature().is_err());
        assert_ne!(tampered.digest(), r.digest());
        assert_eq!(r.prompt(), &[1, 4093, 198]);
        assert_eq!(r.completion(), &[49151, 2]);
        assert!(r.signing_bytes().starts_with(&[20, 0, 0, 0]));
        // The signature is over the digest, under the rollout domain.
        let sig = Signature(r.signature);
        key.public().verify(identity::domain::ROLLOUT, &r.digest(), &sig).unwrap();
        assert!(key.public().verify(identity::domain::ROLLOUT, &r.signing_bytes(), &sig).is_err());
        assert!(key.public().verify(identity::domain::HANDSHAKE, &r.digest(), &sig).is_err());
        // The cached-key path refuses what the plain check refuses.
        let mut bad = r.signature;
        bad[5] ^= 1;
        assert!(matches!(verify_digest(&r.miner, &r.digest(), &bad), Err(IdentityError::BadSignature)));
        let other = Keypair::from_seed([5; 32]).public().0;
        assert!(matches!(verify_digest(&other, &r.digest(), &r.signature), Err(IdentityError::BadSignature)));
        let mut not_a_point = [0u8; 32];
        not_a_point[0] = 2;
        not_a_point[31] = 0x7f;
        assert!(verify_digest(&not_a_point, &r.digest(), &r.signature).is_err());
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Rollout>(&json).unwrap(), r);
    }

    #[test]
    fn compact_size() {
        // 2 + 3 bytes per 49k-vocab token, 4 per log-prob, 3 per honest sketch.
        let mut r = sample();
        r.tokens = vec![49_000; 1000];
        r.prompt_len = 100;
        r.logprobs = vec![-1.0; 900];
        r.sketches = (0..1000).map(|i| sketch::reduce(i * 61 - 30_000)).collect();
        let n = r.encode().len();
        assert!(n < 1000 * 3 + 900 * 4 + 1000 * 3 + 200, "{n}");
    }

    #[test]
    fn rejects_bad_bytes() {
        let bytes = sample().encode();
        let lim = RolloutLimits::DEFAULT;
        assert_eq!(Rollout::decode(&[], &lim), Err(RolloutError::Truncated));
        assert_eq!(Rollout::decode(&bytes[..60], &lim), Err(RolloutError::Truncated));
        let mut v = bytes.clone();
        v[0] = 9;
        assert_eq!(Rollout::decode(&v, &lim), Err(RolloutError::Version(9)));
        let small = RolloutLimits { max_bytes: 10, ..lim };
        assert!(matches!(Rollout::decode(&bytes, &small), Err(RolloutError::TooLarge { .. })));
        let few = RolloutLimits { max_tokens: 4, ..lim };
        assert!(matches!(Rollout::decode(&bytes, &few), Err(RolloutError::TooMany { what: "tokens", .. })));
        let mut extra = bytes.clone();
        extra.insert(bytes.len() - 64, 0);
        assert_eq!(Rollout::decode(&extra, &lim), Err(RolloutError::Trailing(1)));
        assert!(matches!(Rollout::decode(&bytes[..bytes.len() - 1], &lim), Err(RolloutError::Body(_))));
    }
}
