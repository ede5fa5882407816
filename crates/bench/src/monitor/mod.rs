//! `tierstack bench monitor`: fine-grained monitoring (services paper
//! §5.2, Fig. 8a): how far each scheme's reported number of running
//! threads is from the actual number at the moment a front end uses it, as
//! the back end gets busier.
//!
//! Per compute-thread count, one run: a `tierstack monitor-node` process
//! (fabric node 0, pinned to the last CPU when there are two or more) runs
//! `walk_max` worker threads that a seeded random walk wakes (they spin)
//! and idles (they block), and K compute threads that always spin; each
//! running thread counts in its published `running_threads`. This process
//! (node 1) reads the four schemes, each from its own thread, every
//! `sample_every`, and stamps each reading with its time of use
//! (`CLOCK_MONOTONIC`). **The truth** is independent of all of it: an
//! observer thread here ([`truth`]) scans the back end's
//! `/proc/<pid>/task/*/stat` about every millisecond and counts the
//! `worker-*`/`compute-*` tasks the kernel has in state `R`; each reading
//! is joined to the scan covering (or nearest) its time of use. The walk's
//! own log (busy workers + K) is kept as a secondary column: what the back
//! end meant, not what the kernel ran. Compute threads delay the back end's
//! monitor thread (the async schemes' sampler, Socket-Sync's answers),
//! never RDMA-Sync's read. RDMA-Async's record also carries the host-wide
//! `procs_running` the sampler read; it is joined to the same truth and
//! reported on its own line, with its age.
//! [R] With two or more CPUs the walk's thread runs on CPU 0, away from the
//! compute threads: otherwise a starved walk would barely move under load
//! and every scheme would look accurate for the wrong reason (seen: at 200
//! compute threads the walk made a fraction of its steps). The back end
//! runs in a session of its own and the walk at real-time priority where
//! the system allows it: Linux's autogroup otherwise starved both the walk
//! and this process's observer (see `run_once` and `monitor_node`).
//! A reading with no walk step between it and the end of its scan is
//! "quiet": the truth cannot be wrong about it, so its deviation is the
//! scheme's own (the table's second exact share).
//!
//! Fig. 8b lives in [`throughput`] ([`run_throughput`]), its simulated
//! counterpart in [`throughput_sim`] ([`run_throughput_sim`]), the
//! reconfiguration experiment in [`reconfig`] ([`run_reconfig`]), the
//! hung-back-end experiment in [`hung`] ([`run_hung`]).

mod hung;
mod reconfig;
mod throughput;
mod throughput_sim;
pub mod truth;

pub use hung::{run_hung, HungConfig, HungPoint, HungReport};
pub use reconfig::{run_reconfig, ReconfigBenchConfig, ReconfigPoint, ReconfigReport};
pub use throughput::{
    run_throughput, BalanceConfig, ThroughputConfig, ThroughputPoint, ThroughputReport, ThroughputSummary,
};
pub use throughput_sim::{run_throughput_sim, SimPoint, ThroughputSimConfig, ThroughputSimReport, FIG8A_READ_US};

