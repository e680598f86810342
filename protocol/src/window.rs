//! The window clock and each window's randomness.
//!
//! Time is cut into windows of a fixed length from a genesis instant. Window
//! `W` opens at `genesis + W·length`; miners generate and submit during `W`;
//! submissions close at `genesis + (W+1)·length + grace`. Grail's timeline
//! follows: the checkpoint miners use in `W` is the one published by the end
//! of `W−1`; validators check `W` and the trainer trains on it during `W+1`.
//!
//! Each window has two secrets, both derived from the coordinator's master
//! secret so a restarted coordinator re-derives the same ones:
//! - the **seed**, published when the window opens: it fixes prompts and sampling;
//! - the **challenge secret**, committed to at open (`commitment = blake3` in
//!   the [`CHALLENGE_COMMIT_DOMAIN`] key-derivation mode over window ‖ secret)
//!   and revealed only once submissions close, so a miner cannot know which
//!   positions will be checked when it commits its sketches.

use serde::{Deserialize, Serialize};

use crate::prf::Seed;

/// blake3 key-derivation context for a window's public seed.
pub const SEED_DOMAIN: &str = crate::domain::context::WINDOW_SEED;
/// blake3 key-derivation context for a window's challenge secret.
pub const CHALLENGE_SECRET_DOMAIN: &str = crate::domain::context::CHALLENGE_SECRET;
/// blake3 key-derivation context for the commitment to a challenge secret.
pub const CHALLENGE_COMMIT_DOMAIN: &str = crate::domain::context::CHALLENGE_COMMIT;

/// A window's index (0 at genesis).
pub type WindowId = u64;

/// Errors building a schedule.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The window length was zero.
    #[error("window length must be positive")]
    ZeroLength,
    /// The grace period was not shorter than a window.
    #[error("grace ({grace_ms} ms) must be shorter than a window ({length_ms} ms)")]
    GraceTooLong {
        /// Grace in milliseconds.
        grace_ms: u64,
        /// Window length in milliseconds.
        length_ms: u64,
    },
}

/// Where a window stands at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not opened yet.
    Pending,
    /// Open: the seed is public and submissions are accepted.
    Open,
    /// Submissions closed; the challenge secret may be revealed.
    Closed,
}

/// The window clock: genesis, window length and submission grace, in
/// milliseconds since the Unix epoch. Pure arithmetic, no clock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    genesis_ms: u64,
    length_ms: u64,
    grace_ms: u64,
}

impl Schedule {
    /// A schedule; `grace_ms` is how long after a window ends it still takes
    /// submissions (it must be shorter than a window).
    pub fn new(genesis_ms: u64, length_ms: u64, grace_ms: u64) -> Result<Self, ScheduleError> {
        if length_ms == 0 {
            return Err(ScheduleError::ZeroLength);
        }
        if grace_ms >= length_ms {
            return Err(ScheduleError::GraceTooLong { grace_ms, length_ms });
        }
        Ok(Self { genesis_ms, length_ms, grace_ms })
    }

    /// Genesis instant.
    pub fn genesis_ms(&self) -> u64 {
        self.genesis_ms
    }

    /// Window length.
    pub fn length_ms(&self) -> u64 {
        self.length_ms
    }

    /// Submission grace after a window ends.
    pub fn grace_ms(&self) -> u64 {
        self.grace_ms
    }

    /// The window in progress at `now_ms`, or `None` before genesis.
    pub fn window_at(&self, now_ms: u64) -> Option<WindowId> {
        now_ms.checked_sub(self.genesis_ms).map(|d| d / self.length_ms)
    }

    /// When `window` opens (saturating at `u64::MAX`).
    pub fn opens_at(&self, window: WindowId) -> u64 {
        window.saturating_mul(self.length_ms).saturating_add(self.genesis_ms)
    }

    /// When `window`'s submissions close (its end plus the grace).
    pub fn closes_at(&self, window: WindowId) -> u64 {
        self.opens_at(window.saturating_add(1)).saturating_add(self.grace_ms)
    }

    /// `window`'s phase at `now_ms`.
    pub fn phase(&self, window: WindowId, now_ms: u64) -> Phase {
        if now_ms < self.opens_at(window) {
            Phase::Pending
        } else if now_ms < self.closes_at(window) {
            Phase::Open
        } else {
            Phase::Closed
        }
    }

