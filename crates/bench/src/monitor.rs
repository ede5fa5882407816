//! `tierstack bench monitor`: fine-grained monitoring (services paper
//! §5.2, Fig. 8a): how far each scheme's reported load is from the true
//! load at the moment a front end uses it, as the back end gets busier.
//!
//! Per compute-thread count, one run: a `tierstack monitor-node` process
//! (fabric node 0, pinned to the last CPU when there are two or more) runs a
//! seeded random walk of requests in flight and logs every change with the
//! host's `CLOCK_MONOTONIC`; this process (node 1) reads the four schemes,
//! each from its own thread, every `sample_every`, stamping each value with the same clock when
//! it has it. The walk's log and the samples are joined offline
//! ([`tierstack_monitor::deviation`]). Compute threads burn CPU on the back
//! end without counting in the load: they delay its monitor thread (the
//! async schemes' sampler, Socket-Sync's answers), never RDMA-Sync's read.
//! [R] With two or more CPUs the walk's thread runs on CPU 0, away from the
//! compute threads: otherwise a starved walk would barely move under load
//! and every scheme would look accurate for the wrong reason (seen: at 200
//! compute threads the walk made a fraction of its steps).
//!
//! **Fig. 8b** ([`run_throughput`]): throughput of a proxy balancing over
//! two application servers, each pinned to its own CPU and publishing its
//! load, every read burning a heavy-tailed "RUBiS-like" CPU cost. One proxy
//! process per configuration (hash, round-robin, and least-loaded fed by each
//! of the four schemes), in `no-cache` mode so every request reaches a back
//! end, under a closed-loop Zipf load at each α. Throughput and p99 are
//! reported as ratios against hash at the same α, measured in the same run.

use crate::monitor_node::MonitorNodeArgs;
use crate::reconfig_agent::ReconfigureArgs;
use crate::report::{line_plot, write_json, Axes, Series, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tierstack_appserver::{AppServerArgs, ModuleArgs};
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_cluster::{open_fabric, Backend, NodeArgs, Topology};
use tierstack_deploy::deployment::{proxy, strings};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_loadgen::{run as run_load, LoadConfig, LoadReport};
use tierstack_monitor::deviation::{deviations, summarize, Change, DeviationSummary, Sample};
use tierstack_monitor::Policy;
use tierstack_monitor::{open_source, BackendAddress, Health, LoadSource, Scheme, SourceConfig};
use tierstack_proxy::{CacheMode, ProxyArgs, ProxyStats};
use tierstack_workload::Trace;

const BACKEND: NodeId = NodeId(0);
const FRONT: NodeId = NodeId(1);

/// `tierstack bench monitor`'s flags: Fig. 8a ([`MonitorBenchConfig`]),
/// Fig. 8b ([`ThroughputConfig`]) or the reconfiguration experiment
/// ([`ReconfigBenchConfig`]).
#[derive(clap::Args, Clone, Debug)]
pub struct MonitorArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/monitor")]
    pub out: PathBuf,
    /// Compute threads 0, 50, 200 and 1 s per run.
    #[arg(long)]
    pub quick: bool,
    /// Compute-thread counts (default 0,25,50,100,200).
    #[arg(long, value_delimiter = ',')]
    pub compute_threads: Option<Vec<usize>>,
    /// Seconds of sampling per run.
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// The back end's monitor interval (RDMA-Async, Socket-Async), ms.
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// Which figure: 8a (accuracy), 8b (throughput of balancing), both,
    /// or reconfig (two sites, load shifting, with and without the agent).
    #[arg(long, default_value = "both", value_parser = ["8a", "8b", "both", "reconfig"])]
    pub figure: String,
    /// Fig. 8b: Zipf exponents (default 0.25,0.5,0.75,0.9; 0.5,0.9 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub alphas: Option<Vec<f64>>,
    /// Fig. 8b: per-read CPU cost of the application servers (`app-server --cpu-cost`).
    #[arg(long, default_value = "rubis")]
    pub cpu_cost: String,
    /// Fig. 8b: closed-loop clients.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
}

