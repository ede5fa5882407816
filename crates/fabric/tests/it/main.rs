//! The fabric crate's integration tests as one test binary, one module per suite.
//! `loom_seqlock.rs` stays a binary of its own: it is built and run only
//! under `--cfg tierstack_loom` (`.ci/run`).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod memory;
mod seqlock_records;
mod seqlock_words;
mod transfers;
