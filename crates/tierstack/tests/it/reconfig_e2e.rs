//! Reconfiguration between two sites, as processes on shm (svc §3, §6):
//! the module, three application servers that share a role word each
//! (node 1 in site 0; nodes 2 and 3 in site 1), one proxy per site routing
//! only to its site's servers by their role words, and four
//! `tierstack reconfigure` agents racing over the same servers. One update
//! held open on node 1 makes site 0 the busy one; the agents' policy then
//! asks to move site 1's idlest node (2) to site 0. Exactly one agent moves
//! it (one CAS; the others lose or see it moved), nothing else moves while
//! the load stays (site 1 keeps its last node, the history rule holds node
//! 2; the agents are stopped before the test's own requests change the
//! loads), the moved node
//! serves site 0's proxy and no longer site 1's, and a request stamped with
//! its old role is fenced.

use crate::exe;
use std::net::SocketAddr;
use std::sync::mpsc::Receiver;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{proxy_args, strings};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_proxy::ProxyStats;
use tierstack_testkit::http;

const DOCS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const AGENTS: u32 = 4;
const FIRST_AGENT_NODE: u32 = 6;

/// One request over its own connection: the status and the body.
fn request(addr: SocketAddr, method: &str, path: &str, extra_header: Option<&str>) -> (u16, String) {
    let response = http::request(addr, method, path, extra_header.as_slice()).unwrap();
    (response.status, response.text())
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    request(addr, "GET", path, None)
}

fn proxy_stats(admin: SocketAddr) -> ProxyStats {
    let (status, body) = get(admin, "/_tierstack/stats");
    assert_eq!(status, 200);
    let stats: ProxyStats = serde_json::from_str(&body).unwrap();
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    stats
}

fn server_stats(listen: SocketAddr) -> serde_json::Value {
    let (status, body) = get(listen, "/_tierstack/stats");
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

/// `n` GETs through a proxy, every one served; the proxy's routed counts
/// before and after.
fn through(listen: SocketAddr, admin: SocketAddr, n: usize) -> (Vec<u64>, Vec<u64>) {
    let before = proxy_stats(admin).routed;
    for doc in DOCS[1..].iter().cycle().take(n) {
        let (status, body) = get(listen, &format!("/doc/{doc}"));
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with(&format!("doc={doc} ")), "{body}");
    }
    (before, proxy_stats(admin).routed)
}

