//! The load client's modes (target choice, a new connection per request,
//! the open loop) against a small in-test cluster of HTTP servers that
//! records every request it sees, in arrival order, with the target and the
//! connection it came on.
//!
//! The cluster's servers share one version table (as proxies in front of one
//! application server do), bump a document's version on PUT before
//! answering, and answer GETs with the current version in
//! `X-Tierstack-Deps`: a correct server, so every GET is a checked 2xx.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::{Clock, SystemClock};
use tierstack_loadgen::{
    run, run_with, ArrivalSchedule, Arrivals, LiveSnapshot, LiveStats, LoadConfig, LoadReport, OpenLoop, TargetChoice,
    TargetChooser,
};
use tierstack_workload::Trace;

const INCARNATION: &str = "00000000c0ffee02";
const SEED: u64 = 11;
const CHOICES: [TargetChoice; 3] = [TargetChoice::Fixed, TargetChoice::RoundRobin, TargetChoice::Random];

/// What the cluster does besides answering.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// One request at a time over the whole cluster (a single server thread).
    serial: bool,
    /// The first GET to be served is held this long before its answer.
    stall_first_get: Option<Duration>,
    /// Static content: no `X-Tierstack-Deps`.
    no_deps: bool,
}

/// One request as a server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    target: usize,
    connection: u64,
    method: Method,
    path: String,
}

#[derive(Default)]
struct Log {
    /// Every request, in arrival order.
    seen: Vec<Seen>,
    /// Connections accepted, per target.
    connections: Vec<u64>,
    versions: HashMap<String, u64>,
    gets: u64,
    /// When the stalled GET began to stall (`SystemClock`, the load client's clock).
    stall_began_ns: Option<u64>,
}

struct State {
    log: Mutex<Log>,
    serial: tokio::sync::Mutex<()>,
    behaviour: Behaviour,
    /// Document name → slot, for the header.
    slots: HashMap<String, usize>,
    next_connection: AtomicU64,
}

/// `targets` servers on their own runtime (so a test may block the load
/// client's runtime without stopping the servers).
struct Cluster {
    urls: Vec<String>,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Cluster {
    fn start(trace: &Trace, targets: usize, behaviour: Behaviour) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let state = Arc::new(State {
            log: Mutex::new(Log { connections: vec![0; targets], ..Log::default() }),
            serial: tokio::sync::Mutex::new(()),
            behaviour,
            slots: trace.documents().iter().enumerate().map(|(i, d)| (d.name.clone(), i)).collect(),
            next_connection: AtomicU64::new(0),
        });
        let mut urls = Vec::new();
        for target in 0..targets {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            urls.push(format!("http://{}", listener.local_addr().unwrap()));
            let state = state.clone();
            runtime.spawn(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else { return };
                    let connection = state.next_connection.fetch_add(1, Ordering::Relaxed);
                    state.log.lock().unwrap().connections[target] += 1;
                    let state = state.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| handle(state.clone(), target, connection, req));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        }
        Self { urls, state, runtime: Some(runtime) }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.log.lock().unwrap().seen.clone()
    }

    fn connections(&self) -> Vec<u64> {
        self.state.log.lock().unwrap().connections.clone()
    }

    fn stall_began_ns(&self) -> Option<u64> {
        self.state.log.lock().unwrap().stall_began_ns
    }
}

async fn handle(
    state: Arc<State>,
    target: usize,
    connection: u64,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let _one_at_a_time = if state.behaviour.serial { Some(state.serial.lock().await) } else { None };
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let answer = {
        let mut log = state.log.lock().unwrap();
        log.seen.push(Seen { target, connection, method: method.clone(), path: path.clone() });
        let name = path.strip_prefix("/doc/").unwrap_or_default().to_string();
        match state.slots.get(&name) {
            None => None,
            Some(&slot) => {
                let version = log.versions.entry(name.clone()).or_insert(1);
                if method == Method::PUT {
                    *version += 1;
                }
                let header = format!("n=0;i={INCARNATION};doc/{name}={}@{slot}", *version);
                let mut stall = None;
                if method == Method::GET {
                    if log.gets == 0 {
                        stall = state.behaviour.stall_first_get;
                    }
                    log.gets += 1;
                }
                if stall.is_some() {
                    log.stall_began_ns = Some(SystemClock.now_ns());
                }
                Some((header, stall))
            }
        }
    };
    let Some((header, stall)) = answer else {
        return Ok(Response::builder().status(404).body(Full::new(Bytes::new())).unwrap());
    };
    if let Some(stall) = stall {
        tokio::time::sleep(stall).await;
    }
    let mut response = Response::builder().status(200);
    if !state.behaviour.no_deps {
        response = response.header("x-tierstack-deps", header);
    }
    Ok(response.body(Full::new(Bytes::from_static(b"ok"))).unwrap())
}

