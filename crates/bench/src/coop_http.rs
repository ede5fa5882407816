//! `tierstack bench coop --http`: the cooperative caching schemes with real
//! processes — `tierstack origin` web servers (an emulated disk per miss, no
//! memory cache), `tierstack proxy --coop <scheme>` proxies with no private
//! cache (the pool is the cache) and, for MTACC and HYBCC, `tierstack
//! coop-node` passive back-end memory nodes; `tierstack_loadgen`'s closed
//! loop over the proxies (every request naming the proxy itself, so every
//! proxy pools under one key). Hit rates come from the proxies' own
//! counters (`/_tierstack/coop`), measured after a warm-up; the simulator's
//! run of the same scaled trace and the paper's statement are printed
//! beside each row.
//!
//! **Scaling.** A trace `coop:<size>@<scale>` has `10240 × scale` files and
//! publishes `64 MiB × scale` of cache per node (Table 1's ratios). In the
//! pool an entity is the body plus the stored response head and the
//! envelope (a few hundred bytes), rounded up to 4 KiB pages: an 8 KiB
//! file takes 3 pages, not 2. So each node's pool is sized to hold as many
//! *entities* as the paper's cache holds *files*: `files per node ×
//! pages per entity × 4 KiB`. The ratio of working set to aggregate cache
//! is then the paper's, counted in files.
//!
//! **Repeats and CPU (issue 34).** Every proxy count × trace × scheme runs
//! `repeats` times, the schemes interleaved within a repeat (so a change of
//! the host's load hits every scheme alike); each run reads the CPU time
//! (utime + stime from `/proc`) of every server process (proxies, passive
//! nodes, origins) over the measured window: CPU-seconds per request
//! survive a loaded host better than rates. Rows give the median and the
//! spread (lowest–highest) over the repeats.
//!
//! **The simulator beside.** Two columns: `tierstack sim` with the seeds'
//! costs and the calibrated constants of `bench coop` (as before), and with
//! costs derived from this run's own measurements ([`crate::coop_derive`]).

