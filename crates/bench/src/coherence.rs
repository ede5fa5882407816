//! `tierstack bench coherence`: the coherency paper's Fig. 9–11 on
//! tierstack, plus a `ttl` mode (hits served with no check: the
//! non-coherent upper bound plain HTTP caches reach).
//!
//! Every configuration is a fresh deployment of processes (module, app
//! server, proxies; see [`tierstack_deploy::deployment`]) with the application tier pinned
//! to one CPU and the proxies and load client to the other, and the load
//! client replaying a trace while an updater changes a random document every
//! second, as in the paper. The staleness checker runs on every response.
//!
//! - Fig. 9: response time and throughput vs compute threads on the
//!   application server, per mode.
//! - Fig. 10: response-time breakdown (client↔proxy, module processing,
//!   back-end version check, application server) at 0 and 200 threads.
//! - Fig. 11: throughput on the Zipf and WorldCup-like traces.
//!
//! **Two deployments of the two-sided baseline** ([`Placement`]): in the
//! paper's (`shared`), the module's version thread competes with the
//! compute threads in one scheduling group, which is what every process of
//! one session gets under Linux's autogroup scheduling; as a service of its
//! own (`own`), the module and the application server each run in a
//! session of their own (`setsid`: an autogroup each, as systemd's units
//! get a cgroup each), so the module's thread gets the CPU share of a
//! group, not of one thread among hundreds. poll/tcp and poll/shm are
//! measured in both, and the ratio is reported for each.
//!
//! **The hot-document experiment** (`--hot`, issues 16 and 31) lives in
//! [`crate::coherence_hot`]; it measures with this module's [`measure`].

use crate::html::Report;
use crate::report::{series_by, Axes, Plot, Table};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;
use tierstack_cluster::{pin_to_cpu, Backend};
use tierstack_deploy::deployment::{strings, Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_loadgen::{run as run_load, LoadConfig, LoadReport};
use tierstack_proxy::ProxyStats;
use tierstack_workload::TraceSpec;

/// Documents fetched through each proxy before a timed run (the most popular first).
const WARM_DOCUMENTS_MAX: usize = 200;

/// Where the application module runs relative to the compute threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// One session (so one autogroup) with the application server's compute
    /// threads and everything else: the paper's node, today's default.
    Shared,
    /// The module and the application server each in a session of its own
    /// (`setsid`), as a service manager would run them.
    Own,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Shared => "shared",
            Placement::Own => "own",
        }
    }

    pub fn parse(text: &str) -> Result<Placement> {
        match text {
            "shared" => Ok(Placement::Shared),
            "own" => Ok(Placement::Own),
            other => anyhow::bail!("placement {other:?}: expected shared or own"),
        }
    }
}

/// One way of serving: a proxy mode on a fabric backend, the module's
/// placement, and whether updates push through to the proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    pub cache: &'static str,
    pub backend: Backend,
    pub placement: Placement,
    /// The application server pushes each update's new version to the
    /// proxies before UPDATE_DONE (write-through).
    pub write_through: bool,
    /// The proxies refresh their hot documents themselves (`tierstack
    /// proxy --refresh-hot`, issue 16); off: `--refresh-hot 0`.
    pub refresh: bool,
    /// Each update publishes its new page at the module and versions change
    /// at UPDATE_DONE (`app-module --versions-at done`, `app-server
    /// --publish`, issue 31): a proxy whose check fails reads the page
    /// one-sidedly instead of asking the application server.
    pub publish: bool,
}

impl Mode {
    pub const fn new(cache: &'static str, backend: Backend) -> Mode {
        Mode { cache, backend, placement: Placement::Shared, write_through: false, refresh: false, publish: false }
    }

    pub fn label(&self) -> String {
        let mut label = match self.cache {
            "poll" => format!("poll/{}", self.backend.name()),
            other => other.to_string(),
        };
        if self.write_through {
            label.push_str("+wt");
        }
        if self.refresh {
            label.push_str("+refresh");
        }
        if self.publish {
            label.push_str("+publish");
        }
        if self.placement == Placement::Own {
            label.push_str("@own");
        }
        label
    }
}

