//! The run: closed-loop workers or the open-loop dispatcher, the updater,
//! the online checker, the report.

use crate::arrival::{stream_of, ArrivalSchedule, Arrivals};
use crate::body::{self, BodyCheckError};
use crate::deps;
use crate::http::{Connection, Endpoint, Exchange};
use crate::record::{CacheStatus, Deps, DepsState, KeyTable, RecordLog, ResponseRecord, Stamp, UpdateRecord};
use crate::report::{
    ErrorCounts, IncarnationSeen, LoadReport, LoadShape, OpenLoopSummary, SecondPoint, StaleExample, TargetCounts,
    UpdateSummary,
};
use crate::staleness::{self, OnlineChecker};
use crate::LoadError;
use http::Method;
use rand::Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tierstack_base::{seeded_rng, Clock, SystemClock};
use tierstack_stats::{percentile, Histogram};
use tierstack_workload::{RequestStream, TargetChoice, TargetChooser, Trace};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

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
/// Salt separating the updater's random stream from the workers'.
const UPDATER_SEED_SALT: u64 = 0x7570_6461_7465_7221; // "updater!"
/// Most header/body check failures described in the report (all are counted).
const CHECK_ERROR_EXAMPLES_MAX: usize = 16;

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

/// Counters readable while a run is in progress (for progress displays).
#[derive(Debug, Default)]
pub struct LiveStats {
    pub requests: AtomicU64,
    pub ok: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub errors: AtomicU64,
    pub updates: AtomicU64,
    pub stale: AtomicU64,
}

/// A copy of [`LiveStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveSnapshot {
    pub requests: u64,
    pub ok: u64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub updates: u64,
    pub stale: u64,
}

impl LiveStats {
    pub fn snapshot(&self) -> LiveSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LiveSnapshot {
            requests: g(&self.requests),
            ok: g(&self.ok),
            hits: g(&self.hits),
            misses: g(&self.misses),
            errors: g(&self.errors),
            updates: g(&self.updates),
            stale: g(&self.stale),
        }
    }
}

/// Runs a load to completion (duration or request count).
pub async fn run(config: LoadConfig) -> Result<LoadReport, LoadError> {
    run_with(config, Arc::new(LiveStats::default()), std::future::pending()).await
}

/// Runs a load, publishing progress to `live`, and stopping early when
/// `shutdown` completes (e.g. on Ctrl-C). Requests in flight at the stop are
/// abandoned and not counted (see [`LoadReport::abandoned`]); an update in
/// flight is finished.
pub async fn run_with<F>(config: LoadConfig, live: Arc<LiveStats>, shutdown: F) -> Result<LoadReport, LoadError>
where
    F: Future<Output = ()> + Send,
{
    let plan = Plan::validate(&config)?;
    let clock = SystemClock;
    // The open loop keeps its schedule on `started` and measures latencies
    // from `run_start_ns`; reading the clock first keeps every request's
    // send time at or after its scheduled time on both.
    let run_start_ns = clock.now_ns();
    let started = Instant::now();
    let shared = Arc::new(Shared {
        state: Mutex::new(CheckState::default()),
        live,
        records_taken: AtomicU64::new(0),
        budget_used: AtomicU64::new(0),
        run_start_ns,
    });
    // `stop` ends the requests in flight (deadline or shutdown); `halt` only
    // stops the open loop's dispatching early (shutdown), so that a run with a
    // duration dispatches exactly the points scheduled before its deadline.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (halt_tx, halt_rx) = watch::channel(false);
    let client = Arc::new(Client::new(&config, &plan, shared.clone()));

    let mut load = match config.open_loop {
        None => tokio::spawn(closed_loop(client.clone(), stop_rx.clone())),
        Some(open) => {
            let driver = OpenLoopDriver { client: client.clone(), open, started, stop: stop_rx.clone(), halt: halt_rx };
            tokio::spawn(driver.run())
        }
    };
    let updater = match &plan.update_target {
        Some(endpoint) if config.update_interval_ms > 0 && !config.trace.documents().is_empty() => {
            let u = Updater {
                endpoint: endpoint.clone(),
                trace: config.trace.clone(),
                shared: shared.clone(),
                stop: stop_rx.clone(),
                interval: Duration::from_millis(config.update_interval_ms),
                timeout: Duration::from_millis(config.request_timeout_ms),
                seed: config.seed ^ UPDATER_SEED_SALT,
            };
            Some(tokio::spawn(u.run()))
        }
        _ => None,
    };

    // Stop at the deadline or on shutdown, whichever comes first; the load
    // also ends by itself when the request budget is spent.
    let deadline = config.duration_ms.map(|ms| started + Duration::from_millis(ms));
    tokio::pin!(shutdown);
    let stop_timer = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop_timer);
    let joined = tokio::select! {
        joined = &mut load => joined,
        _ = &mut stop_timer => { let _ = stop_tx.send(true); (&mut load).await }
        _ = &mut shutdown => {
            let _ = halt_tx.send(true);
            let _ = stop_tx.send(true);
            (&mut load).await
        }
    };
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    let update_tally = match updater {
        Some(handle) => Some(handle.await.map_err(|_| LoadError::TaskFailed("updater"))?),
        None => None,
    };
    let total = joined.map_err(|_| LoadError::TaskFailed("load"))??;
    Ok(assemble(&config, &plan, &shared, total, update_tally, elapsed))
}

