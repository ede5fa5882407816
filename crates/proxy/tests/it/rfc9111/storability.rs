//! Storability (§3): what a shared cache must not store, and what it may.

use super::support::*;
use hyper::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_responses_are_never_stored() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=300, no-store")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_no_store_is_not_stored() {
    assert_eq!(
        origin_requests_for_two_gets(&[("cache-control", "max-age=300")], &[("cache-control", "no-store")]).await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_responses_are_never_stored_by_a_shared_cache() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "private, max-age=300")], &[]).await, 2);
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "private=\"x-user\", max-age=300")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_different_authorization_never_see_each_others_responses() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| {
        let who = seen.headers.get("authorization").map_or("nobody".into(), |a| a.to_str().unwrap().to_string());
        Reply::ok(&[("cache-control", "max-age=300")], &format!("page of {who}"))
    });
    let alice = rig.get("/account", &[("authorization", "Bearer alice")]).await;
    assert_eq!(alice.body, "page of Bearer alice");
    let bob = rig.get("/account", &[("authorization", "Bearer bob")]).await;
    assert_eq!((bob.x_cache(), bob.body.as_str()), ("MISS", "page of Bearer bob"));
    let anonymous = rig.get("/account", &[]).await;
    assert_eq!(anonymous.body, "page of nobody");
    assert_eq!(rig.origin.requests(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorized_response_is_shared_when_public_s_maxage_or_must_revalidate_allow_it() {
    for allows in ["public, max-age=300", "s-maxage=300", "must-revalidate, max-age=300"] {
        let n = origin_requests_for_two_gets(&[("cache-control", allows)], &[("authorization", "Bearer a")]).await;
        assert_eq!(n, 1, "{allows}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_cookie_responses_are_stored_only_when_explicitly_shareable() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=300"), ("set-cookie", "s=1")], &[]).await, 2);
    let public = [("cache-control", "public, max-age=300"), ("set-cookie", "s=1")];
    assert_eq!(origin_requests_for_two_gets(&public, &[]).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_content_is_not_stored_and_a_201_is_not_heuristically_fresh() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::with(201, &[("last-modified", "Mon, 02 Nov 2020 10:00:00 GMT")], "made"));
    rig.get("/c", &[]).await;
    assert_eq!(rig.get("/c", &[]).await.x_cache(), "MISS");
    rig.origin.always(Reply::with(206, &[("cache-control", "max-age=300"), ("content-range", "bytes 0-0/9")], "p"));
    rig.get("/p", &[]).await;
    assert_eq!(rig.get("/p", &[]).await.x_cache(), "MISS");
    assert_eq!(rig.origin.requests(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_cacheable_by_default_are_stored_with_explicit_freshness() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::with(404, &[("cache-control", "max-age=300")], "gone"));
    rig.get("/missing", &[]).await;
    let hit = rig.get("/missing", &[]).await;
    assert_eq!((hit.status, hit.x_cache(), hit.body.as_str()), (StatusCode::NOT_FOUND, "HIT", "gone"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_redirect_with_freshness_is_stored() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::with(301, &[("location", "/new"), ("cache-control", "max-age=300")], ""));
    rig.get("/old", &[]).await;
    let hit = rig.get("/old", &[]).await;
    assert_eq!(
        (hit.status, hit.x_cache(), hit.field("location")),
        (StatusCode::MOVED_PERMANENTLY, "HIT", Some("/new"))
    );
}
