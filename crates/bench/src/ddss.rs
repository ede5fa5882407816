//! `tierstack bench ddss`: the services paper's Fig. 3a on our backends —
//! `put` latency of the distributed data sharing substrate under each
//! coherence model and by value size, `get` latency, and the same value
//! sizes against Redis on loopback, measured in the same run.
//!
//! The 1-byte rows by model, the write-coherence size sweep and the Redis
//! rows come from [`measure`] (RESP client: [`resp`]); this module adds the figure's
//! own grid (put latency for every model at every size), chooses the nodes,
//! and reports tables, JSON and plots.
//!
//! Nodes: by default the home of every key is a separate `tierstack
//! ddss-daemon` process (node 0, pinned to CPU 0 when there are two), and
//! this process is a passive node 1 (its measuring thread pinned to CPU 1)
//! that attaches its data path through the daemon's socket, as a local
//! process of Fig. 2 would; every get and put crosses the fabric to the
//! other process. [`Home::InProcess`] puts both nodes in this process
//! instead (for tests, where the `tierstack` binary is not at hand); table
//! titles say which was used.
//!
//! What the get rows mean: nothing writes a key while its gets are timed, so
//! null and temporal gets are served from the reader's local copy, delta and
//! read after a one-sided version check, write by a fetch, strict by a lock,
//! fetch and unlock; the "get path" column says so. Latencies are per
//! operation, back to back, on one thread; `ops_per_sec` in the JSON is
//! therefore 1 / mean.

pub mod daemon;
pub mod measure;
pub mod resp;

use crate::html::Report;
use crate::report::{us, Axes, Plot, Series, Table};
use crate::stats::{summarize_serial, Summary};
use anyhow::{bail, Context, Result};
use measure::{measure, measure_redis, measure_redis_server, BenchOptions, LatencyRow, RedisOutcome, SIZES};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_cluster::{local_cluster, open_fabric, pin_to_cpu, Backend, LocalCluster, NodeArgs, Topology};
use tierstack_ddss::ipc::DdssClient;
use tierstack_ddss::layout::VALUE_BYTES_MAX;
use tierstack_ddss::{Coherence, Ddss, DdssConfig, Placement};
use tierstack_deploy::process::{write_topology, ChildNode, NodeLine};

/// The node that is home to every measured key.
const HOME: NodeId = NodeId(0);
/// The measuring node.
const CLIENT: NodeId = NodeId(1);
/// Operation timeout of the generated topologies.
const OP_TIMEOUT_MS: u64 = 5000;
/// Measured operations per cell of a full run and of a `--quick` run.
pub const ITERATIONS_FULL: usize = 5000;
pub const ITERATIONS_QUICK: usize = 300;

/// Where the home node runs.
#[derive(Clone, Debug)]
pub enum Home {
    /// A `ddss-daemon` child of this `tierstack` executable.
    Process(PathBuf),
    /// A node of an in-process cluster.
    InProcess,
}

