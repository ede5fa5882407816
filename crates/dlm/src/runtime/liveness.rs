//! Liveness: this node's lease (renewed by the heartbeat thread, which
//! also notices when the node itself was stopped for most of a lease) and
//! the monitor's judgement of other nodes: lost when their process ended,
//! the incarnation this node talked to ended, or their heartbeat stood
//! still for a whole lease.

use super::node::Core;
use crate::error::LockError;
use crate::status::{HEARTBEAT_OFFSET, INCARNATION_OFFSET};
use crate::LockId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierstack_base::sync::lock;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_fabric::{FabricError, PeerState, RemoteRegion};

/// This node's lease: the heartbeat thread's record of its own renewals.
pub(super) struct Lease {
    lease: Duration,
    /// Renewals that came later than [`Lease::gap`] after the previous one:
    /// the node was stopped (or starved) for most of a lease.
    lapses: AtomicU64,
    /// `CLOCK_MONOTONIC` nanoseconds of the last renewal.
    last_ns: AtomicU64,
}

impl Lease {
    pub(super) fn new(lease: Duration) -> Self {
        Self { lease, lapses: AtomicU64::new(0), last_ns: AtomicU64::new(host_monotonic_ns()) }
    }

    /// A gap between renewals at least this long counts as a lapse: below
    /// the lease, so a node that others judged expired (they saw its
    /// heartbeat stand still for a whole lease) always sees its own lapse.
    pub(super) fn gap(&self) -> Duration {
        self.lease * 3 / 4
    }

    pub(super) fn period(&self) -> Duration {
        self.lease / 8
    }

