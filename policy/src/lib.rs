//! The libtorch (`tch`) reference model shared by the validator and the trainer.
