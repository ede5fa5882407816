//! The proxy as an RFC 9111 shared cache, each behaviour through a real
//! proxy in front of a real origin written here (a small hyper server whose
//! every answer, field by field, the test decides). MUSTs first, then
//! SHOULDs; then client conditionals and ranges; then responses with
//! dependencies (`X-Tierstack-Deps`), which keep the version-check guarantee.
//!
//! Staleness is set up with `Age` (a response that arrives already old)
//! rather than by waiting for the clock; the policy's clock arithmetic is
//! unit-tested in `policy.rs` with the time passed in.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_coherent::version_table::VersionTable;
use tierstack_coherent::{Incarnation, DEPS_HEADER};
use tierstack_fabric::{Fabric, NodeId};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_proxy::{CacheMode, Proxy, ProxyConfig, ProxyStats};
use tierstack_tier_http::{serve, Body, Stop};
use tokio::sync::Notify;

/// One request as the origin received it.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    target: String,
    headers: HeaderMap,
}

/// The origin's answer: status, fields in order, body.
#[derive(Clone, Debug)]
struct Reply {
    status: u16,
    fields: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn ok(fields: &[(&str, &str)], body: &str) -> Reply {
        Reply::with(200, fields, body)
    }

    fn with(status: u16, fields: &[(&str, &str)], body: &str) -> Reply {
        Reply {
            status,
            fields: fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: body.to_string(),
        }
    }
}

type Script = Arc<dyn Fn(&Seen, usize) -> Reply + Send + Sync>;

/// The origin: answers by the current script (given the request and how
/// many came before it), records every request; while `hold` is set,
/// answers wait for `release`.
struct Origin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<Script>>,
    hold: Arc<AtomicBool>,
    release: Arc<Notify>,
}

impl Origin {
    async fn start() -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Arc::new(|_: &Seen, _| Reply::ok(&[], "unset"))));
        let (hold, release) = (Arc::new(AtomicBool::new(false)), Arc::new(Notify::new()));
        let (s, sc, h, r) = (seen.clone(), script.clone(), hold.clone(), release.clone());
        let handler = Arc::new(move |request: Request<Incoming>| {
            let request_seen = Seen {
                method: request.method().clone(),
                target: request.uri().path_and_query().map_or("/".into(), |p| p.to_string()),
                headers: request.headers().clone(),
            };
            let script = sc.lock().unwrap().clone();
            let reply = {
                let mut seen = s.lock().unwrap();
                let reply = script(&request_seen, seen.len());
                seen.push(request_seen);
                reply
            };
            let (hold, release) = (h.clone(), r.clone());
            async move {
                if hold.load(Ordering::SeqCst) {
                    release.notified().await;
                }
                let mut response: Response<Body> = Response::new(Full::new(Bytes::from(reply.body)));
                *response.status_mut() = StatusCode::from_u16(reply.status).unwrap();
                for (name, value) in reply.fields {
                    response.headers_mut().append(
                        HeaderName::from_bytes(name.as_bytes()).unwrap(),
                        HeaderValue::from_str(&value).unwrap(),
                    );
                }
                response
            }
        });
        tokio::spawn(serve(listener, handler, Stop::new()));
        Origin { addr, seen, script, hold, release }
    }

    fn answer(&self, script: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Arc::new(script);
    }

    /// Always the same reply.
    fn always(&self, reply: Reply) {
        self.answer(move |_, _| reply.clone());
    }

    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }

    fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
        self.release.notify_waiters();
    }
}

