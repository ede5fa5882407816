//! The run: closed-loop workers, the updater, the online checker, the report.

use crate::body::{self, BodyCheckError};
use crate::deps;
use crate::http::{Connection, Endpoint, Exchange, ExchangeError};
use crate::record::{CacheStatus, Deps, DepsState, KeyTable, RecordLog, ResponseRecord, Stamp, UpdateRecord};
use crate::report::{ErrorCounts, IncarnationSeen, LoadReport, SecondPoint, StaleExample, UpdateSummary};
use crate::staleness::{self, OnlineChecker};
use crate::stats::{percentile, Histogram};
use crate::LoadError;
use http::Method;
use rand::Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tierstack_base::{seeded_rng, Clock, SystemClock};
use tierstack_workload::Trace;
use tokio::sync::watch;
use tokio::time::Instant;

/// Default concurrent connections.
pub const CONNECTIONS_DEFAULT: usize = 16;
/// Most concurrent connections.
pub const CONNECTIONS_MAX: usize = 4096;
/// The paper's update rate: one update per second.
pub const UPDATE_INTERVAL_MS_DEFAULT: u64 = 1000;
/// Default per-request timeout.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default cap on kept response records (about 56 bytes each).
pub const RECORDS_MAX_DEFAULT: usize = 2_000_000;
/// Reconnect back-off after a failed connect: starts here, doubles …
pub const CONNECT_BACKOFF_MS_MIN: u64 = 5;
/// … up to here.
pub const CONNECT_BACKOFF_MS_MAX: u64 = 500;
/// Salt separating the updater's random stream from the workers'.
const UPDATER_SEED_SALT: u64 = 0x7570_6461_7465_7221; // "updater!"
/// Most header/body check failures described in the report (all are counted).
const CHECK_ERROR_EXAMPLES_MAX: usize = 16;

/// How to run a load. Build with [`LoadConfig::new`], then set fields.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Base URLs (`http://host:port`) to load; connection `i` goes to
    /// `targets[i % len]` (e.g. the three proxies of the paper's setup).
    pub targets: Vec<String>,
    /// Where updates go (normally the application server, directly);
    /// `None` = `targets[0]`.
    pub update_target: Option<String>,
    /// The documents and request stream.
    pub trace: Trace,
    /// Concurrent connections (closed loop: one request in flight each).
    pub connections: usize,
    /// Stop after this long …
    pub duration_ms: Option<u64>,
    /// … or after this many requests were issued (whichever comes first;
    /// at least one of the two must be set).
    pub requests_max: Option<u64>,
    /// One update every this many milliseconds; 0 disables updates.
    pub update_interval_ms: u64,
    /// Seeds the request streams and the updater's choices.
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
}

