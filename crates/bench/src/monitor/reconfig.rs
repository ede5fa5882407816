//! The reconfiguration experiment ([`run_reconfig`]).

use super::{command, module_command, zipf_server};
use crate::reconfig_agent::ReconfigureArgs;
use crate::report::{line_plot, write_json, Axes, Series, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use tierstack_appserver::AppServerArgs;
use tierstack_base::NodeId;
use tierstack_cluster::{Backend, NodeArgs};
use tierstack_deploy::deployment::proxy;
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_loadgen::{run as run_load, LoadConfig};
use tierstack_monitor::{BackendAddress, Policy, Scheme};
use tierstack_proxy::{CacheMode, ProxyArgs, ProxyStats};
use tierstack_workload::Trace;

/// The reconfiguration experiment (svc §3, §6; seed-notes b.6): two sites,
/// each a proxy over the application servers whose role word names it,
/// share `servers` servers (half each at the start). The load shifts: in
/// phase 1 site 0 gets `hot_connections` closed-loop clients and site 1
/// `cold_connections`, in phase 2 the reverse. Each configuration gets a
/// fresh deployment: `static` (no agent) and `agent` (a
/// `tierstack reconfigure` process moving servers between the sites).
/// [R] Each server emulates a node of `workers` workers whose cost is spent
/// in wall time (`app-server --emulated-workers`): four back ends sharing
/// this machine's two cores could not otherwise each have a capacity of
/// their own, and moving one between sites would change nothing.
pub struct ReconfigBenchConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    pub servers: usize,
    pub workers: usize,
    /// `app-server --cpu-cost` (spent in wall time by the emulated workers).
    pub cost: String,
    pub phase: Duration,
    pub hot_connections: usize,
    pub cold_connections: usize,
    pub docs: usize,
    /// The agent's window, windows, ratio and history.
    pub window: Duration,
    pub windows: u32,
    pub ratio: f64,
    pub history: Duration,
    pub seed: u64,
}

impl ReconfigBenchConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        ReconfigBenchConfig {
            exe,
            out_dir,
            servers: 4,
            workers: 4,
            cost: "pareto:1.5,5000,100000".into(),
            phase: Duration::from_secs(if quick { 3 } else { 8 }),
            hot_connections: 32,
            cold_connections: 4,
            docs: 64,
            window: Duration::from_millis(100),
            windows: 3,
            ratio: 2.0,
            history: Duration::from_secs(if quick { 2 } else { 5 }),
            seed: 1,
        }
    }
}

/// One site in one phase of one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ReconfigPoint {
    pub configuration: String,
    pub phase: usize,
    pub site: usize,
    pub connections: usize,
    pub requests: u64,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
    /// 2xx responses per second of the phase.
    pub per_second: Vec<u64>,
    /// Against `static`, same phase and site.
    pub throughput_vs_static: f64,
    pub p99_vs_static: f64,
}

#[derive(Serialize)]
pub struct ReconfigReport {
    pub servers: usize,
    pub workers: usize,
    pub cost: String,
    pub phase_s: f64,
    pub points: Vec<ReconfigPoint>,
    /// The agent's moves (its JSON lines), and the forwards fenced at the
    /// proxies (requests routed by a role that changed under them).
    pub moves: Vec<serde_json::Value>,
    pub fenced: u64,
}

