//! The proxy tier (`tierstack proxy`): a reverse proxy in front of
//! application servers that caches dynamic content with strong coherence.
//!
//! It is an RFC 9111 shared cache for every response (see `policy` and
//! ARCHITECTURE.md: whole responses, key = authority + target, `Vary`,
//! revalidation, invalidation, stale-while-revalidate / stale-if-error,
//! `CDN-Cache-Control`; Range requests pass through). A GET response that
//! carries `X-Tierstack-Deps` (the versions it was generated at) is instead
//! cached as a 200 nothing forbids storing, with no freshness: on every hit, in
//! `poll` mode, the proxy reads those versions from the application module's
//! version table with **one batched one-sided read** and serves the copy only
//! if all are still current; otherwise it drops the entry and forwards. This
//! is the coherency paper's client polling (§3) with the version check moved
//! off the back end's CPU.
//!
//! **Fail closed**: if the versions cannot be read (module dead, timeout), the
//! entry is dropped and the request forwarded; the proxy never serves a copy
//! it could not validate. An unreachable origin is 502, a slow one 504.
//!
//! `X-Cache: HIT` marks exactly the responses served from the proxy's own
//! cached copy; everything else is `MISS`, including a response served from
//! another request's concurrent fetch (request coalescing), which also
//! carries `X-Cache-Coalesced: 1`. [`ProxyStats`] counts the same way.
//!
//! Modes: `no-cache` (forward everything: the paper's no-cache coherence),
//! `poll` (the above), `ttl` (serve hits without any check: the non-coherent
//! upper bound plain HTTP caches reach, kept only for comparison).
//!
//! **Adaptive push-pull** (paper §4.3, crate `tierstack-pushpull`): with a
//! fabric node, the proxy keeps its *cache state* — its recently accessed
//! documents with last access, count, weight and whether it holds a copy — in
//! a registered region, updated on every request with a few atomics, which
//! the application tier reads one-sidedly when an update completes. The
//! application tier then pushes new versions it judges useful to
//! `PUT /_tierstack/push/doc/<name>` ([`PUSH_PATH_PREFIX`]): the body is the
//! document, `X-Tierstack-Deps` the versions it was generated at (required;
//! a push whose header does not parse, that names no single document, or
//! whose header does not name that document's key `doc/<name>`, is refused
//! with 400). In `poll` mode a push is installed only if its
//! versions are current when it arrives, and like every entry it is
//! validated again on each hit, so a push racing with a newer update is
//! refused or dropped, never served. Answers: `204`
//! installed, `200` a copy at least as new is already cached, `409` the
//! versions are superseded or the proxy does not cache, `507` too large for
//! the cache, `503` the versions could not be checked. The endpoint is for
//! the application tier only, as `/_tierstack/stats` is for operators: both
//! are served only on the proxy's **admin listener**
//! ([`ProxyConfig::admin_listen`], e.g. a loopback or back-end address) and
//! never on the client listener, which answers every `/_tierstack/` path
//! with 404 — otherwise any client could push a forged page with current
//! versions (they are in every response's header) and have it served to
//! everyone until the next update. Without an admin listener, nobody can
//! push and the counters are not served.
//!
//! **Load balancing** ([`Proxy::set_balancing`], svc §5.2): without it a
//! document goes to the upstream its path hashes to. With it, the upstream
//! of every forwarded request is chosen by a [`tierstack_monitor::Balancer`]
//! (`hash`, `round-robin` or `least-loaded`), fed before each choice with
//! the upstreams' load as one of the four monitoring schemes reads it
//! ([`LoadSource`]); upstreams reported dead are skipped. With admission
//! control (`admit_max`), a request whose chosen upstream is estimated at or
//! above the bound is answered 503 without being forwarded
//! (`refused_overloaded`; every upstream dead: `refused_no_backend`). Both
//! are misses: the request was not served from the cache.

mod access_log;
mod cache;
mod coalesce;
mod coop;
mod metrics;
mod policy;
mod push;
mod refresh;
mod stream;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
mod upstream;

use bytes::Bytes;
use cache::{Cache, Entry, InsertOutcome};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AGE, AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_LOCATION, CONTENT_TYPE,
    DATE, ETAG, EXPIRES, HOST, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE,
    LAST_MODIFIED, LOCATION, RANGE, VARY,
};
use hyper::{Method, Request, Response, StatusCode, Uri};
use policy::{Usable, Vary};
use serde::Serialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tierstack_base::{host_monotonic_ns, Clock, SystemClock};
use tierstack_coherent::{DepsHeader, VersionChecker, DEPS_HEADER};
use tierstack_fabric::{Fabric, RemoteRegion};
use tierstack_monitor::balance::fnv1a;
use tierstack_monitor::reconfig::{read_role, RoleStamp, ROLE_HEADER};
pub use tierstack_monitor::{Balancer, BalancerConfig, Decision, LoadSource, Policy, Scheme};
pub use tierstack_pushpull::state::CacheStateConfig;
pub use tierstack_pushpull::SLOTS_DEFAULT as CACHE_STATE_SLOTS_DEFAULT;
use tierstack_pushpull::{fingerprint, CacheStateWriter};
use tierstack_tier_http::{collect_limited, serve, serve_with_options, text, Body, PeerAddr, ServeOptions, Stop};
use upstream::{PooledBody, UpstreamError, Upstreams};

/// Largest request body forwarded.
pub const REQUEST_BODY_BYTES_MAX: usize = 16 << 20;
/// A miss whose declared length is at most this is read whole, then
/// answered as one response; longer or unknown lengths stream.
pub const WHOLE_BYTES_MAX: usize = 256 << 10;
/// Largest response body read whole (revalidations, pushes).
pub const RESPONSE_BODY_BYTES_MAX: usize = 64 << 20;
/// The response header telling clients whether the cache answered.
pub const X_CACHE: &str = "x-cache";
/// [`X_CACHE`] as a field name, parsed once.
const X_CACHE_NAME: HeaderName = HeaderName::from_static(X_CACHE);
/// Idle connections kept per upstream.
const UPSTREAM_IDLE_MAX: usize = 512;
/// Tries of a forward whose upstream fences it (421) before the 421 is
/// the answer.
const FENCED_ATTEMPTS_MAX: u32 = 2;
/// Present (`1`) on a response served from another request's concurrent
/// fetch after validating it; such a response is labelled `X-Cache: MISS`.
pub const X_CACHE_COALESCED: &str = "x-cache-coalesced";
pub use coop::CoopStats;
pub use refresh::{HotSet, REFRESH_HOT_DEFAULT, REFRESH_INTERVAL_DEFAULT};
pub use stream::{ProxyBody, StreamError};
pub use tierstack_coop::CoopHandle;
/// Where the application tier pushes documents: `PUT <prefix><name>`
/// installs the body as the cached copy of `/doc/<name>`.
pub use tierstack_pushpull::PUSH_PATH_PREFIX;

/// How the proxy treats cached copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    NoCache,
    Poll,
    Ttl,
}

impl std::str::FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "no-cache" => Ok(CacheMode::NoCache),
            "poll" => Ok(CacheMode::Poll),
            "ttl" => Ok(CacheMode::Ttl),
            other => Err(format!("unknown cache mode {other:?} (expected no-cache, poll or ttl)")),
        }
    }
}

#[derive(Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    /// Application servers, e.g. `http://127.0.0.1:8081`; a document goes to
    /// the upstream its path hashes to.
    pub upstreams: Vec<String>,
    pub mode: CacheMode,
    pub cache_bytes: usize,
    pub upstream_timeout: Duration,
    /// The proxy's fabric node; required in `poll` mode.
    pub fabric: Option<Arc<dyn Fabric>>,
    /// Where the admin endpoints (push, stats) listen; `None`: nowhere.
    pub admin_listen: Option<SocketAddr>,
}

/// Settings beyond [`ProxyConfig`], with defaults ([`Proxy::bind`] uses them).
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// The shared cache state to register on the proxy's fabric node, if it
    /// has one; `None` registers none (the application tier then never
    /// pushes to this proxy). A registration that fails is logged and the
    /// proxy runs without one: the cache state is advisory.
    pub cache_state: Option<CacheStateConfig>,
    /// The authority (`host:port`) of requests that carry none, and under
    /// which pushed documents are cached; `None`: the client listener's
    /// address (what a client naming the proxy by address sends as `Host`).
    pub default_authority: Option<String>,
    /// The client listener closes a connection that has not sent a whole
    /// request header this long after it began waiting for one (slow
    /// clients, and idle keep-alive connections); `None`: never.
    pub header_read_timeout: Option<Duration>,
    /// At most this many client connections at once (more wait in the
    /// listen backlog); `None`: no bound.
    pub max_connections: Option<usize>,
    /// Append a Combined Log Format line per client request to this file.
    pub access_log: Option<std::path::PathBuf>,
    /// Proxy-side refresh (`refresh`): watch this many of the hottest
    /// cached documents with dependencies, 0: off (the default here; the
    /// CLI's is [`REFRESH_HOT_DEFAULT`]).
    pub refresh_hot: usize,
    /// How often refresh reads their versions.
    pub refresh_interval: Duration,
}

