//! What an operator watches of a lock manager: [`DlmMetrics`], kept by a
//! [`LockScheme`] wrapper ([`Metered`]) that every [`super::LockManager`]
//! puts around its scheme, so that every acquire and release — through the
//! guards or through [`super::LockManager::scheme`] — is counted once.
//!
//! Counting is a few relaxed atomic adds and one histogram record per
//! acquire (the histogram is atomics too): no lock on the lock path. The
//! protocol's own counters ([`DlmStats`]: messages handled, recoveries)
//! are read from the scheme when the metrics are written.

use super::{DlmStats, Grant, LockScheme, Scheme, Wait};
use crate::error::LockError;
use crate::proto::LockMode;
use crate::LockId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tierstack_base::NodeId;
use tierstack_stats::exposition::{Exposition, SecondsHistogram};

/// Upper bounds of the acquire-wait buckets, seconds: an uncontended
/// one-sided grant takes microseconds, a queued one as long as the holds
/// before it, a recovery about a lease.
const ACQUIRE_WAIT_BOUNDS: &[f64] =
    &[10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1.0, 10.0, 30.0];

/// A lock manager's metrics (see the module documentation); shared, so a
/// metrics listener can hold them while the manager runs.
pub struct DlmMetrics {
    acquires_shared: AtomicU64,
    acquires_exclusive: AtomicU64,
    acquire_failures: AtomicU64,
    releases: AtomicU64,
    /// Every release call, successful or not: a grant ends with it.
    holds_ended: AtomicU64,
    fenced: AtomicU64,
    acquire_wait: SecondsHistogram,
    /// The scheme, for its protocol counters while it runs …
    scheme: Mutex<Option<Weak<dyn LockScheme>>>,
    /// … and its last counters once the manager stopped.
    final_stats: Mutex<Option<DlmStats>>,
}

impl DlmMetrics {
    fn new() -> Self {
        DlmMetrics {
            acquires_shared: AtomicU64::new(0),
            acquires_exclusive: AtomicU64::new(0),
            acquire_failures: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            holds_ended: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            acquire_wait: SecondsHistogram::new(ACQUIRE_WAIT_BOUNDS),
            scheme: Mutex::new(None),
            final_stats: Mutex::new(None),
        }
    }

    /// The protocol's counters: the running scheme's, or its last ones.
    pub fn stats(&self) -> DlmStats {
        let running = tierstack_base::sync::lock(&self.scheme).as_ref().and_then(Weak::upgrade);
        match running {
            Some(scheme) => scheme.stats(),
            None => tierstack_base::sync::lock(&self.final_stats).unwrap_or_default(),
        }
    }

    /// Whether the manager still runs (for a readiness check).
    pub fn running(&self) -> bool {
        tierstack_base::sync::lock(&self.final_stats).is_none()
    }

    /// Grants since start, per mode: (shared, exclusive).
    pub fn acquires(&self) -> (u64, u64) {
        (self.acquires_shared.load(Ordering::Relaxed), self.acquires_exclusive.load(Ordering::Relaxed))
    }

    /// Grants not yet released.
    pub fn held(&self) -> u64 {
        let (shared, exclusive) = self.acquires();
        (shared + exclusive).saturating_sub(self.holds_ended.load(Ordering::Relaxed))
    }

