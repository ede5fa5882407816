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

use crate::coop::{costs, load_average, paper_note, simulate, CoopBenchConfig, WEB_SERVERS};
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
    pub proxies: usize,
    pub schemes: Vec<String>,
    pub connections_per_proxy: usize,
    pub warm_up_ms: u64,
    pub duration_ms: u64,
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
            proxies: 2,
            schemes: crate::coop::SCHEMES.map(String::from).to_vec(),
            connections_per_proxy: 8,
            warm_up_ms: if quick { 1500 } else { 3000 },
            duration_ms: if quick { 3000 } else { 5000 },
            disk_seek_us: 2000,
            disk_mb_per_s: 40,
            seed: 1,
        }
    }
}

/// One scheme on one trace.
#[derive(Clone, Debug, Serialize)]
pub struct HttpRow {
    pub trace: String,
    pub scheme: String,
    pub proxies: usize,
    pub passive: usize,
    pub files: usize,
    pub pool_bytes_per_node: u64,
    pub throughput_rps: f64,
    pub vs_ac: f64,
    pub local_hit_pct: f64,
    pub remote_hit_pct: f64,
    pub miss_pct: f64,
    pub errors: u64,
    pub sim_throughput_per_s: f64,
    pub sim_vs_ac: f64,
    pub sim_local_hit_pct: f64,
    pub sim_remote_hit_pct: f64,
    pub sim_miss_pct: f64,
    pub paper: String,
    pub load_average: String,
}

fn coop_counts(admins: &[SocketAddr]) -> Result<(u64, u64, u64)> {
    let mut sum = (0, 0, 0);
    for admin in admins {
        let v: serde_json::Value = tierstack_deploy::deployment::get_json(*admin, "/_tierstack/coop")?;
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        sum = (sum.0 + n("local_hits"), sum.1 + n("remote_hits"), sum.2 + n("misses"));
    }
    Ok(sum)
}

