//! [`LockManager`]: one scheme behind [`LockScheme`], the threads that
//! read the inbox, watch for lost nodes and keep the lease, and the guards
//! that release their grant on drop.

use super::liveness::Lease;
use super::metered::{DlmMetrics, Metered};
use super::node::Core;
use super::queue_scheme::QueueScheme;
use super::srsl_scheme::SrslScheme;
use super::{DlmConfig, DlmStats, Grant, LockScheme, Scheme, Wait, RECEIVE_POLL_MS};
use crate::error::LockError;
use crate::proto::{LockMode, QueueKind};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion};

/// A node's lock manager: one scheme, plus the threads that read the
/// fabric's [`Channel::LOCKS`] inbox (unless configured off), watch for
/// lost nodes (with recovery) and keep this node's lease (with leases).
pub struct LockManager {
    /// The scheme, counted ([`Metered`]).
    scheme: Arc<dyn LockScheme>,
    metrics: Arc<DlmMetrics>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LockManager {
    /// Starts the lock manager of `fabric`'s node: registers its lock table
    /// (at lock servers) and its node region, and starts its threads.
    pub fn start(fabric: Arc<dyn Fabric>, config: DlmConfig) -> Result<Self, LockError> {
        let own_inbox = config.own_inbox;
        let scheme_kind = config.scheme;
        let recovery = config.recovery;
        let probe = config.probe_interval;
        let core = Core::new(fabric.clone(), config)?;
        let me = core.me;
        let lease = core.lease.clone();
        let node_region = core.node_region.clone();
        let scheme: Arc<dyn LockScheme> = match scheme_kind {
            Scheme::CoShed => {
                Arc::new(QueueScheme { core, kind: QueueKind::CoShed, cells: Mutex::new(HashMap::new()) })
            }
            Scheme::Dqnl => Arc::new(QueueScheme { core, kind: QueueKind::Dqnl, cells: Mutex::new(HashMap::new()) }),
            Scheme::Srsl => {
                Arc::new(SrslScheme { core, cells: Mutex::new(HashMap::new()), served: Mutex::new(HashMap::new()) })
            }
        };
        let (scheme, metrics) = Metered::wrap(scheme);
        let stop = Arc::new(AtomicBool::new(false));
        let mut manager = Self { scheme, metrics, stop: stop.clone(), threads: Vec::new() };
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| LockError::Config(format!("cannot start a lock manager thread: {e}")))
        };
        if own_inbox {
            let (weak, stop) = (Arc::downgrade(&manager.scheme), stop.clone());
            manager
                .threads
                .push(spawn(format!("dlm-recv-{}", me.0), Box::new(move || receive_loop(fabric, weak, stop)))?);
        }
        if let Some(lease) = lease {
            let stop = stop.clone();
            let run = move || heartbeat_loop(&lease, &node_region, &stop);
            manager.threads.push(spawn(format!("dlm-beat-{}", me.0), Box::new(run))?);
        }
        if recovery {
            let (weak, stop) = (Arc::downgrade(&manager.scheme), stop.clone());
            let run = move || monitor_loop(weak, &stop, probe);
            manager.threads.push(spawn(format!("dlm-watch-{}", me.0), Box::new(run))?);
        }
        Ok(manager)
    }

    /// The scheme behind this manager (for code that is generic over schemes).
    pub fn scheme(&self) -> &Arc<dyn LockScheme> {
        &self.scheme
    }

    pub fn node(&self) -> NodeId {
        self.scheme.node()
    }

    /// Creates `lock` at its home; idempotent. Locks must exist before use.
    pub fn create_lock(&self, lock: LockId) -> Result<(), LockError> {
        self.scheme.create_lock(lock)
    }

    pub fn acquire_shared(&self, lock: LockId, timeout: Duration) -> Result<SharedGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Shared, Wait::Timeout(timeout))?;
        Ok(SharedGuard(GuardInner::new(&self.scheme, grant)))
    }

    pub fn acquire_exclusive(&self, lock: LockId, timeout: Duration) -> Result<ExclusiveGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Exclusive, Wait::Timeout(timeout))?;
        ExclusiveGuard::new(&self.scheme, grant)
    }

    /// Shared if available now, else [`LockError::WouldBlock`] (nothing enqueued).
    pub fn try_acquire_shared(&self, lock: LockId) -> Result<SharedGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Shared, Wait::Try)?;
        Ok(SharedGuard(GuardInner::new(&self.scheme, grant)))
    }

    /// Exclusive if available now, else [`LockError::WouldBlock`] (nothing enqueued).
    pub fn try_acquire_exclusive(&self, lock: LockId) -> Result<ExclusiveGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Exclusive, Wait::Try)?;
        ExclusiveGuard::new(&self.scheme, grant)
    }

    /// See [`LockScheme::break_lock`].
    pub fn break_lock(&self, lock: LockId) -> Result<u64, LockError> {
        self.scheme.break_lock(lock)
    }

    /// Handles one lock-manager message (a payload of [`Channel::LOCKS`]),
    /// for a caller that reads that channel itself ([`DlmConfig::without_receiver`]).
    pub fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        self.scheme.handle_message(from, payload)
    }

    pub fn stats(&self) -> DlmStats {
        self.scheme.stats()
    }

    /// What an operator watches (`/metrics`); they outlive the manager,
    /// keeping its last counters.
    pub fn metrics(&self) -> Arc<DlmMetrics> {
        self.metrics.clone()
    }

    /// See [`LockScheme::debug_state`].
    pub fn debug_state(&self, lock: LockId) -> String {
        self.scheme.debug_state(lock)
    }

    /// See [`LockScheme::placement`].
    pub fn placement(&self, lock: LockId) -> Result<super::Placement, LockError> {
        self.scheme.placement(lock)
    }

    /// See [`LockScheme::waits`].
    pub fn waits(&self, lock: LockId) -> Option<crate::proto::Waits> {
        self.scheme.waits(lock)
    }
}

