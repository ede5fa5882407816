//! The proxy's counters: [`Counters`], the atomics every path bumps, and
//! [`ProxyStats`], their snapshot as served at `/_tierstack/stats` with the
//! identities that hold between them ([`ProxyStats::accounting_error`]).

use crate::metrics;
use crate::CacheMode;
use serde::Serialize;
use std::sync::atomic::AtomicU64;
use std::time::Instant;
use tierstack_monitor::{Policy, Scheme};

/// The counters every path bumps (relaxed: each is a statistic on its
/// own); [`ProxyStats`] is their snapshot.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) checks: AtomicU64,
    pub(crate) checks_ok: AtomicU64,
    pub(crate) check_ns: AtomicU64,
    pub(crate) stale_dropped: AtomicU64,
    pub(crate) check_errors: AtomicU64,
    pub(crate) upstream_ns: AtomicU64,
    pub(crate) upstream_errors: AtomicU64,
    pub(crate) upstream_retries: AtomicU64,
    pub(crate) upstream_abandoned: AtomicU64,
    pub(crate) upstream_timeouts: AtomicU64,
    pub(crate) upstream_pauses: AtomicU64,
    pub(crate) uncacheable_deps: AtomicU64,
    pub(crate) coalesced: AtomicU64,
    pub(crate) waiting_on_fetch: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) pushes_received: AtomicU64,
    pub(crate) pushes_installed: AtomicU64,
    pub(crate) pushes_redundant: AtomicU64,
    pub(crate) pushes_stale: AtomicU64,
    pub(crate) pushes_refused: AtomicU64,
    pub(crate) push_bytes: AtomicU64,
    pub(crate) push_hits: AtomicU64,
    pub(crate) pages_installed: AtomicU64,
    pub(crate) pages_unusable: AtomicU64,
    pub(crate) refused_overloaded: AtomicU64,
    pub(crate) refused_no_backend: AtomicU64,
    pub(crate) monitor_reads: AtomicU64,
    pub(crate) monitor_read_ns: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) not_modified: AtomicU64,
    pub(crate) stale_served: AtomicU64,
    pub(crate) served_on_error: AtomicU64,
    pub(crate) ranges_served: AtomicU64,
    pub(crate) revalidations: AtomicU64,
    pub(crate) revalidated: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) purges: AtomicU64,
    pub(crate) upstream_bytes: AtomicU64,
    pub(crate) policy_hits: AtomicU64,
    pub(crate) policy_coalesced: AtomicU64,
    pub(crate) check_latency: metrics::CheckLatency,
}