impl MonitorArgs {
    /// Runs the figures `--figure` chose; `exe` is the `tierstack`
    /// executable the back ends are started from.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        let exe = exe()?;
        let interval = Duration::from_millis(self.interval_ms.max(1));
        if self.figure == "reconfig" {
            let mut config = ReconfigBenchConfig::new(exe, self.out, self.quick);
            if let Some(seconds) = self.duration_s {
                config.phase = Duration::from_secs(seconds);
            }
            run_reconfig(&config)?;
            return Ok(());
        }
        if self.figure != "8b" {
            let mut config = MonitorBenchConfig::new(exe.clone(), self.out.clone(), self.quick);
            if let Some(threads) = self.compute_threads {
                config.compute_threads = threads;
            }
            if let Some(seconds) = self.duration_s {
                config.duration = Duration::from_secs(seconds);
            }
            config.interval = interval;
            run(&config)?;
        }
        if self.figure != "8a" {
            let mut config = ThroughputConfig::new(exe, self.out, self.quick);
            if let Some(alphas) = self.alphas {
                config.alphas = alphas;
            }
            if let Some(seconds) = self.duration_s {
                config.duration = Duration::from_secs(seconds);
            }
            config.interval = interval;
            config.cpu_cost = self.cpu_cost;
            config.connections = self.connections;
            run_throughput(&config)?;
        }
        Ok(())
    }
}

pub struct MonitorBenchConfig {
    /// The `tierstack` executable, to start the back end.
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    pub compute_threads: Vec<usize>,
    /// Sampling time per run.
    pub duration: Duration,
    /// The back end's monitor interval (RDMA-Async, Socket-Async).
    pub interval: Duration,
    /// How often the front end reads each scheme.
    pub sample_every: Duration,
    /// Mean time between two steps of the walk.
    pub step: Duration,
    pub seed: u64,
}

impl MonitorBenchConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        MonitorBenchConfig {
            exe,
            out_dir,
            compute_threads: if quick { vec![0, 50, 200] } else { vec![0, 25, 50, 100, 200] },
            duration: Duration::from_secs(if quick { 1 } else { 4 }),
            interval: Duration::from_millis(10),
            sample_every: Duration::from_millis(1),
            step: Duration::from_millis(1),
            seed: 1,
        }
    }
}

/// One scheme at one compute-thread count.
#[derive(Clone, Debug, Serialize)]
pub struct AccuracyPoint {
    pub scheme: Scheme,
    pub compute_threads: usize,
    /// |reported − actual| at the time of use, over the fresh and stale readings.
    pub deviation: DeviationSummary,
    /// Readings by health.
    pub fresh: u64,
    pub stale: u64,
    pub unusable: u64,
    /// Mean time one read took at the front end, in µs.
    pub read_us_mean: f64,
}

#[derive(Serialize)]
pub struct MonitorReport {
    pub interval_ms: u64,
    pub sample_every_us: u64,
    pub step_us: u64,
    pub walk_changes: Vec<(usize, usize)>,
    pub accuracy: Vec<AccuracyPoint>,
}

#[derive(Default)]
struct SchemeLog {
    samples: Vec<Sample>,
    fresh: u64,
    stale: u64,
    unusable: u64,
    read_ns: u64,
    reads: u64,
}

/// Reads back end 0 through `source` every `sample_every` for `duration`.
fn sample(source: &dyn LoadSource, config: &MonitorBenchConfig) -> SchemeLog {
    let mut log = SchemeLog::default();
    let started = tierstack_base::time::instant_now();
    let mut next = started;
    while started.elapsed() < config.duration {
        let before = host_monotonic_ns();
        let reading = source.read(0);
        let used_ns = host_monotonic_ns();
        log.read_ns += used_ns - before;
        log.reads += 1;
        match reading.health {
            Health::Fresh => log.fresh += 1,
            Health::Stale => log.stale += 1,
            Health::Dead | Health::Unknown => log.unusable += 1,
        }
        if matches!(reading.health, Health::Fresh | Health::Stale) {
            log.samples.push(Sample { used_ns, reported: i64::from(reading.record.counters.load()) });
        }
        next += config.sample_every;
        if let Some(wait) = next.checked_duration_since(tierstack_base::time::instant_now()) {
            std::thread::sleep(wait);
        }
    }
    log
}

