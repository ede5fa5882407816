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
//! It also issues load the way the cooperative-caching and PRESS
//! experiments assume (seed-notes §0 item 5):
//!
//! - **Target choice** per request ([`LoadConfig::target_choice`]): fixed,
//!   round-robin or uniformly random, by the rule
//!   [`tierstack_workload::TargetChooser`] that the simulator shares. Worker
//!   (or open-loop stream) `w` of `W` takes, per request, exactly one
//!   `next()` of `trace.stream(seed, w, W)` and one of
//!   `TargetChooser::new(choice, targets, seed, w)`, whatever happens to the
//!   request afterwards.
//! - **A new connection per request** ([`LoadConfig::new_connection_per_request`]),
//!   closed after the response (`Connection: close`); otherwise persistent
//!   connections (a closed-loop worker keeps at most one per target; the
//!   open loop pools idle ones per target).
//! - **An open loop** ([`LoadConfig::open_loop`]): requests dispatched at
//!   the points of a seeded schedule ([`arrival`], shared with the simulator:
//!   constant or Poisson, and which stream and target each request takes), whatever the state of
//!   earlier ones, with latency measured from the scheduled time (no
//!   coordinated omission: a stall, or the client itself running late, is
//!   charged to every request due behind it). A request due while
//!   `max_in_flight` are in flight is not sent and ends as an
//!   `over_max_in_flight` error. A run with a duration dispatches exactly the
//!   points due before it ends.
//! - **Static content** ([`LoadConfig::static_content`]): against a target
//!   without the dependency header (`tierstack origin`), a 2xx is not an
//!   error.
//!
//! The report counts requests and connections per target
//! ([`LoadReport::per_target`]).
//!
//! Main types: [`LoadConfig`] → [`run`] / [`run_with`] → [`LoadReport`]
//! (throughput, latency p50/p99, hit rate, errors by kind, updates, stale
//! responses, a per-second series, and optionally every record,
//! [`record::RecordLog`], writable as JSON Lines). The pure parts —
//! [`deps`] (the `X-Tierstack-Deps` header of docs/coherence-protocol.md),
//! [`staleness`] (offline and online checkers) — do no I/O; latency
//! statistics are `tierstack_stats`'s. [`console`] is the command line's
//! run: stopped by Ctrl-C, with a progress line.
//!
//! Each connection is hyper's low-level `client::conn::http1` over its own
//! `TcpStream`, re-opened after any error (in the closed loop with a bounded
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
//! `requests == checked_ok + errors.total()`, and once under its target. A
//! failed connect counts as one failed request; a connection the server
//! closed while idle is reopened without losing a request; requests in
//! flight when the run is stopped are abandoned, not counted in `requests`
//! but in [`LoadReport::abandoned`], so `issued == requests + abandoned`
//! ([`LoadReport::accounted`] checks all of these).

pub mod body;
mod client;
mod config;
pub mod console;
pub mod deps;
mod http;
mod loops;
pub mod record;
mod report;
mod run;
pub mod staleness;
mod tally;
mod updater;

pub use config::{
    LoadConfig, OpenLoop, CONNECTIONS_DEFAULT, CONNECTIONS_MAX, CONNECT_BACKOFF_MS_MAX, CONNECT_BACKOFF_MS_MIN,
    MAX_IN_FLIGHT_DEFAULT, MAX_IN_FLIGHT_MAX, RATE_RPS_MAX, RECORDS_MAX_DEFAULT, REQUEST_TIMEOUT_MS_DEFAULT,
    TARGETS_MAX, UPDATE_INTERVAL_MS_DEFAULT,
};
pub use http::Endpoint;
pub use report::{
    ErrorCounts, IncarnationSeen, LoadReport, LoadShape, OpenLoopSummary, SecondPoint, StaleExample, TargetCounts,
    UpdateSummary,
};
pub use run::{run, run_with};
pub use tally::{LiveSnapshot, LiveStats};
/// The open loop's schedule: `tierstack_workload::arrival`, the rule this
/// client shares with the simulator, re-exported here as part of this API.
pub use tierstack_workload::arrival;
pub use tierstack_workload::arrival::{ArrivalSchedule, Arrivals};
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
