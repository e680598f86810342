//! Set-up shared by the edge-miner integration tests.

use std::path::{Path, PathBuf};

use tributary_assets as assets;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::tiny;

/// The project's tiny random llama model of `seed` (SmolLM2's tokenizer),
/// written into `dir`; returns its path.
pub(crate) fn write_tiny(dir: &Path, seed: u64) -> PathBuf {
    let path = dir.join(format!("tiny-{seed}.gguf"));
    let source = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 file");
    tiny::write_tiny(seed, &source, &path).expect("write tiny model");
    path
}