use crate::coop::{costs, load_average, paper_note, simulate, CoopBenchConfig, WEB_SERVERS};
use crate::coop_derive::{derive, simulate_derived, CoopCounts, Derived, Sample};
use crate::http2::cpu_seconds;
use crate::report::{write_json, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_cluster::{Backend, NodeArgs};
use tierstack_coop::args::CoopArgs;
use tierstack_coop::{pages_for, Scheme, PAGE_BYTES};
use tierstack_deploy::deployment::{proxy, strings};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_origin::OriginArgs;
use tierstack_proxy::{CacheMode, ProxyArgs};
use tierstack_workload::TraceSpec;

/// Bytes an entity takes in the pool beyond its body, at most (the stored
/// head of an origin response, the envelope's key): for sizing pools.
pub const ENTITY_OVERHEAD_BYTES: u64 = 1024;

/// What to run.
#[derive(Clone, Debug)]
pub struct CoopHttpConfig {
    pub exe: PathBuf,
    pub out: PathBuf,
    pub backend: Backend,
    pub traces: Vec<String>,
    pub scale: f64,
    /// Proxy counts to run (each with 2 origins, and 2 passive nodes for MTACC/HYBCC).
    pub proxies: Vec<usize>,
    pub schemes: Vec<String>,
    pub connections_per_proxy: usize,
    pub warm_up_ms: u64,
    pub duration_ms: u64,
    pub repeats: usize,
    /// The web servers' emulated disk: positioning time per read.
    pub disk_seek_us: u64,
    pub disk_mb_per_s: u64,
    pub seed: u64,
}

impl CoopHttpConfig {
    pub fn new(exe: PathBuf, out: PathBuf, quick: bool) -> Self {
        Self {
            exe,
            out,
            backend: Backend::Shm,
            traces: if quick {
                vec!["8k".into(), "32k".into()]
            } else {
                ["8k", "16k", "32k", "64k"].map(String::from).to_vec()
            },
            scale: if quick { 0.01 } else { 0.02 },
            proxies: if quick { vec![2] } else { vec![2, 4] },
            schemes: crate::coop::SCHEMES.map(String::from).to_vec(),
            connections_per_proxy: if quick { 4 } else { 8 },
            warm_up_ms: if quick { 500 } else { 3000 },
            duration_ms: if quick { 1000 } else { 5000 },
            repeats: if quick { 1 } else { 3 },
            disk_seek_us: 2000,
            disk_mb_per_s: 40,
            seed: 1,
        }
    }
}

/// One scheme on one trace and proxy count: medians (and spreads) over the repeats.
#[derive(Clone, Debug, Serialize)]
pub struct HttpRow {
    pub trace: String,
    pub scheme: String,
    pub proxies: usize,
    pub passive: usize,
    pub files: usize,
    pub pool_bytes_per_node: u64,
    pub repeats: usize,
    pub throughput_rps: f64,
    pub throughput_min_rps: f64,
    pub throughput_max_rps: f64,
    pub vs_ac: f64,
    /// Server processes' CPU-microseconds per request (proxies, passive nodes, origins).
    pub cpu_us_per_request: f64,
    pub cpu_min_us_per_request: f64,
    pub cpu_max_us_per_request: f64,
    /// Of which the proxies'.
    pub proxy_cpu_us_per_request: f64,
    pub local_hit_pct: f64,
    pub remote_hit_pct: f64,
    pub miss_pct: f64,
    /// Announces the proxies sent per request (the soft state's broadcast).
    pub announces_per_request: f64,
    pub errors: u64,
    /// `tierstack sim` with the seeds' costs and bench coop's calibration.
    pub sim_seeds_vs_ac: f64,
    pub sim_seeds_local_hit_pct: f64,
    pub sim_seeds_remote_hit_pct: f64,
    pub sim_seeds_miss_pct: f64,
    /// `tierstack sim` with the costs derived from this run: its throughput
    /// (one core per node, as the engine models nodes) and its AC CPU per
    /// request over this row's (the ratio if CPU were the only limit; the
    /// real AC is bound by the origins' disks).
    pub sim_throughput_per_s: f64,
    pub sim_vs_ac: f64,
    pub sim_cpu_vs_ac: f64,
    pub sim_cpu_us_per_request: f64,
    pub sim_local_hit_pct: f64,
    pub sim_remote_hit_pct: f64,
    pub sim_miss_pct: f64,
    pub sim_announces_per_request: f64,
    pub paper: String,
    pub load_average: String,
}

/// Everything `--http` writes.
#[derive(Clone, Debug, Serialize)]
pub struct HttpReport {
    pub rows: Vec<HttpRow>,
    pub samples: Vec<Sample>,
    pub derived: Derived,
    pub backend: String,
}

/// The proxies' pooled counts: (local hits, remote hits, misses, announces, announce bytes).
fn coop_counts(admins: &[SocketAddr]) -> Result<[u64; 5]> {
    let mut sum = [0; 5];
    for admin in admins {
        let v: serde_json::Value = tierstack_deploy::deployment::get_json(*admin, "/_tierstack/coop")?;
        for (i, k) in ["local_hits", "remote_hits", "misses"].iter().enumerate() {
            sum[i] += v[k].as_u64().unwrap_or(0);
        }
        // The service's own counters.
        sum[3] += v["service"]["announces"].as_u64().unwrap_or(0);
        sum[4] += v["service"]["announce_bytes"].as_u64().unwrap_or(0);
    }
    Ok(sum)
}

/// Pool bytes per node for `trace`: as many entities as the paper's cache holds files.
fn pool_bytes(trace: &tierstack_workload::Trace) -> Result<u64> {
    let file_bytes = trace.documents().first().map_or(0, |d| d.size_bytes);
    let cache = trace.cache_bytes_per_node().context("coop traces name their cache")?;
    let files_per_node = cache / file_bytes.max(1);
    Ok(files_per_node * u64::from(pages_for(file_bytes + ENTITY_OVERHEAD_BYTES)) * PAGE_BYTES)
}

/// One measured run of `scheme` on `trace_name` with `proxies` proxies.
fn run_once(
    config: &CoopHttpConfig,
    runtime: &tokio::runtime::Runtime,
    proxies: usize,
    trace_name: &str,
    scheme: Scheme,
    repeat: usize,
) -> Result<Sample> {
    let spec = format!("coop:{trace_name}@{}", config.scale);
    let trace = TraceSpec::parse(&spec, 0.0, 0)?.build(config.seed)?;
    let pool = pool_bytes(&trace)?;
    let passive = if scheme.uses_passive() { WEB_SERVERS } else { 0 };
    let load = load_average();
    let scratch = tempfile::Builder::new().prefix("tierstack-coop-http-").tempdir()?;
    let mut nodes: Vec<NodeLine> = (0..proxies as u32).map(|id| NodeLine { id, role: "proxy", cpu: None }).collect();
    nodes.extend((0..passive as u32).map(|i| NodeLine { id: proxies as u32 + i, role: "passive", cpu: None }));
    let topology = write_topology(scratch.path(), "coophttp", config.backend, 1000, &nodes)?;
    let mut children = Vec::new();
    let mut origins = Vec::new();
    for _ in 0..WEB_SERVERS {
        let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
        let origin = OriginArgs {
            admin: Some(admin),
            seed: config.seed,
            cache_bytes: Some(0),
            disk_seek_us: Some(config.disk_seek_us),
            disk_mb_per_s: Some(config.disk_mb_per_s as f64),
            ..OriginArgs::for_trace(listen, spec.clone())
        };
        let mut args = strings(&["origin"]);
        args.extend(origin.to_args());
        children.push(ChildNode::spawn(&config.exe, &args).context("starting an origin")?);
        origins.push(format!("http://{listen}"));
    }
    let coop = CoopArgs { pool_bytes: pool, ..CoopArgs::default() };
    for i in 0..passive {
        let at = NodeArgs { topology: topology.clone(), node: (proxies + i) as u32 };
        let mut args = strings(&["coop-node"]);
        args.extend(at.to_args());
        args.extend(strings(&["--scheme", scheme.name()]));
        args.extend(coop.to_args());
        children.push(ChildNode::spawn(&config.exe, &args).context("starting a passive node")?);
    }
    let (mut urls, mut admins, mut proxy_pids) = (Vec::new(), Vec::new(), Vec::new());
    for node in 0..proxies as u32 {
        let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
        let proxy = ProxyArgs {
            upstreams: origins.clone(),
            coop: Some(scheme),
            coop_args: coop.clone(),
            cache_bytes: 0,
            refresh_hot: 0,
            state_slots: 0,
            ..proxy(listen, admin, CacheMode::Ttl, &topology, node)
        };
        let mut args = strings(&["proxy"]);
        args.extend(proxy.to_args());
        let child = ChildNode::spawn(&config.exe, &args).with_context(|| format!("starting proxy {node}"))?;
        proxy_pids.push(child.pid());
        children.push(child);
        urls.push(format!("http://{listen}"));
        admins.push(admin);
    }
    let pids: Vec<u32> = children.iter().map(ChildNode::pid).collect();
    let mut load_config = tierstack_loadgen::LoadConfig::new(urls[0].clone(), trace.clone());
    load_config.targets = urls.clone();
    load_config.connections = config.connections_per_proxy * proxies;
    load_config.update_interval_ms = 0;
    load_config.static_content = true;
    load_config.seed = config.seed;
    load_config.duration_ms = Some(config.warm_up_ms);
    runtime.block_on(tierstack_loadgen::run(load_config.clone()))?;
    let before = coop_counts(&admins)?;
    let (cpu_before, proxy_cpu_before) = (cpu_seconds(&pids), cpu_seconds(&proxy_pids));
    load_config.duration_ms = Some(config.duration_ms);
    load_config.seed = config.seed + 1 + repeat as u64;
    let report = runtime.block_on(tierstack_loadgen::run(load_config))?;
    let (cpu_after, proxy_cpu_after) = (cpu_seconds(&pids), cpu_seconds(&proxy_pids));
    let after = coop_counts(&admins)?;
    // Proxies first, then passive nodes and origins.
    while let Some(child) = children.pop() {
        drop(child);
    }
    let d = |i: usize| after[i].saturating_sub(before[i]);
    Ok(Sample {
        proxies,
        trace: trace_name.to_string(),
        scheme: scheme.name().to_string(),
        repeat,
        passive,
        files: trace.documents().len(),
        pool_bytes_per_node: pool,
        requests: report.requests,
        throughput_rps: report.throughput_rps,
        cpu_s: cpu_after - cpu_before,
        proxy_cpu_s: proxy_cpu_after - proxy_cpu_before,
        local_hits: d(0),
        remote_hits: d(1),
        misses: d(2),
        announces: d(3),
        announce_bytes: d(4),
        errors: report.errors.total(),
        load_average: load,
    })
}

/// The median (of an even count, the mean of the middle two).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(v: &[f64]) -> (f64, f64) {
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// Runs every proxy count × trace × scheme `repeats` times; prints the
/// table and writes `coop-http.json`.
pub fn run_http(config: &CoopHttpConfig) -> Result<HttpReport> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // Fig. 7 on this backend first: the remote hit's cost the derived simulator uses.
    let fig7 = crate::coop_fig7::Fig7Config {
        backends: vec![config.backend],
        schemes: vec!["bcc".into()],
        proxies: vec![2],
        ..crate::coop_fig7::Fig7Config::new(config.exe.clone(), config.out.clone(), true)
    };
    let fig7 = crate::coop_fig7::run_fig7(&fig7)?;
    let mut samples = Vec::new();
    for &proxies in &config.proxies {
        for trace_name in &config.traces {
            for repeat in 0..config.repeats {
                for name in &config.schemes {
                    let scheme: Scheme = name.parse()?;
                    samples.push(run_once(config, &runtime, proxies, trace_name, scheme, repeat)?);
                }
            }
        }
    }
    let derived = derive(config, &fig7, &samples)?;
    let sim_config = CoopBenchConfig { scale: config.scale, ..CoopBenchConfig::new(config.out.clone(), true) };
    let seeds_costs = costs()?;
    let disk = tierstack_sim::DiskModel::new(config.disk_seek_us * 1000, config.disk_mb_per_s * 1_000_000)?;
    let mut rows: Vec<HttpRow> = Vec::new();
    for &proxies in &config.proxies {
        for trace_name in &config.traces {
            let trace = TraceSpec::parse(&format!("coop:{trace_name}@{}", config.scale), 0.0, 0)?.build(config.seed)?;
            let mut group = Vec::new();
            for name in &config.schemes {
                let scheme: Scheme = name.parse()?;
                let runs: Vec<&Sample> = samples
                    .iter()
                    .filter(|s| s.proxies == proxies && &s.trace == trace_name && &s.scheme == name)
                    .collect();
                let Some(first) = runs.first() else { continue };
                let rps: Vec<f64> = runs.iter().map(|s| s.throughput_rps).collect();
                let cpu: Vec<f64> = runs.iter().map(|s| s.cpu_us_per_request()).collect();
                let (lo, hi) = spread(&rps);
                let (cpu_lo, cpu_hi) = spread(&cpu);
                let (l, r, m, a): (u64, u64, u64, u64) = runs.iter().fold((0, 0, 0, 0), |t, s| {
                    (t.0 + s.local_hits, t.1 + s.remote_hits, t.2 + s.misses, t.3 + s.announces)
                });
                let total = (l + r + m).max(1) as f64;
                let seeds = simulate(&sim_config, &seeds_costs, disk, &trace, scheme, proxies)?;
                let sim = simulate_derived(config, &derived, disk, &trace, scheme, proxies)?;
                group.push(HttpRow {
                    trace: trace_name.clone(),
                    scheme: name.clone(),
                    proxies,
                    passive: first.passive,
                    files: first.files,
                    pool_bytes_per_node: first.pool_bytes_per_node,
                    repeats: runs.len(),
                    throughput_rps: median(rps.clone()),
                    throughput_min_rps: lo,
                    throughput_max_rps: hi,
                    vs_ac: 0.0,
                    cpu_us_per_request: median(cpu.clone()),
                    cpu_min_us_per_request: cpu_lo,
                    cpu_max_us_per_request: cpu_hi,
                    proxy_cpu_us_per_request: median(runs.iter().map(|s| s.proxy_cpu_us_per_request()).collect()),
                    local_hit_pct: 100.0 * l as f64 / total,
                    remote_hit_pct: 100.0 * r as f64 / total,
                    miss_pct: 100.0 * m as f64 / total,
                    announces_per_request: a as f64 / total,
                    errors: runs.iter().map(|s| s.errors).sum(),
                    sim_seeds_vs_ac: seeds.throughput_per_s,
                    sim_seeds_local_hit_pct: seeds.local_hit_pct(),
                    sim_seeds_remote_hit_pct: seeds.remote_hit_pct(),
                    sim_seeds_miss_pct: seeds.miss_pct(),
                    sim_throughput_per_s: sim.report.throughput_per_s,
                    sim_vs_ac: 0.0,
                    sim_cpu_vs_ac: 0.0,
                    sim_cpu_us_per_request: sim.cpu_us_per_request(),
                    sim_local_hit_pct: sim.report.local_hit_pct(),
                    sim_remote_hit_pct: sim.report.remote_hit_pct(),
                    sim_miss_pct: sim.report.miss_pct(),
                    sim_announces_per_request: sim.announces_per_request(),
                    paper: paper_note(proxies, trace_name, name),
                    load_average: runs.iter().map(|s| s.load_average.as_str()).collect::<Vec<_>>().join("; "),
                });
            }
            let ac = group.iter().find(|r| r.scheme == "ac").map(|r| {
                (
                    r.throughput_rps.max(1e-9),
                    r.sim_seeds_vs_ac.max(1e-9),
                    r.sim_throughput_per_s.max(1e-9),
                    r.sim_cpu_us_per_request,
                )
            });
            if let Some((ac, seeds_ac, sim_ac, sim_ac_cpu)) = ac {
                for r in &mut group {
                    r.vs_ac = r.throughput_rps / ac;
                    r.sim_seeds_vs_ac /= seeds_ac;
                    r.sim_vs_ac = r.sim_throughput_per_s / sim_ac;
                    r.sim_cpu_vs_ac = sim_ac_cpu / r.sim_cpu_us_per_request.max(1e-9);
                }
            }
            rows.extend(group);
        }
    }
    print_http(config, &derived, &rows);
    let report = HttpReport { rows, samples, derived, backend: config.backend.name().into() };
    write_json(&config.out.join("coop-http.json"), &report)?;
    Ok(report)
}

