//! Load balancing end to end, as processes on shm: the module, two
//! application servers publishing their load (registered `monitor.load`
//! and a monitor socket server), and four proxies balancing least-loaded
//! over them, one per monitoring scheme. Every request is served, each
//! proxy reads both loads for every choice; once one application server is
//! SIGKILLed, every scheme reports it dead and its proxy stops sending to it.
//! `tierstack top --once` from a node of its own shows exactly the two
//! publishing servers, then the killed one as dead.

use crate::exe;
use std::net::SocketAddr;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{proxy_args, strings};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_monitor::Scheme;
use tierstack_proxy::ProxyStats;
use tierstack_testkit::http;

const DOCS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const TOP_NODE: u32 = 7;

/// `tierstack top --once --json`: (node, health now, sampled health, open connections) per row.
fn top(topology: &str) -> Vec<(u64, String, String, u64)> {
    let output = std::process::Command::new(exe())
        .args(["top", "--topology", topology, "--node", &TOP_NODE.to_string(), "--once", "--json"])
        .args(["--interval-ms", "100"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let both: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(both["tiers"].as_array().map(Vec::len), Some(0), "no [node.service] here: no tier to scrape");
    both["load"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["node"].as_u64().unwrap(),
                row["now"]["health"].as_str().unwrap().to_string(),
                row["sampled"]["health"].as_str().unwrap().to_string(),
                row["now"]["record"]["counters"]["open_connections"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// One GET over its own connection: the status and the body.
pub(crate) fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = http::get(addr, path).unwrap();
    (response.status, response.text())
}

/// A proxy's counters, their accounting checked.
pub(crate) fn stats(admin: SocketAddr) -> ProxyStats {
    let (status, body) = get(admin, "/_tierstack/stats");
    assert_eq!(status, 200);
    let stats: ProxyStats = serde_json::from_str(&body).unwrap();
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    stats
}

#[test]
fn every_scheme_balances_and_skips_a_killed_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = vec![NodeLine { id: 0, role: "app", cpu: None }];
    nodes.extend((1..=2).map(|id| NodeLine { id, role: "app", cpu: None }));
    nodes.extend((3..=6).map(|id| NodeLine { id, role: "proxy", cpu: None }));
    nodes.push(NodeLine { id: TOP_NODE, role: "passive", cpu: None });
    let topology = write_topology(dir.path(), "monitor", Backend::Shm, 1000, &nodes).unwrap().display().to_string();
    let socket = dir.path().join("module.sock").display().to_string();
    let documents = dir.path().join("docs.txt");
    std::fs::write(&documents, DOCS.iter().map(|d| format!("{d} 200\n")).collect::<String>()).unwrap();
    let documents = format!("file:{}", documents.display());

    let _module = ChildNode::spawn(
        &exe(),
        &strings(&["app-module", "--topology", &topology, "--node", "0", "--socket", &socket]),
    )
    .unwrap();
    let mut servers = Vec::new();
    let mut upstreams = Vec::new();
    for node in 1..=2u32 {
        let (listen, monitor) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
        let args = strings(&[
            "app-server",
            "--listen",
            &listen.to_string(),
            "--module-socket",
            &socket,
            "--documents",
            &documents,
            "--topology",
            &topology,
            "--node",
            &node.to_string(),
            "--publish-load",
            "--monitor-listen",
            &monitor.to_string(),
            "--monitor-interval-ms",
            "5",
            "--cpu-cost",
            "pareto:1.1,100,2000",
        ]);
        servers.push(ChildNode::spawn(&exe(), &args).unwrap());
        upstreams.push((format!("http://{listen}"), format!("{node}@{monitor}")));
    }
    let mut proxies = Vec::new();
    for (scheme, node) in Scheme::ALL.into_iter().zip(3u32..) {
        let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
        let mut args = proxy_args(listen, admin, "no-cache", &topology, node);
        args.extend(strings(&["--balance", "least-loaded", "--monitor", scheme.name(), "--monitor-interval-ms", "5"]));
        for (url, monitor) in &upstreams {
            args.extend(strings(&["--upstream", url, "--upstream-monitor", monitor]));
        }
        proxies.push((scheme, listen, admin, ChildNode::spawn(&exe(), &args).unwrap()));
    }

    for (scheme, listen, admin, _) in &proxies {
        for doc in DOCS.iter().cycle().take(12) {
            let (status, body) = get(*listen, &format!("/doc/{doc}"));
            assert_eq!(status, 200, "{scheme}: {body}");
            assert!(body.starts_with(&format!("doc={doc} ")), "{scheme}: {body}");
        }
        let stats = stats(*admin);
        assert_eq!(stats.monitor, Some(*scheme));
        assert_eq!(stats.routed.iter().sum::<u64>(), 12, "{scheme}: {stats:?}");
        assert_eq!(stats.monitor_reads, 24, "{scheme}: both loads read for every choice");
    }

    let rows = top(&topology);
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2], "only the publishing servers: {rows:?}");
    for (node, now, sampled, connections) in &rows {
        assert_eq!((now.as_str(), sampled.as_str()), ("fresh", "fresh"), "node {node}");
        assert!(*connections >= 1, "node {node}: the proxies keep connections open");
    }

    servers[1].kill().unwrap();
    // RDMA-Sync on shm still reads a killed node's counters word (its file
    // outlives it) and asks whether the node lives once per liveness period
    // (`SourceConfig::liveness_every`, 100 ms): only a streak of successes
    // that starts after that period says the scheme has noticed.
    let noticed_by = tierstack_base::time::instant_now() + Duration::from_millis(100);
    for (scheme, listen, admin, _) in &proxies {
        // Requests may fail until the scheme notices (a failed liveness
        // check, a refused connection, a closed push stream); then none may.
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
        let mut streak = 0;
        while streak < 5 {
            assert!(
                tierstack_base::time::instant_now() < deadline,
                "{scheme} never stopped routing to the killed server"
            );
            let began = tierstack_base::time::instant_now();
            let (status, _) = get(*listen, "/doc/a");
            streak = if status == 200 && began > noticed_by { streak + 1 } else { 0 };
        }
        let before = stats(*admin).routed;
        for doc in DOCS {
            assert_eq!(get(*listen, &format!("/doc/{doc}")).0, 200, "{scheme}");
        }
        let after = stats(*admin).routed;
        assert_eq!(after[1], before[1], "{scheme}: nothing more to the killed server");
        assert_eq!(after[0], before[0] + DOCS.len() as u64, "{scheme}");
    }
    let rows = top(&topology);
    assert_eq!(rows[1].0, 2);
    assert_eq!((rows[1].1.as_str(), rows[1].2.as_str()), ("dead", "dead"), "{rows:?}");
    assert_eq!(rows[0].1, "fresh");
}

/// `tierstack bench monitor` end to end, one short run: a back-end process,
/// the four schemes sampled, the join written as JSON and plots.
#[test]
fn the_accuracy_bench_runs_and_reports_every_scheme() {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(exe())
        .args(["bench", "monitor", "--figure", "8a", "--compute-threads", "0,4", "--duration-s", "1", "--out"])
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("monitor.json")).unwrap()).unwrap();
    let points = report["accuracy"].as_array().unwrap();
    assert_eq!(points.len(), 2 * Scheme::ALL.len());
    for point in points {
        assert!(point["deviation"]["samples"].as_u64().unwrap() > 0, "{point}");
    }
    for changes in report["walk_changes"].as_array().unwrap() {
        assert!(changes[1].as_u64().unwrap() > 1, "the walk moved: {changes}");
    }
    assert!(out.path().join("fig8a_mean_deviation.svg").exists());
}

