//! `tierstack bench fabric`: the coherency paper's micro-benchmarks (its
//! Fig. 8, latency and bandwidth) on our backends, plus the same operations
//! with the owner under CPU load.
//!
//! The owner is a separate process pinned to CPU 0; this process is node 1,
//! its measuring thread pinned to CPU 1, so the two act as separate nodes.
//! With K busy threads in the owner, the `tcp` responder must compete for
//! CPU 0 while `shm` operations never need it.
//!
//! **Timing.** A single shm operation takes tens of nanoseconds, about what
//! a clock read costs, so timing each one alone would mostly measure the
//! clock. Operations are therefore timed in batches of N back to back, one
//! clock read between batches, N chosen so a batch lasts about
//! [`BATCH_TARGET_NS`] (N = 1 for operations that slow already); each sample
//! is a batch's time / N. So p50 and p99 are percentiles of per-batch means:
//! exact per operation when N = 1, smoothed tails when N > 1.
//!
//! tcp and ucx run with the cluster key, as deployed; with tcp measured,
//! `fabric_auth` adds the key's cost beside a keyless pair in the same run.

use crate::html::Report;
use crate::report::{us, Axes, Plot, Series, Table};
use crate::stats::{summarize, Summary};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_cluster::{open_fabric, pin_to_cpu, Backend, Topology};
use tierstack_deploy::process::{spawn_owner, write_topology, ChildNode, NodeLine};
use tierstack_fabric::{Channel, Fabric, Op, RemoteRegion};

/// The region the owner registers: large enough for the 1 MiB transfers.
const REGION_BYTES: u64 = 2 << 20;
const OWNER: NodeId = NodeId(0);
const READER: NodeId = NodeId(1);

/// What to measure and for how long.
pub struct FabricBenchConfig {
    /// The `tierstack` executable, to start owner processes.
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    pub backends: Vec<Backend>,
    /// Busy threads in the owner for the load runs.
    pub loads: Vec<usize>,
    /// Wall time spent on one measurement (after warm-up).
    pub budget: Duration,
    /// Transfer sizes of the latency/bandwidth curves.
    pub sizes: Vec<usize>,
}

impl FabricBenchConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        let sizes = (0..=9).map(|i| 4usize << (2 * i)).collect(); // 4 B … 1 MiB by 4x
        Self {
            exe,
            out_dir,
            backends: vec![Backend::Shm, Backend::Tcp],
            loads: vec![0, 16, 64, 200],
            budget: if quick { Duration::from_millis(150) } else { Duration::from_millis(600) },
            sizes,
        }
    }
}

/// `tierstack bench fabric`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct FabricArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/fabric")]
    pub out: PathBuf,
    /// Shorter measurements (for smoke runs).
    #[arg(long)]
    pub quick: bool,
    /// Backends to measure.
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    pub backends: Vec<Backend>,
    /// Busy threads in the owner, one run each.
    #[arg(long, value_delimiter = ',', default_value = "0,16,64,200")]
    pub loads: Vec<usize>,
}

impl FabricArgs {
    /// The configuration these flags describe.
    pub fn config(self, exe: PathBuf) -> FabricBenchConfig {
        let mut config = FabricBenchConfig::new(exe, self.out, self.quick);
        config.backends = self.backends;
        config.loads = self.loads;
        config
    }

    /// Runs the experiment; `exe` is the `tierstack` executable the owners are started from.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        run(&self.config(exe()?))?;
        Ok(())
    }
}

/// Results for one backend. A message's latency is a round trip (send and
/// acknowledgement); its bandwidth is measured by streaming bursts.
#[derive(Serialize, Default)]
pub struct BackendResults {
    /// Per named operation (8-byte read, 4 KiB read, …).
    pub latency: BTreeMap<String, Summary>,
    /// Per kind (read, write, message): (size, latency summary, MB/s).
    pub curves: BTreeMap<String, Vec<SizePoint>>,
    /// Per number of busy owner threads.
    pub load: Vec<LoadPoint>,
    /// Messages per way of receiving (shm: polling, sleeping, the default).
    pub messages: Vec<MessagePoint>,
}

