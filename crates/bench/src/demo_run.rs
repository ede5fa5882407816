//! The orchestration of `tierstack demo`: the paper's 2-tier data-center
//! on this machine, under load, told as a comparison with a checked
//! result. [`crate::demo`] is the story as data (rows, verdict, report
//! page); this module deploys each configuration, warms it, runs the load
//! with live progress, and checks every run.
//!
//! By default it runs the same trace and update rate through four ways of
//! serving, one after the other, each a fresh deployment with warm caches
//! and the application tier under load (busy compute threads on its CPU):
//! `no-cache`, a `ttl` cache (serves copies without revalidating), and
//! coherent polling over two-sided messages (`poll` on `tcp`) and over
//! one-sided reads (`poll` on `shm`). It prints one comparison table
//! (throughput, p50/p99, hit rate, version checks, updates, errors, stale
//! responses) and a one-line verdict, and writes `index.html` with the
//! plots beside `demo.json` in its report folder. `--mode` and/or
//! `--backend` run one configuration instead, with its detailed summary.
//!
//! Each configuration starts the application module, the application
//! server and three proxies as processes (application tier and proxies on
//! different CPUs; the module and the server each in a session of its own,
//! so autogroup scheduling cannot let the compute threads starve the rest), replays a Zipf trace through the proxies while an
//! updater changes a document every second, and checks every response: its
//! self-checking body against its header, and its versions for staleness.
//! Every process is stopped on exit or Ctrl-C. The demo fails if a
//! coherent configuration (every one but `ttl`) served a stale response, if
//! any request or update failed (nothing in a demo run explains a failure),
//! or if a request is not accounted for ([`check`]).
//!
//! The load client runs on CPU 0 with the proxies (the application tier
//! has the last CPU): every thread of its runtime is pinned as it starts,
//! and the pinning is recorded in demo.json (`load_client_threads`).

use crate::coherence::Mode;
use crate::demo::{self as story, RunView, Setup};
use crate::report::{write_json, Table};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierstack_cluster::{pin_to_cpu, Backend};
use tierstack_deploy::deployment::{Deployment, DeploymentConfig};
use tierstack_loadgen::{run_with, LiveStats, LoadConfig, LoadReport};
use tierstack_proxy::ProxyStats;
use tierstack_workload::{Trace, TraceSpec};

/// `tierstack demo`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Seconds of load per configuration.
    #[arg(long, default_value_t = 6)]
    pub duration_s: u64,
    /// Run one configuration only, on this fabric backend: shm (one-sided) or tcp (two-sided).
    #[arg(long)]
    pub backend: Option<Backend>,
    /// Run one configuration only, with this proxy cache mode: poll, no-cache or ttl.
    #[arg(long)]
    pub mode: Option<String>,
    #[arg(long, default_value_t = 3)]
    pub proxies: u32,
    /// single, zipf or worldcup.
    #[arg(long, default_value = "zipf")]
    pub trace: String,
    /// Busy threads on the application server's CPU: the load an application
    /// tier carries, which two-sided version checks must wait behind.
    #[arg(long, default_value_t = COMPUTE_THREADS_DEFAULT)]
    pub compute_threads: usize,
    #[arg(long, default_value_t = 12)]
    pub connections: usize,
    #[arg(long, default_value_t = 1000)]
    pub update_interval_ms: u64,
    /// Report folder.
    #[arg(long, default_value = "report/demo")]
    pub out: PathBuf,
}

/// Enough load on the application tier that two-sided checks and uncached
/// requests wait for its CPU (`docs/results.md`, Fig. 9), while one-sided
/// checks do not notice.
const COMPUTE_THREADS_DEFAULT: usize = 50;

/// Documents in the trace (all warmed into every proxy before a timed run).
const DOCS: usize = 20;

/// One configuration's measurements.
struct ModeRun {
    mode: Mode,
    load: LoadReport,
    proxies: Vec<ProxyStats>,
}

