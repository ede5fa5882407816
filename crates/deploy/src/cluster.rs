//! `tierstack cluster up|status|down <topology.toml>`: the tier processes a
//! topology's `[node.service]` sections describe (see `tierstack_cluster`),
//! started on this host as detached services under a supervisor.
//!
//! - **up** starts the supervisor (`tierstack cluster supervise`, detached,
//!   [`crate::supervise`]) and returns once it says every service is ready.
//!   The supervisor starts them in `ServiceKind::START_ORDER`, each with
//!   [`spawn_service`]: its own session, standard input `/dev/null`, output
//!   into `<run dir>/node-<id>.out` and `.log`. The same pinning as the
//!   demo: each process pins itself to its node's `cpu` when it opens its
//!   fabric node. Each must print `ready` and then answer `/readyz` (or
//!   `/healthz`, for kinds ready only with their peers) with 200 within
//!   [`READY_TIMEOUT`] before the next starts. The pids (with their kernel
//!   start times, so a reused pid is never signalled) go to
//!   `<run dir>/cluster.json` after every start and restart, so a failed
//!   `up` can still be taken `down`; a failed `up` stops what it started.
//! - **status** reads that file: the supervisor alive, every process
//!   alive, its `/healthz`, `/readyz`, restarts, and its load.
//! - **exec** ([`exec_command`]) is one node's service in the caller's
//!   place, for systemd units and containers.
//! - **down** asks the supervisor to stop (SIGTERM): it stops restarting,
//!   sends SIGTERM to every service, proxies first, waits for each (bounded
//!   by the grace period plus [`DOWN_MARGIN`]), SIGKILLs what is still
//!   there and reports it; without a supervisor `down` does the same
//!   itself. The state file is removed once nothing is left.
//!
//! [`plan`] (topology to command lines) is pure.

use crate::deployment::{get, proxy, strings};
use crate::process::{spawn_service, spawn_tied_service, READY_TIMEOUT};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tierstack_appserver::{AppServerArgs, ModuleArgs};
use tierstack_cluster::{NodeArgs, ServiceKind, Topology};
use tierstack_proxy::{CacheMode, ProxyArgs};
use tierstack_tier_http::observe::{ObserveArgs, ProcStat};
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
    /// The module's (or a substrate daemon's) socket, when it has no
    /// HTTP listener: it is healthy and ready while that accepts a connection.
    pub socket: Option<PathBuf>,
    /// Where its `/metrics` answers (`tierstack top`).
    pub metrics: Option<SocketAddr>,
}

/// The command lines of `topology`'s services, in start order
/// ([`ServiceKind::START_ORDER`], each kind in file order). `topology_path`
/// is passed to every process that opens a fabric node as `--topology`.
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
    for kind in ServiceKind::START_ORDER {
        for (node, service) in topology.services().filter(|(_, s)| s.kind == kind) {
            let at = NodeArgs { topology: topology_path.to_path_buf(), node: node.id.0 };
            let mut args = strings(&[kind.command()]);
            let missing = |field: &str| format!("{}'s service has no {field}", node.id);
            let listen = || service.listen.with_context(|| missing("listen"));
            let socket = || service.socket.clone().with_context(|| missing("socket"));
            let admin_words = || service.admin.map(|a| vec!["--admin".to_string(), a.to_string()]).unwrap_or_default();
            match kind {
                ServiceKind::AppModule => args.extend(ModuleArgs::new(at, socket()?).to_args()),
                ServiceKind::AppServer => {
                    let module = service.module.with_context(|| missing("module"))?;
                    let server = AppServerArgs {
                        topology: Some(at.topology),
                        node: Some(at.node),
                        ..AppServerArgs::new(listen()?, socket_of(module)?)
                    };
                    args.extend(server.to_args());
                }
                ServiceKind::Proxy => {
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
                    let proxy = ProxyArgs { upstreams, ..proxy(listen()?, admin, mode, topology_path, node.id.0) };
                    args.extend(proxy.to_args());
                }
                ServiceKind::Origin => {
                    args.extend(strings(&["--listen", &listen()?.to_string()]));
                    args.extend(admin_words());
                }
                ServiceKind::PressNode => {
                    args.extend(at.to_args());
                    args.extend(strings(&["--listen", &listen()?.to_string()]));
                    args.extend(admin_words());
                }
                ServiceKind::DlmNode | ServiceKind::CoopNode => args.extend(at.to_args()),
                ServiceKind::DdssDaemon => {
                    args.extend(at.to_args());
                    args.extend(["--socket".to_string(), socket()?.display().to_string()]);
                }
            }
            args.extend(ObserveArgs { metrics_listen: service.metrics }.to_args());
            args.extend(service.args.iter().cloned());
            // Where readiness is asked: the listener that serves /readyz,
            // else the socket that accepts once the service is up.
            let health = match kind {
                ServiceKind::Proxy | ServiceKind::Origin => service.admin,
                ServiceKind::AppServer => service.metrics.or(service.listen),
                _ => service.metrics,
            };
            let socket = match kind {
                ServiceKind::AppModule | ServiceKind::DdssDaemon if health.is_none() => service.socket.clone(),
                _ => None,
            };
            launches.push(Launch { node: node.id.0, kind, args, health, socket, metrics: metrics_of(kind, service) });
        }
    }
    if launches.is_empty() {
        bail!("the topology describes no services ([node.service] sections)");
    }
    Ok(launches)
}