/// One run: the back end with `threads` compute threads, four schemes read.
fn run_once(config: &MonitorBenchConfig, threads: usize) -> Result<(Vec<AccuracyPoint>, usize)> {
    let scratch = tempfile::Builder::new().prefix("tierstack-bench-monitor-").tempdir()?;
    let cpus = tierstack_cluster::online_cpus();
    let back_cpu = (cpus >= 2).then(|| cpus - 1);
    let nodes =
        [NodeLine { id: BACKEND.0, role: "app", cpu: back_cpu }, NodeLine { id: FRONT.0, role: "proxy", cpu: None }];
    let topology_path = write_topology(scratch.path(), "monitor", Backend::Shm, 1000, &nodes)?;
    let socket = free_loopback_port()?;
    let at = NodeArgs { topology: topology_path.clone(), node: BACKEND.0 };
    let node = MonitorNodeArgs {
        interval_ms: u64::try_from(config.interval.as_millis())?,
        compute_threads: threads,
        step_us: u64::try_from(config.step.as_micros())?,
        seed: config.seed,
        // The truth moves at the pace it would without the compute threads.
        walk_cpu: back_cpu.map(|_| 0),
        ..MonitorNodeArgs::new(at, socket)
    };
    let args = command("monitor-node", node.to_args());
    let child = ChildNode::spawn(&config.exe, &args).context("starting the monitored back end")?;
    let topology = Topology::load(&topology_path)?;
    let fabric = open_fabric(&topology, FRONT)?;
    let backends = [BackendAddress { node: Some(BACKEND), socket: Some(socket) }];
    let source_config = SourceConfig::for_interval(config.interval);
    let sources: Vec<Arc<dyn LoadSource>> = Scheme::ALL
        .into_iter()
        .map(|scheme| open_source(scheme, Some(fabric.clone()), &backends, source_config))
        .collect::<Result<_, _>>()?;
    // One sampling thread per scheme, so a slow scheme (Socket-Sync
    // waiting on a busy back end) does not thin out the others' samples.
    let logs: Vec<SchemeLog> = std::thread::scope(|scope| {
        let threads: Vec<_> =
            sources.iter().map(|source| scope.spawn(move || sample(source.as_ref(), config))).collect();
        threads.into_iter().map(|t| t.join().unwrap_or_default()).collect()
    });
    drop(sources);
    let truth_log = child.finish().context("stopping the back end")?;
    let changes: Vec<Change> = truth_log
        .lines()
        .filter_map(|line| {
            let (t, v) = line.split_once(' ')?;
            Some(Change { t_ns: t.trim().parse().ok()?, value: v.trim().parse().ok()? })
        })
        .collect();
    anyhow::ensure!(changes.len() > 1, "the back end logged no walk ({} lines)", truth_log.lines().count());
    let points = Scheme::ALL
        .into_iter()
        .zip(logs)
        .map(|(scheme, log)| AccuracyPoint {
            scheme,
            compute_threads: threads,
            deviation: summarize(&deviations(&changes, &log.samples)),
            fresh: log.fresh,
            stale: log.stale,
            unusable: log.unusable,
            read_us_mean: log.read_ns as f64 / log.reads.max(1) as f64 / 1000.0,
        })
        .collect();
    Ok((points, changes.len()))
}

