//! `tierstack ddss-daemon` and `tierstack ddss-client`: the DDSS node daemon
//! (the paper's Fig. 2 IPC management) and a client process that runs a
//! randomized history through it, for the multi-process tests and benchmarks.
//!
//! A client process is a *passive* node of the topology: it has its own
//! fabric endpoint (its data path, one-sided gets and puts on the members'
//! regions) but no region of its own, and it reaches allocation and the
//! member list through its node's daemon socket (the control path). Daemons
//! therefore place data only on the topology's non-passive nodes.

use super::NodeArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use tierstack_base::host_monotonic_ns as monotonic_ns;
use tierstack_base::{seeded_rng, NodeId};
use tierstack_cluster::{Role, Topology};
use tierstack_ddss::ipc::{DdssClient, DdssDaemon};
use tierstack_ddss::{Ddss, DdssConfig, DdssStats, Key};

#[derive(Args)]
pub(crate) struct DaemonArgs {
    #[command(flatten)]
    at: NodeArgs,
    /// The control socket to listen on (a stale one is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Accepted for compatibility: standard input is ignored unless
    /// --stop-on-stdin-eof is given.
    #[arg(long, hide = true, conflicts_with = "stop_on_stdin_eof")]
    ignore_stdin: bool,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
}

#[derive(Args)]
pub(crate) struct ClientArgs {
    /// This process's own node: a passive node of the topology, its data-path endpoint.
    #[command(flatten)]
    at: NodeArgs,
    /// The control socket of this node's daemon.
    #[arg(long)]
    socket: PathBuf,
    /// A key to operate on and the number of operations to run on it, as KEY:OPS (repeatable).
    /// Operations on all keys are shuffled together.
    #[arg(long = "key", value_parser = parse_key_ops, required = true)]
    keys: Vec<(Key, usize)>,
    /// Client id in the printed events (default: the node id).
    #[arg(long)]
    client: Option<u32>,
    /// Percent of operations that are puts.
    #[arg(long, default_value_t = 40)]
    put_percent: u32,
    /// Longest value written (also bounded by each key's capacity).
    #[arg(long, default_value_t = 64)]
    value_bytes_max: usize,
    /// Seed of the operation mix and value lengths.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A random pause of up to this many microseconds after each operation,
    /// which spreads the history over time (for temporal coherence).
    #[arg(long, default_value_t = 0)]
    think_us_max: u64,
    /// Get and put through the daemon (the proxied fallback) instead of this
    /// process's own one-sided data path.
    #[arg(long)]
    via_daemon: bool,
    /// After `ready`, wait for a line on standard input before starting, so
    /// that all clients start together.
    #[arg(long)]
    wait_go: bool,
}

fn parse_key_ops(text: &str) -> Result<(Key, usize), String> {
    let (key, ops) = text.split_once(':').ok_or_else(|| format!("expected KEY:OPS, got {text:?}"))?;
    let key = key.parse::<Key>().map_err(|e| format!("bad key in {text:?}: {e}"))?;
    let ops = ops.parse::<usize>().map_err(|e| format!("bad operation count in {text:?}: {e}"))?;
    Ok((key, ops))
}

/// The nodes that hold DDSS regions: every node of the topology but the passive ones.
pub(crate) fn members(topology: &Topology) -> Vec<NodeId> {
    topology.nodes.iter().filter(|n| n.role != Role::Passive).map(|n| n.id).collect()
}

pub(crate) fn stats_json(stats: &DdssStats) -> Value {
    json!({
        "gets_from_copy": stats.gets_from_copy,
        "gets_validated": stats.gets_validated,
        "gets_fetched": stats.gets_fetched,
        "gets_locked": stats.gets_locked,
        "puts": stats.puts,
        "lock_retries": stats.lock_retries,
        "lock_takeovers": stats.lock_takeovers,
        "values_lost": stats.values_lost,
        "allocations": stats.allocations,
        "frees": stats.frees,
    })
}

