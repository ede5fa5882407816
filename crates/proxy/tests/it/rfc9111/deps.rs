//! Responses with dependencies (`X-Tierstack-Deps`): validated by version
//! whatever their freshness, under the same storage rules; coalescing never
//! crosses credentials or variants; `ttl` mode.

use super::support::*;
use http_body_util::BodyExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tierstack_proxy::{CacheMode, ProxyStats};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_dependencies_is_revalidated_by_version_whatever_its_freshness() {
    let rig = Rig::new().await;
    deps_origin(&rig, &[("cache-control", "max-age=3600, stale-while-revalidate=3600"), ("etag", "\"e\"")]);
    rig.get("/doc/a", &[]).await;
    let hit = rig.get("/doc/a", &[]).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert_eq!(hit.field("etag"), Some("\"e\""), "whole responses with dependencies too");
    rig.bump("doc/a");
    let after = rig.get("/doc/a", &[]).await;
    assert_eq!(after.x_cache(), "MISS", "no TTL or stale-while-revalidate applies");
    assert!(after.body.starts_with(&rig.deps("doc/a")), "{after:?}");
    let stats = rig.stats().await;
    assert_eq!((stats.stale_dropped, stats.stale_served), (1, 0));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_no_store_and_authorization_apply_to_responses_with_dependencies() {
    for (fields, request) in [
        (&[("cache-control", "private")][..], &[][..]),
        (&[("cache-control", "no-store")][..], &[][..]),
        (&[][..], &[("authorization", "Bearer a")][..]),
    ] {
        let rig = Rig::new().await;
        let fields: &'static [(&'static str, &'static str)] = Box::leak(fields.to_vec().into_boxed_slice());
        deps_origin(&rig, fields);
        rig.get("/doc/a", request).await;
        assert_eq!(rig.get("/doc/a", request).await.x_cache(), "MISS", "{fields:?} {request:?}");
        assert_eq!(rig.stats().await.cached_entries, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_applies_to_responses_with_dependencies() {
    let rig = Rig::new().await;
    deps_origin(&rig, &[("vary", "Cookie")]);
    rig.get("/doc/a", &[("cookie", "u=1")]).await;
    let other = rig.get("/doc/a", &[("cookie", "u=2")]).await;
    assert_eq!(other.x_cache(), "MISS");
    assert!(other.body.ends_with("u=2"), "{other:?}");
    let first = rig.get("/doc/a", &[("cookie", "u=1")]).await;
    assert_eq!(first.x_cache(), "HIT");
    assert!(first.body.ends_with("u=1"));
}

/// A leader's fetch held at the origin, then a second request; true if the
/// second waited on the leader's fetch rather than making its own.
async fn shares_the_fetch(
    rig: &Arc<Rig>,
    leader: &'static [(&'static str, &'static str)],
    second: &'static [(&'static str, &'static str)],
) -> (Got, Got, usize) {
    rig.origin.hold.store(true, Ordering::SeqCst);
    let before = rig.origin.requests();
    let r = rig.clone();
    let first = tokio::spawn(async move { r.get("/doc/a", leader).await });
    wait_for("the leader's fetch reaches the origin", || rig.origin.requests() == before + 1).await;
    let r = rig.clone();
    let waiter = tokio::spawn(async move { r.get("/doc/a", second).await });
    // Either it waits on the leader (the gauge) or it reaches the origin.
    let admin = rig.admin;
    let client = rig.client.clone();
    let mut waiting = false;
    for _ in 0..5000 {
        if rig.origin.requests() == before + 2 {
            break;
        }
        let uri = format!("http://{admin}/_tierstack/stats").parse().unwrap();
        let body = client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        let stats: ProxyStats = serde_json::from_slice(&body).unwrap();
        if stats.waiting_on_fetch == 1 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    rig.origin.release();
    let (first, second) = (first.await.unwrap(), waiter.await.unwrap());
    let _ = waiting;
    (first, second, rig.origin.requests() - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_fetch_is_never_handed_across_credentials_or_varied_fields() {
    let rig = Arc::new(Rig::new().await);
    deps_origin(&rig, &[("cache-control", "public"), ("vary", "Cookie")]);
    // Same cookie: shared (one origin request), served after its own check.
    let (_, second, fetches) = shares_the_fetch(&rig, &[("cookie", "u=1")], &[("cookie", "u=1")]).await;
    assert_eq!((fetches, second.field("x-cache-coalesced")), (1, Some("1")));
    rig.bump("doc/a");
    // Another cookie: the varied field differs.
    let (first, second, _) = shares_the_fetch(&rig, &[("cookie", "u=1")], &[("cookie", "u=2")]).await;
    assert!(first.body.ends_with("u=1") && second.body.ends_with("u=2"), "{first:?} {second:?}");
    assert!(second.field("x-cache-coalesced").is_none());
    rig.bump("doc/a");
    // Other credentials never even join the flight.
    let (first, second, fetches) = shares_the_fetch(
        &rig,
        &[("cookie", "u=1"), ("authorization", "Bearer a")],
        &[("cookie", "u=1"), ("authorization", "Bearer b")],
    )
    .await;
    assert_eq!(fetches, 2);
    assert!(first.body.ends_with("Bearer a") && second.body.ends_with("Bearer b"), "{first:?} {second:?}");
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_mode_still_follows_rfc_9111_for_responses_without_dependencies() {
    let rig = Rig::with_mode(CacheMode::Ttl).await;
    rig.origin.always(Reply::ok(&[("cache-control", "private, max-age=300")], "x"));
    rig.get("/t", &[]).await;
    assert_eq!(rig.get("/t", &[]).await.x_cache(), "MISS");
}