/// Messages with the receivers waiting one way: round trips, one-way
/// throughput, and what an idle receiver costs.
#[derive(Serialize)]
pub struct MessagePoint {
    /// `polling`, `sleeping` or `default` (shm: how long a receiver polls
    /// before it sleeps, [`MessageMode::spin_us`]); `threads` (tcp).
    pub receiver: String,
    /// The receive spin the topology set (shm), in µs.
    pub spin_us: Option<u64>,
    /// A 1-byte message and its 1-byte acknowledgement.
    pub round_trip: Summary,
    /// 64-byte messages streamed one way (bursts of [`THROUGHPUT_BURST`],
    /// each ended by one acknowledged message), messages per second.
    pub one_way_64b_per_sec: f64,
    /// CPU time the owner process (the receiver) used while idle, ms per
    /// second of wall time, over [`MessageMode`]'s idle window right after
    /// its last message.
    pub idle_receiver_cpu_ms_per_sec: Option<f64>,
}

/// Messages streamed per acknowledgement in the one-way throughput.
pub const THROUGHPUT_BURST: usize = 4096;

/// One way for receivers to wait.
pub struct MessageMode {
    pub name: &'static str,
    /// shm: `shm_receive_spin_us` of the topology (`None`: the default).
    pub spin_us: Option<u64>,
}

impl MessageMode {
    /// The ways measured on `backend`. shm: receivers that poll for a second
    /// before sleeping (busy: every message of a benchmark finds its
    /// receiver polling), that sleep at once (every message wakes its
    /// receiver's thread with a futex), and the default spin.
    pub fn for_backend(backend: Backend) -> Vec<MessageMode> {
        match backend {
            Backend::Shm => vec![
                MessageMode { name: "polling", spin_us: Some(1_000_000) },
                MessageMode { name: "sleeping", spin_us: Some(0) },
                MessageMode { name: "default", spin_us: None },
            ],
            Backend::Tcp => vec![MessageMode { name: "threads", spin_us: None }],
            // UCX: active messages handled by the node's progress thread.
            Backend::Ucx => vec![MessageMode { name: "progress", spin_us: None }],
        }
    }
}

#[derive(Serialize)]
pub struct SizePoint {
    pub bytes: usize,
    pub latency: Summary,
    pub megabytes_per_sec: f64,
}

#[derive(Serialize)]
pub struct LoadPoint {
    pub busy_threads: usize,
    pub read_8b: Summary,
    pub fetch_add: Summary,
}

#[derive(Serialize)]
pub struct FabricReport {
    pub cpus: usize,
    pub backends: BTreeMap<String, BackendResults>,
    /// tcp with and without the cluster key (when tcp is measured).
    pub auth: Vec<crate::fabric_auth::AuthPoint>,
}

/// How long one timed batch should last: long enough that its clock read
/// (tens of ns) is noise, short enough for hundreds of samples per budget.
pub const BATCH_TARGET_NS: u64 = 20_000;
/// The most operations in one batch.
pub const BATCH_OPS_MAX: u64 = 4096;

/// Times `op` in batches until `budget` has passed (and at least
/// `MIN_SAMPLES` batches ran); see the module docs.
pub(crate) fn measure(budget: Duration, op: impl FnMut() -> Result<()>) -> Result<Summary> {
    let origin = tierstack_base::time::instant_now();
    let now_ns = || u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    measure_with(now_ns, u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX), op)
}

