//! The Tributary edge miner: generates rollouts with llama.cpp (logits,
//! seeded sampling and a hidden-state sketch at every position from one
//! decode) and, through the uplink, streams them to the coordinator.
//!
//! - [`backend`]: the engine-independent interface ([`backend::Backend`]);
//! - [`llama`]: the llama.cpp implementation;
//! - [`offline`]: `edge-miner generate` (tasks → groups → JSONL records);
//! - [`quantize`]: llama.cpp's quantizer on GGUF files;
//! - [`uplink`], [`sync`], [`run`]: `edge-miner run` (stream rollouts, fetch
//!   and swap checkpoints, the mining loop);
//! - `wgpu` (feature `wgpu`): the second backend, the forward pass in WGSL
//!   compute shaders.

pub mod backend;
pub mod llama;
pub mod offline;
pub mod quantize;
pub mod run;
pub mod sync;
pub mod uplink;
#[cfg(feature = "wgpu")]
pub mod wgpu;
