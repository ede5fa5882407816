//! `/metrics` of the tiers as real processes: `app-module`, `app-server`,
//! `press-node` and `coop-node` on `--metrics-listen`, `origin` on its
//! admin listener. Each exposition passes `tierstack_testkit::metrics::check`
//! (prometheus-parse, promtool, our conventions), its key series are there,
//! and they move under a little load: a counter rises by exactly the
//! requests sent, a histogram's count by the updates done, a queue-depth
//! gauge shows a request queued behind a held update. `/readyz` is 200 once
//! each serves.
//!
//! The module's queues are driven without timing: the test holds an update
//! grant itself (speaking the module's socket protocol), so a read sent
//! through the application server must queue behind it until the test
//! sends UPDATE_DONE.

use crate::exe;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{proxy_args, strings};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_testkit::http;
use tierstack_testkit::metrics::{self, Metrics};
use tierstack_workload::TraceSpec;

/// How long a condition polled on a scrape may take to hold.
const BOUND: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(10);

/// One checked scrape of `/metrics` at `addr`.
fn scrape(addr: SocketAddr) -> Metrics {
    let response = http::get(addr, "/metrics").unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some(tierstack_stats::exposition::CONTENT_TYPE));
    metrics::check(&response.text()).unwrap_or_else(|e| panic!("{addr}/metrics: {e}\n{}", response.text()))
}

/// Scrapes until `done` holds (bounded); returns that scrape.
fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = instant_now() + BOUND;
    loop {
        let scraped = scrape(addr);
        if done(&scraped) {
            return scraped;
        }
        assert!(instant_now() < deadline, "{what}: never held in\n{}", scraped.text);
        std::thread::sleep(POLL);
    }
}

/// `/healthz` 200 and, once the command has set its serving flag, `/readyz` 200.
fn assert_ready(addr: SocketAddr) {
    assert_eq!(http::get(addr, "/healthz").unwrap().status, 200);
    let deadline = instant_now() + BOUND;
    while http::get(addr, "/readyz").unwrap().status != 200 {
        assert!(instant_now() < deadline, "{addr}/readyz never 200");
        std::thread::sleep(POLL);
    }
}

