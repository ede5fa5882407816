//! The application server's published load: its counters follow what the
//! server is doing (connections, requests in flight, requests queued for
//! the module, running threads), and a read burns its drawn CPU cost.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use tierstack_appserver::{AppServer, AppServerConfig, CpuCost, StoreConfig, UPDATE_WRITE_PAUSE_MAX};
use tierstack_base::time::instant_now;
use tierstack_cluster::{local_cluster, Backend};
use tierstack_coherent::module::ModuleServer;
use tierstack_coherent::version_table::{Incarnation, VersionTable};
use tierstack_monitor::{Counters, LoadPublisher};
use tierstack_tier_http::Stop;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

const COMPUTE_THREADS: u16 = 2;
const COST_US: u64 = 500;

struct Setup {
    _dir: tempfile::TempDir,
    _cluster: tierstack_cluster::LocalCluster,
    module: Arc<ModuleServer>,
    app: std::net::SocketAddr,
    publisher: Arc<LoadPublisher>,
    client: HttpClient,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 64, Incarnation(5)).unwrap());
    let socket = dir.path().join("module.sock");
    let listener = ModuleServer::bind(&socket).await.unwrap();
    let module = Arc::new(ModuleServer::new(table));
    let serving = module.clone();
    tokio::spawn(async move { serving.serve_on(listener).await });
    let config = AppServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        module_socket: socket,
        module_uids: Vec::new(),
        documents: vec![("a".into(), 300)],
        compute_threads: usize::from(COMPUTE_THREADS),
        // A long rewrite pause holds an update granted while we look.
        store: Some(StoreConfig { update_write_pause: UPDATE_WRITE_PAUSE_MAX }),
        publish: false,
    };
    let server = AppServer::bind(config).await.unwrap();
    let publisher = LoadPublisher::unregistered().unwrap();
    assert!(server.publish_load(publisher.clone()));
    assert!(!server.publish_load(publisher.clone()), "set once");
    let fixed = CpuCost { alpha: 1.0, min_us: COST_US, max_us: COST_US, seed: 0 };
    assert!(!server.set_cpu_cost(CpuCost { min_us: 0, ..fixed }), "an invalid cost is refused");
    assert!(server.set_cpu_cost(fixed));
    let app = server.local_addr().unwrap();
    tokio::spawn(server.run(Stop::new()));
    Setup {
        _dir: dir,
        _cluster: cluster,
        module,
        app,
        publisher,
        // One idle connection at most: a request sent before the previous
        // one's connection went back to the pool dials a second one, which
        // the pool then closes, so the kept-alive count settles at one.
        client: Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1).build_http(),
    }
}

impl Setup {
    async fn request(&self, method: Method, path: &str) -> (StatusCode, Bytes) {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{}{path}", self.app).parse().unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        (status, response.into_body().collect().await.unwrap().to_bytes())
    }

    /// Waits (bounded) until the published counters satisfy `holds`.
    async fn counters_until(&self, what: &str, holds: impl Fn(Counters) -> bool) -> Counters {
        let deadline = instant_now() + Duration::from_secs(20);
        loop {
            let counters = self.publisher.counters();
            if holds(counters) {
                return counters;
            }
            assert!(instant_now() < deadline, "never {what}: {counters:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn module_requests(&self, n: usize) {
        let deadline = instant_now() + Duration::from_secs(20);
        while self.module.requests_in_progress() != n {
            assert!(instant_now() < deadline, "module never had {n} requests");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_published_counters_follow_the_server() {
    let s = Arc::new(setup().await);
    // Compute threads are running threads for as long as they run.
    s.counters_until("the compute threads running", |c| c.running_threads == COMPUTE_THREADS).await;

    // A connection counts while it is open.
    let raw = tokio::net::TcpStream::connect(s.app).await.unwrap();
    s.counters_until("one connection", |c| c.open_connections == 1).await;
    drop(raw);
    s.counters_until("no connection", |c| c.open_connections == 0).await;

    // A read burns its cost; at rest nothing is in flight or queued.
    let (status, _) = s.request(Method::GET, "/doc/a").await;
    assert_eq!(status, StatusCode::OK);
    let (_, stats) = s.request(Method::GET, "/_tierstack/stats").await;
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    assert_eq!(stats["cpu_cost_us"], COST_US, "{stats}");
    let rest = s.counters_until("the client's one kept-alive connection", |c| c.open_connections == 1).await;
    assert_eq!((rest.in_flight_requests, rest.queue_len, rest.running_threads), (0, 0, COMPUTE_THREADS));

    // An update holds the document; a read behind it waits for the module.
    let updater = s.clone();
    tokio::spawn(async move { updater.request(Method::PUT, "/doc/a").await });
    s.module_requests(1).await;
    let reader = s.clone();
    tokio::spawn(async move { reader.request(Method::GET, "/doc/a").await });
    let busy = s.counters_until("one read queued", |c| c.queue_len == 1).await;
    assert_eq!(busy.in_flight_requests, 2, "the update and the read: {busy:?}");
    assert_eq!(busy.running_threads, COMPUTE_THREADS, "nobody is on the CPU for them: {busy:?}");
    s.counters_until("two connections", |c| c.open_connections == 2).await;
}

/// The progress word: the serving runtime advances it on its own while the
/// server runs (a reader takes a word standing still for a hung server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_runtime_advances_the_progress_word() {
    let setup = setup().await;
    let first = setup.publisher.progress();
    let deadline = instant_now() + Duration::from_secs(20);
    while setup.publisher.progress() < first + 3 && instant_now() < deadline {
        tokio::time::sleep(tierstack_monitor::publisher::HEARTBEAT).await;
    }
    assert!(setup.publisher.progress() >= first + 3, "the heartbeat did not move: {}", setup.publisher.progress());
}
