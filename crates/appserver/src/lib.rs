//! The reference application server (`tierstack app-server`).
//!
//! It serves dynamic documents `/doc/<name>`, each depending on the key
//! `doc/<name>`, and works the way the coherency paper's application servers
//! do with their module (§3.1): every GET is done under the module's read
//! protocol (READ_REQUEST … READ_PROCEED, generate, READ_DONE) and every PUT
//! or POST under its update protocol. The body is generated from the version
//! the module granted, so body and `X-Tierstack-Deps` header always agree,
//! and a checker can tell exactly which state a response reflects.
//!
//! **Documents in a store** ([`store`], `AppServerConfig::store`): bodies
//! live in an embedded store that an update rewrites in two halves between
//! UPDATE_PROCEED and UPDATE_DONE and that reads copy, so a read admitted
//! during an update (a Table 1 violation) yields a detectably mixed body.
//!
//! `compute_threads` CPU-burning threads emulate CGI and application work
//! (the paper's x-axis in Fig. 9–10), competing with the module on the node.
//!
//! `/_tierstack/stats` answers the server's counters as JSON (time waiting
//! for the module, time generating), for the response-time breakdown; the
//! same counters, and the module's own, are Prometheus text on
//! `--metrics-listen` ([`observe`]).
//!
//! **Published load** ([`AppServer::publish_load`], svc §5.2): the server
//! keeps a [`LoadPublisher`]'s counters on the paths that change them —
//! requests in flight (a `/doc/` request from arrival to answer), running
//! threads (a request burning its CPU cost or generating its body, and each
//! compute thread), queue length (a request waiting for the module's
//! grant), open connections — so a front end reads them one-sidedly.
//! **CPU cost** ([`AppServer::set_cpu_cost`], [`cost`]): each read first
//! burns a heavy-tailed, seeded amount of CPU ("RUBiS-like").
//!
//! **Push** ([`AppServer::bind_with_push`], coherency paper §4.3): with a
//! fabric node of its own, a list of proxies and a push policy, the server
//! reads the proxies' shared cache states after every completed update and
//! pushes the new version to the proxies the policy picks ([`push`]), off
//! the update's response path; or, in write-through mode, before
//! UPDATE_DONE, the update waiting (bounded) for it. Its counters appear in
//! the stats as `push`.

pub mod args;
pub mod cost;
pub mod module_args;
mod module_link;
pub mod observe;
pub mod push;
pub mod store;

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tierstack_base::time::instant_now;
use tierstack_coherent::module::{ClientOptions, ModuleClient, ModuleError};
use tierstack_coherent::{DepsHeader, DEPS_HEADER};
use tierstack_fabric::LocalRegion;
use tierstack_monitor::reconfig::{self, RoleStamp, ROLE_HEADER};
use tierstack_monitor::{Gauge, GaugeGuard, LoadPublisher};
use tierstack_stats::exposition::SecondsHistogram;
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{
    collect_limited, serve_with_options, text, Body, ConnectionHook, HttpLimitsArgs, ServeOptions, Stop,
};

pub use args::AppServerArgs;
pub use cost::CpuCost;
pub use module_args::ModuleArgs;
pub use push::{
    PushConfig, PushConfigError, PushStats, PushTarget, PUSH_TIMEOUT_DEFAULT, WRITE_THROUGH_TIMEOUT_DEFAULT,
    WRITE_THROUGH_TIMEOUT_MAX,
};
pub use store::{StoreConfig, UPDATE_WRITE_PAUSE_DEFAULT, UPDATE_WRITE_PAUSE_MAX};
pub use tierstack_pushpull::PushPolicy;