    /// Whether `window` accepts submissions at `now_ms`. During the grace
    /// period two windows accept: the one that just ended and the new one.
    pub fn accepts(&self, window: WindowId, now_ms: u64) -> bool {
        self.phase(window, now_ms) == Phase::Open
    }
}

/// A window's public seed and its secret challenge, both derived from the
/// coordinator's master secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WindowSecrets {
    /// The window.
    pub window: WindowId,
    /// Published at open: drives prompts, tasks and sampling.
    pub seed: Seed,
    /// Revealed after submissions close: drives which positions are challenged.
    pub challenge: Seed,
}

impl std::fmt::Debug for WindowSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowSecrets").field("window", &self.window).field("seed", &self.seed).finish_non_exhaustive()
    }
}

impl WindowSecrets {
    /// Derives window `window`'s secrets from the master secret.
    pub fn derive(master: &[u8; 32], window: WindowId) -> Self {
        let derive = |ctx: &str| {
            let mut h = blake3::Hasher::new_derive_key(ctx);
            h.update(master);
            h.update(&window.to_le_bytes());
            Seed(*h.finalize().as_bytes())
        };
        Self { window, seed: derive(SEED_DOMAIN), challenge: derive(CHALLENGE_SECRET_DOMAIN) }
    }

    /// The commitment to the challenge secret, published at open.
    pub fn commitment(&self) -> [u8; 32] {
        challenge_commitment(self.window, &self.challenge.0)
    }
}

/// `blake3` (derive-key mode, [`CHALLENGE_COMMIT_DOMAIN`]) over window (u64 LE) ‖ secret.
pub fn challenge_commitment(window: WindowId, secret: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(CHALLENGE_COMMIT_DOMAIN);
    h.update(&window.to_le_bytes());
    h.update(secret);
    *h.finalize().as_bytes()
}

/// Whether a revealed secret matches the commitment published for `window`.
pub fn verify_reveal(window: WindowId, commitment: &[u8; 32], secret: &[u8; 32]) -> bool {
    // Commitments are public; a plain comparison leaks nothing.
    &challenge_commitment(window, secret) == commitment
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn boundaries() {
        let s = Schedule::new(1_000, 100, 10).unwrap();
        assert_eq!(s.window_at(999), None);
        assert_eq!(s.window_at(1_000), Some(0));
        assert_eq!(s.window_at(1_099), Some(0));
        assert_eq!(s.window_at(1_100), Some(1));
        assert_eq!(s.phase(1, 1_099), Phase::Pending);
        assert_eq!(s.phase(1, 1_100), Phase::Open);
        // Grace: window 0 still open at 1_105, closed at 1_110.
        assert!(s.accepts(0, 1_105));
        assert!(s.accepts(1, 1_105));
        assert_eq!(s.phase(0, 1_110), Phase::Closed);
        assert_eq!(Schedule::new(0, 0, 0), Err(ScheduleError::ZeroLength));
        assert!(Schedule::new(0, 10, 10).is_err());
    }

    #[test]
    fn secrets_are_distinct_and_reproducible() {
        let m = [5u8; 32];
        let a = WindowSecrets::derive(&m, 3);
        assert_eq!(a, WindowSecrets::derive(&m, 3));
        assert_ne!(a.seed, a.challenge);
        assert_ne!(a.seed, WindowSecrets::derive(&m, 4).seed);
        assert_ne!(a.seed, WindowSecrets::derive(&[6u8; 32], 3).seed);
        assert!(verify_reveal(3, &a.commitment(), &a.challenge.0));
        assert!(!verify_reveal(4, &a.commitment(), &a.challenge.0));
        assert!(!verify_reveal(3, &a.commitment(), &a.seed.0));
    }

    proptest! {
        #[test]
        fn window_contains_now(genesis in 0u64..1 << 40, len in 1u64..1 << 20, now in 0u64..1 << 41) {
            let s = Schedule::new(genesis, len, 0).unwrap();
            match s.window_at(now) {
                None => prop_assert!(now < genesis),
                Some(w) => {
                    prop_assert!(s.opens_at(w) <= now && now < s.opens_at(w + 1));
                    prop_assert!(s.accepts(w, now));
                }
            }
        }
    }
}