/// The four modes of the paper's comparison plus the ttl bound.
pub fn modes() -> Vec<Mode> {
    vec![
        Mode::new("no-cache", Backend::Shm),
        Mode::new("poll", Backend::Tcp),
        Mode::new("poll", Backend::Shm),
        Mode::new("ttl", Backend::Shm),
    ]
}

/// The two-sided baseline and poll/shm with the module as its own service.
pub fn own_service_modes() -> Vec<Mode> {
    [Backend::Tcp, Backend::Shm]
        .into_iter()
        .map(|b| Mode { placement: Placement::Own, ..Mode::new("poll", b) })
        .collect()
}

/// The proxies' refresh in the `+refresh` modes: the CLI's default hot set
/// size and interval.
pub(crate) const REFRESH_ARGS: &[&str] = &["--refresh-hot", "64", "--refresh-interval-ms", "5"];

/// The load average (`/proc/loadavg`'s first three fields), or `?`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Whether Linux's autogroup scheduling is on (`None`: unknown), which
/// [`Placement::Own`] relies on to give a session its own CPU share.
pub fn autogroup_enabled() -> Option<bool> {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").ok().map(|text| text.trim() == "1")
}

/// `tierstack bench coherence`'s flags; `--hot` picks
/// [`CoherenceBenchConfig::hot`]'s defaults instead of
/// [`CoherenceBenchConfig::new`]'s.
#[derive(clap::Args, Clone, Debug)]
pub struct CoherenceArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/coherence")]
    pub out: PathBuf,
    /// Compute threads 0 and 200 only, 3 s per run (with --hot: 200 threads, costs none and
    /// fixed:3000, 2 rounds of 2 s runs: a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// Compute-thread counts (default 0,25,50,100,200).
    #[arg(long, value_delimiter = ',')]
    pub compute_threads: Option<Vec<usize>>,
    /// Seconds per run.
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Placements of the module for poll/tcp and poll/shm: `shared` (in the compute
    /// threads' scheduling group, the paper's node) and/or `own` (module and server
    /// each in a session, so an autogroup, of its own).
    #[arg(long, value_delimiter = ',', default_value = "shared,own")]
    pub placements: Vec<String>,
    /// The hot-document experiment instead (issues 16, 31): ttl, poll/shm, write-through
    /// push, proxy-side refresh and published pages, 32 connections, single and zipf, at 0 and
    /// 200 compute threads and each --cpu-cost, alternated over --repeats rounds; and the
    /// refresh study (refresh on and off, both placements).
    #[arg(long)]
    pub hot: bool,
    /// Connections of the load client (default 16; 32 with --hot).
    #[arg(long)]
    pub connections: Option<usize>,
    /// With --hot: the application server's CPU cost per page generated, one experiment
    /// cell each: `none`, `fixed:<us>`, `rubis` or `pareto:<alpha>,<min_us>,<max_us>`
    /// (default none,fixed:3000,rubis).
    #[arg(long, requires = "hot")]
    pub cpu_cost: Option<String>,
    /// With --hot: rounds; each runs every (trace, threads, cost, mode) once, the modes'
    /// order rotated per round (default 3).
    #[arg(long, requires = "hot")]
    pub repeats: Option<usize>,
    /// With --hot: traces (default single,zipf).
    #[arg(long, requires = "hot", value_delimiter = ',')]
    pub traces: Option<Vec<String>>,
    /// With --hot: only these modes, by label (ttl@own, poll/shm@own, poll/shm+wt@own,
    /// poll/shm+refresh@own, poll/shm+publish@own, poll/shm, poll/shm+refresh; default all).
    #[arg(long, requires = "hot", value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// Write-through's bound on an update's wait for its pushes.
    #[arg(long, default_value_t = 500)]
    pub write_through_bound_ms: u64,
}