fn print_http(config: &CoopHttpConfig, derived: &Derived, rows: &[HttpRow]) {
    let mut table = Table::new(
        &format!(
            "coop Fig. 5/6 with real processes ({} proxies + {WEB_SERVERS} origins (+{WEB_SERVERS} passive for MTACC/HYBCC), {}, scale {}, disk seek {} us, {} connections per proxy, {} repeats: median (lowest-highest)); sim = tierstack sim on the same configuration with the costs derived from this run, sim(seeds) = bench coop's seed-calibrated costs",
            config.proxies.iter().map(usize::to_string).collect::<Vec<_>>().join("/"),
            config.backend.name(),
            config.scale,
            config.disk_seek_us,
            config.connections_per_proxy,
            config.repeats,
        ),
        &["proxies", "trace", "scheme", "req/s", "vs AC", "CPU us/req", "proxy CPU us/req", "local/remote/miss %", "announces/req", "errors", "sim vs AC (CPU only)", "sim vs AC (own cores)", "sim CPU us/req", "sim local/remote/miss %", "sim announces/req", "sim(seeds) vs AC", "paper"],
    );
    for r in rows {
        table.row(vec![
            r.proxies.to_string(),
            r.trace.clone(),
            r.scheme.to_uppercase(),
            format!("{:.0} ({:.0}-{:.0})", r.throughput_rps, r.throughput_min_rps, r.throughput_max_rps),
            format!("{:.2}", r.vs_ac),
            format!("{:.0} ({:.0}-{:.0})", r.cpu_us_per_request, r.cpu_min_us_per_request, r.cpu_max_us_per_request),
            format!("{:.0}", r.proxy_cpu_us_per_request),
            format!("{:.0}/{:.0}/{:.0}", r.local_hit_pct, r.remote_hit_pct, r.miss_pct),
            format!("{:.2}", r.announces_per_request),
            r.errors.to_string(),
            format!("{:.2}", r.sim_cpu_vs_ac),
            format!("{:.2}", r.sim_vs_ac),
            format!("{:.0}", r.sim_cpu_us_per_request),
            format!("{:.0}/{:.0}/{:.0}", r.sim_local_hit_pct, r.sim_remote_hit_pct, r.sim_miss_pct),
            format!("{:.2}", r.sim_announces_per_request),
            format!("{:.2}", r.sim_seeds_vs_ac),
            r.paper.clone(),
        ]);
    }
    println!("{}", table.render());
    println!("{}", derived.render());
    if let Some(bound) = crate::coop_derive::agreement(rows) {
        println!("{bound}");
    }
}
