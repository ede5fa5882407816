//! Freshness (§4.2), and the request directives that bear on it (§5.2.1).

use super::support::*;
use hyper::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_makes_a_response_fresh() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=300")], &[]).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_maxage_overrides_max_age_for_a_shared_cache() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=0, s-maxage=300")], &[]).await, 1);
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=300, s-maxage=0")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_overrides_expires_and_expires_alone_gives_freshness() {
    let (now, later, past) = (http_date(0), http_date(300), http_date(-300));
    let (now, later, past) = (now.as_str(), later.as_str(), past.as_str());
    assert_eq!(origin_requests_for_two_gets(&[("date", now), ("expires", later)], &[]).await, 1);
    let both = [("date", now), ("expires", later), ("cache-control", "max-age=0")];
    assert_eq!(origin_requests_for_two_gets(&both, &[]).await, 2);
    let expired = [("date", now), ("expires", past), ("cache-control", "public")];
    assert_eq!(origin_requests_for_two_gets(&expired, &[]).await, 2);
    assert_eq!(origin_requests_for_two_gets(&[("expires", "0"), ("cache-control", "public")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_or_repeated_max_age_is_stale() {
    for cc in ["max-age=abc", "max-age=300, max-age=5"] {
        assert_eq!(origin_requests_for_two_gets(&[("cache-control", cc), ("etag", "\"e\"")], &[]).await, 2, "{cc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heuristic_freshness_comes_only_from_last_modified() {
    let old = http_date(-86_400 * 30);
    assert_eq!(origin_requests_for_two_gets(&[("last-modified", &old)], &[]).await, 1);
    assert_eq!(origin_requests_for_two_gets(&[("content-type", "text/plain")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_already_older_than_its_lifetime_is_not_served_without_revalidation() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=30"), ("age", "60")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdn_cache_control_takes_the_place_of_cache_control() {
    let targeted = [("cache-control", "no-store"), ("cdn-cache-control", "max-age=300")];
    assert_eq!(origin_requests_for_two_gets(&targeted, &[]).await, 1);
    let forbidden = [("cache-control", "max-age=300"), ("cdn-cache-control", "no-store")];
    assert_eq!(origin_requests_for_two_gets(&forbidden, &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_directives_no_cache_max_age_and_pragma_force_revalidation() {
    for request in [[("cache-control", "no-cache")], [("cache-control", "max-age=0")], [("pragma", "no-cache")]] {
        let rig = Rig::new().await;
        rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "x"));
        rig.get("/r", &[]).await;
        assert_eq!(rig.get("/r", &[]).await.x_cache(), "HIT");
        rig.get("/r", &request).await;
        assert_eq!(rig.origin.requests(), 2, "{request:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_if_cached_gets_504_on_a_miss_and_the_stored_response_on_a_hit() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "x"));
    let miss = rig.get("/o", &[("cache-control", "only-if-cached")]).await;
    assert_eq!(miss.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(rig.origin.requests(), 0);
    rig.get("/o", &[]).await;
    let hit = rig.get("/o", &[("cache-control", "only-if-cached")]).await;
    assert_eq!((hit.status, hit.x_cache()), (StatusCode::OK, "HIT"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_allowing_max_stale_is_served_a_stale_response() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=10"), ("age", "20")], "stale but fine"));
    rig.get("/m", &[]).await;
    let got = rig.get("/m", &[("cache-control", "max-stale=60")]).await;
    assert_eq!((got.x_cache(), got.body.as_str()), ("HIT", "stale but fine"));
    let strict = rig.get("/m", &[("cache-control", "max-stale=5")]).await;
    assert_eq!(strict.x_cache(), "MISS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_if_cached_with_only_a_stale_response_is_504() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=10"), ("age", "20"), ("etag", "\"x\"")], "x"));
    rig.get("/o", &[]).await;
    assert_eq!(rig.get("/o", &[("cache-control", "only-if-cached")]).await.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(rig.origin.requests(), 1);
}
