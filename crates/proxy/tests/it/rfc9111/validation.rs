//! Validation (§4.3): conditional requests with the stored validators, 304s,
//! and serving stale (`must-revalidate`, `stale-if-error`, `stale-while-
//! revalidate`).

use super::support::*;
use hyper::StatusCode;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_responses_are_revalidated_with_the_stored_etag_before_every_use() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(tag) if tag == "\"v1\"" => Reply::with(304, &[("etag", "\"v1\"")], ""),
        _ => Reply::ok(&[("cache-control", "no-cache"), ("etag", "\"v1\"")], "stored body"),
    });
    rig.get("/n", &[]).await;
    for _ in 0..2 {
        let got = rig.get("/n", &[]).await;
        assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "stored body"));
        assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"v1\"");
    }
    assert_eq!(rig.origin.requests(), 3);
    let stats = rig.stats().await;
    assert_eq!((stats.revalidations, stats.revalidated), (2, 2), "{stats:?}");
    assert_eq!(stats.accounting_error(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revalidation_uses_last_modified_when_there_is_no_etag() {
    let rig = Rig::new().await;
    let lm = "Mon, 02 Nov 2026 10:00:00 GMT";
    rig.origin.answer(move |seen, _| match seen.headers.get("if-modified-since") {
        Some(since) if since == lm => Reply::with(304, &[], ""),
        _ => Reply::ok(&[("cache-control", "max-age=0"), ("last-modified", lm)], "by date"),
    });
    rig.get("/d", &[]).await;
    let got = rig.get("/d", &[]).await;
    assert_eq!(got.body, "by date");
    assert_eq!(rig.origin.last().headers.get("if-modified-since").unwrap(), lm);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_updates_the_stored_fields() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(_) => Reply::with(304, &[("etag", "\"v1\""), ("cache-control", "max-age=300"), ("x-version", "2")], ""),
        None => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"v1\""), ("x-version", "1")], "body"),
    });
    assert_eq!(rig.get("/u", &[]).await.field("x-version"), Some("1"));
    let revalidated = rig.get("/u", &[]).await;
    assert_eq!((revalidated.field("x-version"), revalidated.body.as_str()), (Some("2"), "body"));
    let hit = rig.get("/u", &[]).await;
    assert_eq!(
        (hit.x_cache(), hit.field("x-version"), hit.field("cache-control")),
        ("HIT", Some("2"), Some("max-age=300"))
    );
    assert_eq!(hit.field("content-length"), Some("4"), "the framing is the stored body's");
    assert_eq!(rig.origin.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_response_to_a_revalidation_replaces_the_stored_one() {
    let rig = Rig::new().await;
    rig.origin
        .answer(|_, n| Reply::ok(&[("cache-control", "max-age=0"), ("etag", &format!("\"v{n}\""))], &format!("v{n}")));
    rig.get("/f", &[]).await;
    assert_eq!(rig.get("/f", &[]).await.body, "v1");
    rig.get("/f", &[]).await;
    assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"v1\"", "the new validator is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_own_conditions_are_not_sent_on_a_revalidation() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(_) => Reply::with(304, &[("etag", "\"mine\"")], ""),
        None => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"mine\"")], "body"),
    });
    rig.get("/c", &[]).await;
    let got = rig.get("/c", &[("if-none-match", "\"other\"")]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "body"));
    assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"mine\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_forbids_serving_stale_on_error() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(
            &[("cache-control", "max-age=1, must-revalidate, stale-if-error=600"), ("age", "5"), ("etag", "\"a\"")],
            "old",
        ),
        _ => Reply::with(503, &[], "down"),
    });
    rig.get("/m", &[]).await;
    assert_eq!(rig.get("/m", &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_revalidate_also_forbids_stale() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(&[("cache-control", "max-age=1, proxy-revalidate, stale-if-error=600"), ("age", "5")], "old"),
        _ => Reply::with(500, &[], "down"),
    });
    rig.get("/m", &[]).await;
    assert_eq!(rig.get("/m", &[]).await.status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_the_stored_response_when_the_origin_fails() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(&[("cache-control", "max-age=1, stale-if-error=600"), ("age", "5"), ("etag", "\"a\"")], "kept"),
        _ => Reply::with(503, &[], "down"),
    });
    rig.get("/e", &[]).await;
    let got = rig.get("/e", &[]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "kept"));
    assert_eq!(rig.stats().await.stale_served, 1);
    // Without the directive the error goes through.
    rig.origin.answer(|_, n| match n {
        2 => Reply::ok(&[("cache-control", "max-age=1"), ("age", "5"), ("etag", "\"a\"")], "kept"),
        _ => Reply::with(503, &[], "down"),
    });
    rig.get("/e2", &[]).await;
    assert_eq!(rig.get("/e2", &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_serves_stale_at_once_and_refreshes_behind() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| {
        Reply::ok(
            &[("cache-control", "max-age=1, stale-while-revalidate=600"), ("age", "5"), ("etag", &format!("\"{n}\""))],
            &format!("v{n}"),
        )
    });
    rig.get("/s", &[]).await;
    let stale = rig.get("/s", &[]).await;
    assert_eq!((stale.x_cache(), stale.body.as_str()), ("HIT", "v0"), "served stale at once");
    wait_for("the background revalidation", || rig.origin.requests() == 2).await;
    assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"0\"");
    // It stored v1 (also already past its lifetime: again stale-while-revalidate).
    let mut body = String::new();
    for _ in 0..1000 {
        body = rig.get("/s", &[("cache-control", "max-stale")]).await.body;
        if body == "v1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(body, "v1");
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "a background revalidation is routed too: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_maxage_forbids_serving_stale_even_with_stale_if_error() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(&[("cache-control", "s-maxage=1, stale-if-error=600"), ("age", "5")], "old"),
        _ => Reply::with(502, &[], "down"),
    });
    rig.get("/s", &[]).await;
    assert_eq!(rig.get("/s", &[]).await.status, StatusCode::BAD_GATEWAY);
}

/// §4.3.4: a 304 naming a strong validator no stored response has updates
/// nothing; the request it answered gets the stored response (the 304 said
/// the stored validator still holds), never a second, unconditional
/// request's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_for_another_representation_updates_nothing_and_the_stored_response_answers() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, n| match (n, seen.headers.get("if-none-match")) {
        (0, _) => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"a\""), ("x-v", "1")], "first"),
        (_, Some(_)) => Reply::with(304, &[("etag", "\"b\""), ("cache-control", "max-age=300"), ("x-v", "2")], ""),
        (_, None) => Reply::with(599, &[], "an unconditional request reached the origin"),
    });
    rig.get("/r", &[]).await;
    for round in 1..=2 {
        let got = rig.get("/r", &[]).await;
        assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "first"), "round {round}");
        assert_eq!((got.field("etag"), got.field("x-v")), (Some("\"a\""), Some("1")), "not updated");
        assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"a\"", "still stale: revalidated");
    }
    assert_eq!(rig.origin.requests(), 3);
    let stats = rig.stats().await;
    assert_eq!((stats.revalidations, stats.revalidated), (2, 0));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}
