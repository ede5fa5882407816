//! `tierstack bench press`: the PRESS paper's experiments on real
//! `tierstack press-node` processes on this host.
//!
//! - **Fig. 3** (TCP vs Base per trace): throughput of PRESS over the `tcp`
//!   and `base` versions, with the paper's gain of Base over TCP beside ours.
//! - **Fig. 4** (remote writes over Base): RDMA-1c's throughput gain over
//!   Base per trace (the paper: "does not significantly improve") and
//!   RDMA's (the paper: +11 % to +23 %) and Zero's (+15 % to +29 %; Zero
//!   over TCP up to +52 %).
//! - **Table 2**: messages and KiB per 1,000 requests, per type, summed over
//!   the nodes' send counters, with the paper's Clarknet values beside ours.
//! - **Fig. 5**: throughput against the number of nodes, traditional vs
//!   PRESS (tcp and base), as many nodes as this host takes.
//! - **Traditional comparison**: PRESS-Base over the traditional server per
//!   trace on the largest node count, the paper's 8-node gains beside ours.
//!
//! - **Capacity** (`--cpu`, module [`cpu`]): CPU-seconds of the node
//!   processes per 1,000 requests per version, repeated, with spreads and
//!   ratios to TCP measured in the same round; throughput with several
//!   client processes (`--clients`) and each node's CPU utilisation; Fig. 1's
//!   branches per threshold T (`--thresholds`), or T found by bisection
//!   per version (`--bisect-t`, module [`bisect`]).
//!
//! Every run: the nodes start, a closed-loop client (`tierstack_loadgen`,
//! one new connection per request, targets chosen at random, as the paper's
//! clients) warms the caches, then measures for the run's duration. Node
//! counters are read before and after the measurement and subtracted. Only
//! ratios measured in one invocation are compared, and the load average is
//! printed beside them: this host's cores are shared.

use crate::html::Page;
use crate::report::{bar_chart, line_plot, write_json, Axes, BarGroup, Series, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_cluster::{Backend, NodeArgs};
use tierstack_deploy::haproxy::{haproxy_path, Haproxy};
use tierstack_deploy::process::{write_topology, ChildNode, NodeLine};
use tierstack_loadgen::{LoadConfig, TargetChoice};
use tierstack_press::{Counts, MsgType};
use tierstack_press_node::{DispatcherArgs, Mode, NodeStats, PressNodeArgs, TransportKind};
use tierstack_workload::{Trace, TraceSpec};

mod bisect;
mod cpu;
pub use bisect::BisectGoal;

/// The paper's Base-VIA gain over TCP on 8 nodes, Fig. 3 (§4.2): only the
/// extremes are stated (6 % Rutgers, 28 % Nasa).
const PAPER_FIG3: [(&str, Option<f64>); 5] =
    [("clarknet", None), ("nasa", Some(28.0)), ("rutgers", Some(6.0)), ("usask", None), ("wc98", None)];

/// PRESS over the traditional server on 8 nodes (§4.3), percent.
const PAPER_VS_TRADITIONAL: [(&str, f64); 5] =
    [("clarknet", 64.0), ("nasa", 18.0), ("rutgers", 173.0), ("usask", 38.0), ("wc98", 91.0)];

/// Table 2, version Base, Clarknet: (type, msgs per 1K, KB per 1K, avg bytes).
const PAPER_TABLE2_BASE: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 435.3, 1.7, 4.0),
    (MsgType::Forward, 766.7, 40.3, 55.1),
    (MsgType::Caching, 0.8, 0.1, 59.1),
    (MsgType::File, 766.7, 6646.9, 9091.2),
];

/// Table 2, version RDMA-1c, Clarknet (caching: 0.0 messages, avg N/A).
const PAPER_TABLE2_RDMA1C: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 1362.0, 17.4, 13.1),
    (MsgType::Forward, 778.2, 45.0, 59.2),
    (MsgType::Caching, 0.0, 0.0, f64::NAN),
    (MsgType::File, 778.2, 6815.7, 8968.0),
];

/// Table 2, version RDMA, Clarknet.
const PAPER_TABLE2_RDMA: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 1475.0, 18.9, 13.1),
    (MsgType::Forward, 842.9, 48.6, 59.1),
    (MsgType::Caching, 0.0, 0.0, f64::NAN),
    (MsgType::File, 842.9, 7417.8, 9012.0),
];

/// The systems of Fig. 5 (the paper's: Traditional, PRESS-Base, PRESS-Zero
/// and the hand-off servers; hand-off is not built here).
const FIG5_SYSTEMS: [&str; 4] = ["traditional", "press-tcp", "press-base", "press-zero"];

/// Table 2, version Zero, Clarknet.
const PAPER_TABLE2_ZERO: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 1477.1, 18.9, 13.1),
    (MsgType::Forward, 844.1, 48.8, 59.2),
    (MsgType::Caching, 0.002, 0.0001, 63.1),
    (MsgType::File, 844.1, 7433.3, 9018.0),
];

