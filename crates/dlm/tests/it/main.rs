//! The dlm crate's integration tests as one test binary, one module per suite.
//! `bench.rs` stays a binary of its own (the benchmark code is moving to
//! the bench crate).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

// Shared with `bench.rs`, a binary of its own.
#[path = "../common/mod.rs"]
mod common;
mod explorer;
mod model_check;
mod model_check_rehome;
mod model_check_srsl;
mod recovery;
mod rehome;
mod rehome_srsl;
mod runtime;
