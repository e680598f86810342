//! Rollouts on the wire: submission (one or a batch), acknowledgement,
//! refusal and progress for miners; paged fetching for validators and the
//! trainer.

use serde::{Deserialize, Serialize};

use super::frame::{Blob, bounded_vec};
use crate::identity::PublicKey;
use crate::window::WindowId;

/// Why the coordinator refused a rollout. Append only: the discriminants are on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectReason {
    /// The rollout bytes did not decode.
    Malformed,
    /// The encoded rollout exceeded [`MAX_ROLLOUT_LEN`].
    Oversized,
    /// Decoded, but lengths or fields are inconsistent (token counts, logprobs, sketches).
    Schema,
    /// The miner signature does not verify.
    BadSignature,
    /// The rollout names a miner other than the authenticated peer.
    WrongMiner,
    /// The operator's allow/deny list refuses this key.
    NotAllowed,
    /// The miner is banned.
    Banned,
    /// The rollout's window is not open for submissions.
    WrongWindow,
    /// The rollout was generated with a checkpoint other than the window's.
    StaleCheckpoint,
    /// The environment is not the active one.
    WrongEnv,
    /// The task (group, task id) is not one assigned to this miner in this window.
    Unassigned,
    /// The same rollout (or the same slot) was already accepted.
    Duplicate,
    /// Retired: the coordinator no longer refuses a repeated completion (copies
    /// are judged by validators), so it never sends this. Kept so the
    /// discriminants after it stay where they are on the wire.
    ReplayedContent,
    /// The miner exceeded a rate limit.
    RateLimited,
    /// The coordinator could not store it; the miner may retry.
    Internal,
    /// The window's storage is full for this key: its byte share is used,
    /// or no slot is left for a key without proven work (issue 29). Final
    /// for this window; the miner tries again in the next one.
    WindowFull,
}

impl RejectReason {
    /// Every reason, for metrics and reports.
    pub const ALL: [RejectReason; 16] = [
        Self::Malformed,
        Self::Oversized,
        Self::Schema,
        Self::BadSignature,
        Self::WrongMiner,
        Self::NotAllowed,
        Self::Banned,
        Self::WrongWindow,
        Self::StaleCheckpoint,
        Self::WrongEnv,
        Self::Unassigned,
        Self::Duplicate,
        Self::ReplayedContent,
        Self::RateLimited,
        Self::Internal,
        Self::WindowFull,
    ];

    /// snake_case name, for metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Oversized => "oversized",
            Self::Schema => "schema",
            Self::BadSignature => "bad_signature",
            Self::WrongMiner => "wrong_miner",
            Self::NotAllowed => "not_allowed",
            Self::Banned => "banned",
            Self::WrongWindow => "wrong_window",
            Self::StaleCheckpoint => "stale_checkpoint",
            Self::WrongEnv => "wrong_env",
            Self::Unassigned => "unassigned",
            Self::Duplicate => "duplicate",
            Self::ReplayedContent => "replayed_content",
            Self::RateLimited => "rate_limited",
            Self::Internal => "internal",
            Self::WindowFull => "window_full",
        }
    }
}

/// Miner → coordinator: one signed rollout (`Rollout::encode()` bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submit {
    /// Miner-chosen sequence number, echoed in the answer.
    pub seq: u64,
    /// The encoded rollout.
    pub rollout: Blob,
}

/// Coordinator → miner: the rollout with this sequence number is durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The submission's sequence number.
    pub seq: u64,
    /// The rollout's digest.
    pub digest: [u8; 32],
}

/// Coordinator → miner: the rollout was refused; nothing of it was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// The submission's sequence number.
    pub seq: u64,
    /// Why.
    pub reason: RejectReason,
}

/// Miner → coordinator: which of my slots in this window are already stored?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetProgress {
    /// The window.
    pub window: WindowId,
}

/// The (group, rollout index) slots of the asking miner already stored for a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The window.
    pub window: WindowId,
    /// Stored slots.
    pub slots: Vec<(u32, u32)>,
}

/// The most rollouts one [`SubmitBatch`] may carry.
pub const MAX_BATCH_ROLLOUTS: usize = 256;

/// The largest [`SubmitBatch`] body (a sender splits larger batches).
pub const MAX_BATCH_LEN: u32 = 8 << 20;

/// Miner → coordinator: several signed rollouts in one frame. Each is checked
/// as a [`Submit`] would be; one [`BatchAnswer`] answers them all once every
/// accepted one is durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitBatch {
    /// Sequence number of the first rollout; rollout `i` has `seq + i`.
    pub seq: u64,
    /// The encoded rollouts (`Rollout::encode()` bytes), at most [`MAX_BATCH_ROLLOUTS`].
    #[serde(deserialize_with = "bounded_vec")]
    pub rollouts: Vec<Blob>,
}

/// What became of one rollout of a [`SubmitBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Durable; the rollout's digest.
    Stored([u8; 32]),
    /// Refused, and nothing of it stored.
    Refused(RejectReason),
}

/// Coordinator → miner: the outcome of every rollout of one [`SubmitBatch`], in its order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAnswer {
    /// The batch's first sequence number.
    pub seq: u64,
    /// One outcome per rollout, at most [`MAX_BATCH_ROLLOUTS`].
    #[serde(deserialize_with = "bounded_vec")]
    pub outcomes: Vec<Outcome>,
}

/// Validator/trainer → coordinator: fetch stored rollouts of a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRollouts {
    /// The window (its submissions must have closed).
    pub window: WindowId,
    /// Only this miner's rollouts, or all.
    pub miner: Option<PublicKey>,
    /// Resume after this digest (the previous batch's `next`).
    pub after: Option<[u8; 32]>,
    /// At most this many rollouts (the coordinator may send fewer).
    pub limit: u32,
}

/// A batch of encoded rollouts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollouts {
    /// The window.
    pub window: WindowId,
    /// Encoded rollouts.
    pub items: Vec<Blob>,
    /// Cursor for the next batch, `None` when done.
    pub next: Option<[u8; 32]>,
}

/// Validator/trainer → coordinator: which miners stored rollouts in a
/// closed window, and how much (a page of them, in key order). What a
/// validator computes its assignment from before it fetches only the miners
/// it judges, and what the trainer walks miner by miner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetWindowIndex {
    /// The window (its submissions must have closed).
    pub window: WindowId,
    /// Resume after this miner (the previous page's `next`).
    pub after: Option<PublicKey>,
}

/// One miner's stored work in a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinerWork {
    /// The miner.
    pub miner: PublicKey,
    /// Rollouts stored.
    pub rollouts: u32,
    /// Their bytes, as stored.
    pub bytes: u64,
    /// The groups they belong to (ascending, each once): what the window's
    /// assignment draws from ([`crate::assign::Assignment::compute`]).
    pub groups: Vec<u32>,
}

/// A page of a closed window's index: miners in ascending key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowIndex {
    /// The window.
    pub window: WindowId,
    /// Miners of this page.
    pub miners: Vec<MinerWork>,
    /// The last miner of this page when more follow (the next request's `after`), `None` when done.
    pub next: Option<PublicKey>,
}

/// The most bytes of [`MinerWork`] entries the coordinator puts in one
/// [`WindowIndex`] answer (a quarter of the tag's limit: one more entry,
/// whose groups are bounded by the window's `groups_per_miner`, never takes
/// it past the limit).
pub const WINDOW_INDEX_ANSWER_BYTES: usize = 256 << 10;
