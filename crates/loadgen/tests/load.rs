//! The load client against a tiny in-test HTTP server that implements the
//! header contract — correctly, or deliberately wrongly.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_loadgen::body::contract_body;
use tierstack_loadgen::{run, run_with, LiveStats, LoadConfig, LoadReport};
use tierstack_workload::Trace;
use tokio::net::TcpListener;

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Versions bumped before the PUT is answered; GETs read them under the lock.
    Correct,
    /// After a PUT returns, keep serving the old version for `lag` more GETs of that document.
    StaleAfterPut { lag: u64 },
    /// 200 without `X-Tierstack-Deps`.
    NoDeps,
    /// 200 with a header that breaks the contract.
    MalformedDeps,
    /// Every GET answers 500.
    Status500,
    /// Correct versions, but every body is spliced: the served version's
    /// first line, the previous version's content.
    SplicedBody,
    /// The body is of another version than the header's.
    BodyOfAnotherVersion,
    /// The header names another key instead of the document's.
    WrongKey,
}

#[derive(Default)]
struct Doc {
    version: u64,
    /// What GETs serve (== version unless lagging).
    served: u64,
    lag_left: u64,
}

struct State {
    mode: Mode,
    /// Each document also depends on this shared key, when set.
    shared_key: Option<&'static str>,
    shared_version: u64,
    docs: HashMap<String, Doc>,
    sizes: HashMap<String, usize>,
    gets: u64,
    puts: u64,
    /// Bodies by (document, version, kind): generating and hashing a 1 MiB
    /// body per GET would make a debug build's server the bottleneck.
    bodies: HashMap<(String, u64, u8), Bytes>,
}

struct TestServer {
    url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const INCARNATION: &str = "00000000c0ffee01";

fn header(state: &State, name: &str, version: u64) -> String {
    let slot = state.sizes.keys().filter(|k| k.as_str() < name).count();
    let mut h = format!("n=0;i={INCARNATION};doc/{name}={version}@{slot}");
    if let Some(k) = state.shared_key {
        h.push_str(&format!(",{k}={}@999", state.shared_version));
    }
    h
}

async fn handle(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let mut st = state.lock().unwrap();
    let Some(name) = path.strip_prefix("/doc/").map(str::to_string) else {
        return Ok(Response::builder().status(404).body(Full::new(Bytes::new())).unwrap());
    };
    let Some(&size) = st.sizes.get(&name) else {
        return Ok(Response::builder().status(404).body(Full::new(Bytes::from_static(b"no such document"))).unwrap());
    };
    let mode = st.mode;
    match *req.method() {
        Method::GET => {
            st.gets += 1;
            if let Mode::Status500 = mode {
                return Ok(Response::builder().status(500).body(Full::new(Bytes::new())).unwrap());
            }
            let doc = st.docs.entry(name.clone()).or_insert(Doc { version: 1, served: 1, lag_left: 0 });
            if doc.lag_left > 0 {
                doc.lag_left -= 1;
            } else {
                doc.served = doc.version;
            }
            let served = doc.served;
            let mut resp = Response::builder().status(200).header("x-cache", "MISS");
            match mode {
                Mode::NoDeps => {}
                Mode::MalformedDeps => resp = resp.header("x-tierstack-deps", format!("doc/{name}=notanumber")),
                Mode::WrongKey => {
                    resp = resp.header("x-tierstack-deps", format!("n=0;i={INCARNATION};other/{name}={served}@0"))
                }
                _ => resp = resp.header("x-tierstack-deps", header(&st, &name, served)),
            }
            let kind = match mode {
                Mode::SplicedBody => 1,
                Mode::BodyOfAnotherVersion => 2,
                _ => 0,
            };
            let body = st
                .bodies
                .entry((name.clone(), served, kind))
                .or_insert_with(|| {
                    let body = match mode {
                        Mode::SplicedBody => {
                            let (now, other) =
                                (contract_body(&name, served, size), contract_body(&name, served + 1, size));
                            let cut = now.iter().position(|&b| b == b'\n').unwrap() + 1;
                            [&now[..cut], &other[cut..]].concat()
                        }
                        Mode::BodyOfAnotherVersion => contract_body(&name, served + 1, size),
                        _ => contract_body(&name, served, size),
                    };
                    Bytes::from(body)
                })
                .clone();
            Ok(resp.body(Full::new(body)).unwrap())
        }
        Method::PUT | Method::POST => {
            st.puts += 1;
            st.shared_version += 1;
            let doc = st.docs.entry(name.clone()).or_insert(Doc { version: 1, served: 1, lag_left: 0 });
            doc.version += 1;
            match mode {
                Mode::StaleAfterPut { lag } => doc.lag_left = lag,
                _ => doc.served = doc.version,
            }
            let version = doc.version;
            let h = header(&st, &name, version);
            Ok(Response::builder().status(200).header("x-tierstack-deps", h).body(Full::new(Bytes::new())).unwrap())
        }
        _ => Ok(Response::builder().status(405).body(Full::new(Bytes::new())).unwrap()),
    }
}

async fn serve(trace: &Trace, mode: Mode, shared_key: Option<&'static str>) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Mutex::new(State {
        mode,
        shared_key,
        shared_version: 1,
        docs: HashMap::new(),
        sizes: trace.documents().iter().map(|d| (d.name.clone(), d.size_bytes as usize)).collect(),
        gets: 0,
        puts: 0,
        bodies: HashMap::new(),
    }));
    let st = state.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let st = st.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(st.clone(), req));
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    TestServer { url, state, task }
}

