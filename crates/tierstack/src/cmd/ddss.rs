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
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use tierstack_base::NodeId;
pub(crate) use tierstack_bench::ddss::daemon::DaemonArgs;
use tierstack_cluster::{Role, Topology};
use tierstack_ddss::history::{parse_key_ops, stats_json, History, HistoryConfig};
use tierstack_ddss::ipc::{DdssClient, DdssDaemon};
use tierstack_ddss::metrics::DaemonMetrics;
use tierstack_ddss::{Ddss, DdssConfig, Key};
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{Observed, ServingFlag};

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

/// The nodes that hold DDSS regions: every node of the topology but the passive ones.
fn members(topology: &Topology) -> Vec<NodeId> {
    topology.nodes.iter().filter(|n| n.role != Role::Passive).map(|n| n.id).collect()
}

/// What a daemon's `/metrics` and `/readyz` report.
struct DaemonObserved {
    ddss: Arc<Ddss>,
    metrics: Arc<DaemonMetrics>,
    socket: PathBuf,
    serving: ServingFlag,
}

impl Observed for DaemonObserved {
    fn metrics(&self, out: &mut Exposition) {
        self.metrics.write(&self.ddss, out);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let socket = match self.socket.exists() {
            true => Ok(()),
            false => Err(format!("{} is gone", self.socket.display())),
        };
        vec![("serving", self.serving.check()), ("socket", socket)]
    }
}

/// Starts the node's substrate, serves it on the socket, prints `ready`,
/// serves as a service (`crate::service`: until SIGTERM/SIGINT, or its
/// standard input's end with `--stop-on-stdin-eof`), with `/metrics` on
/// `--metrics-listen` (`tierstack_ddss::metrics`), then stops
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
    let serving = ServingFlag::new();
    let observed = DaemonObserved {
        ddss: ddss.clone(),
        metrics: daemon.metrics(),
        socket: args.socket.clone(),
        serving: serving.clone(),
    };
    let _observer = args.observe.start(Arc::new(observed))?;
    // Ready before `ready` is printed, so whoever reads the line finds /readyz agreeing.
    serving.set(true);
    crate::service::announce_ready()?;

    let reason = stopped.recv().map(|cause| cause.name()).unwrap_or("stop watcher gone");
    tracing::info!(%node, reason, "DDSS daemon stopping");
    serving.set(false);
    daemon.stop();
    println!("{}", json!({ "stopped": reason, "node": node.0, "stats": stats_json(&ddss.stats()) }));
    std::io::stdout().flush()?;
    Ok(())
}

/// Connects to the daemon, attaches the data path, prints `ready`, runs the
/// shuffled operations (`tierstack_ddss::history`), then prints one JSON
/// line per event and a last line with the counters.
pub(crate) fn run_client(args: ClientArgs) -> Result<()> {
    let client = args.client.unwrap_or(args.at.node);
    let (_, fabric) = args.at.open()?;
    let mut control = DdssClient::connect(&args.socket)?;
    // This process's own one-sided data path, or none: the daemon performs the gets and puts.
    let data_path =
        if args.via_daemon { None } else { Some(control.attach_data_path(fabric).context("attaching the data path")?) };
    let history = History::new(HistoryConfig {
        keys: args.keys,
        client,
        put_percent: args.put_percent,
        value_bytes_max: args.value_bytes_max,
        seed: args.seed,
        think_us_max: args.think_us_max,
    });
    crate::service::announce_ready()?;
    if args.wait_go {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
    }
    let events = history.run(|key, value| match (&data_path, value) {
        (Some(ddss), Some(value)) => Ok((ddss.put(key, value)?, Vec::new())),
        (Some(ddss), None) => ddss.get(key),
        (None, Some(value)) => Ok((control.put(key, value)?, Vec::new())),
        (None, None) => control.get(key),
    })?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for event in &events {
        writeln!(out, "{event}")?;
    }
    let stats = data_path.as_ref().map_or(Value::Null, |ddss| stats_json(&ddss.stats()));
    writeln!(
        out,
        "{}",
        json!({ "done": client, "events": events.len(), "via_daemon": args.via_daemon, "stats": stats })
    )?;
    out.flush()?;
    Ok(())
}