/// The proxy's counters, served at `/_tierstack/stats`.
///
/// Every request on the client listener ends as exactly one of: a **hit**
/// (served from the proxy's own cached copy, after a successful version
/// check in `poll` mode; `X-Cache: HIT`), **coalesced** (served another
/// request's concurrent fetch after validating it; `X-Cache: MISS` and
/// [`crate::X_CACHE_COALESCED`], so a client's count of `HIT`s equals `hits`), or
/// a **miss** (forwarded upstream; `X-Cache: MISS`), or **abandoned** (its
/// client left before it was any of these). Version checks
/// (`checks`) are the request path's only: checks of cached copies and of
/// shared fetches, each ending ok, stale or in error; pushes are checked
/// too, but counted under `pushes_*`. Once no request is in flight:
///
/// - `requests == hits + coalesced + misses + abandoned`
/// - `checks == checks_ok + stale_dropped + check_errors`
/// - `poll` mode: `checks_ok + pages_installed + policy_hits +
///   policy_coalesced == hits + coalesced` (every successful check, and
///   every published page read current, serves exactly one response, and
///   nothing with dependencies is served unchecked);
/// - `pages_installed + pages_unusable <= stale_dropped` (a published page
///   is read only after a check found the copy out of date);
///   `ttl`: `checks == 0`; `no-cache`: `checks == hits == coalesced == 0`
/// - `push_hits <= hits`
/// - `refused_overloaded + refused_no_backend <= misses`
/// - `routed` sums to at most `misses + fenced + revalidations +
///   refresh_refetches + upstream_retries` (a request
///   whose upstream was chosen; a fenced one is chosen again; each
///   conditional or repeated request of a revalidation is chosen too)
/// - `pushes_received == pushes_installed + pushes_redundant + pushes_stale`
///
/// [`ProxyStats::accounting_error`] checks them. While requests are in
/// flight, each left side may run ahead of its right side.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct ProxyStats {
    /// The proxy's cache mode (absent from older proxies' counters).
    #[serde(default)]
    pub mode: Option<CacheMode>,
    /// Requests on the client listener.
    pub requests: u64,
    /// Served from the proxy's own cached copy (`X-Cache: HIT`).
    pub hits: u64,
    /// Forwarded upstream.
    pub misses: u64,
    /// Version checks on the request path, and their total time.
    pub checks: u64,
    /// Checks that found the copy current (each served one response).
    #[serde(default)]
    pub checks_ok: u64,
    pub check_ns: u64,
    /// Checks that found the copy out of date (a cached copy is then
    /// dropped; a shared fetch is not served).
    pub stale_dropped: u64,
    /// Checks that could not be made (fail closed: served from origin).
    pub check_errors: u64,
    pub upstream_ns: u64,
    pub upstream_errors: u64,
    /// Forwards sent to another upstream because the chosen one refused the
    /// connection (or, for an idempotent method, broke it before a response
    /// head); each was routed once more.
    #[serde(default)]
    pub upstream_retries: u64,
    /// Forwards given up before a response head because their upstream
    /// turned suspect or dead while they waited; an idempotent one was then
    /// retried on another upstream (counted in `upstream_retries` too).
    #[serde(default)]
    pub upstream_abandoned: u64,
    /// Forwards with no response head within the upstream timeout (an
    /// idempotent one was retried on another upstream, if one was left).
    #[serde(default)]
    pub upstream_timeouts: u64,
    /// Times an upstream was paused for `fail_timeout` after `max_fails`
    /// failed forwards (nginx's passive health check).
    #[serde(default)]
    pub upstream_pauses: u64,
    /// Responses not cached because their dependency header was malformed.
    pub uncacheable_deps: u64,
    /// Requests answered from another request's concurrent fetch (after
    /// validating it): upstream requests saved by coalescing. Not hits.
    #[serde(default)]
    pub coalesced: u64,
    /// Requests waiting for another request's fetch right now.
    #[serde(default)]
    pub waiting_on_fetch: u64,
    /// Requests dropped before they were served or forwarded: their client
    /// went away while they waited on a check or another request's fetch
    /// (the server then cancels the request's handling).
    #[serde(default)]
    pub abandoned: u64,
    pub cached_entries: u64,
    pub cached_bytes: u64,
    pub evictions: u64,
    /// Well-formed pushes received (installed or not).
    #[serde(default)]
    pub pushes_received: u64,
    /// Pushes installed in the cache, and their body bytes.
    #[serde(default)]
    pub pushes_installed: u64,
    #[serde(default)]
    pub push_bytes: u64,
    /// Pushes not installed because a copy at least as new was cached.
    #[serde(default)]
    pub pushes_redundant: u64,
    /// Pushes not installed because their versions were already superseded
    /// (or could not be checked, or stored).
    #[serde(default)]
    pub pushes_stale: u64,
    /// Pushes refused before being received: malformed, naming another
    /// document, too large, or caching is off.
    #[serde(default)]
    pub pushes_refused: u64,
    /// Hits served from pushed entries.
    #[serde(default)]
    pub push_hits: u64,
    /// Wasted updates (paper §5.3): pushes of a document followed by another
    /// push of it with no request for it in between.
    #[serde(default)]
    pub wasted_updates: u64,
    /// Slots of the shared cache state (0: none registered).
    #[serde(default)]
    pub cache_state_slots: u64,
    /// Cache state updates dropped under writer contention.
    #[serde(default)]
    pub cache_state_dropped: u64,
    /// The balancing policy and monitoring scheme, when balancing is set.
    #[serde(default)]
    pub balance: Option<Policy>,
    #[serde(default)]
    pub monitor: Option<Scheme>,
    /// Requests forwarded to each upstream (in `--upstream` order).
    #[serde(default)]
    pub routed: Vec<u64>,
    /// Misses answered 503 by admission control (the chosen upstream was
    /// estimated at or above `admit_max`).
    #[serde(default)]
    pub refused_overloaded: u64,
    /// Misses answered 503 because every upstream was reported dead.
    #[serde(default)]
    pub refused_no_backend: u64,
    /// Readings of one upstream's load taken for balancing, and their time.
    #[serde(default)]
    pub monitor_reads: u64,
    #[serde(default)]
    pub monitor_read_ns: u64,
    /// This proxy's site, when it routes only to its site's upstreams.
    #[serde(default)]
    pub site: Option<u16>,
    /// Forwards refused by an upstream whose role had changed since this
    /// proxy read it (421, the epoch fence); each was routed once more.
    #[serde(default)]
    pub fenced: u64,
    /// Hits answered 304 because the client's `If-None-Match` or
    /// `If-Modified-Since` held (counted in `hits` too).
    #[serde(default)]
    pub not_modified: u64,
    /// Stale responses served: during `stale-while-revalidate` (hits) or
    /// in place of an error under `stale-if-error` (misses).
    #[serde(default)]
    pub stale_served: u64,
    /// Stored responses served in place of an upstream failure (500, 502,
    /// 503, 504, or no answer) under `stale-if-error` or the operator's
    /// `--serve-stale-on-error` grace (misses; in `stale_served` too).
    #[serde(default)]
    pub served_on_error: u64,
    /// Hits answered 206 (or 416) with ranges of a stored complete
    /// response (in `hits` too).
    #[serde(default)]
    pub ranges_served: u64,
    /// Conditional requests sent to revalidate stored responses, and those
    /// answered 304 (the stored response then served, updated).
    #[serde(default)]
    pub revalidations: u64,
    #[serde(default)]
    pub revalidated: u64,
    /// Stored responses dropped after unsafe methods (RFC 9111 §4.4).
    #[serde(default)]
    pub invalidations: u64,
    /// Objects dropped by an admin purge.
    #[serde(default)]
    pub purges: u64,
    /// Response body bytes received from upstreams.
    #[serde(default)]
    pub upstream_bytes: u64,
    /// Hits and coalesced responses without dependencies: served by RFC
    /// 9111 freshness, with no version check (included in `hits` and
    /// `coalesced`).
    #[serde(default)]
    pub policy_hits: u64,
    #[serde(default)]
    pub policy_coalesced: u64,
    /// Proxy-side refresh: batched version reads of the hot set, and the
    /// documents they found changed and refetched (each routed upstream).
    #[serde(default)]
    pub refresh_reads: u64,
    #[serde(default)]
    pub refresh_refetches: u64,
    /// Refetched copies stored in the cache.
    #[serde(default)]
    pub refresh_installed: u64,
    /// Hits served from a page the application module published, read
    /// one-sidedly with its versions after the stored copy's check failed
    /// (then stored in place of that copy).
    #[serde(default)]
    pub pages_installed: u64,
    /// Published-page reads that found no usable page (none published for
    /// the document, not current, evicted, torn, unreadable): those requests
    /// went upstream. A module that publishes no pages is never read.
    #[serde(default)]
    pub pages_unusable: u64,
}

