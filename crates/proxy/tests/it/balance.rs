//! The proxy's load balancing: upstreams chosen by the balancer from the
//! load a (scripted) monitoring source reports, dead upstreams skipped,
//! admission control answering 503 without forwarding.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_monitor::{Counters, Health, LoadRecord, Reading};
use tierstack_proxy::{
    BalancerConfig, Balancing, CacheMode, LoadSource, Policy, Proxy, ProxyConfig, ProxyError, ProxyOptions, ProxyStats,
    Scheme,
};
use tierstack_tier_http::{serve, text, Stop};

/// A monitoring source whose readings the test sets.
struct Scripted {
    readings: Mutex<Vec<(u16, Health)>>,
}

impl LoadSource for Scripted {
    fn scheme(&self) -> Scheme {
        Scheme::RdmaSync
    }
    fn len(&self) -> usize {
        self.readings.lock().unwrap().len()
    }
    fn read(&self, index: usize) -> Reading {
        let (load, health) = self.readings.lock().unwrap()[index];
        let now = tierstack_base::host_monotonic_ns();
        let counters = Counters { in_flight_requests: load, ..Counters::default() };
        Reading { record: LoadRecord { t_ns: now, counters, ..LoadRecord::default() }, read_ns: now, health }
    }
}

struct Setup {
    proxy: SocketAddr,
    admin: SocketAddr,
    served: Vec<Arc<AtomicU64>>,
    source: Arc<Scripted>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

async fn upstream() -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicU64::new(0));
    let counting = served.clone();
    let handler = Arc::new(move |_request| {
        counting.fetch_add(1, Ordering::Relaxed);
        async { text(StatusCode::OK, "ok\n") }
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    (format!("http://{addr}"), served)
}

async fn setup(policy: Policy, admit_max: Option<u32>, loads: Vec<(u16, Health)>) -> Setup {
    let mut upstreams = Vec::new();
    let mut served = Vec::new();
    for _ in 0..loads.len() {
        let (url, count) = upstream().await;
        upstreams.push(url);
        served.push(count);
    }
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams,
        mode: CacheMode::NoCache,
        cache_bytes: 1 << 20,
        upstream_timeout: Duration::from_secs(10),
        fabric: None,
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
    };
    let proxy = Proxy::bind_with(config, ProxyOptions { cache_state: None, ..ProxyOptions::default() }).await.unwrap();
    let source = Arc::new(Scripted { readings: Mutex::new(loads) });
    let wrong = Arc::new(Scripted { readings: Mutex::new(vec![(0, Health::Fresh)]) });
    let config = BalancerConfig { admit_max, ..BalancerConfig::new(policy) };
    if source.len() != 1 {
        let mismatch = proxy.set_balancing(Balancing { config, source: Some(wrong) });
        assert!(matches!(mismatch, Err(ProxyError::SourceMismatch { .. })), "one source per upstream");
    }
    proxy.set_balancing(Balancing { config, source: Some(source.clone()) }).unwrap();
    assert!(matches!(proxy.set_balancing(Balancing { config, source: None }), Err(ProxyError::BalancingSet)));
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    tokio::spawn(proxy.run(Stop::new()));
    Setup { proxy: addr, admin, served, source, client: Client::builder(TokioExecutor::new()).build_http() }
}

impl Setup {
    async fn get(&self, path: &str, at: SocketAddr) -> (StatusCode, Bytes) {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = format!("http://{at}{path}").parse().unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        (status, response.into_body().collect().await.unwrap().to_bytes())
    }

    async fn stats(&self) -> ProxyStats {
        let (_, body) = self.get("/_tierstack/stats", self.admin).await;
        let stats: ProxyStats = serde_json::from_slice(&body).unwrap();
        assert_eq!(stats.accounting_error(), None, "{stats:?}");
        stats
    }

