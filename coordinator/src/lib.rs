//! Tributary coordinator: window clock, assignment, durable ingestion, weights, checkpoint relay.
//!
//! # Layout
//! - [`core`]: the sans-IO state machine (windows, admission, verdicts, weights, bans).

pub mod core;
