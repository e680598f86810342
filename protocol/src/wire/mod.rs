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

use serde::Deserialize;

mod checkpoint;
mod confirm;
mod frame;
mod handshake;
mod rollouts;
mod signed;
mod stats;
mod store;
#[cfg(test)]
mod tests;
mod verdict;
mod window;

pub use checkpoint::*;
pub use confirm::*;
pub use frame::{Blob, WireError, canonical};
pub use handshake::*;
pub use rollouts::*;
pub use signed::{NetworkId, Signed, SignedBody, SignedError};
pub use stats::*;
pub use store::*;
pub use verdict::*;
pub use window::*;

/// The QUIC ALPN; the number is the protocol's major version.
pub const ALPN: &[u8] = b"tributary/10";

/// Version sent in [`Hello`]; peers refuse other versions. Version 1: the
/// handshake signature covers the TLS session's exporter keying material,
/// and a checkpoint path carries the trainer's signed announcement. Version
/// 2: every signed document names its network ([`NetworkId`]) under its
/// signature, and the coordinator proves in the [`Challenge`] that it holds
/// its key. Version 3: validators and the trainer commit to and reveal
/// contributions to each window's challenge ([`crate::beacon`]), and the
/// [`Reveal`] carries them. Version 4: a closed window's index of miners
/// ([`GetWindowIndex`], so validators and the trainer fetch miner by miner),
/// and every list answer is paged and capped by bytes. Version 5: a closed
/// window's coordinator-signed manifest in the object store
/// ([`GetWindowManifest`]), so validators and the trainer read archived
/// windows from the store. Version 6: a window names the rule its rewards
/// are scored by ([`WindowInfo::reward`], strict by default: only a
/// well-formed final `Answer:` line is read). Version 7: a refusal says when
/// to retry ([`RejectReason::WindowFull`]: in the next window; admission
/// reserves slots for keys with proven work), and a claimed reward must
/// equal the recomputed one bit for bit (no tolerance). Version 8: an
/// ambiguous position's claimed token is bounded by the reference mass
/// between it and the reference's own draw, not by their distance in ids
/// ([`crate::sampling::DEFAULT_MAX_DRAW_GAP`]), and a rollout's ambiguous
/// positions by what its tokens make honest
/// ([`crate::verify::AmbiguityCap`]). Version 9: arith levels 115–117 ask
/// the problems of 105–107 with worked examples in the prompt
/// ([`crate::env::WORKED_LEVELS`]); a version-8 peer would clamp them to level
/// 10 and fail every prompt check. No verification rule changed. Version
/// 10: arith levels 108 and 118 ask 105's problems subtracting three times
/// in four (a training level for the same held-out columns); a version-9
/// peer would clamp them to level 10. No verification rule changed. Peers
/// of different versions cannot talk.
pub const PROTOCOL_VERSION: u16 = 10;

/// Bytes in a frame header (body length + tag).
pub const HEADER_LEN: usize = 6;

/// The largest body any tag allows (checkpoint chunks, rollout batches).
pub const MAX_BODY_LEN: u32 = 32 << 20;

/// The largest encoded rollout the coordinator takes.
pub const MAX_ROLLOUT_LEN: u32 = 1 << 20;

/// The largest checkpoint chunk.
pub const MAX_CHUNK_LEN: u32 = 8 << 20;

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
    /// A challenge reveal (with the validator set and the contributions:
    /// about 250 bytes a contributing validator).
    Reveal = 13, max 1 << 20, Reveal;
    /// Validator or trainer → coordinator: a signed commitment to a contribution.
    PostBeaconCommit = 14, max SMALL, BeaconCommit;
    /// Validator or trainer → coordinator: the secret behind its commitment.
    PostBeaconReveal = 15, max SMALL, BeaconReveal;
    /// A commitment or reveal is stored.
    BeaconAck = 16, max SMALL, BeaconAck;
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
    /// Submit several rollouts at once.
    SubmitBatch = 25, max MAX_BATCH_LEN, SubmitBatch;
    /// The outcomes of a batch.
    BatchAnswer = 26, max 16 << 10, BatchAnswer;
    /// Fetch rollouts of a closed window.
    FetchRollouts = 30, max SMALL, FetchRollouts;
    /// A batch of rollouts.
    Rollouts = 31, max MAX_BODY_LEN, Rollouts;
    /// Post a signed verdict.
    PostVerdict = 32, max MAX_VERDICT_LEN, Verdict;
    /// Verdict stored.
    VerdictAck = 33, max SMALL, VerdictAck;
    /// Ask for part of a weights document.
    GetWeights = 34, max SMALL, GetWeights;
    /// Part of a signed weights document.
    Weights = 35, max 1 << 20, WeightsPart;
    /// Ask for a window's verdict standing.
    GetStanding = 36, max SMALL, GetStanding;
    /// A window's verdict standing.
    Standing = 37, max 1 << 20, Standing;
    /// Ask which miners stored rollouts in a closed window, and how much.
    GetWindowIndex = 38, max SMALL, GetWindowIndex;
    /// A page of a closed window's miners with their work.
    WindowIndex = 39, max 1 << 20, WindowIndex;
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
    /// Validator → coordinator: the failures waiting for its confirmation.
    GetConfirmations = 50, max SMALL, GetConfirmations;
    /// A page of confirmations (at most 64, each at most about 6 KiB).
    Confirmations = 51, max 1 << 20, Confirmations;
    /// Trainer → coordinator: a signed training-step report.
    PostTrainerStats = 60, max SMALL, TrainerStats;
    /// The training-step report is stored.
    TrainerStatsAck = 61, max SMALL, TrainerStatsAck;
    /// Validator/trainer → coordinator: a closed window's manifest in the object store.
    GetWindowManifest = 65, max SMALL, GetWindowManifest;
    /// The coordinator-signed manifest and a GET URL per segment (at most
    /// [`MAX_MANIFEST_SEGMENTS`] segments of about 250 bytes and a URL each).
    WindowManifest = 66, max 8 << 20, WindowManifest;
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
