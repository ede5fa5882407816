//! The receiving end of a push: `PUT /_tierstack/push/doc/<name>` from the
//! application tier (see the crate docs for the answers).
//!
//! Order of checks, cheapest first: method, caching on, header present and
//! parsable, the header names the pushed document's key, body within bounds
//! and small enough to cache; then the push counts as received (and for the
//! wasted-update metric); then "is a copy at least as new cached already?"
//! (no fabric operation), then, in `poll` mode, one version read — a
//! superseded push would only evict a useful entry for a copy no hit could
//! ever serve; then the insert (which keeps a newer copy cached meanwhile).
//!
//! **What the header must name.** The proxy caches `/doc/<name>` under its
//! path and knows keys only from headers; the documents' convention (the
//! reference application server's, and the push path's) is that
//! `/doc/<name>` depends on the key `doc/<name>`. A push for `/doc/<name>`
//! must list `doc/<name>` among its dependencies, or it is refused (400):
//! otherwise a push carrying another document's current header would
//! install a page whose validation says nothing about the page itself (an
//! update of `doc/<name>` would not invalidate it). The header may list
//! further keys; those are validated like any other.

use crate::cache::{Entry, InsertOutcome};
use crate::state::State;
use crate::CacheMode;
use http_body_util::BodyExt;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tierstack_coherent::{DepsHeader, DEPS_HEADER};
use tierstack_pushpull::fingerprint;
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{text, Body};

/// The dependency key the document cached under `path` (`/doc/<name>`)
/// must name.
fn document_key(path: &str) -> Option<&str> {
    path.strip_prefix('/').filter(|key| key.starts_with("doc/"))
}

/// True if `cached` was generated at versions no older than `pushed`'s:
/// same module run, and every pushed key present at a version ≥ the pushed one.
fn at_least_as_new(cached: &DepsHeader, pushed: &DepsHeader) -> bool {
    cached.node == pushed.node
        && cached.incarnation == pushed.incarnation
        && pushed.deps.iter().all(|p| cached.deps.iter().any(|c| c.key == p.key && c.version >= p.version))
}

