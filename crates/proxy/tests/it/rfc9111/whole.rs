//! Whole responses (RFC 9111 §3 and §4): replayed status, fields and body,
//! `Age`, the key; HEAD.

use super::support::*;
use hyper::{Method, StatusCode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_replays_the_status_every_end_to_end_field_and_the_body() {
    let rig = Rig::new().await;
    let date = http_date(0);
    rig.origin.always(Reply::with(
        203,
        &[
            ("cache-control", "max-age=300"),
            ("etag", "\"v1\""),
            ("last-modified", "Mon, 02 Nov 2026 10:00:00 GMT"),
            ("content-type", "text/html; charset=utf-8"),
            ("content-language", "en"),
            ("x-custom", "one"),
            ("x-custom", "two"),
            ("date", &date),
            ("link", "</style.css>; rel=preload"),
        ],
        "the whole page",
    ));
    let miss = rig.get("/page", &[]).await;
    assert_eq!((miss.status.as_u16(), miss.x_cache()), (203, "MISS"));
    let hit = rig.get("/page", &[]).await;
    assert_eq!((hit.status.as_u16(), hit.x_cache()), (203, "HIT"), "{hit:?}");
    assert_eq!(hit.body, "the whole page");
    assert_eq!(without_cache_fields(&hit.headers), without_cache_fields(&miss.headers));
    let customs: Vec<_> = hit.headers.get_all("x-custom").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(customs, ["one", "two"], "every line, in order");
    assert_eq!(hit.field("etag"), Some("\"v1\""));
    assert_eq!(rig.origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_and_those_connection_names_are_never_relayed_nor_stored() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(
        &[
            ("cache-control", "max-age=300"),
            ("connection", "x-secret, x-other"),
            ("x-secret", "hop"),
            ("x-other", "hop too"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic realm=\"origin\""),
            ("x-kept", "end to end"),
        ],
        "body",
    ));
    for expected in ["MISS", "HIT"] {
        let got = rig.get("/h", &[]).await;
        assert_eq!(got.x_cache(), expected);
        for hop in ["x-secret", "x-other", "keep-alive", "proxy-authenticate"] {
            assert!(got.field(hop).is_none(), "{expected}: {hop} relayed: {got:?}");
        }
        assert_eq!(got.field("x-kept"), Some("end to end"));
    }
    // Nor sent upstream from the client's request.
    rig.get("/h2", &[("connection", "x-client-hop"), ("x-client-hop", "1"), ("x-end", "2")]).await;
    let seen = rig.origin.last();
    assert!(seen.headers.get("x-client-hop").is_none(), "{seen:?}");
    assert_eq!(seen.headers.get("x-end").unwrap(), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_carry_age_including_the_age_the_origin_reported() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300"), ("age", "40")], "aged"));
    rig.get("/a", &[]).await;
    let hit = rig.get("/a", &[]).await;
    assert_eq!(hit.x_cache(), "HIT");
    let age: u64 = hit.field("age").unwrap().parse().unwrap();
    assert!((40..=45).contains(&age), "age {age}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_key_is_the_authority_and_the_full_target() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| {
        let host = seen.headers.get("host").map_or("-".into(), |h| h.to_str().unwrap().to_string());
        Reply::ok(&[("cache-control", "max-age=300")], &format!("{host} {}", seen.target))
    });
    let a = rig.get("/p?q=1", &[("host", "a.example")]).await;
    assert_eq!(a.body, "a.example /p?q=1", "the upstream is told the site");
    let b = rig.get("/p?q=1", &[("host", "B.example")]).await;
    assert_eq!((b.x_cache(), b.body.as_str()), ("MISS", "B.example /p?q=1"), "another site");
    let q = rig.get("/p?q=2", &[("host", "a.example")]).await;
    assert_eq!(q.x_cache(), "MISS", "another query");
    let again = rig.get("/p?q=1", &[("host", "A.EXAMPLE")]).await;
    assert_eq!((again.x_cache(), again.body.as_str()), ("HIT", "a.example /p?q=1"), "authority is case-insensitive");
    assert_eq!(rig.origin.requests(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_answered_from_a_stored_get() {
    let rig = Rig::new().await;
    rig.origin
        .always(Reply::ok(&[("cache-control", "max-age=300"), ("etag", "\"h\""), ("x-field", "1")], "0123456789"));
    rig.get("/head", &[]).await;
    let head = rig.send(Method::HEAD, "/head", &[]).await;
    assert_eq!((head.status, head.x_cache(), head.body.as_str()), (StatusCode::OK, "HIT", ""));
    assert_eq!((head.field("etag"), head.field("x-field")), (Some("\"h\""), Some("1")));
    assert_eq!(head.field("content-length"), Some("10"));
    assert_eq!(rig.origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_miss_is_forwarded_as_head_and_stores_nothing() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "body"));
    let head = rig.send(Method::HEAD, "/h", &[]).await;
    assert_eq!((head.status, head.x_cache(), head.body.as_str()), (StatusCode::OK, "MISS", ""));
    assert_eq!(rig.origin.last().method, Method::HEAD);
    assert_eq!(rig.get("/h", &[]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/h", &[]).await.x_cache(), "HIT");
}
