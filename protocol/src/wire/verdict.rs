//! Verdicts, standings and the weights document.

use serde::{Deserialize, Serialize};

use super::{Frame, Signed, SignedBody, Tag, WireError, canonical};
use crate::identity::{self, PublicKey};
use crate::window::WindowId;

/// A validator's findings about one miner in one window (the signed part of a [`Verdict`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictBody {
    /// The window checked.
    pub window: WindowId,
    /// The miner checked.
    pub miner: PublicKey,
    /// The validator.
    pub validator: PublicKey,
    /// Rollouts checked.
    pub checked: u32,
    /// Of those, rollouts that passed every check.
    pub valid: u32,
    /// Estimated valid rollouts of the miner in the window (extrapolated from the sample).
    pub estimated_valid: u32,
    /// A hard check failed (proof, logprobs, prompt, signature...): ban.
    pub hard_failure: bool,
    /// Soft checks that failed (distribution...).
    pub soft_failures: u32,
    /// The failed checks with their figures, one line each (at most
    /// [`MAX_VERDICT_REASONS`] lines of at most [`MAX_REASON_LEN`] bytes).
    pub reasons: Vec<String>,
}

/// Most reason lines in a [`VerdictBody`].
pub const MAX_VERDICT_REASONS: usize = 6;

/// Longest reason line in a [`VerdictBody`], in bytes.
pub const MAX_REASON_LEN: usize = 320;

impl VerdictBody {
    /// Adds a reason line, truncated to [`MAX_REASON_LEN`] bytes (on a
    /// character boundary); lines beyond [`MAX_VERDICT_REASONS`] are dropped.
    pub fn add_reason(&mut self, line: &str) {
        if self.reasons.len() >= MAX_VERDICT_REASONS || self.reasons.iter().any(|r| r == line) {
            return;
        }
        let mut end = line.len().min(MAX_REASON_LEN);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        self.reasons.push(line[..end].to_owned());
    }
}

/// A signed verdict.
pub type Verdict = Signed<VerdictBody>;

impl SignedBody for VerdictBody {
    const DOMAIN: &'static str = identity::domain::VERDICT;

    fn signer(&self) -> &PublicKey {
        &self.validator
    }
}

/// Coordinator → validator: verdict stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictAck {
    /// The window.
    pub window: WindowId,
    /// The miner.
    pub miner: PublicKey,
}

/// Trainer/validator → coordinator: what the verdicts say about a window's miners.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetStanding {
    /// The window.
    pub window: WindowId,
}

/// What is known of one miner in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MinerStanding {
    /// Every verdict on the window passed it.
    Passed,
    /// A verdict (or the coordinator's door) failed it.
    Failed,
    /// Not judged yet, but banned or failed in the ban span: not in good standing.
    Suspect,
}

/// The coordinator's answer to [`GetStanding`]: every miner it knows
/// something about for the window. Miners not listed are unjudged and in
/// good standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// The window.
    pub window: WindowId,
    /// Miner → standing.
    pub miners: Vec<(PublicKey, MinerStanding)>,
}

/// Asks for the latest weights document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetWeights;

/// The weights the coordinator derived from verdicts (signed part).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsBody {
    /// The last window these weights account for.
    pub window: WindowId,
    /// Miner → weight; weights sum to 1 (or the list is empty).
    pub weights: Vec<(PublicKey, f64)>,
    /// The coordinator.
    pub coordinator: PublicKey,
}

/// A signed weights document (the coordinator's).
pub type WeightsDoc = Signed<WeightsBody>;

impl SignedBody for WeightsBody {
    const DOMAIN: &'static str = identity::domain::WEIGHTS;

    fn signer(&self) -> &PublicKey {
        &self.coordinator
    }
}

impl Signed<WeightsBody> {
    /// Checks that the document is signed by `coordinator` (the key a peer
    /// learnt in the handshake's [`Challenge`] or its configuration), not
    /// merely by whichever key it names.
    pub fn verify_by(&self, coordinator: &PublicKey) -> Result<(), WeightsDocError> {
        if self.body.coordinator != *coordinator {
            return Err(WeightsDocError::WrongCoordinator);
        }
        self.verify().map_err(|_| WeightsDocError::BadSignature)
    }

    /// The document's bytes as published (`postcard(WeightsDoc)`, the body of
    /// a [`Frame::Weights`]); what `GET /api/weights` gives in hex.
    pub fn encode(&self) -> Vec<u8> {
        canonical(self)
    }

    /// Decodes published document bytes (with the [`Tag::Weights`] size
    /// limit, consumed exactly) and checks they are signed by `coordinator`.
    pub fn decode_verified(bytes: &[u8], coordinator: &PublicKey) -> Result<Self, WeightsDocError> {
        let doc = match Frame::decode_body(Tag::Weights, bytes)? {
            Frame::Weights(doc) => doc,
            // decode_body answers with the frame of the tag it was given.
            other => return Err(WeightsDocError::Wire(WireError::UnknownTag(other.tag() as u16))),
        };
        doc.verify_by(coordinator)?;
        Ok(doc)
    }
}

/// Why a weights document is not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightsDocError {
    /// The bytes do not decode.
    #[error("weights document: {0}")]
    Wire(#[from] WireError),
    /// The document names another coordinator.
    #[error("weights document names another coordinator")]
    WrongCoordinator,
    /// The signature does not verify.
    #[error("weights document signature does not verify")]
    BadSignature,
}
