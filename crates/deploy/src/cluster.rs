//! `tierstack cluster up|status|down <topology.toml>`: the tier processes a
//! topology's `[node.service]` sections describe (see `tierstack_cluster`),
//! started on this host as detached services.
//!
//! - **up** starts the services in dependency order (modules, application
//!   servers, proxies), each with [`spawn_service`]: its own session,
//!   standard input `/dev/null`, output into `<run dir>/node-<id>.out` and
//!   `.log`. The same pinning as the demo: each process pins itself to its
//!   node's `cpu` when it opens its fabric node. Each must print `ready`
//!   and then answer `/readyz` with 200 (where it has an HTTP listener)
//!   within [`READY_TIMEOUT`] before the next starts. The pids (with their
//!   kernel start times, so a reused pid is never signalled) go to
//!   `<run dir>/cluster.json` after every start, so a failed `up` can still
//!   be taken `down`; a failed `up` stops what it started.
//! - **status** reads that file: every process alive, its `/healthz`,
//!   `/readyz`, and its load (the proxies' and servers' counters).
//! - **exec** ([`exec_command`]) is one node's service in the caller's
//!   place, for systemd units and containers.
//! - **down** sends SIGTERM, proxies first, waits for each (bounded by the
//!   grace period plus [`DOWN_MARGIN`]), SIGKILLs what is still there and
//!   reports it; the state file is removed once nothing is left.
//!
//! [`plan`] (topology to command lines) is pure.

use crate::deployment::{get, proxy, strings};
use crate::process::{spawn_service, READY_TIMEOUT};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tierstack_appserver::{AppServerArgs, ModuleArgs};
use tierstack_cluster::{NodeArgs, ServiceKind, Topology};
use tierstack_proxy::{CacheMode, ProxyArgs};
use tierstack_tier_http::service::ServiceArgs;
use tierstack_tier_http::{HEALTHZ_PATH, READYZ_PATH};

/// The state file in the run directory.
pub const STATE_FILE: &str = "cluster.json";
/// What `down` waits beyond the services' grace period before SIGKILL.
pub const DOWN_MARGIN: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);
/// A proxy's cache mode when its service names none.
pub const PROXY_MODE_DEFAULT: &str = "poll";

/// One process to start.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub node: u32,
    pub kind: ServiceKind,
    /// The `tierstack` arguments (subcommand first).
    pub args: Vec<String>,
    /// Where its `/healthz` and `/readyz` answer (none for the module).
    pub health: Option<SocketAddr>,
    /// The module's socket: it is healthy and ready while that accepts a
    /// connection.
    pub socket: Option<PathBuf>,
}

