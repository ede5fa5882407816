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

/// A scheme's name on the command line.
pub(crate) fn parse_scheme(s: &str) -> Result<Scheme, String> {
    s.parse::<Scheme>().map_err(|e| e.to_string())
}

/// Who cooperates, and with how much memory (the same on every node).
#[derive(Args, Clone, Debug)]
pub(crate) struct CoopArgs {
    /// The cooperating proxies' fabric nodes, in order (comma-separated);
    /// default: every `proxy` node of the topology.
    #[arg(long = "coop-peers", value_delimiter = ',')]
    pub peers: Vec<u32>,
    /// The passive back-end memory nodes (MTACC, HYBCC); default: every
    /// `passive` node of the topology.
    #[arg(long = "coop-passive", value_delimiter = ',')]
    pub passive: Vec<u32>,
    /// Each node's pool (the paper's 64 MB per node).
    #[arg(long = "coop-pool-bytes", default_value_t = 64 << 20)]
    pub pool_bytes: u64,
    /// How long a node waits for a peer's answer (STORE acknowledgment,
    /// groupcache reply, a home's grant) before it counts a miss.
    #[arg(long = "coop-ack-timeout-ms", default_value_t = 500)]
    pub ack_timeout_ms: u64,
    /// HYBCC: the largest pooled entity treated as small (BCC on the
    /// proxies). The pool holds the response head with the body, so the
    /// default is the seed-notes' 8 KiB plus 1 KiB for the head: an 8 KiB
    /// file is small.
    #[arg(long = "coop-hybcc-small-max", default_value_t = tierstack_coop::HYBCC_SMALL_MAX_BYTES + HEAD_ALLOWANCE_BYTES)]
    pub hybcc_small_max: u64,
}

/// Bytes a pooled response takes beyond its body, at most, in the
/// threshold's sense (its stored head and the envelope's key).
pub(crate) const HEAD_ALLOWANCE_BYTES: u64 = 1024;

impl CoopArgs {
    /// The service configuration for `scheme` on `topology`.
    pub(crate) fn config(&self, topology: &Topology, scheme: Scheme) -> Result<CoopConfig> {
        let pick = |given: &[u32], role: Role| -> Vec<NodeId> {
            if given.is_empty() {
                topology.nodes_with_role(role)
            } else {
                given.iter().map(|&n| NodeId(n)).collect()
            }
        };
        let active = pick(&self.peers, Role::Proxy);
        let passive = pick(&self.passive, Role::Passive);
        anyhow::ensure!(!active.is_empty(), "no cooperating proxies (give --coop-peers or proxy nodes)");
        for node in active.iter().chain(&passive) {
            topology.node(*node).with_context(|| format!("cooperating node {node}"))?;
        }
        let scheme = match scheme {
            Scheme::Hybcc { .. } => Scheme::Hybcc { small_max_bytes: self.hybcc_small_max },
            other => other,
        };
        let mut config = CoopConfig::new(scheme, active, passive, self.pool_bytes);
        config.ack_timeout = Duration::from_millis(self.ack_timeout_ms);
        Ok(config)
    }
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
    let config = args.coop.config(&topology, args.scheme)?;
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
