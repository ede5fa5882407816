//! The push path (coherency paper §4.3): after an update completes, read
//! each proxy's shared cache state, decide per proxy with the policy,
//! generate the new document once, and install it in the chosen proxies'
//! caches with the versions `update_done` returned.
//!
//! It runs in a task of its own, after the update's response is sent, so it
//! never lengthens an update.
//!
//! **Write-through** ([`PushConfig::write_through`]): the same push, made
//! between UPDATE_PROCEED and UPDATE_DONE with the versions UPDATE_PROCEED
//! granted (already visible in the version table, so the proxies' checks
//! accept it), and awaited by the update: a proxy holding a hot document has
//! the new version before the update completes, instead of missing on it
//! and refetching from the application server once the update is done. The
//! wait is bounded by the write-through timeout: past it the update goes on
//! (counted in `write_through_timeouts`) and the push finishes on its own,
//! each of its steps bounded by [`PushConfig::timeout`]. A pushed entry is
//! validated on every hit like any other, so an early or late push can
//! never be served once a newer update has begun.
//!
//! Every failure is skipped and counted: a proxy
//! whose cache state cannot be read (dead, restarting, no state) gets no
//! push; a push that fails or is refused is only a lost optimization — the
//! proxy still validates every hit, so nothing stale can result.

use crate::{generate_body, key_of};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tierstack_base::time::instant_now;
use tierstack_base::{Clock, NodeId, SystemClock};
use tierstack_coherent::{DepsHeader, DEPS_HEADER};
use tierstack_fabric::Fabric;
use tierstack_pushpull::{decide, fingerprint, CacheStateReader, Decision, PushPolicy, UpdateContext, UpdateRates};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Updates whose push is in progress at once; later ones skip their push.
pub const PUSHES_IN_FLIGHT_MAX: usize = 64;
/// Default bound on one cache-state read plus one push.
pub const PUSH_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Most proxies one application server pushes to.
pub const PUSH_PROXIES_MAX: usize = 256;

/// One proxy the application server may push to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushTarget {
    /// The proxy's fabric node (its cache state lives there).
    pub node: NodeId,
    /// The proxy's base URL, `http://host:port`.
    pub url: String,
}

/// What the application server needs to push.
#[derive(Clone)]
pub struct PushConfig {
    /// The application server's own fabric node.
    pub fabric: Arc<dyn Fabric>,
    pub proxies: Vec<PushTarget>,
    pub policy: PushPolicy,
    /// Bound on each cache-state read and each push request.
    pub timeout: Duration,
    /// `Some(bound)`: push before UPDATE_DONE (write-through), the update
    /// waiting at most `bound` for it; `None`: push after the update.
    pub write_through: Option<Duration>,
    /// The token the proxies' admin listeners require
    /// (`Authorization: Bearer <token>` on every push); `None`: none sent.
    pub admin_token: Option<tierstack_secret::Secret>,
}

/// What to push after an update.
pub(crate) enum Content {
    /// Generate the body at the version `update_done` returned.
    Generate { size: usize },
    /// The body the update stored, for `version` (store mode).
    /// (For a write-through push `version` is the one UPDATE_PROCEED granted.)
    Stored { version: u64, body: Bytes },
}

/// Counters of the push path, in the server's `/_tierstack/stats` as `push`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PushStats {
    pub policy: String,
    /// Updates the push path considered.
    pub updates: u64,
    /// Cache-state reads, their total time, and the ones that failed
    /// (that proxy was skipped for that update).
    pub state_reads: u64,
    pub state_read_ns: u64,
    pub state_read_errors: u64,
    /// Decisions, per (update, proxy).
    pub decided_push: u64,
    pub decided_never: u64,
    pub decided_not_cached: u64,
    pub decided_not_recent: u64,
    pub decided_unlikely: u64,
    /// Pushes sent, and their outcome: installed (2xx), declined by the
    /// proxy (superseded, refused, too large), failed (unreachable, timeout).
    pub pushes_sent: u64,
    pub pushes_ok: u64,
    pub pushes_declined: u64,
    pub pushes_failed: u64,
    /// Body bytes of the pushes sent.
    pub push_bytes: u64,
    /// Updates whose push was skipped because too many were in flight.
    pub skipped_busy: u64,
    /// Write-through: updates that waited for their push before
    /// UPDATE_DONE, the total wait, and the waits cut short by the bound.
    #[serde(default)]
    pub write_through: bool,
    #[serde(default)]
    pub write_through_updates: u64,
    #[serde(default)]
    pub write_through_wait_ns: u64,
    #[serde(default)]
    pub write_through_timeouts: u64,
}

