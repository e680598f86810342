//! Tributary coordinator: window clock, assignment, durable ingestion, weights, checkpoint relay.