impl CoherenceArgs {
    /// The configuration these flags describe; an unknown placement is an error.
    pub fn config(self, exe: PathBuf) -> Result<CoherenceBenchConfig> {
        let mut config = if self.hot {
            CoherenceBenchConfig::hot(exe, self.out, self.quick)
        } else {
            CoherenceBenchConfig::new(exe, self.out, self.quick)
        };
        config.placements = self.placements.iter().map(|p| Placement::parse(p)).collect::<Result<_>>()?;
        if let Some(connections) = self.connections {
            config.connections = connections;
        }
        if let Some(costs) = self.cpu_cost {
            config.costs = crate::coherence_hot::cost_specs(&costs)?;
        }
        if let Some(repeats) = self.repeats {
            anyhow::ensure!(repeats > 0, "--repeats must be at least 1");
            config.repeats = repeats;
        }
        if let Some(traces) = self.traces {
            for trace in &traces {
                TraceSpec::parse(trace, 0.75, 20).with_context(|| format!("--traces {trace:?}"))?;
            }
            config.traces = traces;
        }
        if let Some(modes) = self.modes {
            config.modes = Some(crate::coherence_hot::select_modes(&modes)?);
        }
        config.write_through_bound = Duration::from_millis(self.write_through_bound_ms);
        if let Some(threads) = self.compute_threads {
            config.compute_threads = threads;
        }
        if let Some(seconds) = self.duration_s {
            config.duration = Duration::from_secs(seconds);
        }
        Ok(config)
    }

    /// Runs the experiment `--hot` chose; `exe` is the `tierstack`
    /// executable the tiers are started from.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        let hot = self.hot;
        let config = self.config(exe()?)?;
        if hot {
            crate::coherence_hot::run_hot(&config)?;
        } else {
            run(&config)?;
        }
        Ok(())
    }
}

pub struct CoherenceBenchConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    pub compute_threads: Vec<usize>,
    pub duration: Duration,
    pub connections: usize,
    pub proxies: u32,
    pub update_interval_ms: u64,
    /// Placements of the two-sided baseline to measure (the sweep).
    pub placements: Vec<Placement>,
    /// Write-through's bound on an update's wait for its pushes.
    pub write_through_bound: Duration,
    /// `--hot`: the application server's CPU cost specs (`none`: no cost).
    pub costs: Vec<String>,
    /// `--hot`: rounds of alternated runs.
    pub repeats: usize,
    /// `--hot`: the traces.
    pub traces: Vec<String>,
    /// `--hot`: the modes measured (`None`: all of them).
    pub modes: Option<Vec<Mode>>,
}

impl CoherenceBenchConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        Self {
            exe,
            out_dir,
            compute_threads: if quick { vec![0, 200] } else { vec![0, 25, 50, 100, 200] },
            duration: Duration::from_secs(if quick { 3 } else { 8 }),
            connections: 16,
            proxies: 3,
            update_interval_ms: 1000,
            placements: vec![Placement::Shared, Placement::Own],
            write_through_bound: Duration::from_millis(500),
            costs: vec![NO_COST.into()],
            repeats: 1,
            traces: vec!["single".into()],
            modes: None,
        }
    }

    /// The hot-document experiment's settings: 0 and 200 compute threads,
    /// 32 connections, three page costs, three rounds of 5 s runs (the
    /// default experiment takes about 30 min on two cores).
    pub fn hot(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        let costs: &[&str] = if quick { &[NO_COST, "fixed:3000"] } else { &[NO_COST, "fixed:3000", "rubis"] };
        Self {
            compute_threads: if quick { vec![200] } else { vec![0, 200] },
            connections: 32,
            duration: Duration::from_secs(if quick { 2 } else { 5 }),
            costs: costs.iter().map(|c| c.to_string()).collect(),
            repeats: if quick { 2 } else { 3 },
            traces: vec!["single".into(), "zipf".into()],
            ..Self::new(exe, out_dir, quick)
        }
    }
}

/// The cost spec of an application server that spends no CPU per page.
pub const NO_COST: &str = "none";

/// One measured configuration.
#[derive(Serialize)]
pub struct Run {
    pub mode: String,
    pub placement: String,
    pub write_through: bool,
    pub trace: String,
    pub compute_threads: usize,
    /// The application server's `--cpu-cost` ([`NO_COST`]: none).
    pub cpu_cost: String,
    /// The round of alternated runs this run belongs to (`--hot`; else 0).
    pub round: usize,
    /// `/proc/loadavg` when the run started.
    pub load_average: String,
    /// Latency of the updates (start to response), µs.
    pub update_p50_us: f64,
    pub update_p99_us: f64,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The 99.9th percentile and the slowest response, µs: a closed-loop
    /// client issues few requests while its connections wait out a stall,
    /// so a stall shows here before it moves p99.
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    pub hit_rate: f64,
    pub stale_responses: u64,
    pub updates: u64,
    pub errors: u64,
    /// Hits served from a page the application published at the module
    /// (the proxies' `pages_installed`; `None`: the proxies do not count them).
    pub pages_installed: Option<u64>,
    /// Published pages read and not usable (older than the versions, torn, absent).
    pub pages_unusable: Option<u64>,
    pub breakdown: Breakdown,
    pub proxies: Vec<ProxyStats>,
}

