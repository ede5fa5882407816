//! The measurements behind `tierstack bench dlm` (the services paper's
//! Fig. 5, lock cascading latency), as library functions over any fabric.
//!
//! Node roles, for every scheme alike: node 0 is the only lock server (the
//! home), node 1 the first holder, nodes 2.. the waiters; so a cascade with
//! N waiters needs N + 2 fabrics. Nodes may be threads of one process, each
//! with its own fabric, or separate processes.
//!
//! A **cascade** (one sample): node 1 takes the lock exclusively; N waiters
//! request it (all shared, or all exclusive) and block; once every waiter
//! is known to be queued (each queued request costs exactly one message,
//! which the managers count), node 1 releases. The sample is the time from
//! that release until the last waiter is granted; each waiter releases as
//! soon as it is granted (the exclusive queue cascades through all of them).
//! Each round starts only when no message is in flight (sent and handled
//! counts agree) and ends only when every message of the round has been
//! handled, so rounds do not overlap.
//!
//! Regions cannot be unregistered, so each set of managers started on the
//! same fabrics needs its own region prefix ([`start_managers`]). In one
//! process the first scheme measured runs measurably slower than later ones
//! (warm-up of threads and connections), so a fair run measures every scheme
//! once to warm up and then again.

use crate::runtime::{DlmConfig, LockManager, Scheme, Wait};
use crate::{LockError, LockId, LockMode};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierstack_base::{Clock, NodeId, SystemClock};
use tierstack_fabric::Fabric;

/// The lock every measurement uses.
pub const BENCH_LOCK: LockId = LockId(0xF15);
/// Bound on every wait of a measurement; reaching it is an error, not a sample.
pub const BENCH_WAIT: Duration = Duration::from_secs(30);

/// Starts a `scheme` lock manager on every fabric (node 0 serves locks) and
/// creates [`BENCH_LOCK`]. The managers own their fabrics' inboxes; their
/// regions are named under `region_prefix` (one prefix per scheme and fabric
/// set: regions cannot be unregistered).
pub fn start_managers(
    fabrics: &[Arc<dyn Fabric>],
    scheme: Scheme,
    region_prefix: &str,
) -> Result<Vec<LockManager>, LockError> {
    let nodes: Vec<NodeId> = fabrics.iter().map(|f| f.local_node()).collect();
    let server = *nodes.first().ok_or_else(|| LockError::Config("no fabrics".into()))?;
    let managers = fabrics
        .iter()
        .map(|f| {
            let config = DlmConfig::new(scheme, vec![server], nodes.clone()).with_region_prefix(region_prefix);
            LockManager::start(f.clone(), config)
        })
        .collect::<Result<Vec<_>, _>>()?;
    managers[0].create_lock(BENCH_LOCK)?;
    Ok(managers)
}

fn total_messages(managers: &[LockManager]) -> u64 {
    managers.iter().map(|m| m.stats().messages_handled).sum()
}

