//! Tributary coordinator: window clock, assignment, durable ingestion, weights, checkpoint relay.
//!
//! # Layout
//! - [`core`]: the sans-IO state machine (windows, admission, verdicts, weights, bans).
//! - [`bans`]: bans need evidence (confirmation, refutation, flagged validators, the model-free re-check).
//! - [`admin`]: operator commands on a stopped coordinator (ban, unban, window length, inspect).
//! - `testing` (feature `test-utils`): test scaffolding the coordinator's tests share.

pub mod archive;
pub mod bans;
pub mod config;
pub mod core;
pub use tributary_net as net;
pub mod admin;
pub mod dashboard;
pub mod http;
pub mod node;
pub mod relay;
pub mod server;
pub mod sim;
pub mod store;
#[cfg(any(test, feature = "test-utils"))]
pub mod testing;
pub mod upkeep;
pub mod weights;
