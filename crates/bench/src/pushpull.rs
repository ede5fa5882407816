//! `tierstack bench push-pull`: the coherency paper's Fig. 12–14 on
//! tierstack — wasted updates and cache misses of the pull model, the push
//! model and the shared-cache-state hybrid at several fractions, per fabric
//! backend, plus client response time.
//!
//! Every configuration is a fresh deployment of processes (module, an
//! application server that pushes by the policy under test, proxies; see
//! [`tierstack_deploy::deployment`]) with small proxy caches, so that pushes compete with
//! fetched entries for room, which is the paper's point about push. The
//! load client replays the Zipf trace while the updater changes a uniformly
//! chosen document every few milliseconds; the staleness checker runs on
//! every response. Counters are the proxies' (`/_tierstack/stats`), taken
//! before and after the timed run, so warm-up does not count.
//!
//! The paper plots absolute counts for one run length; the table prints them
//! too, but runs differ in throughput, so the plots and the knee use rates:
//! misses per 1000 requests and wasted updates per 100 updates.
//!
//! **The knee** of the hybrid sweep ([`knee`]): with pull and push as the
//! two ends, each hybrid point achieves a share of push's miss reduction and
//! costs a share of push's wasted updates; the knee is the fraction where the
//! first exceeds the second by the most.

use crate::html::Report;
use crate::report::{Axes, Plot, Series, Table};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;
use tierstack_cluster::{pin_to_cpu, Backend};
use tierstack_deploy::deployment::{Deployment, DeploymentConfig, DeploymentOptions};
use tierstack_loadgen::{run as run_load, LoadConfig, LoadReport};
use tierstack_proxy::ProxyStats;
use tierstack_workload::Trace;

/// Documents of the default run. With the Zipf trace's 200 B – 1 MiB size
/// ladder, 200 documents give a cacheable set larger than the cache (with
/// the paper's 20, every cacheable document fits and nothing is evicted).
pub const DOCS_DEFAULT: usize = 200;
/// Zipf exponent of the default run's requests.
pub const ALPHA_DEFAULT: f64 = 1.0;
/// Each proxy's cache in the default run: the hot documents fit, the rest
/// competes for room with pushes.
pub const CACHE_BYTES_DEFAULT: usize = 512 << 10;
/// Update period of the default run. Wasted updates need documents whose
/// request rate at a proxy is comparable to their update rate; with about
/// 10^4 requests/s on a small machine that takes an update per millisecond
/// (the paper's one per second went with a much slower client).
pub const UPDATE_INTERVAL_MS_DEFAULT: u64 = 1;
/// Load client connections of the default run: few, for the same reason.
pub const CONNECTIONS_DEFAULT: usize = 2;

/// How to run the experiment. Build with [`PushPullBenchConfig::new`].
#[derive(Clone, Debug)]
pub struct PushPullBenchConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    pub backends: Vec<Backend>,
    /// Policies, as `tierstack app-server --push-policy`.
    pub policies: Vec<String>,
    pub proxies: u32,
    /// Zipf documents and exponent.
    pub docs: usize,
    pub alpha: f64,
    /// Each proxy's cache size: small, so pushes evict.
    pub cache_bytes: usize,
    pub connections: usize,
    pub duration: Duration,
    /// One update of a uniformly chosen document per this many ms.
    pub update_interval_ms: u64,
    pub seed: u64,
}

