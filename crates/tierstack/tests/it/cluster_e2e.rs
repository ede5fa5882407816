//! `tierstack cluster up|status|down` on a 1-module, 1-server, 2-proxy
//! topology, as real detached processes: `up` returns with every service
//! ready and still running, the proxies serve coherent traffic (the load
//! client's staleness checker finds nothing stale), `status` reports every
//! node alive and ready, and `down` leaves no process behind and every
//! fabric node revoked.

use crate::exe;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tierstack_deploy::cluster::{State, STATE_FILE};
use tierstack_deploy::process::free_loopback_port;
use tierstack_loadgen::{run, LoadConfig};
use tierstack_workload::Trace;

fn tierstack(args: &[&str]) -> Output {
    Command::new(exe()).args(args).output().unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Stops what `cluster up` started if the test ends before its own
/// `cluster down` (a failed assertion): the services are detached and
/// would otherwise outlive the test.
struct DownOnDrop {
    args: Vec<String>,
    armed: bool,
}

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
            let _ = Command::new(exe()).args(&args).output();
        }
    }
}

/// Writes the topology: module 0, server 1, proxies 2 and 3, on shm in `dir`.
fn topology(dir: &Path) -> (PathBuf, String, Vec<String>) {
    let app = free_loopback_port().unwrap();
    let ports: Vec<_> = (0..4).map(|_| free_loopback_port().unwrap()).collect();
    let text = format!(
        r#"[cluster]
name = "up"
fabric = "shm"
shm_root = "{shm}"

[[node]]
id = 0
role = "app"
[node.service]
kind = "app-module"
socket = "{socket}"

[[node]]
id = 1
role = "app"
[node.service]
kind = "app-server"
listen = "{app}"
module = 0
args = ["--documents", "zipf", "--docs", "5"]

[[node]]
id = 2
role = "proxy"
[node.service]
kind = "proxy"
listen = "{p0}"
admin = "{a0}"
upstreams = [1]

[[node]]
id = 3
role = "proxy"
[node.service]
kind = "proxy"
listen = "{p1}"
admin = "{a1}"
upstreams = [1]
mode = "poll"
"#,
        shm = dir.join("shm").display(),
        socket = dir.join("module.sock").display(),
        p0 = ports[0],
        a0 = ports[1],
        p1 = ports[2],
        a1 = ports[3],
    );
    let path = dir.join("dc.toml");
    std::fs::write(&path, text).unwrap();
    (path, format!("http://{app}"), vec![format!("http://{}", ports[0]), format!("http://{}", ports[2])])
}

#[test]
fn cluster_up_serves_coherent_traffic_and_down_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app_url, proxy_urls) = topology(dir.path());
    let path_arg = path.display().to_string();
    let run_dir = dir.path().join("run");
    let run_arg = run_dir.display().to_string();

    let mut guard = DownOnDrop {
        args: ["cluster", "down", &path_arg, "--run-dir", &run_arg].map(String::from).to_vec(),
        armed: true,
    };
    let up = tierstack(&["cluster", "up", &path_arg, "--run-dir", &run_arg, "--grace-ms", "5000"]);
    assert!(up.status.success(), "cluster up: {}", text(&up));
    let state = State::load(&run_dir).unwrap();
    let kinds: Vec<&str> = state.processes.iter().map(|p| p.kind.as_str()).collect();
    assert_eq!(kinds, vec!["app-module", "app-server", "proxy", "proxy"]);
    assert!(state.processes.iter().all(|p| p.alive()), "every service outlived `cluster up`");

    let again = tierstack(&["cluster", "up", &path_arg, "--run-dir", &run_arg]);
    assert!(!again.status.success() && text(&again).contains("still up"), "{}", text(&again));

    let status = tierstack(&["cluster", "status", &path_arg, "--run-dir", &run_arg]);
    assert!(status.status.success(), "cluster status: {}", text(&status));
    let rows: Vec<&str> = status.stdout.split(|&b| b == b'\n').filter_map(|l| std::str::from_utf8(l).ok()).collect();
    let healthy_ready = rows
        .iter()
        .filter(|l| {
            let columns: Vec<&str> = l.split_whitespace().collect();
            columns.len() > 6 && columns[3..6] == ["yes", "yes", "yes"]
        })
        .count();
    assert_eq!(healthy_ready, 4, "every node alive, healthy and ready: {}", text(&status));

    let report = checked_load(proxy_urls, app_url, 5, 1500);
    assert!(report.cache_hits > 0, "the proxies cached");

    guard.armed = false;
    let down = tierstack(&["cluster", "down", &path_arg, "--run-dir", &run_arg]);
    assert!(down.status.success(), "cluster down: {}", text(&down));
    assert_eq!(text(&down).matches("stopped in").count(), 4, "{}", text(&down));
    for process in &state.processes {
        assert!(!process.alive(), "node {} (pid {}) is gone", process.node, process.pid);
    }
    for node in 0..4 {
        assert!(!dir.path().join(format!("shm/node-{node}")).exists(), "node {node}'s regions are revoked");
    }
    assert!(!run_dir.join(STATE_FILE).exists(), "the state file is removed");
    let status = tierstack(&["cluster", "status", &path_arg, "--run-dir", &run_arg]);
    assert!(!status.status.success(), "nothing is up any more");
}