/// Fig. 8b end to end, one α, one second per configuration, two repeats:
/// every configuration is measured without errors in each repeat, the
/// second repeat runs them in another order, each is compared with hash of
/// its own repeat, the back ends' and proxies' CPU is read from /proc, and
/// the load-oblivious round-robin splits requests evenly.
#[test]
fn the_throughput_bench_runs_every_configuration() {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(exe())
        .args(["bench", "monitor", "--figure", "8b", "--alphas", "0.9", "--duration-s", "1", "--connections", "4"])
        .args(["--repeats", "2", "--backend-compute-threads", "1"])
        .arg("--out")
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("monitor_throughput.json")).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    let configurations = 2 + Scheme::ALL.len();
    assert_eq!(points.len(), 2 * configurations);
    let labels = |repeat: u64| -> Vec<&str> {
        points.iter().filter(|p| p["repeat"] == repeat).map(|p| p["balance"].as_str().unwrap()).collect()
    };
    assert_eq!(labels(0)[..2], ["hash", "round-robin"]);
    assert_eq!(labels(1)[configurations - 1], "hash", "the second repeat is rotated by one");
    let mut sorted = labels(1);
    sorted.sort_unstable();
    let mut first = labels(0);
    first.sort_unstable();
    assert_eq!(sorted, first, "every configuration in every repeat");
    for point in points {
        assert_eq!(point["errors"], 0, "{point}");
        assert!(point["requests"].as_u64().unwrap() > 0, "{point}");
        let routed: u64 = point["routed"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap()).sum();
        // Requests still in flight when the load stops were forwarded but
        // are not counted by the client: at most one per connection; a
        // forward sent again (a suspect or failed server) is routed twice.
        let requests = point["requests"].as_u64().unwrap();
        let retries = point["retries"].as_u64().unwrap();
        assert!((requests..=requests + 4 + retries).contains(&routed), "every request forwarded once: {point}");
        assert_eq!(point["backend_cpu_share"].as_array().unwrap().len(), 2, "{point}");
        if point["balance"] == "hash" {
            assert_eq!(point["throughput_vs_hash"], 1.0, "{point}");
        }
    }
    // A compute thread each: the back ends used CPU, and so did the proxy,
    // as /proc tells (how much depends on the machine: on a crowded one a
    // one-second point may see no clock tick of a process, so over the run).
    for backend in 0..2 {
        let used = points.iter().any(|p| p["backend_cpu_share"][backend].as_f64().unwrap() > 0.0);
        assert!(used, "back end {backend} never used CPU: {points:?}");
    }
    assert!(points.iter().any(|p| p["proxy_cpu_us_per_request"].as_f64().unwrap() > 0.0), "{points:?}");
    let round_robin: Vec<u64> = points.iter().find(|p| p["balance"] == "round-robin").unwrap()["routed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    assert!(round_robin[0].abs_diff(round_robin[1]) <= 1, "{round_robin:?}");
    assert_eq!(report["summary"].as_array().unwrap().len(), configurations);
    assert!(out.path().join("fig8b_throughput.svg").exists());
}

