//! Tributary validator: re-runs the reference model to prove rollouts.
//!
//! - [`check`]: `validator check`, every model check offline on a miner's
//!   JSONL file (the seed stands in for the coordinator's randomness).
#![deny(missing_docs)]

pub mod check;
