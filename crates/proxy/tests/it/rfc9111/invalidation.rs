//! Invalidation (§4.4): unsafe methods drop the target and same-origin
//! `Location` / `Content-Location`.

use super::support::*;
use hyper::Method;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_unsafe_method_invalidates_the_target() {
    for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
        let rig = Rig::new().await;
        rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "x"));
        rig.get("/i", &[]).await;
        assert_eq!(rig.get("/i", &[]).await.x_cache(), "HIT");
        rig.send(method.clone(), "/i", &[]).await;
        assert_eq!(rig.get("/i", &[]).await.x_cache(), "MISS", "{method}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_method_with_an_error_response_does_not_invalidate() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.method {
        Method::GET => Reply::ok(&[("cache-control", "max-age=300")], "x"),
        _ => Reply::with(500, &[], "failed"),
    });
    rig.get("/i", &[]).await;
    rig.send(Method::POST, "/i", &[]).await;
    assert_eq!(rig.get("/i", &[]).await.x_cache(), "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn location_and_content_location_of_the_same_origin_are_invalidated() {
    let rig = Rig::new().await;
    let proxy = rig.proxy;
    rig.origin.answer(move |seen, _| match seen.method {
        Method::GET => Reply::ok(&[("cache-control", "max-age=300")], "x"),
        _ => Reply::with(
            201,
            &[
                ("location", "/created"),
                ("content-location", &format!("http://{proxy}/described")),
                ("x-ignored", "http://elsewhere.example/other"),
            ],
            "",
        ),
    });
    for target in ["/created", "/described", "/other"] {
        rig.get(target, &[]).await;
    }
    rig.send(Method::POST, "/form", &[]).await;
    assert_eq!(rig.get("/created", &[]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/described", &[]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/other", &[]).await.x_cache(), "HIT");
    // Another origin's Location is left alone.
    rig.origin.answer(|seen, _| match seen.method {
        Method::GET => Reply::ok(&[("cache-control", "max-age=300")], "x"),
        _ => Reply::with(201, &[("location", "http://elsewhere.example/created")], ""),
    });
    rig.send(Method::POST, "/form", &[]).await;
    assert_eq!(rig.get("/created", &[]).await.x_cache(), "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_method_invalidates_every_variant() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.method {
        Method::GET => Reply::ok(&[("cache-control", "max-age=300"), ("vary", "accept-language")], "x"),
        _ => Reply::with(204, &[], ""),
    });
    for lang in ["en", "fr"] {
        rig.get("/v", &[("accept-language", lang)]).await;
        assert_eq!(rig.get("/v", &[("accept-language", lang)]).await.x_cache(), "HIT");
    }
    rig.send(Method::PUT, "/v", &[]).await;
    for lang in ["en", "fr"] {
        assert_eq!(rig.get("/v", &[("accept-language", lang)]).await.x_cache(), "MISS", "{lang}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_is_neither_cached_nor_invalidating() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "x"));
    rig.get("/p", &[]).await;
    for _ in 0..2 {
        assert_eq!(rig.send(Method::OPTIONS, "/p", &[]).await.x_cache(), "MISS");
    }
    assert_eq!(rig.get("/p", &[]).await.x_cache(), "HIT");
    assert_eq!(rig.origin.requests(), 3);
}