    /// Writes the `tierstack_dlm_*` families.
    pub fn write(&self, out: &mut Exposition) {
        let stats = self.stats();
        let (shared, exclusive) = self.acquires();
        out.counters(
            "tierstack_dlm_acquires_total",
            "Lock requests granted, by mode.",
            &[(&[("mode", "shared")], shared), (&[("mode", "exclusive")], exclusive)],
        );
        out.counter(
            "tierstack_dlm_acquire_failures_total",
            "Lock requests that ended without a grant (timeout, busy try, dead peer, broken).",
            self.acquire_failures.load(Ordering::Relaxed),
        );
        out.counter(
            "tierstack_dlm_releases_total",
            "Holds released successfully.",
            self.releases.load(Ordering::Relaxed),
        );
        out.histogram(
            "tierstack_dlm_acquire_wait_seconds",
            "Time from a lock request to its grant.",
            &self.acquire_wait,
        );
        out.counter(
            "tierstack_dlm_recoveries_total",
            "Locks recovered from lost holders without an operator, by this node.",
            stats.recoveries,
        );
        out.counter(
            "tierstack_dlm_rehomes_total",
            "Locks this node made usable at a new home after their home was lost.",
            stats.rehomes,
        );
        out.counter(
            "tierstack_dlm_fenced_total",
            "Acquires and releases refused because a break or recovery revoked them (Broken).",
            self.fenced.load(Ordering::Relaxed),
        );
        out.gauge("tierstack_dlm_held_locks", "Holds granted on this node and not yet released.", self.held() as f64);
        out.counter(
            "tierstack_dlm_messages_handled_total",
            "Lock-manager messages this node handled.",
            stats.messages_handled,
        );
        out.counter(
            "tierstack_dlm_message_errors_total",
            "Lock-manager messages whose handling failed.",
            stats.message_errors,
        );
        out.counter(
            "tierstack_dlm_moves_total",
            "Locks this node moved to a new generation (recoveries and breaks).",
            stats.moves,
        );
    }
}

/// The scheme a [`super::LockManager`] runs, counted (see the module documentation).
pub(super) struct Metered {
    inner: Arc<dyn LockScheme>,
    metrics: Arc<DlmMetrics>,
}

impl Metered {
    /// Wraps `inner`; the metrics read its protocol counters while it lives.
    pub(super) fn wrap(inner: Arc<dyn LockScheme>) -> (Arc<dyn LockScheme>, Arc<DlmMetrics>) {
        let metrics = Arc::new(DlmMetrics::new());
        let scheme: Arc<dyn LockScheme> = Arc::new(Metered { inner, metrics: metrics.clone() });
        *tierstack_base::sync::lock(&metrics.scheme) = Some(Arc::downgrade(&scheme));
        (scheme, metrics)
    }

    /// Keeps `stats` as the last counters: the manager stopped.
    pub(super) fn freeze(metrics: &DlmMetrics, stats: DlmStats) {
        *tierstack_base::sync::lock(&metrics.final_stats) = Some(stats);
        *tierstack_base::sync::lock(&metrics.scheme) = None;
    }

    fn count_error(&self, error: &LockError) {
        if matches!(error, LockError::Broken { .. }) {
            self.metrics.fenced.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl LockScheme for Metered {
    fn scheme(&self) -> Scheme {
        self.inner.scheme()
    }

    fn node(&self) -> NodeId {
        self.inner.node()
    }

    fn create_lock(&self, lock: LockId) -> Result<(), LockError> {
        self.inner.create_lock(lock)
    }

    fn acquire(&self, lock: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
        let result = self.inner.acquire(lock, mode, wait);
        match &result {
            Ok(grant) => {
                self.metrics.acquire_wait.record(grant.waited());
                let granted = match mode {
                    LockMode::Shared => &self.metrics.acquires_shared,
                    LockMode::Exclusive => &self.metrics.acquires_exclusive,
                };
                granted.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.metrics.acquire_failures.fetch_add(1, Ordering::Relaxed);
                self.count_error(e);
            }
        }
        result
    }

    fn release(&self, grant: &Grant) -> Result<(), LockError> {
        let result = self.inner.release(grant);
        self.metrics.holds_ended.fetch_add(1, Ordering::Relaxed);
        match &result {
            Ok(()) => {
                self.metrics.releases.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.count_error(e),
        }
        result
    }

    fn break_lock(&self, lock: LockId) -> Result<u64, LockError> {
        self.inner.break_lock(lock)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        self.inner.handle_message(from, payload)
    }

    fn stats(&self) -> DlmStats {
        self.inner.stats()
    }

    fn tick(&self) {
        self.inner.tick();
    }

    fn waits(&self, lock: LockId) -> Option<crate::proto::Waits> {
        self.inner.waits(lock)
    }

    fn debug_state(&self, lock: LockId) -> String {
        self.inner.debug_state(lock)
    }

    fn placement(&self, lock: LockId) -> Result<super::Placement, LockError> {
        self.inner.placement(lock)
    }
}
