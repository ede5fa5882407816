//! Fig. 8b ([`run_throughput`]): throughput of a proxy balancing over
//! application servers in the paper's setting (svc §5.2): busy back ends
//! (each pinned to its own CPU with `compute_threads` CPU-burning threads,
//! which count as running threads in the published load, as in Fig. 8a),
//! requests whose CPU cost diverges (the "RUBiS-like" bounded Pareto of
//! `app-server --cpu-cost`), and enough closed-loop clients to keep every
//! back end busy. One proxy process per configuration (hash, round-robin,
//! and least-loaded fed by each of the four schemes), in `no-cache` mode so
//! every request reaches a back end, under a Zipf load at each α.
//!
//! [R] Repeats: each repeat runs every configuration once per α, in an
//! order rotated by one each repeat, so no configuration always runs first
//! (warm-up) or last (a neighbour's build). Throughput and p99 are ratios
//! against hash **of the same repeat and α**; the table gives their median
//! and range over the repeats. The CPU each back end and each proxy used
//! comes from `/proc/<pid>/stat` deltas over the load: a back end's share
//! says whether it was busy, the proxy's CPU per request is what reading
//! the load costs the front end.

use super::{command, module_command, zipf_server};
use crate::coherence_hot::Spread;
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
use tierstack_loadgen::{run as run_load, LoadConfig, LoadReport};
use tierstack_monitor::{BackendAddress, Policy, Scheme};
use tierstack_proxy::{CacheMode, ProxyArgs, ProxyStats};
use tierstack_tier_http::observe::ProcStat;
use tierstack_workload::Trace;

pub struct ThroughputConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    /// Zipf exponents of the requests.
    pub alphas: Vec<f64>,
    pub docs: usize,
    /// Application servers (each pinned to CPU `i % cpus`).
    pub servers: usize,
    /// `app-server --compute-threads` of server `i` is entry `i % len`.
    pub compute_threads: Vec<usize>,
    /// Load time per configuration, α and repeat.
    pub duration: Duration,
    /// Closed-loop clients.
    pub connections: usize,
    /// `app-server --cpu-cost`.
    pub cpu_cost: String,
    /// The servers' monitor interval (RDMA-Async, Socket-Async).
    pub interval: Duration,
    /// Runs of every configuration, each in a rotated order.
    pub repeats: usize,
    pub seed: u64,
}

impl ThroughputConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        ThroughputConfig {
            exe,
            out_dir,
            alphas: if quick { vec![0.9] } else { vec![0.25, 0.5, 0.75, 0.9] },
            docs: 64,
            servers: 2,
            compute_threads: vec![COMPUTE_THREADS_DEFAULT],
            duration: Duration::from_secs(if quick { 2 } else { 4 }),
            connections: CONNECTIONS_DEFAULT,
            cpu_cost: "rubis".into(),
            interval: Duration::from_millis(10),
            repeats: if quick { 1 } else { 3 },
            seed: 1,
        }
    }
}

/// [R] Compute threads per back end: busy enough that a monitor thread
/// waits to be scheduled (Fig. 8a measured Socket-Sync's answer at 2.7 ms
/// with 25 threads against 41 µs idle), few enough that the requests'
/// own threads still get a share of the CPU.
pub(crate) const COMPUTE_THREADS_DEFAULT: usize = 4;

/// [R] Closed-loop clients: several per back end, so a back end is never
/// idle for want of requests under any policy.
pub(crate) const CONNECTIONS_DEFAULT: usize = 32;

/// A way of choosing the upstream: a policy and, for least-loaded, a scheme.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BalanceConfig {
    pub policy: &'static str,
    pub scheme: Option<Scheme>,
}

impl BalanceConfig {
    pub fn label(&self) -> String {
        match self.scheme {
            Some(scheme) => format!("least-loaded/{scheme}"),
            None => self.policy.to_string(),
        }
    }

    /// Hash, round-robin, then least-loaded by each scheme.
    pub fn all() -> Vec<BalanceConfig> {
        let mut all =
            vec![BalanceConfig { policy: "hash", scheme: None }, BalanceConfig { policy: "round-robin", scheme: None }];
        all.extend(
            Scheme::ALL.into_iter().map(|scheme| BalanceConfig { policy: "least-loaded", scheme: Some(scheme) }),
        );
        all
    }
}