/// Runs until `done(live)` holds (checked every 10 ms), with `cap_ms` as
/// the bound on the run.
async fn run_until(
    mut config: LoadConfig,
    cap_ms: u64,
    done: impl Fn(&tierstack_loadgen::LiveSnapshot) -> bool + Send + 'static,
) -> LoadReport {
    config.duration_ms = Some(cap_ms);
    let live = Arc::new(LiveStats::default());
    let watcher = live.clone();
    let condition: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
        while !done(&watcher.snapshot()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    run_with(config, live, condition).await.unwrap()
}

fn config(target: &str, trace: Trace) -> LoadConfig {
    let mut c = LoadConfig::new(target, trace);
    c.check_bodies = true;
    c.connections = 4;
    c.update_interval_ms = 20;
    c.keep_records = true;
    c.seed = 9;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correct_server_has_no_stale_responses_under_concurrent_updates() {
    let trace = Trace::zipf(0.75, 5).unwrap();
    let server = serve(&trace, Mode::Correct, None).await;
    let report = run_until(config(&server.url, trace.clone()), 60_000, |l| l.updates >= 10 && l.ok >= 2000).await;

    // The client recorded responses …
    assert!(report.ok >= 2000, "{report:#?}");
    assert_eq!(report.requests, report.ok);
    assert_eq!(report.errors.total(), 0, "{:?}", report.errors);
    assert_eq!(report.checked_responses, report.ok);
    assert_eq!((report.checked_ok, report.bodies_checked), (report.ok, report.ok), "every body was verified");
    assert!(report.accounted());
    assert!(report.latency.p50_ns > 0 && report.latency.p99_ns >= report.latency.p50_ns);
    assert_eq!(report.hit_rate, Some(0.0), "the test server always says MISS");
    // … the updater updated, and the server saw every update …
    assert!(report.updates.done >= 10);
    assert_eq!(report.updates.done, report.updates.attempted);
    let (gets, puts) = {
        let st = server.state.lock().unwrap();
        (st.gets, st.puts)
    };
    assert_eq!(puts, report.updates.done);
    assert!(gets >= report.requests, "the server answered at least every recorded request");
    // … and nothing was stale, by both checkers.
    assert_eq!(report.stale_responses, 0, "{:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0));

    // The records: versions the responses carried really moved.
    let log = report.records.as_ref().unwrap();
    assert_eq!(log.responses.len() as u64, report.ok);
    assert_eq!(log.updates.len() as u64, report.updates.done);
    let max_served = log.responses.iter().flat_map(|r| r.deps.iter()).map(|(_, s)| s.version).max().unwrap();
    assert!(max_served > 1, "responses must carry updated versions");
    let sizes: HashMap<u32, u64> = (0..5).map(|i| (i, trace.documents()[i as usize].size_bytes)).collect();
    assert!(log.responses.iter().all(|r| r.bytes == sizes[&r.doc]), "bodies are counted in full");
    let mut jsonl = Vec::new();
    log.write_jsonl(&mut jsonl).unwrap();
    assert_eq!(jsonl.iter().filter(|&&b| b == b'\n').count(), log.responses.len() + log.updates.len());
    // The per-second series adds up.
    assert_eq!(report.series.iter().map(|p| p.ok).sum::<u64>(), report.ok);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["stale_responses"], 0);
    assert!(json.get("records").is_none(), "records are not serialized into the report");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_a_server_that_serves_old_versions_after_an_update() {
    let trace = Trace::single();
    let server = serve(&trace, Mode::StaleAfterPut { lag: 200 }, None).await;
    let report = run_until(config(&server.url, trace), 60_000, |l| l.stale >= 50 && l.updates >= 2).await;
    assert!(report.stale_responses >= 50, "{report:#?}");
    assert_eq!(report.stale_responses_offline, Some(report.stale_responses), "online and offline checkers agree");
    let ex = &report.stale_examples[0];
    assert_eq!((ex.path.as_str(), ex.key.as_str()), ("/doc/single", "doc/single"));
    assert!(ex.newer_version > ex.served_version);
    assert!(ex.update_end_ns < ex.response_start_ns);
    // Each update makes at most `lag` responses stale (those served late).
    assert!(report.stale_responses <= 200 * report.updates.done);
    assert!(report.summary_table().contains("stale responses"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_dependencies_are_checked_per_key() {
    // Every document also depends on `shared/config`, which every update bumps:
    // responses carry two keys, updates produce two versions.
    let trace = Trace::zipf(0.5, 4).unwrap();
    let server = serve(&trace, Mode::Correct, Some("shared/config")).await;
    let report = run_until(config(&server.url, trace), 60_000, |l| l.updates >= 5 && l.ok >= 1000).await;
    assert_eq!(report.stale_responses, 0, "{:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0));
    let log = report.records.unwrap();
    assert!(log.responses.iter().all(|r| r.deps.iter().count() == 2));
    assert!(log.updates.iter().all(|u| u.deps.iter().count() == 2));
    assert!(log.keys.get("shared/config").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_budget_and_multiple_targets() {
    let trace = Trace::zipf(0.75, 3).unwrap();
    let a = serve(&trace, Mode::Correct, None).await;
    let b = serve(&trace, Mode::Correct, None).await;
    let mut c = config(&a.url, trace);
    c.targets.push(b.url.clone());
    c.update_target = Some(a.url.clone());
    c.duration_ms = None;
    c.requests_max = Some(600);
    c.update_interval_ms = 0;
    let report = run(c).await.unwrap();
    assert_eq!(report.requests, 600, "stops at exactly the request budget");
    assert_eq!(report.updates.attempted, 0, "updates disabled");
    let (ga, gb) = (a.state.lock().unwrap().gets, b.state.lock().unwrap().gets);
    assert_eq!(ga + gb, 600);
    assert!(ga > 0 && gb > 0, "connections spread over both targets: {ga} + {gb}");
}

async fn short_run(url: &str, trace: Trace) -> LoadReport {
    let mut c = config(url, trace);
    c.duration_ms = None;
    c.requests_max = Some(200);
    c.update_interval_ms = 0;
    run(c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_responses_are_counted_not_fatal() {
    let trace = Trace::single();
    let s = serve(&trace, Mode::NoDeps, None).await;
    let r = short_run(&s.url, trace.clone()).await;
    assert_eq!((r.ok, r.errors.missing_deps, r.checked_responses), (200, 200, 0));
    assert!(r.accounted());

    let s = serve(&trace, Mode::MalformedDeps, None).await;
    let r = short_run(&s.url, trace.clone()).await;
    assert_eq!((r.ok, r.errors.malformed_deps, r.checked_responses), (200, 200, 0));
    assert!(r.accounted() && !r.check_error_examples.is_empty());

    let s = serve(&trace, Mode::Status500, None).await;
    let r = short_run(&s.url, trace.clone()).await;
    assert_eq!((r.requests, r.ok, r.errors.status_5xx), (200, 0, 200));
    assert!(r.accounted());

    // A document the server does not have: 404s, counted.
    let other = Trace::zipf(1.0, 2).unwrap();
    let s = serve(&trace, Mode::Correct, None).await;
    let r = short_run(&s.url, other).await;
    assert_eq!((r.requests, r.errors.status_4xx), (200, 200));
    assert!(r.accounted());
}

/// Bodies that disagree with their header are caught and counted as their
/// own categories — and only when body checking is on: against a
/// third-party service, only the header contract applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_disagree_with_the_header_are_counted() {
    let trace = Trace::zipf(0.75, 3).unwrap();
    for (mode, wrong_key, mismatch) in
        [(Mode::SplicedBody, 0, 200), (Mode::BodyOfAnotherVersion, 0, 200), (Mode::WrongKey, 200, 0)]
    {
        let s = serve(&trace, mode, None).await;
        let r = short_run(&s.url, trace.clone()).await;
        assert_eq!((r.ok, r.checked_ok, r.checked_responses), (200, 0, 0), "{mode:?}");
        assert_eq!((r.errors.deps_wrong_key, r.errors.body_mismatch), (wrong_key, mismatch), "{mode:?}");
        assert_eq!(r.errors.total(), 200, "{mode:?}: {:?}", r.errors);
        assert!(r.accounted(), "{mode:?}");
        assert!(!r.check_error_examples.is_empty(), "{mode:?}");

        let mut unchecked = config(&s.url, trace.clone());
        (unchecked.check_bodies, unchecked.duration_ms, unchecked.requests_max) = (false, None, Some(200));
        unchecked.update_interval_ms = 0;
        let r = run(unchecked).await.unwrap();
        assert_eq!((r.checked_ok, r.bodies_checked, r.errors.total()), (200, 0, 0), "{mode:?}, bodies not checked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_counts_connect_errors() {
    // Bound but never listening: the port stays ours, and connecting is refused.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = reserved.local_addr().unwrap().port();
    let mut c = config(&format!("http://127.0.0.1:{port}"), Trace::single());
    c.duration_ms = Some(300);
    let r = run(c).await.unwrap();
    assert!(r.errors.connect > 0);
    assert_eq!((r.requests, r.ok, r.checked_ok), (r.errors.connect, 0, 0), "each failed connect is a failed request");
    assert!(r.accounted());
    assert!(r.updates.errors.connect > 0 || r.updates.attempted == 0);
    assert_eq!(r.stale_responses, 0);
}

#[tokio::test]
async fn invalid_configurations_are_errors() {
    let mut c = LoadConfig::new("ftp://x", Trace::single());
    assert!(matches!(run(c.clone()).await, Err(tierstack_loadgen::LoadError::InvalidUrl { .. })));
    c.targets = vec!["http://127.0.0.1:1".into()];
    c.connections = 0;
    assert!(matches!(run(c.clone()).await, Err(tierstack_loadgen::LoadError::InvalidConfig(_))));
    c.connections = 1;
    c.duration_ms = None;
    c.requests_max = None;
    assert!(matches!(run(c).await, Err(tierstack_loadgen::LoadError::InvalidConfig(_))));
}
