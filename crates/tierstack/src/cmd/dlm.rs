//! `tierstack dlm-node`: one node of the distributed lock manager as an OS
//! process, running a random mix of shared and exclusive holds and printing
//! every hold, for the multi-process lock tests (and a checker outside).
//!
//! **Lock servers.** The homes of the locks are the topology's non-passive
//! nodes (at least one is required); passive nodes only use locks. Every
//! node of the topology is a lock-manager node (`DlmConfig::nodes`), so
//! `break_lock` tells them all.
//!
//! **Who creates the locks.** Each lock server creates the locks of
//! `--locks` that it is home to, locally, before it prints `ready`; it waits
//! for nobody, so servers can be started in any order. Every other node
//! then calls `create_lock` for every lock as well, before `ready`:
//! creation is idempotent (the slot is claimed by a compare-and-swap on its
//! tag, so it finds the slot the home claimed, or claims that same slot),
//! and it is retried for up to [`LOCK_SETUP_TIMEOUT_MS`] while a home is
//! not up yet. A non-server's `ready` therefore means every lock exists; a
//! server checks the other servers' locks the same way after `go`, before
//! its first operation. A launcher starts the servers, then the others.
//!
//! **Output** (one JSON object per line on standard output):
//! - `ready` (plain text) once the manager runs and the locks exist;
//! - per completed hold: `{node, lock, mode, token, start_ns, granted_ns,
//!   released_ns}` — `token` is the fencing token (null for a shared hold
//!   without one); `start_ns` is read before the acquire call,
//!   `granted_ns` after it returned and `released_ns` before the release
//!   call, all from `CLOCK_MONOTONIC` (one clock for every process on the
//!   host), so `granted_ns..released_ns` lies inside the real hold and two
//!   recorded intervals that overlap prove that the holds overlapped;
//! - per failed acquire or release: `{node, lock, mode, phase, error, peer,
//!   message, start_ns, failed_ns}` with `error` one of `timeout`,
//!   `peer_dead`, `broken`, `other` and `peer` the node the error names
//!   (the holder waited for, the dead node), or null; the node goes on
//!   with its next operation;
//! - with `--announce`: `{event: "granted", ...}` as soon as a grant
//!   returns, and during each hold `{event: "handled", messages}` whenever
//!   the count of lock messages this node has handled changes (a holder's
//!   view of who queued behind it);
//! - after the last operation the summary `{done, scheme, ops, holds,
//!   errors, messages_handled, message_errors}`.
//!
//! Then the node keeps serving lock traffic — it may be the home of locks
//! others use, or the predecessor that passes a lock on — until its
//! standard input closes; it prints `{stopped, messages_handled,
//! message_errors}` and exits, with a failure status if any operation
//! failed.

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::Rng;
use serde_json::{json, Value};
use std::io::{BufRead, Read, Write};
use std::ops::Range;
use std::time::{Duration, Instant};
use tierstack_base::host_monotonic_ns as monotonic_ns;
use tierstack_base::{seeded_rng, NodeId};
use tierstack_cluster::{Role, Topology};
use tierstack_dlm::table::home_of;
use tierstack_dlm::{DlmConfig, Grant, LockError, LockId, LockManager, LockMode, Scheme, Wait};

/// Most locks one node may operate on.
pub const LOCKS_MAX: u64 = 1024;
/// How long a node waits for the homes of its locks to come up.
pub const LOCK_SETUP_TIMEOUT_MS: u64 = 30_000;
/// Pause between attempts to reach a home that is not up yet.
const LOCK_SETUP_RETRY_MS: u64 = 5;
/// Poll interval of an announced hold (for `handled` events).
const ANNOUNCE_POLL_US: u64 = 500;

#[derive(Args)]
pub struct LockNodeArgs {
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
}

/// `tierstack dlm-bench-node`: one node of `bench dlm`, run by the benchmark.
#[derive(Args)]
pub struct BenchNodeArgs {
    #[command(flatten)]
    at: super::NodeArgs,
}

/// Attaches to the fabric, prints `ready`, and runs the benchmark's commands
/// from standard input until it closes.
pub fn run_bench_node(args: BenchNodeArgs) -> Result<()> {
    let (topology, fabric) = args.at.open()?;
    println!("ready");
    std::io::stdout().flush()?;
    tierstack_bench::dlm_nodes::serve_node(fabric, topology.node_ids(), std::io::stdin().lock(), std::io::stdout())
}

fn parse_lock_range(text: &str) -> Result<Range<u64>, String> {
    let (first, end) = text.split_once("..").ok_or_else(|| format!("expected FIRST..END, got {text:?}"))?;
    let first: u64 = first.trim().parse().map_err(|e| format!("bad first lock in {text:?}: {e}"))?;
    let end: u64 = end.trim().parse().map_err(|e| format!("bad end in {text:?}: {e}"))?;
    if first >= end || end - first > LOCKS_MAX || end == u64::MAX {
        return Err(format!("{text:?} must name 1..={LOCKS_MAX} locks below {}", u64::MAX));
    }
    Ok(first..end)
}

/// The nodes that keep lock tables: the topology's non-passive nodes.
pub fn lock_servers(topology: &Topology) -> Vec<NodeId> {
    topology.nodes.iter().filter(|n| n.role != Role::Passive).map(|n| n.id).collect()
}

