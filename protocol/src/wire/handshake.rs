//! The handshake (a peer proves it holds its key) and connection-level errors.

use serde::{Deserialize, Serialize};

use crate::identity::{PublicKey, Signature};
use crate::window::Schedule;

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
pub const DEV_KEY_CONTEXT: &str = crate::domain::context::DEV_KEY;

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

/// Coordinator → client: a fresh nonce to sign, and the coordinator's proof
/// that it holds the key it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Random, fresh per connection.
    pub nonce: [u8; 32],
    /// The coordinator's own key (it signs weights documents; the network's
    /// id is derived from it, [`super::NetworkId::of`]).
    pub coordinator: PublicKey,
    /// `coordinator`'s signature under
    /// [`crate::domain::sign::COORDINATOR_HANDSHAKE`] over the nonce and this
    /// TLS session's exporter keying material: a server cannot name a key it
    /// does not hold, nor pass on another server's proof.
    pub proof: Signature,
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