/// A proxy (poll mode, its own shm fabric) in front of an [`Origin`], and
/// a version table for responses with dependencies.
struct Rig {
    _dir: tempfile::TempDir,
    origin: Origin,
    proxy: SocketAddr,
    admin: SocketAddr,
    table: Arc<VersionTable>,
    _module: Arc<ShmFabric>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What the client got.
#[derive(Debug)]
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Got {
    fn field(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn x_cache(&self) -> &str {
        self.field("x-cache").unwrap_or("")
    }
}

impl Rig {
    async fn new() -> Rig {
        Rig::with_mode(CacheMode::Poll).await
    }

    async fn with_mode(mode: CacheMode) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let module = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0))).unwrap();
        let table = Arc::new(VersionTable::create(module.as_ref(), 16, Incarnation(3)).unwrap());
        let proxy_fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(1))).unwrap();
        let origin = Origin::start().await;
        let proxy = Proxy::bind(ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstreams: vec![format!("http://{}", origin.addr)],
            mode,
            cache_bytes: 64 << 20,
            upstream_timeout: Duration::from_secs(20),
            fabric: Some(proxy_fabric),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        })
        .await
        .unwrap();
        let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
        tokio::spawn(proxy.run(Stop::new()));
        Rig {
            _dir: dir,
            origin,
            proxy: addr,
            admin,
            table,
            _module: module,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn send(&self, method: Method, target: &str, fields: &[(&str, &str)]) -> Got {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{}{target}", self.proxy).parse().unwrap();
        for (name, value) in fields {
            request
                .headers_mut()
                .append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        let response = self.client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Got { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    async fn get(&self, target: &str, fields: &[(&str, &str)]) -> Got {
        self.send(Method::GET, target, fields).await
    }

    async fn stats(&self) -> ProxyStats {
        let uri = format!("http://{}/_tierstack/stats", self.admin).parse().unwrap();
        let body = self.client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    /// The current dependency header of `key`.
    fn deps(&self, key: &str) -> String {
        let slot = self.table.slot_of(key).unwrap();
        self.table.header(&[(key.to_string(), slot)]).unwrap().to_string()
    }

    fn bump(&self, key: &str) {
        self.table.bump(self.table.slot_of(key).unwrap()).unwrap();
    }
}

/// Waits (bounded) until `condition` holds.
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what}: never happened");
}

fn http_date(offset_secs: i64) -> String {
    let now = std::time::SystemTime::now();
    let at = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs((-offset_secs) as u64)
    };
    httpdate::fmt_http_date(at)
}

/// The fields a cache adds or may set on a hit.
fn without_cache_fields(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(n, _)| !matches!(n.as_str(), "age" | "x-cache" | "x-cache-coalesced"))
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
        .collect()
}