#[derive(Default)]
struct Counters {
    updates: AtomicU64,
    state_reads: AtomicU64,
    state_read_ns: AtomicU64,
    state_read_errors: AtomicU64,
    decided_push: AtomicU64,
    decided_never: AtomicU64,
    decided_not_cached: AtomicU64,
    decided_not_recent: AtomicU64,
    decided_unlikely: AtomicU64,
    pushes_sent: AtomicU64,
    pushes_ok: AtomicU64,
    pushes_declined: AtomicU64,
    pushes_failed: AtomicU64,
    push_bytes: AtomicU64,
    skipped_busy: AtomicU64,
    write_through_updates: AtomicU64,
    write_through_wait_ns: AtomicU64,
    write_through_timeouts: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum PushConfigError {
    #[error("bad proxy URL {0:?}: expected http://host:port")]
    BadUrl(String),
    #[error("at most {PUSH_PROXIES_MAX} proxies")]
    TooManyProxies,
    #[error("write-through bound {0:?} must be between 1 ms and {WRITE_THROUGH_TIMEOUT_MAX:?}")]
    BadWriteThroughTimeout(Duration),
    #[error("the admin token cannot be sent in a header (it must be printable ASCII without spaces)")]
    BadAdminToken,
}

/// Longest write-through bound accepted (it may lengthen every update).
pub const WRITE_THROUGH_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// Default write-through bound (`tierstack app-server --push-write-through`).
pub const WRITE_THROUGH_TIMEOUT_DEFAULT: Duration = Duration::from_millis(500);

pub(crate) struct Pusher {
    policy: PushPolicy,
    timeout: Duration,
    write_through: Option<Duration>,
    proxies: Vec<(NodeId, Uri)>,
    /// `Bearer <admin token>`, marked sensitive (never logged by hyper).
    authorization: Option<HeaderValue>,
    reader: CacheStateReader,
    client: Client<HttpConnector, Full<Bytes>>,
    rates: Mutex<UpdateRates>,
    in_flight: Arc<Semaphore>,
    counters: Counters,
    clock: SystemClock,
}

/// The `Authorization` value that carries `token`.
fn bearer(token: &tierstack_secret::Secret) -> Result<HeaderValue, PushConfigError> {
    let token = token.as_bytes();
    if token.is_empty() || !token.iter().all(|b| b.is_ascii_graphic()) {
        return Err(PushConfigError::BadAdminToken);
    }
    let mut value =
        HeaderValue::from_bytes(&[b"Bearer ", token].concat()).map_err(|_| PushConfigError::BadAdminToken)?;
    value.set_sensitive(true);
    Ok(value)
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Pusher {
    pub(crate) fn new(config: PushConfig) -> Result<Self, PushConfigError> {
        if config.proxies.len() > PUSH_PROXIES_MAX {
            return Err(PushConfigError::TooManyProxies);
        }
        if let Some(bound) = config.write_through {
            if bound < Duration::from_millis(1) || bound > WRITE_THROUGH_TIMEOUT_MAX {
                return Err(PushConfigError::BadWriteThroughTimeout(bound));
            }
        }
        let proxies = config
            .proxies
            .iter()
            .map(|p| match p.url.trim_end_matches('/').parse::<Uri>() {
                Ok(uri) if uri.scheme_str() == Some("http") && uri.authority().is_some() => Ok((p.node, uri)),
                _ => Err(PushConfigError::BadUrl(p.url.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let authorization = config.admin_token.as_ref().map(bearer).transpose()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(Self {
            authorization,
            policy: config.policy,
            timeout: config.timeout,
            write_through: config.write_through,
            proxies,
            reader: CacheStateReader::new(config.fabric),
            client: Client::builder(TokioExecutor::new()).build(connector),
            rates: Mutex::new(UpdateRates::new()),
            in_flight: Arc::new(Semaphore::new(PUSHES_IN_FLIGHT_MAX)),
            counters: Counters::default(),
            clock: SystemClock,
        })
    }

    pub(crate) fn stats(&self) -> PushStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        PushStats {
            policy: self.policy.to_string(),
            updates: load(&c.updates),
            state_reads: load(&c.state_reads),
            state_read_ns: load(&c.state_read_ns),
            state_read_errors: load(&c.state_read_errors),
            decided_push: load(&c.decided_push),
            decided_never: load(&c.decided_never),
            decided_not_cached: load(&c.decided_not_cached),
            decided_not_recent: load(&c.decided_not_recent),
            decided_unlikely: load(&c.decided_unlikely),
            pushes_sent: load(&c.pushes_sent),
            pushes_ok: load(&c.pushes_ok),
            pushes_declined: load(&c.pushes_declined),
            pushes_failed: load(&c.pushes_failed),
            push_bytes: load(&c.push_bytes),
            skipped_busy: load(&c.skipped_busy),
            write_through: self.write_through.is_some(),
            write_through_updates: load(&c.write_through_updates),
            write_through_wait_ns: load(&c.write_through_wait_ns),
            write_through_timeouts: load(&c.write_through_timeouts),
        }
    }

    fn count(&self, decision: Decision) {
        let c = &self.counters;
        let counter = match decision {
            Decision::Push => &c.decided_push,
            Decision::Never => &c.decided_never,
            Decision::NotCached => &c.decided_not_cached,
            Decision::NotRecent => &c.decided_not_recent,
            Decision::Unlikely => &c.decided_unlikely,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// True if updates push before UPDATE_DONE ([`Pusher::write_through`]).
    pub(crate) fn is_write_through(&self) -> bool {
        self.write_through.is_some()
    }

    /// Starts the push of an update that completed with `deps` (the header
    /// `update_done` returned); returns at once.
    pub(crate) fn spawn_after_update(self: &Arc<Self>, name: &str, content: Content, deps: String) {
        let _ = self.spawn_push(name, content, deps);
    }

    /// Starts the push in a task of its own (`None`: too many in flight,
    /// skipped and counted).
    fn spawn_push(self: &Arc<Self>, name: &str, content: Content, deps: String) -> Option<tokio::task::JoinHandle<()>> {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.counters.skipped_busy.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let pusher = self.clone();
        let name = name.to_string();
        Some(tokio::spawn(async move {
            pusher.after_update(&name, content, &deps).await;
            drop(permit);
        }))
    }

    /// Write-through: pushes `content` with the versions UPDATE_PROCEED
    /// granted (`deps`) and waits for the push to end, at most the
    /// write-through bound; to be called before UPDATE_DONE. Past the bound
    /// the push goes on in its task (each step bounded by the push timeout)
    /// and the wait is counted as timed out. Returns whether the push ended
    /// within the bound.
    pub(crate) async fn write_through(self: &Arc<Self>, name: &str, content: Content, deps: String) -> bool {
        let bound = self.write_through.unwrap_or(self.timeout);
        let started = instant_now();
        let Some(push) = self.spawn_push(name, content, deps) else { return false };
        let ended = tokio::time::timeout(bound, push).await.is_ok();
        let c = &self.counters;
        c.write_through_updates.fetch_add(1, Ordering::Relaxed);
        c.write_through_wait_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
        if !ended {
            c.write_through_timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(name, ?bound, "write-through push still running; the update goes on");
        }
        ended
    }

    async fn after_update(self: Arc<Self>, name: &str, content: Content, deps: &str) {
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let key = key_of(name);
        let Some(version) =
            DepsHeader::parse(deps).ok().and_then(|h| h.deps.iter().find(|d| d.key == key).map(|d| d.version))
        else {
            tracing::warn!(name, "update_done returned no version for the document; not pushing");
            return;
        };
        // Generate once; every chosen proxy gets the same bytes. A stored
        // body of another version than the header's must not be paired with it.
        let body = match content {
            Content::Generate { size } => generate_body(name, version, size),
            Content::Stored { version: stored, body } if stored == version => body,
            Content::Stored { version: stored, .. } => {
                tracing::warn!(
                    name,
                    stored,
                    version,
                    "stored body is not at the version update_done returned; not pushing"
                );
                return;
            }
        };
        let doc = fingerprint(&format!("/doc/{name}"));
        let update_rate_hz = self.rates.lock().ok().and_then(|mut rates| rates.record(doc, self.clock.now_ns()));
        let context = UpdateContext { update_rate_hz };
        if !self.policy.reads_state() {
            for _ in &self.proxies {
                self.count(Decision::Never);
            }
            return;
        }
        // One cache-state read per proxy, all at once.
        let mut reads = JoinSet::new();
        for (index, (node, _)) in self.proxies.iter().enumerate() {
            let pusher = self.clone();
            let node = *node;
            reads.spawn(async move {
                let started = instant_now();
                let state = tokio::time::timeout(pusher.timeout, pusher.reader.read(node)).await;
                (index, state, elapsed_ns(started))
            });
        }
        let mut chosen = Vec::new();
        while let Some(joined) = reads.join_next().await {
            let Ok((index, state, read_ns)) = joined else { continue };
            self.counters.state_reads.fetch_add(1, Ordering::Relaxed);
            self.counters.state_read_ns.fetch_add(read_ns, Ordering::Relaxed);
            match state {
                Ok(Ok(state)) => {
                    let decision = decide(self.policy, doc, &state, &context);
                    self.count(decision);
                    if decision.is_push() {
                        chosen.push(index);
                    }
                }
                Ok(Err(e)) => {
                    self.counters.state_read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(proxy = index, error = %e, "cache state unreadable; not pushing there");
                }
                Err(_) => {
                    self.counters.state_read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(proxy = index, "cache state read timed out; not pushing there");
                }
            }
        }
        if chosen.is_empty() {
            return;
        }
        let Ok(deps_value) = HeaderValue::from_str(deps) else { return };
        let mut pushes = JoinSet::new();
        for index in chosen {
            let Some((_, base)) = self.proxies.get(index) else { continue };
            let uri =
                format!("{}{}{}", base.to_string().trim_end_matches('/'), tierstack_pushpull::PUSH_PATH_PREFIX, name);
            let Ok(uri) = uri.parse::<Uri>() else { continue };
            let mut request = Request::new(Full::new(body.clone()));
            *request.method_mut() = Method::PUT;
            *request.uri_mut() = uri;
            request.headers_mut().insert(DEPS_HEADER, deps_value.clone());
            request.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            if let Some(authorization) = &self.authorization {
                request.headers_mut().insert(AUTHORIZATION, authorization.clone());
            }
            self.counters.pushes_sent.fetch_add(1, Ordering::Relaxed);
            self.counters.push_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
            let pusher = self.clone();
            pushes.spawn(async move {
                let exchange = async {
                    let response = pusher.client.request(request).await?;
                    let status = response.status();
                    // Read the (short) answer so the connection is reused.
                    let _ = response.into_body().collect().await;
                    Ok::<_, hyper_util::client::legacy::Error>(status)
                };
                let outcome = tokio::time::timeout(pusher.timeout, exchange).await;
                let counter = match outcome {
                    Ok(Ok(status)) if status.is_success() => &pusher.counters.pushes_ok,
                    Ok(Ok(status)) => {
                        tracing::debug!(proxy = index, %status, "push declined");
                        &pusher.counters.pushes_declined
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(proxy = index, error = %e, "push failed");
                        &pusher.counters.pushes_failed
                    }
                    Err(_) => &pusher.counters.pushes_failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            });
        }
        while pushes.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AppServer, AppServerConfig};
    use hyper::StatusCode;
    use tierstack_cluster::{local_cluster, Backend, LocalCluster};
    use tierstack_coherent::module::ModuleServer;
    use tierstack_coherent::version_table::{Incarnation, VersionTable};
    use tierstack_pushpull::state::CacheStateConfig;
    use tierstack_pushpull::CacheStateWriter;
    use tierstack_tier_http::RequestBody;
    use tierstack_tier_http::{serve, text, Stop};

    type Received = Arc<Mutex<Vec<(String, String, String)>>>;
    /// Each push's `Authorization` value, if any.
    type Authorizations = Arc<Mutex<Vec<Option<String>>>>;
    /// The admin token every test server sends.
    const ADMIN_TOKEN: &str = "the-proxies-admin-token";

    /// Node 0: the module; node 1: a proxy's cache state and an HTTP
    /// endpoint that records pushes; node 2: the application server.
    struct Setup {
        _dir: tempfile::TempDir,
        _cluster: LocalCluster,
        state: CacheStateWriter,
        received: Received,
        authorizations: Authorizations,
        app: std::net::SocketAddr,
        client: Client<HttpConnector, Full<Bytes>>,
    }

    async fn recorder(received: Received, authorizations: Authorizations) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler = Arc::new(move |request: Request<RequestBody>| {
            let (received, authorizations) = (received.clone(), authorizations.clone());
            async move {
                let authorization = request.headers().get(AUTHORIZATION).map(|v| v.to_str().unwrap().to_string());
                authorizations.lock().unwrap().push(authorization);
                let path = request.uri().path().to_string();
                let deps = request.headers().get(DEPS_HEADER).map(|v| v.to_str().unwrap().to_string()).unwrap();
                let body = request.into_body().collect().await.unwrap().to_bytes();
                received.lock().unwrap().push((path, deps, String::from_utf8_lossy(&body).to_string()));
                text(StatusCode::NO_CONTENT, "")
            }
        });
        tokio::spawn(serve(listener, handler, Stop::new()));
        addr
    }

    impl Setup {
        /// `targets(push_url)` lists the proxies the server pushes to.
        async fn new(policy: &str, targets: impl FnOnce(String) -> Vec<PushTarget>) -> Setup {
            Self::with_store(policy, targets, None).await
        }

        async fn with_store(
            policy: &str,
            targets: impl FnOnce(String) -> Vec<PushTarget>,
            store: Option<crate::StoreConfig>,
        ) -> Setup {
            Self::with_options(policy, targets, store, None, Duration::from_secs(2)).await
        }

        async fn with_options(
            policy: &str,
            targets: impl FnOnce(String) -> Vec<PushTarget>,
            store: Option<crate::StoreConfig>,
            write_through: Option<Duration>,
            timeout: Duration,
        ) -> Setup {
            let dir = tempfile::tempdir().unwrap();
            let cluster = local_cluster(Backend::Shm, 3).unwrap();
            let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 64, Incarnation(5)).unwrap());
            let socket = dir.path().join("module.sock");
            let listener = ModuleServer::bind(&socket).await.unwrap();
            let module = ModuleServer::new(table);
            tokio::spawn(async move { module.serve_on(listener).await });
            let state = CacheStateWriter::create(cluster.fabric(1).as_ref(), CacheStateConfig::default()).unwrap();
            let received: Received = Arc::default();
            let authorizations: Authorizations = Arc::default();
            let push_url = format!("http://{}", recorder(received.clone(), authorizations.clone()).await);
            let config = AppServerConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                module_socket: socket,
                module_uids: Vec::new(),
                documents: vec![("a".into(), 100), ("b".into(), 50)],
                compute_threads: 0,
                store,
                publish: false,
            };
            let push = PushConfig {
                fabric: cluster.fabric(2).clone(),
                proxies: targets(push_url),
                policy: policy.parse().unwrap(),
                timeout,
                write_through,
                admin_token: Some(tierstack_secret::Secret::new(ADMIN_TOKEN.as_bytes().to_vec())),
            };
            let server = AppServer::bind_with_push(config, Some(push)).await.unwrap();
            let app = server.local_addr().unwrap();
            tokio::spawn(server.run(Stop::new()));
            Setup {
                _dir: dir,
                _cluster: cluster,
                state,
                received,
                authorizations,
                app,
                client: Client::builder(TokioExecutor::new()).build_http(),
            }
        }

        async fn update(&self, name: &str) {
            let mut request = Request::new(Full::new(Bytes::new()));
            *request.method_mut() = Method::PUT;
            *request.uri_mut() = format!("http://{}/doc/{name}", self.app).parse().unwrap();
            let response = self.client.request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }

        async fn stats_now(&self) -> PushStats {
            let uri = format!("http://{}/_tierstack/stats", self.app).parse().unwrap();
            let body = self.client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
            let stats: serde_json::Value = serde_json::from_slice(&body).unwrap();
            serde_json::from_value(stats["push"].clone()).unwrap()
        }

        /// Waits (bounded) until `updates` updates went through the push
        /// path, with `decisions` (update, proxy) decisions made and every push answered.
        async fn stats_after(&self, updates: u64, decisions: u64) -> PushStats {
            let deadline = instant_now() + Duration::from_secs(20);
            loop {
                let uri = format!("http://{}/_tierstack/stats", self.app).parse().unwrap();
                let body = self.client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
                let stats: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let push: PushStats = serde_json::from_value(stats["push"].clone()).unwrap();
                let settled = push.updates >= updates
                    && push.state_reads + push.decided_never >= decisions
                    && push.pushes_ok + push.pushes_declined + push.pushes_failed == push.pushes_sent
                    && push.decided_push == push.pushes_sent;
                if settled || instant_now() > deadline {
                    return push;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    fn one_proxy(url: String) -> Vec<PushTarget> {
        vec![PushTarget { node: NodeId(1), url }]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pushes_the_new_version_to_a_proxy_holding_a_copy() {
        let s = Setup::new("push", one_proxy).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        s.state.record_access(fingerprint("/doc/b"), false, 2);
        s.update("a").await;
        s.update("b").await;
        let stats = s.stats_after(2, 2).await;
        assert_eq!((stats.decided_push, stats.decided_not_cached), (1, 1), "{stats:?}");
        assert_eq!((stats.pushes_sent, stats.pushes_ok, stats.push_bytes), (1, 1, 100));
        let received = s.received.lock().unwrap().clone();
        assert_eq!(received.len(), 1);
        let (path, deps, body) = &received[0];
        assert_eq!(path, "/_tierstack/push/doc/a");
        let deps = DepsHeader::parse(deps).unwrap();
        assert_eq!(deps.deps[0].key, "doc/a");
        assert_eq!(deps.deps[0].version, 2, "the version the update produced");
        assert_eq!(body.as_bytes(), &crate::generate_body("a", 2, 100)[..], "generated at that version");
        assert!(body.starts_with("doc=a version=2 fnv1a64="), "{body:?}");
        let bearer = format!("Bearer {ADMIN_TOKEN}");
        assert_eq!(*s.authorizations.lock().unwrap(), [Some(bearer)], "the push carries the admin token");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_store_mode_pushes_the_stored_body() {
        let s = Setup::with_store("push", one_proxy, Some(crate::StoreConfig::default())).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        s.update("a").await;
        s.update("a").await;
        let stats = s.stats_after(2, 2).await;
        assert_eq!((stats.pushes_sent, stats.pushes_ok), (2, 2), "{stats:?}");
        let mut received = s.received.lock().unwrap().clone();
        received.sort_by(|x, y| x.1.cmp(&y.1));
        for ((_, deps, body), version) in received.iter().zip([2, 3]) {
            assert_eq!(DepsHeader::parse(deps).unwrap().deps[0].version, version);
            assert_eq!(body.as_bytes(), &crate::generate_body("a", version, 100)[..], "the body stored for {version}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pull_never_reads_cache_states_nor_pushes() {
        let s = Setup::new("pull", one_proxy).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        s.update("a").await;
        let stats = s.stats_after(1, 1).await;
        assert_eq!((stats.decided_never, stats.state_reads, stats.pushes_sent), (1, 0, 0), "{stats:?}");
        assert!(s.received.lock().unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_or_stateless_proxies_are_skipped_and_counted() {
        // Node 1 has a state but its HTTP endpoint is gone; node 2 (the
        // server itself) has no cache state; node 9 is not in the cluster.
        // Bound but never listening: the port stays ours, and connecting is refused.
        let reserved = tokio::net::TcpSocket::new_v4().unwrap();
        reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let closed = reserved.local_addr().unwrap();
        let s = Setup::new("push", move |_| {
            vec![
                PushTarget { node: NodeId(1), url: format!("http://{closed}") },
                PushTarget { node: NodeId(2), url: format!("http://{closed}") },
                PushTarget { node: NodeId(9), url: format!("http://{closed}") },
            ]
        })
        .await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        s.update("a").await;
        let stats = s.stats_after(1, 3).await;
        assert_eq!(stats.state_reads, 3, "{stats:?}");
        assert_eq!(stats.state_read_errors, 2, "no region on node 2, no node 9: {stats:?}");
        assert_eq!((stats.pushes_sent, stats.pushes_failed), (1, 1), "{stats:?}");
    }

    /// A TCP endpoint that accepts connections and never answers (a
    /// stopped or overloaded proxy); the connections are held until the
    /// test ends.
    async fn silent_endpoint() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn write_through_installs_the_new_version_before_the_update_answers() {
        let s =
            Setup::with_options("push", one_proxy, None, Some(Duration::from_secs(10)), Duration::from_secs(10)).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        s.update("a").await;
        // No waiting: the push was received before the update's response.
        let received = s.received.lock().unwrap().clone();
        assert_eq!(received.len(), 1, "pushed before UPDATE_DONE");
        let (path, deps, body) = &received[0];
        assert_eq!(path, "/_tierstack/push/doc/a");
        assert_eq!(DepsHeader::parse(deps).unwrap().deps[0].version, 2, "the version UPDATE_PROCEED granted");
        assert_eq!(body.as_bytes(), &crate::generate_body("a", 2, 100)[..]);
        let stats = s.stats_after(1, 1).await;
        assert!(stats.write_through, "{stats:?}");
        assert_eq!((stats.write_through_updates, stats.write_through_timeouts), (1, 0), "{stats:?}");
        assert_eq!((stats.pushes_sent, stats.pushes_ok), (1, 1), "{stats:?}");
        assert!(stats.write_through_wait_ns > 0, "{stats:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn write_through_in_store_mode_pushes_each_stored_body_in_order() {
        let store = Some(crate::StoreConfig::default());
        let s =
            Setup::with_options("push", one_proxy, store, Some(Duration::from_secs(10)), Duration::from_secs(10)).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        for expected in 1..=3 {
            s.update("a").await;
            assert_eq!(s.received.lock().unwrap().len(), expected, "update {expected} pushed before it answered");
        }
        let received = s.received.lock().unwrap().clone();
        for ((_, deps, body), version) in received.iter().zip([2, 3, 4]) {
            assert_eq!(DepsHeader::parse(deps).unwrap().deps[0].version, version);
            assert_eq!(body.as_bytes(), &crate::generate_body("a", version, 100)[..], "the body stored for {version}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_proxy_delays_a_write_through_update_only_up_to_the_bound() {
        let silent = silent_endpoint().await;
        // Pushes would wait 60 s; the update waits at most 200 ms for them.
        let targets = move |_| vec![PushTarget { node: NodeId(1), url: format!("http://{silent}") }];
        let s =
            Setup::with_options("push", targets, None, Some(Duration::from_millis(200)), Duration::from_secs(60)).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_secs(30), s.update("a"))
                .await
                .expect("the update answered although the proxy never does");
        }
        let stats = s.stats_now().await;
        assert_eq!((stats.write_through_updates, stats.write_through_timeouts), (2, 2), "{stats:?}");
        assert_eq!(stats.pushes_sent, 2, "{stats:?}");
        assert_eq!(stats.pushes_ok + stats.pushes_failed, 0, "still waiting on the silent proxy: {stats:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_proxy_fails_write_through_pushes_fast_and_counted() {
        let reserved = tokio::net::TcpSocket::new_v4().unwrap();
        reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let closed = reserved.local_addr().unwrap();
        let targets = move |_| vec![PushTarget { node: NodeId(1), url: format!("http://{closed}") }];
        let s =
            Setup::with_options("push", targets, None, Some(Duration::from_secs(60)), Duration::from_secs(60)).await;
        s.state.record_access(fingerprint("/doc/a"), true, 1);
        tokio::time::timeout(Duration::from_secs(30), s.update("a")).await.expect("a refused push ends the wait");
        let stats = s.stats_after(1, 1).await;
        assert_eq!((stats.pushes_sent, stats.pushes_failed), (1, 1), "{stats:?}");
        assert_eq!((stats.write_through_updates, stats.write_through_timeouts), (1, 0), "{stats:?}");
    }

    #[test]
    fn write_through_bounds_are_checked() {
        let cluster = local_cluster(Backend::Shm, 1).unwrap();
        let config = |bound| PushConfig {
            fabric: cluster.fabric(0).clone(),
            proxies: vec![],
            policy: PushPolicy::Push,
            timeout: Duration::from_secs(1),
            write_through: Some(bound),
            admin_token: None,
        };
        for bad in [Duration::ZERO, WRITE_THROUGH_TIMEOUT_MAX + Duration::from_millis(1)] {
            assert!(matches!(Pusher::new(config(bad)), Err(PushConfigError::BadWriteThroughTimeout(_))), "{bad:?}");
        }
        assert!(Pusher::new(config(Duration::from_millis(1))).is_ok());
    }

    #[test]
    fn an_admin_token_that_cannot_be_a_header_is_refused() {
        for bad in [&b"two words"[..], b"line\nbreak", b"\xff\xfe"] {
            let token = tierstack_secret::Secret::new(bad.to_vec());
            assert!(matches!(bearer(&token), Err(PushConfigError::BadAdminToken)), "{bad:?}");
        }
        let value = bearer(&tierstack_secret::Secret::new(b"abc123".to_vec())).unwrap();
        assert_eq!(value, "Bearer abc123");
        assert!(value.is_sensitive());
    }
}
