//! Hung and killed application servers behind least-loaded balancing, as
//! processes: the module, two application servers publishing their load
//! and heartbeat, and one proxy per monitoring scheme over them.
//!
//! - **SIGSTOP** (shm and tcp): a stopped server's counters freeze at
//!   "idle", the black hole a balancer falls into. With the liveness word,
//!   every scheme calls it suspect: of a run of sequential GETs after the
//!   stop, at most the one in flight when suspicion came went there (and
//!   was given up and answered by the other server, counted as abandoned,
//!   never waiting out the 30 s upstream timeout); after SIGCONT it is used
//!   again.
//! - **SIGKILL** under concurrent load: no GET of any client gets anything
//!   but 200 (requests on the killed server's connections are retried on
//!   the other, connections refused too, and the server is paused).

use crate::exe;
use crate::monitor_e2e::{get, stats};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{proxy_args, strings};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_monitor::Scheme;
use tierstack_proxy::ProxyStats;

const DOCS: [&str; 4] = ["a", "b", "c", "d"];
/// The proxies' liveness bound (`--suspect-after-ms`).
const SUSPECT_AFTER_MS: &str = "200";
/// Bound on waiting for a condition: a hang guard, not a speed claim.
const PATIENCE: Duration = Duration::from_secs(30);

struct Rig {
    _dir: tempfile::TempDir,
    _module: ChildNode,
    servers: Vec<ChildNode>,
    /// (scheme, listen, admin, process) per proxy.
    proxies: Vec<(Scheme, SocketAddr, SocketAddr, ChildNode)>,
}

fn rig(backend: Backend) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<NodeLine> = (0..=2).map(|id| NodeLine { id, role: "app", cpu: None }).collect();
    nodes.extend((3..=6).map(|id| NodeLine { id, role: "proxy", cpu: None }));
    let topology = write_topology(dir.path(), "liveness", backend, 1000, &nodes).unwrap().display().to_string();
    let socket = dir.path().join("module.sock").display().to_string();
    let documents = dir.path().join("docs.txt");
    std::fs::write(&documents, DOCS.iter().map(|d| format!("{d} 200\n")).collect::<String>()).unwrap();
    let documents = format!("file:{}", documents.display());
    let module = ChildNode::spawn(
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
        ]);
        servers.push(ChildNode::spawn(&exe(), &args).unwrap());
        upstreams.push((format!("http://{listen}"), format!("{node}@{monitor}")));
    }
    let mut proxies = Vec::new();
    for (scheme, node) in Scheme::ALL.into_iter().zip(3u32..) {
        let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
        let mut args = proxy_args(listen, admin, "no-cache", &topology, node);
        args.extend(strings(&["--balance", "least-loaded", "--monitor", scheme.name(), "--monitor-interval-ms", "5"]));
        args.extend(strings(&["--suspect-after-ms", SUSPECT_AFTER_MS]));
        for (url, monitor) in &upstreams {
            args.extend(strings(&["--upstream", url, "--upstream-monitor", monitor]));
        }
        proxies.push((scheme, listen, admin, ChildNode::spawn(&exe(), &args).unwrap()));
    }
    Rig { _dir: dir, _module: module, servers, proxies }
}

fn signal(server: &ChildNode, signal: libc::c_int) {
    // SAFETY: kill(2) on a child of ours, by pid.
    let sent = unsafe { libc::kill(server.pid() as libc::pid_t, signal) };
    assert_eq!(sent, 0, "kill({}, {signal})", server.pid());
}

/// Stops `server` and returns once every thread of it is stopped.
fn stop(server: &ChildNode) {
    signal(server, libc::SIGSTOP);
    tierstack_testkit::child::wait_stopped(server.pid(), PATIENCE);
}

fn warm_up(rig: &Rig) {
    for (scheme, listen, admin, _) in &rig.proxies {
        for doc in DOCS.iter().cycle().take(8) {
            let (status, body) = get(*listen, &format!("/doc/{doc}"));
            assert_eq!(status, 200, "{scheme}: {body}");
        }
        assert!(stats(*admin).routed.iter().all(|r| *r > 0), "{scheme}: both servers in use before the stop");
    }
}

