//! The wire protocol between the coordinator and every other role.
//!
//! Connections are QUIC with the ALPN [`ALPN`]. Each stream carries a
//! sequence of frames:
//!
//! ```text
//! frame = body_len: u32 LE ‖ tag: u16 LE ‖ body: postcard bytes (body_len of them)
//! ```
//!
//! Every tag has its own size limit ([`Tag::max_body_len`]); a reader checks
//! the header before reading the body, so a peer cannot make it allocate more
//! than that. Tag numbers are never reused: a removed frame leaves its number
//! behind as a comment in the list below. Bodies must be consumed exactly
//! (trailing bytes are an error).

use serde::{Deserialize, Serialize};

use crate::checkpoint::ContentId;
use crate::env::EnvId;
use crate::identity::{self, PublicKey, Signature};
use crate::prf::Seed;
use crate::rollout::SamplingParams;
use crate::window::{Schedule, WindowId};

/// The QUIC ALPN; the number is the protocol's major version.
pub const ALPN: &[u8] = b"tributary/0";

/// Version sent in [`Hello`]; peers refuse other versions.
pub const PROTOCOL_VERSION: u16 = 0;

/// Bytes in a frame header (body length + tag).
pub const HEADER_LEN: usize = 6;

/// The largest body any tag allows (checkpoint chunks, rollout batches).
pub const MAX_BODY_LEN: u32 = 32 << 20;

/// The largest encoded rollout the coordinator takes.
pub const MAX_ROLLOUT_LEN: u32 = 1 << 20;

/// The largest checkpoint chunk.
pub const MAX_CHUNK_LEN: u32 = 8 << 20;

/// Errors from decoding frames. Every one means the peer sent bad bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Not enough bytes yet: at least `needed` in total are required.
    #[error("incomplete frame: need {needed} bytes")]
    Incomplete {
        /// Total bytes needed to make progress.
        needed: usize,
    },
    /// The tag number is not one this version knows.
    #[error("unknown frame tag {0}")]
    UnknownTag(u16),
    /// The body is larger than its tag allows.
    #[error("frame {tag:?} body of {len} bytes exceeds its limit of {max}")]
    Oversized {
        /// The frame's tag.
        tag: Tag,
        /// Declared body length.
        len: u32,
        /// The tag's limit.
        max: u32,
    },
    /// The body is not a valid postcard encoding of the tag's type.
    #[error("malformed {tag:?} body: {reason}")]
    Malformed {
        /// The frame's tag.
        tag: Tag,
        /// What postcard said.
        reason: String,
    },
    /// The body decoded but bytes were left over.
    #[error("{tag:?} body has {extra} trailing bytes")]
    TrailingBytes {
        /// The frame's tag.
        tag: Tag,
        /// Bytes left over.
        extra: usize,
    },
}

/// An owned byte string that postcard encodes as length ‖ bytes (not as a
/// sequence of integers).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Blob(pub Vec<u8>);

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

/// The role a peer claims in its [`Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Generates rollouts. Anyone may mine unless an operator's list says otherwise.
    Miner,
    /// Checks rollouts and posts verdicts; only configured keys.
    Validator,
    /// Trains and publishes checkpoints; only the configured key.
    Trainer,
}

/// blake3 key-derivation context of the `--dev` role keys.
pub const DEV_KEY_CONTEXT: &str = "tributary 2025 dev role key v1";

impl Role {
    /// The well-known key of this role in a `--dev` network: ed25519 with
    /// secret seed `blake3::derive_key(DEV_KEY_CONTEXT, role name)`. A `--dev`
    /// coordinator authorises the dev trainer and validator keys, so those
    /// roles join without configuration. Public knowledge: never use it
    /// outside `--dev`.
    pub fn dev_key(self) -> crate::identity::Keypair {
        crate::identity::Keypair::from_seed(blake3::derive_key(DEV_KEY_CONTEXT, self.as_str().as_bytes()))
    }
}

impl Role {
    /// Lower-case name, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Miner => "miner",
            Role::Validator => "validator",
            Role::Trainer => "trainer",
        }
    }
}

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
    /// The same completion was already submitted in this window (possibly by another key).
    ReplayedContent,
    /// The miner exceeded a rate limit.
    RateLimited,
    /// The coordinator could not store it; the miner may retry.
    Internal,
}

