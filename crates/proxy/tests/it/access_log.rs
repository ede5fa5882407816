//! The access log: one Combined Log Format line per client request, which
//! the workload crate's replay (`tierstack load`, trace `clf:PATH`) reads back.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use tierstack_proxy::{CacheMode, Proxy, ProxyConfig, ProxyOptions};
use tierstack_tier_http::{serve, text, Stop};
use tierstack_workload::clf::parse_line;
use tierstack_workload::Trace;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_logged_in_combined_log_format_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let handler = Arc::new(|_| async {
        let mut response = text(StatusCode::OK, "0123456789");
        response.headers_mut().insert("cache-control", "max-age=300".parse().unwrap());
        response
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    let proxy = Proxy::bind_with(
        ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstreams: vec![format!("http://{origin}")],
            mode: CacheMode::Ttl,
            cache_bytes: 1 << 20,
            upstream_timeout: Duration::from_secs(10),
            fabric: None,
            admin_listen: None,
        },
        ProxyOptions { access_log: Some(log.clone()), ..ProxyOptions::default() },
    )
    .await
    .unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.run(Stop::new()));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let requests = [
        (Method::GET, "/doc/a?x=1"),
        (Method::GET, "/doc/a?x=1"),
        (Method::HEAD, "/doc/a?x=1"),
        (Method::POST, "/form"),
    ];
    for (method, target) in &requests {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method.clone();
        *request.uri_mut() = format!("http://{addr}{target}").parse().unwrap();
        request.headers_mut().insert("user-agent", "test \"agent\"".parse().unwrap());
        request.headers_mut().insert("referer", "http://example.com/".parse().unwrap());
        client.request(request).await.unwrap().into_body().collect().await.unwrap();
    }
    let mut text = String::new();
    for _ in 0..5000 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() == requests.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), requests.len(), "{text}");
    for (line, (method, target)) in lines.iter().zip(&requests) {
        let entry = parse_line(line).unwrap_or_else(|e| panic!("{e:?}: {line}"));
        assert_eq!((entry.host, entry.method, entry.path, entry.status), ("127.0.0.1", method.as_str(), *target, 200));
        let bytes = if *method == Method::HEAD { 0 } else { 10 };
        assert_eq!(entry.bytes, Some(bytes), "{line}");
        assert!(line.ends_with("\"http://example.com/\" \"test _agent_\""), "{line}");
    }
    let trace = Trace::clf(&log).unwrap();
    let stats = trace.clf_stats().unwrap();
    assert_eq!((stats.lines, stats.requests, stats.malformed, stats.skipped_method), (4, 2, 0, 2), "{stats:?}");
}