/// The order of the configurations in repeat `repeat`: [`BalanceConfig::all`]
/// rotated left by `repeat`.
pub(crate) fn rotated(configs: &[BalanceConfig], repeat: usize) -> Vec<BalanceConfig> {
    let mut order = configs.to_vec();
    if !order.is_empty() {
        order.rotate_left(repeat % configs.len());
    }
    order
}

/// One configuration at one α in one repeat.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputPoint {
    pub repeat: usize,
    /// Its place in the repeat's order (0 = ran first).
    pub position: usize,
    pub alpha: f64,
    pub balance: String,
    pub requests: u64,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
    /// Requests each server got.
    pub routed: Vec<u64>,
    /// Forwards the proxy sent again to the other server (one failed,
    /// or its server turned suspect while it waited: a starved monitor).
    pub retries: u64,
    /// CPU each back end used over the load, as a share of the wall time
    /// (1.0 = one CPU all the time).
    pub backend_cpu_share: Vec<f64>,
    /// The proxy's CPU time per request served, µs.
    pub proxy_cpu_us_per_request: f64,
    /// Against hash at the same α in the same repeat.
    pub throughput_vs_hash: f64,
    pub p99_vs_hash: f64,
}

/// One configuration at one α over every repeat.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputSummary {
    pub alpha: f64,
    pub balance: String,
    pub throughput_rps: Spread,
    pub throughput_vs_hash: Spread,
    pub p99_us: Spread,
    pub p99_vs_hash: Spread,
    pub proxy_cpu_us_per_request: Spread,
    /// Median over the repeats, per back end.
    pub backend_cpu_share: Vec<f64>,
    /// Share of the requests routed to each back end, summed over repeats.
    pub routed_share: Vec<f64>,
    pub errors: u64,
}

#[derive(Serialize)]
pub struct ThroughputReport {
    pub cpu_cost: String,
    pub servers: usize,
    pub compute_threads: Vec<usize>,
    pub connections: usize,
    pub duration_s: f64,
    pub repeats: usize,
    pub points: Vec<ThroughputPoint>,
    pub summary: Vec<ThroughputSummary>,
}

/// User + system CPU time process `pid` has used, ms.
fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = ProcStat::read(Some(pid))?;
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (stat.utime + stat.stime) as f64 * 1000.0 / ticks as f64)
}

/// CPU time used by each of `pids` between two snapshots, ms.
fn cpu_delta_ms(before: &[Option<f64>], after: &[Option<f64>]) -> Vec<f64> {
    before.iter().zip(after).map(|(b, a)| (a.unwrap_or(0.0) - b.unwrap_or(0.0)).max(0.0)).collect()
}

/// The deployment the configurations share: the module and the servers.
struct Servers {
    servers: Vec<ChildNode>,
    /// Each server's URL and monitor address.
    upstreams: Vec<(String, BackendAddress)>,
    /// Last, so it stops after the servers (fields drop in order).
    _module: ChildNode,
}

fn start_servers(config: &ThroughputConfig, topology: &std::path::Path, scratch: &std::path::Path) -> Result<Servers> {
    let socket = scratch.join("module.sock");
    let module =
        ChildNode::spawn(&config.exe, &module_command(topology, &socket)).context("starting the application module")?;
    let interval_ms = u64::try_from(config.interval.as_millis())?;
    let mut servers = Vec::new();
    let mut upstreams = Vec::new();
    for node in 1..=config.servers as u32 {
        let (listen, monitor) = (free_loopback_port()?, free_loopback_port()?);
        let threads = config.compute_threads[(node as usize - 1) % config.compute_threads.len()];
        let server = AppServerArgs {
            topology: Some(topology.to_path_buf()),
            node: Some(node),
            publish_load: true,
            monitor_listen: Some(monitor),
            monitor_interval_ms: interval_ms,
            cpu_cost: Some(config.cpu_cost.clone()),
            compute_threads: threads,
            ..zipf_server(listen, &socket, config.docs, config.seed)
        };
        // A session of its own, as on another machine: its compute threads
        // must not shrink the CPU weight of this process and the proxies
        // (Linux autogroups share one weight per session).
        servers.push(
            ChildNode::spawn_in_own_session(&config.exe, &command("app-server", server.to_args()))
                .with_context(|| format!("starting application server {node}"))?,
        );
        let address = BackendAddress { node: Some(NodeId(node)), socket: Some(monitor) };
        upstreams.push((format!("http://{listen}"), address));
    }
    Ok(Servers { servers, upstreams, _module: module })
}