/// Where a service's `/metrics` answers, if anywhere.
fn metrics_of(kind: ServiceKind, service: &tierstack_cluster::ServiceSpec) -> Option<SocketAddr> {
    match kind {
        ServiceKind::Proxy | ServiceKind::Origin => service.admin,
        _ => service.metrics,
    }
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
    /// Where its `/metrics` answers.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    pub log: PathBuf,
    /// How often the supervisor has started it again after it died.
    #[serde(default)]
    pub restarts: u32,
}

/// `<run dir>/cluster.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub topology: PathBuf,
    pub grace_ms: u64,
    /// In start order.
    pub processes: Vec<Started>,
    /// The process that watches and restarts them (`cluster supervise`).
    #[serde(default)]
    pub supervisor: Option<ProcessId>,
}

impl State {
    pub fn load(run_dir: &Path) -> Result<State> {
        let path = run_dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (is the cluster up, with this --run-dir?)", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub(crate) fn save(&self, run_dir: &Path) -> Result<()> {
        let path = run_dir.join(STATE_FILE);
        let temporary = run_dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&temporary, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(&temporary, &path).with_context(|| format!("writing {}", path.display()))
    }
}

/// The start time of `pid` if it runs (not a zombie), from `/proc`.
pub fn start_time_of(pid: u32) -> Option<u64> {
    ProcStat::read(Some(pid)).filter(|stat| !matches!(stat.state, 'Z' | 'X')).map(|stat| stat.starttime)
}

/// A process named so that a reused pid is never taken for it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessId {
    pub pid: u32,
    /// The kernel's start time of `pid`.
    pub start_time: u64,
}

impl ProcessId {
    /// The process `pid` as it runs now.
    pub fn of(pid: u32) -> Option<ProcessId> {
        start_time_of(pid).map(|start_time| ProcessId { pid, start_time })
    }

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

impl Started {
    pub fn id(&self) -> ProcessId {
        ProcessId { pid: self.pid, start_time: self.start_time }
    }

    /// The recorded process still runs (the same one: its start time matches).
    pub fn alive(&self) -> bool {
        self.id().alive()
    }