/// What `bench press` runs.
pub struct PressBenchConfig {
    /// The `tierstack` executable.
    pub exe: PathBuf,
    pub out: PathBuf,
    /// Traces by PRESS name (clarknet, nasa, rutgers, usask, wc98).
    pub traces: Vec<String>,
    /// Scale of the synthesized traces (files and caches).
    pub scale: f64,
    /// Node counts for Fig. 5; the largest is used for Fig. 3 and Table 2.
    pub nodes: Vec<usize>,
    pub duration_s: u64,
    pub warmup_s: u64,
    /// Closed-loop client connections.
    pub connections: usize,
    /// Emulated disk (seek µs, MB/s), every node.
    pub disk: (u64, f64),
    /// The systems run per trace on the largest cluster ([`SYSTEMS`]).
    pub systems: Vec<String>,
    /// Rounds: every (trace, system) point is run this many times, the
    /// systems alternated within each round; tables show the mean.
    pub repeats: usize,
    /// Skip Fig. 5 (the node-count sweep).
    pub skip_fig5: bool,
    /// Capacity instead of the figures: CPU per request per version ([`cpu`]).
    pub cpu: bool,
    /// Fig. 1's T per run (`--cpu` runs every version at each).
    pub thresholds: Vec<u32>,
    /// Client processes (`tierstack load`) in the measured window; 1 runs
    /// the client in this process.
    pub clients: usize,
    /// The nodes send inline when nothing has to wait (`false`: every send
    /// through the blocking pool, the path before, to measure against).
    pub send_inline: bool,
    /// With `cpu`: T found by bisection per version instead of `thresholds`.
    pub bisect_t: Option<BisectGoal>,
}

/// Every system `bench press` knows: the five PRESS versions, the
/// traditional server, the distributed and dispatcher hand-off servers and
/// HAProxy with bounded-load consistent hashing (skipped, with a printed
/// reason, when `haproxy` is not installed).
pub const SYSTEMS: [&str; 9] = [
    "press-tcp",
    "press-base",
    "press-rdma-1c",
    "press-rdma",
    "press-zero",
    "traditional",
    "distrib-ho",
    "dispatch-ho",
    "haproxy",
];

/// Table 3 (8 nodes, percent): trace, Trad HR, then LHR, THR, Fwd for
/// PRESS-Zero, Distrib HO and Dispatch HO.
type Table3Row = (&'static str, f64, [f64; 3], [f64; 3], [f64; 3]);
const PAPER_TABLE3: [Table3Row; 5] = [
    ("clarknet", 98.8, [99.6, 99.9, 87.4], [99.6, 99.9, 82.0], [99.6, 99.9, 85.7]),
    ("nasa", 98.3, [91.2, 98.7, 85.6], [94.6, 98.7, 75.1], [94.4, 98.7, 77.3]),
    ("rutgers", 96.4, [94.1, 99.2, 86.8], [94.1, 99.2, 86.9], [94.7, 99.2, 85.0]),
    ("usask", 98.6, [99.9, 100.0, 87.5], [99.9, 100.0, 72.5], [99.9, 100.0, 82.1]),
    ("wc98", 98.4, [99.8, 99.9, 87.4], [99.8, 99.9, 86.0], [99.8, 99.9, 85.4]),
];

/// Latency at maximum throughput, Clarknet, 8 nodes (§4.4), ms.
const PAPER_LATENCY_MS: [(&str, f64); 5] =
    [("press-zero", 27.0), ("distrib-ho", 27.0), ("dispatch-ho", 30.0), ("press-base", 33.0), ("traditional", 43.0)];

impl PressBenchConfig {
    pub fn new(exe: PathBuf, out: PathBuf, quick: bool) -> Self {
        PressBenchConfig {
            exe,
            out,
            traces: if quick {
                vec!["clarknet".into()]
            } else {
                PAPER_VS_TRADITIONAL.iter().map(|t| t.0.into()).collect()
            },
            scale: 0.01,
            nodes: if quick { vec![1, 2] } else { vec![1, 2, 3, 4] },
            duration_s: if quick { 2 } else { 6 },
            warmup_s: if quick { 1 } else { 2 },
            connections: 16,
            disk: (8_000, 40.0),
            systems: SYSTEMS.iter().map(|s| s.to_string()).collect(),
            repeats: 1,
            skip_fig5: false,
            cpu: false,
            thresholds: vec![tierstack_press::THRESHOLD_DEFAULT],
            clients: 1,
            send_inline: true,
            bisect_t: None,
        }
    }
}

/// `tierstack bench press`'s flags; unset options keep
/// [`PressBenchConfig::new`]'s `--quick`-dependent defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct PressArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/press")]
    pub out: PathBuf,
    /// Clarknet only, 1 and 2 nodes, 2 s per run.
    #[arg(long)]
    pub quick: bool,
    /// Traces (clarknet, nasa, rutgers, usask, wc98).
    #[arg(long, value_delimiter = ',')]
    pub traces: Option<Vec<String>>,
    /// Node counts of Fig. 5 (the largest is used for the per-trace runs).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Option<Vec<usize>>,
    /// Scale of the synthesized traces (files and per-node caches).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Seconds measured per run.
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Closed-loop client connections.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Systems run per trace (press-tcp, press-base, press-rdma-1c, press-rdma, press-zero, traditional,
    /// distrib-ho, dispatch-ho, haproxy); default all (haproxy skipped when not installed).
    #[arg(long, value_delimiter = ',')]
    pub systems: Option<Vec<String>>,
    /// Rounds: each point run this many times, the systems alternated; the tables show means and the
    /// versions' order per round.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Skip Fig. 5's node-count sweep.
    #[arg(long)]
    pub skip_fig5: bool,
    /// Capacity: CPU-seconds of the node processes per 1,000 requests for every PRESS version (with
    /// --repeats rounds, spreads and ratios to TCP), node CPU utilisation, Fig. 1's branches per T.
    #[arg(long)]
    pub cpu: bool,
    /// Fig. 1's threshold T, one run per value (e.g. 256,8,2: the small ones make the load-balancing
    /// branches run); default 256.
    #[arg(long, value_delimiter = ',')]
    pub thresholds: Option<Vec<u32>>,
    /// Client processes (`tierstack load`) driving the nodes in the measured window, the connections
    /// split among them; 1: the client runs inside the bench.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// The nodes send intra-cluster messages inline from the request's task when nothing has to wait;
    /// false hands every send to the blocking pool (the path before, to measure against).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub send_inline: bool,
    /// With --cpu: find Fig. 1's T by bisection per version, `balancing` (the largest T at which the
    /// load-balancing branches decide ≥ 1 % of requests) or `fwd:PCT` (the largest T with Fwd ≤ PCT + 2);
    /// prints every probe's branch shares.
    #[arg(long)]
    pub bisect_t: Option<BisectGoal>,
}

impl PressArgs {
    /// The configuration these flags describe; an unknown system is an error.
    pub fn config(self, exe: PathBuf) -> Result<PressBenchConfig> {
        let mut config = PressBenchConfig::new(exe, self.out, self.quick);
        if let Some(traces) = self.traces {
            config.traces = traces;
        }
        if let Some(nodes) = self.nodes {
            config.nodes = nodes;
        }
        if let Some(scale) = self.scale {
            config.scale = scale;
        }
        if let Some(duration_s) = self.duration_s {
            config.duration_s = duration_s;
        }
        if let Some(connections) = self.connections {
            config.connections = connections;
        }
        if let Some(systems) = self.systems {
            if let Some(bad) = systems.iter().find(|s| !SYSTEMS.contains(&s.as_str())) {
                anyhow::bail!("unknown system {bad:?} (expected one of {SYSTEMS:?})");
            }
            config.systems = systems;
        }
        config.repeats = self.repeats.max(1);
        config.skip_fig5 = self.skip_fig5;
        config.cpu = self.cpu;
        if let Some(thresholds) = self.thresholds {
            anyhow::ensure!(!thresholds.is_empty(), "--thresholds needs at least one value");
            config.thresholds = thresholds;
        }
        config.clients = self.clients.max(1);
        config.send_inline = self.send_inline;
        anyhow::ensure!(self.bisect_t.is_none() || self.cpu, "--bisect-t needs --cpu");
        config.bisect_t = self.bisect_t;
        Ok(config)
    }

    /// Runs the experiment; `exe` is the `tierstack` executable the nodes are started from.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        let config = self.config(exe()?)?;
        if let (true, Some(goal)) = (config.cpu, config.bisect_t) {
            bisect::run(&config, goal)?;
        } else if config.cpu {
            cpu::run(&config)?;
        } else {
            run(&config)?;
        }
        Ok(())
    }
}

