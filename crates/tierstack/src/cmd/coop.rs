//! `tierstack coop-node`: a cooperative-cache node that serves no HTTP, the
//! passive back-end module of MTACC and HYBCC (its pool is read and filled
//! by the proxies; it never initiates nor acts as a home, coop §3.3); and
//! the flags a proxy's `--coop` mode shares with it ([`CoopArgs`]).

use anyhow::{Context, Result};
use clap::Args;
use std::sync::Arc;
use std::time::Duration;
use tierstack_cluster::{Role, Topology};
use tierstack_coop::service::{CoopConfig, CoopNode};
use tierstack_coop::Scheme;
use tierstack_fabric::NodeId;
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{ObserveArgs, Observed, ServingFlag};

pub(crate) use tierstack_coop::args::{parse_scheme, CoopArgs};

/// The service configuration for `scheme` on `topology`, as `args` ask.
pub(crate) fn config(args: &CoopArgs, topology: &Topology, scheme: Scheme) -> Result<CoopConfig> {
    let pick = |given: &[u32], role: Role| -> Vec<NodeId> {
        if given.is_empty() {
            topology.nodes_with_role(role)
        } else {
            given.iter().map(|&n| NodeId(n)).collect()
        }
    };
    let active = pick(&args.peers, Role::Proxy);
    let passive = pick(&args.passive, Role::Passive);
    anyhow::ensure!(!active.is_empty(), "no cooperating proxies (give --coop-peers or proxy nodes)");
    for node in active.iter().chain(&passive) {
        topology.node(*node).with_context(|| format!("cooperating node {node}"))?;
    }
    let scheme = match scheme {
        Scheme::Hybcc { .. } => Scheme::Hybcc { small_max_bytes: args.hybcc_small_max },
        other => other,
    };
    let mut config = CoopConfig::new(scheme, active, passive, args.pool_bytes);
    config.ack_timeout = Duration::from_millis(args.ack_timeout_ms);
    anyhow::ensure!(
        args.key_table_entries.is_power_of_two() && args.key_table_entries <= 1 << 24,
        "--coop-key-table-entries must be a power of two, at most 16777216 (got {})",
        args.key_table_entries
    );
    config.key_table_entries = args.key_table_entries;
    config.liveness_interval = Duration::from_millis(args.liveness_ms.max(1));
    Ok(config)
}

#[derive(Args)]
pub(crate) struct CoopNodeArgs {
    #[command(flatten)]
    at: super::NodeArgs,
    /// ac | bcc | ccwr | mtacc | hybcc | groupcache (as the proxies').
    #[arg(long, value_parser = parse_scheme)]
    scheme: Scheme,
    #[command(flatten)]
    coop: CoopArgs,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
    #[command(flatten)]
    observe: ObserveArgs,
}

/// Runs the node until SIGTERM/SIGINT (or its standard input's end with
/// `--stop-on-stdin-eof`); prints its counters as JSON on the way out.
pub(crate) fn run(args: CoopNodeArgs) -> Result<()> {
    let (topology, fabric) = args.at.open()?;
    let config = config(&args.coop, &topology, args.scheme)?;
    if config.passive.contains(&args.at.id()) && !args.scheme.uses_passive() {
        tracing::warn!(
            scheme = args.scheme.name(),
            "a passive node lends no memory under this scheme (only mtacc and hybcc use it)"
        );
    }
    let node = Arc::new(CoopNode::start(fabric, config).context("starting the cooperative cache node")?);
    let serving = ServingFlag::new();
    let observer = args.observe.start(Arc::new(CoopObserved { node: node.clone(), serving: serving.clone() }))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let signals = args.service.stop_signals()?;
        crate::service::announce_ready()?;
        serving.set(true);
        signals.wait().await;
        serving.set(false);
        anyhow::Ok(())
    })?;
    drop(observer);
    println!("{}", serde_json::to_string(&node.stats())?);
    Ok(())
}

/// `coop-node --metrics-listen`: its `tierstack_coop_*` families
/// (`tierstack_coop::service::write_metrics`, shared with the proxies).
struct CoopObserved {
    node: Arc<CoopNode>,
    serving: ServingFlag,
}

impl Observed for CoopObserved {
    fn metrics(&self, out: &mut Exposition) {
        tierstack_coop::service::write_metrics(&self.node, out);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("serving", self.serving.check())]
    }
}

#[derive(Args)]
pub(crate) struct BenchNodeArgs {
    #[command(flatten)]
    at: super::NodeArgs,
}

/// Attaches to the fabric, prints `ready`, and runs `bench coop --figure
/// 7`'s commands from standard input until it closes.
pub(crate) fn run_bench_node(args: BenchNodeArgs) -> Result<()> {
    let (_topology, fabric) = args.at.open()?;
    crate::service::announce_ready()?;
    tierstack_bench::coop_nodes::serve_node(fabric, std::io::stdin().lock(), std::io::stdout())
}
