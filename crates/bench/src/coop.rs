//! `tierstack bench coop`: the cooperative caching seed's Fig. 5/6
//! (throughput per scheme and trace, on 2 and 8 proxies with 2 web servers)
//! and Table 2 (messages per primitive), on `tierstack sim` with the
//! schemes' own decision code (`tierstack_coop`).
//!
//! Every configuration is one simulation (`tierstack_sim::coop`): the
//! proxies run the scheme's model; a miss reads the document's web server's
//! disk, whose cost is the calibration knob (seed-notes a.7 #11: calibrate
//! so that AC is about half the cooperative schemes on the 8k-trace with 2
//! proxies). Costs are the seeds' (`costs/seeds.toml`: 200 µs of proxy CPU
//! per request, derived from the seed's 10,000 TPS), with InfiniBand
//! send/receive for messages, RDMA Read for one-sided reads and IPoIB for the
//! client network (coh §5.1: the coop testbed's HCAs). Working sets are
//! scaled by `scale` with the per-node cache, so Table 1's ratios hold.
//! The caches are warmed up first (`warm_up_per_file` requests per document
//! through the model, with no time passing), so throughput and hit rates are
//! the steady state's, as the seed reports them.
//!
//! Table 2 is measured by replaying one request stream through the model
//! alone (every message the schemes send, charged by the seed-notes a.3
//! rule), per scheme, over each trace, and printed beside the paper's cell.

use crate::html::Report;
use crate::report::{Axes, BarGroup, Plot, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use tierstack_coop::{paper_table_2, Model, ModelConfig, Primitive, Scheme, Tally};
use tierstack_sim::coop::{Coop, CoopSim};
use tierstack_sim::{run, Budget, Costs, Load, SimConfig, TransportChoice};
use tierstack_workload::{CoopTrace, TargetChoice, TraceSpec};

/// What to run.
#[derive(Clone, Debug)]
pub struct CoopBenchConfig {
    pub out: PathBuf,
    /// Working set and per-node cache scale (1.0: the seed's 10,000 files, 64 MiB).
    pub scale: f64,
    pub requests_per_file: u64,
    /// Warm-up requests per document, decided before the timed run.
    pub warm_up_per_file: u64,
    pub clients_per_proxy: usize,
    /// The web servers' disk: the miss cost.
    pub disk_seek_us: f64,
    pub disk_mb_per_s: f64,
    /// Replica search cost per page table searched.
    pub lookup_ns: u64,
    /// Replica search cost per lookup (see `CoopSim::lookup_fixed_ns`).
    pub lookup_fixed_ns: u64,
    /// Announce size; 0: announces not charged (see `CoopSim::announce_bytes`).
    pub announce_bytes: u64,
    /// Proxy CPU per miss (see `CoopSim::miss_cpu_ns`).
    pub miss_cpu_ns: u64,
    pub proxies: Vec<usize>,
    /// HYBCC thresholds to sweep on the 8k and 16k traces.
    pub hybcc_thresholds: Vec<u64>,
    pub seed: u64,
}

impl CoopBenchConfig {
    pub fn new(out: PathBuf, quick: bool) -> Self {
        Self {
            out,
            scale: if quick { 0.05 } else { 0.2 },
            requests_per_file: if quick { 5 } else { 10 },
            warm_up_per_file: 10,
            clients_per_proxy: 16,
            disk_seek_us: DISK_SEEK_US,
            disk_mb_per_s: 40.0,
            lookup_ns: tierstack_sim::coop::LOOKUP_NS_DEFAULT,
            lookup_fixed_ns: 0,
            announce_bytes: 0,
            miss_cpu_ns: MISS_CPU_NS,
            proxies: vec![2, 8],
            hybcc_thresholds: vec![4 << 10, 8 << 10, 16 << 10, 32 << 10],
            seed: 1,
        }
    }
}

/// `tierstack bench coop`'s flags: the simulator's knobs, or with `--http`
/// the real processes' ([`crate::coop_http::CoopHttpConfig`]). Unset
/// options keep the `--quick`-dependent defaults of the configs.
#[derive(clap::Args, Clone, Debug)]
pub struct CoopArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/coop")]
    pub out: PathBuf,
    /// Scale 0.05, 10 requests per file.
    #[arg(long)]
    pub quick: bool,
    /// Working set and cache scale (1.0 = the seed's 10,000 files and 64 MiB per node).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Requests per document of the trace.
    #[arg(long)]
    pub requests_per_file: Option<u64>,
    /// The web servers' disk seek (the miss cost), microseconds.
    #[arg(long)]
    pub disk_seek_us: Option<f64>,
    /// Replica search cost per page table, nanoseconds.
    #[arg(long)]
    pub lookup_ns: Option<u64>,
    /// Proxy CPU per miss, microseconds (the calibration knob).
    #[arg(long)]
    pub miss_cpu_us: Option<u64>,
    /// Proxy counts to run (default 2,8; with --http: 2,4, --quick 2; with --figure 7: 2,4,8, --quick 2).
    #[arg(long, value_delimiter = ',')]
    pub proxies: Option<Vec<usize>>,
    /// Real processes instead: `tierstack origin` web servers, `proxy --coop` proxies and
    /// `coop-node` passive nodes under `tierstack load`'s closed loop, the simulator beside.
    #[arg(long)]
    pub http: bool,
    /// --http: the traces (default 8k,32k with --quick, else all four).
    #[arg(long, value_delimiter = ',', requires = "http")]
    pub traces: Option<Vec<String>>,
    /// --http: fabric backend (shm or tcp).
    #[arg(long, requires = "http")]
    pub backend: Option<tierstack_cluster::Backend>,
    /// --http: measured seconds per run (after a warm-up).
    #[arg(long, requires = "http")]
    pub duration_s: Option<f64>,
    /// --http: runs of each configuration (spreads are over them).
    #[arg(long, requires = "http")]
    pub repeats: Option<usize>,
    /// Only this figure, measured on real processes: 7 (lookup cost of each
    /// kind: local hit, remote hit, home read; shm and tcp).
    #[arg(long, value_parser = clap::value_parser!(u32).range(7..=7), conflicts_with = "http")]
    pub figure: Option<u32>,
}

