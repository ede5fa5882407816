//! What a load run reports.

use crate::arrival::Arrivals;
use crate::record::RecordLog;
use serde::Serialize;
use tierstack_stats::LatencySummary;
use tierstack_workload::{TargetChoice, TraceSummary};

/// Failed requests and bad responses, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    /// TCP connect or HTTP handshake failed.
    pub connect: u64,
    /// The connection failed while sending or receiving (the request is lost).
    pub io: u64,
    /// No complete response within the request timeout.
    pub timeout: u64,
    /// Responses with status 4xx.
    pub status_4xx: u64,
    /// Responses with status 5xx.
    pub status_5xx: u64,
    /// Responses with another non-2xx status.
    pub status_other: u64,
    /// 2xx responses without `X-Tierstack-Deps`.
    pub missing_deps: u64,
    /// 2xx responses whose `X-Tierstack-Deps` breaks the contract.
    pub malformed_deps: u64,
    /// 2xx responses whose header does not name the requested document's
    /// key `doc/<name>` (checked only with `check_bodies`).
    pub deps_wrong_key: u64,
    /// 2xx responses whose self-checking body disagrees with the request or
    /// the header, or whose content fails its hash (only with `check_bodies`).
    pub body_mismatch: u64,
    /// Open loop: requests due while `max_in_flight` requests were already
    /// in flight, so not sent (each is still one request of the run).
    pub over_max_in_flight: u64,
}

impl ErrorCounts {
    pub(crate) fn merge(&mut self, o: &ErrorCounts) {
        self.connect += o.connect;
        self.io += o.io;
        self.timeout += o.timeout;
        self.status_4xx += o.status_4xx;
        self.status_5xx += o.status_5xx;
        self.status_other += o.status_other;
        self.missing_deps += o.missing_deps;
        self.malformed_deps += o.malformed_deps;
        self.deps_wrong_key += o.deps_wrong_key;
        self.body_mismatch += o.body_mismatch;
        self.over_max_in_flight += o.over_max_in_flight;
    }

    /// Every category with its count, zeros included, in a fixed order.
    pub fn categories(&self) -> [(&'static str, u64); 11] {
        [
            ("connect", self.connect),
            ("io", self.io),
            ("timeout", self.timeout),
            ("status 4xx", self.status_4xx),
            ("status 5xx", self.status_5xx),
            ("status other", self.status_other),
            ("missing deps", self.missing_deps),
            ("malformed deps", self.malformed_deps),
            ("deps wrong key", self.deps_wrong_key),
            ("body mismatch", self.body_mismatch),
            ("over max in flight", self.over_max_in_flight),
        ]
    }

    /// Everything counted here.
    pub fn total(&self) -> u64 {
        self.connect
            + self.io
            + self.timeout
            + self.status_4xx
            + self.status_5xx
            + self.status_other
            + self.missing_deps
            + self.malformed_deps
            + self.deps_wrong_key
            + self.body_mismatch
            + self.over_max_in_flight
    }
}

/// The updater's work.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct UpdateSummary {
    /// Update target URL (`None` when updates were disabled).
    pub target: Option<String>,
    pub interval_ms: u64,
    /// Updates sent (or attempted: a failed connect counts).
    pub attempted: u64,
    /// Updates answered 2xx with a valid header: these feed the checker.
    pub done: u64,
    /// The rest, by kind (`missing_deps`/`malformed_deps` on 2xx, statuses, transport).
    pub errors: ErrorCounts,
    /// Latency of completed updates (start to response).
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// One second of the run (by response completion time).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SecondPoint {
    /// Seconds since the run started (this point covers `[second, second+1)`).
    pub second: u32,
    /// 2xx responses completed in this second.
    pub ok: u64,
    pub hits: u64,
    pub misses: u64,
    /// Errors of every kind recorded in this second.
    pub errors: u64,
    /// `ok` per second of this bucket's length (the last bucket may be partial).
    pub throughput_rps: f64,
    /// `hits / (hits + misses)`; `None` without `X-Cache` headers.
    pub hit_rate: Option<f64>,
}

/// A stale response, resolved to names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StaleExample {
    pub path: String,
    pub key: String,
    pub served_version: u64,
    /// Epoch (incarnation rank, see [`crate::staleness`]) of `served_version`.
    pub served_epoch: u32,
    pub newer_version: u64,
    pub newer_epoch: u32,
    pub response_start_ns: u64,
    pub update_end_ns: u64,
}

