//! `tierstack bench press`: the PRESS paper's experiments on real
//! `tierstack press-node` processes on this host.
//!
//! - **Fig. 3** (TCP vs Base per trace): throughput of PRESS over the `tcp`
//!   and `base` versions, with the paper's gain of Base over TCP beside ours.
//! - **Fig. 4** (remote writes over Base): RDMA-1c's throughput gain over
//!   Base per trace (the paper: "does not significantly improve") and
//!   RDMA's (the paper: +11 % to +23 %) and Zero's (+15 % to +29 %; Zero
//!   over TCP up to +52 %).
//! - **Table 2**: messages and KiB per 1,000 requests, per type, summed over
//!   the nodes' send counters, with the paper's Clarknet values beside ours.
//! - **Fig. 5**: throughput against the number of nodes, traditional vs
//!   PRESS (tcp and base), as many nodes as this host takes.
//! - **Traditional comparison**: PRESS-Base over the traditional server per
//!   trace on the largest node count, the paper's 8-node gains beside ours.
//!
//! Every run: the nodes start, a closed-loop client (`tierstack_loadgen`,
//! one new connection per request, targets chosen at random, as the paper's
//! clients) warms the caches, then measures for the run's duration. Node
//! counters are read before and after the measurement and subtracted. Only
//! ratios measured in one invocation are compared, and the load average is
//! printed beside them: this host's cores are shared.

use crate::html::Page;
use crate::owner::{write_topology, ChildNode, NodeLine};
use crate::report::{bar_chart, line_plot, write_json, Axes, BarGroup, Series, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_cluster::Backend;
use tierstack_loadgen::{LoadConfig, TargetChoice};
use tierstack_press::{Counts, MsgType};
use tierstack_press_node::NodeStats;
use tierstack_workload::{Trace, TraceSpec};

/// The paper's Base-VIA gain over TCP on 8 nodes, Fig. 3 (§4.2): only the
/// extremes are stated (6 % Rutgers, 28 % Nasa).
const PAPER_FIG3: [(&str, Option<f64>); 5] =
    [("clarknet", None), ("nasa", Some(28.0)), ("rutgers", Some(6.0)), ("usask", None), ("wc98", None)];

/// PRESS over the traditional server on 8 nodes (§4.3), percent.
const PAPER_VS_TRADITIONAL: [(&str, f64); 5] =
    [("clarknet", 64.0), ("nasa", 18.0), ("rutgers", 173.0), ("usask", 38.0), ("wc98", 91.0)];

/// Table 2, version Base, Clarknet: (type, msgs per 1K, KB per 1K, avg bytes).
const PAPER_TABLE2_BASE: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 435.3, 1.7, 4.0),
    (MsgType::Forward, 766.7, 40.3, 55.1),
    (MsgType::Caching, 0.8, 0.1, 59.1),
    (MsgType::File, 766.7, 6646.9, 9091.2),
];

/// Table 2, version RDMA-1c, Clarknet (caching: 0.0 messages, avg N/A).
const PAPER_TABLE2_RDMA1C: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 1362.0, 17.4, 13.1),
    (MsgType::Forward, 778.2, 45.0, 59.2),
    (MsgType::Caching, 0.0, 0.0, f64::NAN),
    (MsgType::File, 778.2, 6815.7, 8968.0),
];

/// Table 2, version RDMA, Clarknet.
const PAPER_TABLE2_RDMA: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 1475.0, 18.9, 13.1),
    (MsgType::Forward, 842.9, 48.6, 59.1),
    (MsgType::Caching, 0.0, 0.0, f64::NAN),
    (MsgType::File, 842.9, 7417.8, 9012.0),
];

/// The systems of Fig. 5 (the paper's: Traditional, PRESS-Base, PRESS-Zero
/// and the hand-off servers; hand-off is not built here).
const FIG5_SYSTEMS: [&str; 4] = ["traditional", "press-tcp", "press-base", "press-zero"];

/// Table 2, version Zero, Clarknet.
const PAPER_TABLE2_ZERO: [(MsgType, f64, f64, f64); 4] = [
    (MsgType::Flow, 1477.1, 18.9, 13.1),
    (MsgType::Forward, 844.1, 48.8, 59.2),
    (MsgType::Caching, 0.002, 0.0001, 63.1),
    (MsgType::File, 844.1, 7433.3, 9018.0),
];

