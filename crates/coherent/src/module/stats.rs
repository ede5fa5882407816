//! What the module counts, for its `/metrics` (the Observed side lives with
//! the binary's tiers: this crate knows nothing of HTTP). Every counter is
//! a relaxed atomic bumped where the event happens; the queue depths are
//! read from the core under its lock when asked, never kept on the way.

use super::ModuleServer;
use crate::module_core::QueueDepths;
use std::sync::atomic::{AtomicU64, Ordering};
use tierstack_stats::exposition::SecondsHistogram;

/// The module's counters (in `Shared`).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) grants: AtomicU64,
    pub(super) reads: AtomicU64,
    pub(super) updates: AtomicU64,
    /// Requests not granted at once: they waited in a queue.
    pub(super) queued: AtomicU64,
    /// Request lines answered with an error (malformed, unknown key or id,
    /// protocol mistakes, a revoked grant's late DONE).
    pub(super) refused: AtomicU64,
    pub(super) revoked: AtomicU64,
    pub(super) peers_refused: AtomicU64,
    pub(super) pages_published: AtomicU64,
    pub(super) pages_unpublished: AtomicU64,
    pub(super) connections_accepted: AtomicU64,
    /// From an update's grant to its UPDATE_DONE.
    pub(super) update_seconds: SecondsHistogram,
}

impl Counters {
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of the module's counters and queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleStats {
    pub reads_granted: u64,
    pub updates_granted: u64,
    /// Requests that were not granted at once (they queued).
    pub requests_queued: u64,
    /// Requests answered with an error.
    pub requests_refused: u64,
    /// Grants held past the grant lifetime and taken back.
    pub grants_revoked: u64,
    /// Connections refused for their peer's credentials.
    pub peers_refused: u64,
    pub pages_published: u64,
    pub pages_unpublished: u64,
    pub connections_accepted: u64,
    pub connections_open: u64,
    /// Requests queued or holding access now.
    pub requests_in_progress: u64,
    pub queues: QueueDepths,
}

impl ModuleServer {
    /// The counters and the queues now.
    pub fn stats(&self) -> ModuleStats {
        let c = &self.shared.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (requests_in_progress, queues) =
            self.shared.core.lock().map(|core| (core.requests() as u64, core.queue_depths())).unwrap_or_default();
        ModuleStats {
            reads_granted: load(&c.reads),
            updates_granted: load(&c.updates),
            requests_queued: load(&c.queued),
            requests_refused: load(&c.refused),
            grants_revoked: load(&c.revoked),
            peers_refused: load(&c.peers_refused),
            pages_published: load(&c.pages_published),
            pages_unpublished: load(&c.pages_unpublished),
            connections_accepted: load(&c.connections_accepted),
            connections_open: self.shared.connections.lock().map(|c| c.len() as u64).unwrap_or(0),
            requests_in_progress,
            queues,
        }
    }

    /// The updates' hold times: from the grant to UPDATE_DONE.
    pub fn update_seconds(&self) -> &SecondsHistogram {
        &self.shared.counters.update_seconds
    }

    /// Requests queued or holding access now.
    pub fn requests_in_progress(&self) -> usize {
        self.shared.core.lock().map(|core| core.requests()).unwrap_or(0)
    }

    /// Updates granted so far.
    pub fn updates(&self) -> u64 {
        self.shared.counters.updates.load(Ordering::Relaxed)
    }

    /// Grants revoked after the grant lifetime so far.
    pub fn grants_revoked(&self) -> u64 {
        self.shared.counters.revoked.load(Ordering::Relaxed)
    }

    /// Connections refused for their peer's credentials so far.
    pub fn peers_refused(&self) -> u64 {
        self.shared.counters.peers_refused.load(Ordering::Relaxed)
    }

    /// Pages published with `update_done` so far.
    pub fn pages_published(&self) -> u64 {
        self.shared.counters.pages_published.load(Ordering::Relaxed)
    }

    /// Pages brought with `update_done` but not published (too large,
    /// malformed, no area) so far.
    pub fn pages_unpublished(&self) -> u64 {
        self.shared.counters.pages_unpublished.load(Ordering::Relaxed)
    }
}
