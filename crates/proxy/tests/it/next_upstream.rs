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
use tierstack_proxy::{
    BalancerConfig, Balancing, CacheMode, FailureConfig, Policy, Proxy, ProxyConfig, ProxyOptions, ProxyStats,
};
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

/// Failed forwards never pause an upstream: every request meets the dead
/// ones (what the retry tests need).
const NEVER_PAUSED: FailureConfig = FailureConfig { max_fails: 0, fail_timeout: Duration::from_secs(10) };

async fn setup(upstreams: Vec<String>, balancing: Option<Policy>) -> Setup {
    setup_with(upstreams, balancing, NEVER_PAUSED).await
}

async fn setup_with(upstreams: Vec<String>, balancing: Option<Policy>, failures: FailureConfig) -> Setup {
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams,
        mode: CacheMode::NoCache,
        cache_bytes: 1 << 20,
        upstream_timeout: Duration::from_secs(10),
        fabric: None,
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
    };
    let options = ProxyOptions { cache_state: None, failures, ..ProxyOptions::default() };
    let proxy = Proxy::bind_with(config, options).await.unwrap();
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

/// nginx's `max_fails=1 fail_timeout=10s` (the default): a refused
/// upstream is paused after its first failure, so later requests go
/// straight to the live one (no retry each); with every other upstream
/// paused or failed, a paused one is still tried rather than answering 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upstream_is_paused_and_skipped_until_fail_timeout() {
    for policy in [None, Some(Policy::RoundRobin), Some(Policy::LeastLoaded)] {
        let (live, served) = alive().await;
        let s = setup_with(vec![refused().await, live, refused().await], policy, FailureConfig::default()).await;
        for i in 0..30 {
            assert_eq!(s.send(Method::GET, &format!("/doc/{i}"), s.proxy).await.0, StatusCode::OK, "{policy:?}");
        }
        let stats = s.stats().await;
        assert_eq!(served.load(Ordering::Relaxed), 30, "{policy:?}");
        assert!(stats.upstream_retries <= 2, "{policy:?}: each dead upstream failed once, then paused: {stats:?}");
        assert_eq!(stats.upstream_pauses, stats.upstream_retries, "{policy:?}: {stats:?}");
        assert_eq!(stats.routed[0] + stats.routed[2], stats.upstream_retries, "{policy:?}: {stats:?}");
    }
    // Only paused upstreams left: tried anyway (a 502 from each, not a 503).
    let s = setup_with(vec![refused().await], None, FailureConfig::default()).await;
    for _ in 0..3 {
        assert_eq!(s.send(Method::GET, "/doc/a", s.proxy).await.0, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(s.stats().await.routed, vec![3], "a lone paused upstream is still tried");
}

/// An upstream that accepts and reads requests but never answers (a
/// stopped process: the kernel accepts for it); counts connections.
async fn hangs() -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let counting = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            counting.fetch_add(1, Ordering::Relaxed);
            held.push(stream);
        }
    });
    (format!("http://{addr}"), accepted)
}

/// A load source whose readings the test sets: each upstream's load and
/// health.
struct Scripted {
    health: Vec<std::sync::Mutex<(tierstack_monitor::Health, u16)>>,
}

impl tierstack_monitor::LoadSource for Scripted {
    fn scheme(&self) -> tierstack_monitor::Scheme {
        tierstack_monitor::Scheme::RdmaSync
    }
    fn len(&self) -> usize {
        self.health.len()
    }
    fn read(&self, index: usize) -> tierstack_monitor::Reading {
        let (health, load) = *self.health[index].lock().unwrap();
        let now = tierstack_base::host_monotonic_ns();
        let counters = tierstack_monitor::Counters { in_flight_requests: load, ..Default::default() };
        let record = tierstack_monitor::LoadRecord { t_ns: now, counters, ..Default::default() };
        tierstack_monitor::Reading { record, read_ns: now, health }
    }
}

