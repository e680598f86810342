//! Tributary validator: re-runs the reference model to prove rollouts.