/// [`ProxyOptions::header_read_timeout`]'s default.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// [`ProxyOptions::max_connections`]'s default.
pub const MAX_CONNECTIONS_DEFAULT: usize = 10_000;

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            cache_state: Some(CacheStateConfig::default()),
            default_authority: None,
            header_read_timeout: Some(HEADER_READ_TIMEOUT_DEFAULT),
            max_connections: Some(MAX_CONNECTIONS_DEFAULT),
            access_log: None,
            refresh_hot: 0,
            refresh_interval: REFRESH_INTERVAL_DEFAULT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no upstream application server was given")]
    NoUpstream,
    #[error("bad upstream {0:?}: expected http://host:port")]
    BadUpstream(String),
    #[error("poll mode needs a fabric node (a topology and node id)")]
    NoFabric,
    #[error("the cooperative cache was set already")]
    CoopSet,
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("the load source reads {sources} back ends but the proxy has {upstreams} upstreams")]
    SourceMismatch { sources: usize, upstreams: usize },
    #[error("balancing is already set")]
    BalancingSet,
    #[error("a site needs balancing set first")]
    SiteNeedsBalancing,
    #[error("the site names {roles} role regions but the proxy has {upstreams} upstreams")]
    RoleMismatch { roles: usize, upstreams: usize },
    #[error("the site is already set")]
    SiteSet,
    #[error("cannot open the access log {path}: {source}")]
    AccessLog { path: std::path::PathBuf, source: std::io::Error },
}

/// This proxy's site among several that share the application servers
/// ([`Proxy::set_site`]; reconfiguration, svc §3).
#[derive(Clone)]
pub struct Site {
    pub site: u16,
    /// Each upstream's role region, index for index.
    pub roles: Vec<Arc<dyn RemoteRegion>>,
}

/// How the proxy picks an upstream ([`Proxy::set_balancing`]).
#[derive(Clone)]
pub struct Balancing {
    pub config: BalancerConfig,
    /// The upstreams' load, index for index; `None`: the balancer knows
    /// only this proxy's own requests in flight.
    pub source: Option<Arc<dyn LoadSource>>,
}

struct BalancingState {
    balancer: Mutex<Balancer>,
    source: Option<Arc<dyn LoadSource>>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    checks: AtomicU64,
    checks_ok: AtomicU64,
    check_ns: AtomicU64,
    stale_dropped: AtomicU64,
    check_errors: AtomicU64,
    upstream_ns: AtomicU64,
    upstream_errors: AtomicU64,
    upstream_retries: AtomicU64,
    uncacheable_deps: AtomicU64,
    coalesced: AtomicU64,
    waiting_on_fetch: AtomicU64,
    abandoned: AtomicU64,
    pushes_received: AtomicU64,
    pushes_installed: AtomicU64,
    pushes_redundant: AtomicU64,
    pushes_stale: AtomicU64,
    pushes_refused: AtomicU64,
    push_bytes: AtomicU64,
    push_hits: AtomicU64,
    refused_overloaded: AtomicU64,
    refused_no_backend: AtomicU64,
    monitor_reads: AtomicU64,
    monitor_read_ns: AtomicU64,
    fenced: AtomicU64,
    not_modified: AtomicU64,
    stale_served: AtomicU64,
    revalidations: AtomicU64,
    revalidated: AtomicU64,
    invalidations: AtomicU64,
    purges: AtomicU64,
    upstream_bytes: AtomicU64,
    policy_hits: AtomicU64,
    policy_coalesced: AtomicU64,
    check_latency: metrics::Histogram,
}

/// The proxy's counters, served at `/_tierstack/stats`.
///
/// Every request on the client listener ends as exactly one of: a **hit**
/// (served from the proxy's own cached copy, after a successful version
/// check in `poll` mode; `X-Cache: HIT`), **coalesced** (served another
/// request's concurrent fetch after validating it; `X-Cache: MISS` and
/// [`X_CACHE_COALESCED`], so a client's count of `HIT`s equals `hits`), or
/// a **miss** (forwarded upstream; `X-Cache: MISS`), or **abandoned** (its
/// client left before it was any of these). Version checks
/// (`checks`) are the request path's only: checks of cached copies and of
/// shared fetches, each ending ok, stale or in error; pushes are checked
/// too, but counted under `pushes_*`. Once no request is in flight:
///
/// - `requests == hits + coalesced + misses + abandoned`
/// - `checks == checks_ok + stale_dropped + check_errors`
/// - `poll` mode: `checks_ok + policy_hits + policy_coalesced == hits +
///   coalesced` (every successful check serves exactly one response, and
///   nothing with dependencies is served unchecked);
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
                self.checks_ok + self.policy_hits + self.policy_coalesced == self.hits + self.coalesced,
                format!(
                    "poll: checks_ok {} + policy_hits {} + policy_coalesced {} != hits {} + coalesced {}",
                    self.checks_ok, self.policy_hits, self.policy_coalesced, self.hits, self.coalesced
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

struct State {
    upstreams: Vec<Uri>,
    mode: CacheMode,
    cache: Mutex<Cache>,
    /// The cache's largest object (fixed when it is made).
    object_bytes_max: usize,
    checker: Option<VersionChecker>,
    /// Idle connections to each upstream (by index in `upstreams`).
    connections: Upstreams,
    upstream_timeout: Duration,
    counters: Counters,
    cache_state: Option<CacheStateWriter>,
    clock: SystemClock,
    flights: coalesce::Flights,
    balancing: OnceLock<BalancingState>,
    site: OnceLock<Site>,
    routed: Vec<AtomicU64>,
    /// See [`ProxyOptions::default_authority`].
    default_authority: String,
    /// Keys being revalidated in the background.
    revalidating: Mutex<HashSet<String>>,
    access_log: Option<access_log::AccessLog>,
    refresh: refresh::Refresh,
    /// `--coop`: the cooperative pool behind the cache (see `coop`).
    coop: OnceLock<Arc<coop::CoopLayer>>,
    #[cfg(test)]
    hooks: testkit::Hooks,
}

/// The upstream chosen for one request; tells the balancer the request
/// ended when dropped (also when the request's handling is cancelled).
struct Routed<'a> {
    index: usize,
    balancer: Option<&'a Mutex<Balancer>>,
    /// The upstream's role as read when routing (with a site).
    stamp: Option<RoleStamp>,
}

impl Drop for Routed<'_> {
    fn drop(&mut self) {
        if let Some(Ok(mut balancer)) = self.balancer.map(|b| b.lock()) {
            balancer.completed(self.index, host_monotonic_ns());
        }
    }
}

impl Routed<'_> {
    /// The same guard, owning its hold on the proxy (for a body relayed by
    /// a task of its own).
    fn detach(mut self, state: &Arc<State>) -> InFlight {
        let balanced = self.balancer.take().is_some();
        InFlight { index: self.index, state: balanced.then(|| state.clone()) }
    }
}

/// A [`Routed`] whose forward outlives the request's handler: tells the
/// balancer the forward ended when dropped.
struct InFlight {
    index: usize,
    /// Set only when the proxy balances.
    state: Option<Arc<State>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let balancer = self.state.as_ref().and_then(|state| state.balancing.get()).map(|b| b.balancer.lock());
        if let Some(Ok(mut balancer)) = balancer {
            balancer.completed(self.index, host_monotonic_ns());
        }
    }
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Hop-by-hop fields (RFC 9110 §7.6.1): never forwarded, never stored.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The fields `headers`' `Connection` field names (hop-by-hop too).
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// Copies every end-to-end field of `from` (not hop-by-hop, not named by
/// `Connection`) into `to`, in order.
fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    let named = connection_named(from);
    for (name, value) in from {
        if !is_hop_by_hop(name) && !named.contains(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// `headers`' end-to-end fields.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut copy = HeaderMap::with_capacity(headers.len());
    copy_end_to_end(headers, &mut copy);
    copy
}

/// The fields of the client's request sent upstream: the end-to-end ones,
/// `Host` included (so an upstream serving several sites knows which).
fn upstream_fields(request: &HeaderMap) -> HeaderMap {
    end_to_end(request)
}

/// The request's conditional fields: a revalidation sends the cache's own
/// validators instead, and answers the client's conditions itself.
const CONDITIONALS: [HeaderName; 5] = [IF_NONE_MATCH, IF_MODIFIED_SINCE, IF_MATCH, IF_UNMODIFIED_SINCE, IF_RANGE];

/// The primary cache key: the authority the client asked for (the request
/// target's, else `Host`, else `default`), lowercased, then the target
/// (path and query) as sent.
fn cache_key(uri: &Uri, headers: &HeaderMap, default: &str) -> String {
    let authority = uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()))
        .unwrap_or(default);
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut key = String::with_capacity(authority.len() + target.len());
    key.push_str(authority);
    key.make_ascii_lowercase();
    key.push_str(target);
    key
}

/// The target part of a cache key (authorities hold no `/`).
fn target_of(key: &str) -> &str {
    key.bytes().position(|b| b == b'/').map_or(key, |at| &key[at..])
}

/// The key a coalesced fetch is shared under: the cache key and the
/// request's credentials, so a fetch is never shared across them.
fn flight_key(key: &str, headers: &HeaderMap) -> String {
    match headers.get(AUTHORIZATION) {
        Some(credentials) => format!("{key}\n{}", String::from_utf8_lossy(credentials.as_bytes())),
        None => key.to_string(),
    }
}

