//! `tierstack dlm-node`: one node of the distributed lock manager as an OS
//! process, running a random mix of shared and exclusive holds and printing
//! every hold, for the multi-process lock tests (and a checker outside).
//! And the operator's tools, `tierstack dlm status` (every lock's home
//! words and every node's view, read one-sidedly) and `tierstack dlm break`.
//!
//! **Recovery** is on unless `--no-recovery`; `--lease-ms` sets the lease
//! (0: none), `--probe-ms` the monitor's interval (see `DlmConfig`).
//!
//! **Lock servers.** The homes of the locks are the topology's non-passive
//! nodes (at least one is required); passive nodes only use locks. Every
//! node of the topology is a lock-manager node (`DlmConfig::nodes`), so
//! `break_lock` tells them all.
//!
//! **Output** (one JSON object per line on standard output): `ready`
//! (plain text) once the manager runs and the locks exist, then the lines of
//! `tierstack_bench::dlm_holds` (which creates the locks, runs the workload
//! and writes its summary).
//!
//! **Metrics** with `--metrics-listen ADDR`: `/metrics` (the
//! `tierstack_dlm_*` families of [`tierstack_dlm::DlmMetrics`]), `/healthz`,
//! and `/readyz` (ready once the locks exist and the node said `ready`,
//! until it stops, while no lock server is known gone).
//!
//! Then the node keeps serving lock traffic — it may be the home of locks
//! others use, or the predecessor that passes a lock on — until its
//! standard input closes; it prints `{stopped, messages_handled,
//! message_errors}` and exits, with a failure status if any operation
//! failed.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use std::io::BufRead;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::host_monotonic_ns as monotonic_ns;
use tierstack_base::NodeId;
use tierstack_bench::dlm_holds::{
    emit_stopped, ensure_locks_after_go, ensure_locks_before_ready, lock_servers, parse_lock_range, HoldWorkload,
};
use tierstack_dlm::status::StatusReport;
use tierstack_dlm::{DlmConfig, DlmMetrics, LockId, LockManager, Scheme};
use tierstack_fabric::{Fabric, PeerState};
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{ObserveArgs, Observed, ServingFlag};

#[derive(Args)]
pub(crate) struct LockNodeArgs {
    /// The node; the topology's non-passive nodes serve locks.
    #[command(flatten)]
    at: super::NodeArgs,
    /// The locks to operate on, as FIRST..END (END exclusive), e.g. 0..3.
    #[arg(long, value_parser = parse_lock_range)]
    locks: Range<u64>,
    /// Lock scheme: ncoshed, srsl or dqnl (every node must use the same).
    #[arg(long, default_value = "ncoshed")]
    scheme: Scheme,
    /// Acquire/hold/release operations to run (0: only serve).
    #[arg(long, default_value_t = 100)]
    ops: usize,
    /// Percent of the operations that acquire in shared mode.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    shared_percent: u32,
    /// Seed of the operation mix; the node's generator uses SEED + node id.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long each hold lasts, in microseconds (0: just yield).
    #[arg(long, default_value_t = 0)]
    hold_us: u64,
    /// Bound on each acquire; past it the request is abandoned and reported.
    #[arg(long, default_value_t = 30_000)]
    acquire_timeout_ms: u64,
    /// After `ready`, wait for a line on standard input before the first operation.
    #[arg(long)]
    wait_go: bool,
    /// Print each grant as it happens, and the lock messages handled during each hold.
    #[arg(long)]
    announce: bool,
    /// Stop starting operations at this CLOCK_MONOTONIC time (ns), even if
    /// fewer than --ops ran (a chaos run's common end, restarts included).
    #[arg(long)]
    run_until_ns: Option<u64>,
    #[command(flatten)]
    recovery: RecoveryArgs,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
    #[command(flatten)]
    observe: ObserveArgs,
}

/// What `/metrics` and `/readyz` of a lock node report.
struct LockNodeObserved {
    metrics: Arc<DlmMetrics>,
    serving: ServingFlag,
    /// The lock servers, and this node's fabric to ask whether they run.
    servers: Vec<NodeId>,
    fabric: Arc<dyn Fabric>,
}