    pub(super) fn renew(&self, memory: &tierstack_fabric::RegionMemory) {
        let now = host_monotonic_ns();
        let last = self.last_ns.load(Ordering::SeqCst);
        if now.saturating_sub(last) >= duration_ns(self.gap()) {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        self.last_ns.store(now, Ordering::SeqCst);
        // The word is ours; a failure would mean a bad offset, which the layout rules out.
        let _ = memory.fetch_add(HEARTBEAT_OFFSET, 1);
    }

    pub(super) fn mark(&self) -> u64 {
        self.lapses.load(Ordering::SeqCst)
    }

    /// True if the node lapsed since `mark` was taken, or is lapsing now
    /// (its heartbeat thread has not run since it was woken).
    pub(super) fn lapsed_since(&self, mark: u64) -> bool {
        // `last_ns` first: a renewal that counted a lapse stored it after the count.
        let last = self.last_ns.load(Ordering::SeqCst);
        let lapses = self.lapses.load(Ordering::SeqCst);
        lapses != mark || host_monotonic_ns().saturating_sub(last) >= duration_ns(self.gap())
    }
}

pub(super) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the monitor knows of one peer: a handle to its node region (bound
/// to the incarnation it was obtained from) and its heartbeat's progress.
pub(super) struct Watch {
    handle: Option<Arc<dyn RemoteRegion>>,
    beat: Option<u64>,
    since: Instant,
}

impl Core {
    /// Makes sure the monitor holds a handle to `node`'s node region before
    /// this node starts to wait for it: the handle is then bound to the
    /// incarnation the message goes to (or an older one), so that
    /// incarnation's end shows as `PeerDead` on reads through it.
    pub(super) fn watch(&self, node: NodeId) {
        if node == self.me || !self.config.recovery {
            return;
        }
        if lock(&self.watches).get(&node).is_some_and(|w| w.handle.is_some()) {
            return;
        }
        let handle = self.fabric.connect(node, &self.node_region_name).ok();
        let mut watches = lock(&self.watches);
        let watch = watches.entry(node).or_insert_with(|| Watch {
            handle: None,
            beat: None,
            since: tierstack_base::time::instant_now(),
        });
        if watch.handle.is_none() {
            watch.handle = handle;
        }
    }

    /// Drops the handle to `node`'s node region: the next look connects to
    /// the incarnation running then.
    pub(super) fn forget_watch(&self, node: NodeId) {
        if let Some(watch) = lock(&self.watches).get_mut(&node) {
            watch.handle = None;
        }
    }

    /// Reads `node`'s incarnation, heartbeat and lease words through the
    /// watch's handle. `Err(reason)` if the node is dead: its process ended,
    /// or the incarnation the handle is bound to did; `Ok(None)` if it
    /// could not be read (slow, stopped, no lock manager).
    pub(super) fn read_node(&self, node: NodeId) -> Result<Option<[u64; 3]>, String> {
        if self.fabric.peer_state(node) == PeerState::Gone {
            // A handle bound to the ended process must not outlive it: read
            // through later, it would call the node's next incarnation dead.
            self.forget_watch(node);
            return Err("its process ended".into());
        }
        self.watch(node);
        let Some(handle) = lock(&self.watches).get(&node).and_then(|w| w.handle.clone()) else { return Ok(None) };
        let mut bytes = [0u8; 24];
        match handle.read(INCARNATION_OFFSET, &mut bytes) {
            Ok(()) => {
                let word = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
                Ok(Some([word(0), word(1), word(2)]))
            }
            Err(FabricError::PeerDead { reason, .. }) => {
                if let Some(watch) = lock(&self.watches).get_mut(&node) {
                    watch.handle = None;
                }
                Err(format!("the incarnation it talked to ended ({reason})"))
            }
            Err(_) => Ok(None),
        }
    }

    /// `Some(reason)` if `node` is lost: its process ended, the incarnation
    /// this node talked to ended, or (with leases) its heartbeat has not
    /// advanced for a lease. Never for a node that is merely slow within
    /// its lease, nor for this node.
    pub(super) fn lost(&self, node: NodeId) -> Option<String> {
        if node == self.me {
            return None;
        }
        let words = match self.read_node(node) {
            Err(reason) => return Some(reason),
            Ok(words) => words,
        };
        // The node's own lease if it told us, else ours (every node shares
        // the configuration; a node we cannot read cannot renew either).
        let lease = match words.map(|w| w[2]) {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => self.config.lease,
        }?;
        let beat = words.map(|w| w[1]);
        let mut watches = lock(&self.watches);
        let watch = watches.entry(node).or_insert_with(|| Watch {
            handle: None,
            beat: None,
            since: tierstack_base::time::instant_now(),
        });
        if beat.is_some() && beat != watch.beat {
            watch.beat = beat;
            watch.since = tierstack_base::time::instant_now();
            return None;
        }
        (watch.since.elapsed() >= lease).then(|| format!("no heartbeat for its lease of {} ms", lease.as_millis()))
    }

    /// The incarnation `node` runs now, if it can be read (a handle bound
    /// to an ended incarnation is dropped by the first read and a fresh one
    /// reads the next).
    pub(super) fn running_incarnation(&self, node: NodeId) -> Option<u64> {
        let read = match self.read_node(node) {
            Err(_) => self.read_node(node),
            read => read,
        };
        match read {
            Ok(Some([incarnation, ..])) => Some(incarnation),
            _ => None,
        }
    }

    /// `Some(reason)` if the incarnation `epoch` of home `node` is over: its
    /// process ended, or another incarnation runs now. Not a lease: a home's
    /// table works while its process is stopped.
    pub(super) fn home_lost(&self, node: NodeId, epoch: u64) -> Option<String> {
        if node == self.me {
            return (epoch != self.incarnation).then(|| "this node restarted".into());
        }
        // A failed read may be of a handle older than the lock's incarnation:
        // `read_node` dropped it, and a second read uses a fresh one.
        let read = match self.read_node(node) {
            Err(_) => self.read_node(node),
            read => read,
        };
        match read {
            Err(reason) => Some(reason),
            Ok(Some([incarnation, ..])) if incarnation != epoch => {
                Some(format!("it restarted (incarnation {incarnation:#x}, the lock was of {epoch:#x})"))
            }
            Ok(_) => None,
        }
    }

    /// The error for a wait that ran out: `PeerDead` if the node we wait
    /// for is lost, else `Timeout`.
    pub(super) fn timeout_error(&self, lock_id: LockId, waited: Duration, blocked_on: Option<NodeId>) -> LockError {
        if let Some(node) = blocked_on {
            let dead = self.lost(node).or_else(|| match self.fabric.connect(node, &self.node_region_name) {
                Err(e @ FabricError::PeerDead { .. }) => Some(e.to_string()),
                _ => None,
            });
            if let Some(reason) = dead {
                return LockError::PeerDead { lock: lock_id, node, reason };
            }
        }
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        LockError::Timeout { lock: lock_id, waited_ms, blocked_on }
    }

    pub(super) fn lease_mark(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.mark())
    }

    pub(super) fn lapsed_since(&self, mark: u64) -> bool {
        self.lease.as_ref().is_some_and(|l| l.lapsed_since(mark))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::node_region_bytes;
    use tierstack_fabric::RegionMemory;

    fn lease(ms: u64) -> (Lease, RegionMemory) {
        let lease = Lease {
            lease: Duration::from_millis(ms),
            lapses: AtomicU64::new(0),
            last_ns: AtomicU64::new(host_monotonic_ns()),
        };
        (lease, RegionMemory::heap("node", node_region_bytes()).unwrap())
    }

    /// A renewal that comes three quarters of a lease or more after the
    /// previous one counts a lapse, and a hold or wait that spans it (or is
    /// in one now) reports it; renewals on time do not.
    #[test]
    fn a_gap_in_the_heartbeat_is_a_lapse() {
        let (lease, memory) = lease(40);
        let mark = lease.mark();
        lease.renew(&memory);
        lease.renew(&memory);
        assert!(!lease.lapsed_since(mark), "renewals on time");
        assert_eq!(memory.load_u64(HEARTBEAT_OFFSET).unwrap(), 2, "each renewal advances the heartbeat");
        std::thread::sleep(Duration::from_millis(31));
        assert!(lease.lapsed_since(mark), "no renewal for 3/4 of the lease: lapsing now");
        lease.renew(&memory);
        assert!(lease.lapsed_since(mark), "the late renewal counted the lapse");
        let after = lease.mark();
        assert!(!lease.lapsed_since(after), "a request made after the lapse is unaffected");
        assert_eq!(lease.period(), Duration::from_millis(5));
    }
}