/// Parsed and checked configuration.
struct Plan {
    targets: Vec<Endpoint>,
    update_target: Option<Endpoint>,
}

impl Plan {
    fn validate(config: &LoadConfig) -> Result<Self, LoadError> {
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

/// State every task shares.
struct Shared {
    state: Mutex<CheckState>,
    live: Arc<LiveStats>,
    records_taken: AtomicU64,
    /// Requests taken from `requests_max` by the closed-loop workers.
    budget_used: AtomicU64,
    run_start_ns: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, CheckState> {
        // A poisoned lock means a task panicked while checking; the data is
        // still consistent enough to report, so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn second_of(&self, end_ns: u64) -> usize {
        (end_ns.saturating_sub(self.run_start_ns) / 1_000_000_000) as usize
    }
}

#[derive(Default)]
struct CheckState {
    checker: OnlineChecker,
    keys: KeyTable,
    next_response: u64,
    updates: Vec<UpdateRecord>,
    /// Per (node, epoch): checked responses and completed updates.
    incarnations: BTreeMap<(u32, u32), (u64, u64)>,
}

impl CheckState {
    /// Keys are interned per module node; versions are stamped with the
    /// epoch of the header's incarnation (its rank by first sight, assigned
    /// here, under the lock, so it is one order for every task), which makes
    /// them comparable across module restarts (see [`crate::staleness`]).
    fn intern(&mut self, parsed: &deps::ParsedDeps<'_>) -> (u32, Deps) {
        let epoch = self.keys.epoch(parsed.node, parsed.incarnation);
        let pairs: Vec<_> = parsed
            .entries
            .iter()
            .map(|e| (self.keys.intern_at(parsed.node, e.key), Stamp::new(epoch, e.version)))
            .collect();
        (epoch, Deps::from_pairs(&pairs))
    }

    /// Checks a response whose header and body passed (the caller holds the lock).
    fn check_response(&mut self, doc: u32, start_ns: u64, parsed: &deps::ParsedDeps<'_>) -> Deps {
        let (epoch, deps) = self.intern(parsed);
        self.incarnations.entry((parsed.node, epoch)).or_default().0 += 1;
        let id = self.next_response;
        self.next_response += 1;
        self.checker.response(id, doc, start_ns, deps.clone());
        deps
    }

    /// Records an update that completed with `parsed` as its new versions.
    fn update_done(&mut self, parsed: &deps::ParsedDeps<'_>) -> Deps {
        let (epoch, deps) = self.intern(parsed);
        self.incarnations.entry((parsed.node, epoch)).or_default().1 += 1;
        deps
    }
}

/// Per-second counters.
#[derive(Clone, Copy, Default)]
struct SecondTally {
    ok: u64,
    hits: u64,
    misses: u64,
    errors: u64,
}

/// What one worker (or the whole open loop) saw.
#[derive(Default)]
struct WorkerTally {
    latency: Histogram,
    issued: u64,
    abandoned: u64,
    requests: u64,
    ok: u64,
    checked_ok: u64,
    bodies_checked: u64,
    bytes: u64,
    hits: u64,
    misses: u64,
    errors: ErrorCounts,
    /// Per target: requests that ended, and connections opened.
    target_requests: Vec<u64>,
    target_connections: Vec<u64>,
    max_dispatch_lag_ns: u64,
    check_error_examples: Vec<String>,
    seconds: Vec<SecondTally>,
    records: Vec<ResponseRecord>,
    records_dropped: u64,
}

/// Adds `n` to `counts[i]`, growing the vector as needed.
fn add_at(counts: &mut Vec<u64>, i: usize, n: u64) {
    if counts.len() <= i {
        counts.resize(i + 1, 0);
    }
    counts[i] += n;
}

/// Element-wise `a += b`.
fn add_all(a: &mut Vec<u64>, b: &[u64]) {
    for (i, &n) in b.iter().enumerate() {
        add_at(a, i, n);
    }
}

impl WorkerTally {
    fn second(&mut self, s: usize) -> &mut SecondTally {
        if self.seconds.len() <= s {
            self.seconds.resize(s + 1, SecondTally::default());
        }
        &mut self.seconds[s]
    }

    /// One request to `target` ended (a response or an error).
    fn ended(&mut self, target: usize) {
        self.requests += 1;
        add_at(&mut self.target_requests, target, 1);
    }

    fn merge(&mut self, o: WorkerTally) {
        self.latency.merge(&o.latency);
        self.issued += o.issued;
        self.abandoned += o.abandoned;
        self.requests += o.requests;
        self.ok += o.ok;
        self.checked_ok += o.checked_ok;
        self.bodies_checked += o.bodies_checked;
        add_all(&mut self.target_requests, &o.target_requests);
        add_all(&mut self.target_connections, &o.target_connections);
        self.max_dispatch_lag_ns = self.max_dispatch_lag_ns.max(o.max_dispatch_lag_ns);
        let room = CHECK_ERROR_EXAMPLES_MAX.saturating_sub(self.check_error_examples.len());
        self.check_error_examples.extend(o.check_error_examples.into_iter().take(room));
        self.bytes += o.bytes;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors.merge(&o.errors);
        if self.seconds.len() < o.seconds.len() {
            self.seconds.resize(o.seconds.len(), SecondTally::default());
        }
        for (a, b) in self.seconds.iter_mut().zip(&o.seconds) {
            a.ok += b.ok;
            a.hits += b.hits;
            a.misses += b.misses;
            a.errors += b.errors;
        }
        self.records.extend(o.records);
        self.records_dropped += o.records_dropped;
    }
}

/// Parses the dependency header of a 2xx.
fn classify_deps(raw: Option<&[u8]>) -> (DepsState, Option<deps::ParsedDeps<'_>>) {
    match raw {
        None => (DepsState::Missing, None),
        Some(bytes) => match std::str::from_utf8(bytes).ok().map(deps::parse) {
            Some(Ok(parsed)) => (DepsState::Ok, Some(parsed)),
            _ => (DepsState::Malformed, None),
        },
    }
}

/// One request: what it asks for, where, and who issued it.
#[derive(Clone, Copy, Debug)]
struct Request {
    doc: usize,
    target: usize,
    stream: usize,
    /// Its index in its stream.
    position: u64,
    /// Open loop: when it was due (its latency's origin).
    scheduled_ns: Option<u64>,
}

/// How an attempt ended.
enum Outcome {
    Response { sent_ns: u64, end_ns: u64, exchange: Exchange },
    ConnectFailed { at_ns: u64 },
    Io { at_ns: u64 },
    Timeout { at_ns: u64 },
}

/// One request's attempt: its outcome, and whether it opened a connection.
struct Attempt {
    outcome: Outcome,
    opened_connection: bool,
}

/// What every request needs, shared by the workers (or request tasks).
struct Client {
    config: LoadConfig,
    targets: Vec<Endpoint>,
    names: Vec<String>,
    paths: Vec<String>,
    shared: Arc<Shared>,
    timeout: Duration,
}

impl Client {
    fn new(config: &LoadConfig, plan: &Plan, shared: Arc<Shared>) -> Self {
        let documents = config.trace.documents();
        Self {
            config: config.clone(),
            targets: plan.targets.clone(),
            names: documents.iter().map(|d| d.name.clone()).collect(),
            paths: documents.iter().map(|d| d.path()).collect(),
            shared,
            timeout: Duration::from_millis(config.request_timeout_ms),
        }
    }

    /// Worker (stream) `w`'s documents and targets.
    fn streams(&self, w: usize) -> (RequestStream, TargetChooser) {
        let c = &self.config;
        (c.trace.stream(c.seed, w, c.connections), TargetChooser::new(c.target_choice, self.targets.len(), c.seed, w))
    }

    /// Opens a connection to `target` and waits until it takes requests.
    /// Returns it if ready, and whether a TCP connection opened at all.
    async fn connect(&self, target: usize) -> (Option<Connection>, bool) {
        let Some(endpoint) = self.targets.get(target) else { return (None, false) };
        let Ok(Ok(mut conn)) = tokio::time::timeout(self.timeout, Connection::open(endpoint)).await else {
            return (None, false);
        };
        let ready = tokio::time::timeout(self.timeout, conn.ready()).await;
        (matches!(ready, Ok(Ok(()))).then_some(conn), true)
    }

    /// Sends `request` on `conn` (one the server closed while idle is
    /// reopened: that loses no request) or on a new connection, and reads
    /// the response. Returns the connection when it may be reused.
    async fn attempt(&self, mut conn: Option<Connection>, request: &Request) -> (Attempt, Option<Connection>) {
        let clock = SystemClock;
        let last = self.config.new_connection_per_request;
        if let Some(c) = conn.as_mut() {
            if !matches!(tokio::time::timeout(self.timeout, c.ready()).await, Ok(Ok(()))) {
                conn = None;
            }
        }
        let (mut conn, opened_connection) = match conn {
            Some(c) => (c, false),
            None => match self.connect(request.target).await {
                (Some(c), opened) => (c, opened),
                (None, opened) => {
                    let outcome = Outcome::ConnectFailed { at_ns: clock.now_ns() };
                    return (Attempt { outcome, opened_connection: opened }, None);
                }
            },
        };
        let path = self.paths.get(request.doc).map_or("/", String::as_str);
        let sent_ns = clock.now_ns();
        let result =
            tokio::time::timeout(self.timeout, conn.exchange(Method::GET, path, self.config.check_bodies, last)).await;
        let end_ns = clock.now_ns();
        let (outcome, reusable) = match result {
            Ok(Ok(exchange)) => {
                let reusable = !(exchange.close || last);
                (Outcome::Response { sent_ns, end_ns, exchange }, reusable)
            }
            Ok(Err(_)) => (Outcome::Io { at_ns: end_ns }, false),
            Err(_elapsed) => (Outcome::Timeout { at_ns: end_ns }, false),
        };
        (Attempt { outcome, opened_connection }, reusable.then_some(conn))
    }

    /// Counts an attempt: exactly one request, under its target.
    fn settle(&self, tally: &mut WorkerTally, request: &Request, attempt: Attempt) {
        if attempt.opened_connection {
            add_at(&mut tally.target_connections, request.target, 1);
        }
        match attempt.outcome {
            Outcome::Response { sent_ns, end_ns, exchange } => self.record(tally, request, sent_ns, end_ns, exchange),
            Outcome::ConnectFailed { at_ns } => {
                tally.errors.connect += 1;
                self.error_at(tally, request.target, at_ns);
            }
            Outcome::Io { at_ns } => {
                tally.errors.io += 1;
                self.error_at(tally, request.target, at_ns);
            }
            Outcome::Timeout { at_ns } => {
                tally.errors.timeout += 1;
                self.error_at(tally, request.target, at_ns);
            }
        }
    }

    /// Counts an ended request that failed (already put in its error
    /// category) in the per-target counts, the series and the live stats.
    fn error_at(&self, tally: &mut WorkerTally, target: usize, at_ns: u64) {
        tally.ended(target);
        tally.second(self.shared.second_of(at_ns)).errors += 1;
        self.shared.live.requests.fetch_add(1, Ordering::Relaxed);
        self.shared.live.errors.fetch_add(1, Ordering::Relaxed);
    }

    fn note_check_error(tally: &mut WorkerTally, name: &str, what: impl std::fmt::Display) {
        if tally.check_error_examples.len() < CHECK_ERROR_EXAMPLES_MAX {
            let prefix = tierstack_workload::DOC_PATH_PREFIX;
            tally.check_error_examples.push(format!("GET {prefix}{name}: {what}"));
        }
    }

    /// Classifies one response: a checked 2xx or exactly one error category.
    fn record(&self, tally: &mut WorkerTally, request: &Request, start_ns: u64, end_ns: u64, ex: Exchange) {
        let live = &self.shared.live;
        let second = self.shared.second_of(end_ns);
        let doc = request.doc as u32;
        let name = self.names.get(request.doc).map_or("", String::as_str);
        // The open loop measures from the schedule, so that a slow response
        // also delays (in latency) every request due behind it.
        let latency_from_ns = request.scheduled_ns.unwrap_or(start_ns);
        tally.ended(request.target);
        tally.bytes += ex.body_bytes;
        let cache = CacheStatus::from_header(ex.cache.as_deref());
        match cache {
            CacheStatus::Hit => {
                tally.hits += 1;
                tally.second(second).hits += 1;
                live.hits.fetch_add(1, Ordering::Relaxed);
            }
            CacheStatus::Miss => {
                tally.misses += 1;
                tally.second(second).misses += 1;
                live.misses.fetch_add(1, Ordering::Relaxed);
            }
            CacheStatus::Unknown => {}
        }
        let status = ex.status.as_u16();
        let (deps_state, deps) = if ex.status.is_success() {
            tally.ok += 1;
            tally.latency.record(end_ns.saturating_sub(latency_from_ns));
            tally.second(second).ok += 1;
            live.ok.fetch_add(1, Ordering::Relaxed);
            let (state, parsed) = classify_deps(ex.deps.as_deref());
            // A 204 has no body to check; every other 2xx GET of a document does.
            let body_check = match (&parsed, ex.body) {
                (Some(parsed), Some(scanned)) if status != 204 => Some(body::verify(scanned, name, parsed)),
                _ => None,
            };
            let (state, deps) = match (state, parsed, body_check) {
                (DepsState::Ok, Some(parsed), None | Some(Ok(()))) => {
                    let mut st = self.shared.lock();
                    let deps = st.check_response(doc, start_ns, &parsed);
                    live.stale.store(st.checker.summary().stale, Ordering::Relaxed);
                    drop(st);
                    tally.checked_ok += 1;
                    if self.config.check_bodies && status != 204 {
                        tally.bodies_checked += 1;
                    }
                    (DepsState::Ok, deps)
                }
                (DepsState::Ok, Some(_), Some(Err(e))) => {
                    match e {
                        BodyCheckError::WrongKey(_) => tally.errors.deps_wrong_key += 1,
                        BodyCheckError::Body(_) => tally.errors.body_mismatch += 1,
                    }
                    Self::note_check_error(tally, name, &e);
                    (DepsState::Rejected, Deps::None)
                }
                (DepsState::Missing, _, _) if self.config.static_content => {
                    // Static content has nothing to be stale against: the
                    // response is checked (trivially) so the identities hold.
                    let mut st = self.shared.lock();
                    let id = st.next_response;
                    st.next_response += 1;
                    st.checker.response(id, doc, start_ns, Deps::None);
                    drop(st);
                    tally.checked_ok += 1;
                    (DepsState::Missing, Deps::None)
                }
                (DepsState::Missing, _, _) => {
                    tally.errors.missing_deps += 1;
                    (DepsState::Missing, Deps::None)
                }
                _ => {
                    tally.errors.malformed_deps += 1;
                    let raw = ex.deps.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
                    Self::note_check_error(tally, name, format_args!("malformed X-Tierstack-Deps {raw:?}"));
                    (DepsState::Malformed, Deps::None)
                }
            };
            (state, deps)
        } else {
            match status {
                400..=499 => tally.errors.status_4xx += 1,
                500..=599 => tally.errors.status_5xx += 1,
                _ => tally.errors.status_other += 1,
            }
            (DepsState::NotChecked, Deps::None)
        };
        live.requests.fetch_add(1, Ordering::Relaxed);
        if deps_state != DepsState::Ok {
            tally.second(second).errors += 1;
            live.errors.fetch_add(1, Ordering::Relaxed);
        }
        if self.config.keep_records
            && self.shared.records_taken.fetch_add(1, Ordering::Relaxed) < self.config.records_max as u64
        {
            // Targets and streams are at most TARGETS_MAX and CONNECTIONS_MAX.
            tally.records.push(ResponseRecord {
                start_ns,
                end_ns,
                bytes: ex.body_bytes,
                doc,
                target: request.target as u16,
                stream: request.stream as u16,
                position: u32::try_from(request.position).unwrap_or(u32::MAX),
                status,
                cache,
                deps_state,
                deps,
            });
        } else {
            tally.records_dropped += 1;
        }
    }
}

/// The closed loop: `connections` workers, each with one request in flight.
async fn closed_loop(client: Arc<Client>, stop: watch::Receiver<bool>) -> Result<WorkerTally, LoadError> {
    let workers: Vec<_> = (0..client.config.connections)
        .map(|w| {
            let (requests, targets) = client.streams(w);
            let worker = Worker { client: client.clone(), index: w, requests, targets, stop: stop.clone() };
            tokio::spawn(worker.run())
        })
        .collect();
    let mut total = WorkerTally::default();
    for handle in workers {
        total.merge(handle.await.map_err(|_| LoadError::TaskFailed("worker"))?);
    }
    Ok(total)
}

/// A closed-loop worker.
struct Worker {
    client: Arc<Client>,
    index: usize,
    requests: RequestStream,
    targets: TargetChooser,
    stop: watch::Receiver<bool>,
}

impl Worker {
    async fn run(mut self) -> WorkerTally {
        let client = self.client.clone();
        let mut tally = WorkerTally::default();
        // At most one persistent connection per target.
        let mut connections: Vec<Option<Connection>> = client.targets.iter().map(|_| None).collect();
        let mut backoff_ms = CONNECT_BACKOFF_MS_MIN;
        let mut position = 0u64;
        loop {
            if *self.stop.borrow() {
                break;
            }
            if let Some(max) = client.config.requests_max {
                if client.shared.budget_used.fetch_add(1, Ordering::Relaxed) >= max {
                    break;
                }
            }
            // Exactly one document and one target per request.
            let (Some(doc), Some(target)) = (self.requests.next(), self.targets.next()) else { break };
            let request = Request { doc, target, stream: self.index, position, scheduled_ns: None };
            position += 1;
            tally.issued += 1;
            let Some(slot) = connections.get_mut(target) else {
                // Unreachable: the chooser yields indices below the target count.
                tally.abandoned += 1;
                break;
            };
            let (attempt, reusable) = tokio::select! {
                _ = self.stop.changed() => {
                    tally.abandoned += 1;
                    break;
                }
                r = client.attempt(slot.take(), &request) => r,
            };
            *slot = reusable;
            let connect_failed = matches!(attempt.outcome, Outcome::ConnectFailed { .. });
            client.settle(&mut tally, &request, attempt);
            if connect_failed {
                tokio::select! {
                    _ = self.stop.changed() => break,
                    _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                }
                backoff_ms = (backoff_ms * 2).min(CONNECT_BACKOFF_MS_MAX);
            } else {
                backoff_ms = CONNECT_BACKOFF_MS_MIN;
            }
        }
        tally
    }
}

/// Idle persistent connections of the open loop, per target.
struct Pool {
    idle: Mutex<Vec<Vec<Connection>>>,
}

impl Pool {
    fn new(targets: usize) -> Self {
        Self { idle: Mutex::new((0..targets).map(|_| Vec::new()).collect()) }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Vec<Connection>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, target: usize) -> Option<Connection> {
        self.lock().get_mut(target)?.pop()
    }

    fn put(&self, target: usize, conn: Connection) {
        if let Some(idle) = self.lock().get_mut(target) {
            idle.push(conn);
        }
    }
}

/// Decrements the in-flight count when a request task ends, however it ends.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The open loop's dispatcher.
struct OpenLoopDriver {
    client: Arc<Client>,
    open: OpenLoop,
    /// The instant the schedule counts from.
    started: Instant,
    stop: watch::Receiver<bool>,
    halt: watch::Receiver<bool>,
}

impl OpenLoopDriver {
    async fn run(mut self) -> Result<WorkerTally, LoadError> {
        let client = self.client.clone();
        let config = &client.config;
        let run_start_ns = client.shared.run_start_ns;
        let streams = config.connections;
        let mut sources: Vec<(RequestStream, TargetChooser, u64)> = (0..streams)
            .map(|w| {
                let (requests, targets) = client.streams(w);
                (requests, targets, 0)
            })
            .collect();
        let tally = Arc::new(Mutex::new(WorkerTally::default()));
        let pool = Arc::new(Pool::new(client.targets.len()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let mut panicked = false;
        let (mut issued, mut max_lag_ns) = (0u64, 0u64);
        let duration_ns = config.duration_ms.map(|ms| ms.saturating_mul(1_000_000));
        let schedule = ArrivalSchedule::new(self.open.arrivals, self.open.rate_rps, config.seed);
        for (k, offset_ns) in (0u64..).zip(schedule) {
            if duration_ns.is_some_and(|d| offset_ns >= d) || config.requests_max.is_some_and(|max| k >= max) {
                break;
            }
            let due = self.started + Duration::from_nanos(offset_ns);
            if due > Instant::now() {
                tokio::select! {
                    _ = self.halt.changed() => break,
                    _ = tokio::time::sleep_until(due) => {}
                }
            } else if *self.halt.borrow() {
                break;
            }
            max_lag_ns = max_lag_ns.max(Instant::now().saturating_duration_since(due).as_nanos() as u64);
            let w = stream_of(k, streams);
            let Some((requests, targets, position)) = sources.get_mut(w) else { break };
            let (Some(doc), Some(target)) = (requests.next(), targets.next()) else { break };
            let scheduled_ns = run_start_ns + offset_ns;
            let request = Request { doc, target, stream: w, position: *position, scheduled_ns: Some(scheduled_ns) };
            *position += 1;
            issued += 1;
            while let Some(joined) = tasks.try_join_next() {
                panicked |= joined.is_err();
            }
            if in_flight.load(Ordering::Relaxed) >= self.open.max_in_flight {
                let mut t = lock_tally(&tally);
                t.errors.over_max_in_flight += 1;
                client.error_at(&mut t, target, scheduled_ns);
                continue;
            }
            in_flight.fetch_add(1, Ordering::Relaxed);
            let guard = InFlight(in_flight.clone());
            let task = (client.clone(), pool.clone(), tally.clone(), self.stop.clone());
            tasks.spawn(open_loop_request(task, request, guard));
        }
        // A run with a duration lasts until its deadline (the `stop`), so
        // that its throughput is over the whole duration.
        if duration_ns.is_some() {
            let _ = self.stop.wait_for(|stopped| *stopped).await;
        }
        while let Some(joined) = tasks.join_next().await {
            panicked |= joined.is_err();
        }
        if panicked {
            return Err(LoadError::TaskFailed("request"));
        }
        let mut total = std::mem::take(&mut *lock_tally(&tally));
        total.issued = issued;
        total.max_dispatch_lag_ns = max_lag_ns;
        Ok(total)
    }
}

fn lock_tally(tally: &Mutex<WorkerTally>) -> MutexGuard<'_, WorkerTally> {
    tally.lock().unwrap_or_else(|p| p.into_inner())
}

/// One open-loop request, on an idle pooled connection or a new one.
async fn open_loop_request(
    (client, pool, tally, mut stop): (Arc<Client>, Arc<Pool>, Arc<Mutex<WorkerTally>>, watch::Receiver<bool>),
    request: Request,
    _in_flight: InFlight,
) {
    let conn = if client.config.new_connection_per_request { None } else { pool.take(request.target) };
    let attempt = tokio::select! {
        _ = stop.wait_for(|stopped| *stopped) => None,
        r = client.attempt(conn, &request) => Some(r),
    };
    let mut t = lock_tally(&tally);
    match attempt {
        None => t.abandoned += 1,
        Some((attempt, reusable)) => {
            client.settle(&mut t, &request, attempt);
            drop(t);
            if let Some(conn) = reusable {
                pool.put(request.target, conn);
            }
        }
    }
}

struct Updater {
    endpoint: Endpoint,
    trace: Trace,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    interval: Duration,
    timeout: Duration,
    seed: u64,
}

#[derive(Default)]
struct UpdateTally {
    attempted: u64,
    done: u64,
    errors: ErrorCounts,
    latencies_ns: Vec<u64>,
}

impl Updater {
    async fn run(mut self) -> UpdateTally {
        let mut tally = UpdateTally::default();
        let clock = SystemClock;
        let mut rng = seeded_rng(self.seed);
        let paths: Vec<String> = self.trace.documents().iter().map(|d| d.path()).collect();
        let mut conn: Option<Connection> = None;
        let mut next = Instant::now() + self.interval;
        loop {
            tokio::select! {
                _ = self.stop.changed() => break,
                _ = tokio::time::sleep_until(next) => {}
            }
            // One update per interval; if one ran long, do not burst to catch up.
            next = (next + self.interval).max(Instant::now());
            let doc = rng.gen_range(0..paths.len());
            tally.attempted += 1;
            if conn.is_none() {
                match tokio::time::timeout(self.timeout, Connection::open(&self.endpoint)).await {
                    Ok(Ok(c)) => conn = Some(c),
                    _ => {
                        tally.errors.connect += 1;
                        continue;
                    }
                }
            }
            let Some(connection) = conn.as_mut() else { continue };
            if !matches!(tokio::time::timeout(self.timeout, connection.ready()).await, Ok(Ok(()))) {
                conn = None;
                tally.errors.io += 1;
                continue;
            }
            // Register before sending (see the staleness module), then send;
            // the exchange is not raced with `stop`: an update in flight is
            // finished so the checker learns its outcome.
            let start_ns = clock.now_ns();
            let ticket = self.shared.lock().checker.update_started(start_ns);
            let result =
                tokio::time::timeout(self.timeout, connection.exchange(Method::PUT, &paths[doc], false, false)).await;
            let end_ns = clock.now_ns();
            let exchange = match result {
                Ok(Ok(ex)) => ex,
                Ok(Err(_)) | Err(_) => {
                    conn = None;
                    match result {
                        Err(_) => tally.errors.timeout += 1,
                        _ => tally.errors.io += 1,
                    }
                    self.shared.lock().checker.update_finished(ticket, None);
                    continue;
                }
            };
            if exchange.close {
                conn = None;
            }
            if !exchange.status.is_success() {
                match exchange.status.as_u16() {
                    400..=499 => tally.errors.status_4xx += 1,
                    500..=599 => tally.errors.status_5xx += 1,
                    _ => tally.errors.status_other += 1,
                }
                self.shared.lock().checker.update_finished(ticket, None);
                continue;
            }
            let (state, parsed) = classify_deps(exchange.deps.as_deref());
            let mut st = self.shared.lock();
            match parsed {
                Some(parsed) => {
                    let deps = st.update_done(&parsed);
                    st.checker.update_finished(ticket, Some((end_ns, &deps)));
                    self.shared.live.stale.store(st.checker.summary().stale, Ordering::Relaxed);
                    st.updates.push(UpdateRecord {
                        start_ns,
                        end_ns,
                        doc: doc as u32,
                        status: exchange.status.as_u16(),
                        deps,
                    });
                    drop(st);
                    tally.done += 1;
                    tally.latencies_ns.push(end_ns.saturating_sub(start_ns));
                    self.shared.live.updates.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    st.checker.update_finished(ticket, None);
                    drop(st);
                    if state == DepsState::Missing {
                        tally.errors.missing_deps += 1;
                    } else {
                        tally.errors.malformed_deps += 1;
                    }
                }
            }
        }
        tally
    }
}

fn assemble(
    config: &LoadConfig,
    plan: &Plan,
    shared: &Shared,
    mut total: WorkerTally,
    updates: Option<UpdateTally>,
    elapsed: Duration,
) -> LoadReport {
    let elapsed_s = elapsed.as_secs_f64();
    let mut st = shared.lock();
    let state = std::mem::take(&mut *st);
    drop(st);
    let summary = state.checker.finish();
    shared.live.stale.store(summary.stale, Ordering::Relaxed);
    let paths: Vec<String> = config.trace.documents().iter().map(|d| d.path()).collect();
    let incarnations = state
        .incarnations
        .iter()
        .map(|(&(node, epoch), &(responses_checked, updates))| IncarnationSeen {
            node,
            incarnation: format!("{:016x}", state.keys.incarnation(node, epoch).unwrap_or_default()),
            epoch,
            responses_checked,
            updates,
        })
        .collect();
    let stale_examples = summary
        .examples
        .iter()
        .map(|f| StaleExample {
            path: paths.get(f.doc as usize).cloned().unwrap_or_default(),
            key: state.keys.name(f.key).to_string(),
            served_version: f.served.version,
            served_epoch: f.served.epoch,
            newer_version: f.newer.version,
            newer_epoch: f.newer.epoch,
            response_start_ns: f.response_start_ns,
            update_end_ns: f.update_end_ns,
        })
        .collect();

    let hit_rate = |hits: u64, misses: u64| (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64);
    let last = total.seconds.len().saturating_sub(1);
    let series = total
        .seconds
        .iter()
        .enumerate()
        .map(|(s, t)| {
            let span_s = if s == last { (elapsed_s - s as f64).clamp(1e-3, 1.0) } else { 1.0 };
            SecondPoint {
                second: s as u32,
                ok: t.ok,
                hits: t.hits,
                misses: t.misses,
                errors: t.errors,
                throughput_rps: t.ok as f64 / span_s,
                hit_rate: hit_rate(t.hits, t.misses),
            }
        })
        .collect();

    let update_summary = match updates {
        Some(mut u) => {
            u.latencies_ns.sort_unstable();
            UpdateSummary {
                target: plan.update_target.as_ref().map(|e| e.url.clone()),
                interval_ms: config.update_interval_ms,
                attempted: u.attempted,
                done: u.done,
                errors: u.errors,
                p50_ns: percentile(&u.latencies_ns, 50.0),
                p99_ns: percentile(&u.latencies_ns, 99.0),
            }
        }
        None => UpdateSummary::default(),
    };

    let records_kept = total.records.len() as u64;
    let records_dropped = total.records_dropped;
    let (records, stale_offline) = if config.keep_records {
        total.records.sort_by_key(|r| r.start_ns);
        let offline =
            (records_dropped == 0).then(|| staleness::find_stale(&total.records, &state.updates).len() as u64);
        let log = RecordLog {
            documents: paths,
            keys: state.keys,
            responses: std::mem::take(&mut total.records),
            updates: state.updates,
            responses_dropped: records_dropped,
        };
        (Some(log), offline)
    } else {
        (None, None)
    };

    let per_target: Vec<TargetCounts> = plan
        .targets
        .iter()
        .enumerate()
        .map(|(i, e)| TargetCounts {
            target: e.url.clone(),
            requests: total.target_requests.get(i).copied().unwrap_or(0),
            connections_opened: total.target_connections.get(i).copied().unwrap_or(0),
        })
        .collect();
    let shape = LoadShape {
        target_choice: config.target_choice,
        new_connection_per_request: config.new_connection_per_request,
        static_content: config.static_content,
        open_loop: config.open_loop.map(|o| OpenLoopSummary {
            rate_rps: o.rate_rps,
            arrivals: o.arrivals,
            streams: config.connections,
            max_in_flight: o.max_in_flight,
            max_dispatch_lag_ns: total.max_dispatch_lag_ns,
        }),
    };

    LoadReport {
        trace: config.trace.summary(),
        targets: plan.targets.iter().map(|e| e.url.clone()).collect(),
        connections: config.connections,
        seed: config.seed,
        shape,
        start_ns: shared.run_start_ns,
        elapsed_s,
        requests: total.requests,
        issued: total.issued,
        abandoned: total.abandoned,
        connections_opened: total.target_connections.iter().sum(),
        per_target,
        checked_ok: total.checked_ok,
        bodies_checked: total.bodies_checked,
        ok: total.ok,
        throughput_rps: if elapsed_s > 0.0 { total.ok as f64 / elapsed_s } else { 0.0 },
        latency: total.latency.summary(),
        bytes: total.bytes,
        cache_hits: total.hits,
        cache_misses: total.misses,
        hit_rate: hit_rate(total.hits, total.misses),
        errors: total.errors,
        updates: update_summary,
        checked_responses: summary.checked,
        stale_responses: summary.stale,
        stale_responses_offline: stale_offline,
        stale_examples,
        check_error_examples: std::mem::take(&mut total.check_error_examples),
        incarnations,
        series,
        records_kept,
        records_dropped,
        records,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(state: &mut CheckState, header: &str, start_ns: u64, end_ns: u64) {
        let parsed = deps::parse(header).unwrap();
        let deps = state.update_done(&parsed);
        let ticket = state.checker.update_started(start_ns);
        state.checker.update_finished(ticket, Some((end_ns, &deps)));
    }

    fn stale(state: &mut CheckState, header: &str, start_ns: u64) -> bool {
        let before = state.checker.summary().stale;
        state.check_response(0, start_ns, &deps::parse(header).unwrap());
        state.checker.summary().stale > before
    }

    /// Across a module restart (incarnation aa, then bb): the new
    /// incarnation's version 1 is not stale next to the old one's version
    /// 5; an old-incarnation copy is stale once an update completed under
    /// the new incarnation before its request started, whatever its
    /// version; and within one incarnation versions compare as before.
    #[test]
    fn versions_compare_across_module_incarnations_by_first_sight() {
        let mut st = CheckState::default();
        update(&mut st, "n=0;i=00000000000000aa;doc/a=5@0", 10, 20);
        assert!(!stale(&mut st, "n=0;i=00000000000000bb;doc/a=1@0", 30), "the new incarnation supersedes");
        assert!(stale(&mut st, "n=0;i=00000000000000aa;doc/a=4@0", 30), "an older version of one incarnation");
        assert!(!stale(&mut st, "n=0;i=00000000000000aa;doc/a=5@0", 30), "the old incarnation, not yet superseded");

        update(&mut st, "n=0;i=00000000000000bb;doc/a=2@0", 40, 50);
        assert!(!stale(&mut st, "n=0;i=00000000000000aa;doc/a=9@0", 45), "concurrent with the new update");
        assert!(stale(&mut st, "n=0;i=00000000000000aa;doc/a=9@0", 60), "superseded by the new incarnation");
        assert!(stale(&mut st, "n=0;i=00000000000000bb;doc/a=1@0", 60), "older within the new incarnation");
        assert!(!stale(&mut st, "n=0;i=00000000000000bb;doc/a=2@0", 60));
        assert!(!stale(&mut st, "n=7;i=00000000000000aa;doc/a=1@0", 60), "another module's key is another key");

        let seen: Vec<_> = st.incarnations.iter().map(|(&k, &v)| (k, v)).collect();
        assert_eq!(seen, vec![((0, 0), (4, 1)), ((0, 1), (3, 1)), ((7, 0), (1, 0))]);
        assert_eq!((st.keys.incarnation(0, 0), st.keys.incarnation(0, 1)), (Some(0xaa), Some(0xbb)));
    }
}