/// `cluster up|status|down` with `dir` as the run directory's parent; the
/// guard downs the cluster if the test fails first.
struct Up {
    path: String,
    run: String,
    guard: DownOnDrop,
}

impl Up {
    fn start(path: &Path, run_dir: &Path) -> Up {
        let (path, run) = (path.display().to_string(), run_dir.display().to_string());
        let guard =
            DownOnDrop { args: ["cluster", "down", &path, "--run-dir", &run].map(String::from).to_vec(), armed: true };
        let up = tierstack(&["cluster", "up", &path, "--run-dir", &run, "--grace-ms", "5000"]);
        assert!(up.status.success(), "cluster up: {}", text(&up));
        Up { path, run, guard }
    }

    fn status(&self) -> Output {
        tierstack(&["cluster", "status", &self.path, "--run-dir", &self.run])
    }

    fn down(mut self) -> String {
        self.guard.armed = false;
        let down = tierstack(&["cluster", "down", &self.path, "--run-dir", &self.run]);
        assert!(down.status.success(), "cluster down: {}", text(&down));
        text(&down)
    }
}

/// Every service of `state` that names a metrics address serves /metrics
/// as Prometheus takes it; returns them by node.
fn scrape_all(state: &State) -> Vec<(u32, tierstack_testkit::metrics::Metrics)> {
    state
        .processes
        .iter()
        .filter_map(|p| p.metrics.map(|addr| (p.node, addr)))
        .map(|(node, addr)| {
            let response = tierstack_testkit::http::get(addr, "/metrics").unwrap();
            assert_eq!(response.status, 200, "node {node}'s /metrics");
            let checked = tierstack_testkit::metrics::check(&response.text())
                .unwrap_or_else(|e| panic!("node {node}'s /metrics: {e}"));
            (node, checked)
        })
        .collect()
}