/// One configuration at one α: a proxy of its own, a closed-loop load.
fn measure(
    config: &ThroughputConfig,
    runtime: &tokio::runtime::Runtime,
    deployment: &Servers,
    topology: &std::path::Path,
    proxy_node: u32,
    balance: &BalanceConfig,
    alpha: f64,
) -> Result<ThroughputPoint> {
    let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
    let upstreams = &deployment.upstreams;
    let args = ProxyArgs {
        balance: Some(balance.policy.parse::<Policy>().map_err(anyhow::Error::msg)?),
        monitor: balance.scheme,
        monitor_interval_ms: u64::try_from(config.interval.as_millis())?,
        upstreams: upstreams.iter().map(|(url, _)| url.clone()).collect(),
        upstream_monitors: match balance.scheme {
            Some(_) => upstreams.iter().map(|(_, monitor)| monitor.clone()).collect(),
            None => Vec::new(),
        },
        ..proxy(listen, admin, CacheMode::NoCache, topology, proxy_node)
    };
    let proxy = ChildNode::spawn(&config.exe, &command("proxy", args.to_args()))
        .with_context(|| format!("starting the {} proxy", balance.label()))?;
    let mut load = LoadConfig::new(format!("http://{listen}"), Trace::zipf(alpha, config.docs)?);
    load.connections = config.connections;
    load.duration_ms = Some(u64::try_from(config.duration.as_millis())?);
    load.update_interval_ms = 0;
    load.seed = config.seed;
    load.check_bodies = true;
    let pids: Vec<u32> = deployment.servers.iter().map(ChildNode::pid).chain([proxy.pid()]).collect();
    let snapshot = || pids.iter().map(|pid| process_cpu_ms(*pid)).collect::<Vec<_>>();
    let before = snapshot();
    let started = tierstack_base::time::instant_now();
    let report: LoadReport = runtime.block_on(run_load(load)).context("load run")?;
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let used = cpu_delta_ms(&before, &snapshot());
    let stats: ProxyStats = tierstack_deploy::deployment::get_json(admin, "/_tierstack/stats")?;
    drop(proxy);
    anyhow::ensure!(report.accounted(), "{}: requests not accounted for", balance.label());
    let (backend_ms, proxy_ms) = used.split_at(deployment.servers.len());
    Ok(ThroughputPoint {
        repeat: 0,
        position: 0,
        alpha,
        balance: balance.label(),
        requests: report.requests,
        throughput_rps: report.throughput_rps,
        p50_us: report.latency.p50_ns as f64 / 1000.0,
        p99_us: report.latency.p99_ns as f64 / 1000.0,
        errors: report.errors.total(),
        routed: stats.routed,
        retries: stats.upstream_retries,
        backend_cpu_share: backend_ms.iter().map(|ms| ms / wall_ms.max(f64::MIN_POSITIVE)).collect(),
        proxy_cpu_us_per_request: proxy_ms.iter().sum::<f64>() * 1000.0 / report.requests.max(1) as f64,
        throughput_vs_hash: 1.0,
        p99_vs_hash: 1.0,
    })
}

/// Sets each point's ratios against the hash point of its repeat and α.
pub(crate) fn set_ratios(points: &mut [ThroughputPoint]) {
    let hashes: Vec<(usize, f64, f64, f64)> = points
        .iter()
        .filter(|p| p.balance == "hash")
        .map(|p| (p.repeat, p.alpha, p.throughput_rps, p.p99_us))
        .collect();
    for point in points.iter_mut() {
        let hash = hashes.iter().find(|(repeat, alpha, _, _)| *repeat == point.repeat && *alpha == point.alpha);
        if let Some(&(_, _, rps, p99)) = hash {
            point.throughput_vs_hash = point.throughput_rps / rps.max(f64::MIN_POSITIVE);
            point.p99_vs_hash = point.p99_us / p99.max(f64::MIN_POSITIVE);
        }
    }
}