/// Mean time per request spent in each component (µs), Fig. 10.
#[derive(Serialize, Default, Clone)]
pub struct Breakdown {
    pub client_proxy_us: f64,
    pub module_processing_us: f64,
    pub version_check_us: f64,
    pub app_server_us: f64,
}

#[derive(Serialize)]
pub struct CoherenceReport {
    pub runs: Vec<Run>,
}

/// The part of the application server's stats the breakdown needs.
#[derive(Deserialize)]
struct AppStatsView {
    module_wait_ns: u64,
    /// The push path's counters (`tierstack_appserver::PushStats`).
    #[serde(default)]
    push: Option<serde_json::Value>,
}

/// Deploys `mode` at `compute_threads` with the application server's CPU
/// cost `cost` ([`NO_COST`]: none), replays `trace` and measures.
pub(crate) fn measure(
    config: &CoherenceBenchConfig,
    mode: Mode,
    trace: &str,
    compute_threads: usize,
    cost: &str,
) -> Result<Run> {
    let spec = TraceSpec::parse(trace, 0.75, 20)?;
    let load_average = load_average();
    let options = DeploymentOptions {
        application_tier_sessions: mode.placement == Placement::Own,
        push_policy: mode.write_through.then(|| "push".to_string()),
        write_through: mode.write_through.then_some(config.write_through_bound),
        ..DeploymentOptions::default()
    };
    let refresh = if mode.refresh { REFRESH_ARGS } else { &["--refresh-hot", "0"] };
    let mut app_server = if cost == NO_COST { Vec::new() } else { strings(&["--cpu-cost", cost]) };
    let mut app_module = Vec::new();
    if mode.publish {
        app_server.push("--publish".into());
        app_module.extend(strings(&["--versions-at", "done"]));
    }
    let extra = ExtraArgs { proxy: strings(refresh), app_server, app_module };
    let deployment = Deployment::start_with_args(
        &DeploymentConfig {
            exe: config.exe.clone(),
            backend: mode.backend,
            mode: mode.cache.into(),
            proxies: config.proxies,
            compute_threads,
            documents: trace.into(),
            docs: 20,
            seed: 1,
            pin: true,
        },
        &options,
        &extra,
    )?;
    let documents = spec.build(1)?;
    let warm: Vec<String> = documents.documents().iter().take(WARM_DOCUMENTS_MAX).map(|d| d.path()).collect();
    deployment.warm_up(&warm)?;
    if let (true, Some(first)) = (mode.write_through, warm.first()) {
        // The push path connects to each proxy's cache state and admin
        // listener on its first update: not part of the steady state.
        deployment.update(first)?;
        deployment.warm_up(&warm)?;
    }
    let mut load = LoadConfig::new(deployment.proxy_urls[0].clone(), documents);
    load.targets = deployment.proxy_urls.clone();
    load.update_target = Some(deployment.app_url.clone());
    load.connections = config.connections;
    load.duration_ms = Some(u64::try_from(config.duration.as_millis())?);
    load.update_interval_ms = config.update_interval_ms;
    // tierstack's own application server: its bodies are self-checking.
    load.check_bodies = true;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let report: LoadReport = runtime.block_on(run_load(load)).context("load run")?;
    let proxies: Vec<ProxyStats> = deployment.settled_proxy_stats()?;
    let app: AppStatsView = deployment.app_stats()?;
    deployment.stop()?;

    let requests = report.ok.max(1) as f64;
    let sum = |f: fn(&ProxyStats) -> u64| proxies.iter().map(f).sum::<u64>() as f64;
    let mean_us = report.latency.mean_ns as f64 / 1000.0;
    let version_check_us = sum(|p| p.check_ns) / requests / 1000.0;
    let module_processing_us = app.module_wait_ns as f64 / requests / 1000.0;
    let upstream_us = sum(|p| p.upstream_ns) / requests / 1000.0;
    let app_server_us = (upstream_us - module_processing_us).max(0.0);
    let breakdown = Breakdown {
        client_proxy_us: (mean_us - version_check_us - upstream_us).max(0.0),
        module_processing_us,
        version_check_us,
        app_server_us,
    };
    let e = &report.errors;
    anyhow::ensure!(report.accounted(), "{}: requests not accounted for: {report:?}", mode.label());
    if mode.write_through {
        let push = app.push.as_ref().context("write-through: the application server reports no push counters")?;
        let field = |name: &str| push[name].as_u64().unwrap_or(0);
        anyhow::ensure!(
            push["write_through"] == true,
            "{}: the application server is not in write-through mode",
            mode.label()
        );
        eprintln!(
            "  write-through: {} updates, {} timed out, mean wait {:.0} µs; pushes {} sent, {} ok, {} failed",
            field("write_through_updates"),
            field("write_through_timeouts"),
            field("write_through_wait_ns") as f64 / field("write_through_updates").max(1) as f64 / 1000.0,
            field("pushes_sent"),
            field("pushes_ok"),
            field("pushes_failed")
        );
    }
    Ok(Run {
        mode: mode.label(),
        placement: mode.placement.name().to_string(),
        write_through: mode.write_through,
        trace: trace.to_string(),
        compute_threads,
        cpu_cost: cost.to_string(),
        round: 0,
        load_average,
        update_p50_us: report.updates.p50_ns as f64 / 1000.0,
        update_p99_us: report.updates.p99_ns as f64 / 1000.0,
        throughput_rps: report.throughput_rps,
        p50_us: report.latency.p50_ns as f64 / 1000.0,
        p99_us: report.latency.p99_ns as f64 / 1000.0,
        p999_us: report.latency.p999_ns as f64 / 1000.0,
        max_us: report.latency.max_ns as f64 / 1000.0,
        mean_us,
        hit_rate: report.hit_rate.unwrap_or(0.0),
        stale_responses: report.stale_responses,
        updates: report.updates.done,
        errors: e.total(),
        pages_installed: proxy_counter(&proxies, "pages_installed"),
        pages_unusable: proxy_counter(&proxies, "pages_unusable"),
        breakdown,
        proxies,
    })
}