/// Receives a push of the document at `path` (`/doc/<name>`), cached
/// under the proxy's default authority.
pub(crate) async fn receive(state: &State, request: Request<RequestBody>, path: String) -> Response<Body> {
    let refuse = |status: StatusCode, why: String| {
        state.counters.pushes_refused.fetch_add(1, Ordering::Relaxed);
        text(status, why)
    };
    if request.method() != Method::PUT {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "pushes use PUT\n".into());
    }
    if path.len() <= "/doc/".len() || path["/doc/".len()..].contains('/') {
        return refuse(StatusCode::BAD_REQUEST, "a push names one document: /_tierstack/push/doc/<name>\n".into());
    }
    if state.mode == CacheMode::NoCache {
        return refuse(StatusCode::CONFLICT, "this proxy does not cache\n".into());
    }
    let raw = request.headers().get(DEPS_HEADER).cloned();
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    let Some(raw) = raw else {
        return refuse(StatusCode::BAD_REQUEST, "a push needs X-Tierstack-Deps\n".into());
    };
    let deps =
        match raw.to_str().map_err(|e| e.to_string()).and_then(|s| DepsHeader::parse(s).map_err(|e| e.to_string())) {
            Ok(deps) => deps,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("malformed X-Tierstack-Deps: {e}\n")),
        };
    let Some(document_key) = document_key(&path) else {
        return refuse(StatusCode::BAD_REQUEST, format!("{path} is not a document\n"));
    };
    if !deps.deps.iter().any(|dep| dep.key == document_key) {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("X-Tierstack-Deps does not name {document_key}, the key of the pushed document {path}\n"),
        );
    }
    // A body larger than the cache's largest object could never be stored:
    // refused on its declared length before it is read, else read at most
    // that far.
    let too_large = || refuse(StatusCode::INSUFFICIENT_STORAGE, "too large for this proxy's cache\n".into());
    if usize::try_from(hyper::body::Body::size_hint(request.body()).lower())
        .map_or(true, |declared| declared > state.object_bytes_max)
    {
        return too_large();
    }
    let body = match http_body_util::Limited::new(request.into_body(), state.object_bytes_max).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => return too_large(),
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("push body: {e}\n")),
    };
    let bytes = body.len() as u64;
    let entry = Entry::pushed(body, content_type, raw, deps);
    let key = format!("{}{path}", state.default_authority);
    if !state.cache.lock().is_ok_and(|cache| cache.admits(&entry)) {
        return refuse(StatusCode::INSUFFICIENT_STORAGE, "too large for this proxy's cache\n".into());
    }
    // From here on every push ends installed, redundant or stale.
    state.counters.pushes_received.fetch_add(1, Ordering::Relaxed);
    let existing = match state.cache.lock() {
        Ok(mut cache) => {
            cache.waste.on_push(fingerprint(&path));
            cache.peek(&key)
        }
        Err(_) => None,
    };
    let redundant = || {
        state.counters.pushes_redundant.fetch_add(1, Ordering::Relaxed);
        text(StatusCode::OK, "a copy at least as new is cached\n")
    };
    let stale = |status: StatusCode, why: String| {
        state.counters.pushes_stale.fetch_add(1, Ordering::Relaxed);
        text(status, why)
    };
    if existing.is_some_and(|e| {
        e.deps.as_ref().is_some_and(|cached| entry.deps.as_ref().is_some_and(|pushed| at_least_as_new(cached, pushed)))
    }) {
        return redundant();
    }
    if state.mode == CacheMode::Poll {
        // `bind` gives every poll-mode proxy a checker.
        let Some(checker) = &state.checker else {
            return stale(StatusCode::SERVICE_UNAVAILABLE, "this proxy cannot check versions\n".into());
        };
        // Not a request-path check: counted as pushes, not in `checks`.
        let Some(deps) = &entry.deps else {
            return stale(StatusCode::SERVICE_UNAVAILABLE, "a push without dependencies\n".into());
        };
        match checker.is_current(deps).await {
            Ok(true) => {}
            Ok(false) => return stale(StatusCode::CONFLICT, "superseded by a newer update\n".into()),
            Err(e) => return stale(StatusCode::SERVICE_UNAVAILABLE, format!("cannot check the versions: {e}\n")),
        }
    }
    match state.cache_store(&key, Arc::new(entry)) {
        Some(InsertOutcome::Stored) => {}
        // A newer copy was cached while the versions were being read.
        Some(InsertOutcome::KeptNewer) => return redundant(),
        Some(InsertOutcome::TooLarge) | None => {
            return stale(StatusCode::SERVICE_UNAVAILABLE, "the cache could not take the push\n".into())
        }
    }
    state.counters.pushes_installed.fetch_add(1, Ordering::Relaxed);
    state.counters.push_bytes.fetch_add(bytes, Ordering::Relaxed);
    let mut response = Response::new(Body::default());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Setup;
    use tierstack_coherent::{Dep, Incarnation};
    use tierstack_fabric::{Fabric, NodeId};
    use tierstack_pushpull::CacheStateReader;

    fn header(incarnation: u64, deps: &[(&str, u64)]) -> DepsHeader {
        DepsHeader {
            node: NodeId(0),
            incarnation: Incarnation(incarnation),
            deps: deps.iter().map(|(k, v)| Dep { key: k.to_string(), version: *v, slot: 0 }).collect(),
        }
    }

    #[test]
    fn newer_or_equal_copies_make_a_push_redundant() {
        let pushed = header(1, &[("doc/a", 5)]);
        assert!(at_least_as_new(&header(1, &[("doc/a", 5)]), &pushed));
        assert!(at_least_as_new(&header(1, &[("doc/a", 6), ("doc/b", 1)]), &pushed));
        assert!(!at_least_as_new(&header(1, &[("doc/a", 4)]), &pushed));
        assert!(!at_least_as_new(&header(2, &[("doc/a", 9)]), &pushed), "another module run");
        assert!(!at_least_as_new(&header(1, &[("doc/b", 9)]), &pushed), "another key");
    }

    #[tokio::test]
    async fn the_client_listener_refuses_pushes_and_stats() {
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        assert_eq!(s.get("a").await.0, "MISS");
        s.bump("a");
        // A client that read the current versions from a response header
        // must not be able to install a forged page for everyone.
        let deps = s.deps("a");
        assert_eq!(s.push_to(s.proxy, "a", Some(&deps), "forged").await, StatusCode::NOT_FOUND);
        let uri = format!("http://{}/_tierstack/stats", s.proxy).parse().unwrap();
        assert_eq!(s.client.get(uri).await.unwrap().status(), StatusCode::NOT_FOUND);
        let (_, body) = s.get("a").await;
        assert!(!body.contains("forged"), "{body}");
        assert_eq!(s.stats().await.pushes_received, 0);
        let uri = format!("http://{}/doc/a", s.admin).parse().unwrap();
        assert_eq!(s.client.get(uri).await.unwrap().status(), StatusCode::NOT_FOUND, "the admin port serves no pages");
    }

    /// With an admin token, a push or purge without it or with another is
    /// 401 and changes nothing (the forged page is never served); with it,
    /// both work.
    #[tokio::test]
    async fn pushes_and_purges_need_the_admin_token() {
        let token = "the-admin-token";
        let options = crate::ProxyOptions {
            admin_token: Some(tierstack_secret::Secret::new(token.as_bytes().to_vec())),
            ..crate::ProxyOptions::default()
        };
        let s = Setup::with_options(CacheMode::Poll, 1 << 20, options).await;
        assert_eq!(s.get("a").await.0, "MISS");
        s.bump("a");
        let deps = s.deps("a");
        let push_path = format!("{}a", crate::PUSH_PATH_PREFIX);
        let bearer = format!("Bearer {token}");
        for (authorization, case) in [(None, "no token"), (Some("Bearer not-the-token"), "a wrong token")] {
            let pushed = s.admin_request(s.admin, Method::PUT, &push_path, Some(&deps), "forged", authorization).await;
            assert_eq!(pushed, (StatusCode::UNAUTHORIZED, true), "a push with {case}");
        }
        let (cache, body) = s.get("a").await;
        assert_eq!(cache, "MISS");
        assert!(!body.contains("forged"), "a refused push was served: {body}");
        assert_eq!(s.stats().await.pushes_received, 0, "a refused push reached the push path");
        // A refused purge leaves the entry; an authorized one drops it.
        assert_eq!(s.get("a").await.0, "HIT");
        let purge = format!("/_tierstack/purge/{}/doc/a", s.state.default_authority);
        let purged = s.admin_request(s.admin, Method::DELETE, &purge, None, "", None).await;
        assert_eq!(purged, (StatusCode::UNAUTHORIZED, true));
        assert_eq!(s.get("a").await.0, "HIT", "a refused purge dropped the entry");
        let purged = s.admin_request(s.admin, Method::DELETE, &purge, None, "", Some(&bearer)).await;
        assert_eq!(purged.0, StatusCode::OK);
        s.bump("a");
        let deps = s.deps("a");
        let pushed = s.admin_request(s.admin, Method::PUT, &push_path, Some(&deps), "pushed", Some(&bearer)).await;
        assert_eq!(pushed.0, StatusCode::NO_CONTENT);
        assert_eq!(s.get("a").await, ("HIT".to_string(), "pushed".to_string()));
        // Reads stay open.
        let uri = format!("http://{}/_tierstack/stats", s.admin).parse().unwrap();
        assert_eq!(s.client.get(uri).await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_current_push_is_installed_and_served_as_a_validated_hit() {
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        assert_eq!(s.get("a").await.0, "MISS");
        s.bump("a");
        let deps = s.deps("a");
        assert_eq!(s.push("a", Some(&deps), "pushed a v2").await, StatusCode::NO_CONTENT);
        assert_eq!(s.get("a").await, ("HIT".to_string(), "pushed a v2".to_string()));
        // A newer update invalidates the pushed copy like any other.
        s.bump("a");
        let (cache, body) = s.get("a").await;
        assert_eq!(cache, "MISS", "a pushed copy is validated on every hit");
        assert!(body.contains("doc/a=3@"), "{body}");
        let stats = s.stats().await;
        assert_eq!((stats.pushes_received, stats.pushes_installed, stats.push_hits), (1, 1, 1));
        assert_eq!(stats.push_bytes, "pushed a v2".len() as u64);
        assert_eq!(stats.stale_dropped, 1);
    }

    #[tokio::test]
    async fn malformed_superseded_and_redundant_pushes_are_not_installed() {
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        assert_eq!(s.push("a", None, "x").await, StatusCode::BAD_REQUEST);
        let deps = s.deps("a");
        assert_eq!(s.push("", Some(&deps), "x").await, StatusCode::BAD_REQUEST, "no document named");
        assert_eq!(s.push("a/b", Some(&deps), "x").await, StatusCode::BAD_REQUEST, "not one document");
        assert_eq!(s.push("a", Some("n=0;garbage"), "x").await, StatusCode::BAD_REQUEST);
        let old = s.deps("a");
        s.bump("a");
        assert_eq!(s.push("a", Some(&old), "old").await, StatusCode::CONFLICT, "superseded on arrival");
        assert_eq!(s.get("a").await.0, "MISS", "nothing was installed");
        // The cache now holds version 2; a push of version 2 (or older) is redundant.
        let current = s.deps("a");
        assert_eq!(s.push("a", Some(&current), "same").await, StatusCode::OK);
        assert_eq!(s.push("a", Some(&old), "older").await, StatusCode::OK);
        let (cache, body) = s.get("a").await;
        assert_eq!(cache, "HIT");
        assert!(body.starts_with("origin"), "the fetched copy was kept: {body}");
        let stats = s.stats().await;
        assert_eq!(stats.pushes_refused, 4);
        assert_eq!(stats.pushes_stale, 1);
        assert_eq!(stats.pushes_redundant, 2);
        assert_eq!(stats.pushes_installed, 0);
        assert_eq!(stats.pushes_received, 3);
    }

    #[tokio::test]
    async fn wasted_updates_follow_the_papers_definition() {
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        let push_next = |s: &Setup| {
            s.bump("a");
            s.deps("a")
        };
        for _ in 0..3 {
            let deps = push_next(&s);
            assert_eq!(s.push("a", Some(&deps), "v").await, StatusCode::NO_CONTENT);
        }
        assert_eq!(s.stats().await.wasted_updates, 2, "three pushes, no request: two wasted");
        s.get("a").await;
        let deps = push_next(&s);
        s.push("a", Some(&deps), "v").await;
        s.get("a").await;
        let deps = push_next(&s);
        s.push("a", Some(&deps), "v").await;
        assert_eq!(s.stats().await.wasted_updates, 2, "a request between pushes: nothing wasted");
    }

    #[tokio::test]
    async fn pushes_that_do_not_fit_or_find_no_cache_are_refused() {
        let s = Setup::new(CacheMode::Poll, 800).await;
        let deps = s.deps("a");
        assert_eq!(s.push("a", Some(&deps), &"x".repeat(200)).await, StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(s.stats().await.pushes_refused, 1);
        let s = Setup::new(CacheMode::NoCache, 1 << 20).await;
        let deps = s.deps("a");
        assert_eq!(s.push("a", Some(&deps), "x").await, StatusCode::CONFLICT);
        assert_eq!(s.stats().await.pushes_refused, 1);
    }

    /// A push whose declared length is over the cache's largest object is
    /// refused at once, without reading (or waiting for) its body.
    #[tokio::test]
    async fn a_push_declared_larger_than_any_object_is_refused_before_its_body() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        let deps = s.deps("a");
        let mut stream = tokio::net::TcpStream::connect(s.admin).await.unwrap();
        let head = format!(
            "PUT /_tierstack/push/doc/a HTTP/1.1\r\nhost: proxy\r\nx-tierstack-deps: {deps}\r\ncontent-length: {}\r\n\r\nonly this",
            50 << 20
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 64];
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut answer)).await;
        let read = read.expect("answered without the 50 MiB body").unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 507"), "{answer}");
        assert_eq!(s.stats().await.pushes_refused, 1);
    }

    #[tokio::test]
    async fn the_cache_state_tracks_requests_and_residency_through_evictions() {
        // Whole responses (body and fields) of about 240 bytes in 2000:
        // about 8 fit, so 10 documents evict.
        let s = Setup::new(CacheMode::Poll, 8 * 250).await;
        let names: Vec<String> = (0..10).map(|i| format!("d{i}")).collect();
        s.get(&names[0]).await;
        for name in &names {
            s.get(name).await;
        }
        let fabric: Arc<dyn Fabric> = s.module_fabric.clone();
        let reader = CacheStateReader::new(fabric);
        let state = reader.read(NodeId(1)).await.unwrap();
        let entry = |name: &str| *state.entry(fingerprint(&format!("/doc/{name}"))).unwrap();
        assert_eq!(state.entries.len(), 10);
        assert_eq!(entry("d0").access_count, 2);
        assert_eq!(entry("d5").access_count, 1);
        assert_eq!(state.recency_rank(fingerprint("/doc/d9")), Some(0));
        assert_eq!(state.recency_rank(fingerprint("/doc/d1")), Some(8));
        let stats = s.stats().await;
        assert!(stats.evictions >= 2, "{stats:?}");
        assert_eq!(stats.cache_state_slots, u64::from(tierstack_pushpull::SLOTS_DEFAULT));
        let resident: Vec<bool> = names.iter().map(|n| entry(n).resident).collect();
        assert_eq!(resident.iter().filter(|r| **r).count() as u64, stats.cached_entries, "{resident:?}");
        assert_eq!(resident.iter().filter(|r| !**r).count() as u64, stats.evictions, "{resident:?}");
        assert!(resident[9] && !resident[0], "the oldest went first: {resident:?}");
    }
}