fn trace() -> Trace {
    Trace::zipf(0.75, 8).unwrap()
}

/// A request-budget run over `cluster`'s targets, no updates, records kept.
fn config(cluster: &Cluster, trace: Trace, requests: u64) -> LoadConfig {
    let mut c = LoadConfig::new(cluster.urls[0].clone(), trace);
    c.targets = cluster.urls.clone();
    c.connections = 1;
    c.duration_ms = None;
    c.requests_max = Some(requests);
    c.update_interval_ms = 0;
    c.keep_records = true;
    c.seed = SEED;
    c
}

/// The first `n` (target, path) pairs of worker `worker` of `workers`, by the
/// shared rules: one `next()` of the trace stream and of the chooser per request.
fn expected(config: &LoadConfig, worker: usize, n: usize) -> Vec<(usize, String)> {
    let paths: Vec<String> = config.trace.documents().iter().map(|d| d.path()).collect();
    let docs = config.trace.stream(config.seed, worker, config.connections);
    let targets = TargetChooser::new(config.target_choice, config.targets.len(), config.seed, worker);
    targets.zip(docs).take(n).map(|(t, d)| (t, paths[d].clone())).collect()
}

/// Every kept response has the document and target its stream position
/// gives by the shared rules, and each stream's positions have no gaps.
fn assert_records_follow_the_rules(report: &LoadReport, config: &LoadConfig) {
    let log = report.records.as_ref().expect("records kept");
    assert_eq!(log.responses.len() as u64, report.ok, "every response is kept");
    let mut by_stream: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for r in &log.responses {
        by_stream.entry(r.stream as usize).or_default().push(r.position as usize);
    }
    for (stream, positions) in &mut by_stream {
        positions.sort_unstable();
        let n = positions.last().map_or(0, |p| p + 1);
        let want = expected(config, *stream, n);
        for r in log.responses.iter().filter(|r| r.stream as usize == *stream) {
            let (target, path) = &want[r.position as usize];
            assert_eq!((r.target as usize, &log.documents[r.doc as usize]), (*target, path), "{r:?}");
        }
        if report.errors.total() == 0 && report.abandoned == 0 {
            assert_eq!(*positions, (0..n).collect::<Vec<_>>(), "stream {stream}: every position, once");
        }
    }
}