impl RejectReason {
    /// Every reason, for metrics and reports.
    pub const ALL: [RejectReason; 15] = [
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
        }
    }
}

/// Connection-level error codes (sent in [`ErrorFrame`] before closing, or as a request's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The peer's protocol version is not supported.
    Version,
    /// The handshake signature did not verify.
    BadHandshake,
    /// The key may not take the claimed role (or is on a deny list).
    Unauthorized,
    /// A frame arrived that is not allowed in this state or role.
    UnexpectedFrame,
    /// The peer sent bytes that do not decode.
    Malformed,
    /// Too many connections or requests.
    RateLimited,
    /// Not found (window, checkpoint...).
    NotFound,
    /// Not yet available (for instance a reveal before submissions close).
    NotYet,
    /// A signed document did not verify.
    BadSignature,
    /// The coordinator failed internally.
    Internal,
}

impl ErrorCode {
    /// Whether the coordinator closes the connection after sending this error.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            Self::Version | Self::BadHandshake | Self::Unauthorized | Self::UnexpectedFrame | Self::Malformed
        )
    }
}

/// Client → coordinator: the first frame on a connection's control stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`].
    pub version: u16,
    /// The role claimed.
    pub role: Role,
    /// The peer's key.
    pub key: PublicKey,
}

/// Coordinator → client: a fresh nonce to sign.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Random, fresh per connection.
    pub nonce: [u8; 32],
    /// The coordinator's own key (it signs weights documents).
    pub coordinator: PublicKey,
}

/// Client → coordinator: proof of key possession.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// The client's signature over [`handshake_bytes`] under [`identity::domain::HANDSHAKE`].
    pub signature: Signature,
}

/// The bytes a client signs in the handshake: nonce, coordinator key, its own key, role.
pub fn handshake_bytes(nonce: &[u8; 32], coordinator: &PublicKey, hello: &Hello) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + 32 + 32 + 3);
    out.extend_from_slice(nonce);
    out.extend_from_slice(coordinator.as_bytes());
    out.extend_from_slice(hello.key.as_bytes());
    out.extend_from_slice(&hello.version.to_le_bytes());
    out.push(match hello.role {
        Role::Miner => 0,
        Role::Validator => 1,
        Role::Trainer => 2,
    });
    out
}

/// Coordinator → client: the handshake succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The coordinator's clock when it answered (ms since the Unix epoch).
    pub now_ms: u64,
    /// The window clock.
    pub schedule: Schedule,
}

/// An error answer; after a connection-level error the coordinator closes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFrame {
    /// What went wrong.
    pub code: ErrorCode,
    /// Human-readable detail (bounded by the frame limit).
    pub detail: String,
}

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

/// Asks for a window's challenge secret (answered only after its submissions close).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReveal {
    /// The window.
    pub window: WindowId,
}

/// A window's revealed challenge secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reveal {
    /// The window.
    pub window: WindowId,
    /// The secret; check it with [`crate::window::verify_reveal`].
    pub secret: [u8; 32],
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// What is asserted.
    pub body: VerdictBody,
    /// The validator's signature over `postcard(body)` under [`identity::domain::VERDICT`].
    pub signature: Signature,
}

impl Verdict {
    /// Signs a verdict body.
    pub fn sign(body: VerdictBody, key: &identity::Keypair) -> Self {
        let signature = key.sign(identity::domain::VERDICT, &canonical(&body));
        Self { body, signature }
    }

    /// Checks the signature against `body.validator`.
    pub fn verify(&self) -> Result<(), identity::IdentityError> {
        self.body.validator.verify(identity::domain::VERDICT, &canonical(&self.body), &self.signature)
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

/// A signed weights document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsDoc {
    /// The weights.
    pub body: WeightsBody,
    /// The coordinator's signature over `postcard(body)` under [`identity::domain::WEIGHTS`].
    pub signature: Signature,
}

impl WeightsDoc {
    /// Signs a weights body.
    pub fn sign(body: WeightsBody, key: &identity::Keypair) -> Self {
        let signature = key.sign(identity::domain::WEIGHTS, &canonical(&body));
        Self { body, signature }
    }