    fn signal(&self, signal: libc::c_int) -> bool {
        self.id().signal(signal)
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
    /// Stop the services when the supervisor's process ends (the demo);
    /// `cluster up`'s services outlive it.
    pub tied: bool,
}

/// The supervisor's output (its `ready` line) and its log, in the run directory.
pub const SUPERVISOR_OUT: &str = "supervisor.out";
pub const SUPERVISOR_LOG: &str = "supervisor.log";
/// What the supervisor did to each process when it stopped (read by `down`).
pub const DOWN_REPORT: &str = "down.json";

/// Starts a supervisor (`<exe> cluster supervise`, detached, see
/// [`crate::supervise`]) that starts every service of the topology at
/// `topology_path` and restarts what dies; returns once all are ready, with
/// the state written to the run directory.
pub fn up(topology_path: &Path, config: &UpConfig) -> Result<State> {
    let topology_path = std::fs::canonicalize(topology_path)
        .with_context(|| format!("reading topology {}", topology_path.display()))?;
    // Refused here, before anything starts, as the supervisor would refuse it.
    let launches = plan(&Topology::load(&topology_path)?, &topology_path)?;
    std::fs::create_dir_all(&config.run_dir).with_context(|| format!("creating {}", config.run_dir.display()))?;
    crate::supervise::refuse_if_running(&config.run_dir)?;
    let out_path = config.run_dir.join(SUPERVISOR_OUT);
    let log_path = config.run_dir.join(SUPERVISOR_LOG);
    let out = std::fs::File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut args = strings(&["cluster", "supervise"]);
    args.push(topology_path.display().to_string());
    args.extend(["--run-dir".to_string(), config.run_dir.display().to_string()]);
    args.extend(["--grace-ms".to_string(), config.grace_ms.to_string()]);
    let mut supervisor = spawn_service(&config.exe, &args, out, log)?;
    // Each service has READY_TIMEOUT to be ready, one after the other.
    let deadline = tierstack_base::time::instant_now() + READY_TIMEOUT * (launches.len() as u32 + 1);
    loop {
        let printed = std::fs::read_to_string(&out_path).unwrap_or_default();
        if printed.lines().any(|line| line.trim() == "ready") {
            return State::load(&config.run_dir);
        }
        if let Some(status) = supervisor.try_wait()? {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the supervisor exited ({status}) before every service was ready: {}", said.trim());
        }
        if tierstack_base::time::instant_now() >= deadline {
            // SAFETY: kill has no memory preconditions; the child is ours and not yet reaped.
            unsafe { libc::kill(supervisor.id() as libc::pid_t, libc::SIGTERM) };
            let _ = supervisor.wait();
            bail!("the services were not all ready within {:?}", READY_TIMEOUT * (launches.len() as u32 + 1));
        }
        std::thread::sleep(POLL);
    }
}

/// Starts one service and waits (bounded) until it is ready; a process
/// that is not is killed and reaped.
pub(crate) fn start_one(launch: &Launch, config: &UpConfig) -> Result<(Started, std::process::Child)> {
    let out_path = config.run_dir.join(format!("node-{}.out", launch.node));
    let log_path = config.run_dir.join(format!("node-{}.log", launch.node));
    let out = std::fs::File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut args = launch.args.clone();
    args.extend(ServiceArgs { stop_on_stdin_eof: false, grace_ms: config.grace_ms }.to_args());
    let spawn = if config.tied { spawn_tied_service } else { spawn_service };
    let mut child = spawn(&config.exe, &args, out, log)?;
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
        metrics: launch.metrics,
        log: log_path.clone(),
        restarts: 0,
    };
    let give_up = |child: &mut std::process::Child, why: String| -> Result<(Started, std::process::Child)> {
        let _ = child.kill();
        let _ = child.wait();
        bail!(why)
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
            return give_up(&mut child, format!("it printed no `ready` within {READY_TIMEOUT:?}: {}", log_tail()));
        }
        std::thread::sleep(POLL);
    }
    // A service that needs its peers to be ready is only asked whether it
    // lives now; `wait_ready` asks the rest once every service started.
    let probe = if launch.kind.ready_with_peers() { HEALTHZ_PATH } else { READYZ_PATH };
    if let Some(addr) = launch.health {
        loop {
            let answer = get(addr, probe);
            if matches!(answer, Ok((200, _))) {
                break;
            }
            if tierstack_base::time::instant_now() >= deadline {
                let why = format!("{probe} at {addr} did not answer 200 within {READY_TIMEOUT:?}: {answer:?}");
                return give_up(&mut child, why);
            }
            std::thread::sleep(POLL);
        }
    }
    Ok((started, child))
}

