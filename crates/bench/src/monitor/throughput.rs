//! Fig. 8b ([`run_throughput`]): throughput of a proxy balancing over
//! application servers, each pinned to its own CPU and publishing its
//! load, every read burning a heavy-tailed "RUBiS-like" CPU cost. One proxy
//! process per configuration (hash, round-robin, and least-loaded fed by each
//! of the four schemes), in `no-cache` mode so every request reaches a back
//! end, under a closed-loop Zipf load at each α. Throughput and p99 are
//! reported as ratios against hash at the same α, measured in the same run.

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
use tierstack_loadgen::{run as run_load, LoadConfig, LoadReport};
use tierstack_monitor::{BackendAddress, Policy, Scheme};
use tierstack_proxy::{CacheMode, ProxyArgs, ProxyStats};
use tierstack_workload::Trace;

pub struct ThroughputConfig {
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    /// Zipf exponents of the requests.
    pub alphas: Vec<f64>,
    pub docs: usize,
    /// Application servers (each pinned to CPU `i % cpus`).
    pub servers: usize,
    /// Load time per configuration and α.
    pub duration: Duration,
    /// Closed-loop clients.
    pub connections: usize,
    /// `app-server --cpu-cost`.
    pub cpu_cost: String,
    /// The servers' monitor interval (RDMA-Async, Socket-Async).
    pub interval: Duration,
    pub seed: u64,
}

impl ThroughputConfig {
    pub fn new(exe: PathBuf, out_dir: PathBuf, quick: bool) -> Self {
        ThroughputConfig {
            exe,
            out_dir,
            alphas: if quick { vec![0.5, 0.9] } else { vec![0.25, 0.5, 0.75, 0.9] },
            docs: 64,
            servers: 2,
            duration: Duration::from_secs(if quick { 2 } else { 5 }),
            connections: 16,
            cpu_cost: "rubis".into(),
            interval: Duration::from_millis(10),
            seed: 1,
        }
    }
}

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

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputPoint {
    pub alpha: f64,
    pub balance: String,
    pub requests: u64,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
    /// Requests each server got.
    pub routed: Vec<u64>,
    /// Against hash at the same α.
    pub throughput_vs_hash: f64,
    pub p99_vs_hash: f64,
}

#[derive(Serialize)]
pub struct ThroughputReport {
    pub cpu_cost: String,
    pub servers: usize,
    pub connections: usize,
    pub duration_s: f64,
    pub points: Vec<ThroughputPoint>,
}

