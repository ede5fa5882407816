//! `tierstack sim`: the trace-driven cluster simulator (glue over
//! `tierstack-sim`).

use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use tierstack_sim::{Arrivals, Budget, Costs, Load, PolicyName, SimConfig};
use tierstack_workload::{TargetChoice, TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

/// Per-node memory cache when `--cache-bytes` is not given and the trace
/// publishes none: the cooperative caching seed's 64 MB per node (coop §4).
const CACHE_BYTES_DEFAULT: u64 = 64 << 20;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("budget").required(true).args(["requests", "client_requests"])))]
pub(crate) struct SimArgs {
    /// Simulated server nodes.
    #[arg(long)]
    nodes: usize,
    /// Clients send only to nodes 0..N (the proxies of a `coop:` policy; the
    /// other nodes are its web servers). Default: every node.
    #[arg(long)]
    client_nodes: Option<usize>,
    /// single | zipf | worldcup | clf:PATH | press:NAME[@SCALE] | coop:NAME[@SCALE]
    /// (as `tierstack load --trace`; see `tierstack trace show`)
    #[arg(long)]
    trace: String,
    /// Zipf exponent (zipf trace).
    #[arg(long, default_value_t = ZIPF_ALPHA_DEFAULT)]
    alpha: f64,
    /// Number of documents (zipf trace).
    #[arg(long, default_value_t = ZIPF_DOCS_DEFAULT)]
    docs: usize,
    /// Requests to issue in all (closed loop: clients stop once this many were
    /// issued, as `tierstack load --requests` does; open loop: arrivals).
    #[arg(long)]
    requests: Option<u64>,
    /// Closed loop with a fixed count per client, comma-separated (client w
    /// issues the w-th count; replays a real run's per-connection counts).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["clients", "rate"])]
    client_requests: Option<Vec<u64>>,
    /// Closed-loop clients, one request outstanding each (default: one per node).
    #[arg(long, conflicts_with = "rate")]
    clients: Option<usize>,
    /// Open loop: requests per second over the whole client.
    #[arg(long)]
    rate: Option<f64>,
    /// Open-loop request streams (arrival k uses stream k mod streams; default: one per node).
    #[arg(long, requires = "rate")]
    streams: Option<usize>,
    /// Open-loop schedule: poisson | constant.
    #[arg(long, default_value = "poisson", requires = "rate")]
    arrivals: Arrivals,
    /// fixed | round-robin | random
    #[arg(long, default_value = "fixed")]
    target_choice: TargetChoice,
    /// Every request opens its own client connection.
    #[arg(long)]
    new_connection_per_request: bool,
    /// Memory cache per node, bytes. Default: the trace's published per-node
    /// cache (press:NAME and coop:NAME, scaled with the trace), else 64 MiB.
    #[arg(long)]
    cache_bytes: Option<u64>,
    /// Larger documents are served but not cached (default: the cache size).
    #[arg(long)]
    cache_max_object_bytes: Option<u64>,
    /// Disk seek (positioning) time per read, µs (default: the cost file's [disk]).
    #[arg(long, requires = "disk_mb_per_s")]
    disk_seek_us: Option<f64>,
    /// Disk transfer rate, MB/s (10^6 bytes per second).
    #[arg(long, requires = "disk_seek_us")]
    disk_mb_per_s: Option<f64>,
    /// Cost file: measured | seeds | PATH to a TOML file of the same shape.
    #[arg(long, default_value = "measured")]
    costs: String,
    /// Override the cost file's transport for two-sided messages.
    #[arg(long)]
    messages_transport: Option<String>,
    /// Override the cost file's transport for one-sided reads.
    #[arg(long)]
    remote_read_transport: Option<String>,
    /// Override the cost file's transport for one-sided writes.
    #[arg(long)]
    remote_write_transport: Option<String>,
    /// independent (PRESS's traditional server), press-base, press-rdma-1c, press-rdma, press-zero,
    /// or coop:ac|bcc|ccwr|mtacc|hybcc|groupcache (cooperative caching on the
    /// client nodes, the others its web servers)
    #[arg(long, default_value = "independent")]
    policy: PolicyName,
    /// Seed of the request streams, target choices, arrivals and trace synthesis.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the report here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn run(args: SimArgs) -> Result<()> {
    let costs = Costs::resolve(&args.costs)?.with_overrides(
        args.messages_transport.clone(),
        args.remote_read_transport.clone(),
        args.remote_write_transport.clone(),
    )?;
    let disk = costs.disk_model(args.disk_seek_us, args.disk_mb_per_s)?;
    let spec = TraceSpec::parse(&args.trace, args.alpha, args.docs)?;
    let trace = spec.build(args.seed).with_context(|| format!("building trace {}", args.trace))?;
    let load = match (&args.client_requests, args.rate) {
        (Some(counts), _) => Load::Closed { clients: counts.len(), budget: Budget::PerClient(counts.clone()) },
        (None, Some(rate_per_s)) => Load::Open {
            rate_per_s,
            requests: args.requests.unwrap_or(0),
            streams: args.streams.unwrap_or(args.nodes),
            arrivals: args.arrivals,
        },
        (None, None) => Load::Closed {
            clients: args.clients.unwrap_or(args.nodes),
            budget: Budget::Total(args.requests.unwrap_or(0)),
        },
    };
    let config = SimConfig {
        client_nodes: args.client_nodes,
        nodes: args.nodes,
        load,
        target_choice: args.target_choice,
        new_connection_per_request: args.new_connection_per_request,
        cache_bytes: args.cache_bytes.or(trace.cache_bytes_per_node()).unwrap_or(CACHE_BYTES_DEFAULT),
        cache_max_object_bytes: args.cache_max_object_bytes,
        disk,
        costs,
        seed: args.seed,
    };
    let started = tierstack_base::time::instant_now();
    let mut report = tierstack_sim::run_named(args.policy, &config, &trace)?;
    let wall = started.elapsed();
    report.costs = args.costs.clone();
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    write!(std::io::stdout().lock(), "{}", report.text())?;
    // Wall time is not part of the (deterministic) report.
    eprintln!(
        "simulated {} requests on {} nodes in {:.3} s of wall time",
        report.requests,
        report.nodes,
        wall.as_secs_f64()
    );
    Ok(())
}