/// Polls the state file until `node` runs again after `restarts` restarts.
fn wait_restarted(run_dir: &Path, node: u32, restarts: u32, old_pid: u32) -> State {
    let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(60);
    loop {
        if let Ok(state) = State::load(run_dir) {
            let process = state.processes.iter().find(|p| p.node == node).unwrap();
            if process.restarts == restarts && process.pid != old_pid && process.alive() {
                return state;
            }
        }
        assert!(tierstack_base::time::instant_now() < deadline, "node {node} was not restarted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn kill(pid: u32) {
    // SAFETY: kill has no memory preconditions; the pid is a live child of the supervisor.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
}

/// A checked load through `proxy_urls` with an updater: nothing stale, every request ok.
fn checked_load(proxy_urls: Vec<String>, app_url: String, docs: usize, requests: u64) -> tierstack_loadgen::LoadReport {
    let mut config = LoadConfig::new(proxy_urls[0].clone(), Trace::zipf(0.9, docs).unwrap());
    config.targets = proxy_urls;
    config.update_target = Some(app_url);
    config.connections = 4;
    config.update_interval_ms = 5;
    config.keep_records = true;
    config.check_bodies = true;
    config.duration_ms = None;
    config.requests_max = Some(requests);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = runtime.block_on(run(config)).unwrap();
    assert_eq!(report.stale_responses, 0, "stale responses: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0));
    assert_eq!(report.ok, report.requests, "errors: {:?}", report.errors);
    assert!(report.updates.done > 0, "the updater ran");
    report
}

/// The issue: the shipped one-machine trial could not start. `deploy/local.toml`,
/// byte for byte (in a scratch directory, where its relative paths land),
/// starts under `cluster up`, serves checked traffic with nothing stale,
/// every service's /metrics parses, and a SIGKILLed proxy, application
/// server and module are started again by the supervisor (counted), after
/// which the traffic is still checked clean (the server reconnects to the
/// new module) and `top` sees every tier up.
#[test]
fn the_one_machine_example_starts_as_is_and_killed_nodes_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local.toml");
    let path = dir.path().join("local.toml");
    std::fs::copy(&example, &path).unwrap();
    let topology = tierstack_cluster::Topology::load(&path).unwrap();
    let listen = |node: u32| topology.node(tierstack_base::NodeId(node)).unwrap().service.as_ref().unwrap().listen;
    let app_url = format!("http://{}", listen(1).unwrap());
    let proxy_urls: Vec<String> = [2, 3].iter().map(|n| format!("http://{}", listen(*n).unwrap())).collect();
    let run_dir = dir.path().join("run");
    let up = Up::start(&path, &run_dir);

    let state = State::load(&run_dir).unwrap();
    let kinds: Vec<&str> = state.processes.iter().map(|p| p.kind.as_str()).collect();
    assert_eq!(kinds, vec!["app-module", "app-server", "proxy", "proxy"]);
    assert!(up.status().status.success(), "{}", text(&up.status()));
    assert_eq!(scrape_all(&state).len(), 4, "every service of the example serves /metrics");
    let first = checked_load(proxy_urls.clone(), app_url.clone(), 100, 1000);

    // A proxy, then the application server, killed: each comes back.
    let proxy = state.processes[2].pid;
    kill(proxy);
    let state = wait_restarted(&run_dir, 2, 1, proxy);
    let server = state.processes[1].pid;
    kill(server);
    let state = wait_restarted(&run_dir, 1, 1, server);
    let status = up.status();
    assert!(status.status.success(), "every service alive and ready again: {}", text(&status));
    let restarts: Vec<u32> = state.processes.iter().map(|p| p.restarts).collect();
    assert_eq!(restarts, vec![0, 1, 1, 0]);
    checked_load(proxy_urls.clone(), app_url.clone(), 100, 1000);

    // The module, killed: a new version table (a new incarnation); the
    // server connects to it again, and nothing cached from the old one is
    // served as current.
    let module = state.processes[0].pid;
    kill(module);
    let state = wait_restarted(&run_dir, 0, 1, module);
    let status = up.status();
    assert!(status.status.success(), "{}", text(&status));
    let report = checked_load(proxy_urls, app_url, 100, 1000);
    let incarnations =
        |r: &tierstack_loadgen::LoadReport| r.incarnations.iter().map(|i| i.incarnation.clone()).collect::<Vec<_>>();
    assert_eq!(incarnations(&first).len(), 1);
    assert_eq!(incarnations(&report).len(), 1, "only the new module's versions after its restart");
    assert_ne!(incarnations(&first), incarnations(&report));
    let metrics = scrape_all(&state);
    let proxy_requests = metrics.iter().find(|(n, _)| *n == 2).unwrap().1.get("tierstack_proxy_requests_total");
    assert!(proxy_requests > 0.0, "the restarted proxy served the later runs");
    let server = &metrics.iter().find(|(n, _)| *n == 1).unwrap().1;
    assert_eq!(server.get("tierstack_appserver_module_reconnects_total"), 1.0, "the server reconnected once");

    let top = tierstack(&["top", "--topology", &up.path, "--once", "--json", "--interval-ms", "200"]);
    assert!(top.status.success(), "{}", text(&top));
    let top: serde_json::Value = serde_json::from_slice(&top.stdout).unwrap();
    let tiers = top["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 4, "{top}");
    assert!(tiers.iter().all(|t| t["down"].is_null() && t["cpu_percent"].is_number()), "{top}");

    let down = up.down();
    assert_eq!(down.matches("stopped in").count(), 4, "{down}");
    for process in &state.processes {
        assert!(!process.alive(), "node {} (pid {}) is gone", process.node, process.pid);
    }
}

/// `cluster up` starts every kind a topology can name (each with its
/// metrics listener where it takes one), `status` finds them all alive and
/// ready, and `down` stops them all on SIGTERM.
#[test]
fn cluster_up_starts_every_kind_of_service() {
    let dir = tempfile::tempdir().unwrap();
    let port = || free_loopback_port().unwrap();
    // Lock managers and a static origin; then substrates, a PRESS node and
    // a cooperative-cache node: each subsystem takes every fabric node of
    // its topology as a member, so each set is a cluster of its own.
    let locks = format!(
        r#"[cluster]
name = "locks"
fabric = "shm"
shm_root = "shm-locks"

[[node]]
id = 0
role = "app"
[node.service]
kind = "dlm-node"
metrics = "{m0}"
args = ["--locks", "0..4", "--ops", "0"]

[[node]]
id = 1
role = "app"
[node.service]
kind = "dlm-node"
metrics = "{m1}"
args = ["--locks", "0..4", "--ops", "0"]

[[node]]
id = 2
role = "passive"
[node.service]
kind = "origin"
listen = "{origin}"
admin = "{origin_admin}"
args = ["--trace", "zipf", "--docs", "10"]
"#,
        m0 = port(),
        m1 = port(),
        origin = port(),
        origin_admin = port(),
    );
    let others = format!(
        r#"[cluster]
name = "others"
fabric = "shm"
shm_root = "shm-others"

[[node]]
id = 0
role = "app"
[node.service]
kind = "ddss-daemon"
socket = "ddss-0.sock"
metrics = "{m0}"

[[node]]
id = 1
role = "app"
[node.service]
kind = "ddss-daemon"
socket = "ddss-1.sock"

[[node]]
id = 2
role = "proxy"
[node.service]
kind = "press-node"
listen = "{press}"
metrics = "{m2}"
args = ["--trace", "zipf", "--docs", "10"]

[[node]]
id = 3
role = "proxy"
[node.service]
kind = "coop-node"
metrics = "{m3}"
args = ["--scheme", "mtacc"]
"#,
        m0 = port(),
        press = port(),
        m2 = port(),
        m3 = port(),
    );
    for (name, topology, kinds) in [
        ("locks", locks, vec!["dlm-node", "dlm-node", "origin"]),
        ("others", others, vec!["ddss-daemon", "ddss-daemon", "coop-node", "press-node"]),
    ] {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, topology).unwrap();
        let run_dir = dir.path().join(format!("{name}.run"));
        let up = Up::start(&path, &run_dir);
        let state = State::load(&run_dir).unwrap();
        assert_eq!(state.processes.iter().map(|p| p.kind.as_str()).collect::<Vec<_>>(), kinds);
        let status = up.status();
        assert!(status.status.success(), "{name}: {}", text(&status));
        let scraped = scrape_all(&state);
        assert_eq!(scraped.len(), state.processes.iter().filter(|p| p.metrics.is_some()).count());
        assert!(scraped.iter().all(|(_, m)| m.get("process_cpu_seconds_total") >= 0.0));
        if name == "others" {
            // A supervisor killed outright leaves its services running,
            // unsupervised: `status` says so, and `down` still stops them.
            kill(state.supervisor.unwrap().pid);
            let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(10);
            while state.supervisor.unwrap().alive() {
                assert!(tierstack_base::time::instant_now() < deadline, "the supervisor did not die");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let status = up.status();
            assert!(
                !status.status.success() && text(&status).contains("supervisor is not running"),
                "{}",
                text(&status)
            );
            assert!(state.processes.iter().all(|p| p.alive()), "the services outlive their supervisor");
        }
        let down = up.down();
        assert_eq!(down.matches("stopped in").count(), kinds.len(), "{name}: {down}");
    }
}
