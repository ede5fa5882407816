//! The proxy against a scripted origin: every kind of bad input gets a clear
//! answer, and nothing that cannot be validated is ever served from cache.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_coherent::version_table::{Incarnation, VersionTable};
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_proxy::{CacheMode, Proxy, ProxyConfig, ProxyStats};
use tierstack_tier_http::{serve, text, Body, Stop};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The origin's behaviour, shared with the test.
struct Origin {
    table: Mutex<Option<Arc<VersionTable>>>,
    /// Overrides the dependency header (for malformed ones).
    deps_override: Mutex<Option<String>>,
    cache_control: Mutex<Option<&'static str>>,
    requests: Mutex<u64>,
    /// While set, responses are generated and then held until `release`.
    hold: std::sync::atomic::AtomicBool,
    release: tokio::sync::Notify,
}

fn origin_response(origin: &Origin, path: &str) -> Response<Body> {
    let response = generate(origin, path);
    // Counted once generated, so a test that sees the count knows the
    // versions the response carries.
    *origin.requests.lock().unwrap() += 1;
    response
}

fn generate(origin: &Origin, path: &str) -> Response<Body> {
    let Some(name) = path.strip_prefix("/doc/") else { return text(StatusCode::NOT_FOUND, "nope") };
    if name == "missing" {
        return text(StatusCode::NOT_FOUND, "no such document");
    }
    let table = origin.table.lock().unwrap().clone();
    let deps = match (origin.deps_override.lock().unwrap().clone(), table) {
        (Some(raw), _) => raw,
        (None, Some(table)) => {
            let key = format!("doc/{name}");
            let slot = table.slot_of(&key).unwrap();
            table.header(&[(key, slot)]).unwrap().to_string()
        }
        (None, None) => return text(StatusCode::SERVICE_UNAVAILABLE, "module down"),
    };
    let body = if name == "big" { "x".repeat(4 << 20) } else { format!("{name} at {deps}") };
    let mut response = text(StatusCode::OK, body);
    response.headers_mut().insert("x-tierstack-deps", deps.parse().unwrap());
    if let Some(cc) = *origin.cache_control.lock().unwrap() {
        response.headers_mut().insert("cache-control", cc.parse().unwrap());
    }
    response
}

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    module_fabric: Option<Arc<ShmFabric>>,
    origin: Arc<Origin>,
    proxy: SocketAddr,
    admin: SocketAddr,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Setup {
    async fn new(mode: CacheMode, origin_up: bool) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let module_fabric = ShmFabric::open(ShmConfig::new(&root, NodeId(0))).unwrap();
        let table = Arc::new(VersionTable::create(module_fabric.as_ref(), 16, Incarnation(11)).unwrap());
        let proxy_fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(&root, NodeId(1))).unwrap();
        let origin = Arc::new(Origin {
            table: Mutex::new(Some(table)),
            deps_override: Mutex::new(None),
            cache_control: Mutex::new(None),
            requests: Mutex::new(0),
            hold: std::sync::atomic::AtomicBool::new(false),
            release: tokio::sync::Notify::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin_addr = listener.local_addr().unwrap();
        if origin_up {
            let o = origin.clone();
            let handler = Arc::new(move |req: Request<tierstack_tier_http::RequestBody>| {
                // Generated now, at the current versions; maybe delivered later.
                let response = origin_response(&o, req.uri().path());
                let o = o.clone();
                async move {
                    if o.hold.load(std::sync::atomic::Ordering::SeqCst) {
                        o.release.notified().await;
                    }
                    response
                }
            });
            tokio::spawn(serve(listener, handler, Stop::new()));
        } else {
            drop(listener);
        }
        let proxy = Proxy::bind(ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstreams: vec![format!("http://{origin_addr}")],
            mode,
            cache_bytes: 64 << 20,
            upstream_timeout: Duration::from_secs(5),
            fabric: Some(proxy_fabric),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        })
        .await
        .unwrap();
        let proxy_addr = proxy.local_addr().unwrap();
        let admin_addr = proxy.admin_addr().unwrap();
        tokio::spawn(proxy.run(Stop::new()));
        Setup {
            _dir: dir,
            root,
            module_fabric: Some(module_fabric),
            origin,
            proxy: proxy_addr,
            admin: admin_addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, String, Option<String>, String) {
        let uri = format!("http://{}{}", self.proxy, path);
        let response = self.client.get(uri.parse().unwrap()).await.unwrap();
        let status = response.status();
        let cache = response.headers().get("x-cache").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let deps = response.headers().get("x-tierstack-deps").map(|v| v.to_str().unwrap().to_string());
        let body = String::from_utf8_lossy(&response.into_body().collect().await.unwrap().to_bytes()).to_string();
        (status, cache, deps, body)
    }

    async fn stats(&self) -> ProxyStats {
        let uri = format!("http://{}/_tierstack/stats", self.admin);
        let body = self.client.get(uri.parse().unwrap()).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    fn table(&self) -> Arc<VersionTable> {
        self.origin.table.lock().unwrap().clone().unwrap()
    }
}

#[tokio::test]
async fn hits_are_validated_and_updates_invalidate() {
    let s = Setup::new(CacheMode::Poll, true).await;
    assert_eq!(s.get("/doc/a").await.1, "MISS");
    let (status, cache, deps, _) = s.get("/doc/a").await;
    assert_eq!((status, cache.as_str()), (StatusCode::OK, "HIT"));
    assert!(deps.unwrap().contains("doc/a=1@"), "hits carry the versions they were generated at");
    let slot = s.table().slot_of("doc/a").unwrap();
    s.table().bump(slot).unwrap();
    let (_, cache, deps, _) = s.get("/doc/a").await;
    assert_eq!(cache, "MISS", "a bumped version must not be served from cache");
    assert!(deps.unwrap().contains("doc/a=2@"));
    assert_eq!(s.stats().await.stale_dropped, 1);
}

#[tokio::test]
async fn malformed_or_oversized_dependency_headers_are_not_cached() {
    let s = Setup::new(CacheMode::Poll, true).await;
    let long =
        format!("n=0;i=000000000000000b;{}", (0..100).map(|i| format!("k{i}=1@{i}")).collect::<Vec<_>>().join(","));
    for bad in ["garbage", "n=0;i=zz;doc/a=1@0", long.as_str()] {
        *s.origin.deps_override.lock().unwrap() = Some(bad.to_string());
        assert_eq!(s.get("/doc/a").await.1, "MISS");
        assert_eq!(s.get("/doc/a").await.1, "MISS", "{bad:?} must not be cached");
    }
    assert_eq!(s.stats().await.uncacheable_deps, 6);
}

#[tokio::test]
async fn unknown_documents_pass_through_as_404_and_no_store_is_honoured() {
    let s = Setup::new(CacheMode::Poll, true).await;
    assert_eq!(s.get("/doc/missing").await.0, StatusCode::NOT_FOUND);
    for cc in ["no-store", "private, max-age=60"] {
        *s.origin.cache_control.lock().unwrap() = Some(cc);
        s.get("/doc/b").await;
        assert_eq!(s.get("/doc/b").await.1, "MISS", "Cache-Control: {cc} must not be cached");
    }
}

#[tokio::test]
async fn a_dead_origin_is_a_502() {
    let s = Setup::new(CacheMode::Poll, false).await;
    let (status, _, _, body) = s.get("/doc/a").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("unreachable"));
}

