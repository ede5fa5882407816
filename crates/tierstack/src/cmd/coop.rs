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
use tierstack_coop::{MsgKind, Primitive, Scheme};
use tierstack_fabric::NodeId;
use tierstack_stats::exposition::{Exposition, Labels};
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

/// `coop-node --metrics-listen`: its `stats()` and occupancy, as
/// `tierstack_coop_*` families (one per counter, labelled by small fixed
/// sets: where a lookup was served, the primitive, the message kind), so a
/// counter added to `ServiceStats` becomes one more family.
struct CoopObserved {
    node: Arc<CoopNode>,
    serving: ServingFlag,
}

impl Observed for CoopObserved {
    fn metrics(&self, out: &mut Exposition) {
        let stats = self.node.stats();
        out.counters(
            "tierstack_coop_lookups_total",
            "Lookups by where they were served: this node's pool, a peer's, or nowhere (miss).",
            &[
                (&[("result", "local_hit")], stats.local_hits),
                (&[("result", "remote_hit")], stats.remote_hits),
                (&[("result", "miss")], stats.misses),
            ],
        );
        let calls: Vec<([(&str, &str); 1], u64)> = Primitive::ALL
            .iter()
            .map(|p| ([("primitive", p.name())], stats.tally.primitives.get(p).map_or(0, |t| t.calls)))
            .collect();
        out.counters(
            "tierstack_coop_primitive_calls_total",
            "Primitive calls made by this node (fetch, store, validate, invalidate).",
            &labelled(&calls),
        );
        let by_kind = |map: &std::collections::BTreeMap<MsgKind, u64>| -> Vec<([(&str, &str); 1], u64)> {
            MsgKind::ALL.iter().map(|k| ([("kind", k.name())], map.get(k).copied().unwrap_or(0))).collect()
        };
        let (messages, bytes) = (by_kind(&stats.tally.messages), by_kind(&stats.tally.bytes));
        out.counters("tierstack_coop_messages_total", "Messages this node sent, by kind.", &labelled(&messages));
        out.counters(
            "tierstack_coop_message_bytes_total",
            "Bytes of the messages this node sent, by kind.",
            &labelled(&bytes),
        );
        let (_, handled) = self.node.message_counts();
        let mut counter =
            |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_coop_{name}_total"), help, value);
        counter("messages_handled", "Messages this node received and handled.", handled);
        counter(
            "stale_reads",
            "Remote reads refused because the slot changed since it was announced.",
            stats.stale_reads,
        );
        counter(
            "peer_failures",
            "Reads, messages or stores that failed on a dead or silent peer.",
            stats.peer_failures,
        );
        counter("announces", "Announcements of this node's pool contents.", stats.announces);
        counter("announce_bytes", "Bytes of those announcements.", stats.announce_bytes);
        counter("key_table_full", "Keys the home's key table had no room for.", stats.key_table_full);
        counter("malformed", "Malformed messages dropped.", stats.malformed);
        counter("guarded_evictions", "Redundant copies' evictions asked at their homes.", stats.guarded_evictions);
        counter("last_copy_refusals", "Guarded evictions the home refused (the last copy).", stats.last_copy_refusals);
        let occupancy = self.node.occupancy();
        let mut gauge =
            |name: &str, help: &str, value: u64| out.gauge(&format!("tierstack_coop_{name}"), help, value as f64);
        gauge("pool_entries", "Entries in this node's pool now.", occupancy.entries);
        gauge("pool_used_pages", "Pool pages in use now.", occupancy.used_pages);
        gauge("pool_capacity_pages", "Pool pages in all.", occupancy.capacity_pages);
        gauge("home_keys", "Keys in this node's key table (as their home) now.", occupancy.home_keys);
        gauge(
            "home_key_capacity",
            "Entries the key table holds at most (0: no home here).",
            occupancy.home_key_capacity,
        );
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("serving", self.serving.check())]
    }
}

/// Rows of one-label samples as the exposition takes them.
fn labelled<'a>(rows: &'a [([(&'a str, &'a str); 1], u64)]) -> Vec<(Labels<'a>, u64)> {
    rows.iter().map(|(labels, n)| (&labels[..], *n)).collect()
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
