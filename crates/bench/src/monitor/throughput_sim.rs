//! Fig. 8b in the simulator ([`run_throughput_sim`], `bench monitor
//! --figure 8b-sim`): the balancing model of [`tierstack_sim::balance`] at
//! cluster sizes this machine cannot host, each scheme given **its measured
//! cost and value age** from Fig. 8a at a back-end load level:
//!
//! - read wait per back end = Fig. 8a's mean time of one read of that
//!   scheme (`read_us_mean` of `monitor.json` with `--sim-fig8a`, else the
//!   table of docs/results.md, [`FIG8A_READ_US`]);
//! - sync schemes read the value live; async schemes (Socket-Async,
//!   RDMA-Async) read what the back end's sampler last published, every
//!   `interval + d`, where d, the time the loaded back end takes to run its
//!   monitor thread, is Socket-Sync's measured read at that load (the same
//!   thread answering on the same back end). [R] That underestimates the
//!   async schemes' age (Fig. 8a found over half their readings older than
//!   30 ms at 200 compute threads), so it favours them.
//!
//! Requests cost what the app server's `--cpu-cost` would make them cost
//! (the same quantile function, [`CpuCost::quantile_us`]). Throughput is
//! closed loop, as ratios against hash in the same model and seed; the
//! spread is over seeds.

use crate::coherence_hot::Spread;
use crate::report::{write_json, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tierstack_appserver::CpuCost;
use tierstack_monitor::{Policy, Scheme};
use tierstack_sim::balance::{run_balance, BalanceSimConfig, BalanceSimReport, SchemeModel};
use tierstack_workload::Trace;

/// Fig. 8a's mean time of one read, µs, by compute threads on the back end
/// and scheme (Socket-Async, Socket-Sync, RDMA-Async, RDMA-Sync): the table
/// of docs/results.md, "Fine-grained resource monitoring", measured with
/// `bench monitor --figure 8a` on this 2-core host.
pub const FIG8A_READ_US: [(usize, [f64; 4]); 5] = [
    (0, [0.4, 41.0, 4.2, 2.5]),
    (25, [0.4, 2700.0, 3.5, 2.4]),
    (50, [0.4, 3100.0, 3.7, 2.3]),
    (100, [0.4, 3500.0, 16.8, 2.0]),
    (200, [0.3, 7000.0, 24.6, 1.9]),
];

pub struct ThroughputSimConfig {
    pub out_dir: PathBuf,
    pub backends: Vec<usize>,
    pub front_ends: Vec<usize>,
    pub workers: usize,
    /// Closed-loop clients per worker of the cluster, both services.
    pub clients_per_worker: usize,
    /// The share of those clients that belong to a second, hash-routed
    /// service on the same back ends (0: the balanced service alone); each
    /// value a setting of its own.
    pub second_service_share: Vec<f64>,
    /// Fig. 8a's load levels (compute threads) whose measurements feed the schemes.
    pub compute_threads: Vec<usize>,
    /// `monitor.json` of a Fig. 8a run; else [`FIG8A_READ_US`].
    pub fig8a: Option<PathBuf>,
    pub interval: Duration,
    pub cpu_cost: String,
    pub alpha: f64,
    pub docs: usize,
    pub requests: u64,
    /// Seeds 1..=repeats.
    pub repeats: usize,
}

impl ThroughputSimConfig {
    pub fn new(out_dir: PathBuf, quick: bool) -> Self {
        ThroughputSimConfig {
            out_dir,
            backends: vec![2, 8, 32],
            front_ends: vec![1],
            workers: 4,
            clients_per_worker: 1,
            second_service_share: vec![0.0, 0.5],
            compute_threads: vec![0, 200],
            fig8a: None,
            interval: Duration::from_millis(10),
            cpu_cost: "rubis".into(),
            alpha: 0.9,
            docs: 64,
            requests: if quick { 20_000 } else { 200_000 },
            repeats: if quick { 1 } else { 3 },
        }
    }
}

/// Where the scheme inputs came from.
#[derive(Clone, Debug, Serialize)]
pub struct SchemeInputs {
    pub compute_threads: usize,
    pub source: String,
    pub schemes: Vec<SchemeModel>,
}

/// Mean read µs per scheme at `threads`, from a Fig. 8a `monitor.json`
/// (its `accuracy` rows: `scheme`, `compute_threads`, `read_us_mean`).
fn read_us_from_json(path: &Path, threads: usize) -> Result<[f64; 4]> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let rows = json.get("accuracy").and_then(|a| a.as_array()).context("no `accuracy` rows in the Fig. 8a report")?;
    let mut read_us = [f64::NAN; 4];
    for (slot, scheme) in read_us.iter_mut().zip(Scheme::ALL) {
        let row = rows.iter().find(|row| {
            row.get("scheme").and_then(|s| s.as_str()) == Some(scheme.name())
                && row.get("compute_threads").and_then(|t| t.as_u64()) == Some(threads as u64)
        });
        *slot = row.and_then(|row| row.get("read_us_mean")).and_then(|v| v.as_f64()).with_context(|| {
            format!("{}: no read_us_mean for {scheme} at {threads} compute threads", path.display())
        })?;
    }
    Ok(read_us)
}

