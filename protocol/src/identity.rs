//! Identities: ed25519 keys for every role, and domain-separated signatures.
//!
//! Every signature in Tributary is made over `domain_message(domain, bytes)`:
//! the domain string's length (u32 little-endian), the domain, then the bytes.
//! A signature made for one purpose therefore never verifies for another.
//! Domains are the constants in [`domain`].

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

/// Signature domains, one per kind of signed message. Never reuse one.
pub use crate::domain::sign as domain;

/// Errors from keys, key files and signatures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The 32 bytes are not a valid ed25519 public key (not a curve point,
    /// or a weak point of small order).
    #[error("invalid ed25519 public key")]
    InvalidPublicKey,
    /// The signature does not verify for this key, domain and message.
    #[error("signature does not verify")]
    BadSignature,
    /// A hex string was malformed or of the wrong length.
    #[error("bad hex: expected {expected} bytes")]
    BadHex {
        /// The number of bytes expected.
        expected: usize,
    },
    /// A key file held neither 32 raw bytes nor 64 hex characters.
    #[error("key file {path} is not 32 raw bytes or 64 hex characters")]
    BadKeyFile {
        /// The file's path.
        path: String,
    },
    /// Reading or writing a key file failed.
    #[error("key file {path}: {source}")]
    Io {
        /// The file's path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The bytes that are actually signed: a length-prefixed domain, then the message.
pub fn domain_message(domain: &str, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + domain.len() + msg.len());
    // Domains are short constants; saturate rather than wrap for absurd input.
    let len = u32::try_from(domain.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(domain.as_bytes());
    out.extend_from_slice(msg);
    out
}

/// An ed25519 signing key (secret). Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct Keypair(SigningKey);

impl Keypair {
    /// A fresh key from the operating system's randomness.
    pub fn generate() -> Self {
        Self(SigningKey::generate(&mut rand::rngs::OsRng))
    }

    /// The key whose secret seed is these 32 bytes (deterministic; for tests and `--dev`).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    /// The 32-byte secret seed.
    pub fn seed(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// This key's public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key().to_bytes())
    }

    /// Signs `msg` under `domain`.
    pub fn sign(&self, domain: &str, msg: &[u8]) -> Signature {
        Signature(self.0.sign(&domain_message(domain, msg)).to_bytes())
    }

    /// Reads a key file: 32 raw bytes, or 64 hex characters (surrounding whitespace allowed).
    pub fn load(path: &Path) -> Result<Self, IdentityError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|source| IdentityError::Io { path: shown.clone(), source })?;
        // A key file is tiny; refuse to read anything large.
        if meta.len() > 1024 {
            return Err(IdentityError::BadKeyFile { path: shown });
        }
        let bytes = std::fs::read(path).map_err(|source| IdentityError::Io { path: shown.clone(), source })?;
        if let Ok(seed) = <[u8; 32]>::try_from(bytes.as_slice()) {
            return Ok(Self::from_seed(seed));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| IdentityError::BadKeyFile { path: shown.clone() })?;
        let seed = decode_hex::<32>(text.trim()).map_err(|_| IdentityError::BadKeyFile { path: shown })?;
        Ok(Self::from_seed(seed))
    }

    /// Writes the key as 64 hex characters and a newline, readable by the owner only.
    /// Refuses to overwrite an existing file.
    pub fn save(&self, path: &Path) -> Result<(), IdentityError> {
        use std::io::Write;
        let shown = path.display().to_string();
        let io = |source| IdentityError::Io { path: shown.clone(), source };
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut file = opts.open(path).map_err(io)?;
        file.write_all(format!("{}\n", hex::encode(self.seed())).as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)
    }

    /// Loads the key file at `path`, or, when there is none, creates its
    /// folder and writes a fresh key there: readable by the owner only
    /// (0600 on unix), written to a temporary file, synced and renamed into
    /// place, so a crash never leaves a half-written key that a later start
    /// would refuse. An existing file that is not a key is an error (it is
    /// never replaced: it may be the only copy of an identity).
    pub fn load_or_generate(path: &Path) -> Result<Self, IdentityError> {
        let shown = path.display().to_string();
        let io = |source| IdentityError::Io { path: shown.clone(), source };
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Self::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
        // A leftover from a crashed start of this same process id: `save`
        // creates its file new, so clear the way.
        let _ = std::fs::remove_file(&tmp);
        let key = Self::generate();
        key.save(&tmp)?;
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        // The rename itself is durable only once the folder is synced.
        #[cfg(unix)]
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        Ok(key)
    }
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keypair({})", self.public())
    }
}

