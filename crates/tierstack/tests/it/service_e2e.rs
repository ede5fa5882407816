//! Every long-running command as a service, as real processes: with
//! standard input at its end (`< /dev/null`, as under systemd or in a
//! container) each keeps serving; SIGTERM while requests are in flight lets
//! them finish (no client sees a reset), exits 0 and revokes the process's
//! regions (its shm node directory is gone); `/readyz` says ready only once
//! the tier can serve; with `--stop-on-stdin-eof` (or the variable
//! `ChildNode` sets) a tier stops cleanly when its standard input closes;
//! SIGHUP is logged and ignored; `--version`; `--log-format json`.

use crate::exe;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::get;
use tierstack_deploy::process::{free_loopback_port, write_topology, NodeLine, STOP_ON_STDIN_EOF_ENV};
use tierstack_proxy::ProxyStats;

const BOUND: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);

/// A `tierstack` process started with standard input `/dev/null` (and
/// without the stop-on-EOF variable a test runner might pass down).
struct Service {
    child: Child,
    stderr: Option<mpsc::Receiver<String>>,
}

impl Service {
    fn start(args: &[String]) -> Service {
        Self::start_with(args, &[])
    }

    fn start_with(args: &[String], env: &[(&str, &str)]) -> Service {
        let mut command = Command::new(exe());
        command.args(args).env_remove(STOP_ON_STDIN_EOF_ENV).stdin(Stdio::null()).stdout(Stdio::piped());
        command.stderr(if env.is_empty() { Stdio::inherit() } else { Stdio::piped() });
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = child.stderr.take().map(|stderr| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            rx
        });
        let line = rx.recv_timeout(BOUND).unwrap_or_else(|e| panic!("{args:?}: no ready line: {e}"));
        assert_eq!(line.trim(), "ready", "{args:?}");
        Service { child, stderr }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, signal) }, 0);
    }

    /// SIGTERM, then its exit status (bounded).
    fn terminate(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = tierstack_base::time::instant_now() + BOUND;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(tierstack_base::time::instant_now() < deadline, "the process did not exit within {BOUND:?}");
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Waits (bounded) until `condition` holds.
fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tierstack_base::time::instant_now() + BOUND;
    while !condition() {
        assert!(tierstack_base::time::instant_now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(POLL);
    }
}

fn status_of(addr: SocketAddr, path: &str) -> Option<u16> {
    get(addr, path).ok().map(|(code, _)| code)
}

/// A cluster of `nodes` app-role nodes on shm in `dir`, and the module's
/// socket path and a documents file (`d0` … `d7`, 2000 bytes each).
struct Site {
    topology: String,
    shm: PathBuf,
    socket: String,
    documents: String,
}

fn site(dir: &Path, nodes: u32) -> Site {
    let lines: Vec<NodeLine> = (0..nodes).map(|id| NodeLine { id, role: "app", cpu: None }).collect();
    let topology = write_topology(dir, "svc", Backend::Shm, 1000, &lines).unwrap();
    let documents = dir.join("documents.txt");
    let text: String = (0..8).map(|i| format!("d{i} 2000\n")).collect();
    std::fs::write(&documents, text).unwrap();
    Site {
        topology: topology.display().to_string(),
        shm: dir.join("shm"),
        socket: dir.join("module.sock").display().to_string(),
        documents: format!("file:{}", documents.display()),
    }
}

impl Site {
    fn module(&self) -> Service {
        Service::start(&strings(&["app-module", "--topology", &self.topology, "--node", "0", "--socket", &self.socket]))
    }

    fn server(&self, listen: SocketAddr, extra: &[&str]) -> Service {
        let mut args = strings(&["app-server", "--listen", &listen.to_string(), "--module-socket", &self.socket]);
        args.extend(strings(&["--documents", &self.documents]));
        args.extend(strings(extra));
        Service::start(&args)
    }

    fn proxy(&self, node: u32, listen: SocketAddr, admin: SocketAddr, upstream: SocketAddr) -> Service {
        let mut args = tierstack_deploy::deployment::proxy_args(listen, admin, "poll", &self.topology, node);
        args.extend(strings(&["--upstream", &format!("http://{upstream}"), "--grace-ms", "15000"]));
        Service::start(&args)
    }

    fn node_dir(&self, node: u32) -> PathBuf {
        self.shm.join(format!("node-{node}"))
    }
}

/// One GET on a connection of its own; the status line and whether the
/// whole body (Content-Length bytes) arrived, or the I/O error.
fn fetch(addr: SocketAddr, path: &str) -> Result<(u16, bool), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(BOUND)).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(|e| format!("reading the response: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no complete head: {text:?}"))?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or("no status")?;
    let length = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>()))
        .ok_or("no content-length")?
        .map_err(|e| e.to_string())?;
    Ok((code, body.len() == length))
}