/// An unsafe method (RFC 9110 §9.2.1): its success invalidates (§4.4).
fn is_unsafe(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

/// Does the stored response satisfy the client's `If-None-Match` or
/// `If-Modified-Since` (RFC 9110 §13.1.2, §13.1.3; weak comparison)?
fn client_not_modified(entry: &Entry, request: &HeaderMap) -> bool {
    // One pass over the request's names first: most requests carry no
    // condition, and comparing names is cheaper than two hashed lookups.
    if entry.status != StatusCode::OK || !request.keys().any(|name| name == IF_NONE_MATCH || name == IF_MODIFIED_SINCE)
    {
        return false;
    }
    let mut inm = request.get_all(IF_NONE_MATCH).iter().peekable();
    if inm.peek().is_some() {
        let Some(etag) = entry.headers.get(ETAG) else { return false };
        let opaque = |tag: &[u8]| -> Vec<u8> { tag.strip_prefix(b"W/").unwrap_or(tag).to_vec() };
        let stored = opaque(etag.as_bytes());
        return inm.filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|candidate| {
            let candidate = candidate.trim();
            candidate == "*" || opaque(candidate.as_bytes()) == stored
        });
    }
    let Some(since) = policy::date_field(request, IF_MODIFIED_SINCE) else { return false };
    let modified =
        policy::date_field(&entry.headers, LAST_MODIFIED).or_else(|| policy::date_field(&entry.headers, DATE));
    modified.is_some_and(|modified| modified <= since)
}

/// The fields a 304 repeats from the 200 it stands for (RFC 9110 §15.4.5).
const NOT_MODIFIED_FIELDS: [HeaderName; 6] = [CACHE_CONTROL, CONTENT_LOCATION, DATE, ETAG, EXPIRES, VARY];

/// Answers a request from `entry`: a 304 if the client's conditions hold,
/// else the stored status, every stored field and the body (none for
/// HEAD), with `Age` and `X-Cache: <label>`.
fn respond(entry: &Entry, request: &HeaderMap, method: &Method, now: u64, label: &'static str) -> Response<Body> {
    let mut response = if client_not_modified(entry, request) {
        let mut response = Response::new(Body::default());
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        let headers = response.headers_mut();
        for name in NOT_MODIFIED_FIELDS.iter().chain([&LAST_MODIFIED]) {
            for value in entry.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        response
    } else {
        let body = if *method == Method::HEAD { Body::default() } else { Full::new(entry.body.clone()) };
        let mut response = Response::new(body);
        *response.status_mut() = entry.status;
        let reply = entry.reply.get_or_init(|| {
            // `Age` and `X-Cache` first (an origin's own replaced), so a
            // hit finds them by walking two fields, not by two lookups.
            let mut fields = HeaderMap::with_capacity(entry.headers.len() + 2);
            fields.insert(AGE, HeaderValue::from_static("0"));
            fields.insert(X_CACHE_NAME, HeaderValue::from_static("HIT"));
            for (name, value) in &entry.headers {
                if name != AGE && name != X_CACHE_NAME {
                    fields.append(name, value.clone());
                }
            }
            fields
        });
        let mut headers = reply.clone();
        let (mut age, mut cache) = (false, false);
        for (name, value) in headers.iter_mut() {
            if name == AGE {
                *value = age_value(entry.freshness.age(now));
                age = true;
            } else if name == X_CACHE_NAME {
                *value = HeaderValue::from_static(label);
                cache = true;
            }
            if age && cache {
                break;
            }
        }
        debug_assert!(age && cache, "the reply map holds Age and X-Cache");
        *response.headers_mut() = headers;
        return response;
    };
    let headers = response.headers_mut();
    headers.insert(AGE, age_value(entry.freshness.age(now)));
    headers.insert(X_CACHE_NAME, HeaderValue::from_static(label));
    response
}

/// The `Age` field's value for `age` seconds; the first ages are built
/// once, so a hit's answer does not allocate one.
fn age_value(age: u64) -> HeaderValue {
    const BUILT: usize = 1024;
    static AGES: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let ages = AGES.get_or_init(|| {
        // One string holding every built age, kept for the process's life:
        // values from it are static, so cloning one touches no counter.
        let digits: &'static str = Box::leak((0..BUILT).map(|a| a.to_string()).collect::<String>().into_boxed_str());
        let mut at = 0;
        (0..BUILT)
            .map(|a| {
                let len = a.to_string().len();
                let value = HeaderValue::from_static(&digits[at..at + len]);
                at += len;
                value
            })
            .collect()
    });
    match usize::try_from(age).ok().and_then(|a| ages.get(a)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(age),
    }
}

impl State {
    /// Chooses the upstream for `key`, never one in `avoid` (upstreams
    /// that refused this request's connection), or the response refusing it.
    async fn route(&self, key: &str, avoid: &[usize]) -> Result<Routed<'_>, Response<Body>> {
        let upstreams = self.upstreams.len();
        let Some(balancing) = self.balancing.get() else {
            // FNV-1a: stable across runs, so a document keeps its upstream;
            // past an avoided one, the next in order.
            let first = (fnv1a(key) % upstreams as u64) as usize;
            let Some(index) = (0..upstreams).map(|k| (first + k) % upstreams).find(|i| !avoid.contains(i)) else {
                return Err(text(StatusCode::BAD_GATEWAY, "every application server refused the connection\n"));
            };
            return Ok(self.routed(Routed { index, balancer: None, stamp: None }));
        };
        if let Some(source) = &balancing.source {
            let started = Instant::now();
            let readings = read_loads(source).await;
            self.counters.monitor_reads.fetch_add(readings.len() as u64, Ordering::Relaxed);
            self.counters.monitor_read_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
            let Ok(mut balancer) = balancing.balancer.lock() else { return Err(poisoned()) };
            for (index, reading) in readings.iter().enumerate() {
                balancer.observe(index, reading);
            }
        }
        // Each upstream's role, read one-sidedly: only this site's are
        // eligible, and the request carries the role it was routed by.
        let stamps: Vec<Option<RoleStamp>> = match self.site.get() {
            Some(site) => site
                .roles
                .iter()
                .map(|region| read_role(region.as_ref()).ok().map(|view| RoleStamp::of(view.role)))
                .collect(),
            None => Vec::new(),
        };
        let Ok(mut balancer) = balancing.balancer.lock() else { return Err(poisoned()) };
        if let Some(site) = self.site.get() {
            for (index, stamp) in stamps.iter().enumerate() {
                balancer.set_member(index, stamp.is_some_and(|s| s.site == site.site));
            }
        }
        let decision = match balancer.choose(key) {
            // The balancer's choice refused this request's connection: the
            // next upstream in order that is eligible (of this site, if any).
            Decision::Route(chosen) if avoid.contains(&chosen) => {
                let eligible = |i: &usize| {
                    !avoid.contains(i)
                        && self.site.get().is_none_or(|site| {
                            stamps.get(*i).copied().flatten().is_some_and(|stamp| stamp.site == site.site)
                        })
                };
                match (1..upstreams).map(|k| (chosen + k) % upstreams).find(eligible) {
                    Some(index) => Decision::Route(index),
                    None => {
                        return Err(text(StatusCode::BAD_GATEWAY, "every application server refused the connection\n"))
                    }
                }
            }
            decision => decision,
        };
        match decision {
            Decision::Route(index) => {
                balancer.dispatched(index, host_monotonic_ns());
                let stamp = stamps.get(index).copied().flatten();
                Ok(self.routed(Routed { index, balancer: Some(&balancing.balancer), stamp }))
            }
            Decision::Overloaded => {
                self.counters.refused_overloaded.fetch_add(1, Ordering::Relaxed);
                Err(text(StatusCode::SERVICE_UNAVAILABLE, "every application server is at its admission bound\n"))
            }
            Decision::NoBackend => {
                self.counters.refused_no_backend.fetch_add(1, Ordering::Relaxed);
                Err(text(StatusCode::SERVICE_UNAVAILABLE, "no application server is alive\n"))
            }
        }
    }

    fn routed<'a>(&self, routed: Routed<'a>) -> Routed<'a> {
        if let Some(count) = self.routed.get(routed.index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        routed
    }

    /// Looks `key` up for `request` (its variant, §4.1), noting the
    /// request for the wasted-update metric.
    fn cache_lookup(&self, key: &str, request: &HeaderMap, fingerprint: u64) -> Option<Arc<Entry>> {
        let mut cache = self.cache.lock().ok()?;
        cache.waste.on_request(fingerprint);
        cache.get(key, request)
    }

    /// Drops `key` with all its variants; true if it was cached.
    fn cache_remove(&self, key: &str) -> bool {
        if let Some(coop) = self.coop.get() {
            coop.invalidate(key);
        }
        let Ok(mut cache) = self.cache.lock() else { return false };
        let removed = cache.remove(key);
        if removed {
            self.set_resident(fingerprint(target_of(key)), false);
        }
        removed
    }

    /// Removes `entry` from under `key` if it is still cached there (a copy
    /// that failed its check; a newer one cached meanwhile stays).
    fn cache_remove_entry(&self, key: &str, entry: &Arc<Entry>) {
        if let Some(coop) = self.coop.get() {
            coop.invalidate(key);
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.remove_entry(key, entry) {
                self.set_resident(fingerprint(target_of(key)), false);
            }
        }
    }

    /// Caches `entry` under `key`, keeping the cache state's residency
    /// flags in step (under the cache's lock, so they follow its order).
    /// `None` if the cache is unusable (a poisoned lock).
    fn cache_store(&self, key: &str, entry: Arc<Entry>) -> Option<InsertOutcome> {
        if let Some(coop) = self.coop.get() {
            coop.store(key, &entry);
        }
        let Ok(mut cache) = self.cache.lock() else { return None };
        let inserted = cache.insert(key.to_string(), entry);
        for evicted in &inserted.evicted {
            self.set_resident(fingerprint(target_of(evicted)), false);
        }
        if inserted.outcome == InsertOutcome::Stored {
            self.set_resident(fingerprint(target_of(key)), true);
        }
        Some(inserted.outcome)
    }

    fn set_resident(&self, fingerprint: u64, resident: bool) {
        if let Some(writer) = &self.cache_state {
            writer.set_resident(fingerprint, resident);
        }
    }

    /// Records a request in the shared cache state.
    fn note_access(&self, fingerprint: u64, resident: bool) {
        if let Some(writer) = &self.cache_state {
            writer.record_access(fingerprint, resident, self.clock.now_ns());
        }
    }

    /// Serves the proxy's own cached copy (counted by the caller's check).
    fn hit(&self, entry: &Entry, request: &HeaderMap, method: &Method, now: u64) -> Response<Body> {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        if entry.deps.is_none() {
            self.counters.policy_hits.fetch_add(1, Ordering::Relaxed);
        }
        if entry.pushed {
            self.counters.push_hits.fetch_add(1, Ordering::Relaxed);
        }
        let response = respond(entry, request, method, now, "HIT");
        if response.status() == StatusCode::NOT_MODIFIED {
            self.counters.not_modified.fetch_add(1, Ordering::Relaxed);
        }
        response
    }

    /// Serves another request's fetch, validated: a miss for this client
    /// (nothing was cached for it), marked as coalesced.
    fn serve_shared(&self, entry: &Entry, request: &HeaderMap, now: u64) -> Response<Body> {
        let mut response = respond(entry, request, &Method::GET, now, "MISS");
        response.headers_mut().insert(X_CACHE_COALESCED, HeaderValue::from_static("1"));
        response
    }

    /// Is the cached copy still current? Counts and times the check.
    async fn validate(&self, entry: &Entry) -> bool {
        let (Some(checker), Some(deps)) = (&self.checker, &entry.deps) else { return false };
        let started = Instant::now();
        let verdict = checker.is_current(deps).await;
        #[cfg(test)]
        self.hooks.after_check().await;
        let ns = elapsed_ns(started);
        self.counters.checks.fetch_add(1, Ordering::Relaxed);
        self.counters.check_ns.fetch_add(ns, Ordering::Relaxed);
        self.counters.check_latency.record(ns);
        match verdict {
            Ok(true) => {
                self.counters.checks_ok.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(false) => {
                self.counters.stale_dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(e) => {
                // Fail closed: a copy we cannot validate is never served.
                self.counters.check_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "version check failed; forwarding");
                false
            }
        }
    }

    fn stats(&self) -> ProxyStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        let (cached_entries, cached_bytes, evictions, wasted_updates) = self
            .cache
            .lock()
            .map(|cache| (cache.len() as u64, cache.bytes() as u64, cache.evictions(), cache.waste.wasted()))
            .unwrap_or_default();
        ProxyStats {
            mode: Some(self.mode),
            requests: load(&c.requests),
            hits: load(&c.hits),
            misses: load(&c.misses),
            checks: load(&c.checks),
            checks_ok: load(&c.checks_ok),
            check_ns: load(&c.check_ns),
            stale_dropped: load(&c.stale_dropped),
            check_errors: load(&c.check_errors),
            upstream_ns: load(&c.upstream_ns),
            upstream_errors: load(&c.upstream_errors),
            upstream_retries: load(&c.upstream_retries),
            uncacheable_deps: load(&c.uncacheable_deps),
            coalesced: load(&c.coalesced),
            waiting_on_fetch: load(&c.waiting_on_fetch),
            abandoned: load(&c.abandoned),
            cached_entries,
            cached_bytes,
            evictions,
            pushes_received: load(&c.pushes_received),
            pushes_installed: load(&c.pushes_installed),
            push_bytes: load(&c.push_bytes),
            pushes_redundant: load(&c.pushes_redundant),
            pushes_stale: load(&c.pushes_stale),
            pushes_refused: load(&c.pushes_refused),
            push_hits: load(&c.push_hits),
            wasted_updates,
            cache_state_slots: self.cache_state.as_ref().map_or(0, |w| u64::from(w.slots())),
            cache_state_dropped: self.cache_state.as_ref().map_or(0, |w| w.dropped()),
            balance: self.balancing.get().and_then(|b| b.balancer.lock().ok().map(|b| b.config().policy)),
            monitor: self.balancing.get().and_then(|b| b.source.as_ref().map(|s| s.scheme())),
            routed: self.routed.iter().map(load).collect(),
            refused_overloaded: load(&c.refused_overloaded),
            refused_no_backend: load(&c.refused_no_backend),
            monitor_reads: load(&c.monitor_reads),
            monitor_read_ns: load(&c.monitor_read_ns),
            site: self.site.get().map(|s| s.site),
            fenced: load(&c.fenced),
            not_modified: load(&c.not_modified),
            stale_served: load(&c.stale_served),
            revalidations: load(&c.revalidations),
            revalidated: load(&c.revalidated),
            invalidations: load(&c.invalidations),
            purges: load(&c.purges),
            upstream_bytes: load(&c.upstream_bytes),
            policy_hits: load(&c.policy_hits),
            policy_coalesced: load(&c.policy_coalesced),
            refresh_reads: load(&self.refresh.reads),
            refresh_refetches: load(&self.refresh.refetches),
            refresh_installed: load(&self.refresh.installed),
        }
    }
}