// ---- 1. Whole responses -------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_replays_the_status_every_end_to_end_field_and_the_body() {
    let rig = Rig::new().await;
    let date = http_date(0);
    rig.origin.always(Reply::with(
        203,
        &[
            ("cache-control", "max-age=300"),
            ("etag", "\"v1\""),
            ("last-modified", "Mon, 02 Nov 2026 10:00:00 GMT"),
            ("content-type", "text/html; charset=utf-8"),
            ("content-language", "en"),
            ("x-custom", "one"),
            ("x-custom", "two"),
            ("date", &date),
            ("link", "</style.css>; rel=preload"),
        ],
        "the whole page",
    ));
    let miss = rig.get("/page", &[]).await;
    assert_eq!((miss.status.as_u16(), miss.x_cache()), (203, "MISS"));
    let hit = rig.get("/page", &[]).await;
    assert_eq!((hit.status.as_u16(), hit.x_cache()), (203, "HIT"), "{hit:?}");
    assert_eq!(hit.body, "the whole page");
    assert_eq!(without_cache_fields(&hit.headers), without_cache_fields(&miss.headers));
    let customs: Vec<_> = hit.headers.get_all("x-custom").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(customs, ["one", "two"], "every line, in order");
    assert_eq!(hit.field("etag"), Some("\"v1\""));
    assert_eq!(rig.origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_and_those_connection_names_are_never_relayed_nor_stored() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(
        &[
            ("cache-control", "max-age=300"),
            ("connection", "x-secret, x-other"),
            ("x-secret", "hop"),
            ("x-other", "hop too"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic realm=\"origin\""),
            ("x-kept", "end to end"),
        ],
        "body",
    ));
    for expected in ["MISS", "HIT"] {
        let got = rig.get("/h", &[]).await;
        assert_eq!(got.x_cache(), expected);
        for hop in ["x-secret", "x-other", "keep-alive", "proxy-authenticate"] {
            assert!(got.field(hop).is_none(), "{expected}: {hop} relayed: {got:?}");
        }
        assert_eq!(got.field("x-kept"), Some("end to end"));
    }
    // Nor sent upstream from the client's request.
    rig.get("/h2", &[("connection", "x-client-hop"), ("x-client-hop", "1"), ("x-end", "2")]).await;
    let seen = rig.origin.last();
    assert!(seen.headers.get("x-client-hop").is_none(), "{seen:?}");
    assert_eq!(seen.headers.get("x-end").unwrap(), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_carry_age_including_the_age_the_origin_reported() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300"), ("age", "40")], "aged"));
    rig.get("/a", &[]).await;
    let hit = rig.get("/a", &[]).await;
    assert_eq!(hit.x_cache(), "HIT");
    let age: u64 = hit.field("age").unwrap().parse().unwrap();
    assert!((40..=45).contains(&age), "age {age}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_key_is_the_authority_and_the_full_target() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| {
        let host = seen.headers.get("host").map_or("-".into(), |h| h.to_str().unwrap().to_string());
        Reply::ok(&[("cache-control", "max-age=300")], &format!("{host} {}", seen.target))
    });
    let a = rig.get("/p?q=1", &[("host", "a.example")]).await;
    assert_eq!(a.body, "a.example /p?q=1", "the upstream is told the site");
    let b = rig.get("/p?q=1", &[("host", "B.example")]).await;
    assert_eq!((b.x_cache(), b.body.as_str()), ("MISS", "B.example /p?q=1"), "another site");
    let q = rig.get("/p?q=2", &[("host", "a.example")]).await;
    assert_eq!(q.x_cache(), "MISS", "another query");
    let again = rig.get("/p?q=1", &[("host", "A.EXAMPLE")]).await;
    assert_eq!((again.x_cache(), again.body.as_str()), ("HIT", "a.example /p?q=1"), "authority is case-insensitive");
    assert_eq!(rig.origin.requests(), 3);
}

// ---- 2. Storability (§3) --------------------------------------------------

/// Two GETs of a fresh response with `fields`; how many reached the origin.
async fn origin_requests_for_two_gets(fields: &[(&str, &str)], request: &[(&str, &str)]) -> usize {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(fields, "x"));
    rig.get("/r", request).await;
    rig.get("/r", request).await;
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    rig.origin.requests()
}

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

// ---- Freshness (§4.2) -----------------------------------------------------

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