/// Runs Fig. 9–11, prints the tables, writes JSON and plots.
pub fn run(config: &CoherenceBenchConfig) -> Result<CoherenceReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    // The load client shares CPU 0 with the proxies; the app tier has the other.
    let cpus = tierstack_cluster::online_cpus();
    if cpus >= 2 {
        pin_to_cpu(0)?;
    }
    let mut runs = Vec::new();
    let own = config.placements.contains(&Placement::Own);
    if own && autogroup_enabled() != Some(true) {
        eprintln!("bench coherence: autogroup scheduling is off here; the `own` placement then differs from `shared` only by session");
    }
    for &threads in &config.compute_threads {
        let mut sweep = modes();
        if own {
            sweep.extend(own_service_modes());
        }
        for mode in sweep {
            eprintln!("bench coherence: {} with {threads} compute threads (single 8 KiB document)", mode.label());
            runs.push(measure(config, mode, "single", threads, NO_COST)?);
        }
    }
    for trace in ["zipf", "worldcup"] {
        for mode in modes() {
            eprintln!("bench coherence: {} on the {trace} trace", mode.label());
            runs.push(measure(config, mode, trace, 0, NO_COST)?);
        }
    }
    let report = CoherenceReport { runs };
    print_and_plot(config, &report)?;
    stale_verdict(report.runs.iter().map(|r| (r.mode.as_str(), r.trace.as_str(), r.stale_responses)))?;
    Ok(report)
}

/// Fails if any run of a coherent mode (every mode but `ttl`) served a
/// stale response: the benchmark then exits non-zero, after its report
/// was written. Runs are `(mode, trace, stale responses)`.
pub fn stale_verdict<'a>(runs: impl IntoIterator<Item = (&'a str, &'a str, u64)>) -> Result<()> {
    let stale: Vec<String> = runs
        .into_iter()
        .filter(|&(mode, _, stale)| !mode.starts_with("ttl") && stale > 0)
        .map(|(mode, trace, stale)| format!("{mode} on {trace}: {stale}"))
        .collect();
    anyhow::ensure!(stale.is_empty(), "stale responses served in a coherent mode: {}", stale.join(", "));
    Ok(())
}