/// The command lines of `topology`'s services, in start order: modules,
/// application servers, proxies (each kind in file order). `topology_path`
/// is passed to every process as `--topology`.
pub fn plan(topology: &Topology, topology_path: &Path) -> Result<Vec<Launch>> {
    let socket_of = |module: tierstack_base::NodeId| -> Result<PathBuf> {
        let spec = topology.node(module)?.service.as_ref().and_then(|s| s.socket.as_ref());
        Ok(spec.with_context(|| format!("{module} has no module socket"))?.clone())
    };
    let url_of = |server: tierstack_base::NodeId| -> Result<String> {
        let spec = topology.node(server)?.service.as_ref().and_then(|s| s.listen);
        Ok(format!("http://{}", spec.with_context(|| format!("{server} has no listener"))?))
    };
    let mut launches = Vec::new();
    for kind in [ServiceKind::AppModule, ServiceKind::AppServer, ServiceKind::Proxy] {
        for (node, service) in topology.services().filter(|(_, s)| s.kind == kind) {
            let at = NodeArgs { topology: topology_path.to_path_buf(), node: node.id.0 };
            let mut args = strings(&[kind.command()]);
            let (mut health, mut socket) = (None, None);
            let missing = |field: &str| format!("{}'s service has no {field}", node.id);
            match kind {
                ServiceKind::AppModule => {
                    let path = service.socket.as_ref().with_context(|| missing("socket"))?;
                    args.extend(ModuleArgs::new(at, path.clone()).to_args());
                    socket = Some(path.clone());
                }
                ServiceKind::AppServer => {
                    let listen = service.listen.with_context(|| missing("listen"))?;
                    let module = service.module.with_context(|| missing("module"))?;
                    let server = AppServerArgs {
                        topology: Some(at.topology),
                        node: Some(at.node),
                        ..AppServerArgs::new(listen, socket_of(module)?)
                    };
                    args.extend(server.to_args());
                    health = Some(listen);
                }
                ServiceKind::Proxy => {
                    let listen = service.listen.with_context(|| missing("listen"))?;
                    let admin = service.admin.with_context(|| missing("admin"))?;
                    // The same command line as the demo's proxies.
                    let mode = service.mode.as_deref().unwrap_or(PROXY_MODE_DEFAULT);
                    let mode =
                        mode.parse::<CacheMode>().map_err(anyhow::Error::msg).with_context(|| missing("known mode"))?;
                    let upstreams = service.upstreams.iter().map(|u| url_of(*u)).collect::<Result<Vec<_>>>()?;
                    // Refused here too, before anything starts.
                    let token = service.args.iter().any(|a| a.split('=').next() == Some("--admin-token-file"));
                    tierstack_proxy::check_admin_exposure(Some(admin), token)
                        .with_context(|| format!("{}'s service", node.id))?;
                    let proxy = ProxyArgs { upstreams, ..proxy(listen, admin, mode, topology_path, node.id.0) };
                    args.extend(proxy.to_args());
                    health = Some(admin);
                }
            }
            args.extend(service.args.iter().cloned());
            launches.push(Launch { node: node.id.0, kind, args, health, socket });
        }
    }
    if launches.is_empty() {
        bail!("the topology describes no services ([node.service] sections)");
    }
    Ok(launches)
}

/// `tierstack cluster exec`: the command (`exe` and its arguments) that
/// runs `node`'s service as `up` would start it, refused unless the service
/// is of `kind` when one is named; without stop-on-stdin-eof (a unit's
/// standard input is not its owner).
pub fn exec_command(
    exe: &Path,
    topology_path: &Path,
    node: u32,
    kind: Option<&str>,
    grace_ms: u64,
) -> Result<std::process::Command> {
    let path = std::fs::canonicalize(topology_path)
        .with_context(|| format!("reading topology {}", topology_path.display()))?;
    let topology = Topology::load(&path)?;
    let launches = plan(&topology, &path)?;
    let launch = launches
        .iter()
        .find(|l| l.node == node)
        .with_context(|| format!("node {node} has no [node.service] in {}", path.display()))?;
    if let Some(kind) = kind {
        anyhow::ensure!(launch.kind.command() == kind, "node {node} runs {}, not {kind}", launch.kind.command());
    }
    let mut command = std::process::Command::new(exe);
    command
        .args(&launch.args)
        .args(ServiceArgs { stop_on_stdin_eof: false, grace_ms }.to_args())
        .env_remove(crate::process::STOP_ON_STDIN_EOF_ENV);
    Ok(command)
}

/// A started process, as the state file records it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Started {
    pub node: u32,
    pub kind: String,
    pub pid: u32,
    /// The kernel's start time of `pid` (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    pub health: Option<SocketAddr>,
    /// app-server and proxy: where `/_tierstack/stats` answers.
    pub stats: Option<SocketAddr>,
    /// app-module: its socket.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    pub log: PathBuf,
}

/// `<run dir>/cluster.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub topology: PathBuf,
    pub grace_ms: u64,
    /// In start order.
    pub processes: Vec<Started>,
}

impl State {
    pub fn load(run_dir: &Path) -> Result<State> {
        let path = run_dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (is the cluster up, with this --run-dir?)", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn save(&self, run_dir: &Path) -> Result<()> {
        let path = run_dir.join(STATE_FILE);
        let temporary = run_dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&temporary, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(&temporary, &path).with_context(|| format!("writing {}", path.display()))
    }
}

/// The start time of `pid` if it runs (not a zombie), from `/proc`.
pub fn start_time_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // Fields after the name start at field 3 (state); starttime is field 22.
    fields.nth(18)?.parse().ok()
}

impl Started {
    /// The recorded process still runs (the same one: its start time matches).
    pub fn alive(&self) -> bool {
        start_time_of(self.pid) == Some(self.start_time)
    }

