//! The proxy's integration tests as one test binary, one module per suite.
//! `streaming.rs` stays a binary of its own: it measures this process's peak
//! memory, which other tests beside it would raise.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod access_log;
mod bad_input;
mod balance;
mod limits;
mod next_upstream;
mod rfc9111;
mod site;
mod upstream_http2;