/// [`measure`] against any clock (nanoseconds since some origin).
fn measure_with(
    mut now_ns: impl FnMut() -> u64,
    budget_ns: u64,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Summary> {
    const WARMUP_OPS: u64 = 64;
    const MIN_SAMPLES: usize = 20;
    const MAX_SAMPLES: usize = 2_000_000;
    // Warm up in doubling batches; the last one estimates an operation's cost.
    let warmup_start = now_ns();
    let (mut warmed_ops, mut batch_ops) = (0u64, 1u64);
    let op_ns = loop {
        let t = now_ns();
        for _ in 0..batch_ops {
            op()?;
        }
        let end = now_ns();
        warmed_ops += batch_ops;
        if warmed_ops >= WARMUP_OPS || end.saturating_sub(warmup_start) >= budget_ns / 4 {
            break end.saturating_sub(t) / batch_ops;
        }
        batch_ops *= 2;
    };
    let batch_ops = (BATCH_TARGET_NS / op_ns.max(1)).clamp(1, BATCH_OPS_MAX);
    let mut samples = Vec::with_capacity(4096);
    let start = now_ns();
    let mut batch_start = start;
    // One clock read per batch: a batch's end is the next one's start.
    while (batch_start.saturating_sub(start) < budget_ns || samples.len() < MIN_SAMPLES) && samples.len() < MAX_SAMPLES
    {
        for _ in 0..batch_ops {
            op()?;
        }
        let end = now_ns();
        samples.push(end.saturating_sub(batch_start) / batch_ops);
        batch_start = end;
    }
    let wall_ns = batch_start.saturating_sub(start);
    let ops = samples.len() as u64 * batch_ops;
    let mut summary = summarize(samples, wall_ns);
    // Rates count operations, not batches.
    summary.ops_per_sec = if wall_ns == 0 { 0.0 } else { ops as f64 * 1e9 / wall_ns as f64 };
    Ok(summary)
}

pub(crate) struct Session {
    owner: ChildNode,
    pub(crate) fabric: Arc<dyn Fabric>,
    pub(crate) region: Arc<dyn RemoteRegion>,
}

/// A session as deployed: tcp and ucx with the cluster key.
fn start_session(
    config: &FabricBenchConfig,
    dir: &Path,
    backend: Backend,
    busy_threads: usize,
    mode: Option<&MessageMode>,
) -> Result<Session> {
    start_session_secured(config, dir, backend, busy_threads, mode, Security::Keyed)
}

/// How a session's connections are secured (tcp and ucx).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Security {
    /// No key (loopback only): the baseline the others are measured against.
    Plain,
    /// The cluster key: authenticated, every frame sealed (as deployed).
    Keyed,
    /// The key, inside TLS 1.3 (tcp).
    Tls,
}