async fn setup_scripted(upstreams: Vec<String>, source: Arc<Scripted>, timeout: Duration) -> Setup {
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams,
        mode: CacheMode::NoCache,
        cache_bytes: 1 << 20,
        upstream_timeout: timeout,
        fabric: None,
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
    };
    let options = ProxyOptions {
        cache_state: None,
        failures: NEVER_PAUSED,
        suspect_probe: Some(Duration::from_millis(20)),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::bind_with(config, options).await.unwrap();
    let balancing = Balancing { config: BalancerConfig::new(Policy::LeastLoaded), source: Some(source) };
    proxy.set_balancing(balancing).unwrap();
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    tokio::spawn(proxy.run(Stop::new()));
    Setup { proxy: addr, admin, client: Client::builder(TokioExecutor::new()).build_http() }
}

/// Requests waiting on an upstream that hangs are given up as soon as its
/// load source calls it suspect, and the idempotent ones are answered by
/// another upstream: no request waits out the upstream timeout (a minute
/// here: a 504 would mean it did). New requests avoid the suspect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_an_upstream_that_turns_suspect_are_retried_elsewhere() {
    use tierstack_monitor::Health;
    let (hung, accepted) = hangs().await;
    let (live, served) = alive().await;
    // The hung one looks idle (its counters froze at 0), the live one busy.
    let source = Arc::new(Scripted {
        health: vec![std::sync::Mutex::new((Health::Fresh, 0)), std::sync::Mutex::new((Health::Fresh, 3))],
    });
    let s = Arc::new(setup_scripted(vec![hung, live], source.clone(), Duration::from_secs(60)).await);
    let requests: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.send(Method::GET, &format!("/doc/{i}"), s.proxy).await.0 })
        })
        .collect();
    // Wait (bounded) until the hung upstream holds some of them.
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
    while accepted.load(Ordering::Relaxed) == 0 && tierstack_base::time::instant_now() < deadline {
        tokio::task::yield_now().await;
    }
    assert!(accepted.load(Ordering::Relaxed) > 0, "the idle-looking upstream got requests");
    *source.health[0].lock().unwrap() = (Health::Suspect, 0);
    for request in requests {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    for i in 8..16 {
        assert_eq!(s.send(Method::GET, &format!("/doc/{i}"), s.proxy).await.0, StatusCode::OK);
    }
    let stats = s.stats().await;
    let stuck = stats.routed[0];
    assert!((1..=8).contains(&stuck), "only requests sent before the suspicion went there: {stats:?}");
    assert_eq!(stats.upstream_abandoned, stuck, "{stats:?}");
    assert_eq!(stats.upstream_timeouts, 0, "given up on suspicion, not after the timeout: {stats:?}");
    assert_eq!(served.load(Ordering::Relaxed), 16, "the live upstream answered every request");
}

/// A POST is never given up while its upstream is merely unresponsive (it
/// may be processed when the upstream resumes): it waits for its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_on_a_suspect_upstream_is_not_repeated_elsewhere() {
    use tierstack_monitor::Health;
    let (hung, accepted) = hangs().await;
    let (live, served) = alive().await;
    let source = Arc::new(Scripted {
        health: vec![std::sync::Mutex::new((Health::Fresh, 0)), std::sync::Mutex::new((Health::Fresh, 3))],
    });
    let s = Arc::new(setup_scripted(vec![hung, live], source.clone(), Duration::from_secs(2)).await);
    let posting = {
        let s = s.clone();
        tokio::spawn(async move { s.send(Method::POST, "/doc/a", s.proxy).await.0 })
    };
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
    while accepted.load(Ordering::Relaxed) == 0 && tierstack_base::time::instant_now() < deadline {
        tokio::task::yield_now().await;
    }
    *source.health[0].lock().unwrap() = (Health::Suspect, 0);
    let status = posting.await.unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "the POST waited out its timeout on the hung upstream");
    assert_eq!(served.load(Ordering::Relaxed), 0, "and was not repeated on the live one");
    let stats = s.stats().await;
    assert_eq!((stats.upstream_abandoned, stats.upstream_timeouts), (0, 1), "{stats:?}");
}
