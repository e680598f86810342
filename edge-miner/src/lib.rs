//! The Tributary edge miner.
