//! The simulator's cooperative-caching costs derived from measurements
//! (issue 34), not chosen to match the paper: `bench coop --http` measures
//! Fig. 7 and the real processes first, then runs `tierstack sim` on the same
//! configuration with costs that come from them, each with its source:
//!
//! | constant | from |
//! |---|---|
//! | messages, one-sided writes, client network, copy rate | `costs/measured.toml` (`bench fabric`, `measure-http.sh`), the backend's transports |
//! | remote hit (one-sided read of an entity): latency, reader CPU | this run's Fig. 7: remote-hit p50 − local-hit p50, and the requester's CPU per remote − per local lookup (BCC, 2 proxies) |
//! | replica search (`lookup_fixed_ns`, `lookup_ns`) | 0: Fig. 7's local hit costs the same for every scheme (the replica is one hash map, searched in O(1)); what remains of a lookup is in `request_ns` |
//! | proxy CPU per request (`request_ns`) and per miss (`miss_cpu_ns`) | fitted to the AC runs only (AC has no remote hit and sends nothing): least squares of the real CPU per request against the simulator's response, over AC's traces and proxy counts |
//! | announce size (`announce_bytes`) | the proxies' own counters: announce bytes / announces over the cooperative schemes' runs |
//! | disk | the origins' emulated disk (an input of both) |
//!
//! Every cooperative row is then a prediction, and [`agreement`] states how
//! far the simulator is from the real runs.

use crate::coop::WEB_SERVERS;
use crate::coop_fig7::Fig7Row;
use crate::coop_http::{CoopHttpConfig, HttpRow};
use anyhow::{Context, Result};
use serde::Serialize;
use tierstack_coop::Scheme;
use tierstack_sim::coop::{Coop, CoopSim};
use tierstack_sim::{run, Budget, Costs, Load, SimConfig, SimReport, TransportChoice};
use tierstack_workload::{TargetChoice, Trace};

/// Warm-up and timed requests per document in a derived simulation.
const WARM_UP_PER_FILE: u64 = 10;
const REQUESTS_PER_FILE: u64 = 20;
/// Step of `request_ns` for the simulator's response to it.
const REQUEST_NS_STEP: u64 = 10_000;

/// One measured run of `bench coop --http`.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub proxies: usize,
    pub trace: String,
    pub scheme: String,
    pub repeat: usize,
    pub passive: usize,
    pub files: usize,
    pub pool_bytes_per_node: u64,
    pub requests: u64,
    pub throughput_rps: f64,
    /// Every server process's CPU-seconds over the measured window.
    pub cpu_s: f64,
    pub proxy_cpu_s: f64,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    pub announces: u64,
    pub announce_bytes: u64,
    pub errors: u64,
    pub load_average: String,
}

impl Sample {
    pub fn cpu_us_per_request(&self) -> f64 {
        self.cpu_s * 1e6 / self.requests.max(1) as f64
    }

    pub fn proxy_cpu_us_per_request(&self) -> f64 {
        self.proxy_cpu_s * 1e6 / self.requests.max(1) as f64
    }

    pub fn miss_fraction(&self) -> f64 {
        self.misses as f64 / (self.local_hits + self.remote_hits + self.misses).max(1) as f64
    }
}

/// The derived constants and where each came from.
#[derive(Clone, Debug, Serialize)]
pub struct Derived {
    pub backend: String,
    pub local_hit_ns: u64,
    pub remote_hit_ns: u64,
    pub local_cpu_ns: u64,
    pub remote_cpu_ns: u64,
    /// The one-sided read of an entity (remote − local hit).
    pub remote_read_latency_ns: u64,
    pub remote_read_cpu_ns: u64,
    /// Fitted per trace (file size) to AC and CCWR: proxy CPU per request
    /// and per miss beyond it, as (trace, request_ns, miss_cpu_ns).
    pub fits: Vec<(String, u64, u64)>,
    /// The fitted points: (proxies, trace, scheme, miss fraction, real CPU µs/request, simulated).
    pub fit_points: Vec<(usize, String, String, f64, f64, f64)>,
    /// What `request_ns` starts from (`costs/measured.toml`).
    pub request_ns: u64,
    pub announce_bytes: u64,
    pub costs: Costs,
}

