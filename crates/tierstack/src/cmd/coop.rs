//! `tierstack coop-node`: a cooperative-cache node that serves no HTTP, the
//! passive back-end module of MTACC and HYBCC (its pool is read and filled
//! by the proxies; it never initiates nor acts as a home, coop §3.3); and
//! the flags a proxy's `--coop` mode shares with it ([`CoopArgs`]).

use anyhow::{Context, Result};
use clap::Args;
use std::time::Duration;
use tierstack_cluster::{Role, Topology};
use tierstack_coop::service::{CoopConfig, CoopNode};
use tierstack_coop::Scheme;
use tierstack_fabric::NodeId;

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
    let node = CoopNode::start(fabric, config).context("starting the cooperative cache node")?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let signals = args.service.stop_signals()?;
        crate::service::announce_ready()?;
        signals.wait().await;
        anyhow::Ok(())
    })?;
    println!("{}", serde_json::to_string(&node.stats())?);
    Ok(())
}
