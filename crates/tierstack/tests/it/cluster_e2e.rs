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

    let mut config = LoadConfig::new(proxy_urls[0].clone(), Trace::zipf(0.9, 5).unwrap());
    config.targets = proxy_urls;
    config.update_target = Some(app_url);
    config.connections = 4;
    config.update_interval_ms = 5;
    config.keep_records = true;
    config.check_bodies = true;
    config.duration_ms = None;
    config.requests_max = Some(1500);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = runtime.block_on(run(config)).unwrap();
    assert_eq!(report.stale_responses, 0, "stale responses: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0));
    assert_eq!(report.ok, report.requests, "errors: {:?}", report.errors);
    assert!(report.updates.done > 0, "the updater ran");
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