impl Home {
    fn describe(&self, pinned: bool) -> String {
        match (self, pinned) {
            (Home::Process(_), true) => "home: ddss-daemon process on CPU 0, client: this process on CPU 1".into(),
            (Home::Process(_), false) => "home: ddss-daemon process, client: this process".into(),
            (Home::InProcess, _) => "home and client: two nodes inside this process".into(),
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct DdssBenchConfig {
    pub out_dir: PathBuf,
    pub home: Home,
    pub backends: Vec<Backend>,
    /// Measured operations per cell.
    pub iterations: usize,
    /// Unmeasured operations before each cell.
    pub warmup: usize,
    /// Value sizes in bytes (Fig. 3a's x axis).
    pub sizes: Vec<usize>,
    pub models: Vec<Coherence>,
    /// Measure Redis on loopback too (skipped with a reason if it is not
    /// installed; a comparison that fails fails the run).
    pub redis: bool,
    /// The `redis-server` executable; `None`: looked up on the `PATH`.
    pub redis_server: Option<PathBuf>,
}

/// `tierstack bench ddss`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct DdssArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/ddss")]
    pub out: PathBuf,
    /// Fewer operations per cell (300 instead of 5000).
    #[arg(long)]
    pub quick: bool,
    /// Backends to measure.
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    pub backends: Vec<Backend>,
    /// Measured operations per cell (overrides the --quick choice).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1,64,1024,4096,16384,65536")]
    pub sizes: Vec<usize>,
    /// Run the home node inside this process instead of a separate `ddss-daemon` process.
    #[arg(long)]
    pub in_process: bool,
    /// Skip the Redis comparison.
    #[arg(long)]
    pub no_redis: bool,
}

impl DdssArgs {
    /// The configuration these flags describe; `exe` (the `tierstack`
    /// executable) is asked for only when the home node is a process.
    pub fn config(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<DdssBenchConfig> {
        let home = if self.in_process { Home::InProcess } else { Home::Process(exe()?) };
        let mut config = DdssBenchConfig::new(self.out, home, self.quick);
        config.backends = self.backends;
        config.sizes = self.sizes;
        if let Some(iterations) = self.iterations {
            config.iterations = iterations;
            config.warmup = iterations / 10;
        }
        config.redis = !self.no_redis;
        Ok(config)
    }

    /// Runs the experiment.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        run(&self.config(exe)?)?;
        Ok(())
    }
}

impl DdssBenchConfig {
    pub fn new(out_dir: PathBuf, home: Home, quick: bool) -> Self {
        let iterations = if quick { ITERATIONS_QUICK } else { ITERATIONS_FULL };
        Self {
            out_dir,
            home,
            backends: vec![Backend::Shm, Backend::Tcp],
            iterations,
            warmup: iterations / 10,
            sizes: SIZES.to_vec(),
            models: Coherence::examples().to_vec(),
            redis: true,
            redis_server: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.backends.is_empty() || self.models.is_empty() || self.sizes.is_empty() {
            bail!("bench ddss needs at least one backend, model and value size");
        }
        if self.iterations == 0 {
            bail!("bench ddss needs at least one iteration per cell");
        }
        if let Some(bad) = self.sizes.iter().find(|&&s| s == 0 || s > VALUE_BYTES_MAX as usize) {
            bail!("value size {bad} is outside 1..={VALUE_BYTES_MAX}");
        }
        Ok(())
    }

    fn options(&self, models: Vec<Coherence>, sizes: Vec<usize>) -> BenchOptions {
        BenchOptions { iterations: self.iterations, warmup: self.warmup, sizes, models }
    }
}

/// One measured cell.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// `ddss-shm`, `ddss-tcp` or `redis`.
    pub system: String,
    /// `model` (1 byte, by coherence model), `size` (by value size; DDSS
    /// under write coherence) or `grid` (put by model and size).
    pub experiment: String,
    /// `put` or `get` (SET and GET for Redis).
    pub op: String,
    /// Coherence model (`-` for Redis).
    pub model: String,
    pub value_bytes: usize,
    pub latency: Summary,
}

#[derive(Debug, Serialize)]
pub struct DdssReport {
    pub cpus: usize,
    /// Where the home node ran.
    pub home: String,
    pub iterations: usize,
    pub warmup: usize,
    pub cells: Vec<Cell>,
    /// Why Redis was not measured, if it was not.
    pub redis_skipped: Option<String>,
    /// What the per-model rows can and cannot show (`measure::MODEL_NOTE`).
    pub model_note: &'static str,
}

impl DdssReport {
    /// The cell of (system, experiment, op, model, bytes), if measured.
    pub fn cell(&self, system: &str, experiment: &str, op: &str, model: &str, bytes: usize) -> Option<&Cell> {
        self.cells.iter().find(|c| {
            c.system == system && c.experiment == experiment && c.op == op && c.model == model && c.value_bytes == bytes
        })
    }
}

fn cells_of(rows: Vec<LatencyRow>, experiment: &str) -> impl Iterator<Item = Cell> + '_ {
    rows.into_iter().map(move |row| Cell {
        system: row.system,
        experiment: experiment.to_string(),
        op: row.op,
        model: row.model,
        value_bytes: row.value_bytes,
        latency: summarize_serial(row.samples_ns),
    })
}

/// A backend's two nodes: the home (a child process or in-process) and the
/// measuring handle. Fields drop in order: the client before its home.
struct Session {
    client: Ddss,
    _home_process: Option<ChildNode>,
    _home_in_process: Option<(Arc<Ddss>, LocalCluster)>,
}

fn two_cpus() -> bool {
    tierstack_cluster::online_cpus() >= 2
}

fn start_session(config: &DdssBenchConfig, scratch: &Path, backend: Backend) -> Result<Session> {
    match &config.home {
        Home::Process(exe) => {
            let pinned = two_cpus();
            let nodes = [
                NodeLine { id: HOME.0, role: "app", cpu: pinned.then_some(0) },
                NodeLine { id: CLIENT.0, role: "passive", cpu: None },
            ];
            let name = format!("ddss-{}", backend.name());
            let topology_path = write_topology(scratch, &name, backend, OP_TIMEOUT_MS, &nodes)?;
            let socket = scratch.join(format!("{name}.sock"));
            let at = NodeArgs { topology: topology_path.clone(), node: HOME.0 };
            let mut args = vec!["ddss-daemon".to_string()];
            args.extend(daemon::DaemonArgs::new(at, socket.clone()).to_args());
            let daemon = ChildNode::spawn(exe, &args).context("starting the home's ddss-daemon")?;
            if pinned {
                pin_to_cpu(1)?;
            }
            let topology = Topology::load(&topology_path)?;
            let fabric = open_fabric(&topology, CLIENT)?;
            let control = DdssClient::connect(&socket)?;
            let client = control.attach_data_path(fabric)?;
            Ok(Session { client, _home_process: Some(daemon), _home_in_process: None })
        }
        Home::InProcess => {
            let cluster = local_cluster(backend, 2)?;
            let members = DdssConfig::default().with_members(vec![HOME]);
            let home = Arc::new(Ddss::start(cluster.fabric(HOME.0 as usize).clone(), members.clone())?);
            let client = Ddss::attach(cluster.fabric(CLIENT.0 as usize).clone(), members)?;
            Ok(Session { client, _home_process: None, _home_in_process: Some((home, cluster)) })
        }
    }
}

/// Fig. 3a's grid: put latency of every model at every size, a fresh key per cell.
fn put_grid(config: &DdssBenchConfig, client: &Ddss) -> Result<Vec<Cell>> {
    let system = format!("ddss-{}", client.backend_name());
    let mut cells = Vec::new();
    for model in &config.models {
        for &size in &config.sizes {
            let key = client.allocate(size as u64, Placement::Node(HOME), *model)?;
            let value = vec![0xa5u8; size];
            for _ in 0..config.warmup {
                client.put(key, &value)?;
            }
            let mut samples_ns = Vec::with_capacity(config.iterations);
            for _ in 0..config.iterations {
                let start = tierstack_base::time::instant_now();
                client.put(key, &value)?;
                samples_ns.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
            }
            client.free(key)?;
            cells.push(Cell {
                system: system.clone(),
                experiment: "grid".into(),
                op: "put".into(),
                model: model.to_string(),
                value_bytes: size,
                latency: summarize_serial(samples_ns),
            });
        }
    }
    Ok(cells)
}

/// Runs the whole experiment, prints the tables, writes `ddss.json` and the plots.
pub fn run(config: &DdssBenchConfig) -> Result<DdssReport> {
    config.validate()?;
    std::fs::create_dir_all(&config.out_dir).with_context(|| format!("creating {}", config.out_dir.display()))?;
    let scratch = tempfile::Builder::new().prefix("tierstack-ddss-").tempdir()?;
    let mut report = DdssReport {
        model_note: measure::MODEL_NOTE,
        cpus: tierstack_cluster::online_cpus(),
        home: config.home.describe(two_cpus()),
        iterations: config.iterations,
        warmup: config.warmup,
        cells: Vec::new(),
        redis_skipped: None,
    };
    for &backend in &config.backends {
        eprintln!("bench ddss: {} ({})", backend.name(), report.home);
        let session = start_session(config, scratch.path(), backend)?;
        let by_model = measure(&session.client, HOME, &config.options(config.models.clone(), vec![]))?;
        report.cells.extend(cells_of(by_model, "model"));
        let by_size = measure(&session.client, HOME, &config.options(vec![], config.sizes.clone()))?;
        report.cells.extend(cells_of(by_size, "size"));
        report.cells.extend(put_grid(config, &session.client)?);
    }
    let mut redis_failed = None;
    if config.redis {
        eprintln!("bench ddss: redis on loopback");
        let options = config.options(vec![], config.sizes.clone());
        let outcome = match &config.redis_server {
            Some(binary) => measure_redis_server(binary, &options),
            None => measure_redis(&options),
        };
        match outcome {
            RedisOutcome::Measured(rows) => report.cells.extend(cells_of(rows, "size")),
            RedisOutcome::Skipped(reason) => {
                eprintln!("bench ddss: SKIPPED redis: {reason}");
                report.redis_skipped = Some(reason);
            }
            RedisOutcome::Failed(why) => {
                eprintln!("bench ddss: redis FAILED: {why}");
                report.redis_skipped = Some(format!("failed: {why}"));
                redis_failed = Some(why);
            }
        }
    } else {
        report.redis_skipped = Some("not requested".into());
    }
    // What was measured is written either way; a failed comparison then
    // fails the run rather than passing for a skip.
    print_and_plot(config, &report)?;
    if let Some(why) = redis_failed {
        bail!("the redis comparison failed: {why} (the DDSS results were written; --no-redis leaves redis out)");
    }
    Ok(report)
}

/// How a get of each model is served while nothing writes the key.
fn get_path(model: &Coherence) -> &'static str {
    match model {
        Coherence::Null | Coherence::Temporal { .. } => "local copy",
        Coherence::Delta { .. } | Coherence::Read => "version check",
        Coherence::Write => "fetch",
        Coherence::Strict => "lock+fetch",
    }
}