/// What `bench press` runs.
pub struct PressBenchConfig {
    /// The `tierstack` executable.
    pub exe: PathBuf,
    pub out: PathBuf,
    /// Traces by PRESS name (clarknet, nasa, rutgers, usask, wc98).
    pub traces: Vec<String>,
    /// Scale of the synthesized traces (files and caches).
    pub scale: f64,
    /// Node counts for Fig. 5; the largest is used for Fig. 3 and Table 2.
    pub nodes: Vec<usize>,
    pub duration_s: u64,
    pub warmup_s: u64,
    /// Closed-loop client connections.
    pub connections: usize,
    /// Emulated disk (seek µs, MB/s), every node.
    pub disk: (u64, f64),
}

impl PressBenchConfig {
    pub fn new(exe: PathBuf, out: PathBuf, quick: bool) -> Self {
        PressBenchConfig {
            exe,
            out,
            traces: if quick {
                vec!["clarknet".into()]
            } else {
                PAPER_VS_TRADITIONAL.iter().map(|t| t.0.into()).collect()
            },
            scale: 0.01,
            nodes: if quick { vec![1, 2] } else { vec![1, 2, 3, 4] },
            duration_s: if quick { 2 } else { 6 },
            warmup_s: if quick { 1 } else { 2 },
            connections: 16,
            disk: (8_000, 40.0),
        }
    }
}