fn value(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    m.value(name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{}", m.text))
}

fn assert_families(m: &Metrics, names: &[&str]) {
    let families = m.families();
    for name in names {
        assert!(families.contains(*name), "no family {name} in\n{}", m.text);
    }
}

/// A raw connection to the module's socket: the test's own grants.
struct ModuleConnection(BufReader<UnixStream>);

impl ModuleConnection {
    fn connect(socket: &Path) -> ModuleConnection {
        ModuleConnection(BufReader::new(UnixStream::connect(socket).unwrap()))
    }

    /// Sends one request line and returns the reply's `op`.
    fn call(&mut self, line: &str) -> String {
        self.0.get_mut().write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        self.0.read_line(&mut reply).unwrap();
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        reply["op"].as_str().unwrap().to_string()
    }
}

#[test]
fn metrics_of_the_module_and_the_app_server_move_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [NodeLine { id: 0, role: "app", cpu: None }];
    let topology = write_topology(dir.path(), "metrics-app", Backend::Shm, 1000, &nodes).unwrap();
    let socket = dir.path().join("module.sock");
    let (module_metrics, server_metrics) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let _module = ChildNode::spawn(
        &exe(),
        &strings(&[
            "app-module",
            "--topology",
            topology.to_str().unwrap(),
            "--node",
            "0",
            "--socket",
            socket.to_str().unwrap(),
            "--metrics-listen",
            &module_metrics.to_string(),
        ]),
    )
    .unwrap();
    assert_ready(module_metrics);
    let before = scrape(module_metrics);
    assert_families(
        &before,
        &[
            "tierstack_module_reads_granted_total",
            "tierstack_module_updates_granted_total",
            "tierstack_module_requests_queued_total",
            "tierstack_module_requests_refused_total",
            "tierstack_module_grants_revoked_total",
            "tierstack_module_pages_published_total",
            "tierstack_module_connections_open",
            "tierstack_module_queue_depth",
            "tierstack_module_update_seconds",
            "process_cpu_seconds_total",
        ],
    );
    assert_eq!(value(&before, "tierstack_module_update_seconds_count", &[]), 0.0);

    let documents = dir.path().join("docs.txt");
    std::fs::write(&documents, "a 300\nb 300\n").unwrap();
    let listen = free_loopback_port().unwrap();
    let _server = ChildNode::spawn(
        &exe(),
        &strings(&[
            "app-server",
            "--listen",
            &listen.to_string(),
            "--module-socket",
            socket.to_str().unwrap(),
            "--documents",
            &format!("file:{}", documents.display()),
            "--publish-load",
            "--metrics-listen",
            &server_metrics.to_string(),
        ]),
    )
    .unwrap();
    assert_ready(server_metrics);
    // A proxy forwards client paths to the server: its client listener must not answer them.
    assert_eq!(http::get(listen, "/metrics").unwrap().status, 404);
    let server_before = scrape(server_metrics);
    assert_families(
        &server_before,
        &[
            "tierstack_appserver_requests_total",
            "tierstack_appserver_read_grant_seconds",
            "tierstack_appserver_update_grant_seconds",
            "tierstack_appserver_in_flight_requests",
            "tierstack_appserver_queue_length",
            "tierstack_appserver_open_connections",
            "tierstack_appserver_running_threads",
        ],
    );

    // Load: 5 reads, 2 updates, one unknown document.
    for doc in ["a", "b", "a", "b", "a"] {
        assert_eq!(http::get(listen, &format!("/doc/{doc}")).unwrap().status, 200);
    }
    for doc in ["a", "b"] {
        assert_eq!(http::request(listen, "PUT", &format!("/doc/{doc}"), &[]).unwrap().status, 200);
    }
    assert_eq!(http::get(listen, "/doc/nope").unwrap().status, 404);
    let server_after = scrape(server_metrics);
    let requests = |m: &Metrics, outcome: &str| value(m, "tierstack_appserver_requests_total", &[("outcome", outcome)]);
    for (outcome, sent) in [("read", 5.0), ("update", 2.0), ("not_found", 1.0)] {
        assert_eq!(requests(&server_after, outcome) - requests(&server_before, outcome), sent, "{outcome}");
    }
    let count = |m: &Metrics, name: &str| value(m, &format!("{name}_count"), &[]);
    assert_eq!(count(&server_after, "tierstack_appserver_read_grant_seconds"), 5.0);
    assert_eq!(count(&server_after, "tierstack_appserver_update_grant_seconds"), 2.0);
    let module_after = scrape(module_metrics);
    let moved = |name: &str| value(&module_after, name, &[]) - value(&before, name, &[]);
    assert_eq!(moved("tierstack_module_reads_granted_total"), 5.0);
    assert_eq!(moved("tierstack_module_updates_granted_total"), 2.0);
    assert_eq!(moved("tierstack_module_update_seconds_count"), 2.0, "every update's hold time is recorded");
    assert!(value(&module_after, "tierstack_module_connections_open", &[]) >= 1.0, "the server's connection");

    // The test holds an update of doc/a: a read of it queues behind, in
    // the module and in the server's published load, until UPDATE_DONE.
    let mut held = ModuleConnection::connect(&socket);
    assert_eq!(held.call(r#"{"id":1,"op":"update_request","keys":["doc/a"]}"#), "update_proceed");
    assert_eq!(held.call(r#"{"id":2,"op":"no_such_op"}"#), "error");
    let reading = std::thread::spawn(move || http::get(listen, "/doc/a").unwrap().status);
    let depth = |m: &Metrics, queue: &str| value(m, "tierstack_module_queue_depth", &[("queue", queue)]);
    let queued = scrape_until(module_metrics, "the read queued behind the held update", |m| depth(m, "update") == 2.0);
    assert_eq!((depth(&queued, "read"), depth(&queued, "admission")), (0.0, 0.0));
    assert_eq!(value(&queued, "tierstack_module_requests_queued_total", &[]), 1.0);
    assert_eq!(value(&queued, "tierstack_module_requests_refused_total", &[]), 1.0);
    scrape_until(server_metrics, "the server publishes the waiting read", |m| {
        value(m, "tierstack_appserver_queue_length", &[]) == 1.0
            && value(m, "tierstack_appserver_in_flight_requests", &[]) == 1.0
    });
    assert_eq!(held.call(r#"{"id":1,"op":"update_done"}"#), "done");
    assert_eq!(reading.join().unwrap(), 200);
    let drained = scrape_until(module_metrics, "the queues drained", |m| {
        ["read", "update", "admission"].iter().all(|q| depth(m, q) == 0.0)
    });
    assert_eq!(value(&drained, "tierstack_module_update_seconds_count", &[]), 3.0);
    assert_eq!(value(&drained, "tierstack_module_reads_granted_total", &[]), 6.0);
}

/// The origin serves `/metrics` beside `/stats` on its admin listener.
#[test]
fn metrics_of_the_origin_count_requests_hits_disk_reads_and_304s() {
    let trace_name = "press:clarknet@0.002";
    let trace = TraceSpec::parse(trace_name, 1.0, 10).unwrap().build(1).unwrap();
    let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let args = strings(&[
        "origin",
        "--listen",
        &listen.to_string(),
        "--admin",
        &admin.to_string(),
        "--trace",
        trace_name,
        "--cache-bytes",
        "100000000",
        "--disk-seek-us",
        "1",
        "--disk-mb-per-s",
        "10000",
    ]);
    let _origin = ChildNode::spawn(&exe(), &args).unwrap();
    assert_ready(admin);
    assert_eq!(http::get(admin, "/stats").unwrap().status, 200, "/stats stays");
    let before = scrape(admin);
    assert_families(
        &before,
        &[
            "tierstack_origin_requests_total",
            "tierstack_origin_cache_hits_total",
            "tierstack_origin_cache_misses_total",
            "tierstack_origin_disk_reads_total",
            "tierstack_origin_sent_bytes_total",
            "tierstack_origin_not_modified_total",
        ],
    );
    let path = trace.documents()[0].path();
    let first = http::get(listen, &path).unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(http::get(listen, &path).unwrap().status, 200);
    let etag = first.header("etag").unwrap().to_string();
    let conditional = http::request(listen, "GET", &path, &[&format!("If-None-Match: {etag}")]).unwrap();
    assert_eq!(conditional.status, 304);
    let after = scrape(admin);
    let moved = |name: &str| value(&after, name, &[]) - value(&before, name, &[]);
    assert_eq!(moved("tierstack_origin_requests_total"), 3.0);
    assert_eq!(moved("tierstack_origin_cache_misses_total"), 1.0);
    assert_eq!(moved("tierstack_origin_cache_hits_total"), 1.0);
    assert_eq!(moved("tierstack_origin_disk_reads_total"), 1.0);
    assert_eq!(moved("tierstack_origin_not_modified_total"), 1.0);
    assert_eq!(moved("tierstack_origin_sent_bytes_total"), 2.0 * first.body.len() as f64);
    assert_eq!(value(&after, "tierstack_origin_responses_total", &[("code", "304")]), 1.0);
}

/// Two PRESS nodes on shm: node 0's requests, split by Fig. 1's decision,
/// its cache and its Table 2 messages move; it sees its peer alive.
#[test]
fn metrics_of_a_press_node_split_requests_by_decision() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [NodeLine { id: 0, role: "proxy", cpu: None }, NodeLine { id: 1, role: "proxy", cpu: None }];
    let topology = write_topology(dir.path(), "metrics-press", Backend::Shm, 2000, &nodes).unwrap();
    let trace_name = "press:clarknet@0.002";
    let trace = TraceSpec::parse(trace_name, 1.0, 10).unwrap().build(1).unwrap();
    let spawn = |node: u32, metrics_listen: Option<SocketAddr>| {
        let listen = free_loopback_port().unwrap();
        let mut args = strings(&["press-node", "--topology", topology.to_str().unwrap(), "--node", &node.to_string()]);
        args.extend(strings(&["--listen", &listen.to_string(), "--trace", trace_name, "--threads", "1"]));
        if let Some(addr) = metrics_listen {
            args.extend(strings(&["--metrics-listen", &addr.to_string()]));
        }
        (ChildNode::spawn(&exe(), &args).unwrap(), listen)
    };
    let observed = free_loopback_port().unwrap();
    let (_node0, listen0) = spawn(0, Some(observed));
    let (_node1, listen1) = spawn(1, None);
    assert_ready(observed);
    let before = scrape(observed);
    assert_families(
        &before,
        &[
            "tierstack_press_requests_total",
            "tierstack_press_decisions_total",
            "tierstack_press_sent_messages_total",
            "tierstack_press_cache_hits_total",
            "tierstack_press_cache_misses_total",
            "tierstack_press_peers",
        ],
    );
    // Node 1 caches the first documents; node 0 then gets every document twice.
    let documents: Vec<String> = trace.documents().iter().take(6).map(|d| d.path()).collect();
    for path in &documents[..3] {
        assert_eq!(http::get(listen1, path).unwrap().status, 200);
    }
    for path in documents.iter().chain(&documents) {
        assert_eq!(http::get(listen0, path).unwrap().status, 200, "{path}");
    }
    let after = scrape(observed);
    let moved = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);
    assert_eq!(moved("tierstack_press_requests_total", &[]), 12.0);
    let decisions: f64 = ["local", "uncached", "forwarded"]
        .iter()
        .map(|d| moved("tierstack_press_decisions_total", &[("decision", d)]))
        .sum();
    assert_eq!(decisions, 12.0, "every request took one branch of Fig. 1");
    assert!(moved("tierstack_press_cache_misses_total", &[]) >= 1.0);
    assert!(moved("tierstack_press_cache_hits_total", &[]) >= 1.0, "the second round hits");
    let caching = moved("tierstack_press_sent_messages_total", &[("transport", "base"), ("type", "caching")]);
    assert!(caching >= 1.0, "node 0 told its peer what it cached");
    assert_eq!(value(&after, "tierstack_press_peers", &[("state", "alive")]), 1.0);
}

/// One proxy and one passive `coop-node` under MTACC (as `coop_http`'s
/// static responses, smaller): the proxy fills the passive node's pool,
/// whose `/metrics` shows the messages it handled and its pool occupancy.
#[test]
fn metrics_of_a_passive_coop_node_show_its_pool_filling() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [NodeLine { id: 0, role: "proxy", cpu: None }, NodeLine { id: 1, role: "passive", cpu: None }];
    let topology = write_topology(dir.path(), "metrics-coop", Backend::Shm, 500, &nodes).unwrap();
    let topology = topology.display().to_string();
    let trace_name = "coop:8k@0.004";
    let trace = TraceSpec::parse(trace_name, 0.0, 0).unwrap().build(1).unwrap();
    let origin_listen = free_loopback_port().unwrap();
    let _origin =
        ChildNode::spawn(&exe(), &strings(&["origin", "--listen", &origin_listen.to_string(), "--trace", trace_name]))
            .unwrap();
    let pool = (16 * 3 * 4096).to_string();
    let observed = free_loopback_port().unwrap();
    let _passive = ChildNode::spawn(
        &exe(),
        &strings(&[
            "coop-node",
            "--topology",
            &topology,
            "--node",
            "1",
            "--scheme",
            "mtacc",
            "--coop-pool-bytes",
            &pool,
            "--metrics-listen",
            &observed.to_string(),
        ]),
    )
    .unwrap();
    assert_ready(observed);
    let before = scrape(observed);
    assert_families(
        &before,
        &[
            "tierstack_coop_lookups_total",
            "tierstack_coop_primitive_calls_total",
            "tierstack_coop_messages_total",
            "tierstack_coop_messages_handled_total",
            "tierstack_coop_announces_total",
            "tierstack_coop_pool_used_pages",
            "tierstack_coop_pool_capacity_pages",
        ],
    );
    assert_eq!(value(&before, "tierstack_coop_pool_used_pages", &[]), 0.0);
    assert!(value(&before, "tierstack_coop_pool_capacity_pages", &[]) > 0.0);
    let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let mut args = proxy_args(listen, admin, "ttl", &topology, 0);
    args.extend(strings(&["--upstream", &format!("http://{origin_listen}"), "--coop", "mtacc"]));
    args.extend(strings(&["--cache-bytes", "0", "--coop-pool-bytes", &pool]));
    args.extend(strings(&["--refresh-hot", "0", "--coop-ack-timeout-ms", "300"]));
    let _proxy = ChildNode::spawn(&exe(), &args).unwrap();
    // More documents than the proxy's own pool holds: the rest go to the passive node.
    for document in trace.documents() {
        assert_eq!(http::get(listen, &document.path()).unwrap().status, 200);
    }
    let after =
        scrape_until(observed, "the passive pool filled", |m| value(m, "tierstack_coop_pool_used_pages", &[]) > 0.0);
    assert!(
        value(&after, "tierstack_coop_messages_handled_total", &[])
            > value(&before, "tierstack_coop_messages_handled_total", &[]),
        "the proxy's stores reached the passive node"
    );
    assert!(value(&after, "tierstack_coop_pool_entries", &[]) > 0.0);
}
