//! Tributary trainer: GRPO on verified rollouts, publishes BF16 checkpoints as sparse deltas.
//!
//! - [`grpo`]: the objective (GSPO ratio, asymmetric clip, δ cap, DAPO
//!   token normalisation, entropy bonus, optional KL);
//! - [`select`]: which rollouts may reach a gradient, and GFPO-style ranking;
//! - [`proof`]: the trainer's own proof of every rollout before training;
//! - [`train`]: the training step (FP32 master weights, AdamW) and BF16
//!   checkpoint export;
//! - [`state`]: durable trainer state (weights, optimiser, step, publications);
//! - [`publish`]: signed full/delta publications, one per window;
//! - [`service`]: `trainer run`, the network service;
//! - [`hf`]: Hugging Face export.
#![deny(missing_docs)]

pub mod grpo;
pub mod hf;
pub mod proof;
pub mod publish;
pub mod select;
pub mod service;
pub mod state;
pub mod train;
pub mod transplant;