impl Observed for LockNodeObserved {
    fn metrics(&self, out: &mut Exposition) {
        self.metrics.write(out);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let manager = if self.metrics.running() { Ok(()) } else { Err("the lock manager stopped".into()) };
        // Only a server known gone fails it (one that cannot be told is not
        // judged): its locks wait for its restart.
        let gone: Vec<String> = self
            .servers
            .iter()
            .filter(|&&server| self.fabric.peer_state(server) == PeerState::Gone)
            .map(ToString::to_string)
            .collect();
        let servers = if gone.is_empty() { Ok(()) } else { Err(format!("{} gone", gone.join(", "))) };
        vec![("serving", self.serving.check()), ("lock manager", manager), ("lock servers", servers)]
    }
}

/// How a lock manager recovers from dead and stopped peers (every node of a
/// cluster must use the same).
#[derive(Args, Clone, Debug)]
pub(crate) struct RecoveryArgs {
    /// Turn automatic recovery off: a dead holder wedges its lock until `tierstack dlm break`.
    #[arg(long)]
    no_recovery: bool,
    /// The lease in milliseconds: a node whose heartbeat stands still this long counts as dead (0: no leases).
    #[arg(long, default_value_t = tierstack_dlm::LEASE_MS_DEFAULT)]
    lease_ms: u64,
    /// How often the recovery monitor looks at waiting requests, in milliseconds.
    #[arg(long, default_value_t = tierstack_dlm::PROBE_INTERVAL_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..))]
    probe_ms: u64,
    /// How long a request may wait for parties it cannot name before every node is checked, in milliseconds.
    #[arg(long, default_value_t = tierstack_dlm::SUSPECT_AFTER_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..))]
    suspect_ms: u64,
}

impl RecoveryArgs {
    fn apply(&self, config: DlmConfig) -> DlmConfig {
        config
            .with_recovery(!self.no_recovery)
            .with_lease((self.lease_ms > 0).then(|| Duration::from_millis(self.lease_ms)))
            .with_probe_interval(Duration::from_millis(self.probe_ms))
            .with_suspect_after(Duration::from_millis(self.suspect_ms))
    }
}

/// `tierstack dlm-bench-node`: one node of `bench dlm`, run by the benchmark.
#[derive(Args)]
pub(crate) struct BenchNodeArgs {
    #[command(flatten)]
    at: super::NodeArgs,
}

/// Attaches to the fabric, prints `ready`, and runs the benchmark's commands
/// from standard input until it closes.
pub(crate) fn run_bench_node(args: BenchNodeArgs) -> Result<()> {
    let (topology, fabric) = args.at.open()?;
    crate::service::announce_ready()?;
    tierstack_bench::dlm_nodes::serve_node(fabric, topology.node_ids(), std::io::stdin().lock(), std::io::stdout())
}