fn poisoned() -> Response<Body> {
    text(StatusCode::INTERNAL_SERVER_ERROR, "the balancer's lock was poisoned\n")
}

/// Every upstream's load as `source` reads it. Socket-Sync asks each back
/// end over TCP and waits for its answer: on a blocking thread, so the
/// proxy's other requests go on. The other schemes return at once (the
/// latest pushed frame, or a one-sided read of registered memory).
async fn read_loads(source: &Arc<dyn LoadSource>) -> Vec<tierstack_monitor::Reading> {
    let read_all = |source: &dyn LoadSource| (0..source.len()).map(|i| source.read(i)).collect::<Vec<_>>();
    if source.scheme() == Scheme::SocketSync {
        let source = source.clone();
        let readings: Result<Vec<_>, _> = tokio::task::spawn_blocking(move || read_all(source.as_ref())).await;
        readings.unwrap_or_default()
    } else {
        read_all(source.as_ref())
    }
}

/// `GET` on the admin listener: the cooperative pool's counters as JSON
/// (`null` without `--coop`).
pub const COOP_STATS_PATH: &str = "/_tierstack/coop";

/// `DELETE <prefix><authority><target>` on the admin listener drops that
/// object (every variant).
pub const PURGE_PATH_PREFIX: &str = "/_tierstack/purge/";

/// Where every admin endpoint lives; the client listener refuses these paths.
const ADMIN_PATH_PREFIX: &str = "/_tierstack/";

