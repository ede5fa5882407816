//! `tierstack bench coop --figure 7`: the coop seed's Fig. 7 ("Bookkeeping
//! and Lookup delay") measured on real processes: the cost of each kind of
//! lookup the schemes make, at the requesting proxy, on the shm and tcp
//! backends.
//!
//! Every node is a `tierstack coop-bench-node` process ([`crate::coop_nodes`])
//! running the fabric service (`tierstack_coop::service::CoopNode`). Node 0
//! measures; node 1 (another proxy) stores the entities node 0 reads
//! remotely; the other proxies and the passive back ends only take part
//! (homes, announces, replicas). Per scheme, backend and proxy count, node 0
//! times one round after another over `keys` entities of `entity_bytes`:
//! - **local hit**: an entity in node 0's own pool (`get`);
//! - **remote hit**: an entity in node 1's pool, read one-sidedly by the
//!   cooperative schemes, asked of its owner by groupcache's two-sided GET
//!   (node 0's copy is dropped after the clock stops, so every round reads
//!   remotely again);
//! - **home read**: Cache Validate of a key another node is home of (one
//!   metadata read of the home's key table).
//!
//! Per kind: the median and p99 of each round, their spread over rounds, and
//! CPU per lookup, both the calling thread's (clock_gettime per lookup) and
//! node 1's whole process over the remote round (what the holder pays:
//! nothing on shm, its transport thread on tcp, plus the home's messages).

use crate::coop_nodes::CoopProcesses;
use crate::report::{write_json, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_coop::{pages_for, PAGE_BYTES};

/// Keys node 1 stores (node 0's are 0..keys).
const REMOTE_KEYS: u64 = 1 << 32;
/// Bound on the announces' settling after the stores.
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Clone, Debug)]
pub struct Fig7Config {
    pub exe: PathBuf,
    pub out: PathBuf,
    pub backends: Vec<Backend>,
    pub schemes: Vec<String>,
    /// Proxy counts (node 0 and node 1 among them); 2 passive nodes besides.
    pub proxies: Vec<usize>,
    pub passive: usize,
    pub keys: u64,
    pub rounds: usize,
    pub entity_bytes: u64,
}

impl Fig7Config {
    pub fn new(exe: PathBuf, out: PathBuf, quick: bool) -> Self {
        Self {
            exe,
            out,
            backends: vec![Backend::Shm, Backend::Tcp],
            schemes: ["bcc", "ccwr", "mtacc", "hybcc", "groupcache"].map(String::from).to_vec(),
            proxies: if quick { vec![2] } else { vec![2, 4, 8] },
            passive: 2,
            keys: if quick { 100 } else { 500 },
            rounds: if quick { 3 } else { 7 },
            entity_bytes: 8 << 10,
        }
    }
}

/// One lookup kind of one scheme on one backend and proxy count.
#[derive(Clone, Debug, Serialize)]
pub struct Fig7Row {
    pub backend: String,
    pub proxies: usize,
    pub scheme: String,
    pub kind: String,
    pub lookups: usize,
    /// Lookups that did not find what the kind expects (groupcache's keys
    /// owned by node 0 are local hits, not remote).
    pub unexpected: u64,
    /// Median over rounds of each round's p50, and the rounds' lowest and highest p50.
    pub p50_ns: u64,
    pub p50_min_ns: u64,
    pub p50_max_ns: u64,
    /// Median over rounds of each round's p99.
    pub p99_ns: u64,
    /// The requesting thread's CPU per lookup.
    pub cpu_ns: u64,
    /// Node 1's process CPU per lookup over the rounds (the holder and, for
    /// some keys, the home).
    pub peer_cpu_ns: u64,
    pub load_average: String,
}