    fn signal(&self, signal: libc::c_int) -> bool {
        // Checked just before: the pid is still the process we started
        // (a pid is not reused while its start time matches).
        // SAFETY: kill has no memory preconditions.
        self.alive() && unsafe { libc::kill(self.pid as libc::pid_t, signal) } == 0
    }
}

/// What `up` needs besides the topology.
#[derive(Clone, Debug)]
pub struct UpConfig {
    /// The `tierstack` executable.
    pub exe: PathBuf,
    pub run_dir: PathBuf,
    /// Passed to every service as `--grace-ms`.
    pub grace_ms: u64,
}

/// Starts every service of the topology at `topology_path` (see the module
/// documentation) and returns the state written to the run directory.
pub fn up(topology_path: &Path, config: &UpConfig) -> Result<State> {
    let topology_path = std::fs::canonicalize(topology_path)
        .with_context(|| format!("reading topology {}", topology_path.display()))?;
    let topology = Topology::load(&topology_path)?;
    let launches = plan(&topology, &topology_path)?;
    std::fs::create_dir_all(&config.run_dir).with_context(|| format!("creating {}", config.run_dir.display()))?;
    if let Ok(previous) = State::load(&config.run_dir) {
        if previous.processes.iter().any(Started::alive) {
            bail!("a cluster from {} is still up: `tierstack cluster down` it first", config.run_dir.display());
        }
    }
    let mut state = State { topology: topology_path.clone(), grace_ms: config.grace_ms, processes: Vec::new() };
    for launch in &launches {
        match start_one(launch, config) {
            Ok(started) => {
                state.processes.push(started);
                state.save(&config.run_dir)?;
            }
            Err(e) => {
                let stopped = down_state(&state);
                let _ = std::fs::remove_file(config.run_dir.join(STATE_FILE));
                let note = stopped.map(|r| r.summary()).unwrap_or_else(|e| format!("stopping the others: {e:#}"));
                return Err(e.context(format!("starting node {} ({}); {note}", launch.node, launch.kind.command())));
            }
        }
    }
    Ok(state)
}

