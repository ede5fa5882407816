//! The measurements behind `tierstack bench dlm` (the services paper's
//! Fig. 5, lock cascading latency), as library functions over any set of
//! lock-manager nodes ([`LockNodes`], whose node side is
//! `tierstack_dlm::harness`): threads of this process, each with its own
//! fabric ([`ThreadNodes`]), or separate OS processes driven over pipes
//! (the process nodes).
//!
//! Node roles, for every scheme alike: node 0 is the only lock server (the
//! home), node 1 the first holder, nodes 2.. the waiters; so a cascade with
//! N waiters needs N + 2 nodes.
//!
//! A **cascade** (one sample): node 1 takes the lock exclusively; N waiters
//! request it (all shared, or all exclusive) and block; once every waiter
//! is known to be queued (each queued request costs exactly one message,
//! which the managers count), node 1 releases. The sample is the time from
//! that release until the last waiter is granted, both read from the host's
//! monotonic clock ([`tierstack_base::HostClock`]) so that they compare across processes;
//! each waiter releases as soon as it is granted (the exclusive queue
//! cascades through all of them). Each round starts only when no message is
//! in flight (sent and handled counts agree) and ends only when every
//! message of the round has been handled, so rounds do not overlap.
//!
//! Regions cannot be unregistered, so each set of managers started on the
//! same fabrics needs its own region prefix ([`LockNodes::start`]). The first
//! scheme measured runs measurably slower than later ones (warm-up of
//! threads and connections), so a fair run measures every scheme once to
//! warm up and then again.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tierstack_dlm::harness::{
    contend_pairs, hold_exclusive, overall_span, release_timed, start_managers, uncontended_pairs_ns, wait_and_release,
    LockNodes, MessageTotals, BENCH_LOCK, BENCH_WAIT,
};
use tierstack_dlm::{Grant, LockError, LockManager, LockMode, Scheme};
use tierstack_fabric::Fabric;

/// Every node a thread of this process with its own fabric and manager.
pub struct ThreadNodes {
    fabrics: Vec<Arc<dyn Fabric>>,
    managers: Vec<Arc<LockManager>>,
    holds: HashMap<usize, Grant>,
    waiters: HashMap<usize, JoinHandle<Result<u64, LockError>>>,
}

impl ThreadNodes {
    /// Nodes over `fabrics`; [`LockNodes::start`] starts their managers.
    pub fn new(fabrics: Vec<Arc<dyn Fabric>>) -> Self {
        Self { fabrics, managers: Vec::new(), holds: HashMap::new(), waiters: HashMap::new() }
    }

    /// The running managers, for diagnostics.
    pub fn managers(&self) -> &[Arc<LockManager>] {
        &self.managers
    }

    fn manager(&self, node: usize) -> Result<&Arc<LockManager>, LockError> {
        self.managers.get(node).ok_or_else(|| LockError::Config(format!("no running manager on node index {node}")))
    }
}

fn panicked(what: &str) -> LockError {
    LockError::Protocol(format!("a {what} thread panicked"))
}

impl LockNodes for ThreadNodes {
    fn count(&self) -> usize {
        self.fabrics.len()
    }

    fn start(&mut self, scheme: Scheme, region_prefix: &str) -> Result<(), LockError> {
        // The old managers release their fabrics' lock channels before new ones take them.
        self.holds.clear();
        for (_, waiter) in self.waiters.drain() {
            waiter.join().map_err(|_| panicked("waiter"))??;
        }
        self.managers.clear();
        self.managers = start_managers(&self.fabrics, scheme, region_prefix)?.into_iter().map(Arc::new).collect();
        Ok(())
    }

    fn scheme(&self) -> Result<Scheme, LockError> {
        Ok(self.manager(0)?.scheme().scheme())
    }

    fn totals(&mut self) -> Result<MessageTotals, LockError> {
        Ok(self.managers.iter().map(|m| m.stats()).fold(MessageTotals::default(), |t, s| MessageTotals {
            sent: t.sent + s.messages_sent,
            handled: t.handled + s.messages_handled,
            errors: t.errors + s.message_errors,
        }))
    }

    fn hold(&mut self, node: usize) -> Result<(), LockError> {
        let grant = hold_exclusive(self.manager(node)?)?;
        self.holds.insert(node, grant);
        Ok(())
    }