use crate::monitor_node::MonitorNodeArgs;
use crate::report::{line_plot, write_json, Axes, Series, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tierstack_appserver::{AppServerArgs, ModuleArgs};
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_cluster::{open_fabric, Backend, NodeArgs, Topology};
use tierstack_deploy::deployment::strings;
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_monitor::deviation::{deviations, summarize, Change, DeviationSummary, Sample};
use tierstack_monitor::{open_source, BackendAddress, Health, LoadSource, Scheme, SourceConfig};
use truth::{join, Observer, Resolution, Truth};

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
    /// 8b-sim (Fig. 8b in the simulator, larger clusters), reconfig (two
    /// sites, load shifting, with and without the agent), or hung (a back
    /// end SIGSTOPped mid-run, each scheme with and without the liveness
    /// word).
    #[arg(long, default_value = "both", value_parser = ["8a", "8b", "both", "8b-sim", "reconfig", "hung"])]
    pub figure: String,
    /// Fig. 8b: Zipf exponents (default 0.25,0.5,0.75,0.9; 0.9 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub alphas: Option<Vec<f64>>,
    /// Fig. 8b: per-read CPU cost of the application servers (`app-server --cpu-cost`).
    #[arg(long, default_value = "rubis")]
    pub cpu_cost: String,
    /// Closed-loop clients (Fig. 8b: default 32; hung: 16).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Fig. 8b: compute threads of each application server (server i
    /// takes entry i mod the count; default 4 each).
    #[arg(long, value_delimiter = ',')]
    pub backend_compute_threads: Option<Vec<usize>>,
    /// Fig. 8b and 8b-sim: repeats (seeds for 8b-sim); default 3, 1 with --quick.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// 8b-sim: back ends per cluster.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32")]
    pub sim_backends: Vec<usize>,
    /// 8b-sim: front ends, each balancing on its own.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub sim_front_ends: Vec<usize>,
    /// 8b-sim: workers per back end.
    #[arg(long, default_value_t = 4)]
    pub sim_workers: usize,
    /// 8b-sim: closed-loop clients per worker (both services).
    #[arg(long, default_value_t = 1)]
    pub sim_clients_per_worker: usize,
    /// 8b-sim: the share of the clients that belong to a second,
    /// hash-routed service on the same back ends; each value a setting (0:
    /// the balanced service alone).
    #[arg(long, value_delimiter = ',', default_value = "0,0.5")]
    pub sim_second_service_share: Vec<f64>,
    /// 8b-sim: the Fig. 8a load levels (compute threads) whose measured
    /// read costs feed the schemes.
    #[arg(long, value_delimiter = ',', default_value = "0,200")]
    pub sim_compute_threads: Vec<usize>,
    /// 8b-sim: take the read costs from this Fig. 8a `monitor.json`
    /// (default: docs/results.md's Fig. 8a table).
    #[arg(long)]
    pub sim_fig8a: Option<PathBuf>,
    /// 8b-sim: requests measured per run (default 200000, 20000 with --quick).
    #[arg(long)]
    pub sim_requests: Option<u64>,
}

impl MonitorArgs {
    /// Runs the figures `--figure` chose; `exe` is the `tierstack`
    /// executable the back ends are started from.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        let exe = exe()?;
        let interval = Duration::from_millis(self.interval_ms.max(1));
        if self.figure == "hung" {
            let mut config = HungConfig::new(exe, self.out, self.quick);
            if let Some(seconds) = self.duration_s {
                config.duration = Duration::from_secs(seconds);
            }
            config.interval = interval;
            if let Some(connections) = self.connections {
                config.connections = connections;
            }
            run_hung(&config)?;
            return Ok(());
        }
        if self.figure == "reconfig" {
            let mut config = ReconfigBenchConfig::new(exe, self.out, self.quick);
            if let Some(seconds) = self.duration_s {
                config.phase = Duration::from_secs(seconds);
            }
            run_reconfig(&config)?;
            return Ok(());
        }
        if self.figure == "8b-sim" {
            let mut config = ThroughputSimConfig::new(self.out, self.quick);
            config.backends = self.sim_backends;
            config.front_ends = self.sim_front_ends;
            config.workers = self.sim_workers;
            config.clients_per_worker = self.sim_clients_per_worker;
            config.second_service_share = self.sim_second_service_share;
            config.compute_threads = self.sim_compute_threads;
            config.fig8a = self.sim_fig8a;
            config.interval = interval;
            config.cpu_cost = self.cpu_cost;
            if let Some(requests) = self.sim_requests {
                config.requests = requests;
            }
            if let Some(repeats) = self.repeats {
                config.repeats = repeats;
            }
            run_throughput_sim(&config)?;
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
            if let Some(repeats) = self.repeats {
                config.repeats = repeats;
            }
            config.interval = interval;
            config.cpu_cost = self.cpu_cost;
            if let Some(connections) = self.connections {
                config.connections = connections;
            }
            if let Some(threads) = self.backend_compute_threads {
                config.compute_threads = threads;
            }
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
    /// Worker threads of the back end (the walk's range).
    pub walk_max: usize,
    /// How often the observer starts a scan of the back end's tasks.
    pub observe_every: Duration,
    /// A reading farther than this from every scan is left out of the join.
    pub max_gap: Duration,
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
            walk_max: 32,
            observe_every: Duration::from_millis(1),
            max_gap: Duration::from_millis(2),
            seed: 1,
        }
    }
}

