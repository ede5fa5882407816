//! The coherent crate's integration tests as one test binary, one module per suite.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod deps;
mod module;
mod module_socket;
mod publish;
mod publish_model;
mod table1;
mod version_table;