impl Derived {
    pub fn render(&self) -> String {
        let mut s = format!(
            "derived simulator costs ({}): remote read {} ns and {} ns of reader CPU (Fig. 7: remote hit p50 {} ns − local {} ns; CPU {} − {} ns); announce {} bytes (the proxies' counters); replica search 0 (Fig. 7: the same local hit for every scheme)\n  fitted to AC and CCWR per trace (trace: request ns, miss ns of proxy CPU):",
            self.backend,
            self.remote_read_latency_ns,
            self.remote_read_cpu_ns,
            self.remote_hit_ns,
            self.local_hit_ns,
            self.remote_cpu_ns,
            self.local_cpu_ns,
            self.announce_bytes
        );
        for (t, r, m) in &self.fits {
            s.push_str(&format!(" {t}: {r}, {m};"));
        }
        s.push_str("\n  points (proxies, trace, scheme, miss, real CPU us/req, fitted sim CPU us/req):");
        for (p, t, scheme, m, real, sim) in &self.fit_points {
            s.push_str(&format!(" ({p}, {t}, {scheme}, {m:.2}, {real:.0}, {sim:.0})"));
        }
        s
    }
}

/// Percent of local hits, remote hits and misses of a simulated coop run.
pub trait CoopCounts {
    fn coop_count(&self, key: &str) -> f64;
    fn coop_total(&self) -> f64 {
        (self.coop_count("coop_local_hits") + self.coop_count("coop_remote_hits") + self.coop_count("coop_misses"))
            .max(1.0)
    }
    fn local_hit_pct(&self) -> f64 {
        100.0 * self.coop_count("coop_local_hits") / self.coop_total()
    }
    fn remote_hit_pct(&self) -> f64 {
        100.0 * self.coop_count("coop_remote_hits") / self.coop_total()
    }
    fn miss_pct(&self) -> f64 {
        100.0 * self.coop_count("coop_misses") / self.coop_total()
    }
}

impl CoopCounts for SimReport {
    fn coop_count(&self, key: &str) -> f64 {
        self.policy_counters.get(key).copied().unwrap_or(0) as f64
    }
}

/// One derived simulation and what the table needs of it.
pub struct SimRun {
    pub report: SimReport,
}

impl SimRun {
    /// Every node's CPU per request, µs.
    pub fn cpu_us_per_request(&self) -> f64 {
        let busy: u64 = self.report.per_node.iter().map(|n| n.cpu_busy_ns).sum();
        busy as f64 / 1e3 / self.report.requests.max(1) as f64
    }

    pub fn announces_per_request(&self) -> f64 {
        let n = self.report.messages.get("announce").map_or(0, |m| m.messages);
        n as f64 / self.report.requests.max(1) as f64
    }
}

fn base_costs(backend: tierstack_cluster::Backend) -> Result<Costs> {
    let prefix = backend.name();
    Ok(Costs::resolve("measured")?.with_choice(TransportChoice {
        messages: format!("{prefix}-message"),
        remote_read: format!("{prefix}-read"),
        remote_write: format!("{prefix}-write"),
    })?)
}