/// The sum over `proxies` of the stats counter `name`, or `None` when the
/// proxies' stats have no such counter (a proxy from before it existed).
fn proxy_counter(proxies: &[ProxyStats], name: &str) -> Option<u64> {
    proxies.iter().map(|p| serde_json::to_value(p).ok().and_then(|v| v[name].as_u64())).sum()
}

fn find<'a>(report: &'a CoherenceReport, mode: &str, trace: &str, threads: usize) -> Option<&'a Run> {
    report.runs.iter().find(|r| r.mode == mode && r.trace == trace && r.compute_threads == threads)
}

fn print_and_plot(config: &CoherenceBenchConfig, report: &CoherenceReport) -> Result<()> {
    let mut out =
        Report::new(&config.out_dir, "bench coherence", "strongly coherent caching (coherency paper Fig. 9-11)");
    out.page().paragraph(&format!(
        "Module, application server and {} proxies as processes (application tier on one CPU, proxies and load \
         client on the other), {} connections, an update every {} ms, {:.0} s per run, warm caches; every response \
         is checked for staleness. ttl serves cached copies without revalidating: not coherent, kept as the bound.",
        config.proxies,
        config.connections,
        config.update_interval_ms,
        config.duration.as_secs_f64()
    ));
    let labels: Vec<String> = modes().iter().map(Mode::label).collect();
    let mut header = vec!["compute threads".to_string()];
    header.extend(labels.iter().cloned());
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut latency = Table::new("Fig. 9a: client response time, mean (µs), single 8 KiB document", &header_refs);
    let mut throughput = Table::new("Fig. 9b: throughput (requests/s), single 8 KiB document", &header_refs);
    for &threads in &config.compute_threads {
        let cell = |f: fn(&Run) -> String| {
            let mut row = vec![threads.to_string()];
            row.extend(labels.iter().map(|m| find(report, m, "single", threads).map(f).unwrap_or_default()));
            row
        };
        latency.row(cell(|r| format!("{:.1}", r.mean_us)));
        throughput.row(cell(|r| format!("{:.0}", r.throughput_rps)));
    }
    out.table(&latency);
    out.table(&throughput);
    if let Some(table) = placement_table(config, report) {
        out.table(&table);
    }
    out.table(&breakdown_table(config, report, &labels));
    out.table(&traces_table(report, &header_refs));
    out.table(&quality_table(report));
    out.text(&targets(config, report).join("\n"));

    out.json("coherence.json", report)?;
    let single = |f: fn(&Run) -> f64| {
        let threads = &config.compute_threads;
        let runs = labels.iter().flat_map(|m| threads.iter().filter_map(move |&t| find(report, m, "single", t)));
        series_by(runs, |r| r.mode.clone(), |r| Some((r.compute_threads as f64, f(r))))
    };
    let axes = |y| Axes {
        x_label: "compute threads on the application server (threads)",
        y_label: y,
        log_x: false,
        log_y: true,
    };
    out.plot(&Plot::lines(
        "coherence-response-time.svg",
        "Fig. 9a: client response time, single 8 KiB document",
        axes("mean response time (µs)"),
        single(|r| r.mean_us),
    ))?;
    out.plot(&Plot::lines(
        "coherence-throughput.svg",
        "Fig. 9b: throughput, single 8 KiB document",
        axes("throughput (requests/s)"),
        single(|r| r.throughput_rps),
    ))?;
    out.finish()?;
    Ok(())
}

/// Fig. 11: throughput by trace at 0 compute threads, a column per mode.
fn traces_table(report: &CoherenceReport, header: &[&str]) -> Table {
    let labels = header.get(1..).unwrap_or(&[]);
    let mut traces = Table::new("Fig. 11: throughput (requests/s) by trace, 0 compute threads", header);
    for trace in ["single", "zipf", "worldcup"] {
        let mut row = vec![trace.to_string()];
        row.extend(
            labels
                .iter()
                .map(|m| find(report, m, trace, 0).map(|r| format!("{:.0}", r.throughput_rps)).unwrap_or_default()),
        );
        traces.row(row);
    }
    traces.header[0] = "trace".into();
    traces
}

