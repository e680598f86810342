//! Closed windows in the object store, for readers (issue 21): the
//! coordinator's signed manifest of a window's segment objects, and the
//! frames that hand it out with a GET URL per segment (the store's public
//! base URL, or URLs presigned for a private bucket).
//!
//! A window is archived as segment objects
//! (`windows/<window, 20 digits>/seg-<blake3>.bin`, each a postcard
//! [`SegmentObject`]) holding its rollouts exactly as the miners signed
//! them, in (miner key, rollout digest) order, so that each miner's
//! rollouts lie in a run of segments the manifest names
//! ([`ManifestSegment::first_miner`], [`ManifestSegment::last_miner`]). A
//! reader trusts neither the store nor the URLs: it checks every segment's
//! length and blake3 against the coordinator-signed manifest, then every
//! rollout's signature as it does for rollouts the coordinator sends.

use serde::{Deserialize, Serialize};

use super::{Signed, SignedBody};
use crate::identity::{self, PublicKey};
use crate::window::WindowId;

/// The most segments one manifest lists (64 GiB of rollouts at 64 MiB a
/// segment; the coordinator's window budget is far below).
pub const MAX_MANIFEST_SEGMENTS: usize = 1024;

/// The largest segment object a reader downloads.
pub const MAX_SEGMENT_BYTES: u64 = 96 << 20;

/// The longest GET URL a reader follows (presigned URLs are long).
pub const MAX_SEGMENT_URL_LEN: usize = 4096;

/// One segment object as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestSegment {
    /// The object key, relative to the store's root.
    pub key: String,
    /// blake3 of the object's bytes.
    pub blake3: [u8; 32],
    /// The object's size in bytes.
    pub bytes: u64,
    /// Rollouts in it.
    pub rollouts: u64,
    /// The miner of its first rollout.
    pub first_miner: PublicKey,
    /// The miner of its last rollout.
    pub last_miner: PublicKey,
}

impl ManifestSegment {
    /// Whether `miner`'s rollouts may lie in this segment.
    pub fn may_hold(&self, miner: &PublicKey) -> bool {
        self.first_miner <= *miner && *miner <= self.last_miner
    }
}

/// What the coordinator asserts about an archived window: every rollout it
/// stored in the window is in these segments, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestBody {
    /// The window.
    pub window: WindowId,
    /// Rollouts in the window (the sum over segments).
    pub rollouts: u64,
    /// The segments, in (miner, digest) order of their rollouts.
    pub segments: Vec<ManifestSegment>,
    /// The coordinator.
    pub coordinator: PublicKey,
}

/// A window's manifest signed by the coordinator.
pub type SignedManifest = Signed<ManifestBody>;

impl SignedBody for ManifestBody {
    const DOMAIN: &'static str = identity::domain::WINDOW_MANIFEST;

    fn signer(&self) -> &PublicKey {
        &self.coordinator
    }
}

/// Why a manifest answer is not one a reader uses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The signature, network or signer is wrong.
    #[error("window manifest: {0}")]
    Signed(#[from] super::SignedError),
    /// Signed by a key other than the coordinator's.
    #[error("window manifest signed by another key")]
    WrongSigner,
    /// The manifest is of another window, or its counts disagree, or a
    /// segment is out of order or too large, or the URLs do not match.
    #[error("window {window} manifest: {what}")]
    Inconsistent {
        /// The window asked for.
        window: WindowId,
        /// What is wrong.
        what: &'static str,
    },
}

impl Signed<ManifestBody> {
    /// Checks the signature (the coordinator's, on `network`), that the
    /// manifest is `window`'s and that it agrees with itself: counts add
    /// up, segments are within size and in miner order.
    pub fn check(&self, window: WindowId, coordinator: &PublicKey) -> Result<(), ManifestError> {
        if self.body.coordinator != *coordinator {
            return Err(ManifestError::WrongSigner);
        }
        self.verify(&super::NetworkId::of(coordinator))?;
        let bad = |what| Err(ManifestError::Inconsistent { window, what });
        let b = &self.body;
        if b.window != window {
            return bad("of another window");
        }
        if b.segments.len() > MAX_MANIFEST_SEGMENTS {
            return bad("too many segments");
        }
        if b.segments.iter().map(|s| s.rollouts).sum::<u64>() != b.rollouts {
            return bad("rollout counts do not add up");
        }
        if b.segments.iter().any(|s| s.bytes > MAX_SEGMENT_BYTES || s.first_miner > s.last_miner) {
            return bad("a segment is too large or its miner range is reversed");
        }
        if b.segments.windows(2).any(|p| p[0].last_miner > p[1].first_miner) {
            return bad("segments out of miner order");
        }
        Ok(())
    }
}

/// Validator/trainer → coordinator: the manifest of a closed, archived window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetWindowManifest {
    /// The window.
    pub window: WindowId,
}

/// Coordinator → validator/trainer: a window's signed manifest and where to
/// GET each segment, or no manifest (not archived yet, no store, or no
/// URL a reader can use): fetch from the coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowManifest {
    /// The window.
    pub window: WindowId,
    /// The signed manifest.
    pub manifest: Option<SignedManifest>,
    /// One `http(s)://` GET URL per segment, in the manifest's order.
    pub urls: Vec<String>,
    /// When presigned URLs stop working (ms since the epoch); 0: they do not expire.
    pub expires_ms: u64,
}