/// Runs the demo: `exe` is the `tierstack` executable the tiers are
/// started from, `command` how the run was started (for the report page).
pub fn run(args: &DemoArgs, exe: &Path, command: String) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let modes = match (&args.mode, args.backend) {
        (None, None) => story::comparison(),
        (mode, backend) => vec![story::mode(mode.as_deref().unwrap_or("poll"), backend.unwrap_or(Backend::Shm))?],
    };
    let spec = TraceSpec::parse(&args.trace, 0.75, DOCS)?;
    let trace = spec.build(1)?;
    let labels: Vec<String> = modes.iter().map(Mode::label).collect();
    // Read before any process of ours runs: what else this machine was doing.
    let load_average = load_average_1min();
    eprintln!(
        "tierstack demo: {} ({} s each): module + application server ({} compute threads) + {} proxies, {} trace, \
         an update every {} ms; load average before the run: {}",
        labels.join(", "),
        args.duration_s,
        args.compute_threads,
        args.proxies,
        args.trace,
        args.update_interval_ms,
        load_average.map_or("unknown".to_string(), |l| format!("{l:.2}"))
    );
    // Ctrl-C is handled from the very start, so an interrupt during start-up
    // still stops every process cleanly (registration is synchronous).
    // The runtime's threads exist from here on: they pin themselves as they
    // start (pinning the main thread later would not move them), while the
    // main thread stays unpinned until the first tiers it spawns have started.
    let pin = tierstack_cluster::online_cpus() >= 2;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            if pin {
                if let Err(e) = pin_to_cpu(LOAD_CLIENT_CPU) {
                    eprintln!("tierstack demo: could not pin a load-client thread to CPU {LOAD_CLIENT_CPU}: {e}");
                }
            }
        })
        .build()?;
    let (interrupted_tx, interrupted) = tokio::sync::watch::channel(false);
    let mut sigint =
        runtime.block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) })?;
    runtime.spawn(async move {
        sigint.recv().await;
        let _ = interrupted_tx.send(true);
    });

    let mut runs = Vec::new();
    for (index, mode) in modes.iter().enumerate() {
        if *interrupted.borrow() {
            break;
        }
        eprintln!("[{}/{}] {}", index + 1, modes.len(), mode.label());
        let Some(run) = run_mode(args, exe, &runtime, *mode, &trace, &interrupted, pin)? else { break };
        eprintln!(
            "[{}/{}] {}: {:.0} req/s, {} stale responses",
            index + 1,
            modes.len(),
            mode.label(),
            run.load.throughput_rps,
            run.load.stale_responses
        );
        runs.push(run);
    }
    if runs.is_empty() {
        eprintln!("tierstack demo: interrupted during start-up; every process stopped");
        return Ok(());
    }
    let load_client_threads = thread_cpus();

    let rows: Vec<story::Row> = runs.iter().map(|r| story::Row::of(&r.mode, &r.load, &r.proxies)).collect();
    let details: Vec<Table> = runs.iter().map(|r| summary(&r.mode, &r.load, &r.proxies)).collect();
    if let ([_], [only]) = (modes.as_slice(), details.as_slice()) {
        println!("{}", only.render());
    } else {
        println!("{}", story::table(&rows).render());
        println!("{}", story::verdict(&rows));
    }
    if runs.len() < modes.len() {
        println!("interrupted: {} of {} configurations ran", runs.len(), modes.len());
    }

    write_json(
        &args.out.join("demo.json"),
        &json!({
            "runs": runs.iter().zip(&rows).map(|(r, row)| json!({
                "mode": r.mode.label(), "row": row, "load": r.load, "proxies": r.proxies,
            })).collect::<Vec<_>>(),
            "load_client_threads": load_client_threads,
            "load_average_before": load_average,
        }),
    )?;
    let setup = Setup {
        description: format!(
            "The application module, the application server ({} busy compute threads on its CPU) and {} caching \
             proxies run as processes on this machine; the load client replays the {} trace ({DOCS} documents) \
             over {} connections spread over the proxies while an updater changes a document every {} ms. \
             Each configuration is a fresh deployment, its caches warmed first, measured for {} s; every \
             response is checked against its self-checking body and for staleness. The load average before the \
             run was {}: the configurations run one after another, so other work on this machine that starts or \
             stops meanwhile shifts them unequally (pinning the application tier's busy threads to its CPU also \
             drives other processes onto the proxies' CPU).",
            args.compute_threads,
            args.proxies,
            args.trace,
            args.connections,
            args.update_interval_ms,
            args.duration_s,
            load_average.map_or("unknown".to_string(), |l| format!("{l:.2}"))
        ),
        command,
    };
    let views: Vec<RunView<'_>> = runs.iter().map(|r| RunView { mode: r.mode.label(), load: &r.load }).collect();
    let index = story::write_report(&args.out, &setup, &rows, &views, &details)?;
    println!("report: {} (throughput.svg, stale.svg, latency.svg, hit-rate.svg, demo.json beside it)", index.display());
    for run in &runs {
        check(&run.mode, &run.load, &run.proxies).with_context(|| run.mode.label())?;
    }
    Ok(())
}

