//! The random-hold workload of `tierstack dlm-node`: one lock-manager node
//! runs a seeded mix of shared and exclusive holds on a range of locks and
//! reports every hold, for the multi-process lock tests and a checker
//! outside. The binary opens the fabric and starts the manager; this module
//! chooses the operations, runs them and writes the lines.
//!
//! **Output** (one JSON object per line):
//! - per completed hold: `{node, lock, mode, token, start_ns, granted_ns,
//!   released_ns}` — `token` is the fencing token (null for a shared hold
//!   without one); `start_ns` is read before the acquire call,
//!   `granted_ns` after it returned and `released_ns` before the release
//!   call, all from `CLOCK_MONOTONIC` (one clock for every process on the
//!   host), so `granted_ns..released_ns` lies inside the real hold and two
//!   recorded intervals that overlap prove that the holds overlapped;
//! - per failed acquire or release: `{node, lock, mode, phase, error, peer,
//!   message, start_ns, failed_ns}` with `error` one of `timeout`,
//!   `peer_dead`, `broken`, `would_block`, `other` and `peer` the node the
//!   error names (the holder waited for, the dead node), or null; a failed
//!   release also has the hold's `token`, `granted_ns` and `released_ns`
//!   (a hold whose release says `broken` was revoked); the node goes on
//!   with its next operation;
//! - with `announce`: `{event: "granted", ...}` as soon as a grant returns,
//!   and during each hold `{event: "handled", messages}` whenever the count
//!   of lock messages this node has handled changes (a holder's view of who
//!   queued behind it).
//!
//! The mix is a pure function of the seed and the node ([`HoldPlan`]), so
//! a run can be replayed and its choices tested without a cluster.
//!
//! **Who creates the locks** ([`ensure_locks_before_ready`],
//! [`ensure_locks_after_go`]). Each lock server creates the locks of its
//! range that it is home to, locally, before it says `ready`; it waits for
//! nobody, so servers can be started in any order. Every other node then
//! creates every lock as well, before `ready`: creation is idempotent (the
//! slot is claimed by a compare-and-swap on its tag, so it finds the slot
//! the home claimed, or claims that same slot), and it is retried for up to
//! [`LOCK_SETUP_TIMEOUT_MS`] while a home is not up yet. A non-server's
//! `ready` therefore means every lock exists; a server checks the other
//! servers' locks the same way after `go`, before its first operation.
//!
//! **Summaries**: after the last operation [`HoldWorkload::run_and_summarize`]
//! writes `{done, scheme, ops, holds, errors, messages_handled,
//! message_errors, violations, moves, peers_lost}`, and when the node stops
//! [`emit_stopped`] writes `{stopped, messages_handled, message_errors}`.

use anyhow::{Context, Result};
use rand::Rng;
use serde_json::{json, Value};
use std::io::Write;
use std::ops::Range;
use std::time::Duration;
use tierstack_base::host_monotonic_ns as monotonic_ns;
use tierstack_base::{seeded_rng, NodeId, SeededRng};
use tierstack_cluster::{Role, Topology};
use tierstack_dlm::table::home_of;
use tierstack_dlm::{DlmStats, Grant, LockError, LockId, LockManager, LockMode, Wait};

/// Most locks one node may operate on.
pub const LOCKS_MAX: u64 = 1024;
/// How long a node waits for the homes of its locks to come up.
pub const LOCK_SETUP_TIMEOUT_MS: u64 = 30_000;
/// Pause between attempts to reach a home that is not up yet.
const LOCK_SETUP_RETRY_MS: u64 = 5;
/// Poll interval of an announced hold (for `handled` events).
const ANNOUNCE_POLL_US: u64 = 500;
/// Pause after an acquire that failed for a reason other than a timeout
/// (a home that is down, say), so the node does not spin on it.
const FAILED_ACQUIRE_PAUSE_MS: u64 = 20;

