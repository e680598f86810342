//! One signed-document type for every body a role signs: the network it
//! belongs to, the body, and the signer's ed25519 signature over both under
//! the body's own domain ([`crate::domain::sign`]).

use serde::{Deserialize, Serialize};

use super::frame::canonical;
use crate::identity::{Keypair, PublicKey, Signature};

/// Which network a signed document belongs to: derived from the
/// coordinator's key ([`NetworkId::of`]), which every client pins and the
/// coordinator proves it holds in each handshake. A document signed for one
/// network never verifies on another, even when the same validator or
/// trainer key serves both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetworkId(pub [u8; 32]);

impl NetworkId {
    /// The network whose coordinator holds `coordinator`.
    pub fn of(coordinator: &PublicKey) -> Self {
        Self(blake3::derive_key(crate::domain::context::NETWORK_ID, coordinator.as_bytes()))
    }
}

impl std::fmt::Display for NetworkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A body that is signed on the wire: its signing domain and who must have
/// signed it.
pub trait SignedBody: Serialize {
    /// The signing domain (one of [`crate::domain::sign`]).
    const DOMAIN: &'static str;

    /// The key whose signature the body carries (named inside the body, so a
    /// signature cannot be moved to another signer's document).
    fn signer(&self) -> &PublicKey;
}

/// A network id, a body and its signer's signature over
/// `postcard((network, body))` under [`SignedBody::DOMAIN`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed<B> {
    /// The network the document was signed for.
    pub network: NetworkId,
    /// What is asserted.
    pub body: B,
    /// The signature of [`SignedBody::signer`].
    pub signature: Signature,
}

/// Why a signed document is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignedError {
    /// It was signed for another network.
    #[error("signed for network {got}, this is network {expected}")]
    WrongNetwork {
        /// This network.
        expected: NetworkId,
        /// The document's.
        got: NetworkId,
    },
    /// The signature does not verify against the body's signer.
    #[error("signature does not verify")]
    BadSignature,
}

fn signing_bytes<B: Serialize>(network: &NetworkId, body: &B) -> Vec<u8> {
    canonical(&(network, body))
}

impl<B: SignedBody> Signed<B> {
    /// Signs `body` for `network` with `key` (which should be the body's signer).
    pub fn sign(body: B, key: &Keypair, network: &NetworkId) -> Self {
        let signature = key.sign(B::DOMAIN, &signing_bytes(network, &body));
        Self { network: *network, body, signature }
    }

    /// Checks that the document belongs to `network` and that its signature
    /// is the body's signer's.
    pub fn verify(&self, network: &NetworkId) -> Result<(), SignedError> {
        if self.network != *network {
            return Err(SignedError::WrongNetwork { expected: *network, got: self.network });
        }
        self.body
            .signer()
            .verify(B::DOMAIN, &signing_bytes(&self.network, &self.body), &self.signature)
            .map_err(|_| SignedError::BadSignature)
    }
}