/// The admin listener's requests: the counters, the push endpoint, and
/// `DELETE /_tierstack/purge/<authority><target>` dropping one object.
async fn handle_admin(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path();
    if path == "/_tierstack/stats" {
        let mut response = text(StatusCode::OK, serde_json::to_string(&state.stats()).unwrap_or_default());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    if path == COOP_STATS_PATH {
        let stats = state.coop.get().map(|c| c.stats());
        let mut response = text(StatusCode::OK, serde_json::to_string(&stats).unwrap_or_default());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    if path == "/metrics" {
        let mut response = text(StatusCode::OK, metrics::render(&state.stats(), &state.counters.check_latency));
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
        return response;
    }
    if let Some(name) = path.strip_prefix(PUSH_PATH_PREFIX) {
        let path = format!("/doc/{name}");
        return push::receive(&state, request, path).await;
    }
    if let Some(rest) = request.uri().path_and_query().and_then(|p| p.as_str().strip_prefix(PURGE_PATH_PREFIX)) {
        if request.method() != Method::DELETE {
            return text(StatusCode::METHOD_NOT_ALLOWED, "purges use DELETE\n");
        }
        // <authority>/<target>, e.g. /_tierstack/purge/www.example.com/a?b
        let key = match rest.find('/') {
            Some(at) => format!("{}{}", rest[..at].to_ascii_lowercase(), &rest[at..]),
            None => return text(StatusCode::BAD_REQUEST, "purge /_tierstack/purge/<authority>/<target>\n"),
        };
        return if state.cache_remove(&key) {
            state.counters.purges.fetch_add(1, Ordering::Relaxed);
            text(StatusCode::OK, format!("purged {key}\n"))
        } else {
            text(StatusCode::NOT_FOUND, format!("{key} is not cached\n"))
        };
    }
    if path == tierstack_tier_http::HEALTHZ_PATH {
        return tierstack_tier_http::alive();
    }
    if path == tierstack_tier_http::READYZ_PATH {
        return readiness(&state).await;
    }
    text(StatusCode::NOT_FOUND, format!("no admin endpoint {path}\n"))
}

/// How long `/readyz` waits for each upstream's own `/readyz`.
const READYZ_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(1);

/// `/readyz`: ready once at least one upstream answers its own `/readyz`
/// with 200 (an application server is ready while its module answers).
/// The fabric node, needed in poll mode, is attached before the proxy
/// serves at all.
async fn readiness(state: &State) -> Response<Body> {
    let mut failures = Vec::new();
    for (index, upstream) in state.upstreams.iter().enumerate() {
        let Some(uri) = upstream_uri(upstream, tierstack_tier_http::READYZ_PATH) else {
            failures.push(format!("{upstream}: unusable URL"));
            continue;
        };
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = uri;
        match tokio::time::timeout(READYZ_UPSTREAM_TIMEOUT, state.connections.request(index, request)).await {
            Ok(Ok(response)) if response.status() == StatusCode::OK => {
                return tierstack_tier_http::readiness(&[("upstreams", Ok(()))])
            }
            Ok(Ok(response)) => failures.push(format!("{upstream}: status {}", response.status())),
            Ok(Err(e)) => failures.push(format!("{upstream}: {e}")),
            Err(_) => failures.push(format!("{upstream}: no answer within {READYZ_UPSTREAM_TIMEOUT:?}")),
        }
    }
    tierstack_tier_http::readiness(&[("upstreams", Err(format!("none ready ({})", failures.join("; "))))])
}

/// A request not yet classified as a hit, coalesced or a miss; counted as
/// abandoned if its handling is dropped (cancelled) before it is.
struct Unserved<'a> {
    abandoned: &'a AtomicU64,
    pending: bool,
}

impl Drop for Unserved<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One request in the `waiting_on_fetch` gauge, until it is dropped (also
/// when its handling is cancelled mid-wait).
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn start(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The client listener's requests.
async fn handle<B>(state: Arc<State>, request: Request<B>) -> Response<ProxyBody>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if request.uri().path().starts_with(ADMIN_PATH_PREFIX) {
        return text(StatusCode::NOT_FOUND, "admin endpoints are served on the proxy's admin listener only\n")
            .map(Into::into);
    }
    state.counters.requests.fetch_add(1, Ordering::Relaxed);
    // Counts the request as abandoned unless it gets classified first.
    let mut unserved = Unserved { abandoned: &state.counters.abandoned, pending: true };
    let method = request.method().clone();
    let key = cache_key(request.uri(), request.headers(), &state.default_authority);
    let readable = method == Method::GET || method == Method::HEAD;
    // Range requests pass through (never answered from, nor stored in, the
    // cache): see ARCHITECTURE.md.
    if !readable || state.mode == CacheMode::NoCache || request.headers().keys().any(|name| name == RANGE) {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        // On the heap (here and below): a miss's state (request and response
        // heads, the tee, the upstream call) held inline made every
        // request's future, hits' too, 2,880 bytes instead of 1,376 (moved a
        // few times between the handler and hyper's dispatcher).
        return Box::pin(forward(&state, request, &key, None)).await;
    }
    let now = policy::now_secs();
    // Parsed only when a freshness decision needs it (not on a hit of a
    // response with dependencies).
    let request_cc = OnceLock::new();
    let request_cc = || request_cc.get_or_init(|| policy::request_directives(request.headers()));
    let fingerprint = fingerprint(target_of(&key));
    let mut stale = None;
    if let Some(entry) = state.cache_lookup(&key, request.headers(), fingerprint) {
        if entry.deps.is_some() {
            state.refresh.note(&key, request.headers());
            if state.mode == CacheMode::Ttl || state.validate(&entry).await {
                state.note_access(fingerprint, true);
                unserved.pending = false;
                return state.hit(&entry, request.headers(), &method, now).map(Into::into);
            }
            // Out of date: dropped here (unless a newer copy replaced it
            // meanwhile), fetched below and cached again.
            state.cache_remove_entry(&key, &entry);
        } else {
            match entry.freshness.usable(request_cc(), now) {
                Usable::Fresh => {
                    state.note_access(fingerprint, true);
                    unserved.pending = false;
                    return state.hit(&entry, request.headers(), &method, now).map(Into::into);
                }
                Usable::StaleWhileRevalidate => {
                    state.counters.stale_served.fetch_add(1, Ordering::Relaxed);
                    revalidate_in_background(&state, &key, request.headers(), &entry);
                    state.note_access(fingerprint, true);
                    unserved.pending = false;
                    return state.hit(&entry, request.headers(), &method, now).map(Into::into);
                }
                Usable::Revalidate => stale = Some(entry),
            }
        }
    }
    // `--coop`: the cooperative pool, under the same rules as our own copy
    // (a copy with dependencies only after the version check).
    if let (None, Some(coop)) = (&stale, state.coop.get()) {
        if let Some((entry, source)) = coop.fetch(&key).await {
            let usable = entry.vary.matches(request.headers())
                && match entry.deps {
                    Some(_) => state.mode == CacheMode::Ttl || state.validate(&entry).await,
                    None => entry.freshness.usable(request_cc(), now) == Usable::Fresh,
                };
            if usable {
                coop.served(source);
                state.note_access(fingerprint, true);
                unserved.pending = false;
                return state.hit(&entry, request.headers(), &method, now).map(Into::into);
            }
            coop.unusable();
            if entry.deps.is_some() {
                // Out of date everywhere: every copy goes.
                coop.invalidate(&key);
            }
        }
    }
    state.note_access(fingerprint, false);
    if request_cc().only_if_cached {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        return text(StatusCode::GATEWAY_TIMEOUT, "not cached, and the request asked only-if-cached\n").map(Into::into);
    }
    if let Some(entry) = stale {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        let request_cc = request_cc().clone();
        return Box::pin(revalidate(&state, request, &key, entry, &request_cc)).await.map(Into::into);
    }
    // Concurrent misses of one document share one upstream fetch; each
    // waiter checks the result is its own variant, and validates it itself
    // before serving it (see `coalesce`).
    if method == Method::GET {
        match state.flights.join(&flight_key(&key, request.headers())) {
            coalesce::Role::Waiter(flight) => {
                let waiting = Waiting::start(&state.counters.waiting_on_fetch);
                let outcome = coalesce::outcome(flight).await;
                drop(waiting);
                if let Some(entry) = outcome.filter(|entry| entry.vary.matches(request.headers())) {
                    let now = policy::now_secs();
                    let usable = match entry.deps {
                        Some(_) => state.mode == CacheMode::Ttl || state.validate(&entry).await,
                        None => entry.freshness.usable(request_cc(), now) == Usable::Fresh,
                    };
                    if usable {
                        state.counters.coalesced.fetch_add(1, Ordering::Relaxed);
                        if entry.deps.is_none() {
                            state.counters.policy_coalesced.fetch_add(1, Ordering::Relaxed);
                        }
                        unserved.pending = false;
                        return state.serve_shared(&entry, request.headers(), now).map(Into::into);
                    }
                }
            }
            coalesce::Role::Leader(leader) => {
                state.counters.misses.fetch_add(1, Ordering::Relaxed);
                unserved.pending = false;
                // The leader finishes the flight once the body is stored.
                return Box::pin(forward(&state, request, &key, Some(leader))).await;
            }
        }
    }
    state.counters.misses.fetch_add(1, Ordering::Relaxed);
    unserved.pending = false;
    Box::pin(forward(&state, request, &key, None)).await
}

/// An upstream response, its body read, and when it was asked for and
/// received (seconds since the epoch, for its age).
struct Fetched {
    parts: hyper::http::response::Parts,
    body: Bytes,
    request_time: u64,
    response_time: u64,
}

impl Fetched {
    /// The response to the client: status, end-to-end fields, body.
    fn into_response(self) -> Response<Body> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.parts.status;
        copy_end_to_end(&self.parts.headers, response.headers_mut());
        response.headers_mut().insert(X_CACHE_NAME, HeaderValue::from_static("MISS"));
        response
    }
}

/// Sends `method target` with `headers` (end-to-end already) and `body` to
/// the upstream chosen for `target`; the response read whole, or the
/// error response to give the client (502 unreachable, 504 too slow, 503
/// refused).
async fn fetch(
    state: &State,
    method: &Method,
    target: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Fetched, Response<Body>> {
    // `_routed` lives until the body is read.
    let (response, started, request_time, _routed) = send(state, method, target, headers, body).await?;
    let upstream_error = |response: Response<Body>| {
        state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
        response
    };
    let (parts, body) = response.into_parts();
    let body = match tokio::time::timeout(state.upstream_timeout, collect_limited(body, RESPONSE_BODY_BYTES_MAX)).await
    {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            return Err(upstream_error(text(StatusCode::BAD_GATEWAY, format!("application server response: {e}\n"))))
        }
        Err(_) => {
            return Err(upstream_error(text(StatusCode::GATEWAY_TIMEOUT, "application server response timed out\n")))
        }
    };
    state.counters.upstream_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
    state.counters.upstream_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    Ok(Fetched { parts, body, request_time, response_time: policy::now_secs() })
}

/// Sends the request upstream and waits for the response's head (the
/// body still to read); also when it was sent (for its time and age), and
/// the upstream it went to: the caller holds that until the body is read,
/// so the balancer counts the forward in flight until then.
async fn send<'a>(
    state: &'a State,
    method: &Method,
    target: &str,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<(Response<PooledBody>, Instant, u64, Routed<'a>), Response<Body>> {
    let mut attempt = 0;
    // Upstreams that refused this request (as nginx's `proxy_next_upstream
    // error`): each is tried at most once.
    let mut refused: Vec<usize> = Vec::new();
    let request_time = policy::now_secs();
    let (started, response, routed) = loop {
        attempt += 1;
        let routed = state.route(target, &refused).await?;
        let Some(uri) = upstream_uri(&state.upstreams[routed.index], target) else {
            return Err(text(StatusCode::BAD_REQUEST, "unusable request target\n"));
        };
        // The fields are copied only if this attempt may be followed by
        // another (another upstream, or a fenced request routed again);
        // else the last attempt takes them.
        let may_repeat =
            refused.len() + 1 < state.upstreams.len() || (routed.stamp.is_some() && attempt < FENCED_ATTEMPTS_MAX);
        let fields = if may_repeat { headers.clone() } else { std::mem::take(&mut headers) };
        let mut upstream_request = Request::new(Full::new(body.clone()));
        *upstream_request.method_mut() = method.clone();
        *upstream_request.uri_mut() = uri;
        *upstream_request.headers_mut() = fields;
        if let Some(stamp) = routed.stamp {
            if let Ok(value) = HeaderValue::from_str(&stamp.to_header()) {
                upstream_request.headers_mut().insert(ROLE_HEADER, value);
            }
        }
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(state.upstream_timeout, state.connections.request(routed.index, upstream_request))
                .await;
        if let Ok(Err(e)) = &outcome {
            if may_retry_elsewhere(e, method) && refused.len() + 1 < state.upstreams.len() {
                state.counters.upstream_retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(upstream = routed.index, error = %e, "upstream refused; trying the next");
                refused.push(routed.index);
                continue;
            }
        }
        // The upstream moved to another site after we read its role (the
        // epoch fence refused the request): route it once more.
        if let Ok(Ok(response)) = &outcome {
            if response.status() == StatusCode::MISDIRECTED_REQUEST && routed.stamp.is_some() {
                state.counters.fenced.fetch_add(1, Ordering::Relaxed);
                if attempt < FENCED_ATTEMPTS_MAX {
                    continue;
                }
            }
        }
        break (started, outcome, routed);
    };
    let upstream_error = |response: Response<Body>| {
        state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
        response
    };
    let response = match response {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            return Err(upstream_error(text(StatusCode::BAD_GATEWAY, format!("application server unreachable: {e}\n"))))
        }
        Err(_) => {
            return Err(upstream_error(text(
                StatusCode::GATEWAY_TIMEOUT,
                "application server did not answer in time\n",
            )))
        }
    };
    Ok((response, started, request_time, routed))
}

