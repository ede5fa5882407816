//! One request, start to end: [`Client`] sends it on a connection (opened
//! if needed), times it, checks the response (status, dependency header,
//! body) and counts it exactly once in a [`WorkerTally`].

use crate::body::{self, BodyCheckError};
use crate::config::{LoadConfig, Plan};
use crate::http::{Connection, Endpoint, Exchange};
use crate::record::{CacheStatus, Deps, DepsState, ResponseRecord};
use crate::tally::{add_at, classify_deps, Shared, WorkerTally, CHECK_ERROR_EXAMPLES_MAX};
use http::Method;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::{Clock, SystemClock};
use tierstack_workload::{RequestStream, TargetChooser};

/// One request: what it asks for, where, and who issued it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub(crate) doc: usize,
    pub(crate) target: usize,
    pub(crate) stream: usize,
    /// Its index in its stream.
    pub(crate) position: u64,
    /// Open loop: when it was due (its latency's origin).
    pub(crate) scheduled_ns: Option<u64>,
}

/// How an attempt ended.
pub(crate) enum Outcome {
    Response { sent_ns: u64, end_ns: u64, exchange: Exchange },
    ConnectFailed { at_ns: u64 },
    Io { at_ns: u64 },
    Timeout { at_ns: u64 },
}

/// One request's attempt: its outcome, and whether it opened a connection.
pub(crate) struct Attempt {
    pub(crate) outcome: Outcome,
    opened_connection: bool,
}

/// What every request needs, shared by the workers (or request tasks).
pub(crate) struct Client {
    pub(crate) config: LoadConfig,
    pub(crate) targets: Vec<Endpoint>,
    pub(crate) names: Vec<String>,
    pub(crate) paths: Vec<String>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) timeout: Duration,
}

impl Client {
    pub(crate) fn new(config: &LoadConfig, plan: &Plan, shared: Arc<Shared>) -> Self {
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
    pub(crate) fn streams(&self, w: usize) -> (RequestStream, TargetChooser) {
        let c = &self.config;
        (c.trace.stream(c.seed, w, c.connections), TargetChooser::new(c.target_choice, self.targets.len(), c.seed, w))
    }

    /// Opens a connection to `target` and waits until it takes requests.
    /// Returns it if ready, and whether a TCP connection opened at all.
    pub(crate) async fn connect(&self, target: usize) -> (Option<Connection>, bool) {
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
    pub(crate) async fn attempt(
        &self,
        mut conn: Option<Connection>,
        request: &Request,
    ) -> (Attempt, Option<Connection>) {
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
    pub(crate) fn settle(&self, tally: &mut WorkerTally, request: &Request, attempt: Attempt) {
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
    pub(crate) fn error_at(&self, tally: &mut WorkerTally, target: usize, at_ns: u64) {
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
    pub(crate) fn record(&self, tally: &mut WorkerTally, request: &Request, start_ns: u64, end_ns: u64, ex: Exchange) {
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
