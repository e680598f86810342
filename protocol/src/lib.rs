//! Tributary's protocol: every rule that two roles must compute identically,
//! and nothing else. Pure functions and plain types; no async runtime, no
//! sockets. Anything here that decodes bytes from the network or from disk
//! returns a typed error on bad input and never panics.
#![deny(missing_docs)]

pub mod assign;
pub mod beacon;
pub mod chat;
pub mod checkpoint;
pub mod delta;
pub mod dev;
pub mod domain;
pub mod env;
pub mod gguf;
pub mod identity;
pub mod offline;
pub mod prf;
pub mod quant;
pub mod rollout;
pub mod sampling;
pub mod sketch;
pub mod tiny;
pub mod tokenizer;
pub mod verify;
pub mod window;
pub mod wire;
