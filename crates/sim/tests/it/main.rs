//! The sim crate's integration tests as one test binary, one module per suite.

mod common;
mod coop;
mod counts;
mod hand_computed;
mod load_rules;
mod press;