/// Fig. 8b in the simulator, end to end: every configuration at both
/// settings, hash the baseline, and two runs give byte-identical reports
/// (the model is a pure function of its inputs and seeds).
#[test]
fn the_simulated_throughput_bench_is_deterministic() {
    let run = || {
        let out = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(exe())
            .args(["bench", "monitor", "--figure", "8b-sim", "--quick", "--sim-backends", "2,4"])
            .args(["--sim-compute-threads", "0", "--sim-requests", "2000", "--repeats", "2"])
            .arg("--out")
            .arg(out.path())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::read(out.path().join("monitor_throughput_sim.json")).unwrap()
    };
    let (first, second) = (run(), run());
    assert!(first == second, "two runs of the model differ");
    let report: serde_json::Value = serde_json::from_slice(&first).unwrap();
    let points = report["points"].as_array().unwrap();
    // 2 sizes × 2 settings (alone, shared) × (hash, round-robin, least-conn, 4 schemes).
    assert_eq!(points.len(), 2 * 2 * (3 + Scheme::ALL.len()));
    for point in points.iter().filter(|p| p["balance"] == "hash") {
        assert_eq!(point["throughput_vs_hash"]["median"], 1.0, "{point}");
    }
    assert_eq!(report["runs"].as_array().unwrap().len(), 2 * points.len());
}