/// With one connection the cluster sees exactly the chooser's targets and
/// the trace stream's paths, in order, each target on one persistent connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_sends_exactly_the_shared_sequence_of_targets_and_paths() {
    for choice in CHOICES {
        let cluster = Cluster::start(&trace(), 3, Behaviour::default());
        let mut c = config(&cluster, trace(), 90);
        c.target_choice = choice;
        let report = run(c.clone()).await.unwrap();
        let want = expected(&c, 0, 90);
        let seen: Vec<(usize, String)> = cluster.seen().into_iter().map(|s| (s.target, s.path)).collect();
        assert_eq!(seen, want, "{choice:?}");

        let used: Vec<u64> = (0..3).map(|t| want.iter().filter(|(w, _)| *w == t).count() as u64).collect();
        match choice {
            TargetChoice::Fixed => assert_eq!(used, [90, 0, 0]),
            TargetChoice::RoundRobin => assert_eq!(used, [30, 30, 30]),
            TargetChoice::Random => assert!(used.iter().all(|&n| n > 0), "{used:?}"),
        }
        let opened: Vec<u64> = used.iter().map(|&n| u64::from(n > 0)).collect();
        assert_eq!(cluster.connections(), opened, "{choice:?}: one persistent connection per target used");
        let per_target: Vec<(u64, u64)> =
            report.per_target.iter().map(|t| (t.requests, t.connections_opened)).collect();
        assert_eq!(per_target, used.iter().zip(&opened).map(|(&u, &o)| (u, o)).collect::<Vec<_>>());
        assert_eq!(report.connections_opened, opened.iter().sum::<u64>());
        assert_eq!((report.requests, report.checked_ok, report.issued, report.abandoned), (90, 90, 90, 0));
        assert!(report.accounted(), "{choice:?}");
        assert_records_follow_the_rules(&report, &c);
        let table = report.summary_table();
        assert!(table.contains(&format!("target {}", cluster.urls[0])), "{table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_per_request_opens_exactly_one_connection_per_request() {
    // One worker: still exactly the shared sequence, each on its own connection.
    let cluster = Cluster::start(&trace(), 2, Behaviour::default());
    let mut c = config(&cluster, trace(), 40);
    c.target_choice = TargetChoice::RoundRobin;
    c.new_connection_per_request = true;
    let report = run(c.clone()).await.unwrap();
    let seen = cluster.seen();
    let pairs: Vec<(usize, String)> = seen.iter().map(|s| (s.target, s.path.clone())).collect();
    assert_eq!(pairs, expected(&c, 0, 40));
    let distinct: HashSet<u64> = seen.iter().map(|s| s.connection).collect();
    assert_eq!(distinct.len(), 40, "no connection carried two requests");
    assert_eq!(cluster.connections(), [20, 20]);
    assert_eq!(report.connections_opened, 40);
    assert!(
        report.per_target.iter().all(|t| (t.requests, t.connections_opened) == (20, 20)),
        "{:?}",
        report.per_target
    );
    assert!(report.accounted());

    // Several workers, random targets.
    let cluster = Cluster::start(&trace(), 2, Behaviour::default());
    let mut c = config(&cluster, trace(), 60);
    (c.connections, c.target_choice, c.new_connection_per_request) = (3, TargetChoice::Random, true);
    let report = run(c.clone()).await.unwrap();
    assert_eq!(cluster.connections().iter().sum::<u64>(), 60);
    assert_eq!(cluster.seen().iter().map(|s| s.connection).collect::<HashSet<_>>().len(), 60);
    assert_eq!((report.requests, report.connections_opened), (60, 60));
    assert!(report.accounted());
    assert_records_follow_the_rules(&report, &c);

    // The open loop too.
    let cluster = Cluster::start(&trace(), 2, Behaviour::default());
    let mut c = config(&cluster, trace(), 50);
    c.new_connection_per_request = true;
    c.open_loop = Some(OpenLoop { rate_rps: 500.0, arrivals: Arrivals::Constant, max_in_flight: 64 });
    let report = run(c).await.unwrap();
    assert_eq!(cluster.seen().iter().map(|s| s.connection).collect::<HashSet<_>>().len(), 50);
    assert_eq!((report.requests, report.connections_opened), (50, 50));
    assert!(report.accounted());

    // Against that: persistent connections, two workers, two targets in
    // turn: each worker opens one connection per target it used, once.
    // (The workers share the budget, so how it splits is up to timing.)
    let cluster = Cluster::start(&trace(), 2, Behaviour::default());
    let mut c = config(&cluster, trace(), 40);
    (c.connections, c.target_choice) = (2, TargetChoice::RoundRobin);
    let report = run(c).await.unwrap();
    let log = report.records.as_ref().unwrap();
    let used: u64 = (0..2).map(|w| log.responses.iter().filter(|r| r.stream == w).count().min(2) as u64).sum();
    assert_eq!(cluster.connections().iter().sum::<u64>(), used);
    assert_eq!(report.connections_opened, used);
    assert!(used <= 4 && report.requests == 40);
    assert!(report.accounted());
}

/// The schedule points strictly before `horizon_ns`.
fn points_before(arrivals: Arrivals, rate_rps: f64, horizon_ns: u64) -> Vec<u64> {
    ArrivalSchedule::new(arrivals, rate_rps, SEED).take_while(|&t| t < horizon_ns).collect()
}

/// Each kept response's scheduled time, from the schedule and its stream position.
fn scheduled_times(report: &LoadReport, open: &OpenLoop, streams: usize) -> Vec<(u64, u64, u64)> {
    let log = report.records.as_ref().unwrap();
    let n = log.responses.iter().map(|r| r.position as usize * streams + r.stream as usize + 1).max().unwrap_or(0);
    let schedule: Vec<u64> = ArrivalSchedule::new(open.arrivals, open.rate_rps, SEED).take(n).collect();
    log.responses
        .iter()
        .map(|r| (report.start_ns + schedule[r.position as usize * streams + r.stream as usize], r.start_ns, r.end_ns))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_loop_issues_exactly_the_requests_scheduled_before_its_end() {
    assert_eq!(points_before(Arrivals::Constant, 400.0, 400_000_000).len(), 159, "t_k = (k+1) * 2.5 ms < 400 ms");
    for arrivals in [Arrivals::Constant, Arrivals::Poisson] {
        let cluster = Cluster::start(&trace(), 2, Behaviour::default());
        let mut c = config(&cluster, trace(), 0);
        let open = OpenLoop { rate_rps: 400.0, arrivals, max_in_flight: 256 };
        (c.requests_max, c.duration_ms, c.open_loop) = (None, Some(400), Some(open));
        (c.connections, c.target_choice) = (3, TargetChoice::Random);
        let report = run(c.clone()).await.unwrap();
        let due = points_before(arrivals, 400.0, 400_000_000).len() as u64;
        assert_eq!(report.issued, due, "{arrivals:?}");
        assert_eq!(report.requests + report.abandoned, due);
        assert_eq!(report.errors.total(), 0, "{:?}", report.errors);
        assert!(report.accounted());
        assert!(cluster.seen().len() as u64 >= report.requests, "the servers answered every counted request");
        assert_records_follow_the_rules(&report, &c);

        // Never sent before its time; latency counted from its time, exactly.
        let times = scheduled_times(&report, &open, 3);
        assert!(times.iter().all(|&(due, sent, _)| sent >= due), "a request left early");
        let longest = times.iter().map(|&(due, _, end)| end - due).max().unwrap();
        assert_eq!(report.latency.max_ns, longest, "latency runs from the scheduled time");
        let summary = report.shape.open_loop.as_ref().unwrap();
        assert_eq!((summary.streams, summary.arrivals), (3, arrivals));
    }

    // With a request budget and no duration: exactly the budget, all ended.
    let cluster = Cluster::start(&trace(), 1, Behaviour::default());
    let mut c = config(&cluster, trace(), 50);
    c.open_loop = Some(OpenLoop::new(1000.0));
    let report = run(c).await.unwrap();
    assert_eq!((report.issued, report.requests, report.abandoned, report.checked_ok), (50, 50, 0, 50));
    assert_eq!(cluster.seen().len(), 50);
    assert!(report.accounted());
}

/// A server that stalls once (and serves one request at a time): in the
/// open loop every request due during the stall waits for it, and its
/// latency, counted from its scheduled time, says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_includes_the_wait_behind_a_stalled_request() {
    let stall = Duration::from_millis(300);
    let cluster = Cluster::start(&trace(), 1, Behaviour { serial: true, stall_first_get: Some(stall), no_deps: false });
    let mut c = config(&cluster, trace(), 60);
    let open = OpenLoop { rate_rps: 100.0, arrivals: Arrivals::Constant, max_in_flight: 1000 };
    c.open_loop = Some(open);
    let report = run(c).await.unwrap();
    assert_eq!((report.requests, report.checked_ok), (60, 60));
    assert!(report.accounted());

    let began = cluster.stall_began_ns().expect("the server stalled");
    let stall_ns = stall.as_nanos() as u64;
    let times = scheduled_times(&report, &open, 1);
    // Every request due during the stall ended after it (the server is serial) …
    let behind: Vec<_> = times.iter().filter(|&&(due, _, _)| due >= began && due < began + stall_ns).collect();
    assert!(behind.iter().all(|&&(_, _, end)| end >= began + stall_ns));
    // … so those due in its first half waited at least half of it. They are
    // well over a tenth of the requests (15 of 60 at 10 ms apart), so the
    // reported p90 is at least half the stall (within the histogram's 1/64).
    let half = stall_ns / 2;
    let waited_half = times.iter().filter(|&&(due, _, _)| due >= began && due <= began + half).count();
    assert!(waited_half as u64 * 10 > report.latency.count, "precondition: {waited_half} of {}", report.latency.count);
    assert!(report.latency.p90_ns >= half - half / 64, "p90 {} ns", report.latency.p90_ns);
    assert!(report.latency.max_ns >= stall_ns);
}

/// A client that falls behind its schedule (here: its runtime blocked) is
/// charged for it: latency runs from the scheduled time, not the send.
#[tokio::test(flavor = "current_thread")]
async fn open_loop_latency_includes_the_clients_own_lateness() {
    let block = Duration::from_millis(300);
    let cluster = Cluster::start(&trace(), 1, Behaviour::default());
    let mut c = config(&cluster, trace(), 100);
    let open = OpenLoop { rate_rps: 100.0, arrivals: Arrivals::Constant, max_in_flight: 1000 };
    c.open_loop = Some(open);
    let live = Arc::new(LiveStats::default());
    let watcher = live.clone();
    // Once 10 requests are done, block the client's only runtime thread.
    let blocker = tokio::spawn(async move {
        while watcher.snapshot().requests < 10 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let began = SystemClock.now_ns();
        std::thread::sleep(block);
        (began, SystemClock.now_ns())
    });
    let report = run_with(c, live, std::future::pending()).await.unwrap();
    let (began, ended) = blocker.await.unwrap();
    assert_eq!((report.requests, report.checked_ok), (100, 100));
    assert!(report.accounted());

    // Requests due while the client was blocked were sent after it, late by
    // at least (end of the block - their time); their latency includes that.
    let times = scheduled_times(&report, &open, 1);
    let late: Vec<_> = times.iter().filter(|&&(due, _, _)| due >= began && due < ended).collect();
    assert!(!late.is_empty(), "precondition: some requests were due during the block");
    assert!(late.iter().all(|&&(_, sent, _)| sent >= ended));
    let owed = late.iter().map(|&&(due, _, _)| ended - due).max().unwrap();
    assert!(report.latency.max_ns >= owed, "max {} < {owed}", report.latency.max_ns);
    let lag = report.shape.open_loop.as_ref().unwrap().max_dispatch_lag_ns;
    assert!(lag >= owed, "dispatch lag {lag} < {owed}");
    let longest = times.iter().map(|&(due, _, end)| end - due).max().unwrap();
    assert_eq!(report.latency.max_ns, longest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_max_in_flight_are_counted_not_skipped() {
    // The first GET is held 300 ms and the server is serial, so nothing
    // completes before 305 ms; the 20 requests are due by 100 ms (5 ms
    // apart). The first 3 go out, the other 17 find 3 in flight.
    let cluster = Cluster::start(
        &trace(),
        1,
        Behaviour { serial: true, stall_first_get: Some(Duration::from_millis(300)), no_deps: false },
    );
    let mut c = config(&cluster, trace(), 20);
    c.open_loop = Some(OpenLoop { rate_rps: 200.0, arrivals: Arrivals::Constant, max_in_flight: 3 });
    let report = run(c).await.unwrap();
    assert_eq!(report.errors.over_max_in_flight, 17, "{:?}", report.errors);
    assert_eq!((report.issued, report.requests, report.checked_ok), (20, 20, 3));
    assert_eq!(report.per_target[0].requests, 20);
    assert!(report.accounted());
    assert!(report.summary_table().contains("over max in flight 17"), "{}", report.summary_table());
    assert_eq!(cluster.seen().len(), 3, "refused requests are never sent");

    // A dead target: every scheduled request is a counted connect error.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut c = LoadConfig::new(format!("http://127.0.0.1:{}", reserved.local_addr().unwrap().port()), trace());
    (c.duration_ms, c.requests_max, c.update_interval_ms) = (None, Some(20), 0);
    c.open_loop = Some(OpenLoop::new(400.0));
    let report = run(c).await.unwrap();
    assert_eq!((report.requests, report.errors.connect, report.connections_opened), (20, 20, 0));
    assert!(report.accounted());
}

/// Runs until `done(live)` holds (checked every 5 ms), bounded by `cap_ms`.
async fn run_until(
    mut config: LoadConfig,
    cap_ms: u64,
    done: impl Fn(&LiveSnapshot) -> bool + Send + 'static,
) -> LoadReport {
    config.duration_ms = Some(cap_ms);
    config.requests_max = None;
    let live = Arc::new(LiveStats::default());
    let watcher = live.clone();
    let condition: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
        while !done(&watcher.snapshot()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    run_with(config, live, condition).await.unwrap()
}

/// Every mode, with the updater running: the strict accounting holds, no
/// response is stale, and every response followed the shared rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_keeps_the_accounting_and_the_updates_checked() {
    for open_loop in [None, Some(OpenLoop { rate_rps: 2000.0, arrivals: Arrivals::Poisson, max_in_flight: 512 })] {
        for new_connection_per_request in [false, true] {
            for choice in CHOICES {
                let mode = format!("{open_loop:?} new connection {new_connection_per_request} {choice:?}");
                let cluster = Cluster::start(&trace(), 2, Behaviour::default());
                let mut c = config(&cluster, trace(), 0);
                (c.open_loop, c.new_connection_per_request, c.target_choice) =
                    (open_loop, new_connection_per_request, choice);
                (c.connections, c.update_interval_ms) = (3, 20);
                let report = run_until(c.clone(), 60_000, |l| l.updates >= 3 && l.ok >= 150).await;
                assert!(report.accounted(), "{mode}: {report:#?}");
                assert_eq!(report.errors.total(), 0, "{mode}: {:?}", report.errors);
                assert!(report.updates.done >= 3 && report.ok >= 150, "{mode}");
                assert_eq!(report.updates.done, report.updates.attempted, "{mode}");
                assert_eq!((report.stale_responses, report.stale_responses_offline), (0, Some(0)), "{mode}");
                let puts = cluster.seen().iter().filter(|s| s.method == Method::PUT).count() as u64;
                assert_eq!(puts, report.updates.done, "{mode}");
                assert_records_follow_the_rules(&report, &c);
                if !new_connection_per_request {
                    if open_loop.is_none() {
                        assert!(report.connections_opened <= 3 * 2, "{mode}: one per worker and target at most");
                    } else {
                        // At 2000 req/s against a server that answers at once,
                        // not every one of 150 requests overlapped another:
                        // some reused an idle pooled connection.
                        assert!(report.connections_opened < report.requests, "{mode}: the pool reuses connections");
                    }
                }
                if new_connection_per_request {
                    // The updater's one persistent connection, and one per
                    // request (a request abandoned at the stop may have
                    // connected without sending).
                    let gets = cluster.seen().iter().filter(|s| s.method == Method::GET).count() as u64;
                    let accepted = cluster.connections().iter().sum::<u64>();
                    assert!(
                        (gets + 1..=gets + 1 + report.abandoned).contains(&accepted),
                        "{mode}: {accepted} for {gets}"
                    );
                    assert_eq!(report.connections_opened, report.requests, "{mode}");
                }
                let json = serde_json::to_value(&report).unwrap();
                assert_eq!(json["per_target"].as_array().unwrap().len(), 2, "{mode}");
                assert!(json["connections_opened"].as_u64().is_some(), "{mode}");
            }
        }
    }
}

#[tokio::test]
async fn invalid_open_loops_are_errors() {
    for (rate_rps, max_in_flight) in [(0.0, 8), (-1.0, 8), (f64::NAN, 8), (f64::INFINITY, 8), (10.0, 0)] {
        let mut c = LoadConfig::new("http://127.0.0.1:1", trace());
        c.open_loop = Some(OpenLoop { rate_rps, arrivals: Arrivals::Poisson, max_in_flight });
        let result = run(c).await;
        assert!(matches!(result, Err(tierstack_loadgen::LoadError::InvalidConfig(_))), "{rate_rps} {max_in_flight}");
    }
}

/// Static content (no dependency header): accepted as checked with
/// `static_content`, each a `missing_deps` error without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_content_is_accepted_only_when_declared() {
    let behaviour = Behaviour { no_deps: true, ..Behaviour::default() };
    for static_content in [true, false] {
        let cluster = Cluster::start(&trace(), 2, behaviour);
        let mut c = config(&cluster, trace(), 50);
        (c.static_content, c.target_choice, c.new_connection_per_request) =
            (static_content, TargetChoice::Random, true);
        c.open_loop = Some(OpenLoop::new(1000.0));
        let report = run(c).await.unwrap();
        let want = if static_content { (50, 0) } else { (0, 50) };
        assert_eq!((report.checked_ok, report.errors.missing_deps), want, "static {static_content}");
        assert_eq!((report.requests, report.ok, report.errors.total()), (50, 50, want.1));
        assert!(report.accounted());
        assert_eq!(report.shape.static_content, static_content);
    }
    let mut c = LoadConfig::new("http://127.0.0.1:1", trace());
    (c.static_content, c.update_interval_ms) = (true, 1000);
    assert!(
        matches!(run(c).await, Err(tierstack_loadgen::LoadError::InvalidConfig(_))),
        "static content takes no updates"
    );
}