/// One module incarnation the checker saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IncarnationSeen {
    /// The module's fabric node.
    pub node: u32,
    /// Its incarnation, as in the header (16 hex digits).
    pub incarnation: String,
    /// Rank among `node`'s incarnations by first sight (0 = first).
    pub epoch: u32,
    /// Checked responses whose header named this incarnation.
    pub responses_checked: u64,
    /// Completed updates whose header named it.
    pub updates: u64,
}

/// How the requests were issued.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LoadShape {
    pub target_choice: TargetChoice,
    /// Every request on a connection of its own, closed after the response.
    pub new_connection_per_request: bool,
    /// `None`: closed loop (`connections` workers, one request in flight each).
    pub open_loop: Option<OpenLoopSummary>,
    /// 2xx responses without `X-Tierstack-Deps` were accepted (static content).
    pub static_content: bool,
}

/// The open loop's parameters and how well the client kept its schedule.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OpenLoopSummary {
    pub rate_rps: f64,
    pub arrivals: Arrivals,
    /// Request streams (`connections`); request `k` takes stream `k mod streams`.
    pub streams: usize,
    pub max_in_flight: usize,
    /// The largest delay between a request's scheduled time and its dispatch
    /// by the client (the client's own lag; latencies include it).
    pub max_dispatch_lag_ns: u64,
}

/// What one target received.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TargetCounts {
    /// The target's URL, as configured.
    pub target: String,
    /// Requests to it that ended (counted as in [`LoadReport::requests`]).
    pub requests: u64,
    /// TCP connections to it opened by requests that ended.
    pub connections_opened: u64,
}

/// The outcome of [`crate::run`].
#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub trace: TraceSummary,
    pub targets: Vec<String>,
    pub connections: usize,
    pub seed: u64,
    /// Closed or open loop, target choice, connection reuse.
    pub shape: LoadShape,
    /// When the run started, on the clock of the records
    /// (`tierstack_base::SystemClock`): the open loop's request `k` was due
    /// at `start_ns + t_k` ([`crate::arrival`]).
    pub start_ns: u64,
    /// From the start of the run until every worker stopped.
    pub elapsed_s: f64,
    /// Requests that ended: a response (any status) or a transport failure
    /// (`connect`, `io`, `timeout`), or, in the open loop, a request refused
    /// for the in-flight bound. Always `checked_ok + errors.total()`.
    pub requests: u64,
    /// Requests begun: each took the next document of its stream and the
    /// next target of its chooser. Always `requests + abandoned`.
    pub issued: u64,
    /// Requests still in flight (or connecting) when the run was stopped by
    /// its duration or a shutdown: not counted in `requests`.
    pub abandoned: u64,
    /// TCP connections opened by requests that ended, over all targets (a
    /// request abandoned at the stop may have opened one more).
    pub connections_opened: u64,
    /// Per target, in the order of `targets`.
    pub per_target: Vec<TargetCounts>,
    /// 2xx responses that passed every check (header, and body when
    /// checked) and were checked for staleness; with static content, also
    /// the 2xx responses without a header.
    pub checked_ok: u64,
    /// Of `checked_ok`, responses whose self-checking body was verified.
    pub bodies_checked: u64,
    /// 2xx responses.
    pub ok: u64,
    /// 2xx responses per second of `elapsed_s`.
    pub throughput_rps: f64,
    /// Latency of 2xx responses, to the last body byte, from the moment the
    /// request was handed to its connection (closed loop) or from its
    /// scheduled time (open loop: so connecting, waiting behind a slow
    /// response, or a client running late all count).
    pub latency: LatencySummary,
    /// Body bytes of all responses.
    pub bytes: u64,
    /// `X-Cache: HIT` / `MISS` responses.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// `hits / (hits + misses)`; `None` if no response carried `X-Cache`.
    pub hit_rate: Option<f64>,
    pub errors: ErrorCounts,
    pub updates: UpdateSummary,
    /// Responses the online staleness checker examined (== `checked_ok`).
    pub checked_responses: u64,
    /// Stale responses found by the online checker: must be zero.
    pub stale_responses: u64,
    /// The offline checker's count over the kept records, when every
    /// response was kept (a cross-check of the online count).
    pub stale_responses_offline: Option<u64>,
    /// The first stale responses.
    pub stale_examples: Vec<StaleExample>,
    /// The first header and body check failures, described.
    pub check_error_examples: Vec<String>,
    /// Module incarnations seen, per node in epoch order.
    pub incarnations: Vec<IncarnationSeen>,
    /// Per-second throughput and hit rate.
    pub series: Vec<SecondPoint>,
    /// Responses kept in `records` and responses not kept (log full or disabled).
    pub records_kept: u64,
    pub records_dropped: u64,
    /// The full record log, if `keep_records` was set.
    #[serde(skip)]
    pub records: Option<RecordLog>,
}

