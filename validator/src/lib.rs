//! Tributary validator: re-runs the reference model to prove rollouts.
//!
//! - [`judge`]: the judgement of rollouts, pure but for the reference
//!   model: one pipeline for both commands below.
//! - [`check`]: `validator check`, every model check offline on a miner's
//!   JSONL file (the seed stands in for the coordinator's randomness).
//! - [`models`]: the folder of downloaded checkpoints, pruned to the few
//!   rollouts may still name.
//! - [`service`]: `validator run`, the checks as a service against a
//!   coordinator (fetch, prove, post signed verdicts).
#![deny(missing_docs)]

pub mod check;
pub mod judge;
pub mod models;
pub mod service;