pub fn run(config: &MonitorBenchConfig) -> Result<MonitorReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    let mut report = MonitorReport {
        interval_ms: config.interval.as_millis() as u64,
        sample_every_us: config.sample_every.as_micros() as u64,
        step_us: config.step.as_micros() as u64,
        walk_changes: Vec::new(),
        accuracy: Vec::new(),
    };
    for &threads in &config.compute_threads {
        let (points, changes) = run_once(config, threads)?;
        report.walk_changes.push((threads, changes));
        report.accuracy.extend(points);
    }
    let mut table = Table::new(
        "Fig. 8a: |reported - actual| load at the time of use (shm)",
        &["compute", "scheme", "samples", "mean", "p99", "max", "exact %", "stale %", "read µs"],
    );
    for p in &report.accuracy {
        let used = (p.fresh + p.stale).max(1);
        table.row(vec![
            p.compute_threads.to_string(),
            p.scheme.name().to_string(),
            p.deviation.samples.to_string(),
            format!("{:.2}", p.deviation.mean_abs),
            p.deviation.p99_abs.to_string(),
            p.deviation.max_abs.to_string(),
            format!("{:.1}", 100.0 * p.deviation.exact_share),
            format!("{:.1}", 100.0 * p.stale as f64 / used as f64),
            format!("{:.1}", p.read_us_mean),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out_dir.join("monitor.json"), &report)?;
    let series = |value: fn(&AccuracyPoint) -> f64| -> Vec<Series> {
        Scheme::ALL
            .into_iter()
            .map(|scheme| Series {
                label: scheme.name().to_string(),
                points: report
                    .accuracy
                    .iter()
                    .filter(|p| p.scheme == scheme)
                    .map(|p| (p.compute_threads as f64, value(p)))
                    .collect(),
            })
            .collect()
    };
    let axes = |y_label| Axes { x_label: "compute threads on the back end", y_label, log_x: false, log_y: false };
    line_plot(
        &config.out_dir.join("fig8a_mean_deviation.svg"),
        "Fig. 8a: mean |reported - actual| load",
        axes("mean |deviation| (requests)"),
        &series(|p| p.deviation.mean_abs),
    )?;
    line_plot(
        &config.out_dir.join("fig8a_p99_deviation.svg"),
        "Fig. 8a: p99 |reported - actual| load",
        axes("p99 |deviation| (requests)"),
        &series(|p| p.deviation.p99_abs as f64),
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(report)
}

// ------------------------------------------------------------- Fig. 8b ----

pub struct ThroughputConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    /// Zipf exponents of the requests.
    pub alphas: Vec<f64>,
    pub docs: usize,
    /// Application servers (each pinned to CPU `i % cpus`).
    pub servers: usize,
    /// Load time per configuration and α.
    pub duration: Duration,
    /// Closed-loop clients.
    pub connections: usize,
    /// `app-server --cpu-cost`.
    pub cpu_cost: String,
    /// The servers' monitor interval (RDMA-Async, Socket-Async).
    pub interval: Duration,
    pub seed: u64,
}

impl ThroughputConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        ThroughputConfig {
            exe,
            out_dir,
            alphas: if quick { vec![0.5, 0.9] } else { vec![0.25, 0.5, 0.75, 0.9] },
            docs: 64,
            servers: 2,
            duration: Duration::from_secs(if quick { 2 } else { 5 }),
            connections: 16,
            cpu_cost: "rubis".into(),
            interval: Duration::from_millis(10),
            seed: 1,
        }
    }
}

/// A way of choosing the upstream: a policy and, for least-loaded, a scheme.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BalanceConfig {
    pub policy: &'static str,
    pub scheme: Option<Scheme>,
}

impl BalanceConfig {
    pub fn label(&self) -> String {
        match self.scheme {
            Some(scheme) => format!("least-loaded/{scheme}"),
            None => self.policy.to_string(),
        }
    }