/// Largest update body accepted.
pub const UPDATE_BODY_BYTES_MAX: usize = 1 << 20;
/// Largest document the server will generate.
pub const DOCUMENT_BYTES_MAX: usize = 64 << 20;
/// How long to keep trying to reach the module at start-up.
pub const MODULE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct AppServerConfig {
    pub listen: SocketAddr,
    pub module_socket: PathBuf,
    /// Users the module may run as besides this server's own and root.
    pub module_uids: Vec<u32>,
    /// Document name → size in bytes.
    pub documents: Vec<(String, usize)>,
    pub compute_threads: usize,
    /// Keep bodies in a store that updates rewrite ([`store`]); `None`:
    /// generate each body from the granted version.
    pub store: Option<StoreConfig>,
    /// Hand each update's new page to the module with UPDATE_DONE, for
    /// proxies to read one-sidedly (`app-server --publish`).
    pub publish: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AppServerError {
    #[error("document {name:?}: {reason}")]
    BadDocument { name: String, reason: String },
    #[error("cannot reach the application module at {path}: {reason}")]
    Module { path: PathBuf, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("update write pause {0:?} exceeds {UPDATE_WRITE_PAUSE_MAX:?}")]
    BadPause(Duration),
    #[error(transparent)]
    Push(#[from] PushConfigError),
}

/// Counters exported at `/_tierstack/stats`.
#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    updates: AtomicU64,
    not_found: AtomicU64,
    module_errors: AtomicU64,
    module_wait_ns: AtomicU64,
    generate_ns: AtomicU64,
    cpu_cost_us: AtomicU64,
    /// Sequence numbers of reads, for the CPU cost draw.
    read_sequence: AtomicU64,
    /// Requests refused for a role stamp that is not this node's role.
    fenced: AtomicU64,
    /// Pages handed to the module with UPDATE_DONE and published, or not.
    pages_published: AtomicU64,
    pages_unpublished: AtomicU64,
    /// The module's round trips: from READ_REQUEST / UPDATE_REQUEST to
    /// the grant (`/metrics` only).
    read_grant_seconds: SecondsHistogram,
    update_grant_seconds: SecondsHistogram,
}

#[derive(Serialize)]
pub struct StatsSnapshot {
    pub reads: u64,
    pub updates: u64,
    pub not_found: u64,
    pub module_errors: u64,
    pub module_wait_ns: u64,
    pub generate_ns: u64,
    /// CPU time burned as the requests' cost ([`AppServer::set_cpu_cost`]).
    #[serde(default)]
    pub cpu_cost_us: u64,
    /// Requests refused (421) because their role stamp named another site
    /// or an older epoch than this node's role word (reconfiguration).
    #[serde(default)]
    pub fenced: u64,
    /// Updates whose new page the module published (`--publish`).
    #[serde(default)]
    pub pages_published: u64,
    /// Pages the module could not publish (too large, no area).
    #[serde(default)]
    pub pages_unpublished: u64,
    /// This node's role (`<site>.<epoch>`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The push path's counters, when pushing is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push: Option<PushStats>,
}

struct State {
    module: module_link::ModuleLink,
    /// For `/readyz`: the module answers a connection on it.
    module_socket: PathBuf,
    documents: HashMap<String, usize>,
    counters: Counters,
    pusher: Option<Arc<push::Pusher>>,
    store: Option<store::DocumentStore>,
    /// Where the load is published, if anywhere.
    load: OnceLock<Arc<LoadPublisher>>,
    cpu_cost: OnceLock<CpuCost>,
    /// The node's role word (reconfiguration between sites).
    role: OnceLock<Arc<LocalRegion>>,
    /// Emulated node capacity: this many workers spend the cost in wall time.
    workers: OnceLock<Arc<tokio::sync::Semaphore>>,
    publish: bool,
}

impl State {
    /// Counts one of `gauge` while the guard lives (nothing if the load
    /// is not published).
    fn enter(&self, gauge: Gauge) -> Option<GaugeGuard> {
        self.load.get().map(|publisher| publisher.enter(gauge))
    }
}

/// The document's dependency key.
pub fn key_of(name: &str) -> String {
    format!("doc/{name}")
}

/// FNV-1a, 64 bits: the checksum of a self-checking body's content.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The content of `name` at `version`: the line `<name>@<version>\n`
/// repeated, `len` bytes long. It differs per version, so a body pieced
/// together from two versions fails its checksum.
fn content_of(name: &str, version: u64, len: usize) -> Vec<u8> {
    let line = format!("{name}@{version}\n");
    line.as_bytes().iter().copied().cycle().take(len).collect()
}

/// The body of `name` at `version`, `size` bytes in all, self-checking
/// (the contract shared with the checker, docs/coherence-protocol.md):
/// `doc=<name> version=<v> fnv1a64=<16 hex>\n<content>`, the hash being
/// of the content. When the first line alone exceeds `size`, the content is
/// empty and the body is that line (a checkable body beats an exact size).
pub fn generate_body(name: &str, version: u64, size: usize) -> Bytes {
    // The first line's length does not depend on the hash (always 16 digits).
    let header_len = format!("doc={name} version={version} fnv1a64=0000000000000000\n").len();
    let content = content_of(name, version, size.saturating_sub(header_len));
    let mut body = Vec::with_capacity(header_len + content.len());
    body.extend_from_slice(format!("doc={name} version={version} fnv1a64={:016x}\n", fnv1a64(&content)).as_bytes());
    body.extend_from_slice(&content);
    Bytes::from(body)
}

/// The version of `key` in a dependency header.
fn version_of(deps: &str, key: &str) -> Option<u64> {
    DepsHeader::parse(deps).ok()?.deps.iter().find(|d| d.key == key).map(|d| d.version)
}

fn with_deps(mut response: Response<Body>, deps: &str) -> Response<Body> {
    match HeaderValue::from_str(deps) {
        Ok(value) => {
            response.headers_mut().insert(DEPS_HEADER, value);
            response
        }
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "module returned an unusable dependency header"),
    }
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

async fn handle(state: Arc<State>, request: Request<RequestBody>) -> Response<Body> {
    let path = request.uri().path().to_string();
    if path == "/_tierstack/stats" {
        return stats_response(&state);
    }
    if path == tierstack_tier_http::HEALTHZ_PATH {
        return tierstack_tier_http::alive();
    }
    if path == tierstack_tier_http::READYZ_PATH {
        return readiness(&state).await;
    }
    let Some(name) = path.strip_prefix("/doc/") else {
        return text(StatusCode::NOT_FOUND, "no such document\n");
    };
    let Some(&size) = state.documents.get(name) else {
        state.counters.not_found.fetch_add(1, Ordering::Relaxed);
        return text(StatusCode::NOT_FOUND, "no such document\n");
    };
    if let Some(refusal) = fence(&state, request.headers()) {
        return refusal;
    }
    let _in_flight = state.enter(Gauge::InFlightRequests);
    match *request.method() {
        Method::GET | Method::HEAD => {
            let head_only = request.method() == Method::HEAD;
            // In a task of its own: a client that goes away must not cancel
            // the protocol between READ_REQUEST and READ_DONE.
            let reading = tokio::spawn(read_document(state, name.to_string(), size, head_only));
            reading.await.unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "the read failed\n"))
        }
        Method::PUT | Method::POST => {
            if let Err(e) = collect_limited(request.into_body(), UPDATE_BODY_BYTES_MAX).await {
                return text(StatusCode::PAYLOAD_TOO_LARGE, format!("update body: {e}\n"));
            }
            // In a task of its own: a client that goes away (say, during
            // the store's pause) must not leave the update granted forever
            // and its document half written.
            let updating = tokio::spawn(update_document(state, name.to_string(), size));
            updating.await.unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "the update failed\n"))
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "use GET, HEAD, PUT or POST\n"),
    }
}