    fn release_hold(&mut self, node: usize) -> Result<u64, LockError> {
        let grant = self.holds.remove(&node).ok_or(LockError::NotHeld { lock: BENCH_LOCK })?;
        release_timed(self.manager(node)?, &grant)
    }

    fn start_waiter(&mut self, node: usize, mode: LockMode) -> Result<(), LockError> {
        let manager = self.manager(node)?.clone();
        let waiter = std::thread::Builder::new()
            .name(format!("bench-waiter-{node}"))
            .spawn(move || wait_and_release(&manager, mode))
            .map_err(|e| LockError::Protocol(format!("spawning a waiter thread: {e}")))?;
        self.waiters.insert(node, waiter);
        Ok(())
    }

    fn finish_waiter(&mut self, node: usize) -> Result<u64, LockError> {
        let waiter =
            self.waiters.remove(&node).ok_or_else(|| LockError::Config(format!("no waiter on node index {node}")))?;
        waiter.join().map_err(|_| panicked("waiter"))?
    }

    fn uncontended_ns(&mut self, node: usize, mode: LockMode, pairs: usize) -> Result<Vec<u64>, LockError> {
        uncontended_pairs_ns(self.manager(node)?, mode, pairs)
    }

    fn contend(
        &mut self,
        nodes: Range<usize>,
        shared_percent: u32,
        pairs: usize,
        seed: u64,
    ) -> Result<(u64, u64), LockError> {
        let managers = self
            .managers
            .get(nodes.clone())
            .ok_or_else(|| LockError::Config(format!("nodes {nodes:?} out of {}", self.managers.len())))?;
        let start = std::sync::Barrier::new(managers.len());
        std::thread::scope(|scope| {
            let start = &start;
            let handles: Vec<_> = managers
                .iter()
                .zip(nodes.clone())
                .map(|(m, i)| {
                    scope.spawn(move || {
                        start.wait();
                        contend_pairs(m, shared_percent, pairs, seed.wrapping_add(i as u64))
                    })
                })
                .collect();
            let spans = handles
                .into_iter()
                .map(|handle| handle.join().map_err(|_| panicked("contender"))?)
                .collect::<Result<Vec<_>, _>>()?;
            overall_span(spans)
        })
    }
}

fn bench_timeout(started: Instant) -> LockError {
    let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    LockError::Timeout { lock: BENCH_LOCK, waited_ms, blocked_on: None }
}

/// Waits until every message the managers sent has been handled and
/// counted. A measurement that counts messages must start here: an earlier
/// step can return while one of its messages is uncounted — a release's
/// message (a coordinated `SharedRelease`, an SRSL `Release`) may still be
/// in flight, and a grant message is counted only after its handling has
/// already woken the grantee. Counted late, such a message would satisfy
/// the next round's "every waiter is queued" wait before the last waiter
/// enqueued; the holder then releases early, that waiter finds the lock free
/// and (N-CoShED, DQNL) is granted without any message, and the round's
/// final wait expects a message that is never sent.
pub fn wait_quiescent<N: LockNodes + ?Sized>(nodes: &mut N) -> Result<(), LockError> {
    let started = tierstack_base::time::instant_now();
    loop {
        // Each counter only grows, so equal sums mean no send happened while
        // the handled counts were read; handled >= sent then means none is
        // in flight. (Handled may exceed sent after a send that reported an
        // error although its frame was delivered.)
        let sent_before = nodes.totals()?.sent;
        let handled = nodes.totals()?.handled;
        if sent_before == nodes.totals()?.sent && handled >= sent_before {
            return Ok(());
        }
        if started.elapsed() > BENCH_WAIT {
            return Err(bench_timeout(started));
        }
        std::thread::yield_now();
    }
}

