//! Parsing the fields a shared cache decides by: `CDN-Cache-Control` as an
//! RFC 8941 Dictionary (RFC 9213), `Cache-Control` arguments strictly
//! (§1.2.2, §5.2), `Age` by its first member (§5.1), what a 304 may not
//! change (§3.2), and `If-Modified-Since` against a response without
//! `Last-Modified` (§4.3.2).

use super::support::*;
use hyper::StatusCode;

/// A targeted field that is not a valid Dictionary, or gives `max-age`
/// as a String, is ignored whole: `Cache-Control: no-store` applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_cdn_cache_control_never_overrides_cache_control() {
    for cdn in ["max-age=10000, &&&&&", "max-age=\"10000\"", "max-age=-5", "MAX-AGE=10000", "max-age=10000;A"] {
        let fields = [("cache-control", "no-store"), ("cdn-cache-control", cdn)];
        assert_eq!(origin_requests_for_two_gets(&fields, &[]).await, 2, "{cdn}");
    }
    for cdn in ["max-age=10000", "max-age=10000;a, foo=(1 2)"] {
        let fields = [("cache-control", "no-store"), ("cdn-cache-control", cdn)];
        assert_eq!(origin_requests_for_two_gets(&fields, &[]).await, 1, "a valid one is obeyed: {cdn}");
    }
    let fields = [("cache-control", "max-age=10000"), ("cdn-cache-control", "no-store")];
    assert_eq!(origin_requests_for_two_gets(&fields, &[]).await, 2);
    // With a validator, a targeted field that counted (its bad `max-age`
    // alone ignored) would have it stored and revalidated.
    let rig = Rig::new().await;
    let fields = [("cache-control", "no-store"), ("cdn-cache-control", "max-age=\"10000\""), ("etag", "\"e\"")];
    rig.origin.always(Reply::ok(&fields, "x"));
    rig.get("/e", &[]).await;
    rig.get("/e", &[]).await;
    assert_eq!(rig.origin.requests(), 2);
    assert!(rig.origin.last().headers.get("if-none-match").is_none(), "not stored: no-store applied");
}

/// `max-age` is delta-seconds, as a token or quoted, with nothing around
/// it: anything else is invalid and the response stale (§4.2.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_control_arguments_with_stray_characters_are_stale() {
    for (cc, requests) in [
        ("max-age=3600", 1),
        ("max-age=\"3600\"", 1),
        ("max-age= 3600", 2),
        ("max-age =3600", 2),
        ("max-age=3600a", 2),
        ("max-age=3600.0", 2),
        ("max-age='3600'", 2),
    ] {
        assert_eq!(origin_requests_for_two_gets(&[("cache-control", cc)], &[]).await, requests, "{cc}");
    }
}

/// `Age` is a singleton; a list counts by its first member, and a first
/// member that is not delta-seconds makes the response stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_counts_by_its_first_member_and_an_invalid_age_is_stale() {
    let fresh = ("cache-control", "max-age=3600");
    for (ages, requests) in [
        (&["7200, 0"][..], 2),
        (&["7200,0"][..], 2),
        (&["7200", "0"][..], 2),
        (&["0, 7200"][..], 1),
        (&["0", "7200"][..], 1),
        (&["abc"][..], 2),
        (&["-7200"][..], 2),
        (&["7200.0"][..], 2),
        (&["7200;foo=bar"][..], 2),
        (&["10;foo=111"][..], 2),
        (&["10"][..], 1),
    ] {
        let mut fields = vec![fresh];
        fields.extend(ages.iter().map(|age| ("age", *age)));
        assert_eq!(origin_requests_for_two_gets(&fields, &[]).await, requests, "{ages:?}");
    }
}

/// §3.2: a 304 does not change what the stored body depends on (its
/// checksums, coding, range), and its own `Age` replaces the stored one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_keeps_the_stored_bodys_checksum() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(_) => Reply::with(
            304,
            &[("etag", "\"v\""), ("cache-control", "max-age=300"), ("content-md5", "bmV3"), ("x-v", "2")],
            "",
        ),
        None => Reply::ok(
            &[("etag", "\"v\""), ("cache-control", "max-age=0"), ("content-md5", "b2xk"), ("age", "50"), ("x-v", "1")],
            "body",
        ),
    });
    rig.get("/m", &[]).await;
    rig.get("/m", &[]).await;
    let hit = rig.get("/m", &[]).await;
    assert_eq!((hit.x_cache(), hit.field("x-v"), hit.field("content-md5")), ("HIT", Some("2"), Some("b2xk")));
    let age: u64 = hit.field("age").unwrap().parse().unwrap();
    assert!(age < 50, "the old message's Age is gone: {age}");
    assert_eq!(rig.origin.requests(), 2);
}

/// §4.3.2: without `Last-Modified`, the stored `Date` (not when it was
/// received) answers a client's `If-Modified-Since`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_modified_since_uses_the_stored_date_without_last_modified() {
    let rig = Rig::new().await;
    let date = http_date(-5000);
    let fields = [("cache-control", "max-age=10000"), ("date", date.as_str())];
    rig.origin.always(Reply::ok(&fields, "dated"));
    rig.get("/d", &[]).await;
    let later = http_date(-3000);
    let got = rig.get("/d", &[("if-modified-since", &later)]).await;
    assert_eq!((got.status, got.x_cache()), (StatusCode::NOT_MODIFIED, "HIT"));
    let earlier = http_date(-6000);
    let got = rig.get("/d", &[("if-modified-since", &earlier)]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "dated"), "modified since then");
    assert_eq!(rig.origin.requests(), 1);
}