fn start_one(launch: &Launch, config: &UpConfig) -> Result<Started> {
    let out_path = config.run_dir.join(format!("node-{}.out", launch.node));
    let log_path = config.run_dir.join(format!("node-{}.log", launch.node));
    let out = std::fs::File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut args = launch.args.clone();
    args.extend(ServiceArgs { stop_on_stdin_eof: false, grace_ms: config.grace_ms }.to_args());
    let mut child = spawn_service(&config.exe, &args, out, log)?;
    let pid = child.id();
    let start_time = start_time_of(pid).context("the process vanished at once")?;
    let started = Started {
        node: launch.node,
        kind: launch.kind.command().to_string(),
        pid,
        start_time,
        health: launch.health,
        stats: launch.health,
        socket: launch.socket.clone(),
        log: log_path.clone(),
    };
    let deadline = tierstack_base::time::instant_now() + READY_TIMEOUT;
    let log_tail = || std::fs::read_to_string(&log_path).unwrap_or_default();
    loop {
        let printed = std::fs::read_to_string(&out_path).unwrap_or_default();
        if printed.lines().any(|line| line.trim() == "ready") {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!("it exited ({status}) before it was ready: {}", log_tail());
        }
        if tierstack_base::time::instant_now() >= deadline {
            let _ = started.signal(libc::SIGKILL);
            bail!("it printed no `ready` within {READY_TIMEOUT:?}: {}", log_tail());
        }
        std::thread::sleep(POLL);
    }
    if let Some(addr) = launch.health {
        loop {
            let answer = get(addr, READYZ_PATH);
            if matches!(answer, Ok((200, _))) {
                break;
            }
            if tierstack_base::time::instant_now() >= deadline {
                let _ = started.signal(libc::SIGKILL);
                bail!("/readyz at {addr} did not answer 200 within {READY_TIMEOUT:?}: {answer:?}");
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(started)
}

/// One process as `status` sees it.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub node: u32,
    pub kind: String,
    pub pid: u32,
    pub alive: bool,
    /// `/healthz` answered 200 (None: no HTTP listener).
    pub healthy: Option<bool>,
    /// `/readyz` answered 200; the reasons when not.
    pub ready: Option<bool>,
    pub not_ready: Option<String>,
    /// A few load counters from `/_tierstack/stats`.
    pub load: Option<String>,
}

impl NodeStatus {
    /// Alive and, where it can say, healthy and ready.
    pub fn ok(&self) -> bool {
        self.alive && self.healthy != Some(false) && self.ready != Some(false)
    }
}

/// Reads every recorded process's state, health and load.
pub fn status(run_dir: &Path) -> Result<Vec<NodeStatus>> {
    let state = State::load(run_dir)?;
    Ok(state.processes.iter().map(node_status).collect())
}

fn node_status(started: &Started) -> NodeStatus {
    let alive = started.alive();
    let probe = |path| started.health.filter(|_| alive).map(|addr| get(addr, path));
    let mut healthy = probe(HEALTHZ_PATH).map(|r| matches!(r, Ok((200, _))));
    let readiness = probe(READYZ_PATH);
    let mut ready = readiness.as_ref().map(|r| matches!(r, Ok((200, _))));
    let mut not_ready = match &readiness {
        Some(Ok((200, _))) | None => None,
        Some(Ok((code, body))) => Some(format!("{code}: {}", body.trim().replace('\n', "; "))),
        Some(Err(e)) => Some(format!("{e:#}")),
    };
    if let Some(socket) = started.socket.as_ref().filter(|_| alive) {
        let answered = std::os::unix::net::UnixStream::connect(socket);
        (healthy, ready) = (Some(answered.is_ok()), Some(answered.is_ok()));
        not_ready = answered.err().map(|e| format!("{}: {e}", socket.display()));
    }
    let load = started.stats.filter(|_| alive).and_then(|addr| load_of(addr, &started.kind));
    NodeStatus {
        node: started.node,
        kind: started.kind.clone(),
        pid: started.pid,
        alive,
        healthy,
        ready,
        not_ready,
        load,
    }
}

/// A one-line summary of a tier's `/_tierstack/stats`.
fn load_of(addr: SocketAddr, kind: &str) -> Option<String> {
    let (code, body) = get(addr, "/_tierstack/stats").ok()?;
    if code != 200 {
        return None;
    }
    let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
    let field = |name: &str| stats.get(name).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Some(match kind {
        "proxy" => {
            let in_flight = serde_json::from_value::<tierstack_proxy::ProxyStats>(stats.clone()).ok()?.in_flight();
            format!("requests {} hits {} in-flight {in_flight}", field("requests"), field("hits"))
        }
        _ => format!("reads {} updates {}", field("reads"), field("updates")),
    })
}

/// What `down` did to each process.
#[derive(Clone, Debug, Serialize)]
pub struct DownReport {
    /// (node, kind, pid, outcome): `stopped`, `killed after <t>`, `was not running`.
    pub nodes: Vec<(u32, String, u32, String)>,
}

impl DownReport {
    /// Every process stopped on SIGTERM (none needed SIGKILL).
    pub fn clean(&self) -> bool {
        self.nodes.iter().all(|(_, _, _, outcome)| !outcome.starts_with("killed"))
    }

    pub fn summary(&self) -> String {
        let lines: Vec<String> = self
            .nodes
            .iter()
            .map(|(node, kind, pid, outcome)| format!("node {node} {kind} pid {pid}: {outcome}"))
            .collect();
        lines.join("; ")
    }
}

/// Stops every recorded process (see the module documentation) and removes
/// the state file.
pub fn down(run_dir: &Path) -> Result<DownReport> {
    let state = State::load(run_dir)?;
    let report = down_state(&state)?;
    std::fs::remove_file(run_dir.join(STATE_FILE)).context("removing the state file")?;
    Ok(report)
}

fn down_state(state: &State) -> Result<DownReport> {
    let bound = Duration::from_millis(state.grace_ms) + DOWN_MARGIN;
    let mut nodes = Vec::new();
    // Reverse start order: proxies stop taking clients first, the module last.
    for started in state.processes.iter().rev() {
        let outcome = if !started.signal(libc::SIGTERM) {
            "was not running".to_string()
        } else {
            let since = tierstack_base::time::instant_now();
            while started.alive() && since.elapsed() < bound {
                std::thread::sleep(POLL);
            }
            if started.alive() {
                started.signal(libc::SIGKILL);
                format!("killed after {bound:?} without stopping on SIGTERM")
            } else {
                format!("stopped in {} ms", since.elapsed().as_millis())
            }
        };
        nodes.push((started.node, started.kind.clone(), started.pid, outcome));
    }
    Ok(DownReport { nodes })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPOLOGY: &str = r#"
[cluster]
name = "plan"
fabric = "shm"

[[node]]
id = 3
role = "proxy"
[node.service]
kind = "proxy"
listen = "127.0.0.1:7601"
admin = "127.0.0.1:7602"
upstreams = [1]
mode = "ttl"
args = ["--compute-nothing"]

[[node]]
id = 1
role = "app"
[node.service]
kind = "app-server"
listen = "127.0.0.1:7600"
module = 0

[[node]]
id = 0
role = "app"
cpu = 0
[node.service]
kind = "app-module"
socket = "/tmp/plan.sock"
"#;

    #[test]
    fn plans_modules_then_servers_then_proxies_with_their_options() {
        let topology = Topology::parse(TOPOLOGY).unwrap();
        let launches = plan(&topology, Path::new("/etc/t.toml")).unwrap();
        let order: Vec<u32> = launches.iter().map(|l| l.node).collect();
        assert_eq!(order, vec![0, 1, 3]);
        assert_eq!(launches[0].args.join(" "), "app-module --topology /etc/t.toml --node 0 --socket /tmp/plan.sock");
        assert_eq!(
            launches[1].args.join(" "),
            "app-server --topology /etc/t.toml --node 1 --listen 127.0.0.1:7600 --module-socket /tmp/plan.sock"
        );
        assert_eq!(
            launches[2].args.join(" "),
            "proxy --listen 127.0.0.1:7601 --admin-listen 127.0.0.1:7602 --mode ttl --topology /etc/t.toml \
             --node 3 --upstream http://127.0.0.1:7600 --compute-nothing"
        );
        assert_eq!(launches[0].health, None);
        assert_eq!(launches[0].socket, Some(PathBuf::from("/tmp/plan.sock")));
        assert_eq!(launches[1].socket, None);
        assert_eq!(launches[2].health, Some("127.0.0.1:7602".parse().unwrap()));
    }

    /// The issue: the shipped example put each proxy's admin listener (push,
    /// purge) on the LAN with nothing to check.
    #[test]
    fn the_shipped_example_keeps_every_admin_listener_protected() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/cluster.toml");
        let topology = Topology::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        plan(&topology, &path).unwrap();
    }

    #[test]
    fn an_admin_listener_on_the_network_needs_a_token_file() {
        let exposed = TOPOLOGY.replace("admin = \"127.0.0.1:7602\"", "admin = \"10.0.0.5:7602\"");
        let refused = plan(&Topology::parse(&exposed).unwrap(), Path::new("t.toml")).unwrap_err();
        assert!(format!("{refused:#}").contains("--admin-token-file"), "{refused:#}");
        let with_token = exposed.replace("\"--compute-nothing\"", "\"--admin-token-file\", \"/etc/t.token\"");
        assert!(plan(&Topology::parse(&with_token).unwrap(), Path::new("t.toml")).is_ok());
    }

    #[test]
    fn a_topology_without_services_has_nothing_to_start() {
        let topology =
            Topology::parse("[cluster]\nname = \"x\"\nfabric = \"shm\"\n[[node]]\nid = 0\nrole = \"app\"\n").unwrap();
        assert!(plan(&topology, Path::new("t.toml")).unwrap_err().to_string().contains("no services"));
    }

    #[test]
    fn our_own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let start_time = start_time_of(me).unwrap();
        let started = |start_time| Started {
            node: 0,
            kind: "proxy".into(),
            pid: me,
            start_time,
            health: None,
            stats: None,
            socket: None,
            log: PathBuf::new(),
        };
        assert!(started(start_time).alive());
        assert!(!started(start_time + 1).alive(), "a reused pid is not the process we started");
    }
}