impl ProxyStats {
    /// Requests received and not yet ended (a hit, coalesced, a miss or
    /// abandoned): handlers still running, e.g. of requests whose client
    /// gave up as a load run ended and which hyper has not cancelled yet.
    pub fn in_flight(&self) -> u64 {
        self.requests.saturating_sub(self.hits + self.coalesced + self.misses + self.abandoned)
    }

    /// `None` if the identities in the type's documentation hold, else
    /// which one fails and by how much. Meaningful once no request is in
    /// flight.
    pub fn accounting_error(&self) -> Option<String> {
        let mut errors = Vec::new();
        let mut expect = |holds: bool, what: String| {
            if !holds {
                errors.push(what);
            }
        };
        let ended = self.hits + self.coalesced + self.misses + self.abandoned;
        expect(
            self.requests == ended,
            format!(
                "requests {} != hits {} + coalesced {} + misses {} + abandoned {}",
                self.requests, self.hits, self.coalesced, self.misses, self.abandoned
            ),
        );
        let ended = self.checks_ok + self.stale_dropped + self.check_errors;
        expect(
            self.checks == ended,
            format!(
                "checks {} != ok {} + stale {} + errors {}",
                self.checks, self.checks_ok, self.stale_dropped, self.check_errors
            ),
        );
        match self.mode {
            Some(CacheMode::Poll) => expect(
                self.checks_ok + self.pages_installed + self.policy_hits + self.policy_coalesced
                    == self.hits + self.coalesced,
                format!(
                    "poll: checks_ok {} + pages_installed {} + policy_hits {} + policy_coalesced {} != hits {} + \
                     coalesced {}",
                    self.checks_ok,
                    self.pages_installed,
                    self.policy_hits,
                    self.policy_coalesced,
                    self.hits,
                    self.coalesced
                ),
            ),
            Some(CacheMode::Ttl) => expect(self.checks == 0, format!("ttl: {} checks", self.checks)),
            Some(CacheMode::NoCache) => expect(
                self.checks == 0 && self.hits == 0 && self.coalesced == 0,
                format!("no-cache: {} checks, {} hits, {} coalesced", self.checks, self.hits, self.coalesced),
            ),
            None => {}
        }
        expect(self.push_hits <= self.hits, format!("push_hits {} > hits {}", self.push_hits, self.hits));
        let page_reads = self.pages_installed + self.pages_unusable;
        expect(
            page_reads <= self.stale_dropped,
            format!("published-page reads {page_reads} > stale_dropped {}", self.stale_dropped),
        );
        let refused = self.refused_overloaded + self.refused_no_backend;
        expect(refused <= self.misses, format!("refused {refused} > misses {}", self.misses));
        let routed: u64 = self.routed.iter().sum();
        // A fenced forward is routed once more; a revalidation (also in the
        // background, for stale-while-revalidate) is routed too, and so
        // is a refresh's refetch.
        let routable = self.misses + self.fenced + self.revalidations + self.refresh_refetches + self.upstream_retries;
        expect(
            routed <= routable,
            format!(
                "routed {routed} > misses {} + fenced {} + revalidations {} + refresh_refetches {} + upstream_retries {}",
                self.misses, self.fenced, self.revalidations, self.refresh_refetches, self.upstream_retries
            ),
        );
        let pushes_ended = self.pushes_installed + self.pushes_redundant + self.pushes_stale;
        expect(
            self.pushes_received == pushes_ended,
            format!(
                "pushes_received {} != installed {} + redundant {} + stale {}",
                self.pushes_received, self.pushes_installed, self.pushes_redundant, self.pushes_stale
            ),
        );
        (!errors.is_empty()).then(|| errors.join("; "))
    }
}

/// Nanoseconds since `since`, saturating.
#[inline]
pub(crate) fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
