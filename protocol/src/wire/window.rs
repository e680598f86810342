//! Windows: their public parameters (the generation contract), the
//! contributions to each window's challenge ([`crate::beacon`]) and the
//! challenge reveal.

use serde::{Deserialize, Serialize};

use super::{Signed, SignedBody};
use crate::identity::{self, PublicKey};

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
    /// How every role scores a completion (protocol version 6).
    pub reward: crate::env::RewardRule,
}

impl WindowInfo {
    /// The settings that pick the window's environment ([`crate::env::Environment::for_window`]).
    pub fn env_spec(&self) -> crate::env::EnvSpec {
        crate::env::EnvSpec { env: self.env, difficulty: self.difficulty, dataset: self.dataset, reward: self.reward }
    }
}

/// Asks for a window's challenge secret (answered only after its submissions close).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReveal {
    /// The window.
    pub window: WindowId,
}

/// A validator's or the trainer's commitment to its contribution to a
/// window's challenge (the signed part of a [`BeaconCommit`]): posted
/// before the window's submissions close ([`crate::beacon::commit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeaconCommitBody {
    /// The window whose challenge it contributes to.
    pub window: WindowId,
    /// The contributing validator or trainer.
    pub party: PublicKey,
    /// [`crate::beacon::commitment`] of its secret.
    pub commitment: [u8; 32],
}

/// A signed commitment to a contribution.
pub type BeaconCommit = Signed<BeaconCommitBody>;

impl SignedBody for BeaconCommitBody {
    const DOMAIN: &'static str = identity::domain::BEACON_COMMIT;

    fn signer(&self) -> &PublicKey {
        &self.party
    }
}

/// The secret behind the authenticated peer's commitment for a window,
/// posted once the window's submissions have closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeaconReveal {
    /// The window.
    pub window: WindowId,
    /// The contribution secret ([`crate::beacon::contribution_secret`]).
    pub secret: [u8; 32],
}

/// A commitment or a reveal is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeaconAck {
    /// The window.
    pub window: WindowId,
}

/// A revealed contribution: the party's signed commitment and its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contribution {
    /// The commitment, signed by the party.
    pub commit: BeaconCommit,
    /// The secret it commits to.
    pub secret: [u8; 32],
}

/// A window's challenge, once fixed: the coordinator's own secret (checked
/// against the commitment published at open), every revealed contribution
/// with its signed commitment, the commitments never revealed, and the
/// challenge they make ([`crate::beacon::check_reveal`] recomputes it); with
/// the assignment settings that, together with it, fix which validators
/// judge which miners ([`crate::assign::Assignment::compute`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reveal {
    /// The window.
    pub window: WindowId,
    /// The coordinator's secret; check it with [`crate::window::verify_reveal`].
    pub secret: [u8; 32],
    /// The contributions revealed in time, by party key (ascending).
    pub contributions: Vec<Contribution>,
    /// Commitments whose secret was not revealed in time (left out of the challenge).
    pub withheld: Vec<BeaconCommit>,
    /// The window's challenge: [`crate::beacon::mix`] of the above.
    pub challenge: [u8; 32],
    /// The trainer key, which may contribute besides the validators.
    pub trainer: Option<PublicKey>,
    /// The authorised validators, committee size and per-validator budget.
    pub assign: crate::assign::Spec,
}
