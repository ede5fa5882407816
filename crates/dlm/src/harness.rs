//! What a lock benchmark drives on each lock-manager node: the
//! [`LockNodes`] trait by which a measurement drives a set of nodes (threads
//! of one process, or OS processes over pipes), and each node's side of it
//! (start a manager, hold, release, wait, run uncontended or contended
//! pairs), reading the host's monotonic clock ([`HostClock`]) so that times
//! compare across processes.
//!
//! The measurements themselves (the services paper's Fig. 5: cascades,
//! uncontended latency, contended throughput) live in the `bench` crate
//! (`tierstack_bench::dlm::measure`), and so do the in-process nodes; this
//! module stays here because the node side is lock-manager code, run inside
//! each node process, and the process nodes implement [`LockNodes`] where
//! processes are launched, without depending on the `bench` crate.
//!
//! Node roles, for every scheme alike: node 0 is the only lock server (the
//! home), node 1 the first holder, nodes 2.. the waiters. Regions cannot be
//! unregistered, so each set of managers started on the same fabrics needs
//! its own region prefix ([`LockNodes::start`]).

use crate::runtime::{DlmConfig, Grant, LockManager, Scheme, Wait};
use crate::{LockError, LockId, LockMode};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::{Clock, HostClock, NodeId};
use tierstack_fabric::Fabric;

/// The lock every measurement uses.
pub const BENCH_LOCK: LockId = LockId(0xF15);
/// Bound on every wait of a measurement; reaching it is an error, not a sample.
pub const BENCH_WAIT: Duration = Duration::from_secs(30);

/// Lock-message counters summed over every node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageTotals {
    pub sent: u64,
    pub handled: u64,
    /// Messages whose handling failed (a protocol violation; 0 in a sound run).
    pub errors: u64,
}

/// The lock-manager nodes a measurement drives, by index (node 0 serves
/// the lock). Every call returns once the node has done what it says.
pub trait LockNodes {
    /// How many nodes there are.
    fn count(&self) -> usize;
    /// Starts a fresh `scheme` manager on every node (dropping the previous
    /// one), with regions under `region_prefix`, and creates [`BENCH_LOCK`].
    fn start(&mut self, scheme: Scheme, region_prefix: &str) -> Result<(), LockError>;
    /// The scheme of the running managers.
    fn scheme(&self) -> Result<Scheme, LockError>;
    /// Counters summed over the nodes, each node's read once, one after another.
    fn totals(&mut self) -> Result<MessageTotals, LockError>;
    /// `node` acquires [`BENCH_LOCK`] exclusively and keeps it.
    fn hold(&mut self, node: usize) -> Result<(), LockError>;
    /// `node` releases what [`LockNodes::hold`] took; returns the host clock
    /// read just before the release.
    fn release_hold(&mut self, node: usize) -> Result<u64, LockError>;
    /// `node` starts to acquire [`BENCH_LOCK`] in `mode` and returns at once;
    /// when granted, it reads the host clock and releases.
    fn start_waiter(&mut self, node: usize, mode: LockMode) -> Result<(), LockError>;
    /// Waits for the waiter started on `node`; returns its grant time.
    fn finish_waiter(&mut self, node: usize) -> Result<u64, LockError>;
    /// `pairs` uncontended acquire+release pairs by `node` (after a short
    /// warm-up); nanoseconds each.
    fn uncontended_ns(&mut self, node: usize, mode: LockMode, pairs: usize) -> Result<Vec<u64>, LockError>;
    /// `nodes` each run `pairs` acquire+release pairs on [`BENCH_LOCK`],
    /// starting together, `shared_percent` of them shared (chosen by a
    /// generator seeded with `seed` + the node's index); returns the host
    /// clock at the first node's start and at the last node's end.
    fn contend(
        &mut self,
        nodes: Range<usize>,
        shared_percent: u32,
        pairs: usize,
        seed: u64,
    ) -> Result<(u64, u64), LockError>;
    /// Kills `node` as a crash would (its process gets SIGKILL); returns the
    /// host clock read just before. Only nodes that are processes can.
    fn kill(&mut self, node: usize) -> Result<u64, LockError> {
        Err(LockError::Config(format!("node index {node} cannot be killed: its node is not a process")))
    }
    /// Starts a killed `node` again, with a manager of the running scheme.
    fn restart(&mut self, node: usize) -> Result<(), LockError> {
        Err(LockError::Config(format!("node index {node} cannot be restarted: its node is not a process")))
    }
    /// [`LockNodes::start`] with the first `servers` nodes serving locks
    /// (three or more: re-homing; see `docs/internals/dlm-rehoming.md`).
    fn start_with_servers(&mut self, _scheme: Scheme, _region_prefix: &str, servers: usize) -> Result<(), LockError> {
        Err(LockError::Config(format!("these nodes cannot start with {servers} lock servers")))
    }
    /// The index of [`BENCH_LOCK`]'s current home, as `node` reads it.
    fn home(&mut self, node: usize) -> Result<usize, LockError> {
        Err(LockError::Config(format!("node index {node} cannot tell the lock's home")))
    }
}

