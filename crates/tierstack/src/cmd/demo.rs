//! `tierstack demo`: the paper's 2-tier data-center on this machine, under
//! load, with live progress and a checked result.
//!
//! Starts the application module, the application server and three proxies
//! as processes (application tier and proxies on different CPUs), replays a
//! Zipf trace through the proxies while an updater changes a document every
//! second, and checks every response for staleness. Prints a summary, writes
//! a report folder (JSON and plots), and stops every process on exit or
//! Ctrl-C. Exits non-zero if any stale response was served.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierstack_bench::deploy::{Deployment, DeploymentConfig};
use tierstack_bench::report::{line_plot, write_json, Axes, Series, Table};
use tierstack_cluster::{pin_to_cpu, Backend};
use tierstack_loadgen::{run_with, LiveStats, LoadConfig};
use tierstack_proxy::ProxyStats;
use tierstack_workload::TraceSpec;

#[derive(Args)]
pub struct DemoArgs {
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Fabric backend: shm (one-sided) or tcp (two-sided).
    #[arg(long, default_value = "shm")]
    backend: Backend,
    /// Proxy cache mode: poll, no-cache or ttl.
    #[arg(long, default_value = "poll")]
    mode: String,
    #[arg(long, default_value_t = 3)]
    proxies: u32,
    /// single, zipf or worldcup.
    #[arg(long, default_value = "zipf")]
    trace: String,
    #[arg(long, default_value_t = 0)]
    compute_threads: usize,
    #[arg(long, default_value_t = 12)]
    connections: usize,
    #[arg(long, default_value_t = 1000)]
    update_interval_ms: u64,
    /// Report folder.
    #[arg(long, default_value = "report/demo")]
    out: PathBuf,
}

pub fn run(args: DemoArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let spec = TraceSpec::parse(&args.trace, 0.75, 20)?;
    let trace = spec.build(1)?;
    eprintln!(
        "tierstack demo: module + application server + {} proxies ({} fabric, {} mode), {} trace, {} s",
        args.proxies,
        args.backend.name(),
        args.mode,
        args.trace,
        args.duration_s
    );
    // Ctrl-C is handled from the very start, so an interrupt during start-up
    // still stops every process cleanly (registration is synchronous).
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (interrupted_tx, interrupted) = tokio::sync::watch::channel(false);
    let mut sigint =
        runtime.block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) })?;
    runtime.spawn(async move {
        sigint.recv().await;
        let _ = interrupted_tx.send(true);
    });
    let deployment = Deployment::start(&DeploymentConfig {
        exe: std::env::current_exe()?,
        backend: args.backend,
        mode: args.mode.clone(),
        proxies: args.proxies,
        compute_threads: args.compute_threads,
        documents: args.trace.clone(),
        docs: 20,
        seed: 1,
        pin: true,
    })?;
    if *interrupted.borrow() {
        deployment.stop()?;
        eprintln!("tierstack demo: interrupted during start-up; every process stopped");
        return Ok(());
    }
    if tierstack_cluster::online_cpus() >= 2 {
        pin_to_cpu(0)?;
    }
    let mut load = LoadConfig::new(deployment.proxy_urls[0].clone(), trace);
    load.targets = deployment.proxy_urls.clone();
    load.update_target = Some(deployment.app_url.clone());
    load.connections = args.connections;
    load.duration_ms = Some(args.duration_s * 1000);
    load.update_interval_ms = args.update_interval_ms;

    let live = Arc::new(LiveStats::default());
    let bar = ProgressBar::new(args.duration_s);
    bar.set_style(ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {msg}")?.progress_chars("=> "));
    let report = runtime.block_on(async {
        let watcher = live.clone();
        let bar_task = bar.clone();
        let progress = tokio::spawn(async move {
            let started = Instant::now();
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
    let proxies: Vec<ProxyStats> = deployment.proxy_stats()?;
    deployment.stop()?;

    let checks: u64 = proxies.iter().map(|p| p.checks).sum();
    let check_ns: u64 = proxies.iter().map(|p| p.check_ns).sum();
    let mut summary = Table::new("tierstack demo: summary", &["metric", "value"]);
    let rows: Vec<(&str, String)> = vec![
        ("fabric / mode", format!("{} / {}", args.backend.name(), args.mode)),
        ("requests (2xx)", report.ok.to_string()),
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
        ("updates", report.updates.done.to_string()),
        ("errors", (report.requests - report.ok).to_string()),
        ("stale responses", report.stale_responses.to_string()),
    ];
    for (metric, value) in rows {
        summary.row(vec![metric.to_string(), value]);
    }
    println!("{}", summary.render());

    write_json(&args.out.join("demo.json"), &json!({ "load": report, "proxies": proxies }))?;
    let per_second = |f: fn(&tierstack_loadgen::SecondPoint) -> f64| {
        report.series.iter().map(|p| (f64::from(p.second), f(p))).collect()
    };
    line_plot(
        &args.out.join("throughput.svg"),
        "Throughput over time",
        Axes { x_label: "seconds", y_label: "requests/s", log_x: false, log_y: false },
        &[Series { label: "2xx responses".into(), points: per_second(|p| p.throughput_rps) }],
    )?;
    line_plot(
        &args.out.join("hit-rate.svg"),
        "Cache hit rate over time",
        Axes { x_label: "seconds", y_label: "hit rate", log_x: false, log_y: false },
        &[Series { label: "hit rate".into(), points: per_second(|p| p.hit_rate.unwrap_or(0.0)) }],
    )?;
    println!("report: {}/demo.json, throughput.svg, hit-rate.svg", args.out.display());
    if report.stale_responses > 0 && args.mode != "ttl" {
        bail!("{} stale responses were served", report.stale_responses);
    }
    Ok(())
}