impl LoadReport {
    /// Does every request that ended appear exactly once, as a checked 2xx
    /// or in one error category, and once under its target? Does every
    /// request begun either end or count as abandoned?
    pub fn accounted(&self) -> bool {
        self.requests == self.checked_ok + self.errors.total()
            && self.checked_responses == self.checked_ok
            && self.issued == self.requests + self.abandoned
            && self.per_target.iter().map(|t| t.requests).sum::<u64>() == self.requests
            && self.per_target.iter().map(|t| t.connections_opened).sum::<u64>() == self.connections_opened
    }

    /// A plain-text summary table.
    pub fn summary_table(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let hit = self.hit_rate.map_or_else(|| "n/a".to_string(), |h| format!("{:.1} %", h * 100.0));
        let choice = match self.shape.target_choice {
            TargetChoice::Fixed => "fixed",
            TargetChoice::RoundRobin => "round-robin",
            TargetChoice::Random => "random",
        };
        let reuse = if self.shape.new_connection_per_request { ", a new connection per request" } else { "" };
        let reuse = if self.shape.static_content { format!("{reuse}, static content") } else { reuse.to_string() };
        let load = match &self.shape.open_loop {
            None => format!("closed loop, {} connections, target choice {choice}{reuse}", self.connections),
            Some(o) => format!(
                "open loop, {} req/s {}, {} streams, at most {} in flight, target choice {choice}{reuse}",
                o.rate_rps,
                match o.arrivals {
                    Arrivals::Constant => "constant",
                    Arrivals::Poisson => "poisson",
                },
                o.streams,
                o.max_in_flight
            ),
        };
        let mut rows: Vec<(String, String)> = vec![("trace".into(), self.trace.label.clone()), ("load".into(), load)];
        if let Some(o) = &self.shape.open_loop {
            rows.push(("max dispatch lag".into(), format!("{:.3} ms", ms(o.max_dispatch_lag_ns))));
        }
        for t in &self.per_target {
            rows.push((
                format!("target {}", t.target),
                format!("{} requests, {} connections opened", t.requests, t.connections_opened),
            ));
        }
        rows.extend(vec![
            ("connections opened".into(), self.connections_opened.to_string()),
            ("elapsed".into(), format!("{:.2} s", self.elapsed_s)),
            (
                "requests".into(),
                format!(
                    "{} ({} ok, {} checked ok; {} abandoned at the stop)",
                    self.requests, self.ok, self.checked_ok, self.abandoned
                ),
            ),
            ("throughput".into(), format!("{:.0} req/s", self.throughput_rps)),
            ("latency p50".into(), format!("{:.3} ms", ms(self.latency.p50_ns))),
            ("latency p99".into(), format!("{:.3} ms", ms(self.latency.p99_ns))),
            ("hit rate".into(), hit),
            ("errors".into(), format_errors(&self.errors)),
            (
                "updates".into(),
                format!(
                    "{} done / {} attempted (p50 {:.3} ms){}",
                    self.updates.done,
                    self.updates.attempted,
                    ms(self.updates.p50_ns),
                    if self.updates.errors.total() > 0 {
                        format!(", errors: {}", format_errors(&self.updates.errors))
                    } else {
                        String::new()
                    }
                ),
            ),
            ("checked responses".into(), self.checked_responses.to_string()),
            ("stale responses".into(), self.stale_responses.to_string()),
        ]);
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<width$}  {v}\n"));
        }
        out
    }
}

fn format_errors(e: &ErrorCounts) -> String {
    if e.total() == 0 {
        return "0".to_string();
    }
    e.categories().iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
}