/// One measured run.
#[derive(Clone, Debug, Serialize)]
pub struct PressRun {
    pub trace: String,
    pub system: String,
    pub nodes: usize,
    pub throughput_rps: f64,
    pub latency_mean_ms: f64,
    pub requests: u64,
    pub errors: u64,
    pub forwarded_pct: f64,
    /// Global hit rate over every served read (THR).
    pub hit_rate_pct: f64,
    pub disk_reads: u64,
    pub messages: [u64; 4],
    pub bytes: [u64; 4],
    pub load_average: f64,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

struct Node {
    child: ChildNode,
    listen: SocketAddr,
    admin: SocketAddr,
}

fn trace_name(trace: &str, scale: f64) -> String {
    format!("press:{trace}@{scale}")
}

/// Starts the cluster, warms it, measures; every node stopped on return.
fn run_one(config: &PressBenchConfig, trace: &str, system: &str, nodes: usize) -> Result<PressRun> {
    let (mode, transport) = match system {
        "traditional" => ("traditional", "base"),
        "press-tcp" => ("press", "tcp"),
        "press-rdma-1c" => ("press", "rdma-1c"),
        "press-rdma" => ("press", "rdma"),
        "press-zero" => ("press", "zero"),
        _ => ("press", "base"),
    };
    let backend = if transport == "tcp" { Backend::Tcp } else { Backend::Shm };
    let dir = tempfile::tempdir()?;
    let lines: Vec<NodeLine> = (0..nodes as u32).map(|id| NodeLine { id, role: "proxy", cpu: None }).collect();
    let name = format!("press-{}-{system}-{nodes}", std::process::id());
    let topology = write_topology(dir.path(), &name, backend, 2000, &lines)?;
    let spec = trace_name(trace, config.scale);
    let mut running = Vec::new();
    for id in 0..nodes {
        let (listen, admin) = (crate::owner::free_loopback_port()?, crate::owner::free_loopback_port()?);
        let args: Vec<String> = [
            "press-node",
            "--topology",
            topology.to_str().context("topology path")?,
            "--node",
            &id.to_string(),
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
            "--mode",
            mode,
            "--transport",
            transport,
            "--trace",
            &spec,
            "--disk-seek-us",
            &config.disk.0.to_string(),
            "--disk-mb-per-s",
            &config.disk.1.to_string(),
            "--threads",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        running.push(Node { child: ChildNode::spawn(&config.exe, &args)?, listen, admin });
    }
    let trace_built: Trace = TraceSpec::parse(&spec, 1.0, 10)?.build(1)?;
    let targets: Vec<String> = running.iter().map(|n| format!("http://{}", n.listen)).collect();
    let load = |duration_s: u64, seed: u64| -> Result<tierstack_loadgen::LoadReport> {
        let mut load = LoadConfig::new(targets[0].clone(), trace_built.clone());
        load.targets = targets.clone();
        load.connections = config.connections;
        load.duration_ms = Some(duration_s * 1000);
        load.update_interval_ms = 0;
        load.seed = seed;
        load.target_choice = TargetChoice::Random;
        load.new_connection_per_request = true;
        load.static_content = true;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        Ok(runtime.block_on(tierstack_loadgen::run(load))?)
    };
    load(config.warmup_s, 7)?;
    let before: Vec<NodeStats> =
        running.iter().map(|n| crate::deploy::get_json(n.admin, "/stats")).collect::<Result<_>>()?;
    let report = load(config.duration_s, 1)?;
    let after: Vec<NodeStats> =
        running.iter().map(|n| crate::deploy::get_json(n.admin, "/stats")).collect::<Result<_>>()?;
    let load_average = load_average();
    for node in running {
        node.child.finish().with_context(|| format!("stopping a {system} node"))?;
    }
    let d =
        |f: fn(&NodeStats) -> u64| -> u64 { after.iter().zip(&before).map(|(a, b)| f(a).saturating_sub(f(b))).sum() };
    let counts = after.iter().zip(&before).fold(Counts::default(), |c, (a, b)| c.plus(&a.counts().since(&b.counts())));
    let requests = d(|s| s.requests);
    let (hits, misses) = (d(|s| s.cache_hits), d(|s| s.cache_misses));
    Ok(PressRun {
        trace: trace.to_string(),
        system: system.to_string(),
        nodes,
        throughput_rps: report.throughput_rps,
        latency_mean_ms: report.latency.mean_ns / 1e6,
        requests,
        errors: report.errors.total(),
        forwarded_pct: if requests == 0 { 0.0 } else { 100.0 * d(|s| s.forwarded) as f64 / requests as f64 },
        hit_rate_pct: if hits + misses == 0 { 0.0 } else { 100.0 * hits as f64 / (hits + misses) as f64 },
        disk_reads: d(|s| s.disk_reads),
        messages: counts.messages,
        bytes: counts.bytes,
        load_average,
    })
}

fn gain(new: f64, base: f64) -> f64 {
    if base > 0.0 {
        100.0 * (new / base - 1.0)
    } else {
        f64::NAN
    }
}

/// Runs every experiment, prints the tables, writes JSON and SVG plots into
/// `config.out`.
pub fn run(config: &PressBenchConfig) -> Result<Vec<PressRun>> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let largest = config.nodes.iter().copied().max().unwrap_or(2).max(2);
    let mut runs = Vec::new();
    // Fig. 3, traditional comparison and Table 2: per trace on the largest cluster.
    for trace in &config.traces {
        for system in ["press-tcp", "press-base", "press-rdma-1c", "press-rdma", "press-zero", "traditional"] {
            eprintln!("bench press: {trace} {system} on {largest} nodes");
            runs.push(run_one(config, trace, system, largest)?);
        }
    }
    // Fig. 5: Clarknet (or the first trace) against the node count.
    let fig5_trace = config.traces.iter().find(|t| *t == "clarknet").unwrap_or(&config.traces[0]).clone();
    for &nodes in config.nodes.iter().filter(|&&n| n != largest) {
        for system in FIG5_SYSTEMS {
            eprintln!("bench press: {fig5_trace} {system} on {nodes} nodes");
            runs.push(run_one(config, &fig5_trace, system, nodes)?);
        }
    }
    write_json(&config.out.join("runs.json"), &runs)?;
    let mut page = Page::new("tierstack bench press: PRESS (Carrera and Bianchini), Fig. 3-5 and Table 2");
    page.paragraph(&format!(
        "{} nodes per trace, traces at scale {}, {} closed-loop connections (a new connection per request, random \
         targets), {} s measured after {} s of warm-up per run; the load average is printed beside each row.",
        largest, config.scale, config.connections, config.duration_s, config.warmup_s
    ));
    let find = |trace: &str, system: &str, nodes: usize| {
        runs.iter().find(|r| r.trace == trace && r.system == system && r.nodes == nodes)
    };
    let mut fig3 = Table::new(
        &format!("Fig. 3: PRESS over TCP vs Base, {largest} nodes (paper: 8 nodes, VIA vs TCP over cLAN)"),
        &["trace", "TCP req/s", "Base req/s", "Base over TCP", "paper", "load avg"],
    );
    let mut vs_trad = Table::new(
        &format!("PRESS vs traditional, {largest} nodes (paper: PRESS-Zero, 8 nodes)"),
        &["trace", "traditional req/s", "PRESS-Base req/s", "gain", "paper", "Fwd %", "THR %", "trad HR %"],
    );
    for trace in &config.traces {
        let (Some(tcp), Some(base), Some(trad)) = (
            find(trace, "press-tcp", largest),
            find(trace, "press-base", largest),
            find(trace, "traditional", largest),
        ) else {
            continue;
        };
        let paper = PAPER_FIG3.iter().find(|p| p.0 == trace).and_then(|p| p.1);
        fig3.row(vec![
            trace.clone(),
            format!("{:.0}", tcp.throughput_rps),
            format!("{:.0}", base.throughput_rps),
            format!("{:+.1} %", gain(base.throughput_rps, tcp.throughput_rps)),
            paper.map(|p| format!("{p:+.0} %")).unwrap_or_else(|| "6..28 %".into()),
            format!("{:.2}", base.load_average),
        ]);
        let paper = PAPER_VS_TRADITIONAL.iter().find(|p| p.0 == trace).map(|p| p.1);
        vs_trad.row(vec![
            trace.clone(),
            format!("{:.0}", trad.throughput_rps),
            format!("{:.0}", base.throughput_rps),
            format!("{:+.1} %", gain(base.throughput_rps, trad.throughput_rps)),
            paper.map(|p| format!("{p:+.0} %")).unwrap_or_default(),
            format!("{:.1}", base.forwarded_pct),
            format!("{:.1}", base.hit_rate_pct),
            format!("{:.1}", trad.hit_rate_pct),
        ]);
    }
    page.print(&fig3);
    let mut fig4 = Table::new(
        &format!("Fig. 4: remote-write versions over Base, {largest} nodes (paper: 8 nodes)"),
        &[
            "trace",
            "Base req/s",
            "RDMA-1c req/s",
            "RDMA req/s",
            "Zero req/s",
            "RDMA-1c/Base",
            "paper",
            "RDMA/Base",
            "paper",
            "Zero/Base",
            "paper",
            "Zero/TCP",
            "paper",
            "load avg",
        ],
    );
    const PAPER_FIG4_RDMA: [(&str, &str); 5] = [
        ("clarknet", "11..23 %"),
        ("nasa", "11..23 %"),
        ("rutgers", "+23 %"),
        ("usask", "11..23 %"),
        ("wc98", "+11 %"),
    ];
    const PAPER_FIG4_ZERO: [(&str, &str); 5] = [
        ("clarknet", "15..29 %"),
        ("nasa", "15..29 %"),
        ("rutgers", "+29 %"),
        ("usask", "15..29 %"),
        ("wc98", "+15 %"),
    ];
    for trace in &config.traces {
        let (Some(tcp), Some(base), Some(rdma1c), Some(rdma), Some(zero)) = (
            find(trace, "press-tcp", largest),
            find(trace, "press-base", largest),
            find(trace, "press-rdma-1c", largest),
            find(trace, "press-rdma", largest),
            find(trace, "press-zero", largest),
        ) else {
            continue;
        };
        fig4.row(vec![
            trace.clone(),
            format!("{:.0}", base.throughput_rps),
            format!("{:.0}", rdma1c.throughput_rps),
            format!("{:.0}", rdma.throughput_rps),
            format!("{:.0}", zero.throughput_rps),
            format!("{:+.1} %", gain(rdma1c.throughput_rps, base.throughput_rps)),
            "≈ 0".into(),
            format!("{:+.1} %", gain(rdma.throughput_rps, base.throughput_rps)),
            PAPER_FIG4_RDMA.iter().find(|p| p.0 == trace).map(|p| p.1).unwrap_or("").into(),
            format!("{:+.1} %", gain(zero.throughput_rps, base.throughput_rps)),
            PAPER_FIG4_ZERO.iter().find(|p| p.0 == trace).map(|p| p.1).unwrap_or("").into(),
            format!("{:+.1} %", gain(zero.throughput_rps, tcp.throughput_rps)),
            "up to +52 %".into(),
            format!("{:.2}", zero.load_average),
        ]);
    }
    page.print(&fig4);
    page.print(&vs_trad);
    let table2_trace = &fig5_trace;
    for system in ["press-base", "press-rdma-1c", "press-rdma", "press-zero", "press-tcp"] {
        let Some(run) = find(table2_trace, system, largest) else { continue };
        let (paper_rows, paper_total, paper_name) = match system {
            "press-rdma-1c" => (&PAPER_TABLE2_RDMA1C, ("2918.4", "6878.1"), "RDMA-1c"),
            "press-rdma" => (&PAPER_TABLE2_RDMA, ("3160.8", "7485.3"), "RDMA"),
            "press-zero" => (&PAPER_TABLE2_ZERO, ("3165.3", "7501.0"), "Zero"),
            _ => (&PAPER_TABLE2_BASE, ("1969.5", "6689.0"), "Base"),
        };
        let mut t2 = Table::new(
            &format!(
                "Table 2: {system}, {table2_trace}, {largest} nodes, per 1,000 requests (paper: {paper_name}, Clarknet, 8 nodes)"
            ),
            &["type", "msgs", "paper msgs", "KiB", "paper KB", "avg bytes", "paper avg"],
        );
        let counts = Counts { messages: run.messages, bytes: run.bytes };
        let mut total = (0.0, 0.0);
        for row in counts.table2(run.requests) {
            let paper = paper_rows.iter().find(|p| p.0 == row.kind);
            total.0 += row.messages_per_k;
            total.1 += row.kbytes_per_k;
            t2.row(vec![
                row.kind.name().into(),
                format!("{:.1}", row.messages_per_k),
                paper.map(|p| format!("{:.1}", p.1)).unwrap_or_default(),
                format!("{:.1}", row.kbytes_per_k),
                paper.map(|p| format!("{:.1}", p.2)).unwrap_or_default(),
                row.avg_bytes.map(|a| format!("{a:.1}")).unwrap_or_else(|| "N/A".into()),
                paper.map(|p| if p.3.is_nan() { "N/A".into() } else { format!("{:.1}", p.3) }).unwrap_or_default(),
            ]);
        }
        t2.row(vec![
            "TOTAL".into(),
            format!("{:.1}", total.0),
            paper_total.0.into(),
            format!("{:.1}", total.1),
            paper_total.1.into(),
            "–".into(),
            "–".into(),
        ]);
        page.print(&t2);
    }
    let mut fig5 = Table::new(
        &format!("Fig. 5: throughput vs nodes, {fig5_trace} (req/s)"),
        &["nodes", "traditional", "PRESS-TCP", "PRESS-Base", "PRESS-Zero", "load avg"],
    );
    let mut series: Vec<Series> = Vec::new();
    for system in FIG5_SYSTEMS {
        let mut points = Vec::new();
        for &n in &config.nodes {
            if let Some(r) = find(&fig5_trace, system, n) {
                points.push((n as f64, r.throughput_rps));
            }
        }
        series.push(Series { label: system.into(), points });
    }
    for &n in &config.nodes {
        let cell = |s: &str| find(&fig5_trace, s, n).map(|r| format!("{:.0}", r.throughput_rps)).unwrap_or_default();
        let la = find(&fig5_trace, "press-base", n).map(|r| format!("{:.2}", r.load_average)).unwrap_or_default();
        fig5.row(vec![
            n.to_string(),
            cell("traditional"),
            cell("press-tcp"),
            cell("press-base"),
            cell("press-zero"),
            la,
        ]);
    }
    page.print(&fig5);
    let axes = Axes { x_label: "nodes", y_label: "throughput (requests/s)", log_x: false, log_y: false };
    line_plot(&config.out.join("fig5.svg"), &format!("Fig. 5: throughput vs nodes, {fig5_trace}"), axes, &series)?;
    let categories: Vec<String> = config.traces.clone();
    let groups: Vec<BarGroup> = ["press-tcp", "press-base", "press-rdma-1c", "press-rdma", "press-zero", "traditional"]
        .iter()
        .map(|s| BarGroup {
            label: s.to_string(),
            values: categories.iter().map(|t| find(t, s, largest).map(|r| r.throughput_rps).unwrap_or(0.0)).collect(),
        })
        .collect();
    let axes = Axes { x_label: "trace", y_label: "throughput (requests/s)", log_x: false, log_y: false };
    bar_chart(
        &config.out.join("fig3.svg"),
        &format!("Fig. 3 and traditional, {largest} nodes"),
        axes,
        &categories,
        &groups,
    )?;
    for plot in ["fig3.svg", "fig5.svg"] {
        page.plot(&config.out.join(plot))?;
    }
    page.write(&config.out)?;
    Ok(runs)
}