/// The seed's Fig. 7 for a kind, where the seed (or its hardware) gives one.
pub fn paper_fig7(kind: &str) -> &'static str {
    match kind {
        "local" => "CCWR bookkeeping ≈5-10% of an 8 KB request (≈10-20 µs of 200 µs); grows with nodes",
        "remote" => "IB RDMA Read of 8 KB ≈20 µs (10.5 µs + 8 KB at 840 MB/s, coh §5.1)",
        "home" => "IB RDMA Read of an entry ≈10.5 µs (coh §5.1)",
        _ => "",
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Runs every backend × proxy count × scheme; prints and writes `fig7.json`.
pub fn run_fig7(config: &Fig7Config) -> Result<Vec<Fig7Row>> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let entity_pages = u64::from(pages_for(config.entity_bytes));
    // Room for both sets with no eviction at any node (a lookup, not a replacement, is timed).
    let pool = (2 * config.keys * entity_pages + 64) * PAGE_BYTES;
    let mut rows = Vec::new();
    for &backend in &config.backends {
        for &proxies in &config.proxies {
            for scheme in &config.schemes {
                rows.extend(measure(config, backend, proxies, scheme, pool)?);
            }
        }
    }
    let mut table = Table::new(
        &format!(
            "coop Fig. 7 measured: lookup cost per kind at the requesting proxy ({} entities of {} KiB, {} rounds, {} build; node processes: proxies + {} passive)",
            config.keys,
            config.entity_bytes >> 10,
            config.rounds,
            if cfg!(debug_assertions) { "debug" } else { "release" },
            config.passive
        ),
        &["backend", "proxies", "scheme", "lookup", "p50 us (min-max over rounds)", "p99 us", "CPU us/lookup", "holder CPU us/lookup", "n", "unexpected", "paper (Fig. 7 / seed hardware)", "load avg"],
    );
    for r in &rows {
        table.row(vec![
            r.backend.clone(),
            r.proxies.to_string(),
            r.scheme.to_uppercase(),
            r.kind.clone(),
            format!("{:.1} ({:.1}-{:.1})", r.p50_ns as f64 / 1e3, r.p50_min_ns as f64 / 1e3, r.p50_max_ns as f64 / 1e3),
            format!("{:.1}", r.p99_ns as f64 / 1e3),
            format!("{:.1}", r.cpu_ns as f64 / 1e3),
            format!("{:.1}", r.peer_cpu_ns as f64 / 1e3),
            r.lookups.to_string(),
            r.unexpected.to_string(),
            paper_fig7(&r.kind).to_string(),
            r.load_average.clone(),
        ]);
    }
    println!("{}", table.render());
    write_json(&config.out.join("fig7.json"), &rows)?;
    Ok(rows)
}

fn measure(config: &Fig7Config, backend: Backend, proxies: usize, scheme: &str, pool: u64) -> Result<Vec<Fig7Row>> {
    let scratch = tempfile::Builder::new().prefix("tierstack-coop-fig7-").tempdir()?;
    let (active, passive) = (u32::try_from(proxies)?, u32::try_from(config.passive)?);
    anyhow::ensure!(active >= 2, "Fig. 7 needs 2 proxies at least (one measures, one holds)");
    let mut nodes = CoopProcesses::spawn(&config.exe, backend, active, passive, scratch.path())?;
    for index in 0..nodes.count() {
        nodes.call(index, &format!("start {scheme} {pool} {active} {passive}"))?;
    }
    nodes.call(0, &format!("put 0 {} {}", config.keys, config.entity_bytes))?;
    nodes.call(1, &format!("put {REMOTE_KEYS} {} {}", config.keys, config.entity_bytes))?;
    nodes.settle(SETTLE_BOUND)?;
    let mut rows = Vec::new();
    for kind in ["local", "remote", "home"] {
        let first = if kind == "local" { 0 } else { REMOTE_KEYS };
        let load = crate::coop::load_average();
        let (mut p50s, mut p99s, mut lookups, mut unexpected, mut cpu) = (Vec::new(), Vec::new(), 0, 0u64, 0u64);
        let peer_before = nodes.cpu_ns(1)?;
        for _ in 0..config.rounds {
            let reply = nodes.call(0, &format!("time {kind} {first} {}", config.keys))?;
            let mut words = reply.split_whitespace().map(str::parse::<u64>);
            unexpected += words.next().context("time: unexpected")??;
            cpu += words.next().context("time: cpu")??;
            let samples = words.collect::<Result<Vec<u64>, _>>()?;
            lookups += samples.len();
            if !samples.is_empty() {
                let s = tierstack_stats::summarize(samples);
                p50s.push(s.p50_ns);
                p99s.push(s.p99_ns);
            }
            // The remote rounds' drops announce; let them land before the next round.
            nodes.settle(SETTLE_BOUND)?;
        }
        let peer_cpu = nodes.cpu_ns(1)?.saturating_sub(peer_before);
        let per = |ns: u64| if lookups == 0 { 0 } else { ns / lookups as u64 };
        rows.push(Fig7Row {
            backend: backend.name().into(),
            proxies,
            scheme: scheme.into(),
            kind: kind.into(),
            lookups,
            unexpected,
            p50_ns: median(p50s.clone()),
            p50_min_ns: p50s.iter().copied().min().unwrap_or(0),
            p50_max_ns: p50s.iter().copied().max().unwrap_or(0),
            p99_ns: median(p99s),
            cpu_ns: per(cpu),
            peer_cpu_ns: per(peer_cpu),
            load_average: load,
        });
    }
    Ok(rows)
}