impl Drop for LockManager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        Metered::freeze(&self.metrics, self.scheme.stats());
    }
}

fn receive_loop(fabric: Arc<dyn Fabric>, scheme: Weak<dyn LockScheme>, stop: Arc<AtomicBool>) {
    let poll = Duration::from_millis(RECEIVE_POLL_MS);
    while !stop.load(Ordering::Acquire) {
        match fabric.inbox(Channel::LOCKS).recv_timeout(poll) {
            Ok(message) => {
                let Some(scheme) = scheme.upgrade() else { return };
                if let Err(e) = scheme.handle_message(message.from, &message.payload) {
                    tracing::warn!(node = %scheme.node(), from = %message.from, error = %e, "lock message failed");
                }
            }
            Err(FabricError::RecvTimeout { .. }) => {}
            Err(e) => {
                tracing::info!(error = %e, "lock manager inbox (channel LOCKS) closed");
                return;
            }
        }
    }
}

/// Sleeps `total`, looking at `stop` every [`RECEIVE_POLL_MS`]; false if stopped.
fn nap(total: Duration, stop: &AtomicBool) -> bool {
    let end = tierstack_base::time::instant_now() + total;
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let left = end.saturating_duration_since(tierstack_base::time::instant_now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(RECEIVE_POLL_MS)));
    }
}

fn monitor_loop(scheme: Weak<dyn LockScheme>, stop: &AtomicBool, interval: Duration) {
    while nap(interval, stop) {
        let Some(scheme) = scheme.upgrade() else { return };
        scheme.tick();
    }
}

fn heartbeat_loop(lease: &Lease, region: &LocalRegion, stop: &AtomicBool) {
    loop {
        lease.renew(region.memory());
        if !nap(lease.period(), stop) {
            return;
        }
    }
}

/// A grant and the scheme to release it to. Guards do not keep the manager
/// alive: after the manager is dropped, release fails with `ShutDown`.
struct GuardInner {
    scheme: Weak<dyn LockScheme>,
    grant: Option<Grant>,
}

impl GuardInner {
    fn new(scheme: &Arc<dyn LockScheme>, grant: Grant) -> Self {
        Self { scheme: Arc::downgrade(scheme), grant: Some(grant) }
    }

    fn release(&mut self) -> Result<(), LockError> {
        let Some(grant) = self.grant.take() else { return Ok(()) };
        self.scheme.upgrade().ok_or(LockError::ShutDown)?.release(&grant)
    }
}

impl Drop for GuardInner {
    fn drop(&mut self) {
        if self.grant.is_some() {
            if let Err(e) = self.release() {
                tracing::warn!(error = %e, "releasing a dropped lock guard failed");
            }
        }
    }
}

/// A shared hold; released on drop, or explicitly with [`SharedGuard::release`].
pub struct SharedGuard(GuardInner);

impl SharedGuard {
    pub fn lock(&self) -> Option<LockId> {
        self.0.grant.as_ref().map(Grant::lock)
    }

    /// Releases the hold and reports whether the release worked
    /// (`Broken` if `break_lock` revoked it meanwhile).
    pub fn release(mut self) -> Result<(), LockError> {
        self.0.release()
    }
}

/// An exclusive hold with its fencing token; released on drop, or
/// explicitly with [`ExclusiveGuard::release`].
pub struct ExclusiveGuard {
    inner: GuardInner,
    token: u64,
}

impl ExclusiveGuard {
    fn new(scheme: &Arc<dyn LockScheme>, grant: Grant) -> Result<Self, LockError> {
        let lock_id = grant.lock;
        let mut inner = GuardInner::new(scheme, grant);
        match inner.grant.as_ref().and_then(Grant::fencing_token) {
            Some(token) => Ok(Self { inner, token }),
            None => {
                let _ = inner.release();
                Err(LockError::Protocol(format!("{lock_id}: exclusive grant without a fencing token")))
            }
        }
    }

    pub fn lock(&self) -> Option<LockId> {
        self.inner.grant.as_ref().map(Grant::lock)
    }

    /// Strictly larger than every earlier exclusive grant's token of this
    /// lock; a resource that remembers the largest token it has seen can
    /// reject a stale holder.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    pub fn release(mut self) -> Result<(), LockError> {
        self.inner.release()
    }
}