/// A deviation summary and its signed mean.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Deviation {
    /// Of |reported − truth|.
    pub summary: DeviationSummary,
    /// Mean of reported − truth: below zero, the scheme under-reports.
    pub mean_signed: f64,
}

impl Deviation {
    fn of(deviations: &[(u64, i64)]) -> Self {
        let sum: i64 = deviations.iter().map(|(_, d)| d).sum();
        Deviation { summary: summarize(deviations), mean_signed: sum as f64 / deviations.len().max(1) as f64 }
    }
}

/// One scheme at one compute-thread count.
#[derive(Clone, Debug, Serialize)]
pub struct AccuracyPoint {
    pub scheme: Scheme,
    pub compute_threads: usize,
    /// Reported running threads − the observer's count at the time of use,
    /// over the fresh and stale readings.
    pub deviation: DeviationSummary,
    pub mean_signed: f64,
    /// The same, over the "quiet" readings: those with no step of the walk
    /// from the reading through its scan (the window the truth cannot
    /// resolve), so what is left is the scheme's own error.
    pub quiet: DeviationSummary,
    /// Against the walk's own log (busy workers + compute threads): what
    /// the back end meant, a secondary measure.
    pub vs_walk: Deviation,
    /// The record's host-wide `procs_running` against the same truth, for
    /// the schemes whose record carries it.
    pub procs_running: Option<Deviation>,
    /// Readings by health.
    pub fresh: u64,
    pub stale: u64,
    pub unusable: u64,
    /// Mean time one read took at the front end, in µs.
    pub read_us_mean: f64,
    /// Age of the value when read (read time − its sample time), ms.
    pub age_ms_p50: f64,
    pub age_ms_p99: f64,
}

/// The truth of one run: how finely the observer saw the back end.
#[derive(Clone, Debug, Serialize)]
pub struct TruthPoint {
    pub compute_threads: usize,
    pub resolution: Resolution,
    /// Steps the walk made.
    pub walk_steps: usize,
}

#[derive(Serialize)]
pub struct MonitorReport {
    pub interval_ms: u64,
    pub sample_every_us: u64,
    pub step_us: u64,
    pub walk_max: usize,
    /// (compute threads, entries of the walk's log).
    pub walk_changes: Vec<(usize, usize)>,
    pub truth: Vec<TruthPoint>,
    pub accuracy: Vec<AccuracyPoint>,
}

/// One reading the front end used.
struct Use {
    used_ns: u64,
    running_threads: i64,
    procs_running: Option<i64>,
    age_ns: u64,
}

#[derive(Default)]
struct SchemeLog {
    uses: Vec<Use>,
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
            Health::Suspect | Health::Dead | Health::Unknown => log.unusable += 1,
        }
        if matches!(reading.health, Health::Fresh | Health::Stale) {
            log.uses.push(Use {
                used_ns,
                running_threads: i64::from(reading.record.counters.running_threads),
                procs_running: reading.record.kernel.procs_running.map(i64::from),
                age_ns: reading.age_ns(),
            });
        }
        next += config.sample_every;
        if let Some(wait) = next.checked_duration_since(tierstack_base::time::instant_now()) {
            std::thread::sleep(wait);
        }
    }
    log
}

/// The walk's log as printed by `monitor-node`: `<t_ns> <busy workers>` lines.
fn walk_changes(log: &str, compute_threads: usize) -> Vec<Change> {
    log.lines()
        .filter_map(|line| {
            let (t, v) = line.split_once(' ')?;
            let busy: i64 = v.trim().parse().ok()?;
            Some(Change { t_ns: t.trim().parse().ok()?, value: busy + compute_threads as i64 })
        })
        .collect()
}

/// The deviations of the readings whose window (from the time of use
/// through the whole of its scan) holds no step of the walk.
fn quiet(truth: &Truth, walk: &[Change], readings: &[(u64, i64)], max_gap_ns: u64) -> Vec<(u64, i64)> {
    // The log is in time order (one walk thread, one clock).
    let steps = |from: u64, to: u64| {
        walk.partition_point(|c| c.t_ns < to.saturating_add(1)) - walk.partition_point(|c| c.t_ns < from)
    };
    readings
        .iter()
        .filter_map(|&(t_ns, reported)| {
            let scan = truth.at(t_ns, max_gap_ns)?;
            let (from, to) = (t_ns.min(scan.start_ns), t_ns.max(scan.end_ns));
            (steps(from, to) == 0).then(|| (t_ns, reported - i64::from(scan.running)))
        })
        .collect()
}

