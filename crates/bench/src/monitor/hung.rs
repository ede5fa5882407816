//! `bench monitor --figure hung` ([`run_hung`]): a back end stopped mid-run
//! (SIGSTOP), as a process that hangs without dying (a debugger, a VM
//! pause, a wedged runtime). Two application servers publishing their load
//! and heartbeat; one proxy per (scheme, liveness) balancing least-loaded
//! over them under a closed-loop Zipf load; server 1 stopped at a third of
//! each run and resumed after it. Per configuration: requests served per
//! second over the run and while the server was stopped, p99, errors, and
//! the forwards the proxy gave up (abandoned on suspicion) or that waited
//! out the upstream timeout. [R] Each server emulates a node of `workers`
//! workers spending the cost in wall time (`app-server --emulated-workers`,
//! as the reconfiguration experiment does): on this 2-core machine two
//! servers burning real CPU share one capacity, and stopping one would
//! change nothing but who burns it. "Liveness off" is `--suspect-after-ms 0`: the
//! schemes then trust a node while it answers (RDMA-Sync: while its memory
//! is readable), which is what every scheme did before the progress word.

use super::{command, module_command, zipf_server};
use crate::report::{line_plot, write_json, Axes, Series, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use tierstack_appserver::AppServerArgs;
use tierstack_base::NodeId;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::proxy;
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_loadgen::{run as run_load, LoadConfig};
use tierstack_monitor::{BackendAddress, Policy, Scheme};
use tierstack_proxy::{CacheMode, ProxyArgs, ProxyStats};
use tierstack_workload::Trace;

pub struct HungConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    /// Load time per configuration; the server stops at a third of it.
    pub duration: Duration,
    pub connections: usize,
    /// `app-server --cpu-cost` (spent in wall time by the emulated workers).
    pub cpu_cost: String,
    /// `app-server --emulated-workers`.
    pub workers: usize,
    pub docs: usize,
    /// The proxies' `--upstream-timeout-ms` (how long a forward waits on
    /// the stopped server without liveness): a third of the run, so that
    /// forwards stuck at the stop time out (and are retried) within it.
    pub upstream_timeout: Duration,
    /// The proxies' `--suspect-after-ms` with liveness on.
    pub suspect_after: Duration,
    /// The servers' monitor interval.
    pub interval: Duration,
    pub seed: u64,
}