/// Fig. 10: where a request's time goes, at the fewest and the most
/// compute threads.
fn breakdown_table(config: &CoherenceBenchConfig, report: &CoherenceReport, labels: &[String]) -> Table {
    let mut breakdown = Table::new(
        "Fig. 10: response-time breakdown, mean µs per request",
        &[
            "compute threads",
            "mode",
            "client<->proxy",
            "module processing",
            "version check",
            "app server",
            "module share",
        ],
    );
    let extremes =
        [config.compute_threads.first().copied().unwrap_or(0), config.compute_threads.last().copied().unwrap_or(0)];
    for threads in extremes {
        for label in labels {
            if let Some(r) = find(report, label, "single", threads) {
                let b = &r.breakdown;
                let total = b.client_proxy_us + b.module_processing_us + b.version_check_us + b.app_server_us;
                breakdown.row(vec![
                    threads.to_string(),
                    label.clone(),
                    format!("{:.1}", b.client_proxy_us),
                    format!("{:.1}", b.module_processing_us),
                    format!("{:.1}", b.version_check_us),
                    format!("{:.1}", b.app_server_us),
                    format!("{:.1}%", 100.0 * (b.module_processing_us + b.version_check_us) / total.max(1e-9)),
                ]);
            }
        }
    }
    breakdown
}

/// Every run's hit rate, updates, stale responses and errors.
fn quality_table(report: &CoherenceReport) -> Table {
    let mut quality = Table::new(
        "Every run: hit rate, updates, stale responses (must be 0 except ttl), errors",
        &["mode", "trace", "compute threads", "hit rate", "updates", "stale", "errors"],
    );
    for r in &report.runs {
        quality.row(vec![
            r.mode.clone(),
            r.trace.clone(),
            r.compute_threads.to_string(),
            format!("{:.3}", r.hit_rate),
            r.updates.to_string(),
            r.stale_responses.to_string(),
            r.errors.to_string(),
        ]);
    }
    quality
}

/// Throughput of poll/tcp and poll/shm in each placement of the module and
/// the ratio in each (`None` if only one placement was measured).
fn placement_table(config: &CoherenceBenchConfig, report: &CoherenceReport) -> Option<Table> {
    if !config.placements.contains(&Placement::Own) {
        return None;
    }
    let mut table = Table::new(
        &format!(
            "Two-sided baseline by deployment, throughput (requests/s), single 8 KiB document; shared: the module in \
             the compute threads' scheduling group (the paper's node); own: module and server in sessions of their \
             own (autogroup scheduling {})",
            match autogroup_enabled() {
                Some(true) => "on",
                Some(false) => "off",
                None => "unknown",
            }
        ),
        &[
            "compute threads",
            "poll/tcp shared",
            "poll/shm shared",
            "shm/tcp shared",
            "poll/tcp own",
            "poll/shm own",
            "shm/tcp own",
            "load average",
        ],
    );
    for &threads in &config.compute_threads {
        let tput = |mode: &str| find(report, mode, "single", threads).map(|r| r.throughput_rps);
        let cell = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or_default();
        let ratio = |shm: Option<f64>, tcp: Option<f64>| match (shm, tcp) {
            (Some(shm), Some(tcp)) => format!("{:.2}x", shm / tcp.max(1e-9)),
            _ => String::new(),
        };
        let (tcp, shm, tcp_own, shm_own) =
            (tput("poll/tcp"), tput("poll/shm"), tput("poll/tcp@own"), tput("poll/shm@own"));
        let load = find(report, "poll/tcp@own", "single", threads).map(|r| r.load_average.clone()).unwrap_or_default();
        table.row(vec![
            threads.to_string(),
            cell(tcp),
            cell(shm),
            ratio(shm, tcp),
            cell(tcp_own),
            cell(shm_own),
            ratio(shm_own, tcp_own),
            load,
        ]);
    }
    Some(table)
}