/// The epoch fence: a request stamped with a role ([`ROLE_HEADER`]) that
/// is not this node's current role was routed by a front end that has not
/// seen its latest move; it is refused with 421 (Misdirected Request), so
/// the front end routes it again. Unstamped requests are served.
fn fence(state: &State, headers: &hyper::HeaderMap) -> Option<Response<Body>> {
    let region = state.role.get()?;
    let stamp = headers.get(ROLE_HEADER)?;
    let role = match reconfig::local_role(region) {
        Ok(role) => role,
        Err(e) => return Some(text(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the role word: {e}\n"))),
    };
    match stamp.to_str().ok().and_then(RoleStamp::parse) {
        Some(stamp) if stamp.admitted_by(role) => None,
        Some(_) => {
            state.counters.fenced.fetch_add(1, Ordering::Relaxed);
            Some(text(
                StatusCode::MISDIRECTED_REQUEST,
                format!("this node's role is {}\n", RoleStamp::of(role).to_header()),
            ))
        }
        None => Some(text(StatusCode::BAD_REQUEST, format!("malformed {ROLE_HEADER} header\n"))),
    }
}

/// Spends a read's cost: in CPU time on a blocking thread, or, with
/// emulated workers, in wall time holding one of them (queued meanwhile).
async fn spend_cost(state: &Arc<State>, micros: u64) -> bool {
    if let Some(workers) = state.workers.get() {
        let queued = state.enter(Gauge::QueueLength);
        let Ok(_worker) = workers.acquire().await else { return false };
        drop(queued);
        let _running = state.enter(Gauge::RunningThreads);
        tokio::time::sleep(Duration::from_micros(micros)).await;
        return true;
    }
    let burning = state.clone();
    // On a blocking thread: the cost must not stall the server's
    // other requests, only compete with them for the CPU.
    tokio::task::spawn_blocking(move || {
        let _running = burning.enter(Gauge::RunningThreads);
        cost::burn_cpu(micros);
    })
    .await
    .is_ok()
}

/// Spends the CPU cost of generating one page of `name`, if a cost is set.
async fn spend_page_cost(state: &Arc<State>, name: &str) {
    if let Some(cost) = state.cpu_cost.get().copied() {
        let sequence = state.counters.read_sequence.fetch_add(1, Ordering::Relaxed);
        let micros = cost.cost_us(name, sequence);
        if spend_cost(state, micros).await {
            state.counters.cpu_cost_us.fetch_add(micros, Ordering::Relaxed);
        }
    }
}

/// READ_REQUEST … READ_PROCEED, the body, READ_DONE (off the response's path).
async fn read_document(state: Arc<State>, name: String, size: usize, head_only: bool) -> Response<Body> {
    spend_page_cost(&state, &name).await;
    let (name, keys) = (name.as_str(), [key_of(&name)]);
    let started = instant_now();
    let queued = state.enter(Gauge::QueueLength);
    let module_link::Granted { access, client } = match state.module.read(&keys).await {
        Ok(granted) => granted,
        Err(e) => {
            state.counters.module_errors.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::SERVICE_UNAVAILABLE, format!("application module: {e}\n"));
        }
    };
    drop(queued);
    let waited_ns = elapsed_ns(started);
    state.counters.module_wait_ns.fetch_add(waited_ns, Ordering::Relaxed);
    state.counters.read_grant_seconds.record_ns(waited_ns);
    let running = state.enter(Gauge::RunningThreads);
    let generating = instant_now();
    let version = version_of(&access.deps, &keys[0]).unwrap_or(0);
    let deps = access.deps.clone();
    // Copied under the READ grant: no update may be writing it now.
    let stored = state.store.as_ref().and_then(|store| store.read(name, version, size));
    let body = stored.unwrap_or_else(|| generate_body(name, version, size));
    state.counters.generate_ns.fetch_add(elapsed_ns(generating), Ordering::Relaxed);
    drop(running);
    // READ_DONE needs no answer on the request's path.
    tokio::spawn(async move {
        if let Err(e) = client.read_done(access).await {
            tracing::warn!(error = %e, "READ_DONE failed");
        }
    });
    state.counters.reads.fetch_add(1, Ordering::Relaxed);
    let mut response = Response::new(if head_only { Body::default() } else { Body::new(body) });
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    with_deps(response, &deps)
}

/// The page an update publishes (`--publish`): the document's body at the
/// version the update produced, as a GET would answer it.
fn page_of(name: &str, body: &Bytes) -> tierstack_coherent::Page {
    let headers = vec![("content-type".to_string(), "text/plain".to_string())];
    tierstack_coherent::Page::with_body(format!("/doc/{name}"), headers, body)
}

/// UPDATE_REQUEST … UPDATE_PROCEED, the store's rewrite, the page (with
/// `--publish`), UPDATE_DONE, the push.
async fn update_document(state: Arc<State>, name: String, size: usize) -> Response<Body> {
    let (name, keys) = (name.as_str(), [key_of(&name)]);
    let started = instant_now();
    let module_link::Granted { access, client } = match state.module.update(&keys).await {
        Ok(granted) => {
            state.counters.update_grant_seconds.record_ns(elapsed_ns(started));
            granted
        }
        Err(e) => {
            state.counters.module_errors.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::SERVICE_UNAVAILABLE, format!("application module: {e}\n"));
        }
    };
    // In store mode, write the new version's body now, between
    // UPDATE_PROCEED and UPDATE_DONE; otherwise the content is a
    // function of the version the module just bumped.
    let new_version = version_of(&access.deps, &keys[0]);
    let written = match (&state.store, new_version) {
        (Some(store), Some(version)) => store.rewrite(name, version, size).await.map(|body| (version, body)),
        _ => None,
    };
    let store_failed = state.store.is_some() && written.is_none();
    // With --publish or write-through, the new page is made now, once, at
    // the version this grant produced (its generation cost spent here, not
    // by every proxy's refetch), and handed to the module with UPDATE_DONE
    // or pushed before the update answers.
    let write_through = state.pusher.as_ref().filter(|p| p.is_write_through() && !store_failed);
    let written = match (written, new_version) {
        (None, Some(version)) if (state.publish || write_through.is_some()) && !store_failed => {
            spend_page_cost(&state, name).await;
            Some((version, generate_body(name, version, size)))
        }
        (written, _) => written,
    };
    let page = written.as_ref().filter(|_| state.publish).map(|(_, body)| page_of(name, body));
    let content = || match &written {
        Some((version, body)) => push::Content::Stored { version: *version, body: body.clone() },
        None => push::Content::Generate { size },
    };
    // Write-through: the new version reaches the proxies before the update
    // answers (bounded), with the versions this grant produced: before
    // UPDATE_DONE when they are visible already, else right after it.
    let visible_at_done = access.visible_at_done;
    let mut pushed = false;
    if let Some(pusher) = write_through.filter(|_| !visible_at_done) {
        pusher.write_through(name, content(), access.deps.clone()).await;
        pushed = true;
    }
    match client.update_done_with_page(access, page).await {
        Ok(_) if store_failed => {
            state.counters.module_errors.fetch_add(1, Ordering::Relaxed);
            text(StatusCode::SERVICE_UNAVAILABLE, "application module: the grant named no version of the document\n")
        }
        Ok(done) => {
            state.counters.updates.fetch_add(1, Ordering::Relaxed);
            match &done.published {
                Some(Ok(())) => state.counters.pages_published.fetch_add(1, Ordering::Relaxed),
                Some(Err(why)) => {
                    tracing::warn!(name, why, "the module did not publish the update's page");
                    state.counters.pages_unpublished.fetch_add(1, Ordering::Relaxed)
                }
                None => 0,
            };
            if let Some(pusher) = write_through.filter(|_| !pushed) {
                pusher.write_through(name, content(), done.deps.clone()).await;
            } else if let Some(pusher) = state.pusher.as_ref().filter(|_| !pushed) {
                pusher.spawn_after_update(name, content(), done.deps.clone());
            }
            with_deps(text(StatusCode::OK, format!("updated {name}\n")), &done.deps)
        }
        Err(e) => {
            state.counters.module_errors.fetch_add(1, Ordering::Relaxed);
            text(StatusCode::SERVICE_UNAVAILABLE, format!("application module: {e}\n"))
        }
    }
}

