//! Test support: a real proxy (node 1) in front of an in-process origin that
//! answers `/doc/<name>` with the version table's current header (node 0),
//! all on shm, plus hooks that stop a request at a chosen point so tests can
//! drive interleavings without sleeping.

use crate::state::State;
use crate::{CacheMode, Proxy, ProxyConfig, ProxyStats};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_coherent::version_table::VersionTable;
use tierstack_coherent::{Incarnation, DEPS_HEADER};
use tierstack_fabric::{Fabric, NodeId};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{serve, text, Stop};
use tokio::sync::{oneshot, Notify};

/// Where a request stops once, if armed.
#[derive(Default)]
pub(crate) struct Hooks {
    /// After a request-path version check has its verdict, before the
    /// proxy acts on it.
    pub after_check: Mutex<Option<Pause>>,
}

/// One stop: the request signals `reached`, then waits for `resume`.
pub(crate) struct Pause {
    reached: oneshot::Sender<()>,
    resume: oneshot::Receiver<()>,
}

/// The test's end of a [`Pause`].
pub(crate) struct PauseControl {
    reached: oneshot::Receiver<()>,
    resume: oneshot::Sender<()>,
}

impl Pause {
    pub(crate) fn new() -> (Pause, PauseControl) {
        let (reached_tx, reached_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        (Pause { reached: reached_tx, resume: resume_rx }, PauseControl { reached: reached_rx, resume: resume_tx })
    }
}

impl PauseControl {
    /// Waits until the paused request got there.
    pub(crate) async fn reached(&mut self) {
        (&mut self.reached).await.expect("the paused request went away");
    }

    pub(crate) fn resume(self) {
        let _ = self.resume.send(());
    }
}

impl Hooks {
    /// Stops here once if armed (takes the pause, so later requests pass).
    pub(crate) async fn after_check(&self) {
        let pause = self.after_check.lock().ok().and_then(|mut armed| armed.take());
        if let Some(pause) = pause {
            let _ = pause.reached.send(());
            let _ = pause.resume.await;
        }
    }
}

/// The origin's switches, shared with the test.
#[derive(Default)]
pub(crate) struct Origin {
    /// Requests received.
    pub requests: AtomicU64,
    /// Answer with `Cache-Control: no-store`.
    pub no_store: AtomicBool,
    /// Answer `404 Not Found` (still with the dependency header).
    pub not_found: AtomicBool,
    /// While set, responses are generated (at the current versions) and
    /// then held until `release`.
    pub hold: AtomicBool,
    pub release: Notify,
}

impl Origin {
    pub(crate) fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
        self.release.notify_waiters();
    }
}

pub(crate) struct Setup {
    _dir: tempfile::TempDir,
    pub module_fabric: Arc<ShmFabric>,
    pub table: Arc<VersionTable>,
    pub origin: Arc<Origin>,
    pub proxy: SocketAddr,
    /// The proxy's admin listener: pushes and stats.
    pub admin: SocketAddr,
    pub state: Arc<State>,
    pub client: Client<HttpConnector, Full<Bytes>>,
}

/// What a GET through the proxy returned.
#[derive(Debug)]
pub(crate) struct Got {
    pub status: StatusCode,
    pub x_cache: String,
    pub coalesced: bool,
    pub body: String,
}

impl Setup {
    pub(crate) async fn new(mode: CacheMode, cache_bytes: usize) -> Setup {
        Self::with_options(mode, cache_bytes, crate::ProxyOptions::default()).await
    }