impl CoopArgs {
    /// The simulator's configuration (without `--http`).
    pub fn config(&self) -> CoopBenchConfig {
        let mut config = CoopBenchConfig::new(self.out.clone(), self.quick);
        config.scale = self.scale.unwrap_or(config.scale);
        config.requests_per_file = self.requests_per_file.unwrap_or(config.requests_per_file);
        config.disk_seek_us = self.disk_seek_us.unwrap_or(config.disk_seek_us);
        config.lookup_ns = self.lookup_ns.unwrap_or(config.lookup_ns);
        config.miss_cpu_ns = self.miss_cpu_us.map_or(config.miss_cpu_ns, |us| us * 1000);
        config.proxies = self.proxies.clone().unwrap_or(config.proxies);
        config
    }

    /// The real processes' configuration (`--http`).
    pub fn http_config(&self, exe: PathBuf) -> crate::coop_http::CoopHttpConfig {
        let mut config = crate::coop_http::CoopHttpConfig::new(exe, self.out.clone(), self.quick);
        config.scale = self.scale.unwrap_or(config.scale);
        config.traces = self.traces.clone().unwrap_or(config.traces);
        config.backend = self.backend.unwrap_or(config.backend);
        config.proxies = self.proxies.clone().unwrap_or(config.proxies);
        config.repeats = self.repeats.unwrap_or(config.repeats).max(1);
        config.duration_ms = self.duration_s.map_or(config.duration_ms, |s| (s * 1000.0) as u64);
        config.disk_seek_us = self.disk_seek_us.map_or(config.disk_seek_us, |us| us as u64);
        config
    }