/// Milliseconds at the `pct` percentile of `ns`.
fn ms_at(ns: &mut [u64], pct: f64) -> f64 {
    ns.sort_unstable();
    tierstack_stats::percentile(ns, pct) as f64 / 1e6
}

/// One run: the back end with `threads` compute threads, four schemes read,
/// the observer scanning.
fn run_once(config: &MonitorBenchConfig, threads: usize) -> Result<(Vec<AccuracyPoint>, TruthPoint, usize)> {
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
        walk_max: config.walk_max,
        step_us: u64::try_from(config.step.as_micros())?,
        seed: config.seed,
        // The walk moves at the pace it would without the compute threads.
        walk_cpu: back_cpu.map(|_| 0),
        ..MonitorNodeArgs::new(at, socket)
    };
    let args = command("monitor-node", node.to_args());
    // In a session of its own, as a remote node would be: in ours, the
    // back end's hundreds of spinning threads would shrink our autogroup's
    // weight on the other CPU, and other sessions' work there would starve
    // the observer and the readers (seen: 6 scans in a second at 200).
    let child = ChildNode::spawn_in_own_session(&config.exe, &args).context("starting the monitored back end")?;
    // After `ready`: every thread of the back end is named and counted.
    let observer = Observer::start(child.pid(), config.observe_every).context("observing the back end")?;
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
    let truth = Truth::new(observer.stop()?)?;
    let walk_log = child.finish().context("stopping the back end")?;
    let changes = walk_changes(&walk_log, threads);
    anyhow::ensure!(changes.len() > 1, "the back end logged no walk ({} lines)", walk_log.lines().count());
    anyhow::ensure!(truth.scans().len() > 1, "the observer made {} scans", truth.scans().len());
    let max_gap_ns = u64::try_from(config.max_gap.as_nanos())?;
    let points = Scheme::ALL
        .into_iter()
        .zip(logs)
        .map(|(scheme, log)| {
            let running: Vec<(u64, i64)> = log.uses.iter().map(|u| (u.used_ns, u.running_threads)).collect();
            let against_truth = Deviation::of(&join(&truth, &running, max_gap_ns));
            let samples: Vec<Sample> =
                running.iter().map(|&(used_ns, reported)| Sample { used_ns, reported }).collect();
            let procs: Vec<(u64, i64)> = log.uses.iter().filter_map(|u| Some((u.used_ns, u.procs_running?))).collect();
            let mut ages: Vec<u64> = log.uses.iter().map(|u| u.age_ns).collect();
            AccuracyPoint {
                scheme,
                compute_threads: threads,
                deviation: against_truth.summary,
                mean_signed: against_truth.mean_signed,
                quiet: summarize(&quiet(&truth, &changes, &running, max_gap_ns)),
                vs_walk: Deviation::of(&deviations(&changes, &samples)),
                procs_running: (!procs.is_empty()).then(|| Deviation::of(&join(&truth, &procs, max_gap_ns))),
                fresh: log.fresh,
                stale: log.stale,
                unusable: log.unusable,
                read_us_mean: log.read_ns as f64 / log.reads.max(1) as f64 / 1000.0,
                age_ms_p50: ms_at(&mut ages, 50.0),
                age_ms_p99: ms_at(&mut ages, 99.0),
            }
        })
        .collect();
    let truth_point =
        TruthPoint { compute_threads: threads, resolution: truth.resolution(), walk_steps: changes.len() - 1 };
    Ok((points, truth_point, changes.len()))
}