/// The origin-form URI of `target` (a path and query) at `upstream`: the
/// upstream's path without a trailing `/`, then the target. `None` if that
/// is no URI.
fn upstream_uri(upstream: &Uri, target: &str) -> Option<Uri> {
    let prefix = upstream.path().trim_end_matches('/');
    if prefix.is_empty() && target.starts_with('/') {
        // The common case: no prefix to keep, so no string to format.
        return target.parse().ok();
    }
    let uri: Uri = format!("{prefix}{target}").parse().ok()?;
    // Only a path and query: anything else would be sent as it is.
    (uri.scheme().is_none() && uri.authority().is_none() && uri.path().starts_with('/')).then_some(uri)
}

/// May a request that failed with `error` go to another upstream? If the
/// connection was never made (refused, unreachable): the request was not
/// sent, so any method. If the connection broke before a whole response head
/// arrived: only an idempotent method (RFC 9110 §9.2.2), which may have
/// been processed but may be repeated.
fn may_retry_elsewhere(error: &UpstreamError, method: &Method) -> bool {
    if error.is_connect() {
        return true;
    }
    let idempotent =
        matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE);
    idempotent && error.is_incomplete_message()
}

/// Forwards to the upstream and streams the answer back as it arrives. A
/// GET's answer no larger than the cache's per-object limit is teed into a
/// buffer and, once whole, stored if it may be (the flight's `leader`, if
/// any, then hands it to its waiters); a larger one streams through
/// uncached. An unsafe method's success invalidates (§4.4).
async fn forward<B>(
    state: &Arc<State>,
    request: Request<B>,
    key: &str,
    leader: Option<coalesce::Leader>,
) -> Response<ProxyBody>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let body = match collect_limited(body, REQUEST_BODY_BYTES_MAX).await {
        Ok(body) => body,
        Err(e) => return text(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}\n")).map(Into::into),
    };
    let (response, started, request_time, routed) =
        match send(state, &parts.method, target_of(key), upstream_fields(&parts.headers), body).await {
            Ok(sent) => sent,
            Err(response) => return response.map(Into::into),
        };
    let (head, mut upstream_body) = response.into_parts();
    let response_time = policy::now_secs();
    if is_unsafe(&parts.method) && (head.status.is_success() || head.status.is_redirection()) {
        invalidate(state, key, &head.headers);
    }
    let declared = head
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let object_max = state.object_bytes_max;
    // The pool takes what the proxy's own cache may not (`--cache-bytes 0`).
    let object_max = object_max.max(state.coop.get().map_or(0, |_| coop::OBJECT_BYTES_MAX));
    let mut tee = (parts.method == Method::GET
        && state.mode != CacheMode::NoCache
        && !parts.headers.contains_key(RANGE)
        && declared.is_none_or(|length| length <= object_max))
    .then(bytes::BytesMut::new);
    let mut response = Response::new(ProxyBody::Whole(Body::default()));
    *response.status_mut() = head.status;
    // The end-to-end fields, filtered once: the client's response takes
    // them (and `X-Cache`, room reserved), a stored copy is a clone.
    let mut fields = HeaderMap::with_capacity(head.headers.len() + 1);
    copy_end_to_end(&head.headers, &mut fields);
    let stored_fields = tee.is_some().then(|| fields.clone());
    fields.insert(X_CACHE_NAME, HeaderValue::from_static("MISS"));
    *response.headers_mut() = fields;
    // A body of a declared length up to WHOLE_BYTES_MAX, or whole in its
    // first frame, is answered at once, as one response, without a
    // relaying task: relaying many small frames costs more than it saves.
    let deadline = tokio::time::Instant::now() + state.upstream_timeout;
    let small = declared.is_some_and(|length| length <= WHOLE_BYTES_MAX);
    let first = if small {
        match tokio::time::timeout_at(deadline, collect_limited(&mut upstream_body, WHOLE_BYTES_MAX)).await {
            Ok(Ok(body)) => Some(body),
            Ok(Err(e)) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_GATEWAY, format!("application server response: {e}\n")).map(Into::into);
            }
            Err(_) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::GATEWAY_TIMEOUT, "application server response timed out\n").map(Into::into);
            }
        }
    } else {
        use http_body_util::BodyExt;
        match tokio::time::timeout_at(deadline, upstream_body.frame()).await {
            Ok(Some(Ok(frame))) => Some(frame.into_data().unwrap_or_default()),
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_GATEWAY, format!("application server response: {e}\n")).map(Into::into);
            }
            Err(_) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::GATEWAY_TIMEOUT, "application server response timed out\n").map(Into::into);
            }
        }
    };
    if small || first.is_none() || hyper::body::Body::is_end_stream(&upstream_body) {
        let body = first.unwrap_or_default();
        let storable = tee.is_some() && body.len() <= object_max;
        let finish = Finish {
            state: state.clone(),
            key: key.to_string(),
            status: head.status,
            headers: stored_fields.unwrap_or_default(),
            request_headers: storable.then_some(parts.headers),
            leader,
            request_time,
            response_time,
            started,
        };
        let received = body.len() as u64;
        finish.store(storable.then(|| body.clone()), received);
        *response.body_mut() = ProxyBody::Whole(Full::new(body));
        return response;
    }
    // The balancer counts this forward in flight until its body is relayed.
    let in_flight = routed.detach(state);
    let (sender, receiver) = tokio::sync::mpsc::channel(stream::STREAM_FRAMES);
    *response.body_mut() = ProxyBody::Streamed(receiver);
    let (state, key, request_headers) = (state.clone(), key.to_string(), tee.as_ref().map(|_| parts.headers));
    let mut finish = Some(Finish {
        state,
        key,
        status: head.status,
        headers: stored_fields.unwrap_or_default(),
        request_headers,
        leader,
        request_time,
        response_time,
        started,
    });
    tokio::spawn(async move {
        use http_body_util::BodyExt;
        let _in_flight = in_flight;
        let Some(state) = finish.as_ref().map(|f| f.state.clone()) else { return };
        let mut received = 0u64;
        let mut pending = first;
        loop {
            let frame = match pending.take() {
                Some(data) => Ok(Some(Ok(hyper::body::Frame::data(data)))),
                None => tokio::time::timeout_at(deadline, upstream_body.frame()).await,
            };
            let frame = match frame {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => {
                    if let Some(finish) = finish.take() {
                        finish.store(tee.take().map(bytes::BytesMut::freeze), received);
                    }
                    return;
                }
                Ok(Some(Err(e))) => {
                    state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                    let _ = sender.send(Err(stream::StreamError(e.to_string()))).await;
                    return;
                }
                Err(_) => {
                    state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                    let _ = sender.send(Err(stream::StreamError("timed out".into()))).await;
                    return;
                }
            };
            let Ok(data) = frame.into_data() else { continue };
            received += data.len() as u64;
            if let Some(buffer) = &mut tee {
                if buffer.len() + data.len() > object_max {
                    // Larger than any object the cache takes: through only.
                    tee = None;
                } else {
                    buffer.extend_from_slice(&data);
                }
            }
            // The last part: stored before the client has it all, so its
            // next request finds it.
            if hyper::body::Body::is_end_stream(&upstream_body) {
                if let Some(finish) = finish.take() {
                    finish.store(tee.take().map(bytes::BytesMut::freeze), received);
                }
            }
            if sender.send(Ok(data)).await.is_err() {
                // The client went away: so does this fetch (and its flight).
                return;
            }
        }
    });
    response
}

