//! The trainer's signed report of one training step.

use serde::{Deserialize, Serialize};

use super::{Signed, SignedBody};
use crate::checkpoint::ContentId;
use crate::identity::{self, PublicKey};
use crate::window::WindowId;

/// The trainer's report of one training step (signed part of [`TrainerStats`]):
/// what it trained on, the GRPO figures and the checkpoint it published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerStatsBody {
    /// The window the step's checkpoint was published for ([`CheckpointBody::window`]).
    pub window: WindowId,
    /// The checkpoint published.
    pub checkpoint: ContentId,
    /// First window whose rollouts the step trained on.
    pub first_trained: WindowId,
    /// Last window whose rollouts the step trained on.
    pub last_trained: WindowId,
    /// Optimiser step number (1-based).
    pub step: u64,
    /// Learning rate used.
    pub lr: f64,
    /// Total loss.
    pub loss: f64,
    /// Policy-gradient part of the loss.
    pub pg_loss: f64,
    /// KL part of the loss.
    pub kl: f64,
    /// Mean per-sequence token entropy.
    pub entropy: f64,
    /// Fraction of sequences clipped at `1 − ε_lo`.
    pub clip_low_frac: f64,
    /// Fraction of sequences clipped at `1 + ε_hi`.
    pub clip_high_frac: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Mean reward of the sequences trained on.
    pub reward_mean: f64,
    /// Their reward standard deviation.
    pub reward_std: f64,
    /// Sequences trained on.
    pub seqs: u64,
    /// Completion tokens trained on.
    pub tokens: u64,
    /// Groups kept by selection.
    pub groups_kept: u64,
    /// Groups dropped by selection (every reason).
    pub groups_dropped: u64,
    /// Groups held for verdicts.
    pub groups_held: u64,
    /// Payload bytes of the publication (a delta or a full checkpoint).
    pub payload_bytes: u64,
    /// Full checkpoint bytes.
    pub checkpoint_bytes: u64,
    /// Whether the payload is a delta.
    pub delta: bool,
    /// Changed / total elements against the delta's base (deltas only).
    pub change_fraction: Option<f64>,
    /// The trainer.
    pub trainer: PublicKey,
}

/// Why a [`TrainerStatsBody`] is not well formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrainerStatsError {
    /// A figure is NaN or infinite.
    #[error("{0} is not finite")]
    NotFinite(&'static str),
    /// A fraction lies outside [0, 1].
    #[error("{0} is not a fraction")]
    NotAFraction(&'static str),
    /// The trained windows are not `first ≤ last ≤ window`.
    #[error("trained windows out of order")]
    Windows,
}

impl TrainerStatsBody {
    /// Checks the figures: finite, fractions in [0, 1], trained windows in order.
    pub fn check(&self) -> Result<(), TrainerStatsError> {
        for (name, v) in [
            ("lr", self.lr),
            ("loss", self.loss),
            ("pg_loss", self.pg_loss),
            ("kl", self.kl),
            ("entropy", self.entropy),
            ("grad_norm", self.grad_norm),
            ("reward_mean", self.reward_mean),
            ("reward_std", self.reward_std),
        ] {
            if !v.is_finite() {
                return Err(TrainerStatsError::NotFinite(name));
            }
        }
        let fractions = [
            ("clip_low_frac", Some(self.clip_low_frac)),
            ("clip_high_frac", Some(self.clip_high_frac)),
            ("change_fraction", self.change_fraction),
        ];
        for (name, v) in fractions {
            if let Some(v) = v
                && !(0.0..=1.0).contains(&v)
            {
                return Err(TrainerStatsError::NotAFraction(name));
            }
        }
        if self.first_trained > self.last_trained || self.last_trained > self.window {
            return Err(TrainerStatsError::Windows);
        }
        Ok(())
    }
}

/// A signed training-step report: trainer → coordinator after the step's
/// checkpoint is stored; answered with [`TrainerStatsAck`].
pub type TrainerStats = Signed<TrainerStatsBody>;

impl SignedBody for TrainerStatsBody {
    const DOMAIN: &'static str = identity::domain::TRAINER_STATS;

    fn signer(&self) -> &PublicKey {
        &self.trainer
    }
}

/// Coordinator → trainer: the report for this window is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerStatsAck {
    /// The report's window.
    pub window: WindowId,
}