#[test]
fn every_tier_keeps_serving_with_its_standard_input_at_its_end_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), 4);
    let mut module = site.module();
    let app = free_loopback_port().unwrap();
    let mut server = site.server(app, &[]);
    let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let mut proxy = site.proxy(1, listen, admin, app);
    let fabric_args = ["fabric", "serve", "--topology", &site.topology, "--node", "2", "--region", "r:4096"];
    let mut owner = Service::start(&strings(&fabric_args));
    let ddss_socket = dir.path().join("ddss.sock").display().to_string();
    let ddss_args = ["ddss-daemon", "--topology", &site.topology, "--node", "3", "--socket", &ddss_socket];
    let mut ddss = Service::start(&strings(&ddss_args));
    let (origin_listen, origin_admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let origin_args = ["origin", "--listen", &origin_listen.to_string(), "--admin", &origin_admin.to_string()];
    let mut origin_args = strings(&origin_args);
    let files = dir.path().join("files.txt");
    std::fs::write(&files, "/a 1000\n").unwrap();
    origin_args.extend(strings(&["--files", &files.display().to_string()]));
    let mut origin = Service::start(&origin_args);

    // Requests after `ready`, with every standard input long at its end.
    for i in 0..8 {
        assert_eq!(fetch(listen, &format!("/doc/d{i}")), Ok((200, true)), "through the proxy");
    }
    assert_eq!(fetch(origin_listen, "/a"), Ok((200, true)), "the origin");
    let client = tierstack_ddss::ipc::DdssClient::connect(&ddss_socket).unwrap();
    assert_eq!(client.info().node, tierstack_base::NodeId(3));
    drop(client);
    for (name, service) in [
        ("module", &mut module),
        ("server", &mut server),
        ("proxy", &mut proxy),
        ("fabric serve", &mut owner),
        ("ddss-daemon", &mut ddss),
        ("origin", &mut origin),
    ] {
        assert!(service.running(), "{name} still serves");
    }
    for node in 0..4 {
        assert!(site.node_dir(node).exists(), "node {node} is attached");
    }

    for (name, service) in
        [("proxy", proxy), ("origin", origin), ("ddss-daemon", ddss), ("fabric serve", owner), ("server", server)]
    {
        assert!(service.terminate().success(), "{name} exits 0 on SIGTERM");
    }
    let status = module.terminate();
    assert!(status.success(), "the module exits 0 on SIGTERM: {status}");
    for node in 0..4 {
        assert!(!site.node_dir(node).exists(), "node {node}'s regions were revoked (its directory removed)");
    }
}

#[test]
fn sigterm_during_load_finishes_requests_in_flight_exits_0_and_revokes_the_proxys_regions() {
    const IN_FLIGHT: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), 2);
    let _module = site.module();
    let app = free_loopback_port().unwrap();
    // Each read takes 1.5-2 s of wall time at the server (an emulated node
    // with enough workers for every request): SIGTERM reaches the proxy
    // while all of them wait for their upstream.
    let _server = site.server(app, &["--cpu-cost", "pareto:1.1,1500000,2000000", "--emulated-workers", "16"]);
    let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    let proxy = site.proxy(1, listen, admin, app);
    assert!(site.node_dir(1).exists(), "the proxy is attached");

    let clients: Vec<_> = (0..IN_FLIGHT)
        .map(|i| {
            std::thread::spawn(move || {
                let outcome = fetch(listen, &format!("/doc/d{i}"));
                (outcome, tierstack_base::time::instant_now())
            })
        })
        .collect();
    // Forwarded (a miss is counted as it is forwarded) and none answered
    // yet (the upstream's time is added when its answer arrives).
    wait_for("every request forwarded and waiting for its upstream", || {
        tierstack_deploy::deployment::get_json::<ProxyStats>(admin, "/_tierstack/stats").is_ok_and(|stats| {
            assert_eq!(stats.upstream_ns, 0, "an upstream answered before SIGTERM: the reads are too fast");
            stats.misses == IN_FLIGHT as u64
        })
    });
    proxy.signal(libc::SIGTERM);
    let signalled = tierstack_base::time::instant_now();
    // The listener closes at once (bounded wait), while the requests finish.
    wait_for("the proxy stops accepting", || TcpStream::connect_timeout(&listen, Duration::from_secs(1)).is_err());
    for (i, client) in clients.into_iter().enumerate() {
        let (outcome, at) = client.join().unwrap();
        assert_eq!(outcome, Ok((200, true)), "request {i} completed, whole");
        assert!(at > signalled, "request {i} was still in flight when SIGTERM arrived");
    }
    let mut proxy = proxy;
    let status = proxy.wait();
    assert!(status.success(), "the proxy exits 0: {status}");
    assert!(!site.node_dir(1).exists(), "the proxy's fabric node (its cache-state region) is revoked");
}