/// The four schemes' models at one load level.
pub(crate) fn scheme_inputs(config: &ThroughputSimConfig, threads: usize) -> Result<SchemeInputs> {
    let (read_us, source) = match &config.fig8a {
        Some(path) => (read_us_from_json(path, threads)?, path.display().to_string()),
        None => {
            let row = FIG8A_READ_US.iter().find(|(t, _)| *t == threads).with_context(|| {
                format!("no Fig. 8a row for {threads} compute threads (docs/results.md has 0, 25, 50, 100, 200)")
            })?;
            (row.1, "docs/results.md Fig. 8a table".to_string())
        }
    };
    let ns = |us: f64| (us * 1000.0).round().max(0.0) as u64;
    // The loaded back end's delay in running its monitor thread: what a
    // Socket-Sync read waits for.
    let monitor_delay_ns = ns(read_us[1]);
    let period_ns = u64::try_from(config.interval.as_nanos())? + monitor_delay_ns;
    let schemes = Scheme::ALL
        .into_iter()
        .zip(read_us)
        .map(|(scheme, us)| SchemeModel {
            name: scheme.name().to_string(),
            read_ns: ns(us),
            sample_period_ns: match scheme {
                Scheme::SocketAsync | Scheme::RdmaAsync => period_ns,
                Scheme::SocketSync | Scheme::RdmaSync => 0,
            },
        })
        .collect();
    Ok(SchemeInputs { compute_threads: threads, source, schemes })
}

/// One configuration at one size, front-end count and load level, over seeds.
#[derive(Clone, Debug, Serialize)]
pub struct SimPoint {
    pub compute_threads: usize,
    pub backends: usize,
    pub front_ends: usize,
    pub clients: usize,
    pub background_clients: usize,
    pub balance: String,
    pub throughput_rps: Spread,
    pub throughput_vs_hash: Spread,
    pub p99_us: Spread,
    pub p99_vs_hash: Spread,
    pub utilization: f64,
    pub read_wait_us: f64,
}

#[derive(Serialize)]
pub struct ThroughputSimReport {
    pub cpu_cost: String,
    pub workers: usize,
    pub clients_per_worker: usize,
    pub alpha: f64,
    pub requests: u64,
    pub repeats: usize,
    pub inputs: Vec<SchemeInputs>,
    pub points: Vec<SimPoint>,
    pub runs: Vec<BalanceSimReport>,
}

