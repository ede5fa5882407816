//! The store mode in process: the module, the application server with its
//! documents in a store, and an HTTP client. With the real module a read
//! waits out an update's rewrite; with the module's test-only switch a read
//! lands in the middle of it and gets a mixed body.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use tierstack_appserver::{generate_body, AppServer, AppServerConfig, StoreConfig};
use tierstack_base::time::instant_now;
use tierstack_cluster::{local_cluster, Backend};
use tierstack_coherent::module::{ModuleOptions, ModuleServer};
use tierstack_coherent::version_table::{Incarnation, VersionTable};
use tierstack_coherent::{DepsHeader, DEPS_HEADER};
use tierstack_tier_http::Stop;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

struct Setup {
    _dir: tempfile::TempDir,
    _cluster: tierstack_cluster::LocalCluster,
    module: Arc<ModuleServer>,
    app: std::net::SocketAddr,
    client: HttpClient,
}

async fn setup(broken_module: bool, pause: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 64, Incarnation(5)).unwrap());
    let socket = dir.path().join("module.sock");
    let listener = ModuleServer::bind(&socket).await.unwrap();
    let options = ModuleOptions { test_only_admit_reads_during_updates: broken_module, ..ModuleOptions::default() };
    let module = Arc::new(ModuleServer::with_options(table, &options).unwrap());
    let serving = module.clone();
    tokio::spawn(async move { serving.serve_on(listener).await });
    let config = AppServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        module_socket: socket,
        module_uids: Vec::new(),
        documents: vec![("a".into(), 300)],
        compute_threads: 0,
        store: Some(StoreConfig { update_write_pause: pause }),
        publish: false,
    };
    let server = AppServer::bind(config).await.unwrap();
    let app = server.local_addr().unwrap();
    tokio::spawn(server.run(Stop::new()));
    Setup { _dir: dir, _cluster: cluster, module, app, client: Client::builder(TokioExecutor::new()).build_http() }
}

impl Setup {
    async fn request(&self, method: Method) -> (StatusCode, u64, Bytes) {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{}/doc/a", self.app).parse().unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        let deps = response.headers().get(DEPS_HEADER).unwrap().to_str().unwrap().to_string();
        let version = DepsHeader::parse(&deps).unwrap().deps[0].version;
        (status, version, response.into_body().collect().await.unwrap().to_bytes())
    }

    /// Waits (bounded) until the module has `n` requests queued or holding.
    async fn requests_in_progress(&self, n: usize) {
        let deadline = instant_now() + Duration::from_secs(20);
        while self.module.requests_in_progress() != n {
            assert!(instant_now() < deadline, "module never had {n} requests");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_copy_the_stored_body_and_updates_rewrite_it() {
    let s = setup(false, Duration::ZERO).await;
    let (status, v1, body) = s.request(Method::GET).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, generate_body("a", v1, 300));
    let (status, v2, _) = s.request(Method::PUT).await;
    assert_eq!((status, v2), (StatusCode::OK, v1 + 1));
    let (_, v, body) = s.request(Method::GET).await;
    assert_eq!((v, body), (v2, generate_body("a", v2, 300)));
}

/// A read sent while an update is inside its pause: the real module queues
/// it behind the update, so it gets the whole new body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_real_module_a_read_waits_out_the_rewrite() {
    let s = Arc::new(setup(false, Duration::from_secs(1)).await);
    let (_, v1, _) = s.request(Method::GET).await;
    s.requests_in_progress(0).await;
    let updater = s.clone();
    let update = tokio::spawn(async move { updater.request(Method::PUT).await });
    // Granted at once (nothing else holds the key): now in its pause.
    s.requests_in_progress(1).await;
    let (status, version, body) = s.request(Method::GET).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(version, v1 + 1);
    assert_eq!(body, generate_body("a", v1 + 1, 300), "the whole new body, never half of it");
    assert_eq!(update.await.unwrap().0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reads_admitted_during_updates_a_read_gets_a_mixed_body() {
    let s = Arc::new(setup(true, tierstack_appserver::UPDATE_WRITE_PAUSE_MAX).await);
    let (_, v1, _) = s.request(Method::GET).await;
    s.requests_in_progress(0).await;
    let updater = s.clone();
    let update = tokio::spawn(async move { updater.request(Method::PUT).await });
    s.requests_in_progress(1).await;
    // The update is granted (version bumped) and writes its first half
    // before its pause; read until the new first half shows.
    let new = generate_body("a", v1 + 1, 300);
    let deadline = instant_now() + Duration::from_secs(20);
    let (version, body) = loop {
        let (status, version, body) = s.request(Method::GET).await;
        assert_eq!(status, StatusCode::OK);
        if body[..150] == new[..150] || instant_now() > deadline {
            break (version, body);
        }
    };
    assert_eq!(version, v1 + 1, "admitted under the bumped version");
    assert_eq!(&body[..150], &new[..150], "the new first half");
    assert_eq!(&body[150..], &generate_body("a", v1, 300)[150..], "the old second half");
    update.abort();
}

/// An updater that hangs up during the rewrite's pause: the update still
/// completes (UPDATE_DONE is sent, the body is whole), so the key is not
/// held forever and the next read gets the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_whose_client_hangs_up_still_completes() {
    use tokio::io::AsyncWriteExt;
    let s = setup(false, Duration::from_millis(300)).await;
    let (_, v1, _) = s.request(Method::GET).await;
    s.requests_in_progress(0).await;
    let mut updater = tokio::net::TcpStream::connect(s.app).await.unwrap();
    let put = format!("PUT /doc/a HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n", s.app);
    updater.write_all(put.as_bytes()).await.unwrap();
    s.requests_in_progress(1).await;
    drop(updater);
    let read = tokio::time::timeout(Duration::from_secs(20), s.request(Method::GET)).await;
    let (status, version, body) = read.expect("the abandoned update was never done");
    assert_eq!((status, version), (StatusCode::OK, v1 + 1));
    assert_eq!(body, generate_body("a", v1 + 1, 300));
}

/// A reader that hangs up while queued behind an update: its read is still
/// done once granted, so the next update is not blocked forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_client_hangs_up_is_still_done() {
    use tokio::io::AsyncWriteExt;
    let s = Arc::new(setup(false, Duration::from_millis(300)).await);
    let (_, v1, _) = s.request(Method::GET).await;
    s.requests_in_progress(0).await;
    let updater = s.clone();
    let update = tokio::spawn(async move { updater.request(Method::PUT).await });
    s.requests_in_progress(1).await;
    let mut reader = tokio::net::TcpStream::connect(s.app).await.unwrap();
    reader.write_all(format!("GET /doc/a HTTP/1.1\r\nHost: {}\r\n\r\n", s.app).as_bytes()).await.unwrap();
    s.requests_in_progress(2).await;
    drop(reader);
    assert_eq!(update.await.unwrap().0, StatusCode::OK);
    let next = tokio::time::timeout(Duration::from_secs(20), s.request(Method::PUT)).await;
    let (status, version, _) = next.expect("the abandoned read was never done");
    assert_eq!((status, version), (StatusCode::OK, v1 + 2));
}