/// Starts one deployment, runs both phases, returns its points, the
/// agent's events and the proxies' fenced count.
fn run_reconfig_once(
    config: &ReconfigBenchConfig,
    with_agent: bool,
    runtime: &tokio::runtime::Runtime,
) -> Result<(Vec<ReconfigPoint>, Vec<serde_json::Value>, u64)> {
    let label = if with_agent { "agent" } else { "static" };
    let scratch = tempfile::Builder::new().prefix("tierstack-bench-reconfig-").tempdir()?;
    let proxy0 = config.servers as u32 + 1;
    let agent_node = proxy0 + 2;
    let nodes: Vec<NodeLine> = (0..=agent_node)
        .map(|id| NodeLine { id, role: if id >= proxy0 { "proxy" } else { "app" }, cpu: None })
        .collect();
    let topology_path = write_topology(scratch.path(), "reconfig", Backend::Shm, 1000, &nodes)?;
    let socket = scratch.path().join("module.sock");
    let _module = ChildNode::spawn(&config.exe, &module_command(&topology_path, &socket))
        .context("starting the application module")?;
    let mut servers = Vec::new();
    let mut upstreams = Vec::new();
    for node in 1..=config.servers as u32 {
        let listen = free_loopback_port()?;
        let site = if (node as usize) <= config.servers / 2 { 0 } else { 1 };
        let server = AppServerArgs {
            topology: Some(topology_path.clone()),
            node: Some(node),
            publish_load: true,
            cpu_cost: Some(config.cost.clone()),
            emulated_workers: Some(config.workers),
            site: Some(site),
            ..zipf_server(listen, &socket, config.docs, config.seed)
        };
        servers.push(
            ChildNode::spawn(&config.exe, &command("app-server", server.to_args()))
                .with_context(|| format!("starting server {node}"))?,
        );
        upstreams.push((format!("http://{listen}"), BackendAddress { node: Some(NodeId(node)), socket: None }));
    }
    let mut proxies = Vec::new();
    for site in 0..2u32 {
        let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
        let args = ProxyArgs {
            balance: Some(Policy::LeastLoaded),
            monitor: Some(Scheme::RdmaSync),
            site: Some(u16::try_from(site)?),
            upstreams: upstreams.iter().map(|(url, _)| url.clone()).collect(),
            upstream_monitors: upstreams.iter().map(|(_, monitor)| monitor.clone()).collect(),
            ..proxy(listen, admin, CacheMode::NoCache, &topology_path, proxy0 + site)
        };
        let child = ChildNode::spawn(&config.exe, &command("proxy", args.to_args())).context("starting a proxy")?;
        proxies.push((listen, admin, child));
    }
    let mut agent = if with_agent {
        let at = NodeArgs { topology: topology_path.clone(), node: agent_node };
        let agent = ReconfigureArgs {
            window_ms: u64::try_from(config.window.as_millis())?,
            windows: config.windows,
            ratio: config.ratio,
            history_ms: u64::try_from(config.history.as_millis())?,
            ..ReconfigureArgs::new(at, (1..=config.servers as u32).collect())
        };
        let args = command("reconfigure", agent.to_args());
        Some(ChildNode::spawn(&config.exe, &args).context("starting the agent")?)
    } else {
        None
    };
    let mut points = Vec::new();
    for phase in 0..2usize {
        let loads: Vec<LoadConfig> = (0..2usize)
            .map(|site| -> Result<LoadConfig> {
                let hot = (site == 0) == (phase == 0);
                let mut load = LoadConfig::new(format!("http://{}", proxies[site].0), Trace::zipf(0.5, config.docs)?);
                load.connections = if hot { config.hot_connections } else { config.cold_connections };
                load.duration_ms = Some(u64::try_from(config.phase.as_millis())?);
                load.update_interval_ms = 0;
                load.seed = config.seed + site as u64;
                load.check_bodies = true;
                Ok(load)
            })
            .collect::<Result<_>>()?;
        let connections: Vec<usize> = loads.iter().map(|l| l.connections).collect();
        let mut loads = loads.into_iter();
        let (first, second) = (loads.next().context("site 0")?, loads.next().context("site 1")?);
        let (report0, report1) = runtime.block_on(async { tokio::join!(run_load(first), run_load(second)) });
        for (site, report) in [report0.context("site 0 load")?, report1.context("site 1 load")?].into_iter().enumerate()
        {
            anyhow::ensure!(report.accounted(), "{label}: requests not accounted for");
            points.push(ReconfigPoint {
                configuration: label.to_string(),
                phase: phase + 1,
                site,
                connections: connections[site],
                requests: report.requests,
                throughput_rps: report.throughput_rps,
                p50_us: report.latency.p50_ns as f64 / 1000.0,
                p99_us: report.latency.p99_ns as f64 / 1000.0,
                errors: report.errors.total(),
                // Whole seconds of the phase only (a response or two may
                // land in the second after the end).
                per_second: report
                    .series
                    .iter()
                    .filter(|s| f64::from(s.second) + 1.0 <= config.phase.as_secs_f64())
                    .map(|s| s.ok)
                    .collect(),
                throughput_vs_static: 1.0,
                p99_vs_static: 1.0,
            });
        }
    }
    let mut fenced = 0;
    for (_, admin, _) in &proxies {
        let stats: ProxyStats = tierstack_deploy::deployment::get_json(*admin, "/_tierstack/stats")?;
        if let Some(error) = stats.accounting_error() {
            anyhow::bail!("{label}: proxy accounting: {error}");
        }
        fenced += stats.fenced;
    }
    let moves = match agent.take() {
        Some(agent) => agent
            .finish()?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<Vec<serde_json::Value>, _>>()?,
        None => Vec::new(),
    };
    drop(proxies);
    drop(servers);
    Ok((points, moves, fenced))
}