/// Medians and ranges over the repeats, per α and configuration, in the
/// order of `alphas` and `configs`.
pub(crate) fn summarize(
    points: &[ThroughputPoint],
    alphas: &[f64],
    configs: &[BalanceConfig],
) -> Vec<ThroughputSummary> {
    let mut summary = Vec::new();
    for &alpha in alphas {
        for balance in configs {
            let label = balance.label();
            let of: Vec<&ThroughputPoint> = points.iter().filter(|p| p.alpha == alpha && p.balance == label).collect();
            let spread =
                |value: fn(&ThroughputPoint) -> f64| Spread::of(&of.iter().map(|p| value(p)).collect::<Vec<_>>());
            let (Some(rps), Some(vs), Some(p99), Some(p99_vs), Some(proxy_cpu)) = (
                spread(|p| p.throughput_rps),
                spread(|p| p.throughput_vs_hash),
                spread(|p| p.p99_us),
                spread(|p| p.p99_vs_hash),
                spread(|p| p.proxy_cpu_us_per_request),
            ) else {
                continue;
            };
            let servers = of.iter().map(|p| p.routed.len().max(p.backend_cpu_share.len())).max().unwrap_or(0);
            let backend_cpu_share = (0..servers)
                .map(|i| {
                    let shares: Vec<f64> = of.iter().filter_map(|p| p.backend_cpu_share.get(i).copied()).collect();
                    Spread::of(&shares).map_or(0.0, |s| s.median)
                })
                .collect();
            let routed: Vec<u64> =
                (0..servers).map(|i| of.iter().filter_map(|p| p.routed.get(i)).sum::<u64>()).collect();
            let total = routed.iter().sum::<u64>().max(1) as f64;
            summary.push(ThroughputSummary {
                alpha,
                balance: label,
                throughput_rps: rps,
                throughput_vs_hash: vs,
                p99_us: p99,
                p99_vs_hash: p99_vs,
                proxy_cpu_us_per_request: proxy_cpu,
                backend_cpu_share,
                routed_share: routed.iter().map(|r| *r as f64 / total).collect(),
                errors: of.iter().map(|p| p.errors).sum(),
            });
        }
    }
    summary
}

/// `median (min–max)` with `digits` decimals.
fn show(spread: &Spread, digits: usize) -> String {
    format!("{:.*} ({:.*}–{:.*})", digits, spread.median, digits, spread.min, digits, spread.max)
}

/// Fig. 8b: one deployment of servers; per repeat, α and configuration
/// (in the repeat's rotated order), a proxy and a load run.
pub fn run_throughput(config: &ThroughputConfig) -> Result<ThroughputReport> {
    anyhow::ensure!(config.servers > 0 && config.repeats > 0, "Fig. 8b needs servers and repeats");
    anyhow::ensure!(!config.compute_threads.is_empty(), "Fig. 8b needs a compute-thread count");
    std::fs::create_dir_all(&config.out_dir)?;
    let configs = BalanceConfig::all();
    let scratch = tempfile::Builder::new().prefix("tierstack-bench-balance-").tempdir()?;
    let cpus = tierstack_cluster::online_cpus();
    let mut nodes = vec![NodeLine { id: 0, role: "app", cpu: None }];
    nodes.extend((1..=config.servers as u32).map(|id| NodeLine {
        id,
        role: "app",
        cpu: Some((id as usize - 1) % cpus),
    }));
    let first_proxy = config.servers as u32 + 1;
    let proxy_nodes = u32::try_from(configs.len() * config.alphas.len() * config.repeats)?;
    nodes.extend((first_proxy..first_proxy + proxy_nodes).map(|id| NodeLine { id, role: "proxy", cpu: None }));
    let topology = write_topology(scratch.path(), "balance", Backend::Shm, 1000, &nodes)?;
    let deployment = start_servers(config, &topology, scratch.path())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut points = Vec::new();
    let mut proxy_node = first_proxy;
    for repeat in 0..config.repeats {
        for &alpha in &config.alphas {
            for (position, balance) in rotated(&configs, repeat).iter().enumerate() {
                let point = measure(config, &runtime, &deployment, &topology, proxy_node, balance, alpha)?;
                proxy_node += 1;
                eprintln!(
                    "repeat {repeat} α {alpha:.2} {:<26} {:>6.0} req/s p99 {:>6.0} µs",
                    point.balance, point.throughput_rps, point.p99_us
                );
                points.push(ThroughputPoint { repeat, position, ..point });
            }
        }
    }
    drop(deployment);
    set_ratios(&mut points);
    let summary = summarize(&points, &config.alphas, &configs);
    let report = ThroughputReport {
        cpu_cost: format!("{} (RUBiS-like)", config.cpu_cost),
        servers: config.servers,
        compute_threads: config.compute_threads.clone(),
        connections: config.connections,
        duration_s: config.duration.as_secs_f64(),
        repeats: config.repeats,
        points,
        summary,
    };
    print_and_plot(config, &configs, &report)?;
    Ok(report)
}

