//! The loopback network helpers now live in the crate's library (the mesh factory).
#![allow(unused_imports)]

pub use tributary_tests::*;
