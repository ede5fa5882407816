//! Ranges of stored complete responses (RFC 9110 §14): single, suffix and
//! open ranges, `multipart/byteranges`, 416, ranges ignored, `If-Range`;
//! HEAD ignores `Range`; a range the cache does not answer passes through,
//! its 206 not stored; a response with dependencies gives ranges only
//! after its version check.

use super::support::*;
use hyper::{Method, StatusCode};

const BODY: &str = "0123456789";

/// A rig whose origin answers every request with a fresh `BODY` (or a 206
/// of its first four bytes to a request with `Range`), and one whole GET
/// already stored.
async fn stored(fields: &'static [(&'static str, &'static str)]) -> Rig {
    let rig = Rig::new().await;
    rig.origin.answer(move |seen, _| match seen.headers.get("range") {
        Some(_) => Reply::with(206, &[("content-range", "bytes 0-3/10")], "0123"),
        None => Reply::ok(fields, BODY),
    });
    let first = rig.get("/r", &[]).await;
    assert_eq!((first.x_cache(), first.body.as_str()), ("MISS", BODY));
    rig
}

const FRESH: &[(&str, &str)] = &[("cache-control", "max-age=300"), ("content-type", "text/plain")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_suffix_and_open_ranges_are_served_from_the_stored_response() {
    let rig = stored(FRESH).await;
    for (range, content_range, part) in [
        ("bytes=0-4", "bytes 0-4/10", "01234"),
        ("bytes=5-", "bytes 5-9/10", "56789"),
        ("bytes=-3", "bytes 7-9/10", "789"),
        ("bytes=8-99", "bytes 8-9/10", "89"),
    ] {
        let got = rig.get("/r", &[("range", range)]).await;
        assert_eq!(
            (got.status, got.x_cache(), got.body.as_str()),
            (StatusCode::PARTIAL_CONTENT, "HIT", part),
            "{range}"
        );
        assert_eq!(got.field("content-range"), Some(content_range));
        assert_eq!(got.field("content-length"), Some(part.len().to_string().as_str()));
        assert_eq!(got.field("content-type"), Some("text/plain"));
        assert!(got.field("age").is_some());
    }
    assert_eq!(rig.origin.requests(), 1, "no range went upstream");
    let stats = rig.stats().await;
    assert_eq!((stats.hits, stats.ranges_served), (4, 4));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_ranges_are_served_as_multipart_byteranges_in_the_order_asked() {
    let rig = stored(FRESH).await;
    let got = rig.get("/r", &[("range", "bytes=6-7, 0-1")]).await;
    assert_eq!((got.status, got.x_cache()), (StatusCode::PARTIAL_CONTENT, "HIT"));
    let content_type = got.field("content-type").unwrap();
    let boundary = content_type.strip_prefix("multipart/byteranges; boundary=").expect(content_type);
    assert!(got.field("content-range").is_none(), "each part has its own");
    let expected = format!(
        "--{boundary}\r\nContent-Type: text/plain\r\nContent-Range: bytes 6-7/10\r\n\r\n67\r\n\
         --{boundary}\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n01\r\n--{boundary}--\r\n"
    );
    assert_eq!(got.body, expected);
    assert_eq!(rig.origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsatisfiable_range_is_416_and_an_invalid_one_or_too_many_are_ignored() {
    let rig = stored(FRESH).await;
    let unsatisfiable = rig.get("/r", &[("range", "bytes=10-")]).await;
    assert_eq!((unsatisfiable.status, unsatisfiable.x_cache()), (StatusCode::RANGE_NOT_SATISFIABLE, "HIT"));
    assert_eq!(unsatisfiable.field("content-range"), Some("bytes */10"));
    let too_many = format!("bytes={}", (0..=tierstack_proxy::RANGES_MAX).map(|_| "0-0").collect::<Vec<_>>().join(","));
    for ignored in ["bytes=5-2", "items=0-1", "bytes=0-4,3-6", "bytes=x", too_many.as_str()] {
        let got = rig.get("/r", &[("range", ignored)]).await;
        assert_eq!((got.status, got.x_cache(), got.body.as_str()), (StatusCode::OK, "HIT", BODY), "{ignored}");
        assert!(got.field("content-range").is_none());
    }
    assert_eq!(rig.origin.requests(), 1);
    let stats = rig.stats().await;
    assert_eq!(stats.ranges_served, 1, "the 416; ignored ranges are whole hits");
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_range_serves_the_range_only_for_the_stored_strong_validator() {
    let (modified, date) = (http_date(-3600), http_date(0));
    let fields: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
        ("cache-control", "max-age=300"),
        ("etag", "\"v1\""),
        ("last-modified", Box::leak(modified.clone().into_boxed_str()) as &str),
        ("date", Box::leak(date.into_boxed_str()) as &str),
    ]));
    let rig = stored(fields).await;
    let older = http_date(-7200);
    for (if_range, partial) in [
        ("\"v1\"", true),
        ("\"v0\"", false),
        ("W/\"v1\"", false),
        (modified.as_str(), true),
        (older.as_str(), false),
        ("not a validator", false),
    ] {
        let got = rig.get("/r", &[("range", "bytes=0-1"), ("if-range", if_range)]).await;
        let expected = if partial { (StatusCode::PARTIAL_CONTENT, "01") } else { (StatusCode::OK, BODY) };
        assert_eq!((got.status, got.body.as_str()), expected, "If-Range: {if_range}");
        assert_eq!(got.x_cache(), "HIT");
    }
    assert_eq!(rig.origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_s_own_conditions_come_before_its_range_and_head_ignores_range() {
    let rig = stored(&[("cache-control", "max-age=300"), ("etag", "\"v1\"")]).await;
    let not_modified = rig.get("/r", &[("range", "bytes=0-1"), ("if-none-match", "\"v1\"")]).await;
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    let head = rig.send(Method::HEAD, "/r", &[("range", "bytes=0-1")]).await;
    assert_eq!((head.status, head.x_cache(), head.body.as_str()), (StatusCode::OK, "HIT", ""));
    assert_eq!(head.field("content-length"), Some("10"));
    assert_eq!(rig.origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_the_cache_cannot_answer_passes_through_and_its_206_is_not_stored() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("range") {
        Some(_) => Reply::with(206, &[("cache-control", "max-age=300"), ("content-range", "bytes 0-3/10")], "0123"),
        None => Reply::ok(&[("cache-control", "max-age=300")], BODY),
    });
    for _ in 0..2 {
        let partial = rig.get("/r", &[("range", "bytes=0-3"), ("if-range", "\"x\"")]).await;
        assert_eq!(
            (partial.status, partial.x_cache(), partial.body.as_str()),
            (StatusCode::PARTIAL_CONTENT, "MISS", "0123")
        );
        let seen = rig.origin.last();
        assert_eq!(seen.headers.get("range").unwrap(), "bytes=0-3", "passed through as it came");
        assert_eq!(seen.headers.get("if-range").unwrap(), "\"x\"");
    }
    assert_eq!(rig.origin.requests(), 2, "the 206 was not stored");
    assert_eq!(rig.get("/r", &[]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/r", &[("range", "bytes=0-1")]).await.x_cache(), "HIT", "a whole GET filled the cache");
    assert_eq!(rig.origin.requests(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_of_a_stale_response_passes_through_and_leaves_it_stored() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("range") {
        Some(_) => Reply::with(206, &[("content-range", "bytes 0-3/10")], "abcd"),
        None => Reply::ok(&[("cache-control", "max-age=30"), ("age", "60"), ("etag", "\"e\"")], BODY),
    });
    rig.get("/r", &[]).await;
    let partial = rig.get("/r", &[("range", "bytes=0-3")]).await;
    assert_eq!(
        (partial.status, partial.x_cache(), partial.body.as_str()),
        (StatusCode::PARTIAL_CONTENT, "MISS", "abcd")
    );
    let seen = rig.origin.last();
    assert!(seen.headers.get("if-none-match").is_none(), "not a revalidation: {seen:?}");
    assert_eq!(rig.stats().await.cached_entries, 1, "the stored response stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_of_a_response_with_dependencies_is_served_only_after_its_version_check() {
    let rig = Rig::new().await;
    deps_origin(&rig, &[]);
    let whole = rig.get("/doc/a", &[]).await;
    let before = rig.stats().await;
    let partial = rig.get("/doc/a", &[("range", "bytes=0-2")]).await;
    assert_eq!((partial.status, partial.x_cache()), (StatusCode::PARTIAL_CONTENT, "HIT"));
    assert_eq!(partial.body, whole.body[..3]);
    let after = rig.stats().await;
    assert_eq!(after.checks_ok, before.checks_ok + 1, "checked like a whole hit");
    rig.bump("doc/a");
    let current = rig.deps("doc/a");
    let changed = rig.get("/doc/a", &[("range", "bytes=0-2")]).await;
    assert_eq!(changed.x_cache(), "MISS", "never a range of an out-of-date copy");
    let seen = rig.origin.last();
    assert_eq!(seen.headers.get("range").unwrap(), "bytes=0-2", "passed through");
    assert_eq!(changed.body, format!("{current} -"), "the origin ignored the range: its current page");
    let stats = rig.stats().await;
    assert_eq!((stats.stale_dropped, stats.ranges_served), (1, 1));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}