/// Derives the simulator's costs from Fig. 7 and the samples (see the module docs).
pub fn derive(config: &CoopHttpConfig, fig7: &[Fig7Row], samples: &[Sample]) -> Result<Derived> {
    let kind = |k: &str| {
        fig7.iter().find(|r| r.kind == k && r.scheme == "bcc").with_context(|| format!("Fig. 7 has no BCC {k} row"))
    };
    let (local, remote) = (kind("local")?, kind("remote")?);
    let mut costs = base_costs(config.backend)?;
    let read = costs.cluster.remote_read.clone();
    let transport = costs.transports.get_mut(&read).context("the backend's read transport")?;
    transport.latency_ns = remote.p50_ns.saturating_sub(local.p50_ns).max(1);
    transport.sender_cpu_ns = remote.cpu_ns.saturating_sub(local.cpu_ns).min(transport.latency_ns);
    // The bytes' time is inside the measured latency (8 KiB entities).
    transport.bandwidth_bytes_per_s = 1_000_000_000_000;
    let (announces, announce_bytes) = samples
        .iter()
        .filter(|s| !matches!(s.scheme.as_str(), "ac" | "groupcache"))
        .fold((0u64, 0u64), |t, s| (t.0 + s.announces, t.1 + s.announce_bytes));
    let mut derived = Derived {
        backend: config.backend.name().into(),
        local_hit_ns: local.p50_ns,
        remote_hit_ns: remote.p50_ns,
        local_cpu_ns: local.cpu_ns,
        remote_cpu_ns: remote.cpu_ns,
        remote_read_latency_ns: transport.latency_ns,
        remote_read_cpu_ns: transport.sender_cpu_ns,
        request_ns: costs.cpu.request_ns,
        fits: Vec::new(),
        fit_points: Vec::new(),
        announce_bytes: announce_bytes.checked_div(announces).unwrap_or(0),
        costs,
    };
    for trace_name in &config.traces {
        fit_trace(config, &mut derived, samples, trace_name)?;
    }
    Ok(derived)
}

/// The schemes the CPU costs are fitted to: AC (no remote hit, no
/// message) and CCWR (remote hits at Fig. 7's measured cost); every other
/// scheme is a prediction.
pub const FIT_SCHEMES: [&str; 2] = ["ac", "ccwr"];

