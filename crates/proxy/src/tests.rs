//! The proxy's counters and its cache under racing requests, through a real
//! proxy ([`crate::testkit`]); interleavings are driven by holding the
//! origin's answers and by the proxy's test hooks, never by sleeping.

use crate::testkit::{Got, Setup};
use crate::CacheMode;
use hyper::{Method, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

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

fn spawn_get(s: &Arc<Setup>, name: &'static str) -> tokio::task::JoinHandle<Got> {
    let s = s.clone();
    tokio::spawn(async move { s.get_full(name).await })
}

/// Starts a GET of `name` whose fetch the origin holds, then `waiters` more
/// that wait on that fetch; releases it and returns (leader, waiters).
async fn coalesce_burst(s: &Arc<Setup>, name: &'static str, waiters: u64) -> (Got, Vec<Got>) {
    s.origin.hold.store(true, Ordering::SeqCst);
    let before = s.origin_requests();
    let waiting_before = s.state.counters.waiting_on_fetch.load(Ordering::SeqCst);
    let leader = spawn_get(s, name);
    wait_for("the leader's fetch reaches the origin", || s.origin_requests() == before + 1).await;
    let waiting: Vec<_> = (0..waiters).map(|_| spawn_get(s, name)).collect();
    wait_for("the others wait on the leader's fetch", || {
        s.state.counters.waiting_on_fetch.load(Ordering::SeqCst) == waiting_before + waiters
    })
    .await;
    s.origin.release();
    let leader = leader.await.unwrap();
    let mut served = Vec::new();
    for waiter in waiting {
        served.push(waiter.await.unwrap());
    }
    (leader, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_requests_are_labelled_and_counted_apart_from_hits() {
    let s = Arc::new(Setup::new(CacheMode::Poll, 1 << 20).await);
    let (leader, waiters) = coalesce_burst(&s, "a", 3).await;
    assert_eq!((leader.x_cache.as_str(), leader.coalesced), ("MISS", false));
    for waiter in &waiters {
        assert_eq!(waiter.status, StatusCode::OK);
        assert_eq!((waiter.x_cache.as_str(), waiter.coalesced), ("MISS", true), "{waiter:?}");
    }
    let got = s.get_full("a").await;
    assert_eq!((got.x_cache.as_str(), got.coalesced), ("HIT", false));
    let stats = s.stats().await;
    assert_eq!((stats.requests, stats.hits, stats.coalesced, stats.misses), (5, 1, 3, 1));
    assert_eq!((stats.checks, stats.checks_ok), (4, 4));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

/// What the clients saw.
#[derive(Default, Debug, PartialEq)]
struct Seen {
    requests: u64,
    hits: u64,
    coalesced: u64,
    misses: u64,
}

impl Seen {
    fn add(&mut self, got: &Got) {
        assert_eq!(got.status, StatusCode::OK, "{got:?}");
        self.requests += 1;
        match (got.x_cache.as_str(), got.coalesced) {
            ("HIT", false) => self.hits += 1,
            ("MISS", true) => self.coalesced += 1,
            ("MISS", false) => self.misses += 1,
            other => panic!("unexpected labels {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_add_up_exactly_under_concurrent_load() {
    const CLIENTS: usize = 8;
    const REQUESTS_PER_CLIENT: usize = 60;
    const UPDATES: usize = 40;
    const NAMES: [&str; 4] = ["d0", "d1", "d2", "d3"];
    let s = Arc::new(Setup::new(CacheMode::Poll, 1 << 20).await);
    let mut seen = Seen::default();
    // Certain coalescing first (a load alone may or may not produce any).
    let (leader, waiters) = coalesce_burst(&s, "d0", 4).await;
    for got in std::iter::once(&leader).chain(&waiters) {
        seen.add(got);
    }
    // Then clients, updates and pushes all at once.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut seen = Seen::default();
                for i in 0..REQUESTS_PER_CLIENT {
                    seen.add(&s.get_full(NAMES[(client * 7 + i * 3) % NAMES.len()]).await);
                }
                seen
            })
        })
        .collect();
    let updater = {
        let s = s.clone();
        tokio::spawn(async move {
            let mut pushes = [0u64; 3]; // installed, redundant, stale
            for i in 0..UPDATES {
                let name = NAMES[i % NAMES.len()];
                let before = s.deps(name);
                s.bump(name);
                // Every third update is pushed; every fifth push is an old one.
                if i % 3 == 0 {
                    let deps = if i % 5 == 0 { before } else { s.deps(name) };
                    match s.push(name, Some(&deps), "pushed").await {
                        StatusCode::NO_CONTENT => pushes[0] += 1,
                        StatusCode::OK => pushes[1] += 1,
                        StatusCode::CONFLICT => pushes[2] += 1,
                        other => panic!("push answered {other}"),
                    }
                }
                tokio::task::yield_now().await;
            }
            pushes
        })
    };
    for client in clients {
        let got = client.await.unwrap();
        seen.requests += got.requests;
        seen.hits += got.hits;
        seen.coalesced += got.coalesced;
        seen.misses += got.misses;
    }
    let pushes = updater.await.unwrap();

    let stats = s.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    let counted = Seen { requests: stats.requests, hits: stats.hits, coalesced: stats.coalesced, misses: stats.misses };
    assert_eq!(counted, seen, "the proxy counts what its clients saw");
    assert_eq!(seen.requests, 5 + (CLIENTS * REQUESTS_PER_CLIENT) as u64);
    assert_eq!(stats.checks_ok, stats.hits + stats.coalesced, "hits served == successful checks");
    assert!(stats.coalesced >= 4 && stats.hits > 0, "{stats:?}");
    assert_eq!([stats.pushes_installed, stats.pushes_redundant, stats.pushes_stale], pushes);
    assert_eq!(stats.pushes_received, pushes.iter().sum::<u64>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_check_does_not_remove_a_newer_copy_cached_meanwhile() {
    let s = Arc::new(Setup::new(CacheMode::Poll, 1 << 20).await);
    assert_eq!(s.get("a").await.0, "MISS", "version 1 cached");
    s.bump("a");
    // A checks the version 1 copy and stops once it knows it is stale.
    let mut pause = s.pause_after_check();
    let a = spawn_get(&s, "a");
    pause.reached().await;
    // Meanwhile B finds the same stale copy, fetches version 2 and caches it.
    let (cache, body) = s.get("a").await;
    assert_eq!(cache, "MISS");
    assert!(body.contains("doc/a=2@"), "{body}");
    // A now acts on its verdict; its own fetch is not cacheable, so only
    // B's copy can answer the next request.
    s.origin.no_store.store(true, Ordering::SeqCst);
    pause.resume();
    let a = a.await.unwrap();
    assert_eq!(a.x_cache, "MISS");
    let (cache, body) = s.get("a").await;
    assert_eq!(cache, "HIT", "A's failed check removed B's newer copy");
    assert!(body.contains("doc/a=2@"), "{body}");
    let stats = s.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    assert_eq!((stats.stale_dropped, stats.checks_ok), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_miss_does_not_overwrite_a_newer_cached_copy() {
    let s = Arc::new(Setup::new(CacheMode::Poll, 1 << 20).await);
    // A's response is generated at version 1 and held.
    s.origin.hold.store(true, Ordering::SeqCst);
    let a = spawn_get(&s, "a");
    wait_for("A's fetch reaches the origin", || s.origin_requests() == 1).await;
    // Version 2 is written and pushed before A's response arrives.
    s.bump("a");
    let deps = s.deps("a");
    assert_eq!(s.push("a", Some(&deps), "pushed v2").await, StatusCode::NO_CONTENT);
    s.origin.release();
    let a = a.await.unwrap();
    assert_eq!(a.x_cache, "MISS");
    assert!(a.body.contains("doc/a=1@"), "A began before the update: {}", a.body);
    assert_eq!(s.get("a").await, ("HIT".to_string(), "pushed v2".to_string()), "the pushed version 2 stayed cached");
    let stats = s.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    assert_eq!(stats.stale_dropped, 0, "no copy was ever found stale");
}

#[tokio::test]
async fn a_push_must_name_the_pushed_documents_key() {
    let s = Setup::new(CacheMode::Poll, 1 << 20).await;
    // Another document's header is current, but says nothing about /doc/a.
    let other = s.deps("b");
    assert_eq!(s.push("a", Some(&other), "forged a").await, StatusCode::BAD_REQUEST);
    let (cache, body) = s.get("a").await;
    assert_eq!(cache, "MISS");
    assert!(!body.contains("forged"), "{body}");
    // A header naming doc/a among other keys is fine.
    s.bump("a");
    let slot = |key: &str| (key.to_string(), s.table.slot_of(key).unwrap());
    let both = s.table.header(&[slot("doc/b"), slot("doc/a")]).unwrap().to_string();
    assert_eq!(s.push("a", Some(&both), "pushed a").await, StatusCode::NO_CONTENT);
    assert_eq!(s.get("a").await, ("HIT".to_string(), "pushed a".to_string()));
    let stats = s.stats().await;
    assert_eq!((stats.pushes_refused, stats.pushes_received, stats.pushes_installed), (1, 1, 1));
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_waiting_is_counted_as_abandoned() {
    use tokio::io::AsyncWriteExt;
    let s = Arc::new(Setup::new(CacheMode::Poll, 1 << 20).await);
    s.origin.hold.store(true, Ordering::SeqCst);
    let leader = spawn_get(&s, "a");
    wait_for("the leader's fetch reaches the origin", || s.origin_requests() == 1).await;
    // A second client joins the held fetch, then goes away: the server
    // drops its request's handling mid-wait.
    let mut stream = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
    // The Host the leader's client sent: the same cache key.
    stream.write_all(format!("GET /doc/a HTTP/1.1\r\nHost: {}\r\n\r\n", s.proxy).as_bytes()).await.unwrap();
    let waiting = || s.state.counters.waiting_on_fetch.load(Ordering::SeqCst);
    wait_for("the second request waits", || waiting() == 1).await;
    drop(stream);
    wait_for("the departed client's request is dropped", || waiting() == 0).await;
    s.origin.release();
    assert_eq!(leader.await.unwrap().x_cache, "MISS");
    let stats = s.stats().await;
    assert_eq!((stats.requests, stats.misses, stats.coalesced, stats.abandoned), (2, 1, 0, 1), "{stats:?}");
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_upstream_and_drop_the_cached_copy() {
    let s = Setup::new(CacheMode::Poll, 1 << 20).await;
    assert_eq!(s.get("a").await.0, "MISS");
    assert_eq!(s.get("a").await.0, "HIT");
    assert_eq!(s.request(Method::HEAD, "a").await.x_cache, "HIT", "HEAD is served from the cache");
    assert_eq!(s.stats().await.cached_entries, 1, "a HEAD hit keeps the copy");
    assert_eq!(s.origin_requests(), 1);
    for (method, origin_requests) in [(Method::PUT, 2), (Method::POST, 4)] {
        let written = s.request(method.clone(), "a").await;
        assert_eq!((written.status, written.x_cache.as_str()), (StatusCode::OK, "MISS"), "{method}");
        assert_eq!(s.origin_requests(), origin_requests, "{method} reaches the origin, never the cache");
        assert_eq!(s.stats().await.cached_entries, 0, "{method} drops the copy it made old");
        // No version moved, so only the dropped copy makes this a miss.
        assert_eq!(s.get("a").await.0, "MISS", "after {method}");
        assert_eq!(s.origin_requests(), origin_requests + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_responses_are_passed_through_and_never_cached() {
    let s = Setup::new(CacheMode::Poll, 1 << 20).await;
    s.origin.not_found.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let got = s.get_full("a").await;
        assert_eq!((got.status, got.x_cache.as_str()), (StatusCode::NOT_FOUND, "MISS"));
    }
    assert_eq!(s.origin_requests(), 2, "a 404 is never served from the cache");
    assert_eq!(s.stats().await.cached_entries, 0);
    s.origin.not_found.store(false, Ordering::SeqCst);
    assert_eq!(s.get("a").await.0, "MISS");
    assert_eq!(s.get("a").await.0, "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_mode_neither_stores_nor_shares_a_fetch() {
    let s = Arc::new(Setup::new(CacheMode::NoCache, 1 << 20).await);
    assert_eq!(s.get("a").await.0, "MISS");
    assert_eq!(s.get("a").await.0, "MISS");
    assert_eq!(s.stats().await.cached_entries, 0, "nothing is stored");
    // While the origin holds one fetch, a second request for the same
    // document must make its own.
    s.origin.hold.store(true, Ordering::SeqCst);
    let first = spawn_get(&s, "a");
    wait_for("the first fetch reaches the origin", || s.origin_requests() == 3).await;
    let second = spawn_get(&s, "a");
    wait_for("the second request fetches for itself", || s.origin_requests() == 4).await;
    s.origin.release();
    for got in [first.await.unwrap(), second.await.unwrap()] {
        assert_eq!((got.status, got.x_cache.as_str(), got.coalesced), (StatusCode::OK, "MISS", false));
    }
    let stats = s.stats().await;
    assert_eq!((stats.hits, stats.coalesced, stats.checks), (0, 0, 0));
    assert_eq!(stats.accounting_error(), None);
}

/// Answers from one entry share a field map built at the first one: each
/// still carries its own `Age` and `X-Cache`, every stored field once and
/// in order, and an origin's own `Age` or `X-Cache` is replaced, never
/// repeated.
#[test]
fn answers_from_one_entry_carry_their_own_age_and_label() {
    use crate::cache::Entry;
    use crate::policy::{Freshness, Vary};
    use hyper::header::{HeaderMap, HeaderName, HeaderValue, AGE, CONTENT_TYPE};
    const T: u64 = 1_700_000_000;
    let multi = HeaderName::from_static("x-multi");
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(AGE, HeaderValue::from_static("7"));
    headers.insert(crate::headers::X_CACHE_NAME, HeaderValue::from_static("FROM-ORIGIN"));
    headers.append(multi.clone(), HeaderValue::from_static("a"));
    headers.append(multi.clone(), HeaderValue::from_static("b"));
    let entry = Entry {
        status: StatusCode::OK,
        headers,
        body: bytes::Bytes::from_static(b"body"),
        deps: None,
        pushed: false,
        vary: Vary::default(),
        freshness: Freshness {
            lifetime: 60,
            initial_age: 7,
            response_time: T,
            no_cache: false,
            no_stale: false,
            stale_while_revalidate: 0,
            stale_if_error: 0,
            validators: false,
        },
        reply: std::sync::OnceLock::new(),
    };
    let request = HeaderMap::new();
    let first = crate::handler::respond(&entry, &request, &Method::GET, T, "HIT");
    // Past the ages built once (1,024), and another label.
    let later = crate::handler::respond(&entry, &request, &Method::GET, T + 2_000, "MISS");
    let again = crate::handler::respond(&entry, &request, &Method::GET, T + 1, "HIT");
    for (response, age, label) in [(&first, "7", "HIT"), (&later, "2007", "MISS"), (&again, "8", "HIT")] {
        let fields = response.headers();
        assert_eq!(fields.get_all(AGE).iter().collect::<Vec<_>>(), [age]);
        assert_eq!(fields.get_all(crate::headers::X_CACHE_NAME).iter().collect::<Vec<_>>(), [label]);
        assert_eq!(fields.get_all(&multi).iter().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(fields[CONTENT_TYPE], "text/plain");
        assert_eq!(fields.len(), 5);
    }
}

/// The `Age` values built once are the ones formatting would give.
#[test]
fn built_age_values_equal_formatted_ones() {
    for age in (0..1_100).chain([u64::from(u32::MAX), u64::MAX]) {
        assert_eq!(crate::headers::age_value(age), hyper::header::HeaderValue::from(age), "{age}");
    }
}

/// The target goes upstream in origin-form, after the upstream URL's own
/// path (without its trailing `/`); a target that would not stay a path
/// is refused.
#[test]
fn the_upstream_target_is_origin_form_after_the_upstream_s_path() {
    let uri = |upstream: &str, target: &str| {
        crate::forward::upstream_uri(&upstream.parse().unwrap(), target).map(|uri| uri.to_string())
    };
    assert_eq!(uri("http://127.0.0.1:8080", "/a?b=1").as_deref(), Some("/a?b=1"));
    assert_eq!(uri("http://127.0.0.1:8080/", "/a").as_deref(), Some("/a"));
    assert_eq!(uri("http://127.0.0.1:8080/app", "/a?b=1").as_deref(), Some("/app/a?b=1"));
    assert_eq!(uri("http://127.0.0.1:8080/app/", "/a").as_deref(), Some("/app/a"));
    assert_eq!(uri("http://127.0.0.1:8080", "*"), None);
}