/// Runs every trace × scheme; prints the table and writes `coop-http.json`.
pub fn run_http(config: &CoopHttpConfig) -> Result<Vec<HttpRow>> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let sim_config = CoopBenchConfig { scale: config.scale, ..CoopBenchConfig::new(config.out.clone(), true) };
    let costs = costs()?;
    let disk = tierstack_sim::DiskModel::new(config.disk_seek_us * 1000, config.disk_mb_per_s * 1_000_000)?;
    let mut rows: Vec<HttpRow> = Vec::new();
    for trace_name in &config.traces {
        let spec = format!("coop:{trace_name}@{}", config.scale);
        let trace = TraceSpec::parse(&spec, 0.0, 0)?.build(config.seed)?;
        let files = trace.documents().len();
        let file_bytes = trace.documents().first().map_or(0, |d| d.size_bytes);
        let cache = trace.cache_bytes_per_node().context("coop traces name their cache")?;
        let files_per_node = cache / file_bytes.max(1);
        let pool = files_per_node * u64::from(pages_for(file_bytes + ENTITY_OVERHEAD_BYTES)) * PAGE_BYTES;
        let mut group = Vec::new();
        for name in &config.schemes {
            let scheme: Scheme = name.parse()?;
            let passive = if scheme.uses_passive() { WEB_SERVERS } else { 0 };
            let load = load_average();
            let scratch = tempfile::Builder::new().prefix("tierstack-coop-http-").tempdir()?;
            let mut nodes: Vec<NodeLine> =
                (0..config.proxies as u32).map(|id| NodeLine { id, role: "proxy", cpu: None }).collect();
            nodes.extend((0..passive as u32).map(|i| NodeLine {
                id: config.proxies as u32 + i,
                role: "passive",
                cpu: None,
            }));
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
                let at = NodeArgs { topology: topology.clone(), node: (config.proxies + i) as u32 };
                let mut args = strings(&["coop-node"]);
                args.extend(at.to_args());
                args.extend(strings(&["--scheme", scheme.name()]));
                args.extend(coop.to_args());
                children.push(ChildNode::spawn(&config.exe, &args).context("starting a passive node")?);
            }
            let (mut urls, mut admins) = (Vec::new(), Vec::new());
            for node in 0..config.proxies as u32 {
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
                children.push(ChildNode::spawn(&config.exe, &args).with_context(|| format!("starting proxy {node}"))?);
                urls.push(format!("http://{listen}"));
                admins.push(admin);
            }
            let mut load_config = tierstack_loadgen::LoadConfig::new(urls[0].clone(), trace.clone());
            load_config.targets = urls.clone();
            load_config.connections = config.connections_per_proxy * config.proxies;
            load_config.update_interval_ms = 0;
            load_config.static_content = true;
            load_config.seed = config.seed;
            load_config.duration_ms = Some(config.warm_up_ms);
            runtime.block_on(tierstack_loadgen::run(load_config.clone()))?;
            let before = coop_counts(&admins)?;
            load_config.duration_ms = Some(config.duration_ms);
            load_config.seed = config.seed + 1;
            let report = runtime.block_on(tierstack_loadgen::run(load_config))?;
            let after = coop_counts(&admins)?;
            let (l, r, m) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
            let total = (l + r + m).max(1) as f64;
            let sim = simulate(&sim_config, &costs, disk, &trace, scheme, config.proxies)?;
            let c = |k: &str| sim.policy_counters.get(k).copied().unwrap_or(0) as f64;
            let sim_total = (c("coop_local_hits") + c("coop_remote_hits") + c("coop_misses")).max(1.0);
            group.push(HttpRow {
                trace: trace_name.clone(),
                scheme: name.clone(),
                proxies: config.proxies,
                passive,
                files,
                pool_bytes_per_node: pool,
                throughput_rps: report.throughput_rps,
                vs_ac: 0.0,
                local_hit_pct: 100.0 * l as f64 / total,
                remote_hit_pct: 100.0 * r as f64 / total,
                miss_pct: 100.0 * m as f64 / total,
                errors: report.errors.total(),
                sim_throughput_per_s: sim.throughput_per_s,
                sim_vs_ac: 0.0,
                sim_local_hit_pct: 100.0 * c("coop_local_hits") / sim_total,
                sim_remote_hit_pct: 100.0 * c("coop_remote_hits") / sim_total,
                sim_miss_pct: 100.0 * c("coop_misses") / sim_total,
                paper: paper_note(config.proxies, trace_name, name),
                load_average: load,
            });
            // Proxies first, then passive nodes and origins.
            while let Some(child) = children.pop() {
                drop(child);
            }
        }
        let ac = group.iter().find(|r| r.scheme == "ac").map(|r| (r.throughput_rps, r.sim_throughput_per_s));
        for r in &mut group {
            if let Some((ac, sim_ac)) = ac {
                r.vs_ac = r.throughput_rps / ac.max(1e-9);
                r.sim_vs_ac = r.sim_throughput_per_s / sim_ac.max(1e-9);
            }
        }
        rows.extend(group);
    }
    let mut table = Table::new(
        &format!(
            "coop with real processes ({} proxies + {WEB_SERVERS} origins (+{WEB_SERVERS} passive for MTACC/HYBCC), {}, scale {}, disk seek {} us, {} connections; sim = tierstack sim on the same scaled trace)",
            config.proxies,
            config.backend.name(),
            config.scale,
            config.disk_seek_us,
            config.connections_per_proxy * config.proxies
        ),
        &["trace", "scheme", "req/s", "vs AC", "local %", "remote %", "miss %", "errors", "sim vs AC", "sim local/remote/miss %", "paper", "load avg"],
    );
    for r in &rows {
        table.row(vec![
            r.trace.clone(),
            r.scheme.to_uppercase(),
            format!("{:.0}", r.throughput_rps),
            format!("{:.2}", r.vs_ac),
            format!("{:.1}", r.local_hit_pct),
            format!("{:.1}", r.remote_hit_pct),
            format!("{:.1}", r.miss_pct),
            r.errors.to_string(),
            format!("{:.2}", r.sim_vs_ac),
            format!("{:.0}/{:.0}/{:.0}", r.sim_local_hit_pct, r.sim_remote_hit_pct, r.sim_miss_pct),
            r.paper.clone(),
            r.load_average.clone(),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out.join("coop-http.json"), &rows)?;
    Ok(rows)
}