/// What a streamed miss does once its body is whole.
struct Finish {
    state: Arc<State>,
    key: String,
    status: StatusCode,
    /// The response's end-to-end fields (empty if it is not to be stored).
    headers: HeaderMap,
    /// The client's request fields, if the answer may be stored.
    request_headers: Option<HeaderMap>,
    leader: Option<coalesce::Leader>,
    request_time: u64,
    response_time: u64,
    started: Instant,
}

impl Finish {
    /// Counts the fetch and stores the whole body (if kept); ends the flight.
    fn store(self, body: Option<Bytes>, received: u64) {
        let state = &self.state;
        state.counters.upstream_ns.fetch_add(elapsed_ns(self.started), Ordering::Relaxed);
        state.counters.upstream_bytes.fetch_add(received, Ordering::Relaxed);
        let (Some(body), Some(request_headers)) = (body, self.request_headers) else { return };
        let response = Stored {
            status: self.status,
            headers: self.headers,
            body,
            request_time: self.request_time,
            response_time: self.response_time,
        };
        let stored = store(state, &self.key, &request_headers, response);
        if let Some(leader) = self.leader {
            leader.finish(stored);
        }
    }
}

/// After an unsafe method succeeded: drops the target and the same-origin
/// `Location` and `Content-Location` targets (RFC 9111 §4.4).
fn invalidate(state: &State, key: &str, response: &HeaderMap) {
    let authority = &key[..key.len() - target_of(key).len()];
    let mut removed = u64::from(state.cache_remove(key));
    for field in [LOCATION, CONTENT_LOCATION] {
        let Some(Ok(Ok(uri))) = response.get(field).map(|v| v.to_str().map(|v| v.trim().parse::<Uri>())) else {
            continue;
        };
        let same_origin = match uri.authority() {
            None => uri.path().starts_with('/'),
            Some(other) => other.as_str().eq_ignore_ascii_case(authority),
        };
        if same_origin {
            let target = uri.path_and_query().map_or("/", |p| p.as_str());
            removed += u64::from(state.cache_remove(&format!("{authority}{target}")));
        }
    }
    state.counters.invalidations.fetch_add(removed, Ordering::Relaxed);
}

/// Revalidates the stored `entry` (§4.3): a conditional GET with its
/// validators (unconditional if it has none); a 304 refreshes it and it
/// answers; a new response replaces it; an error answers with it if
/// `stale-if-error` allows.
async fn revalidate<B>(
    state: &Arc<State>,
    request: Request<B>,
    key: &str,
    entry: Arc<Entry>,
    request_cc: &policy::Directives,
) -> Response<Body> {
    let (parts, _) = request.into_parts();
    let outcome = refresh(state, key, &parts.headers, &entry).await;
    let now = policy::now_secs();
    match outcome {
        Refreshed::Entry(fresh) => respond(&fresh, &parts.headers, &parts.method, now, "MISS"),
        Refreshed::Response(fetched) if !fetched.parts.status.is_server_error() => {
            let mut response = fetched.into_response();
            if parts.method == Method::HEAD {
                *response.body_mut() = Body::default();
            }
            response
        }
        Refreshed::Response(_) | Refreshed::Failed(_) if entry.freshness.usable_on_error(request_cc, now) => {
            state.counters.stale_served.fetch_add(1, Ordering::Relaxed);
            respond(&entry, &parts.headers, &parts.method, now, "MISS")
        }
        Refreshed::Response(fetched) => fetched.into_response(),
        Refreshed::Failed(response) => response,
    }
}

/// What a revalidation ended with.
enum Refreshed {
    /// The stored entry, its fields updated by a 304.
    Entry(Arc<Entry>),
    /// A full response from the upstream (stored if it may be).
    Response(Fetched),
    /// No answer (the error response for the client).
    Failed(Response<Body>),
}

/// The conditional request of a revalidation and what its answer does to
/// the cache (§4.3.3, §4.3.4). `request` is the client's: its fields go
/// upstream except its own conditions.
async fn refresh(state: &State, key: &str, request: &HeaderMap, entry: &Arc<Entry>) -> Refreshed {
    let mut headers = upstream_fields(request);
    for name in &CONDITIONALS {
        headers.remove(name);
    }
    for (name, value) in policy::validators(&entry.headers) {
        headers.insert(name, value);
    }
    state.counters.revalidations.fetch_add(1, Ordering::Relaxed);
    let fetched = match fetch(state, &Method::GET, target_of(key), headers.clone(), Bytes::new()).await {
        Ok(fetched) => fetched,
        Err(response) => return Refreshed::Failed(response),
    };
    if fetched.parts.status != StatusCode::NOT_MODIFIED {
        if fetched.parts.status.is_server_error() {
            return Refreshed::Response(fetched);
        }
        if maybe_store(state, key, request, &fetched).is_none() {
            state.cache_remove_entry(key, entry);
        }
        return Refreshed::Response(fetched);
    }
    let update = end_to_end(&fetched.parts.headers);
    if !policy::not_modified_selects(&entry.headers, &update) {
        // A 304 for another representation: ask again, unconditionally.
        for name in &CONDITIONALS {
            headers.remove(name);
        }
        state.counters.revalidations.fetch_add(1, Ordering::Relaxed);
        return match fetch(state, &Method::GET, target_of(key), headers, Bytes::new()).await {
            Ok(fetched) => {
                if maybe_store(state, key, request, &fetched).is_none() {
                    state.cache_remove_entry(key, entry);
                }
                Refreshed::Response(fetched)
            }
            Err(response) => Refreshed::Failed(response),
        };
    }
    state.counters.revalidated.fetch_add(1, Ordering::Relaxed);
    let headers = policy::updated_headers(&entry.headers, &update);
    let freshness =
        policy::storable(&Method::GET, request, entry.status, &headers, fetched.request_time, fetched.response_time);
    let refreshed = Arc::new(Entry {
        status: entry.status,
        body: entry.body.clone(),
        deps: None,
        pushed: false,
        vary: entry.vary.clone(),
        freshness: freshness.unwrap_or(entry.freshness),
        headers,
        reply: OnceLock::new(),
    });
    state.cache_remove_entry(key, entry);
    if freshness.is_ok() {
        state.cache_store(key, refreshed.clone());
    }
    Refreshed::Entry(refreshed)
}

/// Serves stale now and revalidates behind (RFC 5861 `stale-while-
/// revalidate`): one background revalidation per key at a time.
fn revalidate_in_background(state: &Arc<State>, key: &str, request: &HeaderMap, entry: &Arc<Entry>) {
    let Ok(mut revalidating) = state.revalidating.lock() else { return };
    if !revalidating.insert(key.to_string()) {
        return;
    }
    drop(revalidating);
    let (state, key, request, entry) = (state.clone(), key.to_string(), request.clone(), entry.clone());
    tokio::spawn(async move {
        let _ = refresh(&state, &key, &request, &entry).await;
        if let Ok(mut revalidating) = state.revalidating.lock() {
            revalidating.remove(&key);
        }
    });
}

/// Caches a fetched response to `GET key` (the client's `request` fields)
/// if it may be; returns the entry if it is cacheable, for the requests
/// waiting on this fetch (they check and validate it themselves), even
/// when a newer copy already cached was kept instead.
fn maybe_store(state: &State, key: &str, request: &HeaderMap, fetched: &Fetched) -> Option<Arc<Entry>> {
    let response = Stored {
        status: fetched.parts.status,
        headers: end_to_end(&fetched.parts.headers),
        body: fetched.body.clone(),
        request_time: fetched.request_time,
        response_time: fetched.response_time,
    };
    store(state, key, request, response)
}

/// A response to store: its end-to-end fields only.
struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    request_time: u64,
    response_time: u64,
}