/// Waits (bounded by [`READY_TIMEOUT`]) until every started service that
/// answers `/readyz` answers 200: the last step of a start, when services
/// that need their peers can be ready.
pub(crate) fn wait_ready(state: &State) -> Result<()> {
    let deadline = tierstack_base::time::instant_now() + READY_TIMEOUT;
    for started in state.processes.iter().filter(|p| p.health.is_some()) {
        let Some(addr) = started.health else { continue };
        loop {
            let answer = get(addr, READYZ_PATH);
            if matches!(answer, Ok((200, _))) {
                break;
            }
            if tierstack_base::time::instant_now() >= deadline {
                bail!(
                    "node {} ({}): /readyz at {addr} did not answer 200 within {READY_TIMEOUT:?} of the last start: {answer:?}",
                    started.node,
                    started.kind
                );
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(())
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
    /// Times the supervisor restarted it.
    pub restarts: u32,
}

impl NodeStatus {
    /// Alive and, where it can say, healthy and ready.
    pub fn ok(&self) -> bool {
        self.alive && self.healthy != Some(false) && self.ready != Some(false)
    }
}

/// The supervisor's and every recorded process's state, health and load.
pub fn status(run_dir: &Path) -> Result<ClusterStatus> {
    let state = State::load(run_dir)?;
    Ok(ClusterStatus {
        supervisor: state.supervisor,
        supervisor_alive: state.supervisor.is_some_and(|s| s.alive()),
        nodes: state.processes.iter().map(node_status).collect(),
    })
}

/// What `status` reports.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterStatus {
    pub supervisor: Option<ProcessId>,
    pub supervisor_alive: bool,
    pub nodes: Vec<NodeStatus>,
}

impl ClusterStatus {
    /// The supervisor runs and every service is alive and ready.
    pub fn ok(&self) -> bool {
        self.supervisor_alive && self.nodes.iter().all(NodeStatus::ok)
    }
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
        restarts: started.restarts,
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
#[derive(Clone, Debug, Serialize, Deserialize)]
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

/// Stops the cluster: the supervisor first (SIGTERM: it stops restarting,
/// stops every service in reverse start order and reports what it did),
/// then, if it could not (it was gone or did not finish in time), every
/// recorded process that still runs, the same way. Removes the state file.
pub fn down(run_dir: &Path) -> Result<DownReport> {
    let state = State::load(run_dir)?;
    let report_path = run_dir.join(DOWN_REPORT);
    let _ = std::fs::remove_file(&report_path);
    let mut from_supervisor = None;
    if let Some(supervisor) = state.supervisor.filter(ProcessId::alive) {
        let each = Duration::from_millis(state.grace_ms) + DOWN_MARGIN;
        let bound = each * (state.processes.len() as u32 + 1);
        supervisor.signal(libc::SIGTERM);
        let since = tierstack_base::time::instant_now();
        while supervisor.alive() && since.elapsed() < bound {
            std::thread::sleep(POLL);
        }
        if supervisor.alive() {
            supervisor.signal(libc::SIGKILL);
        }
        from_supervisor =
            std::fs::read_to_string(&report_path).ok().and_then(|text| serde_json::from_str::<DownReport>(&text).ok());
    }
    // The supervisor may have restarted some since `state` was read: its
    // file, if it is still there (a supervisor that did not finish), names
    // the processes running now.
    let state = State::load(run_dir).unwrap_or(state);
    let report = match from_supervisor {
        Some(report) if !state.processes.iter().any(Started::alive) => report,
        _ => down_state(&state)?,
    };
    match std::fs::remove_file(run_dir.join(STATE_FILE)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("removing the state file"),
    }
    Ok(report)
}

/// Writes what stopping did, for `down` (the supervisor, as it exits).
pub fn write_down_report(run_dir: &Path, report: &DownReport) -> Result<()> {
    std::fs::write(run_dir.join(DOWN_REPORT), serde_json::to_string_pretty(report)?).context("writing the down report")
}

pub(crate) fn down_state(state: &State) -> Result<DownReport> {
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

    #[test]
    fn plans_every_kind_with_its_node_listeners_and_metrics() {
        let text = r#"
[cluster]
name = "kinds"
fabric = "shm"

[[node]]
id = 0
role = "app"
[node.service]
kind = "press-node"
listen = "127.0.0.1:7700"
metrics = "127.0.0.1:7701"
args = ["--trace", "zipf"]

[[node]]
id = 1
role = "app"
[node.service]
kind = "dlm-node"
args = ["--locks", "0..2"]

[[node]]
id = 2
role = "app"
[node.service]
kind = "ddss-daemon"
socket = "/tmp/d.sock"

[[node]]
id = 3
role = "passive"
[node.service]
kind = "origin"
listen = "127.0.0.1:7702"
admin = "127.0.0.1:7703"

[[node]]
id = 4
role = "passive"
[node.service]
kind = "coop-node"
metrics = "127.0.0.1:7704"
args = ["--scheme", "mtacc"]
"#;
        let launches = plan(&Topology::parse(text).unwrap(), Path::new("/t.toml")).unwrap();
        let lines: Vec<String> = launches.iter().map(|l| l.args.join(" ")).collect();
        assert_eq!(
            lines,
            vec![
                "ddss-daemon --topology /t.toml --node 2 --socket /tmp/d.sock",
                "dlm-node --topology /t.toml --node 1 --locks 0..2",
                "coop-node --topology /t.toml --node 4 --metrics-listen 127.0.0.1:7704 --scheme mtacc",
                "origin --listen 127.0.0.1:7702 --admin 127.0.0.1:7703",
                "press-node --topology /t.toml --node 0 --listen 127.0.0.1:7700 --metrics-listen 127.0.0.1:7701 \
                 --trace zipf",
            ]
        );
        let health: Vec<Option<SocketAddr>> = launches.iter().map(|l| l.health).collect();
        let addr = |a: &str| Some(a.parse::<SocketAddr>().unwrap());
        assert_eq!(health, vec![None, None, addr("127.0.0.1:7704"), addr("127.0.0.1:7703"), addr("127.0.0.1:7701")]);
        assert_eq!(launches[0].socket, Some(PathBuf::from("/tmp/d.sock")), "a daemon without metrics: its socket");
        assert_eq!(launches[3].metrics, addr("127.0.0.1:7703"), "the origin's metrics are on its admin listener");
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
            metrics: None,
            log: PathBuf::new(),
            restarts: 0,
        };
        assert!(started(start_time).alive());
        assert!(!started(start_time + 1).alive(), "a reused pid is not the process we started");
    }
}