/// Runs the node: see the module documentation.
pub(crate) fn run_node(args: LockNodeArgs) -> Result<()> {
    let node = args.at.id();
    let (topology, fabric) = args.at.open()?;
    let servers = lock_servers(&topology);
    if servers.is_empty() {
        bail!("the topology has no non-passive node to serve locks");
    }
    let config = args.recovery.apply(DlmConfig::new(args.scheme, servers.clone(), topology.node_ids()));
    let manager =
        LockManager::start(fabric.clone(), config).with_context(|| format!("starting the lock manager on {node}"))?;
    let serving = ServingFlag::new();
    let observed =
        LockNodeObserved { metrics: manager.metrics(), serving: serving.clone(), servers: servers.clone(), fabric };
    let _observer = args.observe.start(Arc::new(observed))?;
    ensure_locks_before_ready(&manager, &servers, node, &args.locks)?;
    // Ready before `ready` is printed, so whoever reads the line finds /readyz agreeing.
    serving.set(true);
    crate::service::announce_ready()?;
    let mut stdin = std::io::stdin().lock();
    if args.wait_go {
        let mut line = String::new();
        if stdin.read_line(&mut line)? == 0 {
            bail!("standard input closed before go");
        }
    }
    // Installed after the go line was read: with --stop-on-stdin-eof the
    // watcher reads standard input to its end.
    drop(stdin);
    let stopped = args.service.stop_watch_thread()?;
    ensure_locks_after_go(&manager, &servers, node, &args.locks)?;

    let workload = HoldWorkload {
        node,
        locks: args.locks.clone(),
        ops: args.ops,
        shared_percent: args.shared_percent,
        seed: args.seed,
        hold: Duration::from_micros(args.hold_us),
        acquire_timeout: Duration::from_millis(args.acquire_timeout_ms),
        announce: args.announce,
        run_until_ns: args.run_until_ns,
    };
    let mut out = std::io::stdout();
    let errors = workload.run_and_summarize(&manager, args.scheme.name(), &mut out)?.errors;
    // Keep serving (the receive thread does) until asked to stop.
    let _ = stopped.recv();
    serving.set(false);
    emit_stopped(&mut out, node, manager)?;
    if errors > 0 {
        bail!("{errors} of {} operations failed", args.ops);
    }
    Ok(())
}

// ---------------------------------------------------------------- operator tools

/// `tierstack dlm …`: the operator's tools.
#[derive(clap::Subcommand)]
pub(crate) enum DlmCommand {
    /// Every lock's home words (generation, tail, shared count, drain, fence) and every node's view of
    /// each lock (holding, waiting and for whom, moving, barrier), read one-sidedly; plus each node's
    /// liveness, incarnation, heartbeat and lease.
    Status(StatusArgs),
    /// Break a lock: move it to a new generation from this node, revoking every hold and request
    /// (their holders' releases say `Broken`); prints the fencing floor. For a holder that is alive
    /// but stuck: a dead one is recovered without this.
    Break(BreakArgs),
}

/// Which lock manager, on which cluster, as which node.
#[derive(Args)]
pub(crate) struct ManagerArgs {
    /// This tool's node: a node of the topology that runs nothing else now.
    #[command(flatten)]
    at: super::NodeArgs,
    /// The cluster's lock scheme.
    #[arg(long, default_value = "ncoshed")]
    scheme: Scheme,
    /// The cluster's region prefix (`DlmConfig::region_prefix`).
    #[arg(long, default_value = "dlm")]
    prefix: String,
}

#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    manager: ManagerArgs,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct BreakArgs {
    #[command(flatten)]
    manager: ManagerArgs,
    /// The lock to break.
    lock: u64,
    #[command(flatten)]
    recovery: RecoveryArgs,
}

pub(crate) fn run(command: DlmCommand) -> Result<()> {
    match command {
        DlmCommand::Status(args) => status(args),
        DlmCommand::Break(args) => break_lock(args),
    }
}

fn status(args: StatusArgs) -> Result<()> {
    let at = &args.manager;
    let (topology, fabric) = at.at.open()?;
    let nodes: Vec<NodeId> = topology.node_ids().into_iter().filter(|&n| n != at.at.id()).collect();
    let report = StatusReport::read(fabric.as_ref(), &lock_servers(&topology), &nodes, &at.prefix, at.scheme.name());
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render(monotonic_ns()));
    }
    Ok(())
}

fn break_lock(args: BreakArgs) -> Result<()> {
    let at = &args.manager;
    let (topology, fabric) = at.at.open()?;
    let servers = lock_servers(&topology);
    let config = args
        .recovery
        .apply(DlmConfig::new(at.scheme, servers, topology.node_ids()))
        .with_region_prefix(at.prefix.clone());
    let manager = LockManager::start(fabric, config).context("starting a lock manager to break the lock")?;
    let lock = LockId(args.lock);
    let floor = manager.break_lock(lock).with_context(|| format!("breaking {lock}"))?;
    println!("{}", json!({ "broken": lock.0, "floor": floor }));
    Ok(())
}
