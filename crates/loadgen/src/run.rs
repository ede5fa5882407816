//! The run: closed-loop workers, the updater, the online checker, the report.

use crate::deps;
use crate::http::{Connection, Endpoint, Exchange, ExchangeError};
use crate::record::{CacheStatus, Deps, DepsState, KeyTable, RecordLog, ResponseRecord, UpdateRecord};
use crate::report::{ErrorCounts, LoadReport, SecondPoint, StaleExample, UpdateSummary};
use crate::staleness::{self, OnlineChecker};
use crate::stats::{percentile, Histogram};
use crate::LoadError;
use http::Method;
use rand::Rng;
use serde::Serialize;
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
}

impl CheckState {
    /// Keys are interned per module incarnation: a restarted module counts
    /// from version 1 again, and its versions say nothing about the old ones.
    fn intern(&mut self, parsed: &deps::ParsedDeps<'_>) -> Deps {
        let space = (parsed.node, parsed.incarnation);
        let pairs: Vec<_> = parsed.entries.iter().map(|e| (self.keys.intern_in(space, e.key), e.version)).collect();
        Deps::from_pairs(&pairs)
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
    bytes: u64,
    hits: u64,
    misses: u64,
    errors: ErrorCounts,
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
        let paths: Vec<String> = self.config.trace.documents().iter().map(|d| d.path()).collect();
        let mut conn: Option<Connection> = None;
        let mut backoff_ms = CONNECT_BACKOFF_MS_MIN;
        loop {
            if *self.stop.borrow() {
                break;
            }
            let Some(connection) = conn.as_mut() else {
                let opened = tokio::select! {
                    _ = self.stop.changed() => break,
                    r = tokio::time::timeout(timeout, Connection::open(&self.endpoint)) => r,
                };
                match opened {
                    Ok(Ok(c)) => {
                        conn = Some(c);
                        backoff_ms = CONNECT_BACKOFF_MS_MIN;
                    }
                    _ => {
                        tally.errors.connect += 1;
                        let s = self.shared.second_of(clock.now_ns());
                        tally.second(s).errors += 1;
                        self.shared.live.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::select! {
                            _ = self.stop.changed() => break,
                            _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                        }
                        backoff_ms = (backoff_ms * 2).min(CONNECT_BACKOFF_MS_MAX);
                    }
                }
                continue;
            };
            let ready = tokio::select! {
                _ = self.stop.changed() => break,
                r = tokio::time::timeout(timeout, connection.ready()) => r,
            };
            if !matches!(ready, Ok(Ok(()))) {
                // The server closed the idle connection: reconnect, no request lost.
                conn = None;
                continue;
            }
            if let Some(max) = self.config.requests_max {
                if self.shared.issued.fetch_add(1, Ordering::Relaxed) >= max {
                    break;
                }
            }
            let Some(doc) = self.stream.next() else { break };
            let path = paths.get(doc).map_or("/", String::as_str);
            let start_ns = clock.now_ns();
            let result = tokio::select! {
                _ = self.stop.changed() => break,
                r = tokio::time::timeout(timeout, connection.exchange(Method::GET, path)) => r,
            };
            let end_ns = clock.now_ns();
            match result {
                Ok(Ok(exchange)) => {
                    if exchange.close {
                        conn = None;
                    }
                    self.record(&mut tally, doc as u32, start_ns, end_ns, exchange);
                }
                Ok(Err(e)) => {
                    conn = None;
                    match e {
                        ExchangeError::Io | ExchangeError::Request => tally.errors.io += 1,
                    }
                    tally.second(self.shared.second_of(end_ns)).errors += 1;
                    self.shared.live.errors.fetch_add(1, Ordering::Relaxed);
                }
                Err(_elapsed) => {
                    conn = None;
                    tally.errors.timeout += 1;
                    tally.second(self.shared.second_of(end_ns)).errors += 1;
                    self.shared.live.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        tally
    }

    fn record(&self, tally: &mut WorkerTally, doc: u32, start_ns: u64, end_ns: u64, ex: Exchange) {
        let live = &self.shared.live;
        let second = self.shared.second_of(end_ns);
        tally.requests += 1;
        tally.bytes += ex.body_bytes;
        live.requests.fetch_add(1, Ordering::Relaxed);
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
            let deps = match (state, parsed) {
                (DepsState::Ok, Some(parsed)) => {
                    let mut st = self.shared.lock();
                    let deps = st.intern(&parsed);
                    let id = st.next_response;
                    st.next_response += 1;
                    st.checker.response(id, doc, start_ns, deps.clone());
                    live.stale.store(st.checker.summary().stale, Ordering::Relaxed);
                    deps
                }
                (DepsState::Missing, _) => {
                    tally.errors.missing_deps += 1;
                    Deps::None
                }
                _ => {
                    tally.errors.malformed_deps += 1;
                    Deps::None
                }
            };
            if state != DepsState::Ok {
                tally.second(second).errors += 1;
                live.errors.fetch_add(1, Ordering::Relaxed);
            }
            (state, deps)
        } else {
            match status {
                400..=499 => tally.errors.status_4xx += 1,
                500..=599 => tally.errors.status_5xx += 1,
                _ => tally.errors.status_other += 1,
            }
            tally.second(second).errors += 1;
            live.errors.fetch_add(1, Ordering::Relaxed);
            (DepsState::NotChecked, Deps::None)
        };
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
            let result = tokio::time::timeout(self.timeout, connection.exchange(Method::PUT, &paths[doc])).await;
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
                    let deps = st.intern(&parsed);
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
    let stale_examples = summary
        .examples
        .iter()
        .map(|f| StaleExample {
            path: paths.get(f.doc as usize).cloned().unwrap_or_default(),
            key: state.keys.name(f.key).to_string(),
            served_version: f.served_version,
            newer_version: f.newer_version,
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
        series,
        records_kept,
        records_dropped,
        records,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module restart resets versions: a new incarnation's version 1 is
    /// not stale next to the old incarnation's version 5, while a stale
    /// copy within one incarnation still is.
    #[test]
    fn versions_are_compared_within_one_module_incarnation() {
        let mut state = CheckState::default();
        let old_update = deps::parse("n=0;i=00000000000000aa;doc/a=5@0").unwrap();
        let old = state.intern(&old_update);
        let ticket = state.checker.update_started(10);
        state.checker.update_finished(ticket, Some((20, &old)));

        let restarted = deps::parse("n=0;i=00000000000000bb;doc/a=1@0").unwrap();
        let fresh = state.intern(&restarted);
        assert_eq!(state.checker.response(1, 0, 30, fresh), None, "another incarnation's versions do not compare");

        let stale = deps::parse("n=0;i=00000000000000aa;doc/a=4@0").unwrap();
        let stale = state.intern(&stale);
        assert!(state.checker.response(2, 0, 30, stale).is_some(), "an older version of one incarnation is stale");
    }
}
