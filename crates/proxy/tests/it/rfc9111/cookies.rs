//! `--set-cookie` (RFC 9111 §7.3): whether a response with `Set-Cookie` is
//! stored, and that a stored copy hands one client's cookie to another
//! only under `store`, the operator's explicit choice.

use super::support::*;
use tierstack_proxy::{CacheMode, ProxyOptions, SetCookie};

/// A rig whose origin answers every GET with `fields`, a fresh cookie per
/// request (`id=<n>`), under `policy`.
async fn rig(policy: SetCookie, fields: &'static [(&'static str, &'static str)]) -> Rig {
    let rig = Rig::with_options(CacheMode::Poll, ProxyOptions { set_cookie: policy, ..ProxyOptions::default() }).await;
    rig.origin.answer(move |_, n| {
        let cookie = format!("id={n}");
        let mut all = fields.to_vec();
        all.push(("set-cookie", &cookie));
        Reply::ok(&all, "page")
    });
    rig
}

/// (the miss's cookie, the second answer's X-Cache and cookie, origin requests).
async fn two_gets(rig: &Rig) -> (Option<String>, String, Option<String>, usize) {
    let first = rig.get("/c", &[]).await;
    let second = rig.get("/c", &[]).await;
    let cookie = |got: &Got| got.field("set-cookie").map(str::to_string);
    (cookie(&first), second.x_cache().to_string(), cookie(&second), rig.origin.requests())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_set_cookie_policy_stores_and_replays_as_documented() {
    const PUBLIC: &[(&str, &str)] = &[("cache-control", "public, max-age=300")];
    const FRESH: &[(&str, &str)] = &[("cache-control", "max-age=300")];
    let id0 = Some("id=0".to_string());
    let (miss, hit) = ("MISS".to_string(), "HIT".to_string());
    for (policy, fields, expected) in [
        (SetCookie::IfPublic, PUBLIC, (id0.clone(), hit.clone(), None, 1)),
        (SetCookie::IfPublic, FRESH, (id0.clone(), miss.clone(), Some("id=1".into()), 2)),
        (SetCookie::Never, PUBLIC, (id0.clone(), miss.clone(), Some("id=1".into()), 2)),
        (SetCookie::Strip, FRESH, (id0.clone(), hit.clone(), None, 1)),
        (SetCookie::Store, FRESH, (id0.clone(), hit.clone(), id0.clone(), 1)),
    ] {
        assert_eq!(two_gets(&rig(policy, fields).await).await, expected, "{policy:?} {fields:?}");
    }
}

/// A 304's cookie goes to the client whose request was revalidated, and
/// not into the stored copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304s_cookie_reaches_its_client_only() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(_) => {
            Reply::with(304, &[("etag", "\"v\""), ("cache-control", "public, max-age=300"), ("set-cookie", "id=2")], "")
        }
        None => Reply::ok(&[("etag", "\"v\""), ("cache-control", "public, max-age=0"), ("set-cookie", "id=1")], "p"),
    });
    assert_eq!(rig.get("/r", &[]).await.field("set-cookie"), Some("id=1"));
    let revalidated = rig.get("/r", &[]).await;
    assert_eq!((revalidated.body.as_str(), revalidated.field("set-cookie")), ("p", Some("id=2")));
    let hit = rig.get("/r", &[]).await;
    assert_eq!((hit.x_cache(), hit.field("set-cookie")), ("HIT", None));
    assert_eq!(rig.origin.requests(), 2);
}