/// Parses `FIRST..END` (END exclusive) naming 1..=[`LOCKS_MAX`] locks.
pub fn parse_lock_range(text: &str) -> Result<Range<u64>, String> {
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

/// The kind and the node an error names, for the checker.
pub fn classify(error: &LockError) -> (&'static str, Option<NodeId>) {
    match error {
        LockError::Timeout { blocked_on, .. } => ("timeout", *blocked_on),
        LockError::PeerDead { node, .. } => ("peer_dead", Some(*node)),
        LockError::Broken { .. } => ("broken", None),
        LockError::WouldBlock { .. } => ("would_block", None),
        _ => ("other", None),
    }
}

/// Creates every lock in `locks` (idempotent), retrying while its home is
/// not up yet, until [`LOCK_SETUP_TIMEOUT_MS`].
pub fn ensure_locks(manager: &LockManager, locks: impl Iterator<Item = LockId>) -> Result<()> {
    let deadline = tierstack_base::time::instant_now() + Duration::from_millis(LOCK_SETUP_TIMEOUT_MS);
    for lock in locks {
        loop {
            match manager.create_lock(lock) {
                Ok(()) => break,
                Err(e @ (LockError::InvalidLockId { .. } | LockError::TableFull { .. } | LockError::Config(_))) => {
                    return Err(e).with_context(|| format!("creating {lock}"));
                }
                Err(e) if tierstack_base::time::instant_now() >= deadline => {
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

/// Before `ready`: a lock server creates the locks of `locks` it is home
/// to; any other node creates every lock (see the module documentation).
pub fn ensure_locks_before_ready(
    manager: &LockManager,
    servers: &[NodeId],
    node: NodeId,
    locks: &Range<u64>,
) -> Result<()> {
    let all = || (locks.start..locks.end).map(LockId);
    ensure_locks(manager, all().filter(|&l| home_of(l, servers) == Some(node)))?;
    if !servers.contains(&node) {
        ensure_locks(manager, all())?;
    }
    Ok(())
}

/// After `go`: a lock server checks that the other servers' locks exist
/// (a non-server did so before `ready`).
pub fn ensure_locks_after_go(
    manager: &LockManager,
    servers: &[NodeId],
    node: NodeId,
    locks: &Range<u64>,
) -> Result<()> {
    if servers.contains(&node) {
        ensure_locks(manager, (locks.start..locks.end).map(LockId))?;
    }
    Ok(())
}

/// The node's summary once its operations are done.
fn done_line(workload: &HoldWorkload, scheme: &str, tally: HoldTally, stats: &DlmStats) -> Value {
    json!({
    "done": workload.node.0, "scheme": scheme, "ops": workload.ops, "holds": tally.holds, "errors": tally.errors,
    "messages_handled": stats.messages_handled, "message_errors": stats.message_errors,
    "moves": stats.moves, "rehomes": stats.rehomes, "peers_lost": stats.peers_lost, "violations": stats.violations,
    })
}

/// Stops `manager` and writes the node's last line, with the lock traffic
/// it served after its own operations.
pub fn emit_stopped(out: &mut impl Write, node: NodeId, manager: LockManager) -> Result<()> {
    let stats = manager.stats();
    drop(manager);
    emit(
        out,
        &json!({
        "stopped": node.0, "messages_handled": stats.messages_handled, "message_errors": stats.message_errors,
        }),
    )
}

/// The seeded sequence of (lock, mode) choices of one node: the generator
/// is seeded with `seed + node`, so nodes of one run differ and a run
/// replays.
pub struct HoldPlan {
    rng: SeededRng,
    locks: Range<u64>,
    shared_percent: u32,
}

impl HoldPlan {
    pub fn new(seed: u64, node: NodeId, locks: Range<u64>, shared_percent: u32) -> Self {
        Self { rng: seeded_rng(seed.wrapping_add(u64::from(node.0))), locks, shared_percent }
    }
}

impl Iterator for HoldPlan {
    type Item = (LockId, LockMode);

    fn next(&mut self) -> Option<(LockId, LockMode)> {
        let lock = LockId(self.rng.gen_range(self.locks.clone()));
        let shared = self.rng.gen_range(0..100) < self.shared_percent;
        Some((lock, if shared { LockMode::Shared } else { LockMode::Exclusive }))
    }
}

/// What one node runs.
#[derive(Clone, Debug)]
pub struct HoldWorkload {
    pub node: NodeId,
    /// The locks to operate on (END exclusive).
    pub locks: Range<u64>,
    /// Acquire/hold/release operations to run.
    pub ops: usize,
    /// Percent of the operations that acquire in shared mode.
    pub shared_percent: u32,
    pub seed: u64,
    /// How long each hold lasts (zero: just yield).
    pub hold: Duration,
    /// Bound on each acquire.
    pub acquire_timeout: Duration,
    /// Report grants as they happen and the messages handled during holds.
    pub announce: bool,
    /// Start no operation at or after this `CLOCK_MONOTONIC` time (ns).
    pub run_until_ns: Option<u64>,
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldTally {
    pub holds: usize,
    pub errors: usize,
}

/// Writes one line and flushes it, so a reader sees it at once.
pub fn emit(out: &mut impl Write, line: &Value) -> Result<()> {
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The line of a failed acquire or release.
pub fn error_line(node: NodeId, lock: LockId, mode: LockMode, phase: &str, error: &LockError, start_ns: u64) -> Value {
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

impl HoldWorkload {
    /// [`run`](Self::run), then the summary line (`scheme` names the lock scheme in it).
    pub fn run_and_summarize(&self, manager: &LockManager, scheme: &str, out: &mut impl Write) -> Result<HoldTally> {
        let tally = self.run(manager, out)?;
        emit(out, &done_line(self, scheme, tally, &manager.stats()))?;
        Ok(tally)
    }

    /// Runs the operations on `manager`, writing a line per hold or failure
    /// to `out` (see the module documentation).
    pub fn run(&self, manager: &LockManager, out: &mut impl Write) -> Result<HoldTally> {
        let node = self.node;
        let scheme = manager.scheme().clone();
        let mut tally = HoldTally::default();
        let plan = HoldPlan::new(self.seed, node, self.locks.clone(), self.shared_percent);
        for (lock, mode) in plan.take(self.ops) {
            if self.run_until_ns.is_some_and(|end| monotonic_ns() >= end) {
                break;
            }
            let start_ns = monotonic_ns();
            let grant: Grant = match scheme.acquire(lock, mode, Wait::Timeout(self.acquire_timeout)) {
                Ok(grant) => grant,
                Err(e) => {
                    tally.errors += 1;
                    emit(out, &error_line(node, lock, mode, "acquire", &e, start_ns))?;
                    if !matches!(e, LockError::Timeout { .. }) {
                        std::thread::sleep(Duration::from_millis(FAILED_ACQUIRE_PAUSE_MS));
                    }
                    continue;
                }
            };
            // Read after the grant returned and before the release is called:
            // the recorded interval lies inside the real hold.
            let granted_ns = monotonic_ns();
            let token = grant.fencing_token();
            if self.announce {
                emit(
                    out,
                    &json!({
                        "event": "granted", "node": node.0, "lock": lock.0, "mode": mode.name(),
                        "token": token, "granted_ns": granted_ns,
                    }),
                )?;
            }
            self.hold_for(manager, out)?;
            let released_ns = monotonic_ns();
            if let Err(e) = scheme.release(&grant) {
                tally.errors += 1;
                let mut line = error_line(node, lock, mode, "release", &e, start_ns);
                line["token"] = json!(token);
                line["granted_ns"] = json!(granted_ns);
                line["released_ns"] = json!(released_ns);
                emit(out, &line)?;
                continue;
            }
            tally.holds += 1;
            emit(
                out,
                &json!({
                    "node": node.0, "lock": lock.0, "mode": mode.name(), "token": token,
                    "start_ns": start_ns, "granted_ns": granted_ns, "released_ns": released_ns,
                }),
            )?;
        }
        Ok(tally)
    }

    /// Holds for `self.hold`; with `announce`, reports the lock messages handled meanwhile.
    fn hold_for(&self, manager: &LockManager, out: &mut impl Write) -> Result<()> {
        if !self.announce {
            if self.hold.is_zero() {
                std::thread::yield_now();
            } else {
                std::thread::sleep(self.hold);
            }
            return Ok(());
        }
        let end = tierstack_base::time::instant_now() + self.hold;
        let mut seen = manager.stats().messages_handled;
        loop {
            let now = tierstack_base::time::instant_now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_micros(ANNOUNCE_POLL_US)));
            let handled = manager.stats().messages_handled;
            if handled != seen {
                seen = handled;
                emit(out, &json!({ "event": "handled", "node": self.node.0, "messages": handled }))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_creates_its_locks_runs_and_writes_its_summaries() {
        use tierstack_cluster::{local_cluster, Backend};
        use tierstack_dlm::{DlmConfig, Scheme};
        let cluster = local_cluster(Backend::Tcp, 2).unwrap();
        let (servers, nodes) = (vec![NodeId(0)], vec![NodeId(0), NodeId(1)]);
        let start = |i: usize| {
            let config = DlmConfig::new(Scheme::CoShed, servers.clone(), nodes.clone());
            LockManager::start(cluster.fabric(i).clone(), config).unwrap()
        };
        let (home, user) = (start(0), start(1));
        let locks = 0..2;
        ensure_locks_before_ready(&home, &servers, NodeId(0), &locks).unwrap();
        ensure_locks_before_ready(&user, &servers, NodeId(1), &locks).unwrap();
        ensure_locks_after_go(&home, &servers, NodeId(0), &locks).unwrap();
        let workload = HoldWorkload {
            node: NodeId(1),
            locks,
            ops: 3,
            shared_percent: 50,
            seed: 1,
            hold: Duration::ZERO,
            acquire_timeout: Duration::from_secs(30),
            announce: false,
            run_until_ns: None,
        };
        let mut out = Vec::new();
        let tally = workload.run_and_summarize(&user, "ncoshed", &mut out).unwrap();
        assert_eq!(tally, HoldTally { holds: 3, errors: 0 });
        emit_stopped(&mut out, NodeId(1), user).unwrap();
        let lines: Vec<Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 5, "three holds, the summary, the stop");
        assert_eq!(lines[3]["done"], 1);
        assert_eq!(lines[3]["scheme"], "ncoshed");
        assert_eq!((lines[3]["holds"].clone(), lines[3]["errors"].clone()), (json!(3), json!(0)));
        assert_eq!(lines[4]["stopped"], 1);
        drop(home);
    }

    #[test]
    fn a_lock_range_names_one_to_locks_max_locks() {
        assert_eq!(parse_lock_range("0..3"), Ok(0..3));
        assert_eq!(parse_lock_range(" 5 .. 6 "), Ok(5..6));
        assert!(parse_lock_range("3..3").is_err());
        assert!(parse_lock_range("4..3").is_err());
        assert!(parse_lock_range("0..1025").is_err());
        assert_eq!(parse_lock_range("0..1024"), Ok(0..1024));
        assert!(parse_lock_range("7").is_err());
        assert!(parse_lock_range("a..3").is_err());
    }

    #[test]
    fn errors_are_classified_with_the_node_they_name() {
        let dead = LockError::PeerDead { lock: LockId(1), node: NodeId(2), reason: "gone".into() };
        assert_eq!(classify(&dead), ("peer_dead", Some(NodeId(2))));
        let line = error_line(NodeId(0), LockId(1), LockMode::Shared, "acquire", &dead, 7);
        assert_eq!(line["error"], "peer_dead");
        assert_eq!(line["peer"], 2);
        assert_eq!(line["mode"], LockMode::Shared.name());
        assert_eq!(line["start_ns"], 7);
    }

    #[test]
    fn a_plan_replays_and_stays_in_its_range() {
        let a: Vec<_> = HoldPlan::new(1, NodeId(3), 10..14, 50).take(200).collect();
        let b: Vec<_> = HoldPlan::new(1, NodeId(3), 10..14, 50).take(200).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|(lock, _)| (10..14).contains(&lock.0)));
        let other: Vec<_> = HoldPlan::new(1, NodeId(4), 10..14, 50).take(200).collect();
        assert_ne!(a, other, "each node has its own sequence");
        let shared = a.iter().filter(|(_, mode)| *mode == LockMode::Shared).count();
        assert!((50..150).contains(&shared), "about half shared: {shared}");
    }

    #[test]
    fn the_shared_percent_bounds_the_modes() {
        assert!(HoldPlan::new(9, NodeId(0), 0..1, 0).take(100).all(|(_, m)| m == LockMode::Exclusive));
        assert!(HoldPlan::new(9, NodeId(0), 0..1, 100).take(100).all(|(_, m)| m == LockMode::Shared));
    }

    #[test]
    fn lines_are_flushed_one_per_call() {
        let mut out = Vec::new();
        emit(&mut out, &json!({ "a": 1 })).unwrap();
        emit(&mut out, &json!({ "b": 2 })).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "{\"a\":1}\n{\"b\":2}\n");
    }
}