    /// Runs the experiment `--http` chose; `exe` is the `tierstack`
    /// executable the real processes are started from.
    pub fn run(&self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> anyhow::Result<()> {
        if self.figure == Some(7) {
            let mut config = crate::coop_fig7::Fig7Config::new(exe()?, self.out.clone(), self.quick);
            if let Some(proxies) = &self.proxies {
                config.proxies = proxies.clone();
            }
            crate::coop_fig7::run_fig7(&config)?;
        } else if self.http {
            crate::coop_http::run_http(&self.http_config(exe()?))?;
        } else {
            run_bench(&self.config())?;
        }
        Ok(())
    }
}

/// The calibrated web-server disk seek (see the module docs and
/// docs/results.md): AC ≈ ½ of the cooperative schemes at 8k / 2 proxies.
pub const DISK_SEEK_US: f64 = 100.0;
/// The calibrated proxy CPU per miss (see the module docs).
pub const MISS_CPU_NS: u64 = 1_000_000;
/// Makes the warm-up's request stream differ from the run's.
const WARM_UP_SALT: u64 = 0x5741_524d;

/// Web servers in every configuration (coop §4: "two web-servers").
pub const WEB_SERVERS: usize = 2;

/// The schemes, in the figure's order, plus the groupcache baseline.
pub const SCHEMES: [&str; 6] = ["ac", "bcc", "ccwr", "mtacc", "hybcc", "groupcache"];

/// One simulated configuration.
#[derive(Clone, Debug, Serialize)]
pub struct CoopRow {
    pub proxies: usize,
    pub trace: String,
    pub scheme: String,
    pub throughput_per_s: f64,
    pub vs_ac: f64,
    pub vs_bcc: f64,
    pub local_hit_pct: f64,
    pub remote_hit_pct: f64,
    pub miss_pct: f64,
    pub distinct_cached: u64,
    /// What the seed reports for this cell, where it does.
    pub paper: String,
}

/// Table 2, measured.
#[derive(Clone, Debug, Serialize)]
pub struct Table2Row {
    pub scheme: String,
    pub primitive: String,
    pub paper: Option<(u32, u32)>,
    pub max: (u32, u32),
    pub mean: (f64, f64),
    pub calls: u64,
}

/// HYBCC's size threshold, swept (seed-notes a.7 #1).
#[derive(Clone, Debug, Serialize)]
pub struct SweepRow {
    pub proxies: usize,
    pub trace: String,
    pub small_max_bytes: u64,
    pub throughput_per_s: f64,
}

/// The fabric service itself (in-process nodes), per backend and scheme.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceRow {
    pub backend: String,
    pub scheme: String,
    pub requests: u64,
    pub local_hit_pct: f64,
    pub remote_hit_pct: f64,
    pub miss_pct: f64,
    /// Table 2's maxima counted by the service: (control, data).
    pub fetch_max: (u32, u32),
    pub store_max: (u32, u32),
    pub remote_hit_p50_us: f64,
    pub remote_hit_p99_us: f64,
    pub store_p50_us: f64,
    /// Bodies served that did not match the document (must be 0).
    pub wrong_bodies: u64,
    pub load_average: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct CoopReport {
    pub rows: Vec<CoopRow>,
    pub service: Vec<ServiceRow>,
    pub sweep: Vec<SweepRow>,
    pub table2: Vec<Table2Row>,
    pub scale: f64,
    pub disk_seek_us: f64,
    pub miss_cpu_ns: u64,
    pub lookup_ns: u64,
}

pub(crate) fn paper_note(proxies: usize, trace: &str, scheme: &str) -> String {
    match (proxies, trace, scheme) {
        (2, "8k", "ac") => "just above 5000 TPS".into(),
        (2, "8k", "bcc" | "ccwr" | "mtacc" | "hybcc") => "about 10000 TPS (about 2x AC)".into(),
        (8, "64k", "mtacc" | "hybcc") => "about 9500 TPS, +20.5% vs BCC".into(),
        (_, "8k", "ccwr") => "about -5% vs BCC".into(),
        (_, "16k" | "32k" | "64k", "ccwr") => "up to +32% vs BCC, growing with size".into(),
        (8, "8k", "mtacc") => "below BCC and CCWR".into(),
        (_, _, "hybcc") => "matches the best; up to +35% vs BCC".into(),
        _ => String::new(),
    }
}

pub(crate) fn costs() -> Result<Costs> {
    let mut costs = Costs::resolve("seeds")?;
    costs = costs.with_choice(TransportChoice {
        messages: "ib-send-receive".into(),
        remote_read: "ib-rdma-read".into(),
        remote_write: "ib-rdma-write".into(),
    })?;
    // coh §5.1 (the coop testbed's HCAs): IPoIB, 169 MB/s, 30 µs one way.
    costs.client_network.bandwidth_bytes_per_s = 169_000_000;
    costs.client_network.latency_ns = 30_000;
    Ok(costs)
}

/// Runs every configuration; prints and writes the report.
pub fn run_bench(config: &CoopBenchConfig) -> Result<CoopReport> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let costs = costs()?;
    let disk = tierstack_sim::DiskModel::new(
        (config.disk_seek_us * 1e3).round() as u64,
        (config.disk_mb_per_s * 1e6).round() as u64,
    )?;
    let mut rows = Vec::new();
    for &proxies in &config.proxies {
        for coop in CoopTrace::ALL {
            let spec = TraceSpec::parse(&format!("coop:{}@{}", coop.name(), config.scale), 0.0, 0)?;
            let trace = spec.build(config.seed)?;
            let mut group = Vec::new();
            for name in SCHEMES {
                let scheme: Scheme = name.parse()?;
                let report = simulate(config, &costs, disk, &trace, scheme, proxies)?;
                let c = |k: &str| report.policy_counters.get(k).copied().unwrap_or(0) as f64;
                let total = (c("coop_local_hits") + c("coop_remote_hits") + c("coop_misses")).max(1.0);
                group.push(CoopRow {
                    proxies,
                    trace: coop.name().into(),
                    scheme: name.into(),
                    throughput_per_s: report.throughput_per_s,
                    vs_ac: 0.0,
                    vs_bcc: 0.0,
                    local_hit_pct: 100.0 * c("coop_local_hits") / total,
                    remote_hit_pct: 100.0 * c("coop_remote_hits") / total,
                    miss_pct: 100.0 * c("coop_misses") / total,
                    distinct_cached: c("coop_distinct_entities") as u64,
                    paper: paper_note(proxies, coop.name(), name),
                });
            }
            let base = |s: &str| group.iter().find(|r| r.scheme == s).map_or(1.0, |r| r.throughput_per_s.max(1e-9));
            let (ac, bcc) = (base("ac"), base("bcc"));
            for r in &mut group {
                r.vs_ac = r.throughput_per_s / ac;
                r.vs_bcc = r.throughput_per_s / bcc;
            }
            rows.extend(group);
        }
    }
    let mut sweep = Vec::new();
    for &proxies in &config.proxies {
        for coop in [CoopTrace::K8, CoopTrace::K16] {
            let trace =
                TraceSpec::parse(&format!("coop:{}@{}", coop.name(), config.scale), 0.0, 0)?.build(config.seed)?;
            for &small_max_bytes in &config.hybcc_thresholds {
                let report = simulate(config, &costs, disk, &trace, Scheme::Hybcc { small_max_bytes }, proxies)?;
                sweep.push(SweepRow {
                    proxies,
                    trace: coop.name().into(),
                    small_max_bytes,
                    throughput_per_s: report.throughput_per_s,
                });
            }
        }
    }
    let table2 = measure_table_2(config)?;
    let service = measure_service(config)?;
    let report = CoopReport {
        rows,
        service,
        sweep,
        table2,
        scale: config.scale,
        disk_seek_us: config.disk_seek_us,
        miss_cpu_ns: config.miss_cpu_ns,
        lookup_ns: config.lookup_ns,
    };
    let mut page = Report::new(&config.out, "bench coop", "cooperative caching (coop seed Fig. 5/6 and Table 2)");
    page.page().paragraph(
        "Simulated with tierstack sim and the schemes' own decision code (tierstack_coop); the seed's values \
         beside ours where it gives them. See docs/results.md for the calibration and each shape checked.",
    );
    print_report(&report, &mut page);
    page.json("coop.json", &report)?;
    for &proxies in &config.proxies {
        let categories: Vec<String> = CoopTrace::ALL.iter().map(|t| format!("{}-trace", t.name())).collect();
        let groups: Vec<BarGroup> = SCHEMES
            .iter()
            .map(|s| BarGroup {
                label: s.to_uppercase(),
                values: report
                    .rows
                    .iter()
                    .filter(|r| r.proxies == proxies && r.scheme == *s)
                    .map(|r| r.throughput_per_s.round())
                    .collect(),
            })
            .collect();
        let axes = Axes { x_label: "trace", y_label: "throughput (requests/s, simulated)", log_x: false, log_y: false };
        let title = format!("Data-center throughput, {proxies} proxies + {WEB_SERVERS} web servers (coop Fig. 5)");
        page.plot(&Plot::bars(&format!("fig5-{proxies}p.svg"), &title, axes, (categories, groups)))?;
    }
    page.finish()?;
    Ok(report)
}