pub fn run(config: &MonitorBenchConfig) -> Result<MonitorReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    let mut report = MonitorReport {
        interval_ms: config.interval.as_millis() as u64,
        sample_every_us: config.sample_every.as_micros() as u64,
        step_us: config.step.as_micros() as u64,
        walk_max: config.walk_max,
        walk_changes: Vec::new(),
        truth: Vec::new(),
        accuracy: Vec::new(),
    };
    for &threads in &config.compute_threads {
        let (points, truth, changes) = run_once(config, threads)?;
        report.walk_changes.push((threads, changes));
        report.truth.push(truth);
        report.accuracy.extend(points);
    }
    let mut table = Table::new(
        "Fig. 8a: reported - actual running threads at the time of use (actual: the observer's /proc scans; shm)",
        &[
            "compute",
            "scheme",
            "joined",
            "mean |dev|",
            "mean dev",
            "p99",
            "exact %",
            "quiet",
            "exact %",
            "vs walk",
            "stale %",
            "age p50 ms",
            "read µs",
        ],
    );
    for p in &report.accuracy {
        let used = (p.fresh + p.stale).max(1);
        table.row(vec![
            p.compute_threads.to_string(),
            p.scheme.name().to_string(),
            p.deviation.samples.to_string(),
            format!("{:.2}", p.deviation.mean_abs),
            format!("{:+.2}", p.mean_signed),
            p.deviation.p99_abs.to_string(),
            format!("{:.1}", 100.0 * p.deviation.exact_share),
            p.quiet.samples.to_string(),
            format!("{:.1}", 100.0 * p.quiet.exact_share),
            format!("{:.2}", p.vs_walk.summary.mean_abs),
            format!("{:.1}", 100.0 * p.stale as f64 / used as f64),
            format!("{:.2}", p.age_ms_p50),
            format!("{:.1}", p.read_us_mean),
        ]);
    }
    println!("{}", table.render());
    let mut truth_table = Table::new(
        "Fig. 8a: the truth's resolution, and RDMA-Async's host-wide procs_running against it",
        &[
            "compute",
            "scans",
            "scan p50 µs",
            "scan p99 µs",
            "period p50 µs",
            "actual mean",
            "walk steps",
            "procs_running mean dev",
            "p99 |dev|",
            "its age p50/p99 ms",
        ],
    );
    for t in &report.truth {
        let rdma_async =
            report.accuracy.iter().find(|p| p.compute_threads == t.compute_threads && p.scheme == Scheme::RdmaAsync);
        let kernel = rdma_async.and_then(|p| Some((p, p.procs_running?)));
        let r = &t.resolution;
        truth_table.row(vec![
            t.compute_threads.to_string(),
            r.scans.to_string(),
            format!("{:.0}", r.scan_us_p50),
            format!("{:.0}", r.scan_us_p99),
            format!("{:.0}", r.period_us_p50),
            format!("{:.1}", r.running_mean),
            t.walk_steps.to_string(),
            kernel.map_or("-".into(), |(_, k)| format!("{:+.2}", k.mean_signed)),
            kernel.map_or("-".into(), |(_, k)| k.summary.p99_abs.to_string()),
            kernel.map_or("-".into(), |(p, _)| format!("{:.1} / {:.1}", p.age_ms_p50, p.age_ms_p99)),
        ]);
    }
    println!("{}", truth_table.render());
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
        "Fig. 8a: mean |reported - actual| running threads",
        axes("mean |deviation| (threads)"),
        &series(|p| p.deviation.mean_abs),
    )?;
    line_plot(
        &config.out_dir.join("fig8a_p99_deviation.svg"),
        "Fig. 8a: p99 |reported - actual| running threads",
        axes("p99 |deviation| (threads)"),
        &series(|p| p.deviation.p99_abs as f64),
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(report)
}

/// `tierstack <subcommand> <args>`.
pub(super) fn command(subcommand: &str, args: Vec<String>) -> Vec<String> {
    let mut words = strings(&[subcommand]);
    words.extend(args);
    words
}

/// The application module of the experiments' deployments (fabric node 0).
pub(super) fn module_command(topology: &std::path::Path, socket: &std::path::Path) -> Vec<String> {
    let at = NodeArgs { topology: topology.to_path_buf(), node: 0 };
    command("app-module", ModuleArgs::new(at, socket.to_path_buf()).to_args())
}

/// An application server of the experiments: a Zipf document set.
pub(super) fn zipf_server(
    listen: std::net::SocketAddr,
    socket: &std::path::Path,
    docs: usize,
    seed: u64,
) -> AppServerArgs {
    AppServerArgs { documents: "zipf".into(), docs, seed, ..AppServerArgs::new(listen, socket.to_path_buf()) }
}
