//! Tributary trainer: GRPO on verified rollouts, publishes BF16 checkpoints as sparse deltas.