    /// Checks the signature against `body.coordinator`.
    pub fn verify(&self) -> Result<(), identity::IdentityError> {
        self.body.coordinator.verify(identity::domain::WEIGHTS, &canonical(&self.body), &self.signature)
    }

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

/// Whether a checkpoint is stored whole or as a sparse delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointKind {
    /// A full checkpoint.
    Full,
    /// A sparse delta against `base`.
    Delta {
        /// Content id of the checkpoint the delta applies to.
        base: ContentId,
    },
}

/// The trainer's announcement of a checkpoint (signed part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointBody {
    /// Content id of the checkpoint the payload reconstructs.
    pub id: ContentId,
    /// Full or delta.
    pub kind: CheckpointKind,
    /// Total payload bytes.
    pub len: u64,
    /// blake3 of the payload bytes.
    pub payload_hash: [u8; 32],
    /// Miners use it from the window after this one.
    pub window: WindowId,
    /// The trainer.
    pub trainer: PublicKey,
}

/// A signed checkpoint announcement; its payload follows as [`CheckpointChunk`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishCheckpoint {
    /// What is announced.
    pub body: CheckpointBody,
    /// The trainer's signature over `postcard(body)` under [`identity::domain::CHECKPOINT`].
    pub signature: Signature,
}

impl PublishCheckpoint {
    /// Signs an announcement.
    pub fn sign(body: CheckpointBody, key: &identity::Keypair) -> Self {
        let signature = key.sign(identity::domain::CHECKPOINT, &canonical(&body));
        Self { body, signature }
    }

    /// Checks the signature against `body.trainer`.
    pub fn verify(&self) -> Result<(), identity::IdentityError> {
        self.body.trainer.verify(identity::domain::CHECKPOINT, &canonical(&self.body), &self.signature)
    }
}

/// A piece of a checkpoint payload (either direction).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointChunk {
    /// The checkpoint's content id.
    pub id: ContentId,
    /// Byte offset of `data` in the payload.
    pub offset: u64,
    /// At most [`MAX_CHUNK_LEN`] bytes.
    pub data: Blob,
}

/// Asks for part of a stored **full** checkpoint (the GGUF file whose
/// content id is `id`), from `offset`: resumable by asking again from the
/// bytes already held. Answered with one [`CheckpointChunk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetCheckpoint {
    /// The checkpoint's content id.
    pub id: ContentId,
    /// Start offset.
    pub offset: u64,
}

/// The most steps a [`CheckpointPath`] has (longer chains are answered with a full checkpoint).
pub const MAX_PATH_STEPS: usize = 16;

/// Asks the way from the checkpoint a peer holds to another one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetCheckpointPath {
    /// The checkpoint the peer holds, if any.
    pub have: Option<ContentId>,
    /// The checkpoint wanted; `None`: the latest published one.
    pub want: Option<ContentId>,
}

/// One download of a [`CheckpointPath`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStep {
    /// The checkpoint this step produces.
    pub id: ContentId,
    /// `Some(base)`: a delta from `base` (fetch with [`GetDelta`]); `None`: the
    /// full checkpoint (fetch with [`GetCheckpoint`]).
    pub base: Option<ContentId>,
    /// Payload bytes.
    pub len: u64,
    /// blake3 of the payload.
    pub payload_hash: [u8; 32],
}

/// Coordinator → peer: how to get from `have` to `target`, in order (empty
/// when `have` is already `target`). At most [`MAX_PATH_STEPS`] steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointPath {
    /// The checkpoint the path ends at.
    pub target: ContentId,
    /// The first window that uses `target`.
    pub from_window: WindowId,
    /// Downloads, applied in order.
    pub steps: Vec<PathStep>,
}

/// Asks for part of a stored delta payload (from `base` to `id`), from `offset`.
/// Answered with one [`CheckpointChunk`] whose `id` is the delta's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetDelta {
    /// The delta's base checkpoint.
    pub base: ContentId,
    /// The checkpoint the delta produces.
    pub id: ContentId,
    /// Start offset.
    pub offset: u64,
}

/// Coordinator → trainer: the checkpoint payload is stored and verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointStored {
    /// The checkpoint's content id.
    pub id: ContentId,
}

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerStats {
    /// What is reported.
    pub body: TrainerStatsBody,
    /// The trainer's signature over `postcard(body)` under [`identity::domain::TRAINER_STATS`].
    pub signature: Signature,
}

impl TrainerStats {
    /// Signs a report.
    pub fn sign(body: TrainerStatsBody, key: &identity::Keypair) -> Self {
        let signature = key.sign(identity::domain::TRAINER_STATS, &canonical(&body));
        Self { body, signature }
    }