/// Deploys `mode`, warms its caches, runs the load with live progress, and
/// stops every process. `None`: interrupted before the load started.
fn run_mode(
    args: &DemoArgs,
    exe: &Path,
    runtime: &tokio::runtime::Runtime,
    mode: Mode,
    trace: &Trace,
    interrupted: &tokio::sync::watch::Receiver<bool>,
    pin: bool,
) -> Result<Option<ModeRun>> {
    // Started as `tierstack cluster up` starts a topology (the same
    // supervisor, each process in a session of its own, so the application
    // tier's compute threads cannot starve the proxies and this load client).
    let deployment = Deployment::start_supervised(&DeploymentConfig {
        exe: exe.to_path_buf(),
        backend: mode.backend,
        mode: mode.cache.to_string(),
        proxies: args.proxies,
        compute_threads: args.compute_threads,
        documents: args.trace.clone(),
        docs: DOCS,
        seed: 1,
        pin: true,
    })?;
    if pin {
        pin_to_cpu(LOAD_CLIENT_CPU)?;
    }
    // Steady state, as the paper measures: every document cached in every
    // proxy before the clock starts (without a cache there is nothing to warm).
    if mode.cache != "no-cache" && !*interrupted.borrow() {
        let paths: Vec<String> = trace.documents().iter().map(|d| d.path()).collect();
        deployment.warm_up(&paths)?;
    }
    if *interrupted.borrow() {
        deployment.stop()?;
        return Ok(None);
    }
    let mut load = LoadConfig::new(deployment.proxy_urls[0].clone(), trace.clone());
    load.targets = deployment.proxy_urls.clone();
    load.update_target = Some(deployment.app_url.clone());
    load.connections = args.connections;
    load.duration_ms = Some(args.duration_s * 1000);
    load.update_interval_ms = args.update_interval_ms;
    // tierstack's own application server: its bodies are self-checking.
    load.check_bodies = true;

    let live = Arc::new(LiveStats::default());
    let bar = ProgressBar::new(args.duration_s);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>9} {elapsed_precise} [{bar:30}] {msg}")?.progress_chars("=> "),
    );
    bar.set_prefix(mode.label());
    let report = runtime.block_on(async {
        let watcher = live.clone();
        let bar_task = bar.clone();
        let progress = tokio::spawn(async move {
            let started = tierstack_base::time::instant_now();
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let s = watcher.snapshot();
                let seconds = started.elapsed().as_secs_f64().max(1e-3);
                let hit_rate =
                    if s.hits + s.misses > 0 { 100.0 * s.hits as f64 / (s.hits + s.misses) as f64 } else { 0.0 };
                bar_task.set_position(started.elapsed().as_secs());
                bar_task.set_message(format!(
                    "{:>8.0} req/s  hits {:>5.1}%  updates {:>3}  errors {}  stale {}",
                    s.ok as f64 / seconds,
                    hit_rate,
                    s.updates,
                    s.errors,
                    s.stale
                ));
            }
        });
        let mut interrupted = interrupted.clone();
        let shutdown = async move {
            let _ = interrupted.wait_for(|stop| *stop).await;
        };
        let result = run_with(load, live.clone(), shutdown).await;
        progress.abort();
        result
    })?;
    bar.finish_and_clear();
    let proxies: Vec<ProxyStats> = deployment.settled_proxy_stats()?;
    deployment.stop()?;
    Ok(Some(ModeRun { mode, load: report, proxies }))
}