/// `tierstack bench push-pull`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct PushPullArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/pushpull")]
    pub out: PathBuf,
    /// 3 s per run instead of 10.
    #[arg(long)]
    pub quick: bool,
    /// Backends to measure.
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    pub backends: Vec<Backend>,
    /// Push policies (pull, push, hybrid:<fraction>, useful:<probability>).
    #[arg(long, value_delimiter = ',')]
    pub policies: Option<Vec<String>>,
    /// Each proxy's cache size: small enough that pushes evict.
    #[arg(long, default_value_t = CACHE_BYTES_DEFAULT)]
    pub cache_bytes: usize,
    /// Zipf documents (sizes 200 B to 1 MiB).
    #[arg(long, default_value_t = DOCS_DEFAULT)]
    pub docs: usize,
    /// Zipf exponent of the requests.
    #[arg(long, default_value_t = ALPHA_DEFAULT)]
    pub alpha: f64,
    /// One update of a uniformly chosen document every this many ms.
    #[arg(long, default_value_t = UPDATE_INTERVAL_MS_DEFAULT)]
    pub update_interval_ms: u64,
    /// Seconds per run (overrides the --quick choice).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Load client connections.
    #[arg(long, default_value_t = CONNECTIONS_DEFAULT)]
    pub connections: usize,
}

impl PushPullArgs {
    /// The configuration these flags describe.
    pub fn config(self, exe: PathBuf) -> PushPullBenchConfig {
        let mut config = PushPullBenchConfig::new(exe, self.out, self.quick);
        config.backends = self.backends;
        if let Some(policies) = self.policies {
            config.policies = policies;
        }
        config.cache_bytes = self.cache_bytes;
        config.docs = self.docs;
        config.alpha = self.alpha;
        config.update_interval_ms = self.update_interval_ms;
        config.connections = self.connections;
        if let Some(seconds) = self.duration_s {
            config.duration = Duration::from_secs(seconds);
        }
        config
    }

    /// Runs the experiment; `exe` is the `tierstack` executable the tiers are started from.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        run(&self.config(exe()?))?;
        Ok(())
    }
}

/// The default policy sweep: the paper's three models, the hybrid at four
/// fractions, and our `useful` rule at two thresholds.
pub fn default_policies() -> Vec<String> {
    ["pull", "hybrid:0.1", "hybrid:0.25", "hybrid:0.5", "hybrid:0.75", "push", "useful:0.5", "useful:0.8"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

impl PushPullBenchConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        Self {
            exe,
            out_dir,
            backends: vec![Backend::Shm, Backend::Tcp],
            policies: default_policies(),
            proxies: 2,
            docs: DOCS_DEFAULT,
            alpha: ALPHA_DEFAULT,
            cache_bytes: CACHE_BYTES_DEFAULT,
            connections: CONNECTIONS_DEFAULT,
            duration: Duration::from_secs(if quick { 3 } else { 10 }),
            update_interval_ms: UPDATE_INTERVAL_MS_DEFAULT,
            seed: 1,
        }
    }
}

/// One proxy's share of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyCounts {
    pub misses: u64,
    pub wasted_updates: u64,
    pub pushes_received: u64,
    pub push_bytes: u64,
}

/// One measured configuration (proxy counters summed over proxies).
#[derive(Clone, Debug, Serialize)]
pub struct PushPullRun {
    pub backend: String,
    pub policy: String,
    /// Position on the pull–push axis: pull 0, push 1, `hybrid:F` F; other policies none.
    pub fraction: Option<f64>,
    pub elapsed_s: f64,
    pub requests: u64,
    pub updates: u64,
    pub throughput_rps: f64,
    pub hits: u64,
    pub misses: u64,
    /// Misses on a cached copy an update had invalidated (a subset of `misses`).
    pub update_misses: u64,
    pub wasted_updates: u64,
    pub pushes_received: u64,
    pub pushes_installed: u64,
    pub push_hits: u64,
    pub push_bytes: u64,
    pub evictions: u64,
    pub misses_per_1k_requests: f64,
    pub wasted_per_100_updates: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Mean time of one cache-state read by the application server.
    pub state_read_us: f64,
    pub stale_responses: u64,
    pub errors: u64,
    pub per_proxy: Vec<ProxyCounts>,
}