impl HungConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        let duration = Duration::from_secs(if quick { 3 } else { 9 });
        HungConfig {
            exe,
            out_dir,
            duration,
            connections: 16,
            cpu_cost: "pareto:1.5,2000,50000".into(),
            workers: 4,
            docs: 64,
            upstream_timeout: duration / 3,
            suspect_after: tierstack_monitor::scheme::SUSPECT_AFTER_DEFAULT,
            interval: Duration::from_millis(10),
            seed: 1,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct HungPoint {
    pub scheme: Scheme,
    pub liveness: bool,
    pub requests: u64,
    pub throughput_rps: f64,
    /// 2xx per second over the whole seconds the server was stopped.
    pub stopped_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub errors: u64,
    /// Requests still unanswered when the run ended (not in the latency).
    pub unfinished: u64,
    /// Forwards given up because the server turned suspect, and forwards
    /// that waited out the upstream timeout.
    pub abandoned: u64,
    pub timeouts: u64,
    /// Requests each server got.
    pub routed: Vec<u64>,
    /// 2xx per second of the run.
    pub per_second: Vec<u64>,
    /// Against the same scheme with liveness off.
    pub stopped_rps_vs_off: f64,
    pub p999_vs_off: f64,
}

#[derive(Serialize)]
pub struct HungReport {
    pub cpu_cost: String,
    pub workers: usize,
    pub connections: usize,
    pub duration_s: f64,
    pub stop_at_s: f64,
    pub upstream_timeout_ms: u64,
    pub suspect_after_ms: u64,
    pub points: Vec<HungPoint>,
}

fn signal(child: &ChildNode, signal: libc::c_int) -> Result<()> {
    // SAFETY: kill(2) on a child process of ours, by pid.
    let sent = unsafe { libc::kill(child.pid() as libc::pid_t, signal) };
    anyhow::ensure!(sent == 0, "kill({}, {signal}): {}", child.pid(), std::io::Error::last_os_error());
    Ok(())
}

/// The hung-server experiment: one deployment of two servers, a proxy per
/// scheme and liveness setting, liveness off first.
pub fn run_hung(config: &HungConfig) -> Result<HungReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    let scratch = tempfile::Builder::new().prefix("tierstack-bench-hung-").tempdir()?;
    let configurations: Vec<(Scheme, bool)> =
        [false, true].into_iter().flat_map(|liveness| Scheme::ALL.map(|scheme| (scheme, liveness))).collect();
    let first_proxy = 3u32;
    let mut nodes: Vec<NodeLine> = (0..first_proxy).map(|id| NodeLine { id, role: "app", cpu: None }).collect();
    nodes.extend((first_proxy..first_proxy + configurations.len() as u32).map(|id| NodeLine {
        id,
        role: "proxy",
        cpu: None,
    }));
    let topology = write_topology(scratch.path(), "hung", Backend::Shm, 1000, &nodes)?;
    let socket = scratch.path().join("module.sock");
    let _module = ChildNode::spawn(&config.exe, &module_command(&topology, &socket))
        .context("starting the application module")?;
    let interval_ms = u64::try_from(config.interval.as_millis())?;
    let mut servers = Vec::new();
    let mut upstreams = Vec::new();
    for node in 1..=2u32 {
        let (listen, monitor) = (free_loopback_port()?, free_loopback_port()?);
        let server = AppServerArgs {
            topology: Some(topology.clone()),
            node: Some(node),
            publish_load: true,
            monitor_listen: Some(monitor),
            monitor_interval_ms: interval_ms,
            cpu_cost: Some(config.cpu_cost.clone()),
            emulated_workers: Some(config.workers),
            ..zipf_server(listen, &socket, config.docs, config.seed)
        };
        servers.push(
            ChildNode::spawn(&config.exe, &command("app-server", server.to_args()))
                .with_context(|| format!("starting application server {node}"))?,
        );
        upstreams.push((listen, BackendAddress { node: Some(NodeId(node)), socket: Some(monitor) }));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let stop_at = config.duration / 3;
    let mut points = Vec::new();
    for (proxy_node, (scheme, liveness)) in (first_proxy..).zip(configurations) {
        let label = format!("{scheme}, liveness {}", if liveness { "on" } else { "off" });
        let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
        let args = ProxyArgs {
            balance: Some(Policy::LeastLoaded),
            monitor: Some(scheme),
            monitor_interval_ms: interval_ms,
            upstreams: upstreams.iter().map(|(listen, _)| format!("http://{listen}")).collect(),
            upstream_monitors: upstreams.iter().map(|(_, monitor)| monitor.clone()).collect(),
            upstream_timeout_ms: u64::try_from(config.upstream_timeout.as_millis())?,
            suspect_after_ms: if liveness { u64::try_from(config.suspect_after.as_millis())? } else { 0 },
            ..proxy(listen, admin, CacheMode::NoCache, &topology, proxy_node)
        };
        let proxy = ChildNode::spawn(&config.exe, &command("proxy", args.to_args()))
            .with_context(|| format!("starting the proxy ({label})"))?;
        let mut load = LoadConfig::new(format!("http://{listen}"), Trace::zipf(0.5, config.docs)?);
        load.connections = config.connections;
        load.duration_ms = Some(u64::try_from(config.duration.as_millis())?);
        load.update_interval_ms = 0;
        load.seed = config.seed;
        load.check_bodies = true;
        // Long enough that no request is cut by the client: the proxy's
        // own timeout decides.
        load.request_timeout_ms = u64::try_from((config.upstream_timeout * 3).as_millis())?;
        let running = runtime.spawn(run_load(load));
        // The experiment's schedule (not a synchronization): stop the server
        // a third of the way in.
        std::thread::sleep(stop_at);
        signal(&servers[1], libc::SIGSTOP)?;
        let report = runtime.block_on(running).context("the load task")?.context("load run")?;
        signal(&servers[1], libc::SIGCONT)?;
        let stats: ProxyStats = tierstack_deploy::deployment::get_json(admin, "/_tierstack/stats")?;
        drop(proxy);
        anyhow::ensure!(report.accounted(), "{label}: requests not accounted for");
        let stopped_from = stop_at.as_secs_f64().ceil();
        let stopped: Vec<u64> = report
            .series
            .iter()
            .filter(|s| {
                f64::from(s.second) >= stopped_from && f64::from(s.second) + 1.0 <= config.duration.as_secs_f64()
            })
            .map(|s| s.ok)
            .collect();
        points.push(HungPoint {
            scheme,
            liveness,
            requests: report.requests,
            throughput_rps: report.throughput_rps,
            stopped_rps: stopped.iter().sum::<u64>() as f64 / stopped.len().max(1) as f64,
            p50_us: report.latency.p50_ns as f64 / 1000.0,
            p99_us: report.latency.p99_ns as f64 / 1000.0,
            p999_us: report.latency.p999_ns as f64 / 1000.0,
            max_us: report.latency.max_ns as f64 / 1000.0,
            errors: report.errors.total(),
            unfinished: report.abandoned,
            abandoned: stats.upstream_abandoned,
            timeouts: stats.upstream_timeouts,
            routed: stats.routed.clone(),
            per_second: report.series.iter().map(|s| s.ok).collect(),
            stopped_rps_vs_off: 1.0,
            p999_vs_off: 1.0,
        });
        // The resumed server must answer again before the next run.
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(30);
        let ready = || {
            tierstack_deploy::deployment::get_within(upstreams[1].0, "/readyz", Duration::from_secs(1))
                .is_ok_and(|(status, _)| status == 200)
        };
        while !ready() {
            anyhow::ensure!(tierstack_base::time::instant_now() < deadline, "server 1 did not resume");
        }
    }
    drop(servers);
    let off: Vec<(Scheme, f64, f64)> =
        points.iter().filter(|p| !p.liveness).map(|p| (p.scheme, p.stopped_rps, p.p999_us)).collect();
    for point in &mut points {
        if let Some((_, rps, p999)) = off.iter().find(|(scheme, _, _)| *scheme == point.scheme) {
            point.stopped_rps_vs_off = point.stopped_rps / rps.max(f64::MIN_POSITIVE);
            point.p999_vs_off = point.p999_us / p999.max(f64::MIN_POSITIVE);
        }
    }
    let report = HungReport {
        cpu_cost: config.cpu_cost.clone(),
        workers: config.workers,
        connections: config.connections,
        duration_s: config.duration.as_secs_f64(),
        stop_at_s: stop_at.as_secs_f64(),
        upstream_timeout_ms: u64::try_from(config.upstream_timeout.as_millis())?,
        suspect_after_ms: u64::try_from(config.suspect_after.as_millis())?,
        points,
    };
    let mut table = Table::new(
        &format!(
            "Hung back end: server 1 of 2 ({} emulated workers each, cost {}) SIGSTOPped at {:.1} s of {:.0} s, least-loaded, {} clients, upstream timeout {} ms (shm)",
            config.workers, config.cpu_cost, report.stop_at_s, report.duration_s, config.connections, report.upstream_timeout_ms
        ),
        &[
            "scheme",
            "liveness",
            "req/s",
            "req/s stopped",
            "vs off",
            "p99 ms",
            "p99.9 ms",
            "p99.9 vs off",
            "max ms",
            "errors",
            "unfinished",
            "abandoned",
            "timeouts",
            "routed",
        ],
    );
    for p in &report.points {
        table.row(vec![
            p.scheme.name().to_string(),
            if p.liveness { "on" } else { "off" }.to_string(),
            format!("{:.0}", p.throughput_rps),
            format!("{:.0}", p.stopped_rps),
            format!("{:.2}", p.stopped_rps_vs_off),
            format!("{:.1}", p.p99_us / 1000.0),
            format!("{:.1}", p.p999_us / 1000.0),
            format!("{:.2}", p.p999_vs_off),
            format!("{:.0}", p.max_us / 1000.0),
            p.errors.to_string(),
            p.unfinished.to_string(),
            p.abandoned.to_string(),
            p.timeouts.to_string(),
            format!("{:?}", p.routed),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out_dir.join("monitor_hung.json"), &report)?;
    let series: Vec<Series> = report
        .points
        .iter()
        .map(|p| Series {
            label: format!("{}, liveness {}", p.scheme.name(), if p.liveness { "on" } else { "off" }),
            points: p.per_second.iter().enumerate().map(|(s, ok)| (s as f64, *ok as f64)).collect(),
        })
        .collect();
    line_plot(
        &config.out_dir.join("hung_throughput.svg"),
        "Hung back end: responses per second (server 1 stopped at a third of the run)",
        Axes { x_label: "time (s)", y_label: "responses per second", log_x: false, log_y: false },
        &series,
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(report)
}