/// Prints one line; standard output is line-buffered, so it leaves at once.
fn emit(line: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The kind and the node an error names, for the checker.
fn classify(error: &LockError) -> (&'static str, Option<NodeId>) {
    match error {
        LockError::Timeout { blocked_on, .. } => ("timeout", *blocked_on),
        LockError::PeerDead { node, .. } => ("peer_dead", Some(*node)),
        LockError::Broken { .. } => ("broken", None),
        _ => ("other", None),
    }
}

/// Creates every lock in `locks` (idempotent), retrying while its home is
/// not up yet, until [`LOCK_SETUP_TIMEOUT_MS`].
fn ensure_locks(manager: &LockManager, locks: impl Iterator<Item = LockId>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_millis(LOCK_SETUP_TIMEOUT_MS);
    for lock in locks {
        loop {
            match manager.create_lock(lock) {
                Ok(()) => break,
                Err(e @ (LockError::InvalidLockId { .. } | LockError::TableFull { .. } | LockError::Config(_))) => {
                    return Err(e).with_context(|| format!("creating {lock}"));
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| {
                        format!("{lock}: its home was not reachable within {LOCK_SETUP_TIMEOUT_MS} ms")
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(LOCK_SETUP_RETRY_MS)),
            }
        }
    }
    Ok(())
}

/// Holds for `hold`; with `announce`, reports the lock messages handled meanwhile.
fn hold_for(manager: &LockManager, node: NodeId, hold: Duration, announce: bool) -> Result<()> {
    if !announce {
        if hold.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(hold);
        }
        return Ok(());
    }
    let end = Instant::now() + hold;
    let mut seen = manager.stats().messages_handled;
    loop {
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_micros(ANNOUNCE_POLL_US)));
        let handled = manager.stats().messages_handled;
        if handled != seen {
            seen = handled;
            emit(&json!({ "event": "handled", "node": node.0, "messages": handled }))?;
        }
    }
}

fn error_line(node: NodeId, lock: LockId, mode: LockMode, phase: &str, error: &LockError, start_ns: u64) -> Value {
    let (kind, peer) = classify(error);
    json!({
        "node": node.0,
        "lock": lock.0,
        "mode": mode.name(),
        "phase": phase,
        "error": kind,
        "peer": peer.map(|p| p.0),
        "message": error.to_string(),
        "start_ns": start_ns,
        "failed_ns": monotonic_ns(),
    })
}

/// Runs the node: see the module documentation.
pub fn run_node(args: LockNodeArgs) -> Result<()> {
    let node = args.at.id();
    let (topology, fabric) = args.at.open()?;
    let servers = lock_servers(&topology);
    if servers.is_empty() {
        bail!("the topology has no non-passive node to serve locks");
    }
    let config = DlmConfig::new(args.scheme, servers.clone(), topology.node_ids());
    let manager = LockManager::start(fabric, config).with_context(|| format!("starting the lock manager on {node}"))?;
    let locks = || (args.locks.start..args.locks.end).map(LockId);
    let is_server = servers.contains(&node);
    ensure_locks(&manager, locks().filter(|&l| home_of(l, &servers) == Some(node)))?;
    if !is_server {
        ensure_locks(&manager, locks())?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut stdin = std::io::stdin().lock();
    if args.wait_go {
        let mut line = String::new();
        if stdin.read_line(&mut line)? == 0 {
            bail!("standard input closed before go");
        }
    }
    if is_server {
        ensure_locks(&manager, locks())?;
    }

    let mut rng = seeded_rng(args.seed.wrapping_add(u64::from(node.0)));
    let timeout = Duration::from_millis(args.acquire_timeout_ms);
    let hold = Duration::from_micros(args.hold_us);
    let scheme = manager.scheme().clone();
    let (mut holds, mut errors) = (0usize, 0usize);
    for _ in 0..args.ops {
        let lock = LockId(rng.gen_range(args.locks.clone()));
        let mode = if rng.gen_range(0..100) < args.shared_percent { LockMode::Shared } else { LockMode::Exclusive };
        let start_ns = monotonic_ns();
        let grant: Grant = match scheme.acquire(lock, mode, Wait::Timeout(timeout)) {
            Ok(grant) => grant,
            Err(e) => {
                errors += 1;
                emit(&error_line(node, lock, mode, "acquire", &e, start_ns))?;
                continue;
            }
        };
        // Read after the grant returned and before the release is called:
        // the recorded interval lies inside the real hold.
        let granted_ns = monotonic_ns();
        let token = grant.fencing_token();
        if args.announce {
            emit(&json!({
                "event": "granted", "node": node.0, "lock": lock.0, "mode": mode.name(),
                "token": token, "granted_ns": granted_ns,
            }))?;
        }
        hold_for(&manager, node, hold, args.announce)?;
        let released_ns = monotonic_ns();
        if let Err(e) = scheme.release(&grant) {
            errors += 1;
            emit(&error_line(node, lock, mode, "release", &e, start_ns))?;
            continue;
        }
        holds += 1;
        emit(&json!({
            "node": node.0, "lock": lock.0, "mode": mode.name(), "token": token,
            "start_ns": start_ns, "granted_ns": granted_ns, "released_ns": released_ns,
        }))?;
    }
    let stats = manager.stats();
    emit(&json!({
        "done": node.0, "scheme": args.scheme.name(), "ops": args.ops, "holds": holds, "errors": errors,
        "messages_handled": stats.messages_handled, "message_errors": stats.message_errors,
    }))?;

    // Keep serving (the receive thread does) until standard input closes.
    // Read in fixed chunks, so endless input without newlines cannot grow a buffer.
    let mut chunk = [0u8; 1024];
    while matches!(stdin.read(&mut chunk), Ok(n) if n > 0) {}
    let stats = manager.stats();
    drop(manager);
    emit(&json!({
        "stopped": node.0, "messages_handled": stats.messages_handled, "message_errors": stats.message_errors,
    }))?;
    if errors > 0 {
        bail!("{errors} of {} operations failed", args.ops);
    }
    Ok(())
}
