#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.
mod auth;
mod channels;
mod common;
mod lifecycle;
mod processes;
mod transfers;
