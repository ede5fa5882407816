//! What a run is asked to do: [`LoadConfig`] (with [`OpenLoop`]), its
//! limits and defaults, and [`Plan`], the configuration checked and its URLs
//! parsed before anything starts.

use crate::arrival::Arrivals;
use crate::http::Endpoint;
use crate::LoadError;
use tierstack_workload::{TargetChoice, Trace};

/// Default concurrent connections (closed loop) or request streams (open loop).
pub const CONNECTIONS_DEFAULT: usize = 16;
/// Most concurrent connections (or streams).
pub const CONNECTIONS_MAX: usize = 4096;
/// Most targets.
pub const TARGETS_MAX: usize = 4096;
/// The paper's update rate: one update per second.
pub const UPDATE_INTERVAL_MS_DEFAULT: u64 = 1000;
/// Default per-request timeout.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default cap on kept response records (64 bytes each).
pub const RECORDS_MAX_DEFAULT: usize = 2_000_000;
/// Reconnect back-off after a failed connect: starts here, doubles …
pub const CONNECT_BACKOFF_MS_MIN: u64 = 5;
/// … up to here.
pub const CONNECT_BACKOFF_MS_MAX: u64 = 500;
/// Open loop: default bound on requests in flight.
pub const MAX_IN_FLIGHT_DEFAULT: usize = 1024;
/// Open loop: largest accepted bound on requests in flight (each may hold a
/// socket).
pub const MAX_IN_FLIGHT_MAX: usize = 65_536;
/// Open loop: largest accepted rate, requests per second.
pub const RATE_RPS_MAX: f64 = 10_000_000.0;

/// An open loop: requests dispatched at scheduled times
/// ([`crate::arrival`]), whatever the state of earlier ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenLoop {
    /// Requests per second over the whole client.
    pub rate_rps: f64,
    pub arrivals: Arrivals,
    /// A request due while this many are in flight is not sent; it ends at
    /// once as an `over_max_in_flight` error.
    pub max_in_flight: usize,
}

impl OpenLoop {
    /// Poisson arrivals at `rate_rps`, at most [`MAX_IN_FLIGHT_DEFAULT`] in flight.
    pub fn new(rate_rps: f64) -> Self {
        Self { rate_rps, arrivals: Arrivals::default(), max_in_flight: MAX_IN_FLIGHT_DEFAULT }
    }
}

/// How to run a load. Build with [`LoadConfig::new`], then set fields.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Base URLs (`http://host:port`) to load (e.g. the three proxies of the
    /// paper's setup); `target_choice` says which one each request goes to.
    pub targets: Vec<String>,
    /// Where updates go (normally the application server, directly);
    /// `None` = `targets[0]`.
    pub update_target: Option<String>,
    /// The documents and request stream.
    pub trace: Trace,
    /// Closed loop: concurrent workers, one request in flight each. Open
    /// loop: request streams, dealt to scheduled requests in turn. Either
    /// way worker (stream) `w` of `W` takes its documents from
    /// `trace.stream(seed, w, W)` and its targets from
    /// `TargetChooser::new(target_choice, targets.len(), seed, w)`, one
    /// `next()` of each per request.
    pub connections: usize,
    /// Stop after this long …
    pub duration_ms: Option<u64>,
    /// … or after this many requests were issued (whichever comes first;
    /// at least one of the two must be set).
    pub requests_max: Option<u64>,
    /// One update every this many milliseconds; 0 disables updates.
    pub update_interval_ms: u64,
    /// Seeds the request streams, the target choices, the arrivals and the
    /// updater's choices.
    pub seed: u64,
    /// A request (or update) without a complete response by then fails.
    pub request_timeout_ms: u64,
    /// Keep every response and update in [`LoadReport::records`].
    pub keep_records: bool,
    /// Cap on kept responses; the rest are checked and counted, not kept.
    pub records_max: usize,
    /// Verify self-checking bodies ([`crate::body`]) and that each header
    /// names the requested document's key. On for tierstack's own
    /// application server; off (the default) for other HTTP services, which
    /// need only emit the header.
    pub check_bodies: bool,
    /// Which target each request goes to (default: worker `w` always uses
    /// target `w % targets`).
    pub target_choice: TargetChoice,
    /// Open a new TCP connection for every request and close it after the
    /// response (PRESS: "all requests in the traces require a new TCP
    /// connection"). Otherwise connections are persistent: a closed-loop
    /// worker keeps at most one per target, the open loop keeps a pool of
    /// idle ones per target.
    pub new_connection_per_request: bool,
    /// `Some`: an open loop at a rate; `None` (default): the closed loop.
    pub open_loop: Option<OpenLoop>,
    /// The targets serve static content without `X-Tierstack-Deps` (e.g.
    /// `tierstack origin`, for the cooperative-caching and PRESS
    /// experiments): a 2xx without the header counts as checked (there is
    /// nothing to be stale against) instead of as `missing_deps`. A header,
    /// when present, is still checked. Needs `update_interval_ms = 0`.
    pub static_content: bool,
}

