//! The coop crate's integration tests as one test binary, one module per suite.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod common;
mod failures;
mod handle_processes;
mod processes;
mod props;
mod schemes;
mod service;
mod table2;
