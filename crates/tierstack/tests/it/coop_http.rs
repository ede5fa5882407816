//! `tierstack proxy --coop` end to end: proxies as separate processes that
//! share their caches through the cooperative cache service (issue 12).
//!
//! - Static responses from `tierstack origin` (RFC 9111-storable), three
//!   proxies with no private cache (`--cache-bytes 0`: the pool is the
//!   whole cache), every body compared with the origin's synthetic body;
//!   then one proxy (a holder and a home) is SIGKILLed and the two others
//!   keep answering: misses, never an error or wrong bytes. shm and tcp.
//! - Responses with dependencies (the application tier, poll mode) under
//!   updates every 5 ms: a remote copy is served only after the version
//!   check, so the staleness checker counts 0 stale responses, online and
//!   offline, with remote hits happening. shm and tcp.

use crate::exe;
use serde_json::Value;
use std::net::SocketAddr;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{proxy_args, strings, Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_loadgen::{run, LoadConfig};
use tierstack_testkit::http;
use tierstack_workload::{Trace, TraceSpec};

/// One GET on a fresh connection: status, whether it was a hit, body
/// (de-chunked if need be).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    http::get(addr, path).map(|r| (r.status, r.body))
}

fn coop_stats(admin: SocketAddr) -> Value {
    let (status, body) = get(admin, "/_tierstack/coop").unwrap();
    assert_eq!(status, 200);
    serde_json::from_slice(&body).unwrap()
}

fn field(stats: &[Value], name: &str) -> u64 {
    stats.iter().map(|s| s[name].as_u64().unwrap_or(0)).sum()
}

struct Proxy {
    child: ChildNode,
    listen: SocketAddr,
    admin: SocketAddr,
}

/// `count` requests spread over `proxies` (round robin), documents drawn
/// from a seeded stream; every answer must be 200 with the origin's body.
/// Returns the number of wrong answers (status or bytes).
fn requests(proxies: &[&Proxy], trace: &Trace, seed: u64, count: u64) -> u64 {
    let docs = trace.documents();
    let mut wrong = 0;
    for i in 0..count {
        let doc = &docs[(tierstack_coop::key::mix(seed ^ (i << 16)) % docs.len() as u64) as usize];
        let path = doc.path();
        let proxy = proxies[(i % proxies.len() as u64) as usize];
        match get(proxy.listen, &path) {
            Ok((200, body)) if body == tierstack_origin::synthetic_body(&path, doc.size_bytes).as_ref() => {}
            other => {
                wrong += 1;
                eprintln!("{path} via {}: {:?}", proxy.listen, other.map(|(s, b)| (s, b.len())));
            }
        }
    }
    wrong
}