#[test]
fn exactly_one_agent_moves_the_idle_sites_node_and_it_serves_its_new_site() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<NodeLine> = (0..=3).map(|id| NodeLine { id, role: "app", cpu: None }).collect();
    nodes.extend((4..=5).map(|id| NodeLine { id, role: "proxy", cpu: None }));
    nodes.extend((FIRST_AGENT_NODE..FIRST_AGENT_NODE + AGENTS).map(|id| NodeLine { id, role: "passive", cpu: None }));
    let topology = write_topology(dir.path(), "reconfig", Backend::Shm, 1000, &nodes).unwrap().display().to_string();
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
    for (node, site) in [(1u32, "0"), (2, "1"), (3, "1")] {
        let listen = free_loopback_port().unwrap();
        let args = strings(&[
            "app-server",
            "--listen",
            &listen.to_string(),
            "--module-socket",
            &socket,
            "--documents",
            &documents,
            // An update holds its document (and counts in flight) this long.
            "--documents-in-store",
            "--update-write-pause-ms",
            "5000",
            "--topology",
            &topology,
            "--node",
            &node.to_string(),
            "--publish-load",
            "--site",
            site,
        ]);
        servers.push((listen, ChildNode::spawn(&exe(), &args).unwrap()));
    }
    let mut proxies = Vec::new();
    for (site, node) in [("0", 4u32), ("1", 5)] {
        let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
        let mut args = proxy_args(listen, admin, "no-cache", &topology, node);
        args.extend(strings(&["--balance", "round-robin", "--monitor", "rdma-sync", "--site", site]));
        for (server, (listen, _)) in (1..).zip(&servers) {
            args.extend(strings(&[
                "--upstream",
                &format!("http://{listen}"),
                "--upstream-monitor",
                &format!("{server}@"),
            ]));
        }
        proxies.push((listen, admin, ChildNode::spawn(&exe(), &args).unwrap()));
    }
    let (site0, site1) = ((proxies[0].0, proxies[0].1), (proxies[1].0, proxies[1].1));

    // Before: each proxy routes to its own site's servers only.
    let (before, after) = through(site0.0, site0.1, 4);
    assert_eq!((after[0] - before[0], after[1] - before[1], after[2] - before[2]), (4, 0, 0));
    let (before, after) = through(site1.0, site1.1, 4);
    assert_eq!((after[0] - before[0], after[1] - before[1], after[2] - before[2]), (0, 2, 2));

    let mut agents: Vec<(ChildNode, Receiver<String>)> = (FIRST_AGENT_NODE..FIRST_AGENT_NODE + AGENTS)
        .map(|node| {
            let args = strings(&[
                "reconfigure",
                "--topology",
                &topology,
                "--node",
                &node.to_string(),
                "--agent-id",
                &node.to_string(),
                "--backend",
                "1",
                "--backend",
                "2",
                "--backend",
                "3",
                "--window-ms",
                "5",
                "--windows",
                "1",
                "--ratio",
                "2",
                "--history-ms",
                "600000",
            ]);
            let mut agent = ChildNode::spawn(&exe(), &args).unwrap();
            let lines = agent.take_lines().unwrap();
            (agent, lines)
        })
        .collect();

    // Site 0 gets busy: an update held open on node 1 (one request in flight
    // there, none in site 1: (1 + 1) / (0 + 1) reaches the ratio 2).
    let node1 = servers[0].0;
    let update = std::thread::spawn(move || request(node1, "POST", "/doc/a", None));
    let deadline = tierstack_base::time::instant_now() + Duration::from_millis(4500);
    let mut events: Vec<serde_json::Value> = Vec::new();
    while !events.iter().any(|e| e["event"] == "moved") {
        assert!(tierstack_base::time::instant_now() < deadline, "no agent moved a node; events: {events:?}");
        for (_, lines) in &agents {
            if let Ok(line) = lines.recv_timeout(Duration::from_millis(20)) {
                events.push(serde_json::from_str(&line).unwrap());
            }
        }
    }

    // Stop the agents now: the requests below would change the loads they
    // read (a request being generated counts twice, as a running thread and
    // in flight) and could rightly call for more moves.
    for (agent, lines) in agents.drain(..) {
        agent.finish().unwrap();
        events.extend(lines.iter().map(|line| serde_json::from_str::<serde_json::Value>(&line).unwrap()));
    }

    // The moved node serves its new site: site 0's proxy now alternates
    // between nodes 1 and 2; site 1's sends everything to node 3.
    let (before, after) = through(site0.0, site0.1, 8);
    assert_eq!((after[0] - before[0], after[1] - before[1], after[2] - before[2]), (4, 4, 0));
    let (before, after) = through(site1.0, site1.1, 4);
    assert_eq!((after[0] - before[0], after[1] - before[1], after[2] - before[2]), (0, 0, 4));
    // The epoch fence: a request stamped with node 2's old role is refused.
    let node2 = servers[1].0;
    assert_eq!(server_stats(node2)["role"], "0.2");
    assert_eq!(request(node2, "GET", "/doc/b", Some("x-tierstack-role: 1.1")).0, 421);
    assert_eq!(request(node2, "GET", "/doc/b", Some("x-tierstack-role: 0.2")).0, 200);
    assert_eq!(server_stats(node2)["fenced"], 1);
    assert_eq!(server_stats(servers[2].0)["role"], "1.1", "node 3 never moved");

    let (status, body) = update.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let moved: Vec<_> = events.iter().filter(|e| e["event"] == "moved").collect();
    assert_eq!(moved.len(), 1, "exactly one move by exactly one agent: {events:?}");
    assert_eq!((moved[0]["node"].as_u64(), moved[0]["from_site"].as_u64()), (Some(2), Some(1)));
    assert_eq!((moved[0]["to_site"].as_u64(), moved[0]["epoch"].as_u64()), (Some(0), Some(2)));
    for event in &events {
        assert!(event["event"] == "moved" || (event["event"] == "lost" && event["node"] == 2), "{event}");
    }
    eprintln!("events: {events:?}");
}

/// `tierstack bench monitor --figure reconfig` end to end, one short run:
/// both configurations measured, ratios against static, the agent's moves
/// recorded, JSON and plot written.
#[test]
fn the_reconfiguration_bench_runs_and_reports_both_configurations() {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(exe())
        .args(["bench", "monitor", "--figure", "reconfig", "--quick", "--duration-s", "1", "--out"])
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("monitor_reconfig.json")).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 8, "2 configurations x 2 phases x 2 sites");
    for point in points {
        assert!(point["requests"].as_u64().unwrap() > 0, "{point}");
        if point["configuration"] == "static" {
            assert_eq!(point["throughput_vs_static"], 1.0);
        }
    }
    let moves = report["moves"].as_array().unwrap();
    assert!(!moves.is_empty(), "the hot site of phase 1 is over the ratio for many windows");
    assert!(moves.iter().all(|m| m["event"] == "moved"), "one agent never loses: {moves:?}");
    assert!(out.path().join("reconfig_throughput.svg").exists());
}