/// The targets, as measured ratios, beside the paper's own observations.
fn targets(config: &CoherenceBenchConfig, report: &CoherenceReport) -> Vec<String> {
    let tput = |mode: &str, t: usize| find(report, mode, "single", t).map(|r| r.throughput_rps).unwrap_or(f64::NAN);
    let low = config.compute_threads.first().copied().unwrap_or(0);
    let high = config.compute_threads.last().copied().unwrap_or(0);
    let mut out = vec!["== Targets (measured) ==".to_string()];
    for &t in &config.compute_threads {
        out.push(format!(
            "poll/shm / ttl throughput at {t:>3} threads: {:.2} (target >= 0.80)",
            tput("poll/shm", t) / tput("ttl", t)
        ));
    }
    out.push(format!(
        "poll/shm at {high} / at {low} threads: {:.2} (target >= 0.90)",
        tput("poll/shm", high) / tput("poll/shm", low)
    ));
    out.push(format!(
        "poll/shm / poll/tcp at {high} threads, module in the compute threads' group: {:.1}x (target >= 5)",
        tput("poll/shm", high) / tput("poll/tcp", high)
    ));
    if config.placements.contains(&Placement::Own) {
        out.push(format!(
            "poll/shm / poll/tcp at {high} threads, module as its own service: {:.1}x",
            tput("poll/shm@own", high) / tput("poll/tcp@own", high)
        ));
    }
    out.push(format!(
        "poll/shm / no-cache at {high} threads: {:.1}x (target >= 5)",
        tput("poll/shm", high) / tput("no-cache", high)
    ));
    if let Some(r) = find(report, "poll/shm", "single", low) {
        let b = &r.breakdown;
        out.push(format!(
            "module overhead at {low} threads (poll/shm): {:.1}% of response time (target < 10%)",
            100.0 * (b.module_processing_us + b.version_check_us) / r.mean_us.max(1e-9)
        ));
    }
    let stale: u64 = report.runs.iter().filter(|r| r.mode != "ttl").map(|r| r.stale_responses).sum();
    out.push(format!("stale responses in coherent modes: {stale} (target 0)"));
    out.push("== The paper beside ours ==".to_string());
    out.push(format!(
        "poll / no-cache throughput at {low} threads: poll/shm {:.2}x, poll/tcp {:.2}x (the paper, Fig. 9b: 1.67x on every transport at low load)",
        tput("poll/shm", low) / tput("no-cache", low),
        tput("poll/tcp", low) / tput("no-cache", low)
    ));
    let module_share = |mode: &str, t: usize| {
        find(report, mode, "single", t).map(|r| {
            let b = &r.breakdown;
            100.0 * (b.module_processing_us + b.version_check_us) / r.mean_us.max(1e-9)
        })
    };
    if let (Some(shm), Some(tcp)) = (module_share("poll/shm", low), module_share("poll/tcp", low)) {
        out.push(format!(
            "module share of response time at {low} threads: poll/shm {shm:.1}%, poll/tcp {tcp:.1}% (the paper, Fig. 10a: under 10% on every transport)"
        ));
    }
    if let (Some(shm), Some(tcp)) = (module_share("poll/shm", high), module_share("poll/tcp", high)) {
        out.push(format!(
            "module share of response time at {high} threads: poll/shm {shm:.1}%, poll/tcp {tcp:.1}% (the paper, Fig. 10b at 200 threads: about 70% two-sided, unchanged one-sided)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_responses_fail_the_benchmark_only_in_coherent_modes() {
        assert!(stale_verdict([("poll/shm", "zipf", 0), ("ttl", "zipf", 40), ("no-cache", "single", 0)]).is_ok());
        let err = stale_verdict([("poll/shm", "zipf", 0), ("poll/tcp", "single", 2)]).unwrap_err().to_string();
        assert!(err.contains("poll/tcp on single: 2"), "{err}");
        assert!(stale_verdict([("no-cache", "worldcup", 1)]).is_err());
    }

    #[test]
    fn labels_name_placement_and_write_through() {
        let hot = crate::coherence_hot::hot_modes();
        let labels: Vec<String> = own_service_modes().iter().chain(&hot).map(Mode::label).collect();
        assert_eq!(
            labels,
            [
                "poll/tcp@own",
                "poll/shm@own",
                "ttl@own",
                "poll/shm@own",
                "poll/shm+wt@own",
                "poll/shm+refresh@own",
                "poll/shm+publish@own"
            ]
        );
        assert_eq!(Placement::parse("own").unwrap(), Placement::Own);
        assert!(Placement::parse("elsewhere").is_err());
    }
}