/// Where the hybrid sweep bends, for one backend and one miss metric.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Knee {
    pub backend: String,
    /// `misses` (all misses per 1000 requests: the paper's metric) or
    /// `update-misses` (misses on copies an update invalidated, per 1000 requests).
    pub metric: String,
    pub fraction: f64,
    /// Share of push's miss reduction (over pull) that this fraction achieves.
    pub miss_reduction_share: f64,
    /// Share of push's wasted updates that it costs.
    pub wasted_share: f64,
}

#[derive(Serialize)]
pub struct PushPullReport {
    pub docs: usize,
    pub alpha: f64,
    pub cache_bytes: usize,
    pub update_interval_ms: u64,
    pub duration_s: f64,
    pub runs: Vec<PushPullRun>,
    pub knees: Vec<Knee>,
}

/// The part of the application server's stats this experiment reads (its
/// `push` object: `tierstack_appserver::PushStats`).
#[derive(Deserialize, Default)]
struct AppView {
    #[serde(default)]
    push: Option<PushView>,
}

#[derive(Deserialize, Default)]
struct PushView {
    updates: u64,
    decided_never: u64,
    state_reads: u64,
    state_read_ns: u64,
    decided_push: u64,
    pushes_sent: u64,
    pushes_ok: u64,
    pushes_declined: u64,
    pushes_failed: u64,
}