    /// Checks the signature against `body.trainer`.
    pub fn verify(&self) -> Result<(), identity::IdentityError> {
        self.body.trainer.verify(identity::domain::TRAINER_STATS, &canonical(&self.body), &self.signature)
    }
}

/// Coordinator → trainer: the report for this window is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerStatsAck {
    /// The report's window.
    pub window: WindowId,
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

/// A sequence of at most [`MAX_BATCH_ROLLOUTS`] elements: a longer one is an
/// error before it is allocated.
fn bounded_vec<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct Bounded<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {MAX_BATCH_ROLLOUTS} elements")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let hint = seq.size_hint().unwrap_or(0);
            if hint > MAX_BATCH_ROLLOUTS {
                return Err(serde::de::Error::invalid_length(hint, &self));
            }
            let mut out = Vec::with_capacity(hint);
            while let Some(x) = seq.next_element()? {
                if out.len() == MAX_BATCH_ROLLOUTS {
                    return Err(serde::de::Error::invalid_length(out.len() + 1, &self));
                }
                out.push(x);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded(std::marker::PhantomData))
}

/// The postcard encoding used as the canonical bytes of signed bodies.
pub fn canonical<T: Serialize>(body: &T) -> Vec<u8> {
    // Serializing plain in-memory structs to a Vec cannot fail.
    postcard::to_stdvec(body).unwrap_or_default()
}