/// An ed25519 public key: the identity of a miner, validator, trainer or coordinator.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Verifies `sig` over `msg` under `domain`, rejecting weak keys and
    /// non-canonical signatures (`verify_strict`).
    pub fn verify(&self, domain: &str, msg: &[u8], sig: &Signature) -> Result<(), IdentityError> {
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| IdentityError::InvalidPublicKey)?;
        let sig = ed25519_dalek::Signature::from_bytes(&sig.0);
        key.verify_strict(&domain_message(domain, msg), &sig).map_err(|_| IdentityError::BadSignature)
    }

    /// The first 8 hex characters, for logs.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.short())
    }
}

impl FromStr for PublicKey {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        decode_hex::<32>(s.trim()).map(Self)
    }
}

/// An ed25519 signature (64 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature(#[serde(with = "sig_bytes")] pub [u8; 64]);

impl Signature {
    /// The raw 64 bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", hex::encode(&self.0[..4]))
    }
}

impl FromStr for Signature {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        decode_hex::<64>(s.trim()).map(Self)
    }
}

/// Decodes exactly `N` bytes of hex.
pub fn decode_hex<const N: usize>(s: &str) -> Result<[u8; N], IdentityError> {
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|_| IdentityError::BadHex { expected: N })?;
    Ok(out)
}

/// serde for `[u8; 64]` (serde derives arrays only up to 32).
mod sig_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8; 64], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 64], D::Error> {
        let bytes: &[u8] = <&[u8]>::deserialize(d)?;
        <[u8; 64]>::try_from(bytes).map_err(|_| serde::de::Error::invalid_length(bytes.len(), &"64 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_domain_separation() {
        let k = Keypair::from_seed([7; 32]);
        let sig = k.sign(domain::ROLLOUT, b"hello");
        k.public().verify(domain::ROLLOUT, b"hello", &sig).unwrap();
        assert!(k.public().verify(domain::VERDICT, b"hello", &sig).is_err());
        assert!(k.public().verify(domain::ROLLOUT, b"hellp", &sig).is_err());
        let other = Keypair::from_seed([8; 32]);
        assert!(other.public().verify(domain::ROLLOUT, b"hello", &sig).is_err());
    }

    #[test]
    fn hex_round_trip() {
        let k = Keypair::from_seed([1; 32]);
        let p: PublicKey = k.public().to_string().parse().unwrap();
        assert_eq!(p, k.public());
        let s = k.sign(domain::HANDSHAKE, b"x");
        assert_eq!(s.to_string().parse::<Signature>().unwrap(), s);
        assert!("abc".parse::<PublicKey>().is_err());
    }

    #[test]
    fn key_file_round_trip_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("miner.key");
        let k = Keypair::generate();
        k.save(&path).unwrap();
        assert!(k.save(&path).is_err(), "must not overwrite");
        assert_eq!(Keypair::load(&path).unwrap().public(), k.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let raw = dir.path().join("raw.key");
        std::fs::write(&raw, [9u8; 32]).unwrap();
        assert_eq!(Keypair::load(&raw).unwrap().public(), Keypair::from_seed([9; 32]).public());
        let bad = dir.path().join("bad.key");
        std::fs::write(&bad, b"not a key").unwrap();
        assert!(matches!(Keypair::load(&bad), Err(IdentityError::BadKeyFile { .. })));
    }

    #[test]
    fn load_or_generate_creates_once_then_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("data").join("validator.key");
        let k = Keypair::load_or_generate(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(Keypair::load_or_generate(&path).unwrap().public(), k.public());
        assert_eq!(Keypair::load(&path).unwrap().public(), k.public());
        // Only the key file is left in its folder (no temporary file).
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("validator.key")]);
        let bad = dir.path().join("bad.key");
        std::fs::write(&bad, b"not a key").unwrap();
        assert!(matches!(Keypair::load_or_generate(&bad), Err(IdentityError::BadKeyFile { .. })));
        assert_eq!(std::fs::read(&bad).unwrap(), b"not a key", "a bad key file is never replaced");
    }

    #[test]
    fn signature_serde_round_trip() {
        let s = Keypair::from_seed([3; 32]).sign(domain::WEIGHTS, b"w");
        let bytes = postcard::to_stdvec(&s).unwrap();
        assert_eq!(postcard::from_bytes::<Signature>(&bytes).unwrap(), s);
        assert!(postcard::from_bytes::<Signature>(&bytes[..10]).is_err());
    }
}
