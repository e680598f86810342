//! Checkpoints on the wire: the trainer's signed announcement, chunked
//! payloads, and the relay's paths of deltas.

use serde::{Deserialize, Serialize};

use super::{Signed, SignedBody, frame::Blob};
use crate::checkpoint::ContentId;
use crate::identity::{self, PublicKey};
use crate::window::WindowId;

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
pub type PublishCheckpoint = Signed<CheckpointBody>;

impl SignedBody for CheckpointBody {
    const DOMAIN: &'static str = identity::domain::CHECKPOINT;

    fn signer(&self) -> &PublicKey {
        &self.trainer
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

impl CheckpointChunk {
    /// The bytes of a [`super::Frame::CheckpointChunk`] frame that come
    /// before its `len` data bytes: the frame header and the body up to the
    /// data. A sender that writes this, then the data, sends the frame's
    /// encoding without holding the chunk twice (or whole).
    pub fn frame_prefix(id: ContentId, offset: u64, len: usize) -> Vec<u8> {
        // The body of an empty chunk ends with the data's length, a varint 0.
        let empty = super::Frame::CheckpointChunk(CheckpointChunk { id, offset, data: Blob(Vec::new()) }).encode();
        let mut varint = [0u8; 10];
        let n = postcard::to_slice(&(len as u64), &mut varint).map_or(1, |b| b.len());
        let mut out = Vec::with_capacity(empty.len() + n);
        let body = (empty.len() - super::HEADER_LEN - 1 + n + len) as u32;
        out.extend_from_slice(&body.to_le_bytes());
        out.extend_from_slice(&empty[4..empty.len() - 1]);
        out.extend_from_slice(&varint[..n]);
        out
    }
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
    /// The trainer's signed announcement of `target` (`None` for the genesis
    /// checkpoint): a miner checks its signature, its trainer key and its
    /// payload hash, so the coordinator alone cannot name a model.
    pub announcement: Option<PublishCheckpoint>,
    /// The public base URL (`http://` or `https://`, at most
    /// [`MAX_STORE_URL_LEN`] bytes) of the object store, or a CDN in front of
    /// it, that holds every step of this path under [`store_key`]; `None`:
    /// fetch them from the relay. A peer verifies what it downloads from there
    /// as it verifies the relay's chunks, and falls back to the relay on any
    /// failure.
    pub store_url: Option<String>,
}

/// The longest [`CheckpointPath::store_url`] a peer follows.
pub const MAX_STORE_URL_LEN: usize = 1024;

/// The object store's folder of full checkpoint files.
pub const STORE_CHECKPOINTS: &str = "checkpoints";

/// The object store's folder of delta payloads.
pub const STORE_DELTAS: &str = "deltas";

/// The object store's folder of signed weights documents.
pub const STORE_WEIGHTS: &str = "weights";

/// The object key of a path step's payload, relative to the store's root:
/// `checkpoints/<content id>.gguf` for a full file (content-addressed by the
/// trainer-signed content id), `deltas/<blake3 of the payload>.delta` for a
/// delta. The coordinator writes and peers read under these names, so this
/// is the one definition of them.
pub fn store_key(id: &ContentId, base: Option<&ContentId>, payload_hash: &[u8; 32]) -> String {
    match base {
        None => format!("{STORE_CHECKPOINTS}/{id}.gguf"),
        Some(_) => format!("{STORE_DELTAS}/{}.delta", hex::encode(payload_hash)),
    }
}

/// The object key of a window's signed weights document (its postcard
/// encoding, as [`super::WeightsDoc`] signs it).
pub fn store_weights_key(window: WindowId) -> String {
    format!("{STORE_WEIGHTS}/{window:020}.bin")
}

impl PathStep {
    /// This step's object key in the store ([`store_key`]).
    pub fn store_key(&self) -> String {
        store_key(&self.id, self.base.as_ref(), &self.payload_hash)
    }
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