    /// Hash, round-robin, then least-loaded by each scheme.
    pub fn all() -> Vec<BalanceConfig> {
        let mut all =
            vec![BalanceConfig { policy: "hash", scheme: None }, BalanceConfig { policy: "round-robin", scheme: None }];
        all.extend(
            Scheme::ALL.into_iter().map(|scheme| BalanceConfig { policy: "least-loaded", scheme: Some(scheme) }),
        );
        all
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputPoint {
    pub alpha: f64,
    pub balance: String,
    pub requests: u64,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
    /// Requests each server got.
    pub routed: Vec<u64>,
    /// Against hash at the same α.
    pub throughput_vs_hash: f64,
    pub p99_vs_hash: f64,
}

#[derive(Serialize)]
pub struct ThroughputReport {
    pub cpu_cost: String,
    pub servers: usize,
    pub connections: usize,
    pub duration_s: f64,
    pub points: Vec<ThroughputPoint>,
}

/// `tierstack <subcommand> <args>`.
fn command(subcommand: &str, args: Vec<String>) -> Vec<String> {
    let mut words = strings(&[subcommand]);
    words.extend(args);
    words
}

/// The application module of the experiments' deployments (fabric node 0).
fn module_command(topology: &std::path::Path, socket: &std::path::Path) -> Vec<String> {
    let at = NodeArgs { topology: topology.to_path_buf(), node: 0 };
    command("app-module", ModuleArgs::new(at, socket.to_path_buf()).to_args())
}

/// An application server of the experiments: a Zipf document set.
fn zipf_server(listen: std::net::SocketAddr, socket: &std::path::Path, docs: usize, seed: u64) -> AppServerArgs {
    AppServerArgs { documents: "zipf".into(), docs, seed, ..AppServerArgs::new(listen, socket.to_path_buf()) }
}

/// Fig. 8b: one deployment of servers, a proxy per configuration and α.
pub fn run_throughput(config: &ThroughputConfig) -> Result<ThroughputReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    let configs = BalanceConfig::all();
    let scratch = tempfile::Builder::new().prefix("tierstack-bench-balance-").tempdir()?;
    let cpus = tierstack_cluster::online_cpus();
    let mut nodes = vec![NodeLine { id: 0, role: "app", cpu: None }];
    nodes.extend((1..=config.servers as u32).map(|id| NodeLine {
        id,
        role: "app",
        cpu: Some((id as usize - 1) % cpus),
    }));
    let first_proxy = config.servers as u32 + 1;
    let proxy_nodes = (configs.len() * config.alphas.len()) as u32;
    nodes.extend((first_proxy..first_proxy + proxy_nodes).map(|id| NodeLine { id, role: "proxy", cpu: None }));
    let topology = write_topology(scratch.path(), "balance", Backend::Shm, 1000, &nodes)?;
    let socket = scratch.path().join("module.sock");
    let _module = ChildNode::spawn(&config.exe, &module_command(&topology, &socket))
        .context("starting the application module")?;
    let interval_ms = u64::try_from(config.interval.as_millis())?;
    let mut servers = Vec::new();
    let mut upstreams = Vec::new();
    for node in 1..=config.servers as u32 {
        let (listen, monitor) = (free_loopback_port()?, free_loopback_port()?);
        let server = AppServerArgs {
            topology: Some(topology.clone()),
            node: Some(node),
            publish_load: true,
            monitor_listen: Some(monitor),
            monitor_interval_ms: interval_ms,
            cpu_cost: Some(config.cpu_cost.clone()),
            ..zipf_server(listen, &socket, config.docs, config.seed)
        };
        servers.push(
            ChildNode::spawn(&config.exe, &command("app-server", server.to_args()))
                .with_context(|| format!("starting application server {node}"))?,
        );
        let address = BackendAddress { node: Some(NodeId(node)), socket: Some(monitor) };
        upstreams.push((format!("http://{listen}"), address));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut points = Vec::new();
    let mut proxy_node = first_proxy;
    for &alpha in &config.alphas {
        let mut at_alpha = Vec::new();
        for balance in &configs {
            let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
            let args = ProxyArgs {
                balance: Some(balance.policy.parse::<Policy>().map_err(anyhow::Error::msg)?),
                monitor: balance.scheme,
                monitor_interval_ms: interval_ms,
                upstreams: upstreams.iter().map(|(url, _)| url.clone()).collect(),
                upstream_monitors: match balance.scheme {
                    Some(_) => upstreams.iter().map(|(_, monitor)| monitor.clone()).collect(),
                    None => Vec::new(),
                },
                ..proxy(listen, admin, CacheMode::NoCache, &topology, proxy_node)
            };
            proxy_node += 1;
            let proxy = ChildNode::spawn(&config.exe, &command("proxy", args.to_args()))
                .with_context(|| format!("starting the {} proxy", balance.label()))?;
            let mut load = LoadConfig::new(format!("http://{listen}"), Trace::zipf(alpha, config.docs)?);
            load.connections = config.connections;
            load.duration_ms = Some(u64::try_from(config.duration.as_millis())?);
            load.update_interval_ms = 0;
            load.seed = config.seed;
            load.check_bodies = true;
            let report: LoadReport = runtime.block_on(run_load(load)).context("load run")?;
            let stats: ProxyStats = tierstack_deploy::deployment::get_json(admin, "/_tierstack/stats")?;
            drop(proxy);
            let errors = report.errors.total();
            anyhow::ensure!(report.accounted(), "{}: requests not accounted for", balance.label());
            at_alpha.push(ThroughputPoint {
                alpha,
                balance: balance.label(),
                requests: report.requests,
                throughput_rps: report.throughput_rps,
                p50_us: report.latency.p50_ns as f64 / 1000.0,
                p99_us: report.latency.p99_ns as f64 / 1000.0,
                errors,
                routed: stats.routed,
                throughput_vs_hash: 1.0,
                p99_vs_hash: 1.0,
            });
        }
        let (hash_rps, hash_p99) = (at_alpha[0].throughput_rps, at_alpha[0].p99_us);
        for point in &mut at_alpha {
            point.throughput_vs_hash = point.throughput_rps / hash_rps.max(f64::MIN_POSITIVE);
            point.p99_vs_hash = point.p99_us / hash_p99.max(f64::MIN_POSITIVE);
        }
        points.extend(at_alpha);
    }
    drop(servers);
    let report = ThroughputReport {
        cpu_cost: format!("{} (RUBiS-like)", config.cpu_cost),
        servers: config.servers,
        connections: config.connections,
        duration_s: config.duration.as_secs_f64(),
        points,
    };
    let mut table = Table::new(
        &format!(
            "Fig. 8b: balancing over {} servers, RUBiS-like CPU cost {} (shm, no-cache proxy)",
            config.servers, config.cpu_cost
        ),
        &["alpha", "balance", "req/s", "vs hash", "p50 µs", "p99 µs", "p99 vs hash", "errors", "routed"],
    );
    for p in &report.points {
        table.row(vec![
            format!("{:.2}", p.alpha),
            p.balance.clone(),
            format!("{:.0}", p.throughput_rps),
            format!("{:.2}", p.throughput_vs_hash),
            format!("{:.0}", p.p50_us),
            format!("{:.0}", p.p99_us),
            format!("{:.2}", p.p99_vs_hash),
            p.errors.to_string(),
            format!("{:?}", p.routed),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out_dir.join("monitor_throughput.json"), &report)?;
    let series: Vec<Series> = configs
        .iter()
        .map(|balance| Series {
            label: balance.label(),
            points: report
                .points
                .iter()
                .filter(|p| p.balance == balance.label())
                .map(|p| (p.alpha, p.throughput_vs_hash))
                .collect(),
        })
        .collect();
    line_plot(
        &config.out_dir.join("fig8b_throughput.svg"),
        "Fig. 8b: throughput against hash balancing (RUBiS-like CPU cost)",
        Axes { x_label: "Zipf alpha", y_label: "throughput / hash", log_x: false, log_y: false },
        &series,
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(report)
}

// ----------------------------------------------------- reconfiguration ----

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