pub fn run_throughput_sim(config: &ThroughputSimConfig) -> Result<ThroughputSimReport> {
    anyhow::ensure!(config.repeats > 0, "the simulated Fig. 8b needs at least one repeat");
    std::fs::create_dir_all(&config.out_dir)?;
    let cost = CpuCost::parse(&config.cpu_cost, 1).map_err(anyhow::Error::msg)?;
    let cost_ns = |u: f64| cost.quantile_us(u).saturating_mul(1000);
    let trace = Trace::zipf(config.alpha, config.docs)?;
    let mut report = ThroughputSimReport {
        cpu_cost: format!("{} (RUBiS-like)", config.cpu_cost),
        workers: config.workers,
        clients_per_worker: config.clients_per_worker,
        alpha: config.alpha,
        requests: config.requests,
        repeats: config.repeats,
        inputs: Vec::new(),
        points: Vec::new(),
        runs: Vec::new(),
    };
    for &threads in &config.compute_threads {
        let inputs = scheme_inputs(config, threads)?;
        // Hash first: the others are ratios against it.
        let mut balances: Vec<(String, Policy, Option<SchemeModel>)> = vec![
            ("hash".into(), Policy::Hash, None),
            ("round-robin".into(), Policy::RoundRobin, None),
            // Least-loaded on the front end's own requests alone (nginx's
            // least_conn): what the schemes add to it is their value.
            ("least-conn".into(), Policy::LeastLoaded, None),
        ];
        balances.extend(
            inputs.schemes.iter().map(|s| (format!("least-loaded/{}", s.name), Policy::LeastLoaded, Some(s.clone()))),
        );
        for &backends in &config.backends {
            for &front_ends in &config.front_ends {
                for &share in &config.second_service_share {
                    let all = backends * config.workers * config.clients_per_worker;
                    let background_clients = (all as f64 * share.clamp(0.0, 1.0)).round() as usize;
                    let clients = all.saturating_sub(background_clients).max(1);
                    let mut by_seed: Vec<Vec<BalanceSimReport>> = Vec::new();
                    for seed in 1..=config.repeats as u64 {
                        let mut runs = Vec::new();
                        for (_, policy, scheme) in &balances {
                            let sim = BalanceSimConfig {
                                backends,
                                workers: config.workers,
                                front_ends,
                                clients,
                                background_clients,
                                policy: *policy,
                                scheme: scheme.clone(),
                                warmup_requests: config.requests / 10,
                                requests: config.requests,
                                seed,
                            };
                            runs.push(run_balance(&sim, &trace, cost_ns)?);
                        }
                        by_seed.push(runs);
                    }
                    for (k, (label, _, _)) in balances.iter().enumerate() {
                        let of = |value: &dyn Fn(&BalanceSimReport, &BalanceSimReport) -> f64| {
                            let values: Vec<f64> = by_seed.iter().map(|runs| value(&runs[k], &runs[0])).collect();
                            Spread::of(&values).context("no seeds")
                        };
                        let mean = |value: fn(&BalanceSimReport) -> f64| {
                            by_seed.iter().map(|runs| value(&runs[k])).sum::<f64>() / by_seed.len() as f64
                        };
                        report.points.push(SimPoint {
                            compute_threads: threads,
                            backends,
                            front_ends,
                            clients,
                            background_clients,
                            balance: label.clone(),
                            throughput_rps: of(&|r, _| r.throughput_rps)?,
                            throughput_vs_hash: of(&|r, h| r.throughput_rps / h.throughput_rps.max(f64::MIN_POSITIVE))?,
                            p99_us: of(&|r, _| r.p99_us)?,
                            p99_vs_hash: of(&|r, h| r.p99_us / h.p99_us.max(f64::MIN_POSITIVE))?,
                            utilization: mean(|r| r.utilization),
                            read_wait_us: mean(|r| r.read_wait_us),
                        });
                    }
                    report.runs.extend(by_seed.into_iter().flatten());
                }
            }
        }
        report.inputs.push(inputs);
    }
    print(config, &report)?;
    Ok(report)
}

fn print(config: &ThroughputSimConfig, report: &ThroughputSimReport) -> Result<()> {
    for inputs in &report.inputs {
        let schemes: Vec<String> = inputs
            .schemes
            .iter()
            .map(|s| {
                let age = match s.sample_period_ns {
                    0 => "live".to_string(),
                    period => format!("sampled every {:.1} ms", period as f64 / 1e6),
                };
                format!("{}: read {:.1} µs, {age}", s.name, s.read_ns as f64 / 1000.0)
            })
            .collect();
        println!("inputs at {} compute threads ({}): {}", inputs.compute_threads, inputs.source, schemes.join("; "));
    }
    let mut table = Table::new(
        &format!(
            "Fig. 8b (simulated): {} workers per back end, {} client(s) per worker, RUBiS-like cost {}, Zipf {}; \
             median (min–max) over {} seed(s)",
            config.workers, config.clients_per_worker, config.cpu_cost, config.alpha, config.repeats
        ),
        &[
            "compute",
            "N",
            "F",
            "2nd svc",
            "balance",
            "req/s",
            "vs hash",
            "p99 ms",
            "p99 vs hash",
            "util",
            "read wait µs",
        ],
    );
    let show = |s: &Spread| format!("{:.2} ({:.2}–{:.2})", s.median, s.min, s.max);
    for p in &report.points {
        table.row(vec![
            p.compute_threads.to_string(),
            p.backends.to_string(),
            p.front_ends.to_string(),
            p.background_clients.to_string(),
            p.balance.clone(),
            format!("{:.0}", p.throughput_rps.median),
            show(&p.throughput_vs_hash),
            format!("{:.1}", p.p99_us.median / 1000.0),
            show(&p.p99_vs_hash),
            format!("{:.0}%", 100.0 * p.utilization),
            format!("{:.1}", p.read_wait_us),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out_dir.join("monitor_throughput_sim.json"), report)?;
    println!("wrote {}", config.out_dir.display());
    Ok(())
}