impl WindowManifest {
    /// Checks the answer for `window` ([`Signed::check`]) and that it has
    /// one well-formed URL per segment; `Ok(None)` when it has no manifest.
    pub fn checked(&self, window: WindowId, coordinator: &PublicKey) -> Result<Option<&SignedManifest>, ManifestError> {
        let Some(m) = &self.manifest else { return Ok(None) };
        m.check(window, coordinator)?;
        if self.window != window || self.urls.len() != m.body.segments.len() {
            return Err(ManifestError::Inconsistent { window, what: "one URL per segment expected" });
        }
        let ok = |u: &String| {
            u.len() <= MAX_SEGMENT_URL_LEN
                && u.strip_prefix("https://")
                    .or_else(|| u.strip_prefix("http://"))
                    .is_some_and(|r| !r.is_empty() && !r.chars().any(char::is_whitespace))
        };
        if !self.urls.iter().all(ok) {
            return Err(ManifestError::Inconsistent { window, what: "a segment URL is not http(s)" });
        }
        Ok(Some(m))
    }
}

/// A segment object's content: a window's rollouts, each as its miner signed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentObject {
    /// The window.
    pub window: WindowId,
    /// Encoded rollouts (`Rollout::encode()` bytes).
    pub rollouts: Vec<Vec<u8>>,
}

impl SegmentObject {
    /// The object's bytes (postcard).
    pub fn encode(&self) -> Vec<u8> {
        super::canonical(self)
    }

    /// Decodes an object's bytes, which must be consumed exactly.
    pub fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        let (s, rest) = postcard::take_from_bytes::<Self>(bytes)?;
        if !rest.is_empty() {
            return Err(postcard::Error::DeserializeBadEncoding);
        }
        Ok(s)
    }
}

/// The object key of a window's segment with content hash `blake3`.
pub fn store_segment_key(window: WindowId, blake3: &[u8; 32]) -> String {
    format!("windows/{window:020}/seg-{}.bin", hex::encode(blake3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Keypair;
    use crate::wire::NetworkId;

    fn seg(first: u8, last: u8) -> ManifestSegment {
        ManifestSegment {
            key: store_segment_key(3, &[first; 32]),
            blake3: [first; 32],
            bytes: 10,
            rollouts: 2,
            first_miner: PublicKey([first; 32]),
            last_miner: PublicKey([last; 32]),
        }
    }

    fn answer(key: &Keypair, segments: Vec<ManifestSegment>, sign_with: &Keypair) -> WindowManifest {
        let n = segments.len();
        let body = ManifestBody { window: 3, rollouts: 2 * n as u64, segments, coordinator: key.public() };
        let m = SignedManifest::sign(body, sign_with, &NetworkId::of(&key.public()));
        WindowManifest { window: 3, manifest: Some(m), urls: vec!["https://s.example/x".into(); n], expires_ms: 0 }
    }

    #[test]
    fn a_reader_takes_only_the_coordinators_consistent_manifest() {
        let key = Keypair::generate();
        let ok = answer(&key, vec![seg(1, 2), seg(2, 5)], &key);
        assert!(ok.checked(3, &key.public()).unwrap().is_some());
        assert!(ok.manifest.as_ref().unwrap().body.segments[1].may_hold(&PublicKey([4; 32])));
        assert!(!ok.manifest.as_ref().unwrap().body.segments[0].may_hold(&PublicKey([4; 32])));
        // Another window, another coordinator, a forged signature.
        assert!(ok.checked(4, &key.public()).is_err());
        assert!(matches!(ok.checked(3, &Keypair::generate().public()), Err(ManifestError::WrongSigner)));
        let forged = answer(&key, vec![seg(1, 2)], &Keypair::generate());
        assert!(matches!(forged.checked(3, &key.public()), Err(ManifestError::Signed(_))));
        // Out of miner order, a URL short, a URL of another scheme.
        assert!(answer(&key, vec![seg(3, 5), seg(1, 2)], &key).checked(3, &key.public()).is_err());
        let mut short = ok.clone();
        short.urls.pop();
        assert!(short.checked(3, &key.public()).is_err());
        let mut file = ok.clone();
        file.urls[0] = "file:///etc/passwd".into();
        assert!(file.checked(3, &key.public()).is_err());
        // No manifest: nothing to check, the reader asks the coordinator.
        let none = WindowManifest { window: 3, manifest: None, urls: vec![], expires_ms: 0 };
        assert_eq!(none.checked(3, &key.public()), Ok(None));
    }

    #[test]
    fn a_segment_object_round_trips_and_refuses_trailing_bytes() {
        let s = SegmentObject { window: 9, rollouts: vec![vec![1, 2, 3], vec![]] };
        let mut b = s.encode();
        assert_eq!(SegmentObject::decode(&b).unwrap(), s);
        b.push(0);
        assert!(SegmentObject::decode(&b).is_err());
    }
}
