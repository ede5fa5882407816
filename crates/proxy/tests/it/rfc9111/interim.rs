//! Interim (1xx) responses from the origin (103 Early Hints, 102
//! Processing): never the final status a client sees, never stored, and
//! none of their fields in the stored response. (They are not forwarded
//! either: hyper's HTTP/1.1 server cannot send a 1xx before the final
//! response; see docs/operations.md.)

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_proxy::{CacheMode, Proxy, ProxyConfig};
use tierstack_tier_http::Stop;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An origin written by hand (a hyper server cannot send a 1xx): answers
/// each request with `interim` (whole 1xx messages) and then a fresh 200.
async fn raw_origin(interim: &'static str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 || head.len() > 64 << 10 {
                        return;
                    }
                    head.extend_from_slice(&buffer[..n]);
                    // GETs without bodies: each head ends a request.
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        head.drain(..end + 4);
                        let n = counted.fetch_add(1, Ordering::SeqCst);
                        let body = format!("final {n}");
                        let answer = format!(
                            "{interim}HTTP/1.1 200 OK\r\ncache-control: max-age=300\r\nx-final: yes\r\n\
                             content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_responses_are_never_the_final_status_nor_stored() {
    for interim in [
        "HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\nx-hint: 1\r\n\r\n",
        "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a.js>; rel=preload\r\n\r\n",
    ] {
        let (origin, requests) = raw_origin(interim).await;
        let proxy = Proxy::bind(ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstreams: vec![format!("http://{origin}")],
            mode: CacheMode::Ttl,
            cache_bytes: 1 << 20,
            upstream_timeout: Duration::from_secs(20),
            fabric: None,
            admin_listen: None,
        })
        .await
        .unwrap();
        let addr = proxy.local_addr().unwrap();
        tokio::spawn(proxy.run(Stop::new()));
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        for expected_cache in ["MISS", "HIT"] {
            let response = client.get(format!("http://{addr}/e").parse().unwrap()).await.unwrap();
            let (parts, body) = response.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            assert_eq!(parts.status, StatusCode::OK, "{interim:?}");
            assert_eq!(body, "final 0");
            assert_eq!(parts.headers.get("x-cache").unwrap(), expected_cache);
            assert_eq!(parts.headers.get("x-final").unwrap(), "yes");
            assert!(parts.headers.get("link").is_none() && parts.headers.get("x-hint").is_none(), "{parts:?}");
        }
        assert_eq!(requests.load(Ordering::SeqCst), 1, "stored once, from the final response");
    }
}