/// One simulation: `scheme` on `proxies` proxies and the web servers,
/// warmed up, then `requests_per_file` requests per document.
pub(crate) fn simulate(
    config: &CoopBenchConfig,
    costs: &Costs,
    disk: tierstack_sim::DiskModel,
    trace: &tierstack_workload::Trace,
    scheme: Scheme,
    proxies: usize,
) -> Result<tierstack_sim::SimReport> {
    let cache_bytes = trace.cache_bytes_per_node().context("coop traces name their cache")?;
    let files = trace.documents().len() as u64;
    let sim = CoopSim {
        scheme,
        proxies,
        backends: WEB_SERVERS,
        cache_bytes,
        lookup_ns: config.lookup_ns,
        lookup_fixed_ns: config.lookup_fixed_ns,
        announce_bytes: config.announce_bytes,
        miss_cpu_ns: config.miss_cpu_ns,
    };
    let engine = SimConfig {
        nodes: proxies + WEB_SERVERS,
        client_nodes: Some(proxies),
        load: Load::Closed {
            clients: proxies * config.clients_per_proxy,
            budget: Budget::Total(files * config.requests_per_file),
        },
        target_choice: TargetChoice::Random,
        new_connection_per_request: false,
        cache_bytes: 0,
        cache_max_object_bytes: None,
        disk,
        costs: costs.clone(),
        seed: config.seed,
    };
    let mut policy = Coop::new(sim)?;
    policy.warm_up(trace, config.seed ^ WARM_UP_SALT, (files * config.warm_up_per_file) as usize);
    Ok(run(&engine, trace, policy)?)
}

