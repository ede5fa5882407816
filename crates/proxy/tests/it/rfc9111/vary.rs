//! Vary (§4.1): one stored variant per value of the varied fields.

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_keeps_one_variant_per_value_of_the_varied_field() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| {
        let lang = seen.headers.get("accept-language").map_or("none".into(), |v| v.to_str().unwrap().to_string());
        Reply::ok(&[("cache-control", "max-age=300"), ("vary", "Accept-Language")], &lang)
    });
    for lang in ["en", "fr"] {
        assert_eq!(rig.get("/v", &[("accept-language", lang)]).await.x_cache(), "MISS");
    }
    for lang in ["en", "fr"] {
        let got = rig.get("/v", &[("accept-language", lang)]).await;
        assert_eq!((got.x_cache(), got.body.as_str()), ("HIT", lang));
    }
    let none = rig.get("/v", &[]).await;
    assert_eq!((none.x_cache(), none.body.as_str()), ("MISS", "none"), "absent is its own variant");
    assert_eq!(rig.origin.requests(), 3);
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_cookie_separates_users() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| {
        let cookie = seen.headers.get("cookie").map_or("".into(), |v| v.to_str().unwrap().to_string());
        Reply::ok(&[("cache-control", "public, max-age=300"), ("vary", "Cookie")], &format!("hello {cookie}"))
    });
    rig.get("/me", &[("cookie", "user=alice")]).await;
    let bob = rig.get("/me", &[("cookie", "user=bob")]).await;
    assert_eq!((bob.x_cache(), bob.body.as_str()), ("MISS", "hello user=bob"));
    let alice = rig.get("/me", &[("cookie", "user=alice")]).await;
    assert_eq!((alice.x_cache(), alice.body.as_str()), ("HIT", "hello user=alice"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_star_never_matches() {
    assert_eq!(origin_requests_for_two_gets(&[("cache-control", "max-age=300"), ("vary", "*")], &[]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_on_two_fields_needs_both_to_match() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| {
        let v = |n: &str| seen.headers.get(n).map_or("-".to_string(), |v| v.to_str().unwrap().to_string());
        let body = format!("{} {}", v("accept-language"), v("accept-encoding"));
        Reply::ok(&[("cache-control", "max-age=300"), ("vary", "Accept-Language"), ("vary", "Accept-Encoding")], &body)
    });
    rig.get("/v", &[("accept-language", "en"), ("accept-encoding", "gzip")]).await;
    let other = rig.get("/v", &[("accept-language", "en"), ("accept-encoding", "br")]).await;
    assert_eq!((other.x_cache(), other.body.as_str()), ("MISS", "en br"));
    let same = rig.get("/v", &[("accept-encoding", "gzip"), ("accept-language", "en")]).await;
    assert_eq!((same.x_cache(), same.body.as_str()), ("HIT", "en gzip"));
}
