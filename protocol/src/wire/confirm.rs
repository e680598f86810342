//! Confirmations on demand (issue 16): the second opinion a failure needs.
//!
//! Each miner's committee has one prover, which proves the miner's sampled
//! groups ahead of time, and confirmers, which prove nothing ahead of time
//! ([`crate::assign`]). When a committee member's failing verdict cites
//! evidence the coordinator cannot re-check itself (a model-based check),
//! the coordinator lists a [`Confirmation`] for every other member of the
//! committee whose verdict does not cover the cited rollouts yet. A
//! confirmer asks for its list ([`GetConfirmations`], paged), proves the
//! cited rollouts on the reference model and posts its verdict on the miner
//! as usual: a failure there confirms the ban; a pass refutes the claim and
//! flags its validator.

use serde::{Deserialize, Serialize};

use crate::identity::PublicKey;
use crate::window::WindowId;

/// Most confirmations in one [`Confirmations`] page.
pub const MAX_CONFIRMATIONS_PAGE: u32 = 64;

/// Most rollouts one [`Confirmation`] cites (the frame's size limit bounds
/// what a peer can send; this is what the coordinator lists).
pub const MAX_CONFIRMATION_DIGESTS: usize = 32;

/// Most groups one [`Confirmation`] asks for.
pub const MAX_CONFIRMATION_GROUPS: usize = 1024;

/// Validator → coordinator: the confirmations waiting for the authenticated
/// validator, in (window, miner) order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetConfirmations {
    /// Start after this (window, miner); `None`: from the first.
    pub after: Option<(WindowId, PublicKey)>,
    /// Most items wanted (the coordinator answers at most [`MAX_CONFIRMATIONS_PAGE`]).
    pub limit: u32,
}

/// One failure waiting for the asking validator's proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// The window.
    pub window: WindowId,
    /// The miner whose failure is claimed.
    pub miner: PublicKey,
    /// The committee members whose failing verdicts are waiting.
    pub claimants: Vec<PublicKey>,
    /// Digests of the rollouts to prove (the claims' hard evidence).
    pub digests: Vec<[u8; 32]>,
    /// Whole groups to prove, when a claim rests on a count of soft failures
    /// rather than on cited rollouts (empty otherwise).
    pub groups: Vec<u32>,
}

/// Coordinator → validator: one page of its confirmations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmations {
    /// The confirmations, in (window, miner) order.
    pub items: Vec<Confirmation>,
    /// Where the next page starts (`after`), if there is one.
    pub next: Option<(WindowId, PublicKey)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Frame, HEADER_LEN, Tag};

    /// Both frames round-trip, and a full page at the listed maxima fits the
    /// frame's size limit.
    #[test]
    fn a_full_page_of_confirmations_fits_its_frame() {
        let item = |i: u8| Confirmation {
            window: u64::MAX - u64::from(i),
            miner: PublicKey([i; 32]),
            claimants: vec![PublicKey([1; 32]); 4],
            digests: vec![[i; 32]; MAX_CONFIRMATION_DIGESTS],
            groups: (0..MAX_CONFIRMATION_GROUPS as u32).map(|g| u32::MAX - g).collect(),
        };
        let page = Confirmations {
            items: (0..MAX_CONFIRMATIONS_PAGE as u8).map(item).collect(),
            next: Some((u64::MAX, PublicKey([9; 32]))),
        };
        for f in [
            Frame::GetConfirmations(GetConfirmations { after: Some((3, PublicKey([2; 32]))), limit: u32::MAX }),
            Frame::Confirmations(page),
        ] {
            let bytes = f.encode();
            assert!(
                bytes.len() - HEADER_LEN <= f.tag().max_body_len() as usize,
                "{:?}: {} bytes",
                f.tag(),
                bytes.len()
            );
            assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
        }
        assert_eq!((Tag::GetConfirmations as u16, Tag::Confirmations as u16), (50, 51));
    }
}