/// Starts a `scheme` lock manager on every fabric (node 0 serves locks) and
/// creates [`BENCH_LOCK`]. The managers drain their fabrics' lock channels; their
/// regions are named under `region_prefix` (one prefix per scheme and fabric
/// set: regions cannot be unregistered).
pub fn start_managers(
    fabrics: &[Arc<dyn Fabric>],
    scheme: Scheme,
    region_prefix: &str,
) -> Result<Vec<LockManager>, LockError> {
    let nodes: Vec<NodeId> = fabrics.iter().map(|f| f.local_node()).collect();
    fabrics.iter().map(|f| start_manager(f, &nodes, scheme, region_prefix)).collect()
}

/// Starts the `scheme` lock manager of one of `nodes` (the first serves
/// locks; it also creates [`BENCH_LOCK`]), on `fabric`.
pub fn start_manager(
    fabric: &Arc<dyn Fabric>,
    nodes: &[NodeId],
    scheme: Scheme,
    region_prefix: &str,
) -> Result<LockManager, LockError> {
    start_manager_with_servers(fabric, nodes, scheme, region_prefix, 1)
}

/// [`start_manager`] with the first `servers` of `nodes` serving locks;
/// each creates [`BENCH_LOCK`] (at every server it reaches, with
/// re-homing, so the last to start leaves a slot at each).
pub fn start_manager_with_servers(
    fabric: &Arc<dyn Fabric>,
    nodes: &[NodeId],
    scheme: Scheme,
    region_prefix: &str,
    servers: usize,
) -> Result<LockManager, LockError> {
    if servers == 0 || servers > nodes.len() {
        return Err(LockError::Config(format!("{servers} lock servers among {} nodes", nodes.len())));
    }
    let lock_servers = nodes[..servers].to_vec();
    let config = DlmConfig::new(scheme, lock_servers.clone(), nodes.to_vec()).with_region_prefix(region_prefix);
    let manager = LockManager::start(fabric.clone(), config)?;
    if lock_servers.contains(&fabric.local_node()) {
        manager.create_lock(BENCH_LOCK)?;
    }
    Ok(manager)
}

/// One manager's side of [`LockNodes::hold`].
pub fn hold_exclusive(manager: &LockManager) -> Result<Grant, LockError> {
    manager.scheme().acquire(BENCH_LOCK, LockMode::Exclusive, Wait::Timeout(BENCH_WAIT))
}

/// One manager's side of [`LockNodes::release_hold`]: releases `grant`;
/// returns the host clock read just before.
pub fn release_timed(manager: &LockManager, grant: &Grant) -> Result<u64, LockError> {
    let released_ns = HostClock.now_ns();
    manager.scheme().release(grant)?;
    Ok(released_ns)
}

/// From the earliest start to the latest end of `spans`, as
/// [`LockNodes::contend`] returns them; an error if there are none.
pub fn overall_span(spans: impl IntoIterator<Item = (u64, u64)>) -> Result<(u64, u64), LockError> {
    spans
        .into_iter()
        .reduce(|(first, last), (began, ended)| (first.min(began), last.max(ended)))
        .ok_or_else(|| LockError::Config("no contenders".into()))
}

/// One manager's side of [`LockNodes::uncontended_ns`].
pub fn uncontended_pairs_ns(manager: &LockManager, mode: LockMode, pairs: usize) -> Result<Vec<u64>, LockError> {
    let clock = HostClock;
    let mut samples = Vec::with_capacity(pairs);
    for i in 0..pairs + pairs / 10 + 1 {
        let start = clock.now_ns();
        let grant = manager.scheme().acquire(BENCH_LOCK, mode, Wait::Timeout(BENCH_WAIT))?;
        manager.scheme().release(&grant)?;
        if i > pairs / 10 {
            samples.push(clock.now_ns() - start);
        }
    }
    Ok(samples)
}

/// One manager's side of [`LockNodes::contend`], once started: returns the
/// host clock at its start and end.
pub fn contend_pairs(
    manager: &LockManager,
    shared_percent: u32,
    pairs: usize,
    seed: u64,
) -> Result<(u64, u64), LockError> {
    use rand::Rng;
    let mut rng = tierstack_base::seeded_rng(seed);
    let began = HostClock.now_ns();
    for _ in 0..pairs {
        let mode = if rng.gen_range(0..100) < shared_percent { LockMode::Shared } else { LockMode::Exclusive };
        let grant = manager.scheme().acquire(BENCH_LOCK, mode, Wait::Timeout(BENCH_WAIT))?;
        manager.scheme().release(&grant)?;
    }
    Ok((began, HostClock.now_ns()))
}

/// One waiter of a cascade: acquire, read the host clock, release.
pub fn wait_and_release(manager: &LockManager, mode: LockMode) -> Result<u64, LockError> {
    let grant = manager.scheme().acquire(BENCH_LOCK, mode, Wait::Timeout(BENCH_WAIT))?;
    let granted_ns = HostClock.now_ns();
    manager.scheme().release(&grant)?;
    Ok(granted_ns)
}