#[test]
fn a_stopped_server_is_avoided_by_every_scheme_and_used_again_when_resumed() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let rig = rig(backend);
        warm_up(&rig);
        let before: Vec<ProxyStats> = rig.proxies.iter().map(|(_, _, admin, _)| stats(*admin)).collect();
        stop(&rig.servers[1]);
        for ((scheme, listen, admin, _), before) in rig.proxies.iter().zip(&before) {
            let what = format!("{scheme} on {}", backend.name());
            for doc in DOCS.iter().cycle().take(16) {
                let (status, body) = get(*listen, &format!("/doc/{doc}"));
                assert_eq!(status, 200, "{what}: {body}");
            }
            let after = stats(*admin);
            let sent_to_stopped = after.routed[1] - before.routed[1];
            assert!(sent_to_stopped <= 2, "{what}: {sent_to_stopped} requests went to the stopped server: {after:?}");
            assert_eq!(
                after.upstream_abandoned - before.upstream_abandoned,
                sent_to_stopped,
                "{what}: each was given up when it turned suspect: {after:?}"
            );
            assert_eq!(after.upstream_timeouts, 0, "{what}: none waited out the upstream timeout");
        }
        signal(&rig.servers[1], libc::SIGCONT);
        for (scheme, listen, admin, _) in &rig.proxies {
            let what = format!("{scheme} on {}", backend.name());
            let resumed_from = stats(*admin).routed[1];
            let deadline = instant_now() + PATIENCE;
            while stats(*admin).routed[1] == resumed_from {
                assert!(instant_now() < deadline, "{what}: the resumed server was never used again");
                assert_eq!(get(*listen, "/doc/a").0, 200, "{what}");
            }
        }
    }
}

#[test]
fn a_killed_server_costs_no_client_an_error() {
    let mut rig = rig(Backend::Shm);
    warm_up(&rig);
    let stop = AtomicBool::new(false);
    let (served, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        for (scheme, listen, _, _) in &rig.proxies {
            for client in 0..2 {
                let (stop, served, failed) = (&stop, &served, &failed);
                scope.spawn(move || {
                    let mut i = client;
                    while !stop.load(Ordering::Relaxed) {
                        let doc = DOCS[i % DOCS.len()];
                        i += 1;
                        let (status, body) = get(*listen, &format!("/doc/{doc}"));
                        if status == 200 {
                            served.fetch_add(1, Ordering::Relaxed);
                        } else {
                            failed.fetch_add(1, Ordering::Relaxed);
                            eprintln!("{scheme}: {status} {body}");
                        }
                    }
                });
            }
        }
        // Some load first, then the kill, then as much again.
        let deadline = instant_now() + PATIENCE;
        while served.load(Ordering::Relaxed) < 200 && instant_now() < deadline {
            std::thread::yield_now();
        }
        rig.servers[1].kill().unwrap();
        let at_kill = served.load(Ordering::Relaxed);
        while served.load(Ordering::Relaxed) < at_kill + 200 && instant_now() < deadline {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(served.load(Ordering::Relaxed) >= 400, "the load ran: {}", served.load(Ordering::Relaxed));
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no client saw an error");
    for (scheme, _, admin, _) in &rig.proxies {
        let stats = stats(*admin);
        assert_eq!(stats.upstream_errors, 0, "{scheme}: {stats:?}");
    }
}

/// `bench monitor --figure hung` end to end, quick: every scheme with and
/// without liveness is measured without client errors; with liveness off
/// nothing is ever given up on suspicion, with it some stuck requests are.
#[test]
fn the_hung_bench_runs_every_scheme_with_and_without_liveness() {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(exe())
        .args(["bench", "monitor", "--figure", "hung", "--quick", "--connections", "8", "--out"])
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("monitor_hung.json")).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 2 * Scheme::ALL.len());
    let mut abandoned_with_liveness = 0;
    for point in points {
        assert_eq!(point["errors"], 0, "{point}");
        assert!(point["requests"].as_u64().unwrap() > 0, "{point}");
        let abandoned = point["abandoned"].as_u64().unwrap();
        if point["liveness"] == false {
            assert_eq!(abandoned, 0, "nothing is given up on suspicion with liveness off: {point}");
        } else {
            abandoned_with_liveness += abandoned;
        }
    }
    assert!(abandoned_with_liveness > 0, "the stop caught requests and liveness gave some up");
    assert!(out.path().join("hung_throughput.svg").exists());
}