fn print_and_plot(config: &DdssBenchConfig, report: &DdssReport) -> Result<()> {
    let mut out = Report::new(&config.out_dir, "bench ddss", "the data sharing substrate (services paper Fig. 3a)");
    out.page()
        .paragraph(&format!("Home node: {}. Latencies are p50 and p99 over each cell's operations.", report.home));
    let systems: Vec<String> = config.backends.iter().map(|b| format!("ddss-{}", b.name())).collect();
    out.table(&model_table(config, report, &systems));
    // The models share one put path, and three share one guarantee: say so
    // beside the numbers rather than let their noise read as differences.
    out.text(&format!("note: {}\n", measure::MODEL_NOTE));
    let model_names: Vec<String> = config.models.iter().map(Coherence::to_string).collect();
    for grid in grid_tables(config, report, &systems, &model_names) {
        out.table(&grid);
    }
    let mut compared: Vec<(String, String)> = Vec::new(); // (system, model)
    for system in &systems {
        compared.push((system.clone(), Coherence::Write.to_string()));
    }
    let redis_measured = report.cells.iter().any(|c| c.system == "redis");
    if redis_measured {
        compared.push(("redis".into(), "-".into()));
    }
    out.table(&size_table(config, report, &compared));
    out.page().table(&paper_table(report, &systems));
    if let Some(reason) = &report.redis_skipped {
        out.text(&format!("redis: not measured: {reason}"));
    }

    out.json("ddss.json", report)?;
    let series_of = |filter: &dyn Fn(&Cell) -> bool, label: String| Series {
        label,
        points: report
            .cells
            .iter()
            .filter(|c| filter(c))
            .map(|c| (c.value_bytes as f64, c.latency.p50_ns as f64 / 1000.0))
            .collect(),
    };
    let mut grid_series = Vec::new();
    for system in &systems {
        for model in &model_names {
            grid_series.push(series_of(
                &|c: &Cell| &c.system == system && c.experiment == "grid" && &c.model == model,
                format!("{system} {model}"),
            ));
        }
    }
    let log_log = Axes { x_label: "value size (bytes)", y_label: "latency p50 (µs)", log_x: true, log_y: true };
    out.plot(&Plot::lines(
        "ddss-put-latency.svg",
        "Fig. 3a: DDSS put latency by coherence model",
        log_log,
        grid_series,
    ))?;
    let mut size_series = Vec::new();
    for (system, model) in &compared {
        for op in ["put", "get"] {
            size_series.push(series_of(
                &|c: &Cell| &c.system == system && c.experiment == "size" && c.op == op && &c.model == model,
                format!("{system} {op}"),
            ));
        }
    }
    out.plot(&Plot::lines(
        "ddss-size.svg",
        "Latency by value size: DDSS (write coherence) vs Redis (beyond Fig. 3a)",
        log_log,
        size_series,
    ))?;
    out.finish()?;
    Ok(())
}

