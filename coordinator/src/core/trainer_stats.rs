//! The trainer's step reports: who may send them and what is checked.

use tributary_protocol::wire::{Role, TrainerStatsBody, TrainerStatsError};

use super::*;

/// Why a trainer's step report was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StatsError {
    /// The signer is not the configured trainer.
    #[error("not the configured trainer")]
    Unauthorized,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// The figures are not well formed.
    #[error("malformed report: {0}")]
    Malformed(#[from] TrainerStatsError),
}

impl Core {
    /// Checks a trainer's step report: signed by the configured trainer key,
    /// figures well formed.
    pub fn check_trainer_stats(&self, body: &TrainerStatsBody, signature_ok: bool) -> Result<(), StatsError> {
        if !self.cfg.access.permits(Role::Trainer, &body.trainer) {
            return Err(StatsError::Unauthorized);
        }
        if !signature_ok {
            return Err(StatsError::BadSignature);
        }
        body.check()?;
        Ok(())
    }
}