/// Least squares, for one trace (one file size), of the real CPU per
/// request of [`FIT_SCHEMES`] against the simulator's response to
/// `request_ns` and `miss_cpu_ns` (linear: a request pays one, a miss the other).
fn fit_trace(config: &CoopHttpConfig, derived: &mut Derived, samples: &[Sample], trace_name: &str) -> Result<()> {
    let disk = tierstack_sim::DiskModel::new(config.disk_seek_us * 1000, config.disk_mb_per_s * 1_000_000)?;
    let trace = tierstack_workload::TraceSpec::parse(&format!("coop:{trace_name}@{}", config.scale), 0.0, 0)?
        .build(config.seed)?;
    let r0 = derived.request_ns;
    // (proxies, scheme, real, base, per µs of request_ns, miss fraction).
    let mut points = Vec::new();
    for &proxies in &config.proxies {
        for name in FIT_SCHEMES {
            let runs: Vec<&Sample> =
                samples.iter().filter(|s| s.scheme == name && s.proxies == proxies && s.trace == trace_name).collect();
            if runs.is_empty() {
                continue;
            }
            let real = runs.iter().map(|s| s.cpu_us_per_request()).sum::<f64>() / runs.len() as f64;
            let at = |request_ns: u64| -> Result<(f64, f64)> {
                let mut d = derived.clone();
                d.fits = vec![(trace_name.to_string(), request_ns, 0)];
                let run = simulate_derived(config, &d, disk, &trace, name.parse()?, proxies)?;
                Ok((run.cpu_us_per_request(), run.report.miss_pct() / 100.0))
            };
            let (base, miss) = at(r0)?;
            let (stepped, _) = at(r0 + REQUEST_NS_STEP)?;
            let per_us = (stepped - base) / (REQUEST_NS_STEP as f64 / 1e3);
            points.push((proxies, name, real, base, per_us, miss));
        }
    }
    // real ≈ base + k·Δr + m·M (µs): solve for Δr and M.
    let (mut skk, mut skm, mut smm, mut sky, mut smy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(_, _, real, base, k, m) in &points {
        let y = real - base;
        skk += k * k;
        skm += k * m;
        smm += m * m;
        sky += k * y;
        smy += m * y;
    }
    let det = skk * smm - skm * skm;
    let (dr_us, miss_us) = if points.len() >= 2 && det.abs() > 1e-9 {
        ((sky * smm - smy * skm) / det, (skk * smy - skm * sky) / det)
    } else if skk > 0.0 {
        (sky / skk, 0.0)
    } else {
        (0.0, 0.0)
    };
    let request_ns = (r0 as f64 + dr_us * 1e3).max(0.0).round() as u64;
    let miss_ns = (miss_us * 1e3).max(0.0).round() as u64;
    derived.fits.push((trace_name.to_string(), request_ns, miss_ns));
    for &(p, name, real, base, k, m) in &points {
        let fitted = base + k * (request_ns as f64 - r0 as f64) / 1e3 + m * miss_ns as f64 / 1e3;
        derived.fit_points.push((p, trace_name.to_string(), name.to_string(), m, real, fitted));
    }
    Ok(())
}

/// `scheme` on the real run's configuration with the derived costs.
pub fn simulate_derived(
    config: &CoopHttpConfig,
    derived: &Derived,
    disk: tierstack_sim::DiskModel,
    trace: &Trace,
    scheme: Scheme,
    proxies: usize,
) -> Result<SimRun> {
    // The model counts body pages only, so the paper's cache in bytes is
    // the pool that holds as many entities as the real proxies' pools do.
    let pool = trace.cache_bytes_per_node().context("coop traces name their cache")?;
    let size = trace.documents().first().map_or(0, |d| d.size_bytes);
    let fit = derived.fits.iter().find(|f| f.0 == crate::coop_derive::trace_of_size(size));
    let files = trace.documents().len() as u64;
    let sim = CoopSim {
        scheme,
        proxies,
        backends: WEB_SERVERS,
        cache_bytes: pool,
        lookup_ns: 0,
        lookup_fixed_ns: 0,
        announce_bytes: derived.announce_bytes,
        miss_cpu_ns: fit.map_or(0, |f| f.2),
    };
    let mut costs = derived.costs.clone();
    costs.cpu.request_ns = fit.map_or(derived.request_ns, |f| f.1);
    let engine = SimConfig {
        nodes: proxies + WEB_SERVERS,
        client_nodes: Some(proxies),
        load: Load::Closed {
            clients: proxies * config.connections_per_proxy,
            budget: Budget::Total(files * REQUESTS_PER_FILE),
        },
        target_choice: TargetChoice::RoundRobin,
        new_connection_per_request: false,
        cache_bytes: 0,
        cache_max_object_bytes: None,
        disk,
        costs,
        seed: config.seed,
    };
    let mut policy = Coop::new(sim)?;
    policy.warm_up(trace, config.seed ^ 0x5741_524d, (files * WARM_UP_PER_FILE) as usize);
    Ok(SimRun { report: run(&engine, trace, policy)? })
}

/// The coop trace whose files are `bytes` long ("8k" for 8 KiB).
pub fn trace_of_size(bytes: u64) -> String {
    format!("{}k", bytes >> 10)
}

/// How far the derived simulator is from the real runs, over `rows`: the
/// largest gap in hit split (percentage points), and the range and median
/// of its CPU per request against the real one. Throughput is not compared:
/// the engine gives every node a core, the host shares 2 among every
/// process (and other work), so only per-request figures can agree.
pub fn agreement(rows: &[HttpRow]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let mut split = 0.0f64;
    let mut cpu = Vec::new();
    for r in rows {
        split = split
            .max((r.sim_local_hit_pct - r.local_hit_pct).abs())
            .max((r.sim_remote_hit_pct - r.remote_hit_pct).abs())
            .max((r.sim_miss_pct - r.miss_pct).abs());
        cpu.push(100.0 * (r.sim_cpu_us_per_request / r.cpu_us_per_request.max(1e-9) - 1.0));
    }
    let range = |v: &[f64]| {
        (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
    };
    let (cpu_lo, cpu_hi) = range(&cpu);
    let mut gaps: Vec<f64> = cpu.iter().map(|e| e.abs()).collect();
    gaps.sort_by(f64::total_cmp);
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or(f64::NAN);
    let within = gaps.iter().filter(|&&g| g <= 20.0).count();
    Some(format!(
        "agreement of the derived simulator with the real runs over {} rows: hit split within {split:.1} points; CPU per request {cpu_lo:+.0}% to {cpu_hi:+.0}% (median gap {median:.0}%, {within} rows within 20%); throughput not compared (one core per simulated node, 2 shared cores here)",
        rows.len()
    ))
}
