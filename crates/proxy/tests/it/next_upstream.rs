//! A forward whose upstream refuses the connection goes to the next upstream
//! (nginx's `proxy_next_upstream error`): a dead application server costs
//! no 502 while another is alive. A connection broken before any response
//! byte is retried elsewhere only for idempotent methods.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_proxy::{BalancerConfig, Balancing, CacheMode, Policy, Proxy, ProxyConfig, ProxyOptions, ProxyStats};
use tierstack_tier_http::{serve, text, Stop};

/// A live upstream counting the requests it served.
async fn alive() -> (String, Arc<AtomicU64>) {
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

/// An address where nothing listens any more (a killed server's): bound,
/// then closed, so connecting to it is refused.
async fn refused() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// An upstream that accepts, reads the request's first bytes and closes the
/// connection without answering (a server dying mid-request); counts them.
async fn resets() -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let counting = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counting.fetch_add(1, Ordering::Relaxed);
            let mut buffer = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buffer).await;
            drop(stream);
        }
    });
    (format!("http://{addr}"), accepted)
}

struct Setup {
    proxy: SocketAddr,
    admin: SocketAddr,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

async fn setup(upstreams: Vec<String>, balancing: Option<Policy>) -> Setup {
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
    if let Some(policy) = balancing {
        proxy.set_balancing(Balancing { config: BalancerConfig::new(policy), source: None }).unwrap();
    }
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    tokio::spawn(proxy.run(Stop::new()));
    Setup { proxy: addr, admin, client: Client::builder(TokioExecutor::new()).build_http() }
}

impl Setup {
    async fn send(&self, method: Method, path: &str, at: SocketAddr) -> (StatusCode, Bytes) {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{at}{path}").parse().unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        (status, response.into_body().collect().await.unwrap().to_bytes())
    }

    async fn stats(&self) -> ProxyStats {
        let (_, body) = self.send(Method::GET, "/_tierstack/stats", self.admin).await;
        let stats: ProxyStats = serde_json::from_slice(&body).unwrap();
        assert_eq!(stats.accounting_error(), None, "{stats:?}");
        stats
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upstream_costs_no_502_when_another_is_alive() {
    let (live, served) = alive().await;
    let s = setup(vec![refused().await, live, refused().await], None).await;
    for i in 0..30 {
        let (status, body) = s.send(Method::GET, &format!("/doc/{i}"), s.proxy).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok\n"[..]), "/doc/{i}");
    }
    // A write whose upstream refused was never sent: retried too.
    assert_eq!(s.send(Method::POST, "/doc/0", s.proxy).await.0, StatusCode::OK);
    let stats = s.stats().await;
    assert_eq!(served.load(Ordering::Relaxed), 31, "the live upstream served everything");
    assert!(stats.upstream_retries >= 20, "two of three paths hash to a dead upstream: {stats:?}");
    assert_eq!(stats.upstream_errors, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_upstream_refused_is_a_502() {
    let s = setup(vec![refused().await, refused().await], None).await;
    assert_eq!(s.send(Method::GET, "/doc/a", s.proxy).await.0, StatusCode::BAD_GATEWAY);
    let stats = s.stats().await;
    assert_eq!((stats.upstream_retries, stats.upstream_errors), (1, 1), "each tried once: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_s_choice_refused_goes_to_the_next_upstream() {
    let (live, served) = alive().await;
    let s = setup(vec![refused().await, live], Some(Policy::RoundRobin)).await;
    for i in 0..10 {
        assert_eq!(s.send(Method::GET, &format!("/doc/{i}"), s.proxy).await.0, StatusCode::OK, "/doc/{i}");
    }
    assert_eq!(served.load(Ordering::Relaxed), 10);
    let stats = s.stats().await;
    // Round robin chooses the dead one at least every other time (the retry
    // takes a turn too); each request tries it at most once.
    assert!((5..=10).contains(&stats.upstream_retries), "{stats:?}");
    assert_eq!(stats.upstream_errors, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_broken_before_a_response_is_retried_only_for_idempotent_methods() {
    let (live, served) = alive().await;
    let (broken, accepted) = resets().await;
    // One upstream each; find a path the proxy hashes to the broken one
    // (no balancing: the choice is the path's FNV-1a hash).
    let s = setup(vec![broken, live], None).await;
    let mut broken_paths = Vec::new();
    for i in 0..20 {
        let before = accepted.load(Ordering::Relaxed);
        let (status, _) = s.send(Method::GET, &format!("/doc/{i}"), s.proxy).await;
        assert_eq!(status, StatusCode::OK, "a GET is retried on the live upstream");
        if accepted.load(Ordering::Relaxed) > before {
            broken_paths.push(i);
        }
    }
    assert!(!broken_paths.is_empty(), "some path hashes to the broken upstream");
    assert_eq!(served.load(Ordering::Relaxed), 20);
    let path = format!("/doc/{}", broken_paths[0]);
    let (status, _) = s.send(Method::POST, &path, s.proxy).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "a POST may have been processed: never repeated");
    assert_eq!(served.load(Ordering::Relaxed), 20, "the POST did not reach the live upstream");
    let stats = s.stats().await;
    assert_eq!(stats.upstream_retries, broken_paths.len() as u64, "{stats:?}");
}

/// A live upstream answering with the request's `X-Probe` field (empty if
/// the request had none).
async fn echoes_probe() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(move |request: Request<tierstack_tier_http::RequestBody>| {
        let probe = request.headers().get("x-probe").map(|v| v.as_bytes().to_vec()).unwrap_or_default();
        async move { text(StatusCode::OK, String::from_utf8_lossy(&probe).into_owned()) }
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_retried_on_the_next_upstream_keeps_the_client_s_fields() {
    let s = setup(vec![refused().await, echoes_probe().await], Some(Policy::RoundRobin)).await;
    for i in 0..10 {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = format!("http://{}/doc/{i}", s.proxy).parse().unwrap();
        let probe = format!("probe-{i}");
        request.headers_mut().insert("x-probe", probe.parse().unwrap());
        let response = s.client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "/doc/{i}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], probe.as_bytes(), "/doc/{i}: the upstream saw the client's field");
    }
    let stats = s.stats().await;
    assert!(stats.upstream_retries >= 5, "some requests were retried: {stats:?}");
}