/// How long to wait for the pushes of the last updates to be answered.
const PUSHES_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits (bounded) until every update so far has been decided for each of
/// the `proxies` and every push answered, so the proxies' counters include
/// the last updates' pushes.
fn settle_pushes(deployment: &Deployment, proxies: u32) -> Result<AppView> {
    let deadline = tierstack_base::time::instant_now() + PUSHES_SETTLE_TIMEOUT;
    loop {
        let app: AppView = deployment.app_stats()?;
        let settled = app.push.as_ref().is_none_or(|p| {
            p.state_reads + p.decided_never >= p.updates * u64::from(proxies)
                && p.decided_push == p.pushes_sent
                && p.pushes_sent == p.pushes_ok + p.pushes_declined + p.pushes_failed
        });
        if settled || tierstack_base::time::instant_now() > deadline {
            return Ok(app);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The x position of a policy on the pull–push axis.
pub fn fraction_of(policy: &str) -> Option<f64> {
    match policy {
        "pull" => Some(0.0),
        "push" => Some(1.0),
        other => other.strip_prefix("hybrid:").and_then(|f| f.parse().ok()),
    }
}

/// One (rate of) wasted updates and misses, for [`knee`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepPoint {
    pub fraction: f64,
    pub wasted: f64,
    pub misses: f64,
}

/// The knee of a hybrid sweep between `pull` and `push`: the interior point
/// maximizing (share of push's miss reduction) − (share of push's waste).
/// `None` if push does not reduce misses or wastes nothing, or there is no
/// interior point.
pub fn knee(pull: SweepPoint, push: SweepPoint, hybrid: &[SweepPoint]) -> Option<(f64, f64, f64)> {
    let reduction = pull.misses - push.misses;
    let waste = push.wasted - pull.wasted;
    if reduction <= 0.0 || waste <= 0.0 {
        return None;
    }
    hybrid
        .iter()
        .filter(|p| p.fraction > 0.0 && p.fraction < 1.0)
        .map(|p| (p.fraction, (pull.misses - p.misses) / reduction, (p.wasted - pull.wasted) / waste))
        .max_by(|a, b| (a.1 - a.2).total_cmp(&(b.1 - b.2)))
}

fn delta(after: &ProxyStats, before: &ProxyStats, f: fn(&ProxyStats) -> u64) -> u64 {
    f(after).saturating_sub(f(before))
}

fn measure(config: &PushPullBenchConfig, backend: Backend, policy: &str) -> Result<PushPullRun> {
    let deployment = Deployment::start_with(
        &DeploymentConfig {
            exe: config.exe.clone(),
            backend,
            mode: "poll".into(),
            proxies: config.proxies,
            compute_threads: 0,
            documents: "zipf".into(),
            docs: config.docs,
            seed: config.seed,
            pin: true,
        },
        &DeploymentOptions {
            push_policy: Some(policy.to_string()),
            proxy_cache_bytes: Some(config.cache_bytes),
            state_slots: None,
            application_tier_sessions: false,
            write_through: None,
        },
    )?;
    let trace = Trace::zipf(config.alpha, config.docs)?;
    let paths: Vec<String> = trace.documents().iter().map(|d| d.path()).collect();
    deployment.warm_up(&paths)?;
    let before: Vec<ProxyStats> = deployment.proxy_stats()?;
    let app_before: AppView = deployment.app_stats()?;
    let mut load = LoadConfig::new(deployment.proxy_urls[0].clone(), trace);
    load.targets = deployment.proxy_urls.clone();
    load.update_target = Some(deployment.app_url.clone());
    load.connections = config.connections;
    load.duration_ms = Some(u64::try_from(config.duration.as_millis())?);
    load.update_interval_ms = config.update_interval_ms;
    load.seed = config.seed;
    // tierstack's own application server: its bodies (pushed ones too) are self-checking.
    load.check_bodies = true;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let report: LoadReport = runtime.block_on(run_load(load)).context("load run")?;
    anyhow::ensure!(report.accounted(), "{policy} on {}: requests not accounted for: {report:?}", backend.name());
    let app_after = settle_pushes(&deployment, config.proxies)?;
    let after: Vec<ProxyStats> = deployment.proxy_stats()?;
    deployment.stop()?;

    let sum = |f: fn(&ProxyStats) -> u64| after.iter().zip(&before).map(|(a, b)| delta(a, b, f)).sum::<u64>();
    let per_proxy = after
        .iter()
        .zip(&before)
        .map(|(a, b)| ProxyCounts {
            misses: delta(a, b, |s| s.misses),
            wasted_updates: delta(a, b, |s| s.wasted_updates),
            pushes_received: delta(a, b, |s| s.pushes_received),
            push_bytes: delta(a, b, |s| s.push_bytes),
        })
        .collect();
    let (reads, read_ns) = match (app_after.push, app_before.push) {
        (Some(a), Some(b)) => (a.state_reads - b.state_reads, a.state_read_ns - b.state_read_ns),
        _ => (0, 0),
    };
    let requests = report.requests;
    let updates = report.updates.done;
    let misses = sum(|s| s.misses);
    let wasted = sum(|s| s.wasted_updates);
    Ok(PushPullRun {
        backend: backend.name().to_string(),
        policy: policy.to_string(),
        fraction: fraction_of(policy),
        elapsed_s: report.elapsed_s,
        requests,
        updates,
        throughput_rps: report.throughput_rps,
        hits: sum(|s| s.hits),
        misses,
        update_misses: sum(|s| s.stale_dropped),
        wasted_updates: wasted,
        pushes_received: sum(|s| s.pushes_received),
        pushes_installed: sum(|s| s.pushes_installed),
        push_hits: sum(|s| s.push_hits),
        push_bytes: sum(|s| s.push_bytes),
        evictions: sum(|s| s.evictions),
        misses_per_1k_requests: 1000.0 * misses as f64 / requests.max(1) as f64,
        wasted_per_100_updates: 100.0 * wasted as f64 / updates.max(1) as f64,
        mean_us: report.latency.mean_ns / 1000.0,
        p50_us: report.latency.p50_ns as f64 / 1000.0,
        p99_us: report.latency.p99_ns as f64 / 1000.0,
        state_read_us: if reads > 0 { read_ns as f64 / reads as f64 / 1000.0 } else { 0.0 },
        stale_responses: report.stale_responses,
        errors: report.errors.total() + report.updates.errors.total(),
        per_proxy,
    })
}

/// A miss rate of a run.
type Metric = fn(&PushPullRun) -> f64;

fn update_misses_per_1k(r: &PushPullRun) -> f64 {
    1000.0 * r.update_misses as f64 / r.requests.max(1) as f64
}

fn knees(report_runs: &[PushPullRun], backends: &[Backend]) -> Vec<Knee> {
    let metrics: [(&str, Metric); 2] =
        [("misses", |r| r.misses_per_1k_requests), ("update-misses", update_misses_per_1k)];
    let mut knees = Vec::new();
    for backend in backends {
        let runs: Vec<&PushPullRun> = report_runs.iter().filter(|r| r.backend == backend.name()).collect();
        for (metric, misses) in metrics {
            let point = |r: &PushPullRun| SweepPoint {
                fraction: r.fraction.unwrap_or(f64::NAN),
                wasted: r.wasted_per_100_updates,
                misses: misses(r),
            };
            let (Some(pull), Some(push)) = (
                runs.iter().find(|r| r.policy == "pull").map(|r| point(r)),
                runs.iter().find(|r| r.policy == "push").map(|r| point(r)),
            ) else {
                continue;
            };
            let hybrid: Vec<SweepPoint> =
                runs.iter().filter(|r| r.policy.starts_with("hybrid:")).map(|r| point(r)).collect();
            if let Some((fraction, miss_reduction_share, wasted_share)) = knee(pull, push, &hybrid) {
                knees.push(Knee {
                    backend: backend.name().to_string(),
                    metric: metric.to_string(),
                    fraction,
                    miss_reduction_share,
                    wasted_share,
                });
            }
        }
    }
    knees
}

/// Runs every (backend, policy), prints the tables, writes JSON and plots.
pub fn run(config: &PushPullBenchConfig) -> Result<PushPullReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    // The load client shares CPU 0 with the proxies; the app tier has the other.
    if tierstack_cluster::online_cpus() >= 2 {
        pin_to_cpu(0)?;
    }
    let mut runs = Vec::new();
    for &backend in &config.backends {
        for policy in &config.policies {
            eprintln!("bench push-pull: {policy} on {}", backend.name());
            runs.push(measure(config, backend, policy).with_context(|| format!("{policy} on {}", backend.name()))?);
        }
    }
    let knees = knees(&runs, &config.backends);
    let report = PushPullReport {
        docs: config.docs,
        alpha: config.alpha,
        cache_bytes: config.cache_bytes,
        update_interval_ms: config.update_interval_ms,
        duration_s: config.duration.as_secs_f64(),
        runs,
        knees,
    };
    print_and_plot(config, &report)?;
    // Every policy runs the proxies in poll mode, which is coherent: any
    // stale response fails the benchmark (after its report was written).
    let labels: Vec<String> = report.runs.iter().map(|r| format!("{} on {}", r.policy, r.backend)).collect();
    crate::coherence::stale_verdict(
        report.runs.iter().zip(&labels).map(|(r, label)| ("poll", label.as_str(), r.stale_responses)),
    )?;
    Ok(report)
}

fn print_and_plot(config: &PushPullBenchConfig, report: &PushPullReport) -> Result<()> {
    let mut out = Report::new(&config.out_dir, "bench push-pull", "adaptive push-pull (coherency paper Fig. 12-14)");
    out.table(&runs_table(config, report));
    out.table(&per_proxy_table(report));
    out.text(&knee_lines(config, report).join("\n"));

    out.json("pushpull.json", report)?;
    let sweep = |f: fn(&PushPullRun) -> f64| -> Vec<Series> {
        config
            .backends
            .iter()
            .map(|b| {
                let mut points: Vec<(f64, f64)> = report
                    .runs
                    .iter()
                    .filter(|r| r.backend == b.name())
                    .filter_map(|r| r.fraction.map(|x| (x, f(r))))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { label: b.name().to_string(), points }
            })
            .collect()
    };
    let axes = |y| Axes {
        x_label: "fraction of recently accessed documents pushed (fraction; pull = 0, push = 1)",
        y_label: y,
        log_x: false,
        log_y: false,
    };
    out.plot(&Plot::lines(
        "pushpull-wasted.svg",
        "Fig. 12-14a: wasted updates",
        axes("wasted updates per 100 updates"),
        sweep(|r| r.wasted_per_100_updates),
    ))?;
    out.plot(&Plot::lines(
        "pushpull-misses.svg",
        "Fig. 12-14b: cache misses",
        axes("misses per 1000 requests"),
        sweep(|r| r.misses_per_1k_requests),
    ))?;
    out.plot(&Plot::lines(
        "pushpull-update-misses.svg",
        "Misses on copies an update invalidated (part of Fig. 12-14b)",
        axes("update misses per 1000 requests"),
        sweep(update_misses_per_1k),
    ))?;
    out.plot(&Plot::lines(
        "pushpull-response-time.svg",
        "Response time (not in the paper)",
        axes("mean response time (µs)"),
        sweep(|r| r.mean_us),
    ))?;
    out.plot(&Plot::lines(
        "pushpull-tradeoff.svg",
        "Trade-off: misses vs wasted updates (Fig. 12-14a against 12-14b)",
        Axes {
            x_label: "wasted updates per 100 updates",
            y_label: "misses per 1000 requests",
            log_x: false,
            log_y: false,
        },
        tradeoff_series(config, report),
    ))?;
    out.finish()?;
    Ok(())
}

/// Fig. 12-14: every run's wasted updates, misses and response time.
fn runs_table(config: &PushPullBenchConfig, report: &PushPullReport) -> Table {
    let mut table = Table::new(
        &format!(
            "Fig. 12-14: wasted updates and cache misses ({} Zipf({}) documents, {} KiB caches, an update every {} ms, {} s)",
            config.docs,
            config.alpha,
            config.cache_bytes >> 10,
            config.update_interval_ms,
            config.duration.as_secs_f64()
        ),
        &[
            "backend",
            "policy",
            "requests",
            "updates",
            "pushes",
            "wasted",
            "misses",
            "update misses",
            "misses/1k req",
            "wasted/100 upd",
            "push hits",
            "evictions",
            "mean µs",
            "p99 µs",
            "state read µs",
            "stale",
        ],
    );
    for r in &report.runs {
        table.row(vec![
            r.backend.clone(),
            r.policy.clone(),
            r.requests.to_string(),
            r.updates.to_string(),
            r.pushes_received.to_string(),
            r.wasted_updates.to_string(),
            r.misses.to_string(),
            r.update_misses.to_string(),
            format!("{:.1}", r.misses_per_1k_requests),
            format!("{:.1}", r.wasted_per_100_updates),
            r.push_hits.to_string(),
            r.evictions.to_string(),
            format!("{:.0}", r.mean_us),
            format!("{:.0}", r.p99_us),
            format!("{:.1}", r.state_read_us),
            r.stale_responses.to_string(),
        ]);
    }
    table
}

/// Each proxy's misses, wasted updates and pushes.
fn per_proxy_table(report: &PushPullReport) -> Table {
    let mut per_proxy = Table::new(
        "Per proxy: misses, wasted updates, pushes",
        &["backend", "policy", "proxy", "misses", "wasted", "pushes", "push KiB"],
    );
    for r in &report.runs {
        for (i, p) in r.per_proxy.iter().enumerate() {
            per_proxy.row(vec![
                r.backend.clone(),
                r.policy.clone(),
                (i + 1).to_string(),
                p.misses.to_string(),
                p.wasted_updates.to_string(),
                p.pushes_received.to_string(),
                (p.push_bytes >> 10).to_string(),
            ]);
        }
    }
    per_proxy
}

/// The knee of the hybrid sweep per backend and metric, and the stale and
/// error totals.
fn knee_lines(config: &PushPullBenchConfig, report: &PushPullReport) -> Vec<String> {
    let mut knees = vec!["== The knee of the hybrid sweep (measured) ==".to_string()];
    for backend in &config.backends {
        for metric in ["misses", "update-misses"] {
            match report.knees.iter().find(|k| k.backend == backend.name() && k.metric == metric) {
                Some(k) => knees.push(format!(
                    "{} ({metric}): hybrid:{} achieves {:.0}% of push's reduction over pull at {:.0}% of push's wasted updates",
                    k.backend,
                    k.fraction,
                    100.0 * k.miss_reduction_share,
                    100.0 * k.wasted_share
                )),
                None => knees.push(format!(
                    "{} ({metric}): no knee (push did not reduce them or wasted nothing)",
                    backend.name()
                )),
            }
        }
    }
    let stale: u64 = report.runs.iter().map(|r| r.stale_responses).sum();
    let errors: u64 = report.runs.iter().map(|r| r.errors).sum();
    knees.push(format!("stale responses over all runs: {stale} (must be 0); errors: {errors}"));
    knees
}

/// Misses against wasted updates: the pull-hybrid-push sweep as one line
/// per backend, the `useful` policies as another.
fn tradeoff_series(config: &PushPullBenchConfig, report: &PushPullReport) -> Vec<Series> {
    let mut tradeoff = Vec::new();
    for b in &config.backends {
        let mut sweep_points: Vec<(f64, f64, f64)> = report
            .runs
            .iter()
            .filter(|r| r.backend == b.name())
            .filter_map(|r| r.fraction.map(|x| (x, r.wasted_per_100_updates, r.misses_per_1k_requests)))
            .collect();
        sweep_points.sort_by(|a, b| a.0.total_cmp(&b.0));
        tradeoff.push(Series {
            label: format!("{} pull-hybrid-push", b.name()),
            points: sweep_points.iter().map(|p| (p.1, p.2)).collect(),
        });
        let others: Vec<(f64, f64)> = report
            .runs
            .iter()
            .filter(|r| r.backend == b.name() && r.fraction.is_none())
            .map(|r| (r.wasted_per_100_updates, r.misses_per_1k_requests))
            .collect();
        if !others.is_empty() {
            tradeoff.push(Series { label: format!("{} useful", b.name()), points: others });
        }
    }
    tradeoff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(fraction: f64, wasted: f64, misses: f64) -> SweepPoint {
        SweepPoint { fraction, wasted, misses }
    }

    #[test]
    fn fractions_place_policies_on_the_axis() {
        assert_eq!(fraction_of("pull"), Some(0.0));
        assert_eq!(fraction_of("push"), Some(1.0));
        assert_eq!(fraction_of("hybrid:0.25"), Some(0.25));
        assert_eq!(fraction_of("useful:0.5"), None);
    }

    #[test]
    fn the_knee_is_where_miss_reduction_most_exceeds_waste() {
        let pull = p(0.0, 0.0, 100.0);
        let push = p(1.0, 50.0, 20.0);
        // 0.25 gets 50% of the reduction for 10% of the waste (+40);
        // 0.5 gets 75% for 40% (+35); 0.75 gets 90% for 80% (+10).
        let hybrid = [p(0.25, 5.0, 60.0), p(0.5, 20.0, 40.0), p(0.75, 40.0, 28.0)];
        let (fraction, reduction, waste) = knee(pull, push, &hybrid).unwrap();
        assert_eq!(fraction, 0.25);
        assert!((reduction - 0.5).abs() < 1e-12 && (waste - 0.1).abs() < 1e-12);
        assert_eq!(knee(pull, p(1.0, 50.0, 120.0), &hybrid), None, "push did not reduce misses");
        assert_eq!(knee(pull, p(1.0, 0.0, 20.0), &hybrid), None, "push wasted nothing");
        assert_eq!(knee(pull, push, &[]), None);
    }
}
