//! `tierstack bench coherence`: the coherency paper's Fig. 9–11 on
//! tierstack, plus a `ttl` mode (hits served with no check: the
//! non-coherent upper bound plain HTTP caches reach).
//!
//! Every configuration is a fresh deployment of processes (module, app
//! server, proxies; see [`crate::deploy`]) with the application tier pinned
//! to one CPU and the proxies and load client to the other, and the load
//! client replaying a trace while an updater changes a random document every
//! second, as in the paper. The staleness checker runs on every response.
//!
//! - Fig. 9: response time and throughput vs compute threads on the
//!   application server, per mode.
//! - Fig. 10: response-time breakdown (client↔proxy, module processing,
//!   back-end version check, application server) at 0 and 200 threads.
//! - Fig. 11: throughput on the Zipf and WorldCup-like traces.

use crate::deploy::{Deployment, DeploymentConfig};
use crate::html::Page;
use crate::report::{line_plot, write_json, Axes, Series, Table};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;
use tierstack_cluster::{pin_to_cpu, Backend};
use tierstack_loadgen::{run as run_load, LoadConfig, LoadReport};
use tierstack_proxy::ProxyStats;
use tierstack_workload::TraceSpec;

/// Documents fetched through each proxy before a timed run (the most popular first).
const WARM_DOCUMENTS_MAX: usize = 200;

/// One way of serving: a proxy mode on a fabric backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    pub cache: &'static str,
    pub backend: Backend,
}

impl Mode {
    pub fn label(&self) -> String {
        match self.cache {
            "poll" => format!("poll/{}", self.backend.name()),
            other => other.to_string(),
        }
    }
}

/// The four modes of the paper's comparison plus the ttl bound.
pub fn modes() -> Vec<Mode> {
    vec![
        Mode { cache: "no-cache", backend: Backend::Shm },
        Mode { cache: "poll", backend: Backend::Tcp },
        Mode { cache: "poll", backend: Backend::Shm },
        Mode { cache: "ttl", backend: Backend::Shm },
    ]
}

pub struct CoherenceBenchConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    pub compute_threads: Vec<usize>,
    pub duration: Duration,
    pub connections: usize,
    pub proxies: u32,
    pub update_interval_ms: u64,
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
        }
    }
}

/// One measured configuration.
#[derive(Serialize)]
pub struct Run {
    pub mode: String,
    pub trace: String,
    pub compute_threads: usize,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub hit_rate: f64,
    pub stale_responses: u64,
    pub updates: u64,
    pub errors: u64,
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
}

fn measure(config: &CoherenceBenchConfig, mode: Mode, trace: &str, compute_threads: usize) -> Result<Run> {
    let spec = TraceSpec::parse(trace, 0.75, 20)?;
    let deployment = Deployment::start(&DeploymentConfig {
        exe: config.exe.clone(),
        backend: mode.backend,
        mode: mode.cache.into(),
        proxies: config.proxies,
        compute_threads,
        documents: trace.into(),
        docs: 20,
        seed: 1,
        pin: true,
    })?;
    let documents = spec.build(1)?;
    let warm: Vec<String> = documents.documents().iter().take(WARM_DOCUMENTS_MAX).map(|d| d.path()).collect();
    deployment.warm_up(&warm)?;
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
    Ok(Run {
        mode: mode.label(),
        trace: trace.to_string(),
        compute_threads,
        throughput_rps: report.throughput_rps,
        p50_us: report.latency.p50_ns as f64 / 1000.0,
        p99_us: report.latency.p99_ns as f64 / 1000.0,
        mean_us,
        hit_rate: report.hit_rate.unwrap_or(0.0),
        stale_responses: report.stale_responses,
        updates: report.updates.done,
        errors: e.total(),
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
    for &threads in &config.compute_threads {
        for mode in modes() {
            eprintln!("bench coherence: {} with {threads} compute threads (single 8 KiB document)", mode.label());
            runs.push(measure(config, mode, "single", threads)?);
        }
    }
    for trace in ["zipf", "worldcup"] {
        for mode in modes() {
            eprintln!("bench coherence: {} on the {trace} trace", mode.label());
            runs.push(measure(config, mode, trace, 0)?);
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
        .filter(|&(mode, _, stale)| mode != "ttl" && stale > 0)
        .map(|(mode, trace, stale)| format!("{mode} on {trace}: {stale}"))
        .collect();
    anyhow::ensure!(stale.is_empty(), "stale responses served in a coherent mode: {}", stale.join(", "));
    Ok(())
}

fn find<'a>(report: &'a CoherenceReport, mode: &str, trace: &str, threads: usize) -> Option<&'a Run> {
    report.runs.iter().find(|r| r.mode == mode && r.trace == trace && r.compute_threads == threads)
}

fn print_and_plot(config: &CoherenceBenchConfig, report: &CoherenceReport) -> Result<()> {
    let mut page = Page::new("tierstack bench coherence: strongly coherent caching (coherency paper Fig. 9-11)");
    page.paragraph(&format!(
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
    page.print(&latency);
    page.print(&throughput);

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
        for label in &labels {
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
    page.print(&breakdown);

    let mut traces = Table::new("Fig. 11: throughput (requests/s) by trace, 0 compute threads", &header_refs);
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
    page.print(&traces);

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
    page.print(&quality);
    page.print_text(&targets(config, report).join("\n"));

    write_json(&config.out_dir.join("coherence.json"), report)?;
    let series = |f: fn(&Run) -> f64| -> Vec<Series> {
        labels
            .iter()
            .map(|m| Series {
                label: m.clone(),
                points: config
                    .compute_threads
                    .iter()
                    .filter_map(|t| find(report, m, "single", *t).map(|r| (*t as f64, f(r))))
                    .collect(),
            })
            .collect()
    };
    let axes = |y| Axes {
        x_label: "compute threads on the application server (threads)",
        y_label: y,
        log_x: false,
        log_y: true,
    };
    let dir = &config.out_dir;
    line_plot(
        &dir.join("coherence-response-time.svg"),
        "Fig. 9a: client response time, single 8 KiB document",
        axes("mean response time (µs)"),
        &series(|r| r.mean_us),
    )?;
    page.plot(&dir.join("coherence-response-time.svg"))?;
    line_plot(
        &dir.join("coherence-throughput.svg"),
        "Fig. 9b: throughput, single 8 KiB document",
        axes("throughput (requests/s)"),
        &series(|r| r.throughput_rps),
    )?;
    page.plot(&dir.join("coherence-throughput.svg"))?;
    let index = page.write(dir)?;
    println!(
        "wrote {}/coherence.json, coherence-{{response-time,throughput}}.svg and {}",
        config.out_dir.display(),
        index.display()
    );
    Ok(())
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
        "poll/shm / poll/tcp at {high} threads: {:.1}x (target >= 5)",
        tput("poll/shm", high) / tput("poll/tcp", high)
    ));
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
}