// ---- Validation (§4.3) ----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_responses_are_revalidated_with_the_stored_etag_before_every_use() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(tag) if tag == "\"v1\"" => Reply::with(304, &[("etag", "\"v1\"")], ""),
        _ => Reply::ok(&[("cache-control", "no-cache"), ("etag", "\"v1\"")], "stored body"),
    });
    rig.get("/n", &[]).await;
    for _ in 0..2 {
        let got = rig.get("/n", &[]).await;
        assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "stored body"));
        assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"v1\"");
    }
    assert_eq!(rig.origin.requests(), 3);
    let stats = rig.stats().await;
    assert_eq!((stats.revalidations, stats.revalidated), (2, 2), "{stats:?}");
    assert_eq!(stats.accounting_error(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revalidation_uses_last_modified_when_there_is_no_etag() {
    let rig = Rig::new().await;
    let lm = "Mon, 02 Nov 2026 10:00:00 GMT";
    rig.origin.answer(move |seen, _| match seen.headers.get("if-modified-since") {
        Some(since) if since == lm => Reply::with(304, &[], ""),
        _ => Reply::ok(&[("cache-control", "max-age=0"), ("last-modified", lm)], "by date"),
    });
    rig.get("/d", &[]).await;
    let got = rig.get("/d", &[]).await;
    assert_eq!(got.body, "by date");
    assert_eq!(rig.origin.last().headers.get("if-modified-since").unwrap(), lm);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_updates_the_stored_fields() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(_) => Reply::with(304, &[("etag", "\"v1\""), ("cache-control", "max-age=300"), ("x-version", "2")], ""),
        None => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"v1\""), ("x-version", "1")], "body"),
    });
    assert_eq!(rig.get("/u", &[]).await.field("x-version"), Some("1"));
    let revalidated = rig.get("/u", &[]).await;
    assert_eq!((revalidated.field("x-version"), revalidated.body.as_str()), (Some("2"), "body"));
    let hit = rig.get("/u", &[]).await;
    assert_eq!(
        (hit.x_cache(), hit.field("x-version"), hit.field("cache-control")),
        ("HIT", Some("2"), Some("max-age=300"))
    );
    assert_eq!(hit.field("content-length"), Some("4"), "the framing is the stored body's");
    assert_eq!(rig.origin.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_response_to_a_revalidation_replaces_the_stored_one() {
    let rig = Rig::new().await;
    rig.origin
        .answer(|_, n| Reply::ok(&[("cache-control", "max-age=0"), ("etag", &format!("\"v{n}\""))], &format!("v{n}")));
    rig.get("/f", &[]).await;
    assert_eq!(rig.get("/f", &[]).await.body, "v1");
    rig.get("/f", &[]).await;
    assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"v1\"", "the new validator is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_own_conditions_are_not_sent_on_a_revalidation() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("if-none-match") {
        Some(_) => Reply::with(304, &[("etag", "\"mine\"")], ""),
        None => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"mine\"")], "body"),
    });
    rig.get("/c", &[]).await;
    let got = rig.get("/c", &[("if-none-match", "\"other\"")]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "body"));
    assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"mine\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_forbids_serving_stale_on_error() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(
            &[("cache-control", "max-age=1, must-revalidate, stale-if-error=600"), ("age", "5"), ("etag", "\"a\"")],
            "old",
        ),
        _ => Reply::with(503, &[], "down"),
    });
    rig.get("/m", &[]).await;
    assert_eq!(rig.get("/m", &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_revalidate_also_forbids_stale() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(&[("cache-control", "max-age=1, proxy-revalidate, stale-if-error=600"), ("age", "5")], "old"),
        _ => Reply::with(500, &[], "down"),
    });
    rig.get("/m", &[]).await;
    assert_eq!(rig.get("/m", &[]).await.status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_the_stored_response_when_the_origin_fails() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(&[("cache-control", "max-age=1, stale-if-error=600"), ("age", "5"), ("etag", "\"a\"")], "kept"),
        _ => Reply::with(503, &[], "down"),
    });
    rig.get("/e", &[]).await;
    let got = rig.get("/e", &[]).await;
    assert_eq!((got.status, got.body.as_str()), (StatusCode::OK, "kept"));
    assert_eq!(rig.stats().await.stale_served, 1);
    // Without the directive the error goes through.
    rig.origin.answer(|_, n| match n {
        2 => Reply::ok(&[("cache-control", "max-age=1"), ("age", "5"), ("etag", "\"a\"")], "kept"),
        _ => Reply::with(503, &[], "down"),
    });
    rig.get("/e2", &[]).await;
    assert_eq!(rig.get("/e2", &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_serves_stale_at_once_and_refreshes_behind() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| {
        Reply::ok(
            &[("cache-control", "max-age=1, stale-while-revalidate=600"), ("age", "5"), ("etag", &format!("\"{n}\""))],
            &format!("v{n}"),
        )
    });
    rig.get("/s", &[]).await;
    let stale = rig.get("/s", &[]).await;
    assert_eq!((stale.x_cache(), stale.body.as_str()), ("HIT", "v0"), "served stale at once");
    wait_for("the background revalidation", || rig.origin.requests() == 2).await;
    assert_eq!(rig.origin.last().headers.get("if-none-match").unwrap(), "\"0\"");
    // It stored v1 (also already past its lifetime: again stale-while-revalidate).
    let mut body = String::new();
    for _ in 0..1000 {
        body = rig.get("/s", &[("cache-control", "max-stale")]).await.body;
        if body == "v1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(body, "v1");
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "a background revalidation is routed too: {stats:?}");
}

