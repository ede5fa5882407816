//! The proxy tier (`tierstack proxy`): a reverse proxy in front of
//! application servers that caches dynamic content with strong coherence.
//!
//! It is an RFC 9111 shared cache for every response (see `policy` and
//! ARCHITECTURE.md: whole responses, key = authority + target, `Vary`,
//! revalidation, invalidation, stale-while-revalidate / stale-if-error,
//! `CDN-Cache-Control`; ranges of stored responses, see `range`). A GET response that
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
//! **Admin token** ([`ProxyOptions::admin_token`], `--admin-token-file`):
//! with one, every admin request that changes state (any method but `GET`
//! and `HEAD`: pushes, purges) needs `Authorization: Bearer <token>`,
//! compared in constant time; without it, or with another, the answer is
//! 401 with `WWW-Authenticate: Bearer` and nothing changes. Reads (the
//! counters, `/metrics`, `/healthz`, `/readyz`) stay open to whoever
//! reaches the admin listener: probes and scrapers carry no token, and
//! counters change nothing. An admin listener on an address other than
//! loopback without a token is refused at start
//! ([`ProxyError::AdminWithoutToken`]): the loopback default keeps it to
//! this host's processes.
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
//!
//! **Where things are.** A client request enters `handler` (hit, coalesced
//! or miss; the one decision whether a stored entry may answer), a miss
//! goes through `route` (which upstream) and `forward` (send, relay, tee),
//! its answer through `store`; `revalidate` refreshes stored responses
//! without dependencies. `state` holds what requests share, `stats` the
//! counters, `headers` the pure field helpers, `admin` the admin listener.
//! This file keeps [`Proxy`] and its configuration.

mod access_log;
mod admin;
pub mod args;
mod cache;
mod coalesce;
mod coop;
mod forward;
mod handler;
mod headers;
mod metrics;
mod policy;
pub use policy::SetCookie;
mod published;
mod push;
mod range;
mod refresh;
mod revalidate;
mod route;
mod stale;
mod state;
mod stats;
mod store;
mod stream;
mod targeted;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
mod upstream;
mod vary;

use bytes::Bytes;
use cache::Cache;
use forward::Fetched;
use http_body_util::Full;
use hyper::header::HeaderMap;
use hyper::{Request, Response, Uri};
use route::BalancingState;
use serde::Serialize;
use state::State;
use stats::Counters;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tierstack_base::SystemClock;
use tierstack_coherent::VersionChecker;
use tierstack_fabric::{Fabric, RemoteRegion};
pub use tierstack_monitor::{Balancer, BalancerConfig, Decision, FailureConfig, LoadSource, Policy, Scheme};
pub use tierstack_pushpull::state::CacheStateConfig;
use tierstack_pushpull::CacheStateWriter;
pub use tierstack_pushpull::SLOTS_DEFAULT as CACHE_STATE_SLOTS_DEFAULT;
use tierstack_secret::Secret;
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{
    serve_with_front, serve_with_options, Front, PeerAddr, ServeOptions, Stop, BODY_READ_TIMEOUT_DEFAULT,
    WRITE_TIMEOUT_DEFAULT,
};
use upstream::Upstreams;

pub use admin::{COOP_STATS_PATH, PURGE_PATH_PREFIX};
pub use args::ProxyArgs;
pub use coop::CoopStats;
pub use forward::{REQUEST_BODY_BYTES_MAX, RESPONSE_BODY_BYTES_MAX, WHOLE_BYTES_MAX};
pub use headers::{X_CACHE, X_CACHE_COALESCED};
pub use range::RANGES_MAX;
pub use refresh::{HotSet, REFRESH_HOT_DEFAULT, REFRESH_INTERVAL_DEFAULT};
pub use stats::ProxyStats;
pub use stream::{ProxyBody, StreamError};
pub use tierstack_coop::CoopHandle;
/// Where the application tier pushes documents: `PUT <prefix><name>`
/// installs the body as the cached copy of `/doc/<name>`.
pub use tierstack_pushpull::PUSH_PATH_PREFIX;

