//! The admin listener: purges, Prometheus metrics (the client listener never
//! serves either).

use super::support::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_purges_one_object() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "x"));
    rig.get("/one", &[("host", "site.example")]).await;
    rig.get("/two", &[("host", "site.example")]).await;
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.method_mut() = Method::DELETE;
    *request.uri_mut() = format!("http://{}/_tierstack/purge/site.example/one", rig.admin).parse().unwrap();
    assert_eq!(rig.client.request(request).await.unwrap().status(), StatusCode::OK);
    assert_eq!(rig.get("/one", &[("host", "site.example")]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/two", &[("host", "site.example")]).await.x_cache(), "HIT");
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.method_mut() = Method::DELETE;
    *request.uri_mut() = format!("http://{}/_tierstack/purge/site.example/never", rig.admin).parse().unwrap();
    assert_eq!(rig.client.request(request).await.unwrap().status(), StatusCode::NOT_FOUND);
    // Not on the client listener.
    let got = rig.send(Method::DELETE, "/_tierstack/purge/site.example/two", &[]).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(rig.stats().await.purges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_metrics_are_served_on_the_admin_listener_only() {
    let rig = Rig::new().await;
    deps_origin(&rig, &[]);
    rig.get("/doc/a", &[]).await;
    rig.get("/doc/a", &[]).await;
    let uri = format!("http://{}/metrics", rig.admin).parse().unwrap();
    let response = rig.client.get(uri).await.unwrap();
    assert_eq!(response.headers().get("content-type").unwrap(), "text/plain; version=0.0.4; charset=utf-8");
    let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    for line in [
        "tierstack_proxy_requests_total 2",
        "tierstack_proxy_hits_total 1",
        "tierstack_proxy_misses_total 1",
        "tierstack_proxy_version_checks_total 1",
        "tierstack_proxy_objects 1",
        "tierstack_proxy_version_check_seconds_count 1",
        "tierstack_proxy_version_check_seconds_bucket{le=\"+Inf\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    // The client listener forwards /metrics like any page.
    rig.origin.always(Reply::ok(&[], "the origin's page"));
    assert_eq!(rig.get("/metrics", &[]).await.body, "the origin's page");
}