// ---- Vary (§4.1) ----------------------------------------------------------

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

// ---- Invalidation (§4.4) --------------------------------------------------

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

// ---- HEAD -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_answered_from_a_stored_get() {
    let rig = Rig::new().await;
    rig.origin
        .always(Reply::ok(&[("cache-control", "max-age=300"), ("etag", "\"h\""), ("x-field", "1")], "0123456789"));
    rig.get("/head", &[]).await;
    let head = rig.send(Method::HEAD, "/head", &[]).await;
    assert_eq!((head.status, head.x_cache(), head.body.as_str()), (StatusCode::OK, "HIT", ""));
    assert_eq!((head.field("etag"), head.field("x-field")), (Some("\"h\""), Some("1")));
    assert_eq!(head.field("content-length"), Some("10"));
    assert_eq!(rig.origin.requests(), 1);
}

// ---- 3. Client conditionals and ranges -------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_answers_if_none_match_with_304() {
    let rig = Rig::new().await;
    rig.origin
        .always(Reply::ok(&[("cache-control", "max-age=300"), ("etag", "\"e1\""), ("x-body-field", "1")], "body"));
    rig.get("/c", &[]).await;
    let not_modified = rig.get("/c", &[("if-none-match", "\"zz\", W/\"e1\"")]).await;
    assert_eq!(
        (not_modified.status, not_modified.x_cache(), not_modified.body.as_str()),
        (StatusCode::NOT_MODIFIED, "HIT", "")
    );
    assert_eq!(not_modified.field("etag"), Some("\"e1\""));
    assert_eq!(not_modified.field("cache-control"), Some("max-age=300"));
    let star = rig.get("/c", &[("if-none-match", "*")]).await;
    assert_eq!(star.status, StatusCode::NOT_MODIFIED);
    let other = rig.get("/c", &[("if-none-match", "\"e2\"")]).await;
    assert_eq!((other.status, other.body.as_str()), (StatusCode::OK, "body"));
    assert_eq!(rig.origin.requests(), 1);
    assert_eq!(rig.stats().await.not_modified, 2);
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_answers_if_modified_since_with_304() {
    let rig = Rig::new().await;
    let lm = "Mon, 02 Nov 2026 10:00:00 GMT";
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300"), ("last-modified", lm)], "body"));
    rig.get("/c", &[]).await;
    assert_eq!(rig.get("/c", &[("if-modified-since", lm)]).await.status, StatusCode::NOT_MODIFIED);
    let later = "Tue, 03 Nov 2026 10:00:00 GMT";
    assert_eq!(rig.get("/c", &[("if-modified-since", later)]).await.status, StatusCode::NOT_MODIFIED);
    let earlier = "Sun, 01 Nov 2026 10:00:00 GMT";
    assert_eq!(rig.get("/c", &[("if-modified-since", earlier)]).await.status, StatusCode::OK);
    // If-None-Match takes precedence (RFC 9110 §13.2.2).
    let both = rig.get("/c", &[("if-none-match", "\"x\""), ("if-modified-since", later)]).await;
    assert_eq!(both.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_requests_pass_through_to_the_origin() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, _| match seen.headers.get("range") {
        Some(_) => Reply::with(206, &[("content-range", "bytes 0-3/10")], "0123"),
        None => Reply::ok(&[("cache-control", "max-age=300")], "0123456789"),
    });
    rig.get("/r", &[]).await;
    let partial = rig.get("/r", &[("range", "bytes=0-3")]).await;
    assert_eq!(
        (partial.status, partial.x_cache(), partial.body.as_str()),
        (StatusCode::PARTIAL_CONTENT, "MISS", "0123")
    );
    assert_eq!(rig.origin.last().headers.get("range").unwrap(), "bytes=0-3");
    let whole = rig.get("/r", &[]).await;
    assert_eq!((whole.x_cache(), whole.body.as_str()), ("HIT", "0123456789"), "the full response stays stored");
}

