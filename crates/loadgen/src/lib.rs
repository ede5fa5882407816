//! The load client, the updater and the staleness checker.
//!
//! This crate owns the client side of strongly coherent caching's
//! experiments (coherency paper §5.2): `C` closed-loop HTTP/1.1
//! connections replaying a [`tierstack_workload::Trace`] against one or more
//! targets (proxies, or the application server directly), an **updater**
//! that changes a random document every `update_interval_ms` (one per
//! second by default, as in the paper), and an **online staleness checker**
//! that proves no response was older than an update that had completed
//! before the request began.
//!
//! Main types: [`LoadConfig`] → [`run`] / [`run_with`] → [`LoadReport`]
//! (throughput, latency p50/p99, hit rate, errors by kind, updates, stale
//! responses, a per-second series, and optionally every record,
//! [`record::RecordLog`], writable as JSON Lines). The pure parts —
//! [`deps`] (the `X-Tierstack-Deps` header of docs/coherence-protocol.md),
//! [`staleness`] (offline and online checkers), [`stats`] — do no I/O.
//!
//! Each connection is hyper's low-level `client::conn::http1` over its own
//! `TcpStream`, persistent, re-opened after any error (with a bounded
//! back-off after failed connects). Times are nanoseconds of one monotonic
//! clock (`tierstack_base::SystemClock`) shared by the workers and the
//! updater, so response start times and update completion times compare.
//!
//! Key design choice: staleness is checked **online**, as responses arrive,
//! so a run of any length needs memory only for its updates (one per
//! second) and the few responses deferred behind an update in flight; the
//! full record log is optional and capped. Arrival order is not trusted:
//! updates are registered before they are sent and responses that might be
//! affected wait for the outcome (see [`staleness`]). When the full log is
//! kept, the offline checker recounts it as a cross-check
//! ([`LoadReport::stale_responses_offline`]).
//!
//! Bad input never panics: a 2xx without the header counts as
//! `missing_deps`, a header that breaks the contract as `malformed_deps`,
//! transport failures as `connect`/`io`/`timeout`, statuses by class.
//! With [`LoadConfig::check_bodies`] (for tierstack's own application
//! server, whose bodies are self-checking: [`body`]), a header not naming
//! the requested document's key counts as `deps_wrong_key` and a body that
//! disagrees with the header as `body_mismatch`.
//!
//! **Strict accounting**: every request that ends is counted exactly once,
//! as a checked 2xx ([`LoadReport::checked_ok`], of which
//! [`LoadReport::stale_responses`] were stale) or as one error category, so
//! `requests == checked_ok + errors.total()`. A failed connect counts as
//! one failed request; a connection the server closed while idle is
//! reopened without losing a request; requests in flight when the run is
//! stopped are abandoned and not counted.

pub mod arrival;
pub mod body;
pub mod deps;
mod http;
pub mod record;
mod report;
mod run;
pub mod staleness;
pub mod stats;

pub use arrival::{ArrivalSchedule, Arrivals};
pub use http::Endpoint;
pub use report::{
    ErrorCounts, IncarnationSeen, LoadReport, LoadShape, OpenLoopSummary, SecondPoint, StaleExample, TargetCounts,
    UpdateSummary,
};
pub use run::{
    run, run_with, LiveSnapshot, LiveStats, LoadConfig, OpenLoop, CONNECTIONS_DEFAULT, CONNECTIONS_MAX,
    CONNECT_BACKOFF_MS_MAX, CONNECT_BACKOFF_MS_MIN, MAX_IN_FLIGHT_DEFAULT, MAX_IN_FLIGHT_MAX, RATE_RPS_MAX,
    RECORDS_MAX_DEFAULT, REQUEST_TIMEOUT_MS_DEFAULT, TARGETS_MAX, UPDATE_INTERVAL_MS_DEFAULT,
};
pub use tierstack_workload::{TargetChoice, TargetChooser};

/// Errors that stop a run before or instead of a report. Failures of
/// individual requests are counted in the report, not returned.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid load configuration: {0}")]
    InvalidConfig(&'static str),
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("the {0} task failed")]
    TaskFailed(&'static str),
}
