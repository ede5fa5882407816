//! `/metrics` of the node commands without an HTTP listener of their own —
//! `dlm-node`, `ddss-daemon`, `monitor-node`, `reconfigure` and `fabric
//! serve` — each as a real process on shm with `--metrics-listen`: the
//! exposition passes `tierstack_testkit::metrics::check` (prometheus-parse,
//! promtool where installed, the naming conventions), its key series are
//! there, and after the test drives work they moved by what the work was
//! (exact counts where the test knows them). `/readyz` answers 200 once the
//! command said `ready`.

use crate::exe;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_cluster::{open_fabric, Backend, Topology};
use tierstack_deploy::process::{free_loopback_port, write_topology, NodeLine};
use tierstack_testkit::child::ChildProcess;
use tierstack_testkit::metrics::Metrics;

/// Bound on waiting for a series to reach a value.
const WAIT: Duration = Duration::from_secs(30);

/// A shm topology of `roles` (node `i` has `roles[i]`) in `dir`.
fn topology(dir: &Path, roles: &[&'static str]) -> PathBuf {
    let nodes: Vec<NodeLine> = (0..).zip(roles).map(|(id, role)| NodeLine { id, role, cpu: None }).collect();
    write_topology(dir, "metrics", Backend::Shm, 2000, &nodes).unwrap()
}

fn at(topology: &Path, node: u32) -> Vec<String> {
    vec!["--topology".into(), topology.display().to_string(), "--node".into(), node.to_string()]
}

/// The checked exposition at `addr`.
fn scrape(addr: SocketAddr) -> Metrics {
    let response = tierstack_testkit::http::get(addr, "/metrics").unwrap();
    assert_eq!(response.status, 200);
    tierstack_testkit::metrics::check(&response.text()).unwrap_or_else(|e| panic!("{e}"))
}

fn value(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics.value(name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{}", metrics.text))
}

/// Scrapes until `done` holds of the exposition (within [`WAIT`]).
fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = tierstack_base::time::instant_now() + WAIT;
    loop {
        let metrics = scrape(addr);
        if done(&metrics) {
            return metrics;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "timed out waiting for {what}:\n{}", metrics.text);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ready_status(addr: SocketAddr) -> u16 {
    tierstack_testkit::http::get(addr, "/readyz").unwrap().status
}

/// `tierstack <args> --metrics-listen <free port>`, waited for until `ready`.
fn start(args: Vec<String>) -> (ChildProcess, SocketAddr) {
    let listen = free_loopback_port().unwrap();
    let mut args = args;
    args.extend(["--metrics-listen".into(), listen.to_string(), "--stop-on-stdin-eof".into()]);
    let mut child = ChildProcess::tierstack(&exe(), &args);
    child.wait_ready();
    (child, listen)
}

/// A lock node runs 40 holds on its own locks (SRSL: its grants are messages
/// to itself, so the message counter moves too). Before the go nothing is
/// counted; after the run every grant, release and wait is, and nothing is
/// held.
#[test]
fn dlm_node_metrics_count_every_hold() {
    const OPS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(dir.path(), &["app"]);
    let mut args = vec!["dlm-node".to_string()];
    args.extend(at(&topology, 0));
    args.extend(["--scheme", "srsl", "--locks", "0..2", "--ops", &OPS.to_string(), "--wait-go"].map(String::from));
    let (mut node, metrics_at) = start(args);
    assert_eq!(ready_status(metrics_at), 200);
    let before = scrape(metrics_at);
    for family in [
        "tierstack_dlm_acquire_failures_total",
        "tierstack_dlm_releases_total",
        "tierstack_dlm_recoveries_total",
        "tierstack_dlm_fenced_total",
        "tierstack_dlm_held_locks",
    ] {
        assert_eq!(before.get(family), 0.0, "{family}");
    }
    assert_eq!(value(&before, "tierstack_dlm_acquires_total", &[("mode", "shared")]), 0.0);
    assert_eq!(before.get("tierstack_dlm_acquire_wait_seconds_count"), 0.0);

    node.tell("go");
    node.line_after("\"done\"");
    let after = scrape(metrics_at);
    let shared = value(&after, "tierstack_dlm_acquires_total", &[("mode", "shared")]);
    let exclusive = value(&after, "tierstack_dlm_acquires_total", &[("mode", "exclusive")]);
    assert_eq!(shared + exclusive, OPS as f64, "{}", after.text);
    assert!(shared > 0.0 && exclusive > 0.0, "a 50% mix of {OPS} has both modes: {}", after.text);
    assert_eq!(after.get("tierstack_dlm_releases_total"), OPS as f64);
    assert_eq!(after.get("tierstack_dlm_acquire_wait_seconds_count"), OPS as f64);
    assert_eq!(after.get("tierstack_dlm_held_locks"), 0.0);
    assert_eq!(after.get("tierstack_dlm_acquire_failures_total"), 0.0);
    assert!(
        after.get("tierstack_dlm_messages_handled_total") >= 2.0 * OPS as f64,
        "an SRSL hold is a request and a release message at least: {}",
        after.text
    );
    assert!(node.finish().success(), "{}", node.stderr());
}

/// A lock node that only uses locks is ready while its lock server runs,
/// and not ready once the server is killed (its locks would wait for it).
#[test]
fn dlm_node_is_not_ready_while_its_lock_server_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(dir.path(), &["app", "passive"]);
    let node_args = |node: u32| {
        let mut args = vec!["dlm-node".to_string()];
        args.extend(at(&topology, node));
        args.extend(["--locks", "0..1", "--ops", "0"].map(String::from));
        args
    };
    let (mut server, _) = start(node_args(0));
    let (user, metrics_at) = start(node_args(1));
    assert_eq!(ready_status(metrics_at), 200);
    server.kill();
    let deadline = tierstack_base::time::instant_now() + WAIT;
    loop {
        let response = tierstack_testkit::http::get(metrics_at, "/readyz").unwrap();
        if response.status == 503 {
            assert!(response.text().contains("lock servers: node0 gone"), "{}", response.text());
            break;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "still ready with its lock server killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(user);
}

/// A daemon serves one allocate, put and get per coherence model, a free
/// and a get of the freed key (an error) from the test, then a
/// `ddss-client --via-daemon` history of 20 operations on the strict key:
/// the per-model counts, the errors, the histogram's count, the clients
/// gauge and the allocated bytes all follow.
#[test]
fn ddss_daemon_metrics_count_operations_per_model() {
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(dir.path(), &["app", "passive"]);
    let socket = dir.path().join("ddss.sock");
    let mut args = vec!["ddss-daemon".to_string()];
    args.extend(at(&topology, 0));
    args.extend(["--socket".into(), socket.display().to_string()]);
    let (daemon, metrics_at) = start(args);
    assert_eq!(ready_status(metrics_at), 200);
    let before = scrape(metrics_at);
    assert_eq!(before.get("tierstack_ddss_operation_seconds_count"), 0.0);
    assert_eq!(before.get("tierstack_ddss_clients"), 0.0);
    let allocated_before = before.get("tierstack_ddss_allocated_bytes");

    let mut control = tierstack_ddss::ipc::DdssClient::connect(&socket).unwrap();
    let models = tierstack_testkit::ddss::every_model(2, 2);
    let mut keys = Vec::new();
    for model in models {
        let key = control.allocate(64, tierstack_ddss::Placement::Local, model).unwrap();
        control.put(key, b"value").unwrap();
        assert_eq!(control.get(key).unwrap().1, b"value");
        keys.push(key);
    }
    let freed = keys[0];
    control.free(freed).unwrap();
    assert!(control.get(freed).is_err(), "a freed key's get fails");
    let during = scrape(metrics_at);
    assert_eq!(during.get("tierstack_ddss_clients"), 1.0, "{}", during.text);
    for model in models {
        for op in ["allocate", "put", "get"] {
            let expected = if op == "get" && model == models[0] { 2.0 } else { 1.0 };
            let labels = [("model", model.name()), ("op", op)];
            assert_eq!(value(&during, "tierstack_ddss_operations_total", &labels), expected, "{labels:?}");
        }
    }
    assert_eq!(value(&during, "tierstack_ddss_operations_total", &[("model", models[0].name()), ("op", "free")]), 1.0);
    assert_eq!(value(&during, "tierstack_ddss_operation_errors_total", &[("op", "get")]), 1.0);
    assert_eq!(value(&during, "tierstack_ddss_operation_errors_total", &[("op", "put")]), 0.0);
    // 6 models × (allocate, put, get), one free, one failed get.
    assert_eq!(during.get("tierstack_ddss_operation_seconds_count"), 20.0);
    assert!(during.get("tierstack_ddss_allocated_bytes") > allocated_before, "{}", during.text);
    drop(control);

    let strict = *keys.last().unwrap();
    assert_eq!(strict.coherence().name(), "strict");
    let mut client_args = vec!["ddss-client".to_string()];
    client_args.extend(at(&topology, 1));
    client_args.extend([
        "--socket".into(),
        socket.display().to_string(),
        "--key".into(),
        format!("{strict}:20"),
        "--via-daemon".into(),
    ]);
    let mut client = ChildProcess::tierstack(&exe(), &client_args);
    client.line_after("\"done\"");
    assert!(client.finish().success(), "{}", client.stderr());
    let after =
        scrape_until(metrics_at, "the client's connection to close", |m| m.get("tierstack_ddss_clients") == 0.0);
    let strict_ops = |m: &Metrics, op| value(m, "tierstack_ddss_operations_total", &[("model", "strict"), ("op", op)]);
    assert_eq!(strict_ops(&after, "put") + strict_ops(&after, "get"), 2.0 + 20.0, "{}", after.text);
    assert_eq!(after.get("tierstack_ddss_client_connections_total"), 2.0);
    drop(daemon);
}

/// A monitored node writes its load record every tick and answers three
/// Socket-Sync requests from the test: both counters move, and the
/// published load is there as gauges.
#[test]
fn monitor_node_metrics_show_its_load_and_the_reads_it_served() {
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(dir.path(), &["app"]);
    let monitor_at = free_loopback_port().unwrap();
    let mut args = vec!["monitor-node".to_string()];
    args.extend(at(&topology, 0));
    args.extend(["--monitor-listen".into(), monitor_at.to_string(), "--interval-ms".into(), "5".into()]);
    let (node, metrics_at) = start(args);
    assert_eq!(ready_status(metrics_at), 200);
    let before = scrape(metrics_at);
    assert_eq!(before.get("tierstack_monitor_sync_reads_total"), 0.0);
    for gauge in ["running_threads", "open_connections", "in_flight_requests", "queue_length"] {
        before.get(&format!("tierstack_monitor_{gauge}"));
    }
    let written = before.get("tierstack_monitor_records_written_total");
    scrape_until(metrics_at, "a record written after the first scrape", |m| {
        m.get("tierstack_monitor_records_written_total") > written
    });

    let mut stream = TcpStream::connect(monitor_at).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut frame = [0u8; tierstack_monitor::agent::FRAME_BYTES];
    for _ in 0..3 {
        stream.write_all(&[tierstack_monitor::agent::REQUEST_SYNC]).unwrap();
        stream.read_exact(&mut frame).unwrap();
    }
    // Counted after the frame is written: the last one may still be on its way.
    scrape_until(metrics_at, "three sync reads", |m| m.get("tierstack_monitor_sync_reads_total") == 3.0);
    drop(node);
}

/// Three back ends in this process (node 1 at site 0 with five requests in
/// flight, nodes 2 and 3 idle at site 1) and one `reconfigure` agent that
/// moves a node after one window over the ratio: its windows, its one
/// move and the loads it saw show.
#[test]
fn reconfigure_metrics_count_windows_and_moves() {
    let dir = tempfile::tempdir().unwrap();
    let topology_path = topology(dir.path(), &["passive", "app", "app", "app"]);
    let topology = Topology::load(&topology_path).unwrap();
    let mut backends = Vec::new();
    let mut held = Vec::new();
    for (node, site) in [(1u32, 0u16), (2, 1), (3, 1)] {
        let fabric = open_fabric(&topology, NodeId(node)).unwrap();
        let role = tierstack_monitor::reconfig::register_role(fabric.as_ref(), site).unwrap();
        let publisher = tierstack_monitor::LoadPublisher::register(fabric.as_ref()).unwrap();
        if node == 1 {
            held.extend((0..5).map(|_| publisher.enter(tierstack_monitor::Gauge::InFlightRequests)));
        }
        backends.push((fabric, role, publisher));
    }
    let mut args = vec!["reconfigure".to_string()];
    args.extend(at(&topology_path, 0));
    for node in ["1", "2", "3"] {
        args.extend(["--backend".into(), node.into()]);
    }
    args.extend(["--window-ms", "10", "--windows", "1", "--ratio", "2"].map(String::from));
    let (agent, metrics_at) = start(args);
    assert_eq!(ready_status(metrics_at), 200);
    let moved = scrape_until(metrics_at, "one move", |m| m.get("tierstack_reconfig_moves_total") == 1.0);
    assert!(moved.get("tierstack_reconfig_windows_total") >= 1.0);
    assert_eq!(moved.get("tierstack_reconfig_move_decisions_total"), 1.0);
    assert_eq!(value(&moved, "tierstack_reconfig_backend_load", &[("node", "1")]), 5.0);
    // The idlest node of site 1 (node 2, the first of equals) went to site 0.
    let after = scrape_until(metrics_at, "the moved node seen at its new site", |m| {
        m.value("tierstack_reconfig_backend_site", &[("node", "2")]) == Some(0.0)
    });
    assert_eq!(after.get("tierstack_reconfig_backends_seen"), 3.0);
    assert_eq!(after.get("tierstack_reconfig_moves_total"), 1.0, "the history rule holds the moved node");
    drop(agent);
    drop(held);
}

/// `fabric serve` with one region: the region's count and bytes, and three
/// messages from the test counted as received and acknowledged.
#[test]
fn fabric_serve_metrics_count_regions_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let topology_path = topology(dir.path(), &["app", "passive"]);
    let mut args = vec!["fabric".to_string(), "serve".into()];
    args.extend(at(&topology_path, 0));
    args.extend(["--region".into(), "data:4096".into()]);
    let (server, metrics_at) = start(args);
    assert_eq!(ready_status(metrics_at), 200);
    let before = scrape(metrics_at);
    assert_eq!(before.get("tierstack_fabric_regions"), 1.0);
    assert_eq!(before.get("tierstack_fabric_region_bytes"), 4096.0);
    assert_eq!(before.get("tierstack_fabric_messages_received_total"), 0.0);

    let topology = Topology::load(&topology_path).unwrap();
    let fabric = open_fabric(&topology, NodeId(1)).unwrap();
    for _ in 0..3 {
        fabric.send(NodeId(0), tierstack_fabric::Channel::APP, &[1]).unwrap();
        fabric.inbox(tierstack_fabric::Channel::APP).recv_timeout(WAIT).unwrap();
    }
    let after =
        scrape_until(metrics_at, "three acknowledgements", |m| m.get("tierstack_fabric_acknowledgements_total") == 3.0);
    assert_eq!(after.get("tierstack_fabric_messages_received_total"), 3.0);
    drop(server);
}