// ---- 4. Responses with dependencies ------------------------------------------

/// An origin answering every GET with the current dependency header of
/// `doc/a` and `fields`.
fn deps_origin(rig: &Rig, fields: &'static [(&'static str, &'static str)]) {
    let table = rig.table.clone();
    rig.origin.answer(move |seen, _| {
        let slot = table.slot_of("doc/a").unwrap();
        let deps = table.header(&[("doc/a".to_string(), slot)]).unwrap().to_string();
        let who = seen
            .headers
            .get("authorization")
            .or(seen.headers.get("cookie"))
            .map_or("-".into(), |v| v.to_str().unwrap().to_string());
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        all.push((DEPS_HEADER, &deps));
        Reply::ok(&all, &format!("{deps} {who}"))
    });
}

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
async fn the_admin_listener_purges_one_object() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "x"));
    rig.get("/one", &[("host", "site.example")]).await;
    rig.get("/two", &[("host", "site.example")]).await;
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.method_mut() = Method::DELETE;
    *request.uri_mut() = format!("http://{}/_tierstack/purge/site.example/one", rig.admin).parse().unwrap();
    assert_eq!(rig.client.request(request).await.unwrap().status(), StatusCode::OK);
    assert_eq!(rig.get("/one", &[("host", "site.example")]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/two", &[("host", "site.example")]).await.x_cache(), "HIT");
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.method_mut() = Method::DELETE;
    *request.uri_mut() = format!("http://{}/_tierstack/purge/site.example/never", rig.admin).parse().unwrap();
    assert_eq!(rig.client.request(request).await.unwrap().status(), StatusCode::NOT_FOUND);
    // Not on the client listener.
    let got = rig.send(Method::DELETE, "/_tierstack/purge/site.example/two", &[]).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(rig.stats().await.purges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_mode_still_follows_rfc_9111_for_responses_without_dependencies() {
    let rig = Rig::with_mode(CacheMode::Ttl).await;
    rig.origin.always(Reply::ok(&[("cache-control", "private, max-age=300")], "x"));
    rig.get("/t", &[]).await;
    assert_eq!(rig.get("/t", &[]).await.x_cache(), "MISS");
}

// ---- Header fidelity (property) -------------------------------------------

/// Field names the proxy treats specially on the way back (framing, the
/// cache's own, hop-by-hop) are left out of the random sets.
fn special(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "content-length"
            | "age"
            | "x-cache"
            | "date"
            | "cache-control"
            | "vary"
            | "set-cookie"
            | "cdn-cache-control"
            | "expires"
    ) || name.starts_with("x-tierstack")
}

#[test]
fn every_end_to_end_field_of_the_origin_appears_identically_on_the_hit() {
    use proptest::prelude::*;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let rig = runtime.block_on(Rig::new());
    let field = ("[a-z][a-z0-9-]{0,14}", "[!-~]([ !-~]{0,30}[!-~])?");
    let fields = proptest::collection::vec(field, 0..12);
    let hops = proptest::collection::vec("x-hop-[a-z]{1,6}", 0..3);
    let case = std::sync::atomic::AtomicU32::new(0);
    proptest!(ProptestConfig::with_cases(48), |(fields in fields, hops in hops)| {
        let target = format!("/prop/{}", case.fetch_add(1, Ordering::SeqCst));
        let mut reply: Vec<(String, String)> = fields.into_iter().filter(|(n, _)| !special(n) && !n.starts_with("x-hop-")).collect();
        reply.push(("cache-control".into(), "max-age=300".into()));
        if !hops.is_empty() {
            reply.push(("connection".into(), hops.join(", ")));
            reply.extend(hops.iter().map(|h| (h.clone(), "hop".to_string())));
        }
        let script_reply = Reply { status: 200, fields: reply.clone(), body: "p".into() };
        rig.origin.always(script_reply);
        let (miss, hit) = runtime.block_on(async { (rig.get(&target, &[]).await, rig.get(&target, &[]).await) });
        prop_assert_eq!(miss.x_cache(), "MISS");
        prop_assert_eq!(hit.x_cache(), "HIT");
        // What the origin sent, end to end, in order per field name.
        for (name, _) in &reply {
            let sent: Vec<&str> = reply.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect();
            let got: Vec<&str> = hit.headers.get_all(name.as_str()).iter().map(|v| v.to_str().unwrap()).collect();
            if name == "connection" || hops.contains(name) {
                prop_assert!(got.is_empty(), "hop-by-hop {} on the hit", name);
                prop_assert!(miss.headers.get(name.as_str()).is_none(), "hop-by-hop {} on the miss", name);
            } else {
                prop_assert_eq!(got, sent, "field {}", name);
            }
        }
        prop_assert_eq!(without_cache_fields(&hit.headers), without_cache_fields(&miss.headers));
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_metrics_are_served_on_the_admin_listener_only() {
    let rig = Rig::new().await;
    deps_origin(&rig, &[]);
    rig.get("/doc/a", &[]).await;
    rig.get("/doc/a", &[]).await;
    let uri = format!("http://{}/metrics", rig.admin).parse().unwrap();
    let response = rig.client.get(uri).await.unwrap();
    assert_eq!(response.headers().get("content-type").unwrap(), "text/plain; version=0.0.4");
    let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    for line in [
        "tierstack_proxy_requests_total 2",
        "tierstack_proxy_hits_total 1",
        "tierstack_proxy_misses_total 1",
        "tierstack_proxy_version_checks_total 1",
        "tierstack_proxy_objects 1",
        "tierstack_proxy_version_check_seconds_count 1",
        "tierstack_proxy_version_check_seconds_bucket{le=\"+Inf\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    // The client listener forwards /metrics like any page.
    rig.origin.always(Reply::ok(&[], "the origin's page"));
    assert_eq!(rig.get("/metrics", &[]).await.body, "the origin's page");
}

// ---- More SHOULDs and edge cases -------------------------------------------

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_maxage_forbids_serving_stale_even_with_stale_if_error() {
    let rig = Rig::new().await;
    rig.origin.answer(|_, n| match n {
        0 => Reply::ok(&[("cache-control", "s-maxage=1, stale-if-error=600"), ("age", "5")], "old"),
        _ => Reply::with(502, &[], "down"),
    });
    rig.get("/s", &[]).await;
    assert_eq!(rig.get("/s", &[]).await.status, StatusCode::BAD_GATEWAY);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_miss_is_forwarded_as_head_and_stores_nothing() {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300")], "body"));
    let head = rig.send(Method::HEAD, "/h", &[]).await;
    assert_eq!((head.status, head.x_cache(), head.body.as_str()), (StatusCode::OK, "MISS", ""));
    assert_eq!(rig.origin.last().method, Method::HEAD);
    assert_eq!(rig.get("/h", &[]).await.x_cache(), "MISS");
    assert_eq!(rig.get("/h", &[]).await.x_cache(), "HIT");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_for_another_representation_leads_to_an_unconditional_request() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, n| match (n, seen.headers.get("if-none-match")) {
        (0, _) => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"a\"")], "first"),
        (_, Some(_)) => Reply::with(304, &[("etag", "\"b\"")], ""),
        (_, None) => Reply::ok(&[("cache-control", "max-age=0"), ("etag", "\"b\"")], "second"),
    });
    rig.get("/r", &[]).await;
    let got = rig.get("/r", &[]).await;
    assert_eq!(got.body, "second", "the stored \"a\" was not served for a 304 about \"b\"");
    assert!(rig.origin.last().headers.get("if-none-match").is_none());
    assert_eq!(rig.origin.requests(), 3);
    let stats = rig.stats().await;
    assert_eq!((stats.misses, stats.revalidations), (2, 2));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
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
