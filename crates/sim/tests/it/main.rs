//! The sim crate's integration tests as one test binary, one module per suite.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod balance;
mod common;
mod coop;
mod counts;
mod hand_computed;
mod load_rules;
mod press;
