//! Misses stream: the client gets the first bytes of a 64 MiB body while
//! the origin (paced by the test) has not sent the rest, the proxy's memory
//! stays bounded while it relays, and a body larger than the cache's
//! per-object limit streams through uncached while a smaller one is teed
//! into the cache.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_proxy::{CacheMode, Proxy, ProxyBody, ProxyConfig, StreamError};
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{serve, Stop};
use tokio::sync::{mpsc, Semaphore};

const MIB: usize = 1 << 20;
const CHUNK: usize = 64 << 10;

/// An origin whose body is `total` bytes in `CHUNK`s, each sent only when
/// the test adds a permit to `pace` (`None`: as fast as it can).
struct Origin {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

async fn origin(total: usize, pace: Option<Arc<Semaphore>>, fields: &'static [(&'static str, &'static str)]) -> Origin {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    let handler = Arc::new(move |_: Request<RequestBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let pace = pace.clone();
        async move {
            let (sender, receiver) = mpsc::channel::<Result<Bytes, StreamError>>(2);
            tokio::spawn(async move {
                let chunk = Bytes::from(vec![b'z'; CHUNK]);
                for _ in 0..total / CHUNK {
                    if let Some(pace) = &pace {
                        pace.acquire().await.unwrap().forget();
                    }
                    if sender.send(Ok(chunk.clone())).await.is_err() {
                        return;
                    }
                }
            });
            let mut response = Response::new(ProxyBody::Streamed(receiver));
            response.headers_mut().insert("content-length", total.to_string().parse().unwrap());
            for (name, value) in fields {
                response.headers_mut().insert(*name, value.parse().unwrap());
            }
            response
        }
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    Origin { addr, requests }
}

async fn proxy(origin: SocketAddr, cache_bytes: usize) -> SocketAddr {
    let proxy = Proxy::bind(ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams: vec![format!("http://{origin}")],
        mode: CacheMode::Ttl,
        cache_bytes,
        upstream_timeout: Duration::from_secs(120),
        fabric: None,
        admin_listen: None,
    })
    .await
    .unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.run(Stop::new()));
    addr
}

async fn get(proxy: SocketAddr, path: &str) -> Response<Incoming> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.uri_mut() = format!("http://{proxy}{path}").parse().unwrap();
    client.request(request).await.unwrap()
}

/// This process's peak resident memory (VmHWM), bytes.
fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_bytes_of_a_64_mib_miss_arrive_before_the_origin_sent_the_rest() {
    let pace = Arc::new(Semaphore::new(0));
    let origin = origin(64 * MIB, Some(pace.clone()), &[("cache-control", "max-age=300")]).await;
    let proxy = proxy(origin.addr, 256 * MIB).await;
    // The origin may send one chunk only.
    pace.add_permits(1);
    let response = get(proxy, "/big").await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(60), body.frame())
        .await
        .expect("the first bytes never came: the proxy waits for the whole body")
        .unwrap()
        .unwrap();
    assert!(!first.data_ref().unwrap().is_empty());
    // Now the rest.
    pace.add_permits(64 * MIB / CHUNK);
    let mut received = first.data_ref().unwrap().len();
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().data_ref().map_or(0, |d| d.len());
    }
    assert_eq!(received, 64 * MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_and_a_body_over_the_object_limit_streams_through_uncached() {
    let origin = origin(64 * MIB, None, &[("cache-control", "max-age=300")]).await;
    // The per-object limit is an eighth: 1 MiB.
    let proxy = proxy(origin.addr, 8 * MIB).await;
    let before = peak_rss();
    for round in 0..2 {
        let response = get(proxy, "/big").await;
        assert_eq!(response.headers().get("x-cache").unwrap(), "MISS", "round {round}: never cached");
        let mut body = response.into_body();
        let mut received = 0;
        while let Some(frame) = body.frame().await {
            received += frame.unwrap().data_ref().map_or(0, |d| d.len());
        }
        assert_eq!(received, 64 * MIB);
    }
    assert_eq!(origin.requests.load(Ordering::SeqCst), 2);
    let grown = peak_rss().saturating_sub(before);
    assert!(grown < 32 * MIB, "the peak grew by {} MiB relaying 64 MiB twice", grown / MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_within_the_object_limit_is_teed_into_the_cache() {
    let origin = origin(512 << 10, None, &[("cache-control", "max-age=300")]).await;
    let proxy = proxy(origin.addr, 8 * MIB).await;
    let first = get(proxy, "/small").await;
    assert_eq!(first.headers().get("x-cache").unwrap(), "MISS");
    let whole = first.into_body().collect().await.unwrap().to_bytes();
    let hit = get(proxy, "/small").await;
    assert_eq!(hit.headers().get("x-cache").unwrap(), "HIT");
    assert_eq!(hit.into_body().collect().await.unwrap().to_bytes(), whole);
    assert_eq!(origin.requests.load(Ordering::SeqCst), 1);
}