    fn served(&self) -> Vec<u64> {
        self.served.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_follows_the_reported_load() {
    let s = setup(Policy::LeastLoaded, None, vec![(9, Health::Fresh), (2, Health::Fresh), (5, Health::Fresh)]).await;
    for i in 0..10 {
        assert_eq!(s.get(&format!("/doc/{i}"), s.proxy).await.0, StatusCode::OK);
    }
    assert_eq!(s.served(), [0, 10, 0], "one request at a time: always the least loaded");
    s.source.readings.lock().unwrap()[1] = (20, Health::Fresh);
    for i in 0..10 {
        s.get(&format!("/doc/{i}"), s.proxy).await;
    }
    assert_eq!(s.served(), [0, 10, 10], "the load changed: so did the choice");
    let stats = s.stats().await;
    assert_eq!(stats.routed, [0, 10, 10]);
    assert_eq!((stats.balance, stats.monitor), (Some(Policy::LeastLoaded), Some(Scheme::RdmaSync)));
    assert_eq!(stats.monitor_reads, 20 * 3, "every upstream read for every request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstreams_are_skipped_and_all_dead_is_a_503() {
    let s = setup(Policy::RoundRobin, None, vec![(0, Health::Fresh), (0, Health::Dead), (0, Health::Fresh)]).await;
    for i in 0..10 {
        s.get(&format!("/doc/{i}"), s.proxy).await;
    }
    assert_eq!(s.served(), [5, 0, 5]);
    *s.source.readings.lock().unwrap() = vec![(0, Health::Dead); 3];
    let (status, _) = s.get("/doc/x", s.proxy).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(s.served(), [5, 0, 5], "not forwarded");
    let stats = s.stats().await;
    assert_eq!((stats.refused_no_backend, stats.refused_overloaded, stats.misses), (1, 0, 11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_control_refuses_above_the_bound_only() {
    let s = setup(Policy::LeastLoaded, Some(4), vec![(4, Health::Fresh), (7, Health::Fresh)]).await;
    let (status, _) = s.get("/doc/a", s.proxy).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the least loaded is at the bound");
    assert_eq!(s.served(), [0, 0]);
    s.source.readings.lock().unwrap()[0] = (3, Health::Fresh);
    assert_eq!(s.get("/doc/a", s.proxy).await.0, StatusCode::OK);
    assert_eq!(s.served(), [1, 0]);
    let stats = s.stats().await;
    assert_eq!((stats.refused_overloaded, stats.misses, stats.requests), (1, 2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_balancing_keeps_each_document_on_one_upstream() {
    let s = setup(Policy::Hash, None, vec![(0, Health::Fresh), (50, Health::Fresh)]).await;
    for _ in 0..3 {
        for i in 0..8 {
            s.get(&format!("/doc/{i}"), s.proxy).await;
        }
    }
    let served = s.served();
    assert_eq!(served.iter().sum::<u64>(), 24);
    assert!(served.iter().all(|n| n % 3 == 0), "each document three times to the same place: {served:?}");
    assert!(served.iter().all(|&n| n > 0), "load-oblivious: both get documents: {served:?}");
}

/// An upstream that answers `/slow` with a head and a first part, then
/// holds the rest of the body until `release` is dropped; anything else at
/// once. Counts the other requests it served.
async fn holding_upstream(release: tokio::sync::watch::Receiver<()>) -> (String, Arc<AtomicU64>) {
    use tierstack_proxy::ProxyBody;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fast = Arc::new(AtomicU64::new(0));
    let counting = fast.clone();
    let handler = Arc::new(move |request: Request<tierstack_tier_http::RequestBody>| {
        let counting = counting.clone();
        let mut release = release.clone();
        async move {
            if request.uri().path() != "/slow" {
                counting.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::OK, "fast\n").map(ProxyBody::from);
            }
            let (sender, receiver) = tokio::sync::mpsc::channel(4);
            tokio::spawn(async move {
                let _ = sender.send(Ok(Bytes::from_static(b"first part\n"))).await;
                // Held until the test drops its sender.
                let _ = release.changed().await;
                let _ = sender.send(Ok(Bytes::from_static(b"rest\n"))).await;
            });
            hyper::Response::new(ProxyBody::Streamed(receiver))
        }
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    (format!("http://{addr}"), fast)
}

/// The balancer counts a forward in flight until its body has been relayed,
/// not only until its head arrived: while one upstream is still sending a
/// body, least-loaded sends the next requests to the other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_counts_in_flight_until_its_body_ends() {
    let (release, held) = tokio::sync::watch::channel(());
    let (a, fast_a) = holding_upstream(held.clone()).await;
    let (b, fast_b) = holding_upstream(held).await;
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams: vec![a, b],
        mode: CacheMode::NoCache,
        cache_bytes: 1 << 20,
        upstream_timeout: Duration::from_secs(10),
        fabric: None,
        admin_listen: None,
    };
    let proxy = Proxy::bind_with(config, ProxyOptions { cache_state: None, ..ProxyOptions::default() }).await.unwrap();
    let balancing = Balancing { config: BalancerConfig::new(Policy::LeastLoaded), source: None };
    proxy.set_balancing(balancing).unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.run(Stop::new()));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let get = |path: &str| {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = format!("http://{addr}{path}").parse().unwrap();
        client.request(request)
    };
    // The slow response's head (and first part) has arrived; its body has not.
    let mut slow = get("/slow").await.unwrap();
    assert_eq!(slow.status(), StatusCode::OK);
    let first = slow.body_mut().frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"first part\n");
    for _ in 0..8 {
        let fast = get("/fast").await.unwrap();
        assert_eq!(fast.into_body().collect().await.unwrap().to_bytes(), "fast\n");
    }
    let served = (fast_a.load(Ordering::Relaxed), fast_b.load(Ordering::Relaxed));
    assert!(served == (0, 8) || served == (8, 0), "all to the upstream not sending a body: {served:?}");
    drop(release);
    let rest = slow.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"rest\n");
}
