//! The ddss crate's integration tests as one test binary, one module per suite;
//! their fixtures are `tierstack_testkit::ddss`.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod histories;
mod ipc;
mod substrate;
