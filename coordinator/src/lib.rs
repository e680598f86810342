//! Tributary coordinator: window clock, assignment, durable ingestion, weights, checkpoint relay.
//!
//! # Layout
//! - [`core`]: the sans-IO state machine (windows, admission, verdicts, weights, bans).
//! - [`bans`]: bans need evidence (confirmation, refutation, flagged validators, the model-free re-check).
//! - [`admin`]: operator commands on a stopped coordinator (ban, unban, window length, inspect).

pub mod archive;
pub mod bans;
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
pub mod weights;