    pub(crate) async fn with_options(mode: CacheMode, cache_bytes: usize, options: crate::ProxyOptions) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let module_fabric = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0))).unwrap();
        let pages = tierstack_coherent::PagesConfig { count: 16, page_bytes: 4096 };
        let table =
            Arc::new(VersionTable::create_with_pages(module_fabric.as_ref(), 16, pages, Incarnation(7)).unwrap());
        let proxy_fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(1))).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin_addr = listener.local_addr().unwrap();
        let origin = Arc::new(Origin::default());
        let (origin_table, o) = (table.clone(), origin.clone());
        let handler = Arc::new(move |request: Request<RequestBody>| {
            let name = request.uri().path().trim_start_matches("/doc/").to_string();
            let key = format!("doc/{name}");
            let slot = origin_table.slot_of(&key).unwrap();
            let deps = origin_table.header(&[(key, slot)]).unwrap().to_string();
            let mut response = text(StatusCode::OK, format!("origin {deps}"));
            response.headers_mut().insert(DEPS_HEADER, deps.parse().unwrap());
            if o.not_found.load(Ordering::SeqCst) {
                *response.status_mut() = StatusCode::NOT_FOUND;
            }
            if o.no_store.load(Ordering::SeqCst) {
                response.headers_mut().insert("cache-control", "no-store".parse().unwrap());
            }
            // Counted once generated, so a test that sees the count knows
            // the versions the response carries.
            o.requests.fetch_add(1, Ordering::SeqCst);
            let o = o.clone();
            async move {
                if o.hold.load(Ordering::SeqCst) {
                    o.release.notified().await;
                }
                response
            }
        });
        tokio::spawn(serve(listener, handler, Stop::new()));
        let config = ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstreams: vec![format!("http://{origin_addr}")],
            mode,
            cache_bytes,
            upstream_timeout: Duration::from_secs(20),
            fabric: Some(proxy_fabric),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        };
        let proxy = Proxy::bind_with(config, options).await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let admin = proxy.admin_addr().unwrap();
        let state = proxy.state.clone();
        tokio::spawn(proxy.run(Stop::new()));
        Setup {
            _dir: dir,
            module_fabric,
            table,
            origin,
            proxy: addr,
            admin,
            state,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub(crate) fn deps(&self, name: &str) -> String {
        let key = format!("doc/{name}");
        let slot = self.table.slot_of(&key).unwrap();
        self.table.header(&[(key, slot)]).unwrap().to_string()
    }

    pub(crate) fn bump(&self, name: &str) {
        self.table.bump(self.table.slot_of(&format!("doc/{name}")).unwrap()).unwrap();
    }

    pub(crate) fn origin_requests(&self) -> u64 {
        self.origin.requests.load(Ordering::SeqCst)
    }

    /// Arms a one-time stop after the next request-path version check.
    pub(crate) fn pause_after_check(&self) -> PauseControl {
        let (pause, control) = Pause::new();
        *self.state.hooks.after_check.lock().unwrap() = Some(pause);
        control
    }

    pub(crate) async fn push(&self, name: &str, deps: Option<&str>, body: &str) -> StatusCode {
        self.push_to(self.admin, name, deps, body).await
    }

    pub(crate) async fn push_to(&self, to: SocketAddr, name: &str, deps: Option<&str>, body: &str) -> StatusCode {
        self.admin_request(to, Method::PUT, &format!("{}{name}", crate::PUSH_PATH_PREFIX), deps, body, None).await.0
    }

    /// `method path` to `to` with `deps` and `body`, and `authorization`
    /// as given; the status and whether it asked for a bearer token.
    pub(crate) async fn admin_request(
        &self,
        to: SocketAddr,
        method: Method,
        path: &str,
        deps: Option<&str>,
        body: &str,
        authorization: Option<&str>,
    ) -> (StatusCode, bool) {
        let mut request = Request::new(Full::new(Bytes::from(body.to_string())));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{to}{path}").parse().unwrap();
        if let Some(deps) = deps {
            request.headers_mut().insert(DEPS_HEADER, deps.parse().unwrap());
        }
        if let Some(authorization) = authorization {
            request.headers_mut().insert(hyper::header::AUTHORIZATION, authorization.parse().unwrap());
        }
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        let challenged = response
            .headers()
            .get(hyper::header::WWW_AUTHENTICATE)
            .is_some_and(|v| v.to_str().unwrap_or_default().starts_with("Bearer"));
        response.into_body().collect().await.unwrap();
        (status, challenged)
    }

    /// (X-Cache, body) of a GET that must succeed.
    pub(crate) async fn get(&self, name: &str) -> (String, String) {
        let got = self.get_full(name).await;
        assert_eq!(got.status, StatusCode::OK, "{got:?}");
        (got.x_cache, got.body)
    }

    pub(crate) async fn get_full(&self, name: &str) -> Got {
        self.request(Method::GET, name).await
    }

    /// `method /doc/<name>` through the proxy, with an empty body.
    pub(crate) async fn request(&self, method: Method, name: &str) -> Got {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{}/doc/{name}", self.proxy).parse().unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_string());
        let x_cache = header(crate::X_CACHE).unwrap_or_default();
        let coalesced = header(crate::X_CACHE_COALESCED).is_some();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Got { status, x_cache, coalesced, body: String::from_utf8_lossy(&body).to_string() }
    }

    pub(crate) async fn stats(&self) -> ProxyStats {
        let uri = format!("http://{}/_tierstack/stats", self.admin).parse().unwrap();
        let body = self.client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }
}

/// A header map of `fields` in order (repeated names appended), for the
/// pure modules' unit tests.
pub(crate) fn headers(fields: &[(&str, &str)]) -> hyper::HeaderMap {
    let mut map = hyper::HeaderMap::new();
    for (name, value) in fields {
        map.append(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            hyper::header::HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}