/// One measured run.
#[derive(Clone, Debug, Serialize)]
pub struct PressRun {
    pub trace: String,
    pub system: String,
    pub nodes: usize,
    pub throughput_rps: f64,
    pub latency_mean_ms: f64,
    pub requests: u64,
    pub errors: u64,
    pub forwarded_pct: f64,
    /// Global hit rate over every served read (THR).
    pub hit_rate_pct: f64,
    /// The unweighted mean over nodes of each node's hit rate (LHR).
    pub local_hit_rate_pct: f64,
    /// Which alternation round this run belongs to (0-based).
    pub repeat: usize,
    pub disk_reads: u64,
    pub messages: [u64; 4],
    pub bytes: [u64; 4],
    pub load_average: f64,
    /// Fig. 1's T of the run.
    pub threshold: u32,
    /// Client processes in the measured window (1: in the bench).
    pub clients: usize,
    /// User + system CPU-seconds of the node processes (and a front
    /// process, if any) in the measured window, from `/proc/<pid>/stat`.
    pub cpu_s: f64,
    /// Wall seconds between the two CPU readings.
    pub window_s: f64,
    /// Each node's CPU-seconds over `window_s`, percent of one core.
    pub node_cpu_pct: Vec<f64>,
    /// Client requests by Fig. 1's branch (`tierstack_press_node::transport::BRANCHES`).
    pub branches: [u64; 7],
    /// Zero: forwarded files sent from the registered cache, and by a copy.
    pub files_from_slab: u64,
    pub zero_copy_fallbacks: u64,
    /// Receivers' idle waits, their wake-ups, and ring doorbells rung.
    pub idle_waits: u64,
    pub wakeups: u64,
    pub doorbells: u64,
    /// Intra-cluster sends made inline, and handed to the blocking pool.
    pub sends_inline: u64,
    pub sends_blocking: u64,
}