fn static_responses(backend: Backend, scheme: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<NodeLine> = (0..3).map(|id| NodeLine { id, role: "proxy", cpu: None }).collect();
    let passive = if matches!(scheme, "mtacc" | "hybcc") { 2 } else { 0 };
    nodes.extend((0..passive).map(|i| NodeLine { id: 3 + i, role: "passive", cpu: None }));
    let topology = write_topology(dir.path(), "coop", backend, 500, &nodes).unwrap();
    let topology = topology.display().to_string();
    // 41 documents of 8 KiB; each proxy pools 16 (3 pages each with the
    // stored headers): together they hold more than one alone.
    let trace_name = "coop:8k@0.004";
    let trace = TraceSpec::parse(trace_name, 0.0, 0).unwrap().build(1).unwrap();
    let (origin_listen, origin_admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let origin_args = strings(&[
        "origin",
        "--listen",
        &origin_listen.to_string(),
        "--admin",
        &origin_admin.to_string(),
        "--trace",
        trace_name,
    ]);
    let _origin = ChildNode::spawn(&exe(), &origin_args).unwrap();
    let pool = (16 * 3 * 4096).to_string();
    let mut passive_nodes: Vec<ChildNode> = (0..passive)
        .map(|i| {
            let node = (3 + i).to_string();
            let args = strings(&[
                "coop-node",
                "--topology",
                &topology,
                "--node",
                &node,
                "--scheme",
                scheme,
                "--coop-pool-bytes",
                &pool,
            ]);
            ChildNode::spawn(&exe(), &args).unwrap()
        })
        .collect();
    let mut proxies: Vec<Proxy> = (0..3u32)
        .map(|node| {
            let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
            let mut args = proxy_args(listen, admin, "ttl", &topology, node);
            args.extend(strings(&["--upstream", &format!("http://{origin_listen}"), "--coop", scheme]));
            args.extend(strings(&["--cache-bytes", "0", "--coop-pool-bytes", &pool]));
            args.extend(strings(&["--refresh-hot", "0", "--coop-ack-timeout-ms", "300"]));
            let child = ChildNode::spawn(&exe(), &args).unwrap();
            Proxy { child, listen, admin }
        })
        .collect();
    let all: Vec<&Proxy> = proxies.iter().collect();
    assert_eq!(requests(&all, &trace, 1, 600), 0, "{scheme} on {backend:?}: wrong answers");
    let stats: Vec<Value> = proxies.iter().map(|p| coop_stats(p.admin)).collect();
    let name = format!("{scheme} on {}", backend.name());
    assert!(field(&stats, "local_hits") > 0, "{name}: {stats:?}");
    if scheme != "ac" {
        assert!(field(&stats, "remote_hits") > 0, "{name}: peers served each other: {stats:?}");
    } else {
        assert_eq!(field(&stats, "remote_hits"), 0, "{name}: AC never reads a peer");
    }
    // A holder and home dies: the others answer on, right bytes only.
    proxies[2].child.kill().unwrap();
    let survivors: Vec<&Proxy> = proxies[..2].iter().collect();
    assert_eq!(requests(&survivors, &trace, 2, 400), 0, "{name}: wrong answers after a kill");
    let after: Vec<Value> = survivors.iter().map(|p| coop_stats(p.admin)).collect();
    assert!(field(&after, "local_hits") + field(&after, "remote_hits") > field(&stats[..2], "local_hits"));
    // The proxies' /metrics carry the pool's families (issue 34 item 6),
    // and a cooperative scheme's survivors report the takeover of the
    // dead home's keys.
    let metrics = |admin: SocketAddr| {
        let (status, body) = get(admin, "/metrics").unwrap();
        assert_eq!(status, 200);
        tierstack_testkit::metrics::check(&String::from_utf8(body).unwrap()).unwrap()
    };
    let m = metrics(proxies[0].admin);
    let lookups = |m: &tierstack_testkit::metrics::Metrics, result: &str| {
        m.value("tierstack_coop_lookups_total", &[("result", result)]).unwrap()
    };
    assert!(lookups(&m, "local_hit") + lookups(&m, "remote_hit") > 0.0, "{name}");
    for family in ["tierstack_coop_stalls_total", "tierstack_coop_pool_refusals_total", "tierstack_coop_home_keys"] {
        assert!(m.families().contains(family), "{name}: {family}");
    }
    if !matches!(scheme, "ac" | "groupcache") {
        let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(30);
        while metrics(proxies[0].admin).get("tierstack_coop_takeovers_total") < 1.0 {
            assert!(tierstack_base::time::instant_now() < deadline, "{name}: no takeover reported");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    // The passive nodes took entities (each reports its arrivals to their
    // homes) and print their counters when stopped.
    drop(proxies);
    for (i, node) in passive_nodes.drain(..).enumerate() {
        let out = node.finish().unwrap();
        let stats: Value = serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap();
        let transfers = stats["tally"]["consequential"]["transfer"].as_u64().unwrap_or(0);
        assert!(transfers > 0, "{name}: passive node {i} took nothing: {stats}");
    }
}

#[test]
fn mtacc_proxies_use_passive_memory_nodes_on_shm() {
    static_responses(Backend::Shm, "mtacc");
}

#[test]
fn bcc_proxies_share_static_responses_and_survive_a_kill_on_shm() {
    static_responses(Backend::Shm, "bcc");
}

#[test]
fn ccwr_proxies_share_static_responses_and_survive_a_kill_on_tcp() {
    static_responses(Backend::Tcp, "ccwr");
}

#[test]
fn groupcache_proxies_share_static_responses_and_survive_a_kill_on_shm() {
    static_responses(Backend::Shm, "groupcache");
}

#[test]
fn ac_proxies_keep_to_themselves() {
    static_responses(Backend::Shm, "ac");
}

fn coherent_with_dependencies(backend: Backend, scheme: &str) {
    let config = DeploymentConfig {
        exe: exe(),
        backend,
        mode: "poll".into(),
        proxies: 3,
        compute_threads: 0,
        documents: "zipf".into(),
        docs: 12,
        seed: 1,
        pin: false,
    };
    let extra = ExtraArgs {
        proxy: strings(&["--coop", scheme, "--cache-bytes", "0", "--coop-pool-bytes", "262144"]),
        ..ExtraArgs::default()
    };
    let deployment = Deployment::start_with_args(&config, &DeploymentOptions::default(), &extra).unwrap();
    let mut load = LoadConfig::new(deployment.proxy_urls[0].clone(), Trace::zipf(0.9, 12).unwrap());
    load.targets = deployment.proxy_urls.clone();
    load.update_target = Some(deployment.app_url.clone());
    load.connections = 4;
    load.update_interval_ms = 5;
    load.keep_records = true;
    load.check_bodies = true;
    load.duration_ms = None;
    load.requests_max = Some(3000);
    let report = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(load))
        .unwrap();
    let name = format!("{scheme} on {}", backend.name());
    assert_eq!(report.stale_responses, 0, "{name}: stale responses served: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0), "{name}: offline recount");
    assert_eq!(report.errors.total(), 0, "{name}: {:?}", report.errors);
    assert_eq!(report.ok, report.requests, "{name}");
    assert!(report.updates.done >= 20, "{name}: the updater ran ({} updates)", report.updates.done);
    let stats: Vec<Value> = (0..3).map(|i| coop_stats(deployment.proxy_admin(i).unwrap())).collect();
    assert!(field(&stats, "remote_hits") > 0, "{name}: copies with dependencies served across proxies: {stats:?}");
    assert!(field(&stats, "unusable") > 0, "{name}: some pooled copies failed their version check: {stats:?}");
    deployment.stop().unwrap();
}

#[test]
fn pooled_responses_with_dependencies_are_never_stale_on_shm() {
    coherent_with_dependencies(Backend::Shm, "ccwr");
}

#[test]
fn pooled_responses_with_dependencies_are_never_stale_on_tcp() {
    coherent_with_dependencies(Backend::Tcp, "bcc");
}
