//! The Tributary edge miner: generates rollouts with llama.cpp (logits,
//! seeded sampling and a hidden-state sketch at every position from one
//! decode) and, through the uplink, streams them to the coordinator.
//!
//! - [`backend`]: the engine-independent interface ([`backend::Backend`]);
//! - [`llama`]: the llama.cpp implementation;
//! - [`schedule`]: the generation schedule every backend follows (prefill,
//!   KV copy, batched decode, sketches and seeded draws), written once;
//! - [`offline`]: `edge-miner generate` (tasks → groups → JSONL records);
//! - [`quantize`]: llama.cpp's quantizer on GGUF files;
//! - [`uplink`], [`sync`], [`run`]: `edge-miner run` (stream rollouts, fetch
//!   and swap checkpoints, the mining loop); [`store_http`]: checkpoints and
//!   deltas over HTTP(S) from the object store, the relay as the fallback;
//! - [`doctor`]: `edge-miner doctor` (everything a miner needs, checked);
//! - `adversary` (feature `adversary`): the miner with one attack switched
//!   on (`edge-miner run --attack NAME`), for the validator's tests;
//! - `wgpu` (feature `wgpu`): the second backend, the forward pass in WGSL
//!   compute shaders.

#[cfg(feature = "adversary")]
pub mod adversary;
pub mod backend;
pub mod doctor;
pub mod llama;
pub mod offline;
pub mod quantize;
pub mod run;
pub mod schedule;
pub mod store_http;
pub mod sync;
pub mod uplink;
#[cfg(feature = "wgpu")]
pub mod wgpu;