fn stats_response(state: &State) -> Response<Body> {
    let c = &state.counters;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let snapshot = StatsSnapshot {
        reads: load(&c.reads),
        updates: load(&c.updates),
        not_found: load(&c.not_found),
        module_errors: load(&c.module_errors),
        module_wait_ns: load(&c.module_wait_ns),
        generate_ns: load(&c.generate_ns),
        cpu_cost_us: load(&c.cpu_cost_us),
        fenced: load(&c.fenced),
        pages_published: load(&c.pages_published),
        pages_unpublished: load(&c.pages_unpublished),
        role: state
            .role
            .get()
            .and_then(|region| reconfig::local_role(region).ok())
            .map(|role| RoleStamp::of(role).to_header()),
        push: state.pusher.as_ref().map(|p| p.stats()),
    };
    let mut response = text(StatusCode::OK, serde_json::to_string(&snapshot).unwrap_or_default());
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// How long `/readyz` waits for the module to accept a connection.
const READYZ_MODULE_TIMEOUT: Duration = Duration::from_secs(1);

/// `/readyz`: ready while the module accepts connections on its socket
/// (the server's own module connection is made at start and kept).
async fn readiness(state: &State) -> Response<Body> {
    let connect = tokio::net::UnixStream::connect(&state.module_socket);
    let module = match tokio::time::timeout(READYZ_MODULE_TIMEOUT, connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{}: {e}", state.module_socket.display())),
        Err(_) => Err(format!("{}: no answer within {READYZ_MODULE_TIMEOUT:?}", state.module_socket.display())),
    };
    tierstack_tier_http::readiness(&[("module", module)])
}

/// Connects to the module, retrying while it starts (bounded).
async fn connect_module(config: &AppServerConfig) -> Result<ModuleClient, AppServerError> {
    let deadline = instant_now() + MODULE_CONNECT_TIMEOUT;
    loop {
        let options = ClientOptions { module_uids: config.module_uids.clone(), ..ClientOptions::default() };
        match ModuleClient::connect_with(&config.module_socket, &options).await {
            Ok(client) => return Ok(client),
            // Waiting will not make a stranger's socket the module's.
            Err(e @ ModuleError::UntrustedModule { .. }) => {
                return Err(AppServerError::Module { path: config.module_socket.clone(), reason: e.to_string() })
            }
            Err(e) if instant_now() >= deadline => {
                return Err(AppServerError::Module { path: config.module_socket.clone(), reason: e.to_string() })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Burns CPU until `stop` is set: the paper's compute threads (each a
/// running thread in the published load).
fn start_compute_threads(count: usize, stop: Arc<AtomicBool>, load: Option<Arc<LoadPublisher>>) {
    for i in 0..count {
        let stop = stop.clone();
        let load = load.clone();
        let spawned = std::thread::Builder::new().name(format!("compute-{i}")).spawn(move || {
            let _running = load.map(|publisher| publisher.enter(Gauge::RunningThreads));
            let mut x: u64 = i as u64 + 1;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1000 {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                }
                std::hint::black_box(x);
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a compute thread");
        }
    }
}

/// A bound, ready application server.
pub struct AppServer {
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    compute_threads: usize,
    /// The listener's client limits ([`AppServer::set_limits`]).
    limits: ServeOptions,
}

impl AppServer {
    /// Validates the configuration, reaches the module and binds the port.
    pub async fn bind(config: AppServerConfig) -> Result<AppServer, AppServerError> {
        Self::bind_with_push(config, None).await
    }

    /// As [`AppServer::bind`], pushing completed updates to proxies as
    /// `push` says (`None`: never push, which is `bind`).
    pub async fn bind_with_push(
        config: AppServerConfig,
        push: Option<PushConfig>,
    ) -> Result<AppServer, AppServerError> {
        let pusher = push.map(push::Pusher::new).transpose()?.map(Arc::new);
        let mut documents = HashMap::new();
        for (name, size) in &config.documents {
            tierstack_coherent::deps::validate_key(&key_of(name))
                .map_err(|e| AppServerError::BadDocument { name: name.clone(), reason: e.to_string() })?;
            if *size == 0 || *size > DOCUMENT_BYTES_MAX {
                return Err(AppServerError::BadDocument {
                    name: name.clone(),
                    reason: format!("size {size} out of range"),
                });
            }
            documents.insert(name.clone(), *size);
        }
        if let Some(store) = &config.store {
            if store.update_write_pause > UPDATE_WRITE_PAUSE_MAX {
                return Err(AppServerError::BadPause(store.update_write_pause));
            }
        }
        let store = config.store.as_ref().map(|c| store::DocumentStore::new(documents.keys(), c));
        let module = connect_module(&config).await?;
        let options = ClientOptions { module_uids: config.module_uids.clone(), ..ClientOptions::default() };
        let module = module_link::ModuleLink::new(module, config.module_socket.clone(), options);
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| AppServerError::Listen { addr: config.listen, source })?;
        let state = Arc::new(State {
            module,
            module_socket: config.module_socket.clone(),
            documents,
            counters: Counters::default(),
            pusher,
            store,
            load: OnceLock::new(),
            cpu_cost: OnceLock::new(),
            role: OnceLock::new(),
            workers: OnceLock::new(),
            publish: config.publish,
        });
        let limits = HttpLimitsArgs::default().serve_options();
        Ok(AppServer { listener, state, compute_threads: config.compute_threads, limits })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Keeps `publisher`'s counters from now on (call before [`run`]);
    /// false if a publisher was already set.
    ///
    /// [`run`]: AppServer::run
    pub fn publish_load(&self, publisher: Arc<LoadPublisher>) -> bool {
        self.state.load.set(publisher).is_ok()
    }

    /// Makes every read burn CPU as `cost` draws (call before [`run`]);
    /// false if a cost was already set or `cost` is invalid.
    ///
    /// [`run`]: AppServer::run
    pub fn set_cpu_cost(&self, cost: CpuCost) -> bool {
        cost.validate().is_ok() && self.state.cpu_cost.set(cost).is_ok()
    }

    /// Serves requests stamped with `region`'s role word only ([`fence`]:
    /// reconfiguration between sites, svc §3); call before [`run`]. False
    /// if a role was already set.
    ///
    /// [`run`]: AppServer::run
    pub fn set_role(&self, region: Arc<LocalRegion>) -> bool {
        self.state.role.set(region).is_ok()
    }

    /// Emulates a node of `workers` workers: a read's cost is spent in wall
    /// time holding one of them (waiting, it counts as queued), not in this
    /// machine's CPU, so several emulated nodes on one small machine each
    /// have their own capacity. False if zero or already set.
    pub fn set_emulated_workers(&self, workers: usize) -> bool {
        workers > 0 && self.state.workers.set(Arc::new(tokio::sync::Semaphore::new(workers))).is_ok()
    }

    /// Limits slow clients and connections as `limits` says (call before
    /// [`AppServer::run`]; the default is every tier's flags' defaults).
    pub fn set_limits(&mut self, limits: ServeOptions) {
        self.limits = limits;
    }

    /// Serves until `stop` fires.
    pub async fn run(self, stop: Stop) -> std::io::Result<()> {
        let burning = Arc::new(AtomicBool::new(false));
        start_compute_threads(self.compute_threads, burning.clone(), self.state.load.get().cloned());
        let heartbeat = self.state.load.get().cloned().map(|publisher| tokio::spawn(beat(publisher)));
        let state = self.state.clone();
        let handler = Arc::new(move |request| handle(state.clone(), request));
        let hook: Option<ConnectionHook> = self.state.load.get().cloned().map(|publisher| {
            Arc::new(move || Box::new(publisher.enter(Gauge::OpenConnections)) as Box<dyn Send>) as ConnectionHook
        });
        let result = serve_with_options(self.listener, handler, stop, hook, self.limits).await;
        burning.store(true, Ordering::Relaxed);
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
        result
    }
}

/// Advances the published progress word every [`HEARTBEAT`] from a task of
/// the serving runtime: it moves only while that runtime schedules tasks,
/// so a stopped process or a wedged runtime shows as a word standing still
/// (front ends then call this server suspect and route around it).
///
/// [`HEARTBEAT`]: tierstack_monitor::publisher::HEARTBEAT
async fn beat(publisher: Arc<LoadPublisher>) {
    let mut ticks = tokio::time::interval(tierstack_monitor::publisher::HEARTBEAT);
    // After a stall, one beat, not a burst that would hide how long it was.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        publisher.beat();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a body into (first line, content) and checks the contract.
    fn check(body: &[u8], name: &str, version: u64) -> Result<(), String> {
        let newline = body.iter().position(|&b| b == b'\n').ok_or("no first line")?;
        let (line, content) = (std::str::from_utf8(&body[..newline]).map_err(|e| e.to_string())?, &body[newline + 1..]);
        let expected = format!("doc={name} version={version} fnv1a64={:016x}", fnv1a64(content));
        if line == expected {
            Ok(())
        } else {
            Err(format!("{line:?} != {expected:?}"))
        }
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn bodies_have_the_configured_size_and_check_themselves() {
        for (name, version, size) in [("a", 0, 100), ("hot", 17, 4096), ("x", u64::MAX, 333), ("a", 1, 45)] {
            let body = generate_body(name, version, size);
            assert_eq!(body.len(), size, "{name}@{version}");
            check(&body, name, version).unwrap();
            let content_start = body.iter().position(|&b| b == b'\n').unwrap() + 1;
            let line = format!("{name}@{version}\n");
            assert!(
                line.as_bytes().starts_with(&body[content_start..])
                    || body[content_start..].starts_with(line.as_bytes())
            );
        }
    }

    #[test]
    fn a_first_line_longer_than_the_size_leaves_the_content_empty() {
        let body = generate_body("a", 3, 1);
        assert_eq!(&body[..], format!("doc=a version=3 fnv1a64={:016x}\n", fnv1a64(b"")).as_bytes());
        check(&body, "a", 3).unwrap();
    }

    #[test]
    fn a_body_mixing_two_versions_fails_its_check() {
        let (old, new) = (generate_body("a", 9, 200), generate_body("a", 10, 200));
        let mut mixed = new[..100].to_vec();
        mixed.extend_from_slice(&old[100..]);
        assert!(check(&mixed, "a", 10).is_err(), "new header, old tail");
        let mut mixed = old[..100].to_vec();
        mixed.extend_from_slice(&new[100..]);
        assert!(check(&mixed, "a", 9).is_err(), "old header, new tail");
        assert!(check(&new, "b", 10).is_err(), "another document's name");
    }
}