/// A session with its connections secured as `security` says.
pub(crate) fn start_session_secured(
    config: &FabricBenchConfig,
    dir: &Path,
    backend: Backend,
    busy_threads: usize,
    mode: Option<&MessageMode>,
    security: Security,
) -> Result<Session> {
    let cpus = tierstack_cluster::online_cpus();
    let (owner_cpu, reader_cpu) = if cpus >= 2 { (Some(0), Some(1)) } else { (None, None) };
    let name = format!(
        "fabric-{}-{busy_threads}{}{}",
        backend.name(),
        mode.map(|m| format!("-{}", m.name)).unwrap_or_default(),
        match security {
            Security::Keyed => "",
            Security::Plain => "-plain",
            Security::Tls => "-tls",
        }
    );
    let nodes = [NodeLine { id: 0, role: "app", cpu: owner_cpu }, NodeLine { id: 1, role: "proxy", cpu: None }];
    let topology_path = write_topology(dir, &name, backend, 2000, &nodes)?;
    if security != Security::Keyed {
        let text = std::fs::read_to_string(&topology_path)?;
        let text: String = text
            .lines()
            .filter(|l| security != Security::Plain || !l.starts_with("key_file"))
            .map(|l| {
                if security == Security::Tls && l.starts_with("key_file") {
                    format!("{l}\ntls = true\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&topology_path, text)?;
    }
    if let Some(spin_us) = mode.and_then(|m| m.spin_us) {
        let text = std::fs::read_to_string(&topology_path)?;
        let text = text.replacen("[cluster]\n", &format!("[cluster]\nshm_receive_spin_us = {spin_us}\n"), 1);
        std::fs::write(&topology_path, text)?;
    }
    let owner = spawn_owner(&config.exe, &topology_path, OWNER.0, &[("bench", REGION_BYTES)], busy_threads)?;
    if let Some(cpu) = reader_cpu {
        pin_to_cpu(cpu)?;
    }
    let topology = Topology::load(&topology_path)?;
    let fabric = open_fabric(&topology, READER)?;
    let region = fabric.connect(OWNER, "bench")?;
    Ok(Session { owner, fabric, region })
}

fn latency_table(config: &FabricBenchConfig, s: &Session, results: &mut BackendResults) -> Result<()> {
    let r = s.region.as_ref();
    let budget = config.budget;
    let mut buf8 = [0u8; 8];
    let mut buf4k = vec![0u8; 4096];
    let data8 = [7u8; 8];
    let mut named = |name: &str, summary: Summary| {
        results.latency.insert(name.to_string(), summary);
    };
    named("read 8 B", measure(budget, || Ok(r.read(64, &mut buf8)?))?);
    named("read 4 KiB", measure(budget, || Ok(r.read(4096, &mut buf4k)?))?);
    named("write 8 B", measure(budget, || Ok(r.write(64, &data8)?))?);
    named("fetch_add", measure(budget, || r.fetch_add(0, 1).map(|_| ()).map_err(Into::into))?);
    let mut expected = r.read_u64(8)?;
    named(
        "compare_swap",
        measure(budget, || {
            expected = r.compare_swap(8, expected, expected + 1)? + 1;
            Ok(())
        })?,
    );
    named(
        "batch of 4 reads",
        measure(budget, || {
            let ops = (0..4).map(|i| Op::Read { offset: 128 + 8 * i, len: 8 }).collect();
            r.post(ops).wait()?;
            Ok(())
        })?,
    );
    let fabric = &s.fabric;
    named("message round trip", measure(budget, || message_round_trip(fabric.as_ref(), 1))?);
    Ok(())
}

pub(crate) fn message_round_trip(fabric: &dyn Fabric, bytes: usize) -> Result<()> {
    let mut payload = vec![0u8; bytes.max(1)];
    payload[0] = 1; // ask the owner for an acknowledgement
    fabric.send(OWNER, Channel::APP, &payload)?;
    let ack = fabric.inbox(Channel::APP).recv_timeout(Duration::from_secs(10))?;
    if ack.from != OWNER {
        bail!("unexpected message from {}", ack.from);
    }
    Ok(())
}

/// Streams `burst` messages of `bytes` then waits for one acknowledgement.
fn message_burst(fabric: &dyn Fabric, bytes: usize, burst: usize) -> Result<()> {
    let quiet = vec![0u8; bytes.max(1)];
    for _ in 1..burst {
        fabric.send(OWNER, Channel::APP, &quiet)?;
    }
    message_round_trip(fabric, bytes)
}

/// Round trips, one-way throughput and idle cost with the receivers of
/// `session` waiting as `mode` says.
fn message_point(config: &FabricBenchConfig, session: &Session, mode: &MessageMode) -> Result<MessagePoint> {
    let fabric = session.fabric.as_ref();
    let round_trip = measure(config.budget, || message_round_trip(fabric, 1))?;
    let bursts = measure(config.budget, || message_burst(fabric, 64, THROUGHPUT_BURST))?;
    // A last message, then nothing: the owner's receiver polls (as long as
    // its spin says), then sleeps.
    message_round_trip(fabric, 1)?;
    let window =
        if config.budget < Duration::from_millis(500) { Duration::from_secs(2) } else { Duration::from_secs(3) };
    let before = process_cpu_ms(session.owner.pid());
    std::thread::sleep(window);
    let after = process_cpu_ms(session.owner.pid());
    let idle_receiver_cpu_ms_per_sec = before.zip(after).map(|(before, after)| (after - before) / window.as_secs_f64());
    Ok(MessagePoint {
        receiver: mode.name.to_string(),
        spin_us: mode.spin_us,
        round_trip,
        one_way_64b_per_sec: bursts.ops_per_sec * THROUGHPUT_BURST as f64,
        idle_receiver_cpu_ms_per_sec,
    })
}

/// User and system CPU time `pid` has used, in ms (`None` off Linux).
fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is the 3rd
    // field, utime the 14th and stime the 15th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_sec > 0).then(|| ticks * 1000.0 / per_sec as f64)
}

fn curves(config: &FabricBenchConfig, s: &Session, results: &mut BackendResults) -> Result<()> {
    let r = s.region.as_ref();
    let budget = config.budget / 2;
    for &bytes in &config.sizes {
        let mut buf = vec![0u8; bytes];
        let read = measure(budget, || Ok(r.read(0, &mut buf)?))?;
        let write = measure(budget, || Ok(r.write(0, &buf)?))?;
        // Messages stream in bursts so the bandwidth is not one round trip per message.
        let burst = (1 << 20) / bytes.max(64);
        let burst = burst.clamp(1, 256);
        let stream = measure(budget, || message_burst(s.fabric.as_ref(), bytes, burst))?;
        let round_trip = measure(budget, || message_round_trip(s.fabric.as_ref(), bytes))?;
        let rate = |summary: &Summary, per_op_bytes: usize| summary.ops_per_sec * per_op_bytes as f64 / 1e6;
        let points = [
            ("read", rate(&read, bytes), read),
            ("write", rate(&write, bytes), write),
            ("message", rate(&stream, bytes * burst), round_trip),
        ];
        for (kind, megabytes_per_sec, latency) in points {
            results.curves.entry(kind.to_string()).or_default().push(SizePoint { bytes, latency, megabytes_per_sec });
        }
    }
    Ok(())
}

/// Runs the whole experiment, prints the tables, writes JSON and plots.
pub fn run(config: &FabricBenchConfig) -> Result<FabricReport> {
    std::fs::create_dir_all(&config.out_dir).with_context(|| format!("creating {}", config.out_dir.display()))?;
    let scratch = tempfile::Builder::new().prefix("tierstack-bench-").tempdir()?;
    let mut report =
        FabricReport { cpus: tierstack_cluster::online_cpus(), backends: BTreeMap::new(), auth: Vec::new() };
    for &backend in &config.backends {
        let mut results = BackendResults::default();
        for &busy_threads in &config.loads {
            eprintln!("bench fabric: {} with {busy_threads} busy owner threads", backend.name());
            let session = start_session(config, scratch.path(), backend, busy_threads, None)?;
            if busy_threads == 0 {
                latency_table(config, &session, &mut results)?;
                curves(config, &session, &mut results)?;
            }
            let r = session.region.as_ref();
            let mut buf8 = [0u8; 8];
            let read_8b = measure(config.budget, || Ok(r.read(64, &mut buf8)?))?;
            let fetch_add = measure(config.budget, || r.fetch_add(0, 1).map(|_| ()).map_err(Into::into))?;
            results.load.push(LoadPoint { busy_threads, read_8b, fetch_add });
        }
        for mode in MessageMode::for_backend(backend) {
            eprintln!("bench fabric: {} messages, {} receivers", backend.name(), mode.name);
            let session = start_session(config, scratch.path(), backend, 0, Some(&mode))?;
            results.messages.push(message_point(config, &session, &mode)?);
        }
        report.backends.insert(backend.name().to_string(), results);
    }
    if config.backends.contains(&Backend::Tcp) {
        report.auth = crate::fabric_auth::measure_auth_cost(config, scratch.path())?;
    }
    print_and_plot(config, &report)?;
    Ok(report)
}

fn print_and_plot(config: &FabricBenchConfig, report: &FabricReport) -> Result<()> {
    let mut out =
        Report::new(&config.out_dir, "bench fabric", "one-sided and two-sided operations (coherency paper Fig. 8)");
    out.page().paragraph(&format!(
        "Backends: {}. Owner process pinned to one CPU, the measuring process to another; busy owner threads: {:?}.",
        config.backends.iter().map(|b| b.name()).collect::<Vec<_>>().join(", "),
        config.loads
    ));
    out.table(&operations_table(report));
    let (lat_by_size, bandwidth) = size_tables(config, report);
    out.table(&lat_by_size);
    out.table(&bandwidth);
    out.table(&load_table(report));
    if !report.auth.is_empty() {
        out.table(&crate::fabric_auth::auth_table(&report.auth));
        out.plot(&crate::fabric_auth::auth_plot(&report.auth))?;
    }
    println!("{}", messages_table(report).render());

    out.json("fabric.json", report)?;
    let mut lat_series = Vec::new();
    let mut bw_series = Vec::new();
    for (backend, results) in &report.backends {
        for (kind, points) in &results.curves {
            lat_series.push(Series {
                label: format!("{backend} {kind}"),
                points: points.iter().map(|p| (p.bytes as f64, p.latency.p50_ns as f64 / 1000.0)).collect(),
            });
            bw_series.push(Series {
                label: format!("{backend} {kind}"),
                points: points.iter().map(|p| (p.bytes as f64, p.megabytes_per_sec)).collect(),
            });
        }
    }
    let log_log = |y: &'static str| Axes { x_label: "size (bytes)", y_label: y, log_x: true, log_y: true };
    out.plot(&Plot::lines(
        "fabric-latency.svg",
        "Fig. 8a: latency by size (p50)",
        log_log("latency (µs)"),
        lat_series,
    ))?;
    out.plot(&Plot::lines(
        "fabric-bandwidth.svg",
        "Fig. 8b: bandwidth by size",
        log_log("bandwidth (MB/s)"),
        bw_series,
    ))?;
    let load_series: Vec<Series> = report
        .backends
        .iter()
        .flat_map(|(backend, results)| {
            [
                Series {
                    label: format!("{backend} read 8 B"),
                    points: results
                        .load
                        .iter()
                        .map(|p| (p.busy_threads as f64, p.read_8b.p50_ns as f64 / 1000.0))
                        .collect(),
                },
                Series {
                    label: format!("{backend} fetch_add"),
                    points: results
                        .load
                        .iter()
                        .map(|p| (p.busy_threads as f64, p.fetch_add.p50_ns as f64 / 1000.0))
                        .collect(),
                },
            ]
        })
        .collect();
    out.plot(&Plot::lines(
        "fabric-load.svg",
        "p50 latency vs busy owner threads (beyond Fig. 8: the owner under load)",
        Axes {
            x_label: "busy threads in the owner (threads)", y_label: "latency p50 (µs)", log_x: false, log_y: true
        },
        load_series,
    ))?;
    out.finish()?;
    Ok(())
}

/// Fig. 8a: one operation's latency and rate, by backend.
fn operations_table(report: &FabricReport) -> Table {
    let mut latency =
        Table::new("Fig. 8a: latency of one operation (µs)", &["operation", "backend", "p50", "p99", "ops/s"]);
    for (backend, results) in &report.backends {
        for (op, s) in &results.latency {
            latency.row(vec![op.clone(), backend.clone(), us(s.p50_ns), us(s.p99_ns), format!("{:.0}", s.ops_per_sec)]);
        }
    }
    latency
}

/// Fig. 8a and 8b: p50 latency and bandwidth by size, a column per backend
/// and kind of transfer.
fn size_tables(config: &FabricBenchConfig, report: &FabricReport) -> (Table, Table) {
    let mut header = vec!["bytes".to_string()];
    for backend in report.backends.keys() {
        for kind in ["read", "write", "message"] {
            header.push(format!("{backend} {kind}"));
        }
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut lat_by_size = Table::new("Fig. 8a: p50 latency by size (µs)", &header_refs);
    let mut bandwidth = Table::new("Fig. 8b: bandwidth by size (MB/s)", &header_refs);
    for (i, bytes) in config.sizes.iter().enumerate() {
        let mut lat_row = vec![bytes.to_string()];
        let mut bw_row = vec![bytes.to_string()];
        for results in report.backends.values() {
            for kind in ["read", "write", "message"] {
                let point = results.curves.get(kind).and_then(|c| c.get(i));
                lat_row.push(point.map(|p| us(p.latency.p50_ns)).unwrap_or_default());
                bw_row.push(point.map(|p| format!("{:.1}", p.megabytes_per_sec)).unwrap_or_default());
            }
        }
        lat_by_size.row(lat_row);
        bandwidth.row(bw_row);
    }
    (lat_by_size, bandwidth)
}

/// The owner under load: latency against busy owner threads.
fn load_table(report: &FabricReport) -> Table {
    let mut load = Table::new(
        "Owner under load: latency vs busy owner threads (µs)",
        &["busy threads", "backend", "read p50", "read p99", "fetch_add p50", "fetch_add p99", "read p50 / unloaded"],
    );
    for (backend, results) in &report.backends {
        let base = results.load.first().map(|p| p.read_8b.p50_ns.max(1)).unwrap_or(1);
        for p in &results.load {
            load.row(vec![
                p.busy_threads.to_string(),
                backend.clone(),
                us(p.read_8b.p50_ns),
                us(p.read_8b.p99_ns),
                us(p.fetch_add.p50_ns),
                us(p.fetch_add.p99_ns),
                format!("{:.2}", p.read_8b.p50_ns as f64 / base as f64),
            ]);
        }
    }
    load
}

/// Messages by how receivers wait (printed, not on the page).
fn messages_table(report: &FabricReport) -> Table {
    let mut messages = Table::new(
        "Messages by how receivers wait: round trip (µs), one-way 64 B messages/s, idle receiver CPU (ms/s)",
        &["backend", "receivers", "spin µs", "round trip p50", "p99", "one-way 64 B msg/s", "idle CPU ms/s"],
    );
    for (backend, results) in &report.backends {
        for p in &results.messages {
            messages.row(vec![
                backend.clone(),
                p.receiver.clone(),
                p.spin_us.map(|s| s.to_string()).unwrap_or_else(|| "default".into()),
                us(p.round_trip.p50_ns),
                us(p.round_trip.p99_ns),
                format!("{:.0}", p.one_way_64b_per_sec),
                p.idle_receiver_cpu_ms_per_sec.map(|c| format!("{c:.1}")).unwrap_or_default(),
            ]);
        }
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A fake clock that only moves when the fake operation runs (100 ns
    /// each), counting its reads.
    struct Fake {
        now_ns: Cell<u64>,
        reads: Cell<u64>,
        ops: Cell<u64>,
    }

    const OP_NS: u64 = 100;

    fn run(budget_ns: u64) -> (Summary, Fake) {
        let fake = Fake { now_ns: Cell::new(0), reads: Cell::new(0), ops: Cell::new(0) };
        let clock = || {
            fake.reads.set(fake.reads.get() + 1);
            fake.now_ns.get()
        };
        let op = || {
            fake.ops.set(fake.ops.get() + 1);
            fake.now_ns.set(fake.now_ns.get() + OP_NS);
            Ok(())
        };
        let summary = measure_with(clock, budget_ns, op).unwrap();
        (summary, fake)
    }

    #[test]
    fn single_operations_are_timed_in_batches_not_one_clock_pair_each() {
        let (summary, fake) = run(10_000_000);
        let (reads, ops) = (fake.reads.get(), fake.ops.get());
        assert!(ops >= 10_000_000 / OP_NS, "the whole budget was measured: {ops} ops");
        // Batches of BATCH_TARGET_NS / OP_NS = 200 ops: about one read per 200 ops.
        assert!(reads * 100 <= ops, "{reads} clock reads for {ops} operations");
        assert_eq!((summary.p50_ns, summary.p99_ns), (OP_NS, OP_NS), "per-op time is batch time / N: {summary:?}");
        assert_eq!(summary.mean_ns, OP_NS as f64);
        assert_eq!(summary.ops_per_sec, 1e9 / OP_NS as f64, "rates count operations");
    }

    #[test]
    fn slow_operations_are_timed_one_by_one_and_a_tiny_budget_still_gives_samples() {
        // An operation slower than a batch's target runs alone in its batch.
        let fake = Cell::new(0u64);
        let summary = measure_with(
            || fake.get(),
            1,
            || {
                fake.set(fake.get() + 3 * BATCH_TARGET_NS);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(summary.count, 20, "at least MIN_SAMPLES batches");
        assert_eq!(summary.p50_ns, 3 * BATCH_TARGET_NS);
        assert_eq!(summary.ops_per_sec, 1e9 / (3 * BATCH_TARGET_NS) as f64);
    }
}
