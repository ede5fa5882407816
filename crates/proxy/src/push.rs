//! The receiving end of a push: `PUT /_tierstack/push/doc/<name>` from the
//! application tier (see the crate docs for the answers).
//!
//! Order of checks, cheapest first: method, caching on, header present and
//! parsable, body within bounds; then the push counts as received (and for
//! the wasted-update metric); then "is a copy at least as new cached
//! already?" (no fabric operation), then, in `poll` mode, one version read —
//! a superseded push would only evict a useful entry for a copy no hit could
//! ever serve; then the insert.

use crate::cache::Entry;
use crate::{CacheMode, State, RESPONSE_BODY_BYTES_MAX};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tierstack_coherent::{DepsHeader, DEPS_HEADER};
use tierstack_pushpull::fingerprint;
use tierstack_tier_http::{collect_limited, text, Body};

/// True if `cached` was generated at versions no older than `pushed`'s:
/// same module run, and every pushed key present at a version ≥ the pushed one.
fn at_least_as_new(cached: &DepsHeader, pushed: &DepsHeader) -> bool {
    cached.node == pushed.node
        && cached.incarnation == pushed.incarnation
        && pushed.deps.iter().all(|p| cached.deps.iter().any(|c| c.key == p.key && c.version >= p.version))
}

pub(crate) async fn receive(state: &State, request: Request<Incoming>, key: String) -> Response<Body> {
    let refuse = |status: StatusCode, why: String| {
        state.counters.pushes_refused.fetch_add(1, Ordering::Relaxed);
        text(status, why)
    };
    if request.method() != Method::PUT {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "pushes use PUT\n".into());
    }
    if key.len() <= "/doc/".len() || key["/doc/".len()..].contains('/') {
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
    let body = match collect_limited(request.into_body(), RESPONSE_BODY_BYTES_MAX).await {
        Ok(body) => body,
        Err(e) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("push body: {e}\n")),
    };
    state.counters.pushes_received.fetch_add(1, Ordering::Relaxed);
    let existing = match state.cache.lock() {
        Ok(mut cache) => {
            cache.waste.on_push(fingerprint(&key));
            cache.peek(&key)
        }
        Err(_) => None,
    };
    if existing.is_some_and(|e| at_least_as_new(&e.deps, &deps)) {
        state.counters.pushes_redundant.fetch_add(1, Ordering::Relaxed);
        return text(StatusCode::OK, "a copy at least as new is cached\n");
    }
    if state.mode == CacheMode::Poll {
        let Some(checker) = &state.checker else {
            return refuse(StatusCode::CONFLICT, "this proxy cannot check versions\n".into());
        };
        match checker.is_current(&deps).await {
            Ok(true) => {}
            Ok(false) => {
                state.counters.pushes_stale.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::CONFLICT, "superseded by a newer update\n");
            }
            Err(e) => {
                state.counters.pushes_stale.fetch_add(1, Ordering::Relaxed);
                state.counters.check_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::SERVICE_UNAVAILABLE, format!("cannot check the versions: {e}\n"));
            }
        }
    }
    let bytes = body.len() as u64;
    let entry = Entry { body, content_type, deps_raw: raw, deps, pushed: true };
    if !state.cache_store(&key, Arc::new(entry)) {
        return refuse(StatusCode::INSUFFICIENT_STORAGE, "too large for this proxy's cache\n".into());
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
    use crate::{Proxy, ProxyConfig, ProxyStats};
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use std::net::SocketAddr;
    use std::time::Duration;
    use tierstack_coherent::version_table::VersionTable;
    use tierstack_coherent::{Dep, Incarnation};
    use tierstack_fabric::{Fabric, NodeId};
    use tierstack_fabric_shm::{ShmConfig, ShmFabric};
    use tierstack_pushpull::CacheStateReader;
    use tierstack_tier_http::{serve, Stop};

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

    /// A proxy (node 1) in front of an origin that answers `/doc/<name>`
    /// with the version table's current header (node 0), all in-process on shm.
    struct Setup {
        _dir: tempfile::TempDir,
        module_fabric: Arc<ShmFabric>,
        table: Arc<VersionTable>,
        proxy: SocketAddr,
        /// The proxy's admin listener: pushes and stats.
        admin: SocketAddr,
        client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    }

    use bytes::Bytes;
    use http_body_util::Full;

    impl Setup {
        async fn new(mode: CacheMode, cache_bytes: usize) -> Setup {
            let dir = tempfile::tempdir().unwrap();
            let module_fabric = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0))).unwrap();
            let table = Arc::new(VersionTable::create(module_fabric.as_ref(), 16, Incarnation(7)).unwrap());
            let proxy_fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(1))).unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let origin = listener.local_addr().unwrap();
            let origin_table = table.clone();
            let handler = Arc::new(move |request: Request<Incoming>| {
                let name = request.uri().path().trim_start_matches("/doc/").to_string();
                let key = format!("doc/{name}");
                let slot = origin_table.slot_of(&key).unwrap();
                let deps = origin_table.header(&[(key, slot)]).unwrap().to_string();
                let mut response = text(StatusCode::OK, format!("origin {deps}"));
                response.headers_mut().insert(DEPS_HEADER, deps.parse().unwrap());
                async move { response }
            });
            tokio::spawn(serve(listener, handler, Stop::new()));
            let proxy = Proxy::bind(ProxyConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                upstreams: vec![format!("http://{origin}")],
                mode,
                cache_bytes,
                upstream_timeout: Duration::from_secs(5),
                fabric: Some(proxy_fabric),
                admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            })
            .await
            .unwrap();
            let addr = proxy.local_addr().unwrap();
            let admin = proxy.admin_addr().unwrap();
            tokio::spawn(proxy.run(Stop::new()));
            Setup {
                _dir: dir,
                module_fabric,
                table,
                proxy: addr,
                admin,
                client: Client::builder(TokioExecutor::new()).build_http(),
            }
        }

        fn deps(&self, name: &str) -> String {
            let key = format!("doc/{name}");
            let slot = self.table.slot_of(&key).unwrap();
            self.table.header(&[(key, slot)]).unwrap().to_string()
        }

        fn bump(&self, name: &str) {
            self.table.bump(self.table.slot_of(&format!("doc/{name}")).unwrap()).unwrap();
        }

        async fn push(&self, name: &str, deps: Option<&str>, body: &str) -> StatusCode {
            self.push_to(self.admin, name, deps, body).await
        }

        async fn push_to(&self, to: SocketAddr, name: &str, deps: Option<&str>, body: &str) -> StatusCode {
            let mut request = Request::new(Full::new(Bytes::from(body.to_string())));
            *request.method_mut() = Method::PUT;
            *request.uri_mut() = format!("http://{to}{}{name}", crate::PUSH_PATH_PREFIX).parse().unwrap();
            if let Some(deps) = deps {
                request.headers_mut().insert(DEPS_HEADER, deps.parse().unwrap());
            }
            let response = self.client.request(request).await.unwrap();
            let status = response.status();
            response.into_body().collect().await.unwrap();
            status
        }

        /// (X-Cache, body)
        async fn get(&self, name: &str) -> (String, String) {
            let uri = format!("http://{}/doc/{name}", self.proxy).parse().unwrap();
            let response = self.client.get(uri).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let cache = response.headers().get("x-cache").unwrap().to_str().unwrap().to_string();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (cache, String::from_utf8_lossy(&body).to_string())
        }

        async fn stats(&self) -> ProxyStats {
            let uri = format!("http://{}/_tierstack/stats", self.admin).parse().unwrap();
            let body = self.client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice(&body).unwrap()
        }
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

    #[tokio::test]
    async fn the_cache_state_tracks_requests_and_residency_through_evictions() {
        // Entries of about 135 bytes in 1120: about 8 fit, so 10 documents evict.
        let s = Setup::new(CacheMode::Poll, 8 * 140).await;
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