fn wait_for_messages<N: LockNodes + ?Sized>(nodes: &mut N, at_least: u64) -> Result<(), LockError> {
    let started = tierstack_base::time::instant_now();
    while nodes.totals()?.handled < at_least {
        if started.elapsed() > BENCH_WAIT {
            return Err(bench_timeout(started));
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// Messages a round costs in total, so the next round starts quiescent.
fn messages_per_round(scheme: Scheme, waiters: u64) -> u64 {
    match scheme {
        // Acquire, grant and release for the holder and every waiter.
        Scheme::Srsl => 3 * (waiters + 1),
        // Per waiter: its enqueue message (successor notice or shared
        // request) and its grant; releases are atomics or ride on grants.
        Scheme::CoShed | Scheme::Dqnl => 2 * waiters,
    }
}

/// One cascade with `waiters` waiters in `mode`; returns nanoseconds from
/// the first release until the last waiter is granted. `nodes` must number
/// at least `waiters + 2`.
pub fn cascade_latency_ns<N: LockNodes + ?Sized>(
    nodes: &mut N,
    mode: LockMode,
    waiters: usize,
) -> Result<u64, LockError> {
    if nodes.count() < waiters + 2 {
        return Err(LockError::Config(format!("{} nodes cannot host {waiters} waiters", nodes.count())));
    }
    let scheme = nodes.scheme()?;
    wait_quiescent(nodes)?;
    let round_start = nodes.totals()?.handled;
    nodes.hold(1)?;
    let holder_messages = if scheme == Scheme::Srsl { 2 } else { 0 };
    let waiter_nodes = 2..waiters + 2;
    for node in waiter_nodes.clone() {
        nodes.start_waiter(node, mode)?;
    }
    wait_for_messages(nodes, round_start + holder_messages + waiters as u64)?;
    let released_ns = nodes.release_hold(1)?;
    let mut last_ns = released_ns;
    for node in waiter_nodes {
        last_ns = last_ns.max(nodes.finish_waiter(node)?);
    }
    wait_for_messages(nodes, round_start + messages_per_round(scheme, waiters as u64))?;
    Ok(last_ns - released_ns)
}

/// `pairs` uncontended acquire+release pairs by node 1 on a lock homed at
/// node 0; nanoseconds each (after a short warm-up).
pub fn uncontended_ns<N: LockNodes + ?Sized>(
    nodes: &mut N,
    mode: LockMode,
    pairs: usize,
) -> Result<Vec<u64>, LockError> {
    if nodes.count() < 2 {
        return Err(LockError::Config("needs two nodes".into()));
    }
    nodes.uncontended_ns(1, mode, pairs)
}

/// `contenders` nodes (1..=contenders) each run `pairs_per_node`
/// acquire+release pairs on one lock, `shared_percent` of them shared
/// (chosen by a seeded generator); returns completed pairs per second,
/// over the span from the first contender's start to the last one's end
/// (each contender times itself: a coordinator may be descheduled past the
/// whole run on a loaded machine).
pub fn contended_throughput<N: LockNodes + ?Sized>(
    nodes: &mut N,
    contenders: usize,
    shared_percent: u32,
    pairs_per_node: usize,
    seed: u64,
) -> Result<f64, LockError> {
    if contenders == 0 || nodes.count() < contenders + 1 {
        return Err(LockError::Config(format!("{} nodes cannot host {contenders} contenders", nodes.count())));
    }
    let (first_start, last_end) = nodes.contend(1..contenders + 1, shared_percent, pairs_per_node, seed)?;
    // Leave no message in flight for whatever is measured next.
    wait_quiescent(nodes)?;
    let seconds = last_end.saturating_sub(first_start) as f64 / 1e9;
    Ok((contenders * pairs_per_node) as f64 / seconds.max(f64::MIN_POSITIVE))
}

/// One cell of Fig. 5.
#[derive(Clone, Debug, PartialEq)]
pub struct CascadeRow {
    pub scheme: Scheme,
    pub mode: LockMode,
    pub waiters: usize,
    /// One sample per round, nanoseconds.
    pub samples_ns: Vec<u64>,
}

/// Fig. 5 for the running scheme: {shared, exclusive} × `waiter_counts`,
/// `rounds` cascades per cell after one warm-up cascade. `nodes` must
/// number at least `max(waiter_counts) + 2`.
pub fn figure5<N: LockNodes + ?Sized>(
    nodes: &mut N,
    waiter_counts: &[usize],
    rounds: usize,
) -> Result<Vec<CascadeRow>, LockError> {
    let scheme = nodes.scheme()?;
    let mut rows = Vec::new();
    for mode in [LockMode::Shared, LockMode::Exclusive] {
        for &waiters in waiter_counts {
            cascade_latency_ns(nodes, mode, waiters)?; // warm-up: connections, caches
            let samples_ns =
                (0..rounds).map(|_| cascade_latency_ns(nodes, mode, waiters)).collect::<Result<Vec<_>, _>>()?;
            rows.push(CascadeRow { scheme, mode, waiters, samples_ns });
        }
    }
    Ok(rows)
}