#[test]
fn readyz_turns_ready_only_once_the_tier_can_serve() {
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), 2);
    let app = free_loopback_port().unwrap();
    let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
    // The proxy first: its upstream does not exist yet.
    let _proxy = site.proxy(1, listen, admin, app);
    assert_eq!(status_of(admin, "/healthz"), Some(200), "alive at once");
    let (code, body) = get(admin, "/readyz").unwrap();
    assert_eq!(code, 503, "not ready without an upstream: {body}");
    assert!(body.contains("upstreams"), "{body}");
    assert!(fetch(listen, "/doc/d0").is_ok_and(|(code, _)| code != 200), "indeed it cannot serve");

    let module = site.module();
    let _server = site.server(app, &[]);
    assert_eq!(status_of(app, "/readyz"), Some(200), "the server is ready once its module answers");
    wait_for("the proxy turns ready", || status_of(admin, "/readyz") == Some(200));
    assert_eq!(fetch(listen, "/doc/d0"), Ok((200, true)), "and it serves");

    // The module goes away: the server, then the proxy, are not ready.
    assert!(module.terminate().success());
    wait_for("the server reports its module gone", || status_of(app, "/readyz") == Some(503));
    wait_for("the proxy reports no ready upstream", || status_of(admin, "/readyz") == Some(503));
    assert_eq!(status_of(app, "/healthz"), Some(200), "still alive");
}

#[test]
fn version_json_logs_and_sighup_ignored() {
    let output = Command::new(exe()).arg("--version").output().unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(text.trim(), format!("tierstack {}", env!("CARGO_PKG_VERSION")));

    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), 1);
    let args = ["--log-format", "json", "fabric", "serve", "--topology", &site.topology, "--node", "0"];
    let mut service = Service::start_with(&strings(&args), &[("TIERSTACK_LOG", "info")]);
    let stderr = service.stderr.take().unwrap();
    // SIGHUP is logged and ignored: the service keeps running.
    service.signal(libc::SIGHUP);
    let mut lines = vec![stderr.recv_timeout(BOUND).expect("SIGHUP is logged")];
    assert!(lines[0].contains("SIGHUP") && lines[0].contains("ignored"), "{lines:?}");
    assert!(service.running(), "SIGHUP does not stop it");
    assert!(service.terminate().success());
    lines.extend(stderr.iter());
    assert!(!lines.is_empty(), "it logged its stop");
    for line in &lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(value["level"].is_string() && value["fields"].is_object(), "{line}");
    }
    assert!(lines.iter().any(|l| l.contains("\"cause\":\"SIGTERM\"")), "the stop is logged with its cause: {lines:?}");
}

#[test]
fn a_tier_owned_through_a_pipe_stops_when_its_standard_input_closes_if_asked() {
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), 2);
    let args = |node: &str| strings(&["fabric", "serve", "--topology", &site.topology, "--node", node]);
    // By the option, and by the variable `ChildNode` sets (any boolish value).
    let mut by_option = Command::new(exe());
    by_option.args(args("0")).arg("--stop-on-stdin-eof").env_remove(STOP_ON_STDIN_EOF_ENV);
    let mut by_variable = Command::new(exe());
    by_variable.args(args("1")).env(STOP_ON_STDIN_EOF_ENV, "1");
    for (node, mut command) in [(0, by_option), (1, by_variable)] {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        assert!(child.try_wait().unwrap().is_none(), "it serves while its standard input is open");
        drop(child.stdin.take());
        let mut service = Service { child, stderr: None };
        assert!(service.wait().success(), "node {node} stopped cleanly when its standard input closed");
        assert!(!site.node_dir(node).exists(), "node {node} revoked its regions");
    }
}

/// The module's socket as a boundary, through the binary (issue 30): it is
/// 0600; a second `app-module` on a live module's socket exits non-zero
/// saying so, and the first keeps its socket and serves.
#[test]
fn a_second_app_module_on_a_live_modules_socket_exits_and_the_first_keeps_serving() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), 2);
    let mut module = site.module();
    let first = std::fs::symlink_metadata(&site.socket).unwrap();
    assert_eq!(first.permissions().mode() & 0o7777, 0o600);
    let args = ["app-module", "--topology", &site.topology, "--node", "1", "--socket", &site.socket];
    let mut command = Command::new(exe());
    command.args(args).env_remove(STOP_ON_STDIN_EOF_ENV).stdin(Stdio::null()).stdout(Stdio::null());
    let mut second = Service { child: command.stderr(Stdio::piped()).spawn().unwrap(), stderr: None };
    // Bounded: a module that took the socket over would serve for ever.
    let status = second.wait();
    let mut stderr = String::new();
    second.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(!status.success(), "the second module must not start: {stderr}");
    assert!(stderr.contains("a module already serves"), "{stderr}");
    let kept = std::fs::symlink_metadata(&site.socket).unwrap();
    assert_eq!((kept.dev(), kept.ino()), (first.dev(), first.ino()), "the live module's socket is kept");
    // The first still serves: a server reaches it at start and reads through it.
    let app = free_loopback_port().unwrap();
    let _server = site.server(app, &[]);
    assert_eq!(status_of(app, "/doc/d0"), Some(200));
    assert!(module.running());
}