/// One configuration's detailed summary, every error category included
/// (zeros too, so a reader sees what was counted).
pub fn summary(mode: &Mode, report: &LoadReport, proxies: &[ProxyStats]) -> Table {
    let checks: u64 = proxies.iter().map(|p| p.checks).sum();
    let check_ns: u64 = proxies.iter().map(|p| p.check_ns).sum();
    let mut summary = Table::new(&format!("tierstack demo: {} in detail", mode.label()), &["metric", "value"]);
    let rows: Vec<(&str, String)> = vec![
        ("fabric / mode", format!("{} / {}", mode.backend.name(), mode.cache)),
        ("2xx responses", report.ok.to_string()),
        ("throughput", format!("{:.0} req/s", report.throughput_rps)),
        (
            "latency p50 / p99",
            format!("{:.1} / {:.1} µs", report.latency.p50_ns as f64 / 1e3, report.latency.p99_ns as f64 / 1e3),
        ),
        ("hit rate", format!("{:.1} %", 100.0 * report.hit_rate.unwrap_or(0.0))),
        (
            "version checks",
            format!("{checks} (mean {:.2} µs)", if checks > 0 { check_ns as f64 / checks as f64 / 1e3 } else { 0.0 }),
        ),
        ("requests", report.requests.to_string()),
        ("checked ok", report.checked_ok.to_string()),
        ("bodies checked", report.bodies_checked.to_string()),
        ("errors", report.errors.total().to_string()),
        ("updates", format!("{} done / {} attempted", report.updates.done, report.updates.attempted)),
        ("update errors", report.updates.errors.total().to_string()),
        (
            "module incarnations",
            report
                .incarnations
                .iter()
                .map(|i| format!("{} ({} checked)", i.incarnation, i.responses_checked))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("stale responses", report.stale_responses.to_string()),
    ];
    let mut rows: Vec<(String, String)> = rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let at = rows.iter().position(|(k, _)| k == "errors").map_or(rows.len(), |i| i + 1);
    let categories = report.errors.categories().map(|(name, n)| (format!("  error: {name}"), n.to_string()));
    rows.splice(at..at, categories);
    for (metric, value) in rows {
        summary.row(vec![metric, value]);
    }
    summary
}

/// Why a configuration fails the demo, if it does: a stale response in a
/// coherent mode (every mode but `ttl`), a request not accounted for by the
/// load client or by a proxy (`ProxyStats::accounting_error`: in poll mode
/// every hit and coalesced response is one successful version check), or
/// any error of a request or an update (nothing in a demo run explains one).
pub fn check(mode: &Mode, report: &LoadReport, proxies: &[ProxyStats]) -> Result<()> {
    if report.stale_responses > 0 && story::coherent(mode) {
        bail!("{} stale responses were served", report.stale_responses);
    }
    if !report.accounted() {
        bail!(
            "requests not accounted for: {} requests, {} checked ok, {} errors",
            report.requests,
            report.checked_ok,
            report.errors.total()
        );
    }
    for (index, proxy) in proxies.iter().enumerate() {
        if let Some(error) = proxy.accounting_error() {
            bail!("proxy {index} does not account for its requests: {error}");
        }
    }
    if report.errors.total() > 0 || report.updates.errors.total() > 0 {
        bail!(
            "unexplained errors: requests {:?}, updates {:?}; first check failures: {:?}",
            report.errors,
            report.updates.errors,
            report.check_error_examples
        );
    }
    Ok(())
}

/// The machine's 1-minute load average (`/proc/loadavg`), if readable.
fn load_average_1min() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The CPU the load client shares with the proxies.
const LOAD_CLIENT_CPU: usize = 0;

/// Each thread of this process: its name and the CPUs it may run on
/// (`/proc/self/task/*/status`, `Cpus_allowed_list`).
fn thread_cpus() -> Vec<serde_json::Value> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut threads: Vec<serde_json::Value> = tasks
        .filter_map(Result::ok)
        .filter_map(|task| {
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let cpus = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?.trim().to_string();
            Some(json!({ "name": name.trim(), "cpus": cpus }))
        })
        .collect();
    threads.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_string());
    threads
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clean run of 10 checked requests.
    fn clean() -> LoadReport {
        LoadReport {
            trace: Trace::single().summary(),
            targets: vec![],
            connections: 1,
            seed: 1,
            shape: Default::default(),
            start_ns: 0,
            elapsed_s: 1.0,
            requests: 10,
            issued: 10,
            abandoned: 0,
            connections_opened: 0,
            per_target: vec![tierstack_loadgen::TargetCounts { requests: 10, ..Default::default() }],
            checked_ok: 10,
            bodies_checked: 10,
            ok: 10,
            throughput_rps: 10.0,
            latency: Default::default(),
            bytes: 0,
            cache_hits: 0,
            cache_misses: 0,
            hit_rate: None,
            errors: Default::default(),
            updates: Default::default(),
            checked_responses: 10,
            stale_responses: 0,
            stale_responses_offline: None,
            stale_examples: vec![],
            check_error_examples: vec![],
            incarnations: vec![],
            series: vec![],
            records_kept: 0,
            records_dropped: 0,
            records: None,
        }
    }

    fn poll() -> Mode {
        Mode::new("poll", Backend::Shm)
    }

    #[test]
    fn the_detailed_summary_lists_every_error_category_after_the_total() {
        let text = summary(&poll(), &clean(), &[]).render();
        let lines: Vec<&str> = text.lines().collect();
        let errors = lines.iter().position(|l| l.trim_start().starts_with("errors")).expect("an errors row");
        assert!(lines[errors + 1].contains("error: "), "a category follows the total: {text}");
        assert!(text.contains("stale responses"), "{text}");
        assert!(text.contains("poll/shm in detail") || text.contains("poll"), "{text}");
    }

    #[test]
    fn the_demo_fails_on_stale_responses_errors_and_broken_accounting() {
        let proxy = ProxyStats {
            mode: Some(tierstack_proxy::CacheMode::Poll),
            requests: 4,
            hits: 3,
            misses: 1,
            checks: 3,
            checks_ok: 3,
            ..Default::default()
        };
        assert_eq!(proxy.accounting_error(), None);
        assert_eq!(proxy.in_flight(), 0);
        let running = ProxyStats { requests: 7, ..proxy.clone() };
        assert_eq!(running.in_flight(), 3, "received and not yet ended");
        assert!(check(&poll(), &clean(), &[running]).is_err(), "a proxy that never settles fails the demo");
        let proxies = [proxy.clone()];
        assert!(check(&poll(), &clean(), &proxies).is_ok());
        let stale = LoadReport { stale_responses: 1, ..clean() };
        assert!(check(&poll(), &stale, &proxies).is_err());
        assert!(check(&Mode::new("no-cache", Backend::Shm), &stale, &proxies).is_err());
        assert!(
            check(&Mode::new("ttl", Backend::Shm), &stale, &proxies).is_ok(),
            "ttl is not coherent: its staleness is expected"
        );
        let mut failed = clean();
        (failed.requests, failed.errors.body_mismatch) = (11, 1);
        assert!(check(&poll(), &failed, &proxies).is_err(), "an accounted error still fails the demo");
        let mut update_failed = clean();
        update_failed.updates.errors.connect = 1;
        assert!(check(&poll(), &update_failed, &proxies).is_err());
        let unaccounted = LoadReport { requests: 11, ..clean() };
        assert!(check(&poll(), &unaccounted, &proxies).is_err());
        // A hit served without a successful version check.
        let unchecked_hit = ProxyStats { hits: 4, requests: 5, ..proxy };
        assert!(check(&poll(), &clean(), &[unchecked_hit]).is_err());
    }
}