/// A cell's p50 in µs ("-": not measured).
fn p50(cell: Option<&Cell>) -> String {
    cell.map(|c| us(c.latency.p50_ns)).unwrap_or_else(|| "-".into())
}

/// A cell's p99 in µs ("-": not measured).
fn p99(cell: Option<&Cell>) -> String {
    cell.map(|c| us(c.latency.p99_ns)).unwrap_or_else(|| "-".into())
}

/// Fig. 3a: 1-byte put and get by coherence model, each system's columns.
fn model_table(config: &DdssBenchConfig, report: &DdssReport, systems: &[String]) -> Table {
    let mut header = vec!["model".to_string(), "get path".to_string()];
    for system in systems {
        for column in ["put p50", "put p99", "get p50", "get p99"] {
            header.push(format!("{system} {column}"));
        }
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut by_model = Table::new(
        &format!("Fig. 3a: 1-byte put and get latency by coherence model (µs; {})", report.home),
        &header_refs,
    );
    for model in &config.models {
        let name = model.to_string();
        let mut row = vec![name.clone(), get_path(model).to_string()];
        for system in systems {
            let put = report.cell(system, "model", "put", &name, 1);
            let get = report.cell(system, "model", "get", &name, 1);
            row.extend([p50(put), p99(put), p50(get), p99(get)]);
        }
        by_model.row(row);
    }
    by_model
}

/// Put latency by value size, one table per system, a column per model.
fn grid_tables(
    config: &DdssBenchConfig,
    report: &DdssReport,
    systems: &[String],
    model_names: &[String],
) -> Vec<Table> {
    let mut tables = Vec::new();
    for system in systems {
        let mut header = vec!["bytes".to_string()];
        header.extend(model_names.iter().cloned());
        let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut grid = Table::new(
            &format!(
                "Fig. 3a: put latency by value size on {system}, per model (one put path: differences are noise; p50 µs; {})",
                report.home
            ),
            &header_refs,
        );
        for &bytes in &config.sizes {
            let mut row = vec![bytes.to_string()];
            row.extend(model_names.iter().map(|m| p50(report.cell(system, "grid", "put", m, bytes))));
            grid.row(row);
        }
        tables.push(grid);
    }

    tables
}

/// DDSS under write coherence beside Redis, p50 / p99 by value size.
fn size_table(config: &DdssBenchConfig, report: &DdssReport, compared: &[(String, String)]) -> Table {
    let mut header = vec!["bytes".to_string()];
    for (system, _) in compared {
        for op in ["put", "get"] {
            header.push(format!("{system} {op}"));
        }
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut by_size = Table::new(
        &format!(
            "Latency by value size, p50 / p99 µs: DDSS under write coherence vs Redis SET/GET on loopback ({})",
            report.home
        ),
        &header_refs,
    );
    for &bytes in &config.sizes {
        let mut row = vec![bytes.to_string()];
        for (system, model) in compared {
            for op in ["put", "get"] {
                let cell = report.cell(system, "size", op, model, bytes);
                row.push(format!("{} / {}", p50(cell), p99(cell)));
            }
        }
        by_size.row(row);
    }
    by_size
}

/// The paper's put latency beside ours (also printed, one line a system).
fn paper_table(report: &DdssReport, systems: &[String]) -> Table {
    let mut paper = Table::new("The paper beside ours", &["quantity", "the paper (2006 InfiniBand)", "ours"]);
    for system in systems {
        let worst = report
            .cells
            .iter()
            .filter(|c| &c.system == system && c.experiment == "model" && c.op == "put")
            .max_by_key(|c| c.latency.p50_ns);
        if let Some(worst) = worst {
            println!(
                "{system}: largest 1-byte put p50 over the models: {} µs ({}); the paper: about 55 µs on 2006 InfiniBand",
                us(worst.latency.p50_ns),
                worst.model
            );
            paper.row(vec![
                format!("largest 1-byte put p50 over the models, {system}"),
                "about 55 µs".to_string(),
                format!("{} µs ({})", us(worst.latency.p50_ns), worst.model),
            ]);
        }
    }
    paper
}
