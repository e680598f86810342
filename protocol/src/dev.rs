//! The `--dev` network: the settings every role of a `--dev` network must
//! agree on without configuration — the role keys and the genesis model.
//!
//! All of it is public knowledge: a `--dev` network has no secrets, and its
//! keys must never be used elsewhere.

use std::path::{Path, PathBuf};

use crate::checkpoint::{Checkpoint, CheckpointError, ContentId};
use crate::identity::Keypair;
use crate::wire::Role;

/// Seed of the tiny random model that is a `--dev` network's genesis
/// checkpoint; every role generates the same file, so all agree on its
/// content id.
pub const TINY_SEED: u64 = 0;

/// The well-known key of `role` in a `--dev` network ([`Role::dev_key`]).
pub fn key(role: Role) -> Keypair {
    role.dev_key()
}

/// File name of the `--dev` genesis model.
pub fn genesis_file_name() -> String {
    format!("dev-tiny-{TINY_SEED}.gguf")
}

/// The `--dev` genesis model's bytes (deterministic), with the tokenizer of
/// `tokenizer_source` (the SmolLM2 file).
pub fn genesis_bytes(tokenizer_source: &Checkpoint) -> Result<Vec<u8>, CheckpointError> {
    crate::tiny::tiny_checkpoint_bytes(TINY_SEED, tokenizer_source)
}

/// The `--dev` genesis model in `dir`, written once from `tokenizer_source`
/// (the path of the SmolLM2 file); returns its path.
pub fn ensure_genesis(dir: &Path, tokenizer_source: &Path) -> Result<PathBuf, CheckpointError> {
    let io = |source| CheckpointError::Io { path: dir.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let path = dir.join(genesis_file_name());
    if !path.exists() {
        let src = Checkpoint::open(tokenizer_source)?;
        let _: ContentId = crate::tiny::write_tiny(TINY_SEED, &src, &path)?;
    }
    Ok(path)
}