/// Table 2: one stream per trace through the model, per scheme, on 2
/// proxies + 2 passive nodes at the bench's scale.
fn measure_table_2(config: &CoopBenchConfig) -> Result<Vec<Table2Row>> {
    let mut out = Vec::new();
    for name in ["bcc", "ccwr", "mtacc", "hybcc"] {
        let scheme: Scheme = name.parse()?;
        let mut tally = Tally::default();
        for coop in CoopTrace::ALL {
            let trace =
                TraceSpec::parse(&format!("coop:{}@{}", coop.name(), config.scale), 0.0, 0)?.build(config.seed)?;
            let cache = trace.cache_bytes_per_node().context("coop traces name their cache")?;
            let pages = u32::try_from(cache / tierstack_coop::PAGE_BYTES)?;
            let mut model = Model::new(ModelConfig { scheme, active: 2, passive: 2, pages_per_node: pages })?;
            let docs = trace.documents();
            let n = docs.len() as u64 * config.requests_per_file;
            for (i, doc) in trace.stream(config.seed, 0, 1).take(n as usize).enumerate() {
                let node = i % 2;
                model.request(node, doc as u64, docs[doc].size_bytes)?;
                if i % 50 == 0 {
                    model.validate(node, doc as u64)?;
                }
                if i % 500 == 0 {
                    model.invalidate(node, doc as u64)?;
                }
            }
            tally.merge(model.tally());
        }
        let paper = paper_table_2(name);
        for (i, p) in Primitive::ALL.into_iter().enumerate() {
            let t = tally.of(p);
            out.push(Table2Row {
                scheme: name.into(),
                primitive: p.name().into(),
                paper: paper.map(|cells| (cells[i].control, cells[i].data)),
                max: (t.control_max, t.data_max),
                mean: t.mean(),
                calls: t.calls,
            });
        }
    }
    Ok(out)
}

