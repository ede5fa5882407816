//! The client listener's limits: slow clients (headers never finished) and
//! idle keep-alive connections are closed after the header-read timeout
//! while normal requests are served meanwhile; at most `max_connections`
//! connections are open at once, a new one displacing the longest stalled.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tierstack_proxy::{CacheMode, Proxy, ProxyConfig, ProxyOptions};
use tierstack_tier_http::{serve, text, Stop};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn proxy(options: ProxyOptions) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let handler = Arc::new(|_| async { text(StatusCode::OK, "origin\n") });
    tokio::spawn(serve(listener, handler, Stop::new()));
    let proxy = Proxy::bind_with(
        ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstreams: vec![format!("http://{origin}")],
            mode: CacheMode::NoCache,
            cache_bytes: 1 << 20,
            upstream_timeout: Duration::from_secs(10),
            fabric: None,
            admin_listen: None,
        },
        options,
    )
    .await
    .unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.run(Stop::new()));
    addr
}

async fn get(proxy: SocketAddr) -> StatusCode {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.uri_mut() = format!("http://{proxy}/page").parse().unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

/// Waits (at most `within`) until the server closes `stream`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let deadline = tierstack_base::time::instant_now() + within;
    loop {
        let left = deadline.saturating_duration_since(tierstack_base::time::instant_now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_unfinished_headers_are_closed_after_the_timeout_and_others_are_served_meanwhile() {
    const SLOW: usize = 2000;
    let timeout = Duration::from_secs(4);
    let proxy = proxy(ProxyOptions { header_read_timeout: Some(timeout), ..ProxyOptions::default() }).await;
    let started = tierstack_base::time::instant_now();
    let mut slow = Vec::with_capacity(SLOW);
    for _ in 0..SLOW {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        stream.write_all(b"GET /page HTTP/1.1\r\nHost: x\r\nX-Never: ").await.unwrap();
        slow.push(stream);
    }
    // Served while they hang: the last slow client is still connected
    // after these are answered.
    for _ in 0..5 {
        assert_eq!(get(proxy).await, StatusCode::OK);
    }
    let mut probe = [0u8; 1];
    let last = slow.last().unwrap();
    assert!(
        matches!(last.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the last slow client was already closed: the normal requests waited for the timeout"
    );
    let first = &mut slow[0];
    assert!(closed_within(first, Duration::from_secs(60)).await, "a slow client was never closed");
    assert!(started.elapsed() >= timeout, "closed before the timeout");
    for stream in &mut slow {
        assert!(closed_within(stream, Duration::from_secs(60)).await, "a slow client was never closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_timeout() {
    let timeout = Duration::from_millis(500);
    let proxy = proxy(ProxyOptions { header_read_timeout: Some(timeout), ..ProxyOptions::default() }).await;
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(b"GET /page HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&answer).contains("origin\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }
    let idle_since = tierstack_base::time::instant_now();
    assert!(closed_within(&mut stream, Duration::from_secs(20)).await, "the idle connection stayed open");
    assert!(idle_since.elapsed() >= timeout - Duration::from_millis(50));
}

/// At the limit, a new client is served at once: the connection that has
/// waited on its client longest (here, for the rest of a head) is closed to
/// make room, and the newer one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_serves_a_new_client_by_closing_the_longest_stalled() {
    let timeout = Duration::from_secs(30);
    let options =
        ProxyOptions { header_read_timeout: Some(timeout), max_connections: Some(2), ..ProxyOptions::default() };
    let proxy = proxy(options).await;
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        stream.write_all(b"GET /page HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        holders.push(stream);
    }
    let started = tierstack_base::time::instant_now();
    assert_eq!(get(proxy).await, StatusCode::OK);
    assert!(started.elapsed() < timeout / 2, "the new client waited for a timeout");
    let (oldest, newer) = holders.split_at_mut(1);
    assert!(closed_within(&mut oldest[0], Duration::from_secs(20)).await, "no connection made room");
    assert!(!closed_within(&mut newer[0], Duration::from_millis(1)).await, "the newer one was closed too");
}