fn total_sent(managers: &[LockManager]) -> u64 {
    managers.iter().map(|m| m.stats().messages_sent).sum()
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
fn wait_quiescent(managers: &[LockManager]) -> Result<(), LockError> {
    let started = Instant::now();
    loop {
        // Each counter only grows, so equal sums mean no send happened while
        // the handled counts were read; handled >= sent then means none is
        // in flight. (Handled may exceed sent after a send that reported an
        // error although its frame was delivered.)
        let sent_before = total_sent(managers);
        let handled = total_messages(managers);
        if sent_before == total_sent(managers) && handled >= sent_before {
            return Ok(());
        }
        if started.elapsed() > BENCH_WAIT {
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Err(LockError::Timeout { lock: BENCH_LOCK, waited_ms, blocked_on: None });
        }
        std::thread::yield_now();
    }
}

fn wait_for_messages(managers: &[LockManager], at_least: u64) -> Result<(), LockError> {
    let started = Instant::now();
    while total_messages(managers) < at_least {
        if started.elapsed() > BENCH_WAIT {
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Err(LockError::Timeout { lock: BENCH_LOCK, waited_ms, blocked_on: None });
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
/// the first release until the last waiter is granted. `managers` come from
/// [`start_managers`] and must number at least `waiters + 2`.
pub fn cascade_latency_ns(managers: &[LockManager], mode: LockMode, waiters: usize) -> Result<u64, LockError> {
    if managers.len() < waiters + 2 {
        return Err(LockError::Config(format!("{} nodes cannot host {waiters} waiters", managers.len())));
    }
    let scheme = managers[0].scheme().scheme();
    let clock = SystemClock;
    wait_quiescent(managers)?;
    let round_start = total_messages(managers);
    let holder = managers[1].acquire_exclusive(BENCH_LOCK, BENCH_WAIT)?;
    let holder_messages = if scheme == Scheme::Srsl { 2 } else { 0 };
    std::thread::scope(|scope| {
        let handles: Vec<_> = managers[2..waiters + 2]
            .iter()
            .map(|m| {
                scope.spawn(move || {
                    let grant = m.scheme().acquire(BENCH_LOCK, mode, Wait::Timeout(BENCH_WAIT))?;
                    let granted_ns = clock.now_ns();
                    m.scheme().release(&grant)?;
                    Ok::<u64, LockError>(granted_ns)
                })
            })
            .collect();
        wait_for_messages(managers, round_start + holder_messages + waiters as u64)?;
        let released_ns = clock.now_ns();
        holder.release()?;
        let mut last_ns = released_ns;
        for handle in handles {
            let granted_ns = handle.join().map_err(|_| LockError::Protocol("a waiter thread panicked".into()))??;
            last_ns = last_ns.max(granted_ns);
        }
        wait_for_messages(managers, round_start + messages_per_round(scheme, waiters as u64))?;
        Ok(last_ns - released_ns)
    })
}

/// `iterations` uncontended acquire+release pairs by node 1 on a lock homed
/// at node 0; nanoseconds each (after a short warm-up).
pub fn uncontended_ns(managers: &[LockManager], mode: LockMode, iterations: usize) -> Result<Vec<u64>, LockError> {
    let me = managers.get(1).ok_or_else(|| LockError::Config("needs two nodes".into()))?;
    let clock = SystemClock;
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations + iterations / 10 + 1 {
        let start = clock.now_ns();
        let grant = me.scheme().acquire(BENCH_LOCK, mode, Wait::Timeout(BENCH_WAIT))?;
        me.scheme().release(&grant)?;
        if i > iterations / 10 {
            samples.push(clock.now_ns() - start);
        }
    }
    Ok(samples)
}

/// `contenders` nodes (1..=contenders) each run `ops_per_node`
/// acquire+release pairs on one lock, `shared_percent` of them shared
/// (chosen by a seeded generator); returns completed pairs per second,
/// over the span from the first contender's start to the last one's end
/// (each contender times itself: a coordinating thread may be descheduled
/// past the whole run on a loaded machine).
pub fn contended_throughput(
    managers: &[LockManager],
    contenders: usize,
    shared_percent: u32,
    ops_per_node: usize,
    seed: u64,
) -> Result<f64, LockError> {
    use rand::Rng;
    if managers.len() < contenders + 1 {
        return Err(LockError::Config(format!("{} nodes cannot host {contenders} contenders", managers.len())));
    }
    let start = std::sync::Barrier::new(contenders);
    let (first_start, last_end) = std::thread::scope(|scope| {
        let start = &start;
        let handles: Vec<_> = managers[1..contenders + 1]
            .iter()
            .enumerate()
            .map(|(i, m)| {
                scope.spawn(move || {
                    let mut rng = tierstack_base::seeded_rng(seed.wrapping_add(i as u64));
                    start.wait();
                    let began = Instant::now();
                    for _ in 0..ops_per_node {
                        let mode =
                            if rng.gen_range(0..100) < shared_percent { LockMode::Shared } else { LockMode::Exclusive };
                        let grant = m.scheme().acquire(BENCH_LOCK, mode, Wait::Timeout(BENCH_WAIT))?;
                        m.scheme().release(&grant)?;
                    }
                    Ok::<(Instant, Instant), LockError>((began, Instant::now()))
                })
            })
            .collect();
        let mut span: Option<(Instant, Instant)> = None;
        for handle in handles {
            let (began, ended) =
                handle.join().map_err(|_| LockError::Protocol("a contender thread panicked".into()))??;
            span = Some(span.map_or((began, ended), |(first, last)| (first.min(began), last.max(ended))));
        }
        span.ok_or_else(|| LockError::Config("no contenders".into()))
    })?;
    // Leave no message in flight for whatever is measured next.
    wait_quiescent(managers)?;
    let seconds = last_end.duration_since(first_start).as_secs_f64();
    Ok((contenders * ops_per_node) as f64 / seconds.max(f64::MIN_POSITIVE))
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

impl CascadeRow {
    pub fn median_ns(&self) -> u64 {
        median(&self.samples_ns)
    }
}

/// The median of `samples` (0 if empty).
pub fn median(samples: &[u64]) -> u64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

/// Fig. 5 for one scheme (that of `managers`, from [`start_managers`]):
/// {shared, exclusive} × `waiter_counts`, `rounds` cascades per cell after
/// one warm-up cascade. `managers` must number at least
/// `max(waiter_counts) + 2`.
pub fn figure5(managers: &[LockManager], waiter_counts: &[usize], rounds: usize) -> Result<Vec<CascadeRow>, LockError> {
    let scheme = managers.first().ok_or_else(|| LockError::Config("no managers".into()))?.scheme().scheme();
    let mut rows = Vec::new();
    for mode in [LockMode::Shared, LockMode::Exclusive] {
        for &waiters in waiter_counts {
            cascade_latency_ns(managers, mode, waiters)?; // warm-up: connections, caches
            let samples_ns =
                (0..rounds).map(|_| cascade_latency_ns(managers, mode, waiters)).collect::<Result<Vec<_>, _>>()?;
            rows.push(CascadeRow { scheme, mode, waiters, samples_ns });
        }
    }
    Ok(rows)
}