/// [`maybe_store`] of a response whose fields are end-to-end already.
fn store(state: &State, key: &str, request: &HeaderMap, response: Stored) -> Option<Arc<Entry>> {
    let Stored { status, headers, body, request_time, response_time } = response;
    let (freshness, deps) = match headers.get(DEPS_HEADER) {
        // Dependencies: stored only as a 200 nothing forbids storing; served
        // only after a version check, so no freshness applies.
        Some(raw) => {
            let (cc, _) = policy::response_directives(&headers);
            let request_cc = policy::request_directives(request);
            if status != StatusCode::OK
                || policy::refusal(&Method::GET, request, &request_cc, status, &headers, &cc).is_some()
            {
                return None;
            }
            let parsed =
                raw.to_str().map_err(|e| e.to_string()).and_then(|s| DepsHeader::parse(s).map_err(|e| e.to_string()));
            let deps = match parsed {
                Ok(deps) => deps,
                Err(e) => {
                    state.counters.uncacheable_deps.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(key, error = %e, "not caching: malformed dependency header");
                    return None;
                }
            };
            let freshness = policy::Freshness {
                lifetime: 0,
                initial_age: policy::initial_age(&headers, request_time, response_time),
                response_time,
                no_cache: true,
                no_stale: true,
                stale_while_revalidate: 0,
                stale_if_error: 0,
                validators: false,
            };
            (freshness, Some(deps))
        }
        None => {
            let freshness =
                policy::storable(&Method::GET, request, status, &headers, request_time, response_time).ok()?;
            (freshness, None)
        }
    };
    let vary = Vary::key(&Vary::of(&headers)?, request);
    let entry = Arc::new(Entry { status, headers, body, deps, pushed: false, vary, freshness, reply: OnceLock::new() });
    match state.cache_store(key, entry.clone()) {
        Some(InsertOutcome::Stored | InsertOutcome::KeptNewer) => Some(entry),
        // Too large for the proxy's own cache, but pooled.
        Some(InsertOutcome::TooLarge) if state.coop.get().is_some() => Some(entry),
        Some(InsertOutcome::TooLarge) | None => None,
    }
}

/// A bound, ready proxy.
pub struct Proxy {
    listener: tokio::net::TcpListener,
    limits: ServeOptions,
    admin: Option<tokio::net::TcpListener>,
    state: Arc<State>,
}

impl Proxy {
    /// Binds with default [`ProxyOptions`].
    pub async fn bind(config: ProxyConfig) -> Result<Proxy, ProxyError> {
        Self::bind_with(config, ProxyOptions::default()).await
    }

    pub async fn bind_with(config: ProxyConfig, options: ProxyOptions) -> Result<Proxy, ProxyError> {
        if config.upstreams.is_empty() {
            return Err(ProxyError::NoUpstream);
        }
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| match u.parse::<Uri>() {
                Ok(uri) if uri.scheme_str() == Some("http") && uri.authority().is_some() => Ok(uri),
                _ => Err(ProxyError::BadUpstream(u.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cache_state = match (&config.fabric, options.cache_state) {
            (Some(fabric), Some(state_config)) if config.mode != CacheMode::NoCache => {
                match CacheStateWriter::create(fabric.as_ref(), state_config) {
                    Ok(writer) => Some(writer),
                    Err(e) => {
                        tracing::warn!(error = %e, "no shared cache state: the application tier will not push here");
                        None
                    }
                }
            }
            _ => None,
        };
        let checker = match (config.mode, config.fabric) {
            (CacheMode::Poll, None) => return Err(ProxyError::NoFabric),
            (_, Some(fabric)) => Some(VersionChecker::new(fabric)),
            (_, None) => None,
        };
        let connections = Upstreams::new(&upstreams, UPSTREAM_IDLE_MAX);
        let bind = |addr: SocketAddr| async move {
            tokio::net::TcpListener::bind(addr).await.map_err(|source| ProxyError::Listen { addr, source })
        };
        let listener = bind(config.listen).await?;
        let admin = match config.admin_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let access_log = match &options.access_log {
            Some(path) => Some(
                access_log::AccessLog::open(path)
                    .map_err(|source| ProxyError::AccessLog { path: path.clone(), source })?,
            ),
            None => None,
        };
        let default_authority = match options.default_authority {
            Some(authority) => authority.to_ascii_lowercase(),
            None => listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        };
        let cache = Cache::new(config.cache_bytes);
        let state = Arc::new(State {
            upstreams,
            mode: config.mode,
            object_bytes_max: cache.object_bytes_max(),
            cache: Mutex::new(cache),
            checker,
            connections,
            upstream_timeout: config.upstream_timeout,
            counters: Counters::default(),
            cache_state,
            clock: SystemClock,
            flights: coalesce::Flights::default(),
            balancing: OnceLock::new(),
            site: OnceLock::new(),
            routed: (0..config.upstreams.len()).map(|_| AtomicU64::new(0)).collect(),
            default_authority,
            revalidating: Mutex::new(HashSet::new()),
            access_log,
            refresh: refresh::Refresh::new(options.refresh_hot, options.refresh_interval),
            coop: OnceLock::new(),
            #[cfg(test)]
            hooks: testkit::Hooks::default(),
        });
        let limits = ServeOptions {
            header_read_timeout: options.header_read_timeout,
            max_connections: options.max_connections,
            // Only the access log names the client.
            peer_addr: state.access_log.is_some(),
        };
        Ok(Proxy { listener, limits, admin, state })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Chooses upstreams by `balancing` from now on (call before [`run`]).
    ///
    /// [`run`]: Proxy::run
    pub fn set_balancing(&self, balancing: Balancing) -> Result<(), ProxyError> {
        let upstreams = self.state.upstreams.len();
        if let Some(source) = &balancing.source {
            if source.len() != upstreams {
                return Err(ProxyError::SourceMismatch { sources: source.len(), upstreams });
            }
        }
        let state = BalancingState {
            balancer: Mutex::new(Balancer::new(upstreams, balancing.config)),
            source: balancing.source,
        };
        self.state.balancing.set(state).map_err(|_| ProxyError::BalancingSet)
    }

    /// Shares the cache with the cooperating proxies through `handle` (the
    /// `coop` module; call before [`run`]).
    ///
    /// [`run`]: Proxy::run
    pub fn set_coop(&self, handle: CoopHandle) -> Result<(), ProxyError> {
        let layer = coop::CoopLayer::new(handle, &self.state.default_authority);
        self.state.coop.set(Arc::new(layer)).map_err(|_| ProxyError::CoopSet)
    }

    /// Routes only to the upstreams whose role word names `site.site`, read
    /// one-sidedly before each choice, and stamps each forwarded request
    /// with the role it routed by ([`ROLE_HEADER`]); a request the
    /// upstream fences (421: it moved meanwhile) is routed again, once.
    /// Call after [`Proxy::set_balancing`] and before [`run`].
    ///
    /// [`run`]: Proxy::run
    pub fn set_site(&self, site: Site) -> Result<(), ProxyError> {
        if self.state.balancing.get().is_none() {
            return Err(ProxyError::SiteNeedsBalancing);
        }
        let upstreams = self.state.upstreams.len();
        if site.roles.len() != upstreams {
            return Err(ProxyError::RoleMismatch { roles: site.roles.len(), upstreams });
        }
        self.state.site.set(site).map_err(|_| ProxyError::SiteSet)
    }

    /// Benchmark support: stores a response (`headers`, `body`) to `GET
    /// path` at `authority` with the request fields `request`, as a miss
    /// from the origin would.
    #[doc(hidden)]
    pub fn bench_store(
        &self,
        authority: &str,
        path: &str,
        request: &HeaderMap,
        headers: &HeaderMap,
        body: Bytes,
    ) -> bool {
        let mut response = Response::new(());
        *response.headers_mut() = headers.clone();
        let (parts, ()) = response.into_parts();
        let now = policy::now_secs();
        let fetched = Fetched { parts, body, request_time: now, response_time: now };
        maybe_store(&self.state, &format!("{authority}{path}"), request, &fetched).is_some()
    }

    /// Benchmark support: handles one client request as the client
    /// listener would, without a connection.
    #[doc(hidden)]
    pub async fn bench_request(&self, request: Request<Full<Bytes>>) -> Response<ProxyBody> {
        handle(self.state.clone(), request).await
    }

    /// The admin listener's address, if it has one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|admin| admin.local_addr().ok())
    }

    /// Serves both listeners until `stop` fires.
    pub async fn run(self, stop: Stop) -> std::io::Result<()> {
        let _refresh = refresh::spawn(&self.state);
        let state = self.state.clone();
        let handler = Arc::new(move |request: Request<Incoming>| {
            let state = state.clone();
            let pending = state.access_log.as_ref().map(|_| {
                let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
                let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
                access_log::Pending::of(peer, request.method(), target, request.headers())
            });
            async move {
                let response = handle(state.clone(), request).await;
                if let (Some(log), Some(pending)) = (&state.access_log, pending) {
                    log.log(pending, response.status(), response.headers());
                }
                response
            }
        });
        let clients = serve_with_options(self.listener, handler, stop.clone(), None, self.limits);
        let Some(admin) = self.admin else { return clients.await };
        let state = self.state.clone();
        let admin_handler = Arc::new(move |request| handle_admin(state.clone(), request));
        tokio::try_join!(clients, serve(admin, admin_handler, stop)).map(|_| ())
    }
}