fn print_and_plot(config: &ThroughputConfig, configs: &[BalanceConfig], report: &ThroughputReport) -> Result<()> {
    let mut table = Table::new(
        &format!(
            "Fig. 8b: {} servers with {:?} compute threads, RUBiS-like CPU cost {}, {} clients, {} repeat(s) \
             (shm, no-cache proxy); median (min–max) over repeats",
            config.servers, config.compute_threads, config.cpu_cost, config.connections, config.repeats
        ),
        &[
            "alpha",
            "balance",
            "req/s",
            "vs hash",
            "p99 ms",
            "p99 vs hash",
            "proxy µs/req",
            "back-end CPU",
            "routed",
            "errors",
        ],
    );
    for s in &report.summary {
        let shares = |values: &[f64]| values.iter().map(|v| format!("{:.0}%", 100.0 * v)).collect::<Vec<_>>().join("/");
        table.row(vec![
            format!("{:.2}", s.alpha),
            s.balance.clone(),
            format!("{:.0}", s.throughput_rps.median),
            show(&s.throughput_vs_hash, 2),
            format!("{:.1}", s.p99_us.median / 1000.0),
            show(&s.p99_vs_hash, 2),
            format!("{:.0}", s.proxy_cpu_us_per_request.median),
            shares(&s.backend_cpu_share),
            shares(&s.routed_share),
            s.errors.to_string(),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out_dir.join("monitor_throughput.json"), report)?;
    let series: Vec<Series> = configs
        .iter()
        .map(|balance| Series {
            label: balance.label(),
            points: report
                .summary
                .iter()
                .filter(|s| s.balance == balance.label())
                .map(|s| (s.alpha, s.throughput_vs_hash.median))
                .collect(),
        })
        .collect();
    line_plot(
        &config.out_dir.join("fig8b_throughput.svg"),
        "Fig. 8b: throughput against hash balancing, median of repeats (RUBiS-like CPU cost)",
        Axes { x_label: "Zipf alpha", y_label: "throughput / hash", log_x: false, log_y: false },
        &series,
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(repeat: usize, alpha: f64, balance: &str, rps: f64, p99: f64) -> ThroughputPoint {
        ThroughputPoint {
            repeat,
            position: 0,
            alpha,
            balance: balance.into(),
            requests: 10,
            throughput_rps: rps,
            p50_us: 1.0,
            p99_us: p99,
            errors: 0,
            routed: vec![6, 4],
            retries: 0,
            backend_cpu_share: vec![0.9, 1.0],
            proxy_cpu_us_per_request: 50.0,
            throughput_vs_hash: 1.0,
            p99_vs_hash: 1.0,
        }
    }

    #[test]
    fn every_configuration_takes_every_position_over_as_many_repeats() {
        let configs = BalanceConfig::all();
        for position in 0..configs.len() {
            let labels: std::collections::BTreeSet<String> =
                (0..configs.len()).map(|repeat| rotated(&configs, repeat)[position].label()).collect();
            assert_eq!(labels.len(), configs.len(), "position {position}");
        }
        assert_eq!(rotated(&configs, 0)[0].label(), "hash");
        assert_ne!(rotated(&configs, 1)[0].label(), "hash");
    }

    #[test]
    fn ratios_are_against_hash_of_the_same_repeat_and_alpha() {
        let mut points = vec![
            point(0, 0.5, "hash", 100.0, 10.0),
            point(1, 0.5, "hash", 200.0, 20.0),
            point(0, 0.9, "hash", 50.0, 5.0),
            point(0, 0.5, "round-robin", 150.0, 5.0),
            point(1, 0.5, "round-robin", 150.0, 5.0),
            point(0, 0.9, "round-robin", 150.0, 5.0),
        ];
        set_ratios(&mut points);
        let ratios: Vec<(f64, f64)> = points[3..].iter().map(|p| (p.throughput_vs_hash, p.p99_vs_hash)).collect();
        assert_eq!(ratios, vec![(1.5, 0.5), (0.75, 0.25), (3.0, 1.0)]);
        let configs = [BalanceConfig { policy: "round-robin", scheme: None }];
        let summary = summarize(&points, &[0.5], &configs);
        assert_eq!(summary.len(), 1);
        let s = &summary[0];
        assert_eq!((s.throughput_vs_hash.min, s.throughput_vs_hash.max), (0.75, 1.5));
        assert!((s.throughput_vs_hash.median - 1.125).abs() < 1e-9);
        assert_eq!(s.routed_share, vec![0.6, 0.4]);
    }
}