impl PressRun {
    /// CPU-seconds of the nodes per 1,000 requests.
    pub fn cpu_s_per_k(&self) -> f64 {
        if self.requests == 0 {
            f64::NAN
        } else {
            self.cpu_s * 1000.0 / self.requests as f64
        }
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

struct Node {
    child: ChildNode,
    listen: SocketAddr,
    admin: SocketAddr,
}

fn trace_name(trace: &str, scale: f64) -> String {
    format!("press:{trace}@{scale}")
}

/// Starts the cluster, warms it, measures; every node stopped on return.
fn run_one(config: &PressBenchConfig, trace: &str, system: &str, nodes: usize, repeat: usize) -> Result<PressRun> {
    run_at(config, trace, system, nodes, repeat, config.thresholds[0])
}

/// As [`run_one`], with Fig. 1's T = `threshold`.
fn run_at(
    config: &PressBenchConfig,
    trace: &str,
    system: &str,
    nodes: usize,
    repeat: usize,
    threshold: u32,
) -> Result<PressRun> {
    let (mode, transport) = match system {
        "traditional" | "dispatch-ho" | "haproxy" => (Mode::Traditional, TransportKind::Base),
        "distrib-ho" => (Mode::DistribHandoff, TransportKind::Base),
        "press-tcp" => (Mode::Press, TransportKind::Tcp),
        "press-rdma-1c" => (Mode::Press, TransportKind::Rdma1c),
        "press-rdma" => (Mode::Press, TransportKind::Rdma),
        "press-zero" => (Mode::Press, TransportKind::Zero),
        _ => (Mode::Press, TransportKind::Base),
    };
    let backend = if transport == TransportKind::Tcp { Backend::Tcp } else { Backend::Shm };
    let dir = tempfile::tempdir()?;
    let lines: Vec<NodeLine> = (0..nodes as u32).map(|id| NodeLine { id, role: "proxy", cpu: None }).collect();
    let name = format!("press-{}-{system}-{nodes}", std::process::id());
    let topology = write_topology(dir.path(), &name, backend, 2000, &lines)?;
    let spec = trace_name(trace, config.scale);
    let mut running = Vec::new();
    for id in 0..nodes {
        let (listen, admin) =
            (tierstack_deploy::process::free_loopback_port()?, tierstack_deploy::process::free_loopback_port()?);
        let at = NodeArgs { topology: topology.clone(), node: id as u32 };
        let node = PressNodeArgs {
            admin: Some(admin),
            mode,
            transport,
            disk_seek_us: Some(config.disk.0),
            disk_mb_per_s: Some(config.disk.1),
            threads: 1,
            threshold,
            send_inline: config.send_inline,
            handoff_dir: matches!(system, "distrib-ho" | "dispatch-ho").then(|| dir.path().to_path_buf()),
            ..PressNodeArgs::new(at, listen, spec.clone())
        };
        let args: Vec<String> = std::iter::once("press-node".to_string()).chain(node.to_args()).collect();
        running.push(Node { child: ChildNode::spawn(&config.exe, &args)?, listen, admin });
    }
    let trace_built: Trace = TraceSpec::parse(&spec, 1.0, 10)?.build(1)?;
    // The front ends of the hand-off dispatcher and HAProxy.
    let mut dispatcher: Option<(ChildNode, SocketAddr)> = None;
    let mut haproxy: Option<Haproxy> = None;
    let mut targets: Vec<String> = running.iter().map(|n| format!("http://{}", n.listen)).collect();
    if system == "dispatch-ho" {
        let (listen, admin) =
            (tierstack_deploy::process::free_loopback_port()?, tierstack_deploy::process::free_loopback_port()?);
        let dispatcher_args =
            DispatcherArgs { admin: Some(admin), ..DispatcherArgs::new(listen, nodes, dir.path().to_path_buf()) };
        let args: Vec<String> =
            std::iter::once("press-dispatcher".to_string()).chain(dispatcher_args.to_args()).collect();
        dispatcher = Some((ChildNode::spawn(&config.exe, &args)?, admin));
        targets = vec![format!("http://{listen}")];
    }
    if system == "haproxy" {
        let exe = haproxy_path().context("no haproxy executable (install haproxy or set TIERSTACK_HAPROXY)")?;
        let servers: Vec<SocketAddr> = running.iter().map(|n| n.listen).collect();
        let front = Haproxy::start(&exe, &servers)?;
        targets = vec![format!("http://{}", front.listen)];
        haproxy = Some(front);
    }
    let load = |duration_s: u64, seed: u64| -> Result<tierstack_loadgen::LoadReport> {
        let mut load = LoadConfig::new(targets[0].clone(), trace_built.clone());
        load.targets = targets.clone();
        load.connections = config.connections;
        load.duration_ms = Some(duration_s * 1000);
        load.update_interval_ms = 0;
        load.seed = seed;
        load.target_choice = TargetChoice::Random;
        load.new_connection_per_request = true;
        load.static_content = true;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        Ok(runtime.block_on(tierstack_loadgen::run(load))?)
    };
    load(config.warmup_s, 7)?;
    let mut pids: Vec<u32> = running.iter().map(|n| n.child.pid()).collect();
    pids.extend(dispatcher.as_ref().map(|(child, _)| child.pid()));
    let before: Vec<NodeStats> =
        running.iter().map(|n| tierstack_deploy::deployment::get_json(n.admin, "/stats")).collect::<Result<_>>()?;
    let (cpu_before, started) = (cpu::cpu_seconds(&pids)?, tierstack_base::time::instant_now());
    let (throughput_rps, latency_mean_ms, errors) = if config.clients > 1 {
        cpu::load_processes(config, &targets, &spec, config.duration_s)?
    } else {
        let report = load(config.duration_s, 1)?;
        (report.throughput_rps, report.latency.mean_ns / 1e6, report.errors.total())
    };
    let (cpu_after, window_s) = (cpu::cpu_seconds(&pids)?, started.elapsed().as_secs_f64());
    let after: Vec<NodeStats> =
        running.iter().map(|n| tierstack_deploy::deployment::get_json(n.admin, "/stats")).collect::<Result<_>>()?;
    let load_average = load_average();
    drop(haproxy);
    if let Some((child, _)) = dispatcher {
        child.finish().context("stopping the dispatcher")?;
    }
    for node in running {
        node.child.finish().with_context(|| format!("stopping a {system} node"))?;
    }
    let d =
        |f: fn(&NodeStats) -> u64| -> u64 { after.iter().zip(&before).map(|(a, b)| f(a).saturating_sub(f(b))).sum() };
    let counts = after.iter().zip(&before).fold(Counts::default(), |c, (a, b)| c.plus(&a.counts().since(&b.counts())));
    // The dispatcher's back-ends count every request as handed to them.
    let (requests, forwarded) = match system {
        "dispatch-ho" => (d(|s| s.served_for_peers), d(|s| s.served_for_peers)),
        _ => (d(|s| s.requests), d(|s| s.forwarded)),
    };
    let (hits, misses) = (d(|s| s.cache_hits), d(|s| s.cache_misses));
    let per_node: Vec<f64> = after
        .iter()
        .zip(&before)
        .filter_map(|(a, b)| {
            let (h, m) = (a.cache_hits.saturating_sub(b.cache_hits), a.cache_misses.saturating_sub(b.cache_misses));
            (h + m > 0).then(|| 100.0 * h as f64 / (h + m) as f64)
        })
        .collect();
    let local_hit_rate_pct =
        if per_node.is_empty() { 0.0 } else { per_node.iter().sum::<f64>() / per_node.len() as f64 };
    Ok(PressRun {
        trace: trace.to_string(),
        system: system.to_string(),
        nodes,
        throughput_rps,
        latency_mean_ms,
        requests,
        errors,
        forwarded_pct: if requests == 0 { 0.0 } else { 100.0 * forwarded as f64 / requests as f64 },
        hit_rate_pct: if hits + misses == 0 { 0.0 } else { 100.0 * hits as f64 / (hits + misses) as f64 },
        local_hit_rate_pct,
        repeat,
        disk_reads: d(|s| s.disk_reads),
        messages: counts.messages,
        bytes: counts.bytes,
        load_average,
        threshold,
        clients: config.clients,
        cpu_s: cpu_after.iter().zip(&cpu_before).map(|(a, b)| a - b).sum(),
        window_s,
        node_cpu_pct: cpu_after
            .iter()
            .zip(&cpu_before)
            .take(nodes)
            .map(|(a, b)| if window_s > 0.0 { 100.0 * (a - b) / window_s } else { f64::NAN })
            .collect(),
        branches: std::array::from_fn(|i| d_link(&after, &before, |l| l.branches[i])),
        files_from_slab: d_link(&after, &before, |l| l.files_from_slab),
        zero_copy_fallbacks: d(|s| s.zero_copy_fallbacks),
        idle_waits: d_link(&after, &before, |l| l.idle_waits),
        wakeups: d_link(&after, &before, |l| l.woken),
        doorbells: d_link(&after, &before, |l| l.doorbells),
        sends_inline: d(|s| s.sends_inline),
        sends_blocking: d(|s| s.sends_blocking),
    })
}

/// The sum over the nodes of a link counter's growth between two readings.
fn d_link(
    after: &[NodeStats],
    before: &[NodeStats],
    f: impl Fn(&tierstack_press_node::transport::LinkStats) -> u64,
) -> u64 {
    after.iter().zip(before).map(|(a, b)| f(&a.link).saturating_sub(f(&b.link))).sum()
}

/// One row per (trace, system, nodes): the mean over the rounds of
/// throughput, latency, shares and load average; counts summed.
fn mean_runs(runs: &[PressRun]) -> Vec<PressRun> {
    let mut out: Vec<PressRun> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    for r in runs {
        match out.iter().position(|m| m.trace == r.trace && m.system == r.system && m.nodes == r.nodes) {
            Some(i) => {
                let m = &mut out[i];
                counts[i] += 1;
                m.throughput_rps += r.throughput_rps;
                m.latency_mean_ms += r.latency_mean_ms;
                m.forwarded_pct += r.forwarded_pct;
                m.hit_rate_pct += r.hit_rate_pct;
                m.local_hit_rate_pct += r.local_hit_rate_pct;
                m.load_average += r.load_average;
                m.requests += r.requests;
                m.errors += r.errors;
                m.disk_reads += r.disk_reads;
                for k in 0..4 {
                    m.messages[k] += r.messages[k];
                    m.bytes[k] += r.bytes[k];
                }
            }
            None => {
                out.push(r.clone());
                counts.push(1);
            }
        }
    }
    for (m, n) in out.iter_mut().zip(counts) {
        let n = n as f64;
        m.throughput_rps /= n;
        m.latency_mean_ms /= n;
        m.forwarded_pct /= n;
        m.hit_rate_pct /= n;
        m.local_hit_rate_pct /= n;
        m.load_average /= n;
    }
    out
}

/// Fig. 6 / Table 3 / latency: every system per trace with the paper's
/// values, and the versions' order per round.
fn print_comparison(page: &mut Page, config: &PressBenchConfig, runs: &[PressRun], means: &[PressRun], largest: usize) {
    let find =
        |trace: &str, system: &str| means.iter().find(|r| r.trace == trace && r.system == system && r.nodes == largest);
    let mut fig6 = Table::new(
        &format!(
            "Fig. 6 and Table 3: every system, {largest} nodes, mean of {} round(s) (paper: 8 nodes; LHR = mean of \
             per-node hit rates, THR = global hit rate, Fwd = forwarded or handed-off share)",
            config.repeats.max(1)
        ),
        &[
            "trace",
            "system",
            "req/s",
            "÷ trad",
            "latency ms",
            "LHR %",
            "THR %",
            "Fwd %",
            "paper LHR/THR/Fwd",
            "errors",
            "load avg",
        ],
    );
    for trace in &config.traces {
        let paper = PAPER_TABLE3.iter().find(|p| p.0 == trace);
        let trad = find(trace, "traditional").map(|r| r.throughput_rps);
        for system in SYSTEMS {
            let Some(r) = find(trace, system) else { continue };
            let paper_cell = match (paper, system) {
                (Some(p), "traditional") => format!("HR {:.1}", p.1),
                (Some(p), "press-zero") => format!("{:.1} / {:.1} / {:.1}", p.2[0], p.2[1], p.2[2]),
                (Some(p), "distrib-ho") => format!("{:.1} / {:.1} / {:.1}", p.3[0], p.3[1], p.3[2]),
                (Some(p), "dispatch-ho") => {
                    format!("{:.1} / {:.1} / {:.1} (nodes ask on misses)", p.4[0], p.4[1], p.4[2])
                }
                _ => String::new(),
            };
            fig6.row(vec![
                trace.clone(),
                system.into(),
                format!("{:.0}", r.throughput_rps),
                trad.map(|t| format!("{:.2}", r.throughput_rps / t)).unwrap_or_default(),
                format!("{:.1}", r.latency_mean_ms),
                format!("{:.1}", r.local_hit_rate_pct),
                format!("{:.1}", r.hit_rate_pct),
                format!("{:.1}", r.forwarded_pct),
                paper_cell,
                r.errors.to_string(),
                format!("{:.2}", r.load_average),
            ]);
        }
    }
    page.print(&fig6);
    page.paragraph(
        "Paper (§4.3-4.4, 8 nodes): PRESS-Zero and Distrib HO \"perform virtually the same\"; Dispatch HO slightly \
         worse; PRESS-Base substantially worse than both hand-off servers; PRESS +77 % over traditional on average. \
         Latency at maximum throughput, Clarknet: Zero 27 ms = Distrib HO 27, Dispatch HO 30, Base 33, traditional 43. \
         HAProxy (bounded-load consistent hashing) is not in the paper.",
    );
    let mut latency = Table::new(
        &format!("Latency at the closed loop's throughput, {largest} nodes (paper: Clarknet, 8 nodes)"),
        &["trace", "system", "latency ms", "paper ms"],
    );
    for trace in &config.traces {
        for (system, paper) in PAPER_LATENCY_MS {
            let Some(r) = find(trace, system) else { continue };
            let paper = if trace == "clarknet" { format!("{paper:.0}") } else { "same trend".into() };
            latency.row(vec![trace.clone(), system.into(), format!("{:.1}", r.latency_mean_ms), paper]);
        }
    }
    page.print(&latency);
    const VERSIONS: [&str; 5] = ["press-tcp", "press-base", "press-rdma-1c", "press-rdma", "press-zero"];
    let mut order = Table::new(
        "The versions' order per round (claim: TCP < Base < RDMA-1c ≤ RDMA < Zero; paper: RDMA-1c ≈ Base)",
        &["trace", "round", "TCP", "Base", "RDMA-1c", "RDMA", "Zero", "order holds", "load avg"],
    );
    for trace in &config.traces {
        for repeat in 0..config.repeats.max(1) {
            let row: Vec<Option<&PressRun>> = VERSIONS
                .iter()
                .map(|v| {
                    runs.iter()
                        .find(|r| &r.trace == trace && r.system == *v && r.nodes == largest && r.repeat == repeat)
                })
                .collect();
            if row.iter().any(Option::is_none) {
                continue;
            }
            let t: Vec<f64> = row.iter().flatten().map(|r| r.throughput_rps).collect();
            let holds = t.windows(2).all(|w| w[0] < w[1]);
            let la = row.iter().flatten().map(|r| r.load_average).sum::<f64>() / t.len() as f64;
            let mut cells = vec![trace.clone(), repeat.to_string()];
            cells.extend(t.iter().map(|v| format!("{v:.0}")));
            cells.push(if holds { "yes".into() } else { "no".into() });
            cells.push(format!("{la:.2}"));
            order.row(cells);
        }
    }
    page.print(&order);
}

fn gain(new: f64, base: f64) -> f64 {
    if base > 0.0 {
        100.0 * (new / base - 1.0)
    } else {
        f64::NAN
    }
}

/// Runs every experiment, prints the tables, writes JSON and SVG plots into
/// `config.out`.
pub fn run(config: &PressBenchConfig) -> Result<Vec<PressRun>> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let largest = config.nodes.iter().copied().max().unwrap_or(2).max(2);
    let mut runs = Vec::new();
    // Fig. 3, traditional comparison and Table 2: per trace on the largest cluster.
    let haproxy = haproxy_path();
    if haproxy.is_none() && config.systems.iter().any(|s| s == "haproxy") {
        eprintln!("bench press: skipping haproxy: no haproxy executable (install haproxy or set TIERSTACK_HAPROXY)");
    }
    let systems: Vec<&str> =
        config.systems.iter().map(String::as_str).filter(|s| *s != "haproxy" || haproxy.is_some()).collect();
    for repeat in 0..config.repeats.max(1) {
        for trace in &config.traces {
            // Alternate the order between rounds too.
            let order: Vec<&str> =
                if repeat % 2 == 0 { systems.clone() } else { systems.iter().rev().copied().collect() };
            for system in order {
                eprintln!(
                    "bench press: round {repeat} {trace} {system} on {largest} nodes (load average {:.2})",
                    load_average()
                );
                runs.push(run_one(config, trace, system, largest, repeat)?);
            }
        }
    }
    // Fig. 5: Clarknet (or the first trace) against the node count.
    let fig5_trace = config.traces.iter().find(|t| *t == "clarknet").unwrap_or(&config.traces[0]).clone();
    for &nodes in config.nodes.iter().filter(|&&n| n != largest && !config.skip_fig5) {
        for system in FIG5_SYSTEMS {
            eprintln!("bench press: {fig5_trace} {system} on {nodes} nodes");
            runs.push(run_one(config, &fig5_trace, system, nodes, 0)?);
        }
    }
    write_json(&config.out.join("runs.json"), &runs)?;
    let mut page = Page::new("tierstack bench press: PRESS (Carrera and Bianchini), Fig. 3-5 and Table 2");
    page.paragraph(&format!(
        "{} nodes per trace, traces at scale {}, {} closed-loop connections (a new connection per request, random \
         targets), {} s measured after {} s of warm-up per run; the load average is printed beside each row.",
        largest, config.scale, config.connections, config.duration_s, config.warmup_s
    ));
    let means: Vec<PressRun> = mean_runs(&runs);
    let find = |trace: &str, system: &str, nodes: usize| {
        means.iter().find(|r| r.trace == trace && r.system == system && r.nodes == nodes)
    };
    let mut fig3 = Table::new(
        &format!("Fig. 3: PRESS over TCP vs Base, {largest} nodes (paper: 8 nodes, VIA vs TCP over cLAN)"),
        &["trace", "TCP req/s", "Base req/s", "Base over TCP", "paper", "load avg"],
    );
    let mut vs_trad = Table::new(
        &format!("PRESS vs traditional, {largest} nodes (paper: PRESS-Zero, 8 nodes)"),
        &["trace", "traditional req/s", "PRESS-Base req/s", "gain", "paper", "Fwd %", "THR %", "trad HR %"],
    );
    for trace in &config.traces {
        let Some(base) = find(trace, "press-base", largest) else { continue };
        if let Some(tcp) = find(trace, "press-tcp", largest) {
            let paper = PAPER_FIG3.iter().find(|p| p.0 == trace).and_then(|p| p.1);
            fig3.row(vec![
                trace.clone(),
                format!("{:.0}", tcp.throughput_rps),
                format!("{:.0}", base.throughput_rps),
                format!("{:+.1} %", gain(base.throughput_rps, tcp.throughput_rps)),
                paper.map(|p| format!("{p:+.0} %")).unwrap_or_else(|| "6..28 %".into()),
                format!("{:.2}", base.load_average),
            ]);
        }
        let Some(trad) = find(trace, "traditional", largest) else { continue };
        let paper = PAPER_VS_TRADITIONAL.iter().find(|p| p.0 == trace).map(|p| p.1);
        vs_trad.row(vec![
            trace.clone(),
            format!("{:.0}", trad.throughput_rps),
            format!("{:.0}", base.throughput_rps),
            format!("{:+.1} %", gain(base.throughput_rps, trad.throughput_rps)),
            paper.map(|p| format!("{p:+.0} %")).unwrap_or_default(),
            format!("{:.1}", base.forwarded_pct),
            format!("{:.1}", base.hit_rate_pct),
            format!("{:.1}", trad.hit_rate_pct),
        ]);
    }
    page.print(&fig3);
    let mut fig4 = Table::new(
        &format!("Fig. 4: remote-write versions over Base, {largest} nodes (paper: 8 nodes)"),
        &[
            "trace",
            "Base req/s",
            "RDMA-1c req/s",
            "RDMA req/s",
            "Zero req/s",
            "RDMA-1c/Base",
            "paper",
            "RDMA/Base",
            "paper",
            "Zero/Base",
            "paper",
            "Zero/TCP",
            "paper",
            "load avg",
        ],
    );
    const PAPER_FIG4_RDMA: [(&str, &str); 5] = [
        ("clarknet", "11..23 %"),
        ("nasa", "11..23 %"),
        ("rutgers", "+23 %"),
        ("usask", "11..23 %"),
        ("wc98", "+11 %"),
    ];
    const PAPER_FIG4_ZERO: [(&str, &str); 5] = [
        ("clarknet", "15..29 %"),
        ("nasa", "15..29 %"),
        ("rutgers", "+29 %"),
        ("usask", "15..29 %"),
        ("wc98", "+15 %"),
    ];
    for trace in &config.traces {
        let (Some(tcp), Some(base), Some(rdma1c), Some(rdma), Some(zero)) = (
            find(trace, "press-tcp", largest),
            find(trace, "press-base", largest),
            find(trace, "press-rdma-1c", largest),
            find(trace, "press-rdma", largest),
            find(trace, "press-zero", largest),
        ) else {
            continue;
        };
        fig4.row(vec![
            trace.clone(),
            format!("{:.0}", base.throughput_rps),
            format!("{:.0}", rdma1c.throughput_rps),
            format!("{:.0}", rdma.throughput_rps),
            format!("{:.0}", zero.throughput_rps),
            format!("{:+.1} %", gain(rdma1c.throughput_rps, base.throughput_rps)),
            "≈ 0".into(),
            format!("{:+.1} %", gain(rdma.throughput_rps, base.throughput_rps)),
            PAPER_FIG4_RDMA.iter().find(|p| p.0 == trace).map(|p| p.1).unwrap_or("").into(),
            format!("{:+.1} %", gain(zero.throughput_rps, base.throughput_rps)),
            PAPER_FIG4_ZERO.iter().find(|p| p.0 == trace).map(|p| p.1).unwrap_or("").into(),
            format!("{:+.1} %", gain(zero.throughput_rps, tcp.throughput_rps)),
            "up to +52 %".into(),
            format!("{:.2}", zero.load_average),
        ]);
    }
    page.print(&fig4);
    page.print(&vs_trad);
    print_comparison(&mut page, config, &runs, &means, largest);
    let table2_trace = &fig5_trace;
    for system in ["press-base", "press-rdma-1c", "press-rdma", "press-zero", "press-tcp"] {
        let Some(run) = find(table2_trace, system, largest) else { continue };
        let (paper_rows, paper_total, paper_name) = match system {
            "press-rdma-1c" => (&PAPER_TABLE2_RDMA1C, ("2918.4", "6878.1"), "RDMA-1c"),
            "press-rdma" => (&PAPER_TABLE2_RDMA, ("3160.8", "7485.3"), "RDMA"),
            "press-zero" => (&PAPER_TABLE2_ZERO, ("3165.3", "7501.0"), "Zero"),
            _ => (&PAPER_TABLE2_BASE, ("1969.5", "6689.0"), "Base"),
        };
        let mut t2 = Table::new(
            &format!(
                "Table 2: {system}, {table2_trace}, {largest} nodes, per 1,000 requests (paper: {paper_name}, Clarknet, 8 nodes)"
            ),
            &["type", "msgs", "paper msgs", "KiB", "paper KB", "avg bytes", "paper avg"],
        );
        let counts = Counts { messages: run.messages, bytes: run.bytes };
        let mut total = (0.0, 0.0);
        for row in counts.table2(run.requests) {
            let paper = paper_rows.iter().find(|p| p.0 == row.kind);
            total.0 += row.messages_per_k;
            total.1 += row.kbytes_per_k;
            t2.row(vec![
                row.kind.name().into(),
                format!("{:.1}", row.messages_per_k),
                paper.map(|p| format!("{:.1}", p.1)).unwrap_or_default(),
                format!("{:.1}", row.kbytes_per_k),
                paper.map(|p| format!("{:.1}", p.2)).unwrap_or_default(),
                row.avg_bytes.map(|a| format!("{a:.1}")).unwrap_or_else(|| "N/A".into()),
                paper.map(|p| if p.3.is_nan() { "N/A".into() } else { format!("{:.1}", p.3) }).unwrap_or_default(),
            ]);
        }
        t2.row(vec![
            "TOTAL".into(),
            format!("{:.1}", total.0),
            paper_total.0.into(),
            format!("{:.1}", total.1),
            paper_total.1.into(),
            "–".into(),
            "–".into(),
        ]);
        page.print(&t2);
    }
    let mut fig5 = Table::new(
        &format!("Fig. 5: throughput vs nodes, {fig5_trace} (req/s)"),
        &["nodes", "traditional", "PRESS-TCP", "PRESS-Base", "PRESS-Zero", "load avg"],
    );
    let mut series: Vec<Series> = Vec::new();
    for system in FIG5_SYSTEMS {
        let mut points = Vec::new();
        for &n in &config.nodes {
            if let Some(r) = find(&fig5_trace, system, n) {
                points.push((n as f64, r.throughput_rps));
            }
        }
        series.push(Series { label: system.into(), points });
    }
    for &n in &config.nodes {
        let cell = |s: &str| find(&fig5_trace, s, n).map(|r| format!("{:.0}", r.throughput_rps)).unwrap_or_default();
        let la = find(&fig5_trace, "press-base", n).map(|r| format!("{:.2}", r.load_average)).unwrap_or_default();
        fig5.row(vec![
            n.to_string(),
            cell("traditional"),
            cell("press-tcp"),
            cell("press-base"),
            cell("press-zero"),
            la,
        ]);
    }
    page.print(&fig5);
    let axes = Axes { x_label: "nodes", y_label: "throughput (requests/s)", log_x: false, log_y: false };
    line_plot(&config.out.join("fig5.svg"), &format!("Fig. 5: throughput vs nodes, {fig5_trace}"), axes, &series)?;
    let categories: Vec<String> = config.traces.clone();
    let groups: Vec<BarGroup> = ["press-tcp", "press-base", "press-rdma-1c", "press-rdma", "press-zero", "traditional"]
        .iter()
        .map(|s| BarGroup {
            label: s.to_string(),
            values: categories.iter().map(|t| find(t, s, largest).map(|r| r.throughput_rps).unwrap_or(0.0)).collect(),
        })
        .collect();
    let axes = Axes { x_label: "trace", y_label: "throughput (requests/s)", log_x: false, log_y: false };
    bar_chart(
        &config.out.join("fig3.svg"),
        &format!("Fig. 3 and traditional, {largest} nodes"),
        axes,
        &categories,
        &groups,
    )?;
    for plot in ["fig3.svg", "fig5.svg"] {
        page.plot(&config.out.join(plot))?;
    }
    page.write(&config.out)?;
    Ok(runs)
}
