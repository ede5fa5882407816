//! Test support for the whole workspace, used only as a dev-dependency:
//! nothing builds on it normally (the layering test checks that), so it may
//! depend on any crate below the binary without shaping the product.
//!
//! One home for what the tests used to copy:
//!
//! - [`child::ChildProcess`]: a child process with its standard output read
//!   line by line on a thread, every wait bounded by a deadline, standard
//!   error captured on request, SIGSTOP/SIGCONT/SIGKILL, and kill on drop
//!   (after SIGCONT, so a stopped child cannot outlive its test). It drives
//!   both `tierstack` subcommands and a test binary re-run on one of its own
//!   tests ([`child::reentry`]).
//! - [`exe!`]: the `tierstack` binary's path. `CARGO_BIN_EXE_tierstack`
//!   exists only while compiling the tierstack crate's integration tests,
//!   so the macro expands `env!` there, at the call site.
//! - [`nodes`]: sets of fabric nodes in one process, per backend (`shm`
//!   under a fresh directory, `tcp` and `ucx` on loopback).
//! - [`ddss`]: DDSS substrates in one process over a local cluster.
//! - [`http`]: a hand-written HTTP/1.1 client for the end-to-end tests.
//! - [`tls`]: a test certificate authority issuing server certificates
//!   (written to PEM files, the key 0600) and a TLS client that trusts it.
//! - [`metrics`]: a `/metrics` exposition checked as Prometheus takes it.
//! - [`test_seed`]: a randomized test's seed, replayable with
//!   `TIERSTACK_TEST_SEED`.
//! - [`args`]: a tier's flag struct parsed as the binary flattens it (the
//!   round-trip tests of every `to_args`).
//! - [`channels`], [`transfers`] and [`rights`]: the backend-neutral conformance
//!   scenarios, written once against the `Fabric` trait and run by every
//!   backend's tests, so all backends are held to the same observable rules.
//!
//! Failing is this crate's job: its helpers panic with a message that says
//! what was awaited, which is how a test reports; hence `unwrap` and
//! `expect` are allowed here as they are in tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod args;
pub mod channels;
pub mod child;
pub mod ddss;
pub mod http;
pub mod metrics;
pub mod nodes;
pub mod rights;
pub mod tls;
pub mod transfers;

/// The `tierstack` binary's path, for the tierstack crate's integration
/// tests (the only place where cargo sets `CARGO_BIN_EXE_tierstack`).
#[macro_export]
macro_rules! exe {
    () => {
        ::std::path::PathBuf::from(env!("CARGO_BIN_EXE_tierstack"))
    };
}

/// The seed of a randomized test: `TIERSTACK_TEST_SEED` when set (to replay
/// a run), a fresh one otherwise. The caller prints it, with how to replay.
pub fn test_seed() -> u64 {
    std::env::var("TIERSTACK_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(tierstack_base::fresh_seed)
}