/// Fig. 8b: one deployment of servers, a proxy per configuration and α.
pub fn run_throughput(config: &ThroughputConfig) -> Result<ThroughputReport> {
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
    let proxy_nodes = (configs.len() * config.alphas.len()) as u32;
    nodes.extend((first_proxy..first_proxy + proxy_nodes).map(|id| NodeLine { id, role: "proxy", cpu: None }));
    let topology = write_topology(scratch.path(), "balance", Backend::Shm, 1000, &nodes)?;
    let socket = scratch.path().join("module.sock");
    let _module = ChildNode::spawn(&config.exe, &module_command(&topology, &socket))
        .context("starting the application module")?;
    let interval_ms = u64::try_from(config.interval.as_millis())?;
    let mut servers = Vec::new();
    let mut upstreams = Vec::new();
    for node in 1..=config.servers as u32 {
        let (listen, monitor) = (free_loopback_port()?, free_loopback_port()?);
        let server = AppServerArgs {
            topology: Some(topology.clone()),
            node: Some(node),
            publish_load: true,
            monitor_listen: Some(monitor),
            monitor_interval_ms: interval_ms,
            cpu_cost: Some(config.cpu_cost.clone()),
            ..zipf_server(listen, &socket, config.docs, config.seed)
        };
        servers.push(
            ChildNode::spawn(&config.exe, &command("app-server", server.to_args()))
                .with_context(|| format!("starting application server {node}"))?,
        );
        let address = BackendAddress { node: Some(NodeId(node)), socket: Some(monitor) };
        upstreams.push((format!("http://{listen}"), address));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut points = Vec::new();
    let mut proxy_node = first_proxy;
    for &alpha in &config.alphas {
        let mut at_alpha = Vec::new();
        for balance in &configs {
            let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
            let args = ProxyArgs {
                balance: Some(balance.policy.parse::<Policy>().map_err(anyhow::Error::msg)?),
                monitor: balance.scheme,
                monitor_interval_ms: interval_ms,
                upstreams: upstreams.iter().map(|(url, _)| url.clone()).collect(),
                upstream_monitors: match balance.scheme {
                    Some(_) => upstreams.iter().map(|(_, monitor)| monitor.clone()).collect(),
                    None => Vec::new(),
                },
                ..proxy(listen, admin, CacheMode::NoCache, &topology, proxy_node)
            };
            proxy_node += 1;
            let proxy = ChildNode::spawn(&config.exe, &command("proxy", args.to_args()))
                .with_context(|| format!("starting the {} proxy", balance.label()))?;
            let mut load = LoadConfig::new(format!("http://{listen}"), Trace::zipf(alpha, config.docs)?);
            load.connections = config.connections;
            load.duration_ms = Some(u64::try_from(config.duration.as_millis())?);
            load.update_interval_ms = 0;
            load.seed = config.seed;
            load.check_bodies = true;
            let report: LoadReport = runtime.block_on(run_load(load)).context("load run")?;
            let stats: ProxyStats = tierstack_deploy::deployment::get_json(admin, "/_tierstack/stats")?;
            drop(proxy);
            let errors = report.errors.total();
            anyhow::ensure!(report.accounted(), "{}: requests not accounted for", balance.label());
            at_alpha.push(ThroughputPoint {
                alpha,
                balance: balance.label(),
                requests: report.requests,
                throughput_rps: report.throughput_rps,
                p50_us: report.latency.p50_ns as f64 / 1000.0,
                p99_us: report.latency.p99_ns as f64 / 1000.0,
                errors,
                routed: stats.routed,
                throughput_vs_hash: 1.0,
                p99_vs_hash: 1.0,
            });
        }
        let (hash_rps, hash_p99) = (at_alpha[0].throughput_rps, at_alpha[0].p99_us);
        for point in &mut at_alpha {
            point.throughput_vs_hash = point.throughput_rps / hash_rps.max(f64::MIN_POSITIVE);
            point.p99_vs_hash = point.p99_us / hash_p99.max(f64::MIN_POSITIVE);
        }
        points.extend(at_alpha);
    }
    drop(servers);
    let report = ThroughputReport {
        cpu_cost: format!("{} (RUBiS-like)", config.cpu_cost),
        servers: config.servers,
        connections: config.connections,
        duration_s: config.duration.as_secs_f64(),
        points,
    };
    let mut table = Table::new(
        &format!(
            "Fig. 8b: balancing over {} servers, RUBiS-like CPU cost {} (shm, no-cache proxy)",
            config.servers, config.cpu_cost
        ),
        &["alpha", "balance", "req/s", "vs hash", "p50 µs", "p99 µs", "p99 vs hash", "errors", "routed"],
    );
    for p in &report.points {
        table.row(vec![
            format!("{:.2}", p.alpha),
            p.balance.clone(),
            format!("{:.0}", p.throughput_rps),
            format!("{:.2}", p.throughput_vs_hash),
            format!("{:.0}", p.p50_us),
            format!("{:.0}", p.p99_us),
            format!("{:.2}", p.p99_vs_hash),
            p.errors.to_string(),
            format!("{:?}", p.routed),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out_dir.join("monitor_throughput.json"), &report)?;
    let series: Vec<Series> = configs
        .iter()
        .map(|balance| Series {
            label: balance.label(),
            points: report
                .points
                .iter()
                .filter(|p| p.balance == balance.label())
                .map(|p| (p.alpha, p.throughput_vs_hash))
                .collect(),
        })
        .collect();
    line_plot(
        &config.out_dir.join("fig8b_throughput.svg"),
        "Fig. 8b: throughput against hash balancing (RUBiS-like CPU cost)",
        Axes { x_label: "Zipf alpha", y_label: "throughput / hash", log_x: false, log_y: false },
        &series,
    )?;
    println!("wrote {}", config.out_dir.display());
    Ok(report)
}