impl LoadConfig {
    /// One target, the paper's defaults: 16 connections, 20 s, one update
    /// per second sent to the same target, records off.
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
/// abandoned and not counted; an update in flight is finished.
pub async fn run_with<F>(config: LoadConfig, live: Arc<LiveStats>, shutdown: F) -> Result<LoadReport, LoadError>
where
    F: Future<Output = ()> + Send,
{
    let plan = Plan::validate(&config)?;
    let clock = SystemClock;
    let shared = Arc::new(Shared {
        state: Mutex::new(CheckState::default()),
        live,
        records_taken: AtomicU64::new(0),
        issued: AtomicU64::new(0),
        run_start_ns: clock.now_ns(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Instant::now();

    let mut workers = Vec::with_capacity(config.connections);
    for w in 0..config.connections {
        let worker = Worker {
            endpoint: plan.targets[w % plan.targets.len()].clone(),
            stream: config.trace.stream(config.seed, w, config.connections),
            shared: shared.clone(),
            stop: stop_rx.clone(),
            config: config.clone(),
        };
        workers.push(tokio::spawn(worker.run()));
    }
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

    // Stop at the deadline or on shutdown, whichever comes first; the
    // workers also stop by themselves when the request budget is spent.
    let deadline = config.duration_ms.map(|ms| started + Duration::from_millis(ms));
    let all_workers = async {
        let mut tallies = Vec::with_capacity(workers.len());
        for handle in workers {
            tallies.push(handle.await);
        }
        tallies
    };
    tokio::pin!(all_workers);
    tokio::pin!(shutdown);
    let stop_timer = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop_timer);
    let tallies = tokio::select! {
        tallies = &mut all_workers => tallies,
        _ = &mut stop_timer => { let _ = stop_tx.send(true); all_workers.await }
        _ = &mut shutdown => { let _ = stop_tx.send(true); all_workers.await }
    };
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    let update_tally = match updater {
        Some(handle) => Some(handle.await.map_err(|_| LoadError::TaskFailed("updater"))?),
        None => None,
    };
    let mut total = WorkerTally::default();
    for tally in tallies {
        total.merge(tally.map_err(|_| LoadError::TaskFailed("worker"))?);
    }
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
        if config.targets.is_empty() {
            return invalid("at least one target is needed");
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
    issued: AtomicU64,
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

/// What one worker saw.
#[derive(Default)]
struct WorkerTally {
    latency: Histogram,
    requests: u64,
    ok: u64,
    checked_ok: u64,
    bodies_checked: u64,
    bytes: u64,
    hits: u64,
    misses: u64,
    errors: ErrorCounts,
    check_error_examples: Vec<String>,
    seconds: Vec<SecondTally>,
    records: Vec<ResponseRecord>,
    records_dropped: u64,
}

impl WorkerTally {
    fn second(&mut self, s: usize) -> &mut SecondTally {
        if self.seconds.len() <= s {
            self.seconds.resize(s + 1, SecondTally::default());
        }
        &mut self.seconds[s]
    }

    fn merge(&mut self, o: WorkerTally) {
        self.latency.merge(&o.latency);
        self.requests += o.requests;
        self.ok += o.ok;
        self.checked_ok += o.checked_ok;
        self.bodies_checked += o.bodies_checked;
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

struct Worker {
    endpoint: Endpoint,
    stream: tierstack_workload::RequestStream,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    config: LoadConfig,
}

impl Worker {
    async fn run(mut self) -> WorkerTally {
        let mut tally = WorkerTally::default();
        let clock = SystemClock;
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        let documents = self.config.trace.documents().to_vec();
        let paths: Vec<String> = documents.iter().map(|d| d.path()).collect();
        let mut conn: Option<Connection> = None;
        let mut backoff_ms = CONNECT_BACKOFF_MS_MIN;
        loop {
            if *self.stop.borrow() {
                break;
            }
            if let Some(max) = self.config.requests_max {
                if self.shared.issued.fetch_add(1, Ordering::Relaxed) >= max {
                    break;
                }
            }
            let Some(doc) = self.stream.next() else { break };
            // A ready connection. One the server closed while idle is
            // reopened: that loses no request. A failed (re)open fails this
            // request as `connect`.
            if let Some(connection) = conn.as_mut() {
                let ready = tokio::select! {
                    _ = self.stop.changed() => break,
                    r = tokio::time::timeout(timeout, connection.ready()) => r,
                };
                if !matches!(ready, Ok(Ok(()))) {
                    conn = None;
                }
            }
            if conn.is_none() {
                let opened = tokio::select! {
                    _ = self.stop.changed() => break,
                    r = tokio::time::timeout(timeout, Connection::open(&self.endpoint)) => r,
                };
                let ready = match opened {
                    Ok(Ok(mut c)) => {
                        let ready = tokio::select! {
                            _ = self.stop.changed() => break,
                            r = tokio::time::timeout(timeout, c.ready()) => r,
                        };
                        conn = Some(c);
                        matches!(ready, Ok(Ok(())))
                    }
                    _ => false,
                };
                if ready {
                    backoff_ms = CONNECT_BACKOFF_MS_MIN;
                } else {
                    conn = None;
                    tally.requests += 1;
                    tally.errors.connect += 1;
                    self.error_at(&mut tally, clock.now_ns());
                    tokio::select! {
                        _ = self.stop.changed() => break,
                        _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                    }
                    backoff_ms = (backoff_ms * 2).min(CONNECT_BACKOFF_MS_MAX);
                    continue;
                }
            }
            let Some(connection) = conn.as_mut() else { continue };
            let path = paths.get(doc).map_or("/", String::as_str);
            let start_ns = clock.now_ns();
            let result = tokio::select! {
                _ = self.stop.changed() => break,
                r = tokio::time::timeout(timeout, connection.exchange(Method::GET, path, self.config.check_bodies)) => r,
            };
            let end_ns = clock.now_ns();
            match result {
                Ok(Ok(exchange)) => {
                    if exchange.close {
                        conn = None;
                    }
                    let name = documents.get(doc).map_or("", |d| d.name.as_str());
                    self.record(&mut tally, doc as u32, name, start_ns, end_ns, exchange);
                }
                Ok(Err(e)) => {
                    conn = None;
                    match e {
                        ExchangeError::Io | ExchangeError::Request => tally.errors.io += 1,
                    }
                    tally.requests += 1;
                    self.error_at(&mut tally, end_ns);
                }
                Err(_elapsed) => {
                    conn = None;
                    tally.errors.timeout += 1;
                    tally.requests += 1;
                    self.error_at(&mut tally, end_ns);
                }
            }
        }
        tally
    }

    /// Counts an error (already put in its category) in the series and the live stats.
    fn error_at(&self, tally: &mut WorkerTally, at_ns: u64) {
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
    fn record(&self, tally: &mut WorkerTally, doc: u32, name: &str, start_ns: u64, end_ns: u64, ex: Exchange) {
        let live = &self.shared.live;
        let second = self.shared.second_of(end_ns);
        tally.requests += 1;
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
            tally.latency.record(end_ns.saturating_sub(start_ns));
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
            tally.records.push(ResponseRecord {
                start_ns,
                end_ns,
                bytes: ex.body_bytes,
                doc,
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
            let result = tokio::time::timeout(self.timeout, connection.exchange(Method::PUT, &paths[doc], false)).await;
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

    LoadReport {
        trace: config.trace.summary(),
        targets: plan.targets.iter().map(|e| e.url.clone()).collect(),
        connections: config.connections,
        seed: config.seed,
        elapsed_s,
        requests: total.requests,
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
