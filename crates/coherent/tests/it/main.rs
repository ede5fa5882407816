//! The coherent crate's integration tests as one test binary, one module per suite.

mod deps;
mod module;
mod table1;
mod version_table;
