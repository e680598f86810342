//! Windows: their public parameters (the generation contract) and the
//! challenge reveal.

use serde::{Deserialize, Serialize};

use crate::checkpoint::ContentId;
use crate::env::EnvId;
use crate::prf::Seed;
use crate::rollout::SamplingParams;
use crate::window::WindowId;

/// Asks for the current window (or a given one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetWindow {
    /// `None`: the window open now.
    pub window: Option<WindowId>,
}

/// A window's public parameters, published when it opens. Together they are
/// the window's generation contract: miners generate with exactly these
/// settings and validators require them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowInfo {
    /// The window.
    pub window: WindowId,
    /// When it opened.
    pub opens_at_ms: u64,
    /// When its submissions close.
    pub closes_at_ms: u64,
    /// The public seed (prompts, tasks, sampling).
    pub seed: Seed,
    /// Commitment to the challenge secret.
    pub commitment: [u8; 32],
    /// Content id of the checkpoint miners must use.
    pub checkpoint: ContentId,
    /// Active environment.
    pub env: EnvId,
    /// Groups each miner may submit in this window.
    pub groups_per_miner: u32,
    /// Rollouts per group.
    pub group_size: u32,
    /// Sampling temperature and completion length limit (rollouts must carry exactly these).
    pub sampling: SamplingParams,
    /// Difficulty of the procedural environments (arith).
    pub difficulty: u32,
    /// blake3 of the dataset file the environment draws from (gsm8k), if any.
    pub dataset: Option<[u8; 32]>,
}

impl WindowInfo {
    /// The settings that pick the window's environment ([`crate::env::Environment::for_window`]).
    pub fn env_spec(&self) -> crate::env::EnvSpec {
        crate::env::EnvSpec { env: self.env, difficulty: self.difficulty, dataset: self.dataset }
    }
}

/// Asks for a window's challenge secret (answered only after its submissions close).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReveal {
    /// The window.
    pub window: WindowId,
}

/// A window's revealed challenge secret, with the assignment settings that,
/// together with it, fix which validators judge which miners
/// ([`crate::assign::Assignment::compute`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reveal {
    /// The window.
    pub window: WindowId,
    /// The secret; check it with [`crate::window::verify_reveal`].
    pub secret: [u8; 32],
    /// The authorised validators, committee size and per-validator budget.
    pub assign: crate::assign::Spec,
}
