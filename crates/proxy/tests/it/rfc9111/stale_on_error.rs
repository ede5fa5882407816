//! Serving stale on failure: the operator's grace (`serve_stale_on_error`,
//! `--serve-stale-on-error`) beside RFC 5861's `stale-if-error`, when the
//! origin closes the connection or answers 500/502/503/504; never for
//! `must-revalidate`, `proxy-revalidate`, `s-maxage`, `no-cache`, against
//! the request's `min-fresh`/`max-stale`, or for a response with
//! dependencies; a range request passed through gets the stale copy's
//! range. Staleness comes from the origin's `Age`.

use super::support::*;
use hyper::StatusCode;
use std::time::Duration;
use tierstack_proxy::{CacheMode, ProxyOptions};

/// A rig with a cuttable relay to the origin and `grace_secs` of grace.
async fn rig(mode: CacheMode, grace_secs: u64) -> Rig {
    let options = ProxyOptions { serve_stale_on_error: Duration::from_secs(grace_secs), ..ProxyOptions::default() };
    Rig::build(mode, options, true).await
}

/// Stores `/r` with `fields` (the origin answering `body`), then cuts the
/// way to the origin and asks again with `request`.
async fn after_a_cut(rig: &Rig, fields: &'static [(&'static str, &'static str)], request: &[(&str, &str)]) -> Got {
    rig.origin.always(Reply::ok(fields, "stored"));
    let first = rig.get("/r", &[]).await;
    assert_eq!((first.status, first.x_cache()), (StatusCode::OK, "MISS"));
    assert_eq!(rig.stats().await.cached_entries, 1, "stored: {fields:?}");
    rig.relay.as_ref().unwrap().cut(true).await;
    rig.get("/r", request).await
}

/// Stale by 60 - 30 = 30 seconds on arrival.
const STALE_30: &[(&str, &str)] = &[("cache-control", "max-age=30"), ("age", "60")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_grace_a_closed_connection_is_502() {
    let rig = rig(CacheMode::Ttl, 0).await;
    let got = after_a_cut(&rig, STALE_30, &[]).await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    assert_eq!(rig.stats().await.served_on_error, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_serves_a_stale_response_when_the_origin_closes_the_connection() {
    let rig = rig(CacheMode::Ttl, 3600).await;
    let got = after_a_cut(&rig, STALE_30, &[]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "stored"));
    let age: u64 = got.field("age").unwrap().parse().unwrap();
    assert!(age >= 60, "its real age: {age}");
    assert!(got.field("warning").is_none(), "RFC 9111 obsoletes Warning");
    let stats = rig.stats().await;
    assert_eq!((stats.served_on_error, stats.stale_served, stats.misses), (1, 1, 2));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    // Once the origin is back, the revalidation answers again.
    rig.relay.as_ref().unwrap().cut(false).await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "new"));
    assert_eq!(rig.get("/r", &[]).await.body, "new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_covers_a_response_stale_by_at_most_its_seconds() {
    let rig = rig(CacheMode::Ttl, 10).await;
    assert_eq!(after_a_cut(&rig, STALE_30, &[]).await.status, StatusCode::BAD_GATEWAY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_stands_in_for_500_502_503_504_but_not_for_other_statuses() {
    for (status, served) in [(500, true), (502, true), (503, true), (504, true), (501, false), (404, false)] {
        let rig = rig(CacheMode::Ttl, 3600).await;
        rig.origin.answer(move |_, n| match n {
            0 => Reply::ok(STALE_30, "stored"),
            _ => Reply::with(status, &[], "failure"),
        });
        rig.get("/r", &[]).await;
        let got = rig.get("/r", &[]).await;
        let expected = if served { (200, "stored") } else { (status, "failure") };
        assert_eq!((got.status.as_u16(), got.body.as_str()), expected, "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_proxy_revalidate_s_maxage_and_no_cache_are_never_served_stale_on_error() {
    let cases: [&'static [(&'static str, &'static str)]; 4] = [
        &[("cache-control", "max-age=30, must-revalidate, stale-if-error=3600"), ("age", "60")],
        &[("cache-control", "max-age=30, proxy-revalidate"), ("age", "60")],
        &[("cache-control", "s-maxage=30"), ("age", "60")],
        &[("cache-control", "max-age=300, no-cache"), ("etag", "\"e\"")],
    ];
    for fields in cases {
        let rig = rig(CacheMode::Ttl, 3600).await;
        let got = after_a_cut(&rig, fields, &[]).await;
        assert_eq!(got.status, StatusCode::BAD_GATEWAY, "{fields:?}");
        assert_eq!(rig.stats().await.served_on_error, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_s_min_fresh_and_max_stale_limit_the_grace() {
    for (request, served) in [
        ("min-fresh=1", false),
        ("max-stale=10", false),
        ("max-stale=40", true),
        ("max-stale", true),
        ("no-cache", true),
    ] {
        let rig = rig(CacheMode::Ttl, 3600).await;
        let got = after_a_cut(&rig, STALE_30, &[("cache-control", request)]).await;
        let expected = if served { StatusCode::OK } else { StatusCode::BAD_GATEWAY };
        assert_eq!(got.status, expected, "{request}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_alone_serves_within_its_window() {
    let within: &[(&str, &str)] = &[("cache-control", "max-age=30, stale-if-error=60"), ("age", "60")];
    assert_eq!(after_a_cut(&rig(CacheMode::Ttl, 0).await, within, &[]).await.status, StatusCode::OK);
    let past: &[(&str, &str)] = &[("cache-control", "max-age=30, stale-if-error=20"), ("age", "60")];
    assert_eq!(after_a_cut(&rig(CacheMode::Ttl, 0).await, past, &[]).await.status, StatusCode::BAD_GATEWAY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_dependencies_is_never_served_stale_on_error() {
    let rig = rig(CacheMode::Poll, 3600).await;
    deps_origin(&rig, &[("cache-control", "max-age=0, stale-if-error=3600")]);
    let first = rig.get("/doc/a", &[]).await;
    assert_eq!(rig.get("/doc/a", &[]).await.x_cache(), "HIT", "stored, current");
    rig.bump("doc/a");
    rig.relay.as_ref().unwrap().cut(true).await;
    let got = rig.get("/doc/a", &[]).await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY, "not the out-of-date copy: {got:?}");
    assert_ne!(got.body, first.body);
    let stats = rig.stats().await;
    assert_eq!((stats.served_on_error, stats.stale_served), (0, 0));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_request_the_origin_fails_gets_the_stale_copy_s_range_under_the_grace() {
    let graced = rig(CacheMode::Ttl, 3600).await;
    let got = after_a_cut(&graced, STALE_30, &[("range", "bytes=1-3")]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::PARTIAL_CONTENT, "tor"));
    assert_eq!((got.field("content-range"), got.x_cache()), (Some("bytes 1-3/6"), "MISS"));
    let stats = graced.stats().await;
    assert_eq!(stats.served_on_error, 1);
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    let without = rig(CacheMode::Ttl, 0).await;
    assert_eq!(after_a_cut(&without, STALE_30, &[("range", "bytes=1-3")]).await.status, StatusCode::BAD_GATEWAY);
}