macro_rules! frames {
    ($( $(#[$doc:meta])* $name:ident = $tag:literal, max $max:expr, $body:ty; )*) => {
        /// A frame's tag number. Never reuse a number.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Tag {
            $( $(#[$doc])* $name = $tag, )*
        }

        impl Tag {
            /// Every tag.
            pub const ALL: &'static [Tag] = &[$(Tag::$name,)*];

            /// The tag for a number, if this version knows it.
            pub fn from_u16(n: u16) -> Option<Tag> {
                match n {
                    $( $tag => Some(Tag::$name), )*
                    _ => None,
                }
            }

            /// The largest body this tag allows.
            pub fn max_body_len(self) -> u32 {
                match self {
                    $( Tag::$name => $max, )*
                }
            }
        }

        /// Every frame of the protocol.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(clippy::large_enum_variant)]
        pub enum Frame {
            $( $(#[$doc])* $name($body), )*
        }

        impl Frame {
            /// This frame's tag.
            pub fn tag(&self) -> Tag {
                match self {
                    $( Frame::$name(_) => Tag::$name, )*
                }
            }

            fn body_bytes(&self) -> Vec<u8> {
                match self {
                    $( Frame::$name(b) => canonical(b), )*
                }
            }

            /// Decodes a body of the given tag. The body must be consumed exactly.
            pub fn decode_body(tag: Tag, body: &[u8]) -> Result<Frame, WireError> {
                let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
                if len > tag.max_body_len() {
                    return Err(WireError::Oversized { tag, len, max: tag.max_body_len() });
                }
                match tag {
                    $( Tag::$name => take::<$body>(tag, body).map(Frame::$name), )*
                }
            }
        }
    };
}

fn take<'a, T: Deserialize<'a>>(tag: Tag, body: &'a [u8]) -> Result<T, WireError> {
    let (value, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| WireError::Malformed { tag, reason: e.to_string() })?;
    if !rest.is_empty() {
        return Err(WireError::TrailingBytes { tag, extra: rest.len() });
    }
    Ok(value)
}

const SMALL: u32 = 4 << 10;

frames! {
    /// Handshake, client → coordinator.
    Hello = 1, max SMALL, Hello;
    /// Handshake, coordinator → client.
    Challenge = 2, max SMALL, Challenge;
    /// Handshake, client → coordinator.
    Auth = 3, max SMALL, Auth;
    /// Handshake done.
    Welcome = 4, max SMALL, Welcome;
    /// An error; connection-level errors close the connection.
    Error = 5, max SMALL, ErrorFrame;
    /// Ask for a window's parameters.
    GetWindow = 10, max SMALL, GetWindow;
    /// A window's parameters.
    WindowInfo = 11, max SMALL, WindowInfo;
    /// Ask for a challenge reveal.
    GetReveal = 12, max SMALL, GetReveal;
    /// A challenge reveal.
    Reveal = 13, max SMALL, Reveal;
    /// Submit a rollout.
    Submit = 20, max MAX_ROLLOUT_LEN + 64, Submit;
    /// A rollout is durable.
    Ack = 21, max SMALL, Ack;
    /// A rollout was refused.
    Refused = 22, max SMALL, Refused;
    /// Ask which slots are stored.
    GetProgress = 23, max SMALL, GetProgress;
    /// Stored slots.
    Progress = 24, max 1 << 20, Progress;
    /// Fetch rollouts of a closed window.
    FetchRollouts = 30, max SMALL, FetchRollouts;
    /// A batch of rollouts.
    Rollouts = 31, max MAX_BODY_LEN, Rollouts;
    /// Post a signed verdict.
    PostVerdict = 32, max SMALL, Verdict;
    /// Verdict stored.
    VerdictAck = 33, max SMALL, VerdictAck;
    /// Ask for weights.
    GetWeights = 34, max SMALL, GetWeights;
    /// A signed weights document.
    Weights = 35, max 4 << 20, WeightsDoc;
    /// Announce a checkpoint.
    PublishCheckpoint = 40, max SMALL, PublishCheckpoint;
    /// Part of a checkpoint payload.
    CheckpointChunk = 41, max MAX_CHUNK_LEN + 64, CheckpointChunk;
    /// Ask for part of a checkpoint payload.
    GetCheckpoint = 42, max SMALL, GetCheckpoint;
    /// A checkpoint is stored.
    CheckpointStored = 43, max SMALL, CheckpointStored;
    /// Ask the way between two checkpoints.
    GetCheckpointPath = 44, max SMALL, GetCheckpointPath;
    /// The way between two checkpoints.
    CheckpointPath = 45, max 16 << 10, CheckpointPath;
    /// Ask for part of a delta payload.
    GetDelta = 46, max SMALL, GetDelta;
    /// Ask for a window's verdict standing.
    GetStanding = 36, max SMALL, GetStanding;
    /// A window's verdict standing.
    Standing = 37, max 4 << 20, Standing;
    /// Trainer → coordinator: a signed training-step report.
    PostTrainerStats = 60, max SMALL, TrainerStats;
    /// The training-step report is stored.
    TrainerStatsAck = 61, max SMALL, TrainerStatsAck;
    /// Submit several rollouts at once.
    SubmitBatch = 25, max MAX_BATCH_LEN, SubmitBatch;
    /// The outcomes of a batch.
    BatchAnswer = 26, max 16 << 10, BatchAnswer;
}

impl Frame {
    /// The frame's full encoding: header then body.
    pub fn encode(&self) -> Vec<u8> {
        let body = self.body_bytes();
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        // Bodies we build are far below 4 GiB; the limit check on the reader refuses the rest.
        out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&(self.tag() as u16).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes one frame from the front of `buf`, returning it and the bytes it used.
    pub fn decode(buf: &[u8]) -> Result<(Frame, usize), WireError> {
        let header: &[u8; HEADER_LEN] = buf
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(WireError::Incomplete { needed: HEADER_LEN })?;
        let (tag, len) = parse_header(header)?;
        let end = HEADER_LEN + len as usize;
        let body = buf.get(HEADER_LEN..end).ok_or(WireError::Incomplete { needed: end })?;
        Ok((Frame::decode_body(tag, body)?, end))
    }
}

/// Checks a header: the tag must be known and the length within its limit.
pub fn parse_header(header: &[u8; HEADER_LEN]) -> Result<(Tag, u32), WireError> {
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let raw = u16::from_le_bytes([header[4], header[5]]);
    let tag = Tag::from_u16(raw).ok_or(WireError::UnknownTag(raw))?;
    if len > tag.max_body_len() {
        return Err(WireError::Oversized { tag, len, max: tag.max_body_len() });
    }
    Ok((tag, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_unique_and_limits_bounded() {
        let mut seen = std::collections::HashSet::new();
        for t in Tag::ALL {
            assert!(seen.insert(*t as u16), "duplicate tag {t:?}");
            assert_eq!(Tag::from_u16(*t as u16), Some(*t));
            assert!(t.max_body_len() <= MAX_BODY_LEN);
        }
    }

    #[test]
    fn header_checks() {
        let f = Frame::GetReveal(GetReveal { window: 7 });
        let bytes = f.encode();
        assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
        assert_eq!(Frame::decode(&bytes[..3]), Err(WireError::Incomplete { needed: HEADER_LEN }));
        let mut unknown = bytes.clone();
        unknown[4] = 0xEE;
        assert!(matches!(Frame::decode(&unknown), Err(WireError::UnknownTag(_))));
        let mut big = bytes.clone();
        big[..4].copy_from_slice(&(SMALL + 1).to_le_bytes());
        assert!(matches!(Frame::decode(&big), Err(WireError::Oversized { .. })));
        let mut trailing = bytes.clone();
        trailing[0] += 1;
        trailing.push(0);
        assert!(matches!(Frame::decode(&trailing), Err(WireError::TrailingBytes { .. })));
    }

    #[test]
    fn signed_documents_verify_and_detect_tampering() {
        let v = identity::Keypair::from_seed([2; 32]);
        let mut verdict = Verdict::sign(
            VerdictBody {
                window: 3,
                miner: identity::Keypair::from_seed([3; 32]).public(),
                validator: v.public(),
                checked: 10,
                valid: 9,
                estimated_valid: 90,
                hard_failure: false,
                soft_failures: 1,
                reasons: vec!["Distribution: median 0.2".into()],
            },
            &v,
        );
        verdict.verify().unwrap();
        verdict.body.valid = 10;
        assert!(verdict.verify().is_err());
    }

    #[test]
    fn weights_document_verifies_by_coordinator_and_detects_tampering() {
        let c = identity::Keypair::from_seed([4; 32]);
        let other = identity::Keypair::from_seed([5; 32]);
        let m = identity::Keypair::from_seed([6; 32]).public();
        let doc = WeightsDoc::sign(WeightsBody { window: 7, weights: vec![(m, 1.0)], coordinator: c.public() }, &c);
        let bytes = doc.encode();
        assert_eq!(WeightsDoc::decode_verified(&bytes, &c.public()), Ok(doc.clone()));
        // Another expected key, a re-signed copy naming another coordinator, a flipped byte, junk.
        assert_eq!(WeightsDoc::decode_verified(&bytes, &other.public()), Err(WeightsDocError::WrongCoordinator));
        let mut tampered = doc.clone();
        tampered.body.weights[0].1 = 0.5;
        assert_eq!(WeightsDoc::decode_verified(&tampered.encode(), &c.public()), Err(WeightsDocError::BadSignature));
        let mut flipped = bytes.clone();
        flipped[1] ^= 1;
        assert!(WeightsDoc::decode_verified(&flipped, &c.public()).is_err());
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(WeightsDoc::decode_verified(&trailing, &c.public()), Err(WeightsDocError::Wire(_))));
    }

    #[test]
    fn trainer_stats_sign_check_and_round_trip() {
        let t = identity::Keypair::from_seed([7; 32]);
        let body = TrainerStatsBody {
            window: 9,
            checkpoint: ContentId([1; 32]),
            first_trained: 7,
            last_trained: 8,
            step: 3,
            lr: 1e-3,
            loss: -0.25,
            pg_loss: -0.3,
            kl: 0.05,
            entropy: 2.5,
            clip_low_frac: 0.0,
            clip_high_frac: 0.1,
            grad_norm: 1.5,
            reward_mean: 0.4,
            reward_std: 0.2,
            seqs: 8,
            tokens: 128,
            groups_kept: 2,
            groups_dropped: 1,
            groups_held: 0,
            payload_bytes: 1000,
            checkpoint_bytes: 10_000,
            delta: true,
            change_fraction: Some(0.3),
            trainer: t.public(),
        };
        assert_eq!(body.check(), Ok(()));
        let s = TrainerStats::sign(body.clone(), &t);
        s.verify().unwrap();
        let f = Frame::PostTrainerStats(s.clone());
        let bytes = f.encode();
        assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
        let mut tampered = s.clone();
        tampered.body.loss = 0.0;
        assert!(tampered.verify().is_err());
        let mut b = body.clone();
        b.loss = f64::NAN;
        assert_eq!(b.check(), Err(TrainerStatsError::NotFinite("loss")));
        let mut b = body.clone();
        b.clip_high_frac = 1.5;
        assert_eq!(b.check(), Err(TrainerStatsError::NotAFraction("clip_high_frac")));
        let mut b = body;
        b.last_trained = 10;
        assert_eq!(b.check(), Err(TrainerStatsError::Windows));
    }

    proptest::proptest! {
        #[test]
        fn contract_standing_and_verdict_frames_round_trip(
            window in proptest::prelude::any::<u64>(),
            temp in 0.0f32..4.0,
            max_new in proptest::prelude::any::<u32>(),
            difficulty in proptest::prelude::any::<u32>(),
            dataset in proptest::option::of(proptest::prelude::any::<[u8; 32]>()),
            standings in proptest::collection::vec((proptest::prelude::any::<[u8; 32]>(), 0u8..3), 0..8),
            reasons in proptest::collection::vec(".{0,400}", 0..10),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let info = WindowInfo {
                window,
                opens_at_ms: 1,
                closes_at_ms: 2,
                seed: Seed([3; 32]),
                commitment: [4; 32],
                checkpoint: ContentId([5; 32]),
                env: EnvId::Gsm8k,
                groups_per_miner: 2,
                group_size: 4,
                sampling: SamplingParams { temperature: temp, max_new_tokens: max_new },
                difficulty,
                dataset,
            };
            let miners = standings
                .iter()
                .map(|(k, s)| (PublicKey(*k), [MinerStanding::Passed, MinerStanding::Failed, MinerStanding::Suspect][*s as usize]))
                .collect();
            let mut body = VerdictBody {
                window,
                miner: PublicKey([1; 32]),
                validator: PublicKey([2; 32]),
                checked: 3,
                valid: 1,
                estimated_valid: 1,
                hard_failure: true,
                soft_failures: 0,
                reasons: vec![],
            };
            for r in &reasons {
                body.add_reason(r);
            }
            proptest::prop_assert!(body.reasons.len() <= MAX_VERDICT_REASONS);
            proptest::prop_assert!(body.reasons.iter().all(|r| r.len() <= MAX_REASON_LEN));
            let key = identity::Keypair::from_seed([9; 32]);
            for f in [
                Frame::WindowInfo(info),
                Frame::GetStanding(GetStanding { window }),
                Frame::Standing(Standing { window, miners }),
                Frame::PostVerdict(Verdict::sign(body, &key)),
            ] {
                let bytes = f.encode();
                proptest::prop_assert!(bytes.len() - HEADER_LEN <= f.tag().max_body_len() as usize);
                proptest::prop_assert_eq!(Frame::decode(&bytes).unwrap(), (f.clone(), bytes.len()));
                // Garbage bodies under the same tag are an error, never a panic.
                let _ = Frame::decode_body(f.tag(), &junk);
            }
        }
    }

    #[test]
    fn batch_frames_round_trip_and_are_bounded() {
        let rollouts: Vec<Blob> = (0..MAX_BATCH_ROLLOUTS).map(|i| Blob(vec![i as u8; 40])).collect();
        let answer = BatchAnswer {
            seq: 9,
            outcomes: (0..MAX_BATCH_ROLLOUTS)
                .map(|i| {
                    if i % 2 == 0 { Outcome::Stored([i as u8; 32]) } else { Outcome::Refused(RejectReason::Duplicate) }
                })
                .collect(),
        };
        for f in
            [Frame::SubmitBatch(SubmitBatch { seq: 7, rollouts: rollouts.clone() }), Frame::BatchAnswer(answer.clone())]
        {
            let bytes = f.encode();
            assert!(bytes.len() - HEADER_LEN <= f.tag().max_body_len() as usize);
            assert_eq!(Frame::decode(&bytes).unwrap(), (f, bytes.len()));
        }
        // One element more than allowed is refused, for both frames.
        let mut more = rollouts;
        more.push(Blob(vec![]));
        let f = Frame::SubmitBatch(SubmitBatch { seq: 7, rollouts: more });
        assert!(matches!(Frame::decode(&f.encode()), Err(WireError::Malformed { tag: Tag::SubmitBatch, .. })));
        let mut more = answer;
        more.outcomes.push(Outcome::Refused(RejectReason::Schema));
        let f = Frame::BatchAnswer(more);
        assert!(matches!(Frame::decode(&f.encode()), Err(WireError::Malformed { tag: Tag::BatchAnswer, .. })));
        // A claimed count far beyond the bound fails before any allocation.
        let mut huge = vec![7u8]; // seq
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // u32::MAX elements
        assert!(Frame::decode_body(Tag::SubmitBatch, &huge).is_err());
    }
}