/// Starts the node's substrate, serves it on the socket, prints `ready`,
/// serves as a service (`crate::service`: until SIGTERM/SIGINT, or its
/// standard input's end with `--stop-on-stdin-eof`), then stops
/// the daemon (closing its clients and removing the socket) and prints one
/// JSON line with the daemon handle's own counters.
pub(crate) fn run_daemon(args: DaemonArgs) -> Result<()> {
    let node = args.at.id();
    let (topology, fabric) = args.at.open()?;
    let members = members(&topology);
    if !members.contains(&node) {
        bail!("{node} is passive in the topology: a daemon runs on a node that holds a region");
    }
    let ddss = Arc::new(
        Ddss::start(fabric, DdssConfig::default().with_members(members))
            .with_context(|| format!("starting the substrate on {node}"))?,
    );

    // Registered before `ready`, so a stop asked for right after is not lost.
    let stopped = args.service.stop_watch_thread()?;
    let daemon = DdssDaemon::serve(ddss.clone(), &args.socket)
        .with_context(|| format!("serving on {}", args.socket.display()))?;
    crate::service::announce_ready()?;

    let reason = stopped.recv().map(|cause| cause.name()).unwrap_or("stop watcher gone");
    tracing::info!(%node, reason, "DDSS daemon stopping");
    daemon.stop();
    println!("{}", json!({ "stopped": reason, "node": node.0, "stats": stats_json(&ddss.stats()) }));
    std::io::stdout().flush()?;
    Ok(())
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes a client writes in its `n`-th put: distinct per (client, n) and
/// position, so a torn or misattributed value cannot pass the checkers.
pub(crate) fn pattern(client: u32, n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (client as usize * 97 + n * 31 + i * 7) as u8).collect()
}

/// Connects to the daemon, attaches the data path, prints `ready`, runs the
/// shuffled operations, then prints one JSON line per event and a last line
/// with the counters.
pub(crate) fn run_client(args: ClientArgs) -> Result<()> {
    let client_id = args.client.unwrap_or(args.at.node);
    let (_, fabric) = args.at.open()?;
    let mut control = DdssClient::connect(&args.socket)?;
    // This process's own one-sided data path, or none: the daemon performs the gets and puts.
    let data_path =
        if args.via_daemon { None } else { Some(control.attach_data_path(fabric).context("attaching the data path")?) };
    let mut rng = seeded_rng(args.seed);
    let mut schedule: Vec<usize> = args.keys.iter().enumerate().flat_map(|(i, (_, ops))| vec![i; *ops]).collect();
    schedule.shuffle(&mut rng);
    crate::service::announce_ready()?;
    if args.wait_go {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
    }

    let mut events = Vec::with_capacity(schedule.len());
    for (n, index) in schedule.into_iter().enumerate() {
        let key = args.keys[index].0;
        let is_put = rng.gen_range(0..100) < args.put_percent;
        let len_max = args.value_bytes_max.min(key.capacity_bytes() as usize);
        let value = if is_put { pattern(client_id, n, rng.gen_range(0..=len_max)) } else { Vec::new() };
        let start_ns = monotonic_ns();
        let (version, bytes) = match (&data_path, is_put) {
            (Some(ddss), true) => (ddss.put(key, &value)?, value),
            (Some(ddss), false) => ddss.get(key)?,
            (None, true) => (control.put(key, &value)?, value),
            (None, false) => control.get(key)?,
        };
        // A reading after the operation; at least one tick after the start,
        // which only widens the event (weakens what the checkers conclude).
        let end_ns = monotonic_ns().max(start_ns + 1);
        events.push(json!({
            "client": client_id,
            "key": key.to_string(),
            "op": if is_put { "put" } else { "get" },
            "version": version,
            "value": hex(&bytes),
            "start_ns": start_ns,
            "end_ns": end_ns,
        }));
        if args.think_us_max > 0 {
            std::thread::sleep(std::time::Duration::from_micros(rng.gen_range(0..=args.think_us_max)));
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for event in &events {
        writeln!(out, "{event}")?;
    }
    let stats = data_path.as_ref().map_or(Value::Null, |ddss| stats_json(&ddss.stats()));
    writeln!(
        out,
        "{}",
        json!({ "done": client_id, "events": events.len(), "via_daemon": args.via_daemon, "stats": stats })
    )?;
    out.flush()?;
    Ok(())
}