/// The trace of the service runs: small enough for in-process nodes.
pub const SERVICE_TRACE: &str = "coop:16k@0.02";
/// Requests per service run.
pub const SERVICE_REQUESTS: usize = 3_000;

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs the fabric service (`tierstack_coop::service`) in-process on shm
/// and tcp: 2 proxies and 2 passive nodes, one request at a time alternating
/// between the proxies, every body checked; counts Table 2 on the service's
/// own counters and times remote hits and stores.
fn measure_service(config: &CoopBenchConfig) -> Result<Vec<ServiceRow>> {
    use std::sync::Arc;

    use tierstack_cluster::{local_cluster, Backend};
    use tierstack_coop::service::{CoopConfig, CoopNode, Lookup};
    use tierstack_fabric::NodeId;
    let trace = TraceSpec::parse(SERVICE_TRACE, 0.0, 0)?.build(config.seed)?;
    let cache = trace.cache_bytes_per_node().context("coop traces name their cache")?;
    let docs = trace.documents();
    let body = |doc: usize| -> Vec<u8> {
        let key = doc as u64;
        (0..docs[doc].size_bytes).map(|i| (tierstack_coop::key::mix(key ^ (i / 8)) >> (8 * (i % 8))) as u8).collect()
    };
    let mut out = Vec::new();
    for backend in [Backend::Shm, Backend::Tcp] {
        for name in ["bcc", "ccwr", "mtacc", "hybcc", "groupcache"] {
            let load = load_average();
            let cluster = local_cluster(backend, 4)?;
            let ids: Vec<NodeId> = (0..4).map(NodeId).collect();
            let coop = CoopConfig::new(name.parse()?, ids[..2].to_vec(), ids[2..].to_vec(), cache);
            let nodes = cluster
                .fabrics()
                .iter()
                .map(|f| CoopNode::start(Arc::clone(f), coop.clone()))
                .collect::<Result<Vec<_>, _>>()?;
            let (mut remote_ns, mut store_ns, mut wrong) = (Vec::new(), Vec::new(), 0u64);
            for (i, doc) in trace.stream(config.seed, 0, 1).take(SERVICE_REQUESTS).enumerate() {
                let node = &nodes[i % 2];
                let started = tierstack_base::time::instant_now();
                match node.get(doc as u64)? {
                    Lookup::Local { body: b, .. } => wrong += u64::from(b != body(doc)),
                    Lookup::Remote { body: b, .. } => {
                        remote_ns.push(started.elapsed().as_nanos() as u64);
                        wrong += u64::from(b != body(doc));
                    }
                    Lookup::Miss => {
                        let b = body(doc);
                        let started = tierstack_base::time::instant_now();
                        node.put(doc as u64, 0, &b)?;
                        store_ns.push(started.elapsed().as_nanos() as u64);
                    }
                }
            }
            let mut tally = Tally::default();
            let (mut local, mut remote, mut miss) = (0u64, 0u64, 0u64);
            for n in &nodes {
                let s = n.stats();
                tally.merge(&s.tally);
                local += s.local_hits;
                remote += s.remote_hits;
                miss += s.misses;
            }
            let total = (local + remote + miss).max(1) as f64;
            let (r, st) = (crate::stats::summarize(remote_ns, 1), crate::stats::summarize(store_ns, 1));
            let max = |p: Primitive| (tally.of(p).control_max, tally.of(p).data_max);
            out.push(ServiceRow {
                backend: backend.name().into(),
                scheme: name.into(),
                requests: SERVICE_REQUESTS as u64,
                local_hit_pct: 100.0 * local as f64 / total,
                remote_hit_pct: 100.0 * remote as f64 / total,
                miss_pct: 100.0 * miss as f64 / total,
                fetch_max: max(Primitive::Fetch),
                store_max: max(Primitive::Store),
                remote_hit_p50_us: r.p50_ns as f64 / 1e3,
                remote_hit_p99_us: r.p99_ns as f64 / 1e3,
                store_p50_us: st.p50_ns as f64 / 1e3,
                wrong_bodies: wrong,
                load_average: load,
            });
            drop(nodes);
        }
    }
    Ok(out)
}

