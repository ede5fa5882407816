//! What a primitive holds while it waits on a peer: its key (so primitives
//! on one key run one at a time, as the protocol needs) and, for a STORE or
//! a swap, a staging area of its own. Neither is node-wide: a primitive
//! waiting on a stopped peer delays only the requests for the same key, and
//! takes one of [`STAGING_SLOTS`] staging areas of its kind.

use crate::service::layout::STAGING_SLOTS;
use crate::Key;
use std::collections::HashSet;
use std::sync::{Condvar, Mutex};
use tierstack_base::sync::lock;

/// Keys with a primitive in progress on this node.
#[derive(Default)]
pub(super) struct KeyLocks {
    busy: Mutex<HashSet<Key>>,
    freed: Condvar,
}

/// A key held by a primitive; released when dropped.
pub(super) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: Key,
}

impl KeyLocks {
    /// Waits until no other primitive holds `key`, then holds it.
    pub(super) fn hold(&self, key: Key) -> KeyGuard<'_> {
        let mut busy = lock(&self.busy);
        while busy.contains(&key) {
            busy = self.freed.wait(busy).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        busy.insert(key);
        KeyGuard { locks: self, key }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        lock(&self.locks.busy).remove(&self.key);
        self.locks.freed.notify_all();
    }
}

/// Which staging area a primitive needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Staging {
    /// A fetched entity waiting for its swap's acknowledgment.
    Fetch,
    /// A body offered by a STORE until its acknowledgment.
    Store,
}

/// The staging areas in use, one bit per area, per kind.
#[derive(Default)]
pub(super) struct StagingSlots {
    used: Mutex<[u32; 2]>,
}

/// A staging area held by a primitive; freed when dropped.
pub(super) struct SlotGuard<'a> {
    slots: &'a StagingSlots,
    kind: Staging,
    pub slot: u32,
}

impl StagingSlots {
    /// A free area of `kind`, or `None` if all are in use (the caller then
    /// does without: places locally, or misses).
    pub(super) fn take(&self, kind: Staging) -> Option<SlotGuard<'_>> {
        let mut used = lock(&self.used);
        let mask = &mut used[kind as usize];
        let slot = (0..STAGING_SLOTS).find(|&s| *mask & (1 << s) == 0)?;
        *mask |= 1 << slot;
        Some(SlotGuard { slots: self, kind, slot })
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        lock(&self.slots.used)[self.kind as usize] &= !(1 << self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_held_key_blocks_only_itself() {
        let locks = Arc::new(KeyLocks::default());
        let held = locks.hold(1);
        // Another key is free at once.
        drop(locks.hold(2));
        let done = Arc::new(AtomicBool::new(false));
        let (l, d) = (locks.clone(), done.clone());
        let waiter = std::thread::spawn(move || {
            let _g = l.hold(1);
            d.store(true, Ordering::SeqCst);
        });
        // The waiter cannot finish while key 1 is held.
        for _ in 0..100 {
            std::thread::yield_now();
        }
        assert!(!done.load(Ordering::SeqCst));
        drop(held);
        waiter.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn staging_slots_run_out_and_come_back() {
        let slots = StagingSlots::default();
        let taken: Vec<_> = (0..STAGING_SLOTS).map(|_| slots.take(Staging::Store).unwrap()).collect();
        assert!(slots.take(Staging::Store).is_none());
        assert!(slots.take(Staging::Fetch).is_some());
        drop(taken);
        assert!(slots.take(Staging::Store).is_some());
    }
}