impl LoadConfig {
    /// One target, the paper's defaults: 16 connections, 20 s, one update
    /// per second sent to the same target, records off, closed loop, fixed
    /// targets, persistent connections.
    pub fn new(target: impl Into<String>, trace: Trace) -> Self {
        Self {
            targets: vec![target.into()],
            update_target: None,
            trace,
            connections: CONNECTIONS_DEFAULT,
            duration_ms: Some(20_000),
            requests_max: None,
            update_interval_ms: UPDATE_INTERVAL_MS_DEFAULT,
            seed: 1,
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            keep_records: false,
            records_max: RECORDS_MAX_DEFAULT,
            check_bodies: false,
            target_choice: TargetChoice::Fixed,
            new_connection_per_request: false,
            open_loop: None,
            static_content: false,
        }
    }
}

/// Parsed and checked configuration.
pub(crate) struct Plan {
    pub(crate) targets: Vec<Endpoint>,
    pub(crate) update_target: Option<Endpoint>,
}

impl Plan {
    pub(crate) fn validate(config: &LoadConfig) -> Result<Self, LoadError> {
        let invalid = |what: &'static str| Err(LoadError::InvalidConfig(what));
        if config.targets.is_empty() || config.targets.len() > TARGETS_MAX {
            return invalid("targets: between 1 and TARGETS_MAX are needed");
        }
        if config.connections == 0 || config.connections > CONNECTIONS_MAX {
            return invalid("connections must be in 1..=CONNECTIONS_MAX");
        }
        if config.duration_ms.is_none() && config.requests_max.is_none() {
            return invalid("set duration_ms or requests_max");
        }
        if config.request_timeout_ms == 0 {
            return invalid("request_timeout_ms must be > 0");
        }
        if config.trace.documents().is_empty() {
            return invalid("the trace has no documents");
        }
        if config.static_content && config.update_interval_ms > 0 {
            return invalid("static content takes no updates: set update_interval_ms to 0");
        }
        if let Some(open) = &config.open_loop {
            if !(open.rate_rps > 0.0 && open.rate_rps <= RATE_RPS_MAX) {
                return invalid("the open loop's rate must be in (0, RATE_RPS_MAX] requests per second");
            }
            if open.max_in_flight == 0 || open.max_in_flight > MAX_IN_FLIGHT_MAX {
                return invalid("max_in_flight must be in 1..=MAX_IN_FLIGHT_MAX");
            }
        }
        let targets = config.targets.iter().map(|t| Endpoint::parse(t)).collect::<Result<Vec<_>, _>>()?;
        let update_target = match &config.update_target {
            Some(url) => Some(Endpoint::parse(url)?),
            None => targets.first().cloned(),
        };
        Ok(Self { targets, update_target })
    }
}