fn print_report(report: &CoopReport, page: &mut Report) {
    let mut table = Table::new(
        &format!(
            "coop Fig. 5/6 (tierstack sim, scale {}, web-server disk seek {} us, proxy CPU per miss {} us, lookup {} ns per page table)",
            report.scale, report.disk_seek_us, report.miss_cpu_ns / 1000, report.lookup_ns
        ),
        &["proxies", "trace", "scheme", "TPS", "vs AC", "vs BCC", "local %", "remote %", "miss %", "paper"],
    );
    for r in &report.rows {
        table.row(vec![
            format!("{}+{WEB_SERVERS}", r.proxies),
            r.trace.clone(),
            r.scheme.to_uppercase(),
            format!("{:.0}", r.throughput_per_s),
            format!("{:.2}", r.vs_ac),
            format!("{:.2}", r.vs_bcc),
            format!("{:.1}", r.local_hit_pct),
            format!("{:.1}", r.remote_hit_pct),
            format!("{:.1}", r.miss_pct),
            r.paper.clone(),
        ]);
    }
    page.table(&table);
    let mut t2 = Table::new(
        "coop Table 2: messages per primitive (control, data): paper's maximum vs measured maximum and mean",
        &["scheme", "primitive", "paper max", "measured max", "measured mean", "calls"],
    );
    for r in &report.table2 {
        t2.row(vec![
            r.scheme.to_uppercase(),
            r.primitive.clone(),
            r.paper.map_or("-".into(), |(c, d)| format!("{c},{d}")),
            format!("{},{}", r.max.0, r.max.1),
            format!("{:.2},{:.2}", r.mean.0, r.mean.1),
            r.calls.to_string(),
        ]);
    }
    page.table(&t2);
    let mut sv = Table::new(
        &format!(
            "the fabric service in-process ({SERVICE_TRACE}, 2 proxies + 2 passive, {SERVICE_REQUESTS} requests, every body checked; {} build)",
            if cfg!(debug_assertions) { "debug" } else { "release" }
        ),
        &["backend", "scheme", "local %", "remote %", "miss %", "fetch max", "store max", "remote hit p50/p99 us", "store p50 us", "wrong", "load avg"],
    );
    for r in &report.service {
        sv.row(vec![
            r.backend.clone(),
            r.scheme.to_uppercase(),
            format!("{:.1}", r.local_hit_pct),
            format!("{:.1}", r.remote_hit_pct),
            format!("{:.1}", r.miss_pct),
            format!("{},{}", r.fetch_max.0, r.fetch_max.1),
            format!("{},{}", r.store_max.0, r.store_max.1),
            format!("{:.0}/{:.0}", r.remote_hit_p50_us, r.remote_hit_p99_us),
            format!("{:.0}", r.store_p50_us),
            r.wrong_bodies.to_string(),
            r.load_average.clone(),
        ]);
    }
    page.table(&sv);
    let mut sw = Table::new(
        "HYBCC's size threshold (small: BCC on the proxies; larger: MTACC)",
        &["proxies", "trace", "small max", "TPS"],
    );
    for r in &report.sweep {
        sw.row(vec![
            format!("{}+{WEB_SERVERS}", r.proxies),
            r.trace.clone(),
            format!("{} KiB", r.small_max_bytes >> 10),
            format!("{:.0}", r.throughput_per_s),
        ]);
    }
    page.table(&sw);
}