/// The reconfiguration experiment: `static` then `agent`, each on a fresh
/// deployment; ratios of `agent` against `static` per phase and site.
pub fn run_reconfig(config: &ReconfigBenchConfig) -> Result<ReconfigReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut points, _, _) = run_reconfig_once(config, false, &runtime)?;
    let (agent_points, moves, fenced) = run_reconfig_once(config, true, &runtime)?;
    points.extend(agent_points);
    let baseline: Vec<(usize, usize, f64, f64)> = points
        .iter()
        .filter(|p| p.configuration == "static")
        .map(|p| (p.phase, p.site, p.throughput_rps, p.p99_us))
        .collect();
    for point in &mut points {
        if let Some((_, _, rps, p99)) = baseline.iter().find(|b| b.0 == point.phase && b.1 == point.site) {
            point.throughput_vs_static = point.throughput_rps / rps.max(f64::MIN_POSITIVE);
            point.p99_vs_static = point.p99_us / p99.max(f64::MIN_POSITIVE);
        }
    }
    let report = ReconfigReport {
        servers: config.servers,
        workers: config.workers,
        cost: config.cost.clone(),
        phase_s: config.phase.as_secs_f64(),
        points,
        moves,
        fenced,
    };
    let mut table = Table::new(
        &format!(
            "Reconfiguration: 2 sites sharing {} servers ({} emulated workers each, cost {}), load shifting between them",
            config.servers, config.workers, config.cost
        ),
        &["config", "phase", "site", "clients", "req/s", "vs static", "p50 µs", "p99 µs", "p99 vs static", "errors"],
    );
    for p in &report.points {
        table.row(vec![
            p.configuration.clone(),
            p.phase.to_string(),
            p.site.to_string(),
            p.connections.to_string(),
            format!("{:.0}", p.throughput_rps),
            format!("{:.2}", p.throughput_vs_static),
            format!("{:.0}", p.p50_us),
            format!("{:.0}", p.p99_us),
            format!("{:.2}", p.p99_vs_static),
            p.errors.to_string(),
        ]);
    }
    println!("{}", table.render());
    println!("agent moves: {}; forwards fenced: {}", report.moves.len(), report.fenced);
    for event in &report.moves {
        println!("  {event}");
    }
    write_json(&config.out_dir.join("monitor_reconfig.json"), &report)?;
    let phase_s = config.phase.as_secs_f64();
    let series: Vec<Series> = ["static", "agent"]
        .iter()
        .flat_map(|label| (0..2usize).map(move |site| (*label, site)))
        .map(|(label, site)| Series {
            label: format!("{label}, site {site}"),
            points: report
                .points
                .iter()
                .filter(|p| p.configuration == label && p.site == site)
                .flat_map(|p| {
                    let offset = (p.phase - 1) as f64 * phase_s;
                    p.per_second.iter().enumerate().map(move |(s, ok)| (offset + s as f64, *ok as f64))
                })
                .collect(),
        })
        .collect();
    line_plot(
        &config.out_dir.join("reconfig_throughput.svg"),
        "Reconfiguration: throughput per site over time (load shifts at the middle)",
        Axes { x_label: "time (s)", y_label: "responses per second", log_x: false, log_y: false },
        &series,
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(report)
}