/// Idle connections kept per upstream.
const UPSTREAM_IDLE_MAX: usize = 512;

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
    /// At most this many client connections at once (when full, a new one
    /// displaces the connection stalled longest on its client, see
    /// `tierstack_tier_http::guard`); `None`: no bound.
    pub max_connections: Option<usize>,
    /// Append a Combined Log Format line per client request to this file.
    pub access_log: Option<std::path::PathBuf>,
    /// Close a client connection whose request body has not arrived this
    /// long after its head; `None`: never.
    pub body_read_timeout: Option<Duration>,
    /// Close a client connection that takes no bytes of its answer for this
    /// long (slow readers); `None`: never.
    pub write_timeout: Option<Duration>,
    /// At most this many client connections from one IP address; `None`:
    /// no such cap.
    pub max_connections_per_client: Option<usize>,
    /// The bearer token every state-changing admin request (push, purge)
    /// must carry; `None`: none needed, allowed only on a loopback admin
    /// listener.
    pub admin_token: Option<Secret>,
    /// Proxy-side refresh (`refresh`): watch this many of the hottest
    /// cached documents with dependencies, 0: off (the default here and the
    /// CLI's, [`REFRESH_HOT_DEFAULT`]).
    pub refresh_hot: usize,
    /// How often refresh reads their versions.
    pub refresh_interval: Duration,
    /// The passive health check (nginx's `max_fails`, `fail_timeout`):
    /// forwards that failed (refused, broken or timed out before a response
    /// head) pause their upstream.
    pub failures: FailureConfig,
    /// With a load source: a forward with no response head after this long
    /// asks whether its upstream is suspect (stopped, wedged) or dead, and
    /// again each time this passes; an idempotent one then goes to another
    /// upstream. `None`: a forward waits for `upstream_timeout`.
    pub suspect_probe: Option<Duration>,
    /// Whether and how responses with `Set-Cookie` are stored
    /// (`--set-cookie`; default: only `public` ones, without their cookies).
    pub set_cookie: SetCookie,
    /// The operator's grace (`--serve-stale-on-error`): when the upstream
    /// fails a revalidation, a stored response without dependencies that
    /// is stale by at most this long answers instead, unless it or the
    /// request forbids it (see the `stale` module). Zero: only
    /// `stale-if-error` does.
    pub serve_stale_on_error: Duration,
    /// What the client listener speaks besides HTTP/1.1: TLS (ALPN h2 and
    /// http/1.1), h2c. The admin listener stays plain HTTP/1.1.
    pub front: Front,
    /// Speak HTTP/2 to the upstreams (h2c, prior knowledge): one shared
    /// connection each, a stream per request.
    pub upstream_http2: bool,
}

/// The client listener's limits' defaults, as every tier's.
pub use tierstack_tier_http::{HEADER_READ_TIMEOUT_DEFAULT, MAX_CONNECTIONS_DEFAULT};

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            cache_state: Some(CacheStateConfig::default()),
            default_authority: None,
            header_read_timeout: Some(HEADER_READ_TIMEOUT_DEFAULT),
            body_read_timeout: Some(BODY_READ_TIMEOUT_DEFAULT),
            write_timeout: Some(WRITE_TIMEOUT_DEFAULT),
            max_connections: Some(MAX_CONNECTIONS_DEFAULT),
            max_connections_per_client: None,
            admin_token: None,
            access_log: None,
            refresh_hot: 0,
            refresh_interval: REFRESH_INTERVAL_DEFAULT,
            failures: FailureConfig::default(),
            suspect_probe: Some(tierstack_monitor::scheme::SUSPECT_AFTER_DEFAULT),
            set_cookie: SetCookie::default(),
            serve_stale_on_error: Duration::ZERO,
            front: Front::default(),
            upstream_http2: false,
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
    #[error(
        "the admin listener {addr} is not on loopback and has no token: anyone who reaches it could push pages \
         every client is served; give --admin-token-file FILE (0600) or listen on 127.0.0.1"
    )]
    AdminWithoutToken { addr: SocketAddr },
}

