//! One signed-document type for every body a role signs: the body, and the
//! signer's ed25519 signature over its canonical bytes under the body's own
//! domain ([`crate::domain::sign`]).

use serde::{Deserialize, Serialize};

use super::frame::canonical;
use crate::identity::{IdentityError, Keypair, PublicKey, Signature};

/// A body that is signed on the wire: its signing domain and who must have
/// signed it.
pub trait SignedBody: Serialize {
    /// The signing domain (one of [`crate::domain::sign`]).
    const DOMAIN: &'static str;

    /// The key whose signature the body carries (named inside the body, so a
    /// signature cannot be moved to another signer's document).
    fn signer(&self) -> &PublicKey;
}

/// A body and its signer's signature over `postcard(body)` under
/// [`SignedBody::DOMAIN`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed<B> {
    /// What is asserted.
    pub body: B,
    /// The signature of [`SignedBody::signer`].
    pub signature: Signature,
}

impl<B: SignedBody> Signed<B> {
    /// Signs `body` with `key` (which should be the body's signer).
    pub fn sign(body: B, key: &Keypair) -> Self {
        let signature = key.sign(B::DOMAIN, &canonical(&body));
        Self { body, signature }
    }

    /// Checks the signature against the body's signer.
    pub fn verify(&self) -> Result<(), IdentityError> {
        self.body.signer().verify(B::DOMAIN, &canonical(&self.body), &self.signature)
    }
}