#[tokio::test]
async fn a_client_that_disconnects_mid_response_does_not_hurt_the_proxy() {
    let s = Setup::new(CacheMode::Poll, true).await;
    s.get("/doc/big").await;
    for _ in 0..5 {
        let mut stream = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
        stream.write_all(b"GET /doc/big HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut first = [0u8; 1024];
        let n = stream.read(&mut first).await.unwrap();
        assert!(n > 0);
        drop(stream); // gone with most of the 4 MiB body unread
    }
    let (status, _, _, body) = s.get("/doc/big").await;
    assert_eq!((status, body.len()), (StatusCode::OK, 4 << 20));
}

#[tokio::test]
async fn a_dead_module_means_no_hits_and_a_restarted_module_invalidates_old_copies() {
    let mut s = Setup::new(CacheMode::Poll, true).await;
    s.get("/doc/a").await;
    assert_eq!(s.get("/doc/a").await.1, "HIT");

    // The module dies: its region is revoked, versions cannot be read.
    *s.origin.table.lock().unwrap() = None;
    s.module_fabric.take();
    let (status, cache, _, _) = s.get("/doc/a").await;
    assert_eq!(cache, "MISS", "fail closed: an unvalidated copy is never served");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the origin's own answer passes through");
    assert!(s.stats().await.check_errors >= 1);

    // It restarts under the same node id with a new incarnation and fresh versions.
    let fabric = ShmFabric::open(ShmConfig::new(&s.root, NodeId(0))).unwrap();
    let table = Arc::new(VersionTable::create(fabric.as_ref(), 16, Incarnation(99)).unwrap());
    *s.origin.table.lock().unwrap() = Some(table);
    s.module_fabric = Some(fabric);
    let (status, cache, deps, _) = s.get("/doc/a").await;
    assert_eq!((status, cache.as_str()), (StatusCode::OK, "MISS"));
    assert!(deps.unwrap().contains(";i=0000000000000063;"), "the new incarnation is served");
    assert_eq!(s.get("/doc/a").await.1, "HIT", "the proxy recovers and caches again");
}

#[tokio::test]
async fn ttl_mode_serves_hits_without_checks() {
    let s = Setup::new(CacheMode::Ttl, true).await;
    s.get("/doc/a").await;
    let slot = s.table().slot_of("doc/a").unwrap();
    s.table().bump(slot).unwrap();
    assert_eq!(s.get("/doc/a").await.1, "HIT", "ttl never revalidates (the non-coherent bound)");
    assert_eq!(s.stats().await.checks, 0);
}

/// Waits (bounded) until `condition` holds.
async fn wait_for(mut condition: impl FnMut() -> bool) {
    for _ in 0..5000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never became true");
}

/// Waits (bounded) until `count` requests wait on another request's fetch.
async fn wait_for_waiters(s: &Setup, count: u64) {
    let mut waiting = 0;
    for _ in 0..5000 {
        waiting = s.stats().await.waiting_on_fetch;
        if waiting == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{waiting} requests wait on a shared fetch, expected {count}");
}

type GetResult = (StatusCode, String, Option<String>, String);

/// A GET through the proxy, running concurrently.
fn spawn_get(s: &Arc<Setup>, path: &'static str) -> tokio::task::JoinHandle<GetResult> {
    let s = s.clone();
    tokio::spawn(async move { s.get(path).await })
}

fn origin_requests(s: &Setup) -> u64 {
    *s.origin.requests.lock().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_share_one_fetch() {
    let s = Arc::new(Setup::new(CacheMode::Poll, true).await);
    s.origin.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let first = spawn_get(&s, "/doc/a");
    wait_for(|| origin_requests(&s) == 1).await;
    let waiters: Vec<_> = (0..3).map(|_| spawn_get(&s, "/doc/a")).collect();
    wait_for_waiters(&s, 3).await; // the three later requests wait for the first one's fetch
    s.origin.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    s.origin.release.notify_waiters();
    assert_eq!(first.await.unwrap().1, "MISS");
    for waiter in waiters {
        let (status, cache, deps, _) = waiter.await.unwrap();
        // Served from the shared, validated fetch: not a hit of this proxy's cache.
        assert_eq!((status, cache.as_str()), (StatusCode::OK, "MISS"));
        assert!(deps.unwrap().contains("doc/a=1@"));
    }
    assert_eq!(origin_requests(&s), 1, "one upstream request for four clients");
    let stats = s.stats().await;
    assert_eq!((stats.coalesced, stats.hits, stats.misses), (3, 0, 1));
    assert_eq!(stats.accounting_error(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_fetch_older_than_a_completed_update_is_never_served() {
    let s = Arc::new(Setup::new(CacheMode::Poll, true).await);
    s.origin.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    // The first request's response is generated at version 1, then held.
    let first = spawn_get(&s, "/doc/a");
    wait_for(|| origin_requests(&s) == 1).await;
    // An update completes; a request that starts after it must see version 2.
    let slot = s.table().slot_of("doc/a").unwrap();
    s.table().bump(slot).unwrap();
    let later = spawn_get(&s, "/doc/a");
    wait_for_waiters(&s, 1).await; // the later request joined the first one's fetch
    s.origin.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    s.origin.release.notify_waiters();
    let (_, _, first_deps, _) = first.await.unwrap();
    assert!(first_deps.unwrap().contains("doc/a=1@"), "the first request began before the update");
    let (status, cache, later_deps, _) = later.await.unwrap();
    assert_eq!((status, cache.as_str()), (StatusCode::OK, "MISS"), "the shared result failed validation");
    assert!(later_deps.unwrap().contains("doc/a=2@"), "the later request gets the updated document");
    assert_eq!(origin_requests(&s), 2);
    assert_eq!(s.stats().await.coalesced, 0);
}