/// Refuses an admin listener that others than this host could reach with
/// no token to check (the issue: a LAN admin address let any client push).
pub fn check_admin_exposure(admin_listen: Option<SocketAddr>, has_token: bool) -> Result<(), ProxyError> {
    match admin_listen {
        Some(addr) if !addr.ip().is_loopback() && !has_token => Err(ProxyError::AdminWithoutToken { addr }),
        _ => Ok(()),
    }
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

/// A bound, ready proxy.
pub struct Proxy {
    listener: tokio::net::TcpListener,
    limits: ServeOptions,
    front: Front,
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
        check_admin_exposure(config.admin_listen, options.admin_token.is_some())?;
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
        let connections = Upstreams::new(&upstreams, UPSTREAM_IDLE_MAX, options.upstream_http2);
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
            failures: route::FailureGate::new(config.upstreams.len(), options.failures),
            suspect_probe: options.suspect_probe,
            stale_on_error_secs: options.serve_stale_on_error.as_secs(),
            default_authority,
            revalidating: Mutex::new(HashSet::new()),
            access_log,
            refresh: refresh::Refresh::new(options.refresh_hot, options.refresh_interval),
            coop: OnceLock::new(),
            admin_token: options.admin_token,
            set_cookie: options.set_cookie,
            #[cfg(test)]
            hooks: testkit::Hooks::default(),
        });
        let limits = ServeOptions {
            header_read_timeout: options.header_read_timeout,
            body_read_timeout: options.body_read_timeout,
            write_timeout: options.write_timeout,
            max_connections: options.max_connections,
            max_connections_per_client: options.max_connections_per_client,
            // Only the access log names the client.
            peer_addr: state.access_log.is_some(),
        };
        Ok(Proxy { listener, limits, front: options.front, admin, state })
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
    /// with the role it routed by
    /// ([`ROLE_HEADER`](tierstack_monitor::reconfig::ROLE_HEADER)); a
    /// request the upstream fences (421: it moved meanwhile) is routed
    /// again, once.
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
        store::maybe_store(&self.state, &format!("{authority}{path}"), request, &fetched).is_some()
    }

    /// Benchmark support: handles one client request as the client
    /// listener would, without a connection.
    #[doc(hidden)]
    pub async fn bench_request(&self, request: Request<Full<Bytes>>) -> Response<ProxyBody> {
        handler::handle(self.state.clone(), request).await
    }

    /// The admin listener's address, if it has one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|admin| admin.local_addr().ok())
    }

    /// Serves both listeners until `stop` fires.
    pub async fn run(self, stop: Stop) -> std::io::Result<()> {
        let _refresh = refresh::spawn(&self.state);
        let state = self.state.clone();
        let handler = Arc::new(move |request: Request<RequestBody>| {
            let state = state.clone();
            let pending = state.access_log.as_ref().map(|_| {
                let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
                let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
                access_log::Pending::of(peer, request.method(), target, request.headers())
            });
            async move {
                let response = handler::handle(state.clone(), request).await;
                if let (Some(log), Some(pending)) = (&state.access_log, pending) {
                    log.log(pending, response.status(), response.headers());
                }
                response
            }
        });
        let clients = serve_with_front(self.listener, handler, stop.clone(), None, self.limits, self.front);
        let Some(admin) = self.admin else { return clients.await };
        let state = self.state.clone();
        let admin_handler = Arc::new(move |request| admin::handle_admin(state.clone(), request));
        // The admin listener's clients are slow or stuck like any other.
        let admin_limits = ServeOptions { peer_addr: false, max_connections_per_client: None, ..self.limits };
        let admin = serve_with_options(admin, admin_handler, stop, None, admin_limits);
        tokio::try_join!(clients, admin).map(|_| ())
    }
}
