//! One node's storage: a memory cache (`ByteLru`) in front of a FIFO disk
//! (`DiskQueue`), decided in `tierstack origin`'s order.
//!
//! Every read decides at its arrival: look the document up (a hit becomes
//! most recently used); on a miss, queue a disk read and insert the document
//! at once (unless caching is bypassed or it is above the object bound), so
//! a later read of it is a hit that waits for the read in flight. The counts
//! therefore depend only on the order of arrivals, never on disk timing.
//! `crates/sim/tests/origin_storage.rs` checks this against the origin's own
//! `Storage` on random arrival sequences. Pure: time is a parameter.

use crate::policy::{Caching, DocId};
use std::collections::HashMap;
use tierstack_model::{ByteLru, DiskModel, DiskQueue, Inserted};

/// What one [`NodeStore::read`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRead {
    pub hit: bool,
    /// When the bytes are in memory: now for a plain hit, the read's end for a
    /// miss or for a hit on a document still being read.
    pub ready_ns: u64,
    /// For a miss that inserted: what the insert did.
    pub inserted: Option<Inserted<DocId>>,
}

/// A node's memory cache and disk.
pub struct NodeStore {
    cache: ByteLru<DocId>,
    max_object_bytes: u64,
    /// When each cached document's bytes are in memory.
    ready_at: HashMap<DocId, u64>,
    disk: DiskQueue,
}

impl NodeStore {
    /// A cache of `cache_bytes` (0: none) holding objects of at most
    /// `max_object_bytes` (default and upper bound: the cache), and `disk`.
    pub fn new(cache_bytes: u64, max_object_bytes: Option<u64>, disk: DiskModel) -> Self {
        Self {
            cache: ByteLru::new(cache_bytes),
            max_object_bytes: max_object_bytes.unwrap_or(cache_bytes).min(cache_bytes),
            ready_at: HashMap::new(),
            disk: DiskQueue::new(disk),
        }
    }

    /// Reads `doc` of `bytes` arriving at `now_ns` (calls in non-decreasing
    /// time).
    pub fn read(&mut self, now_ns: u64, doc: DocId, bytes: u64, caching: Caching) -> StoreRead {
        if self.cache.touch(&doc) {
            let ready_ns = self.ready_at.get(&doc).copied().unwrap_or(now_ns).max(now_ns);
            return StoreRead { hit: true, ready_ns, inserted: None };
        }
        let done = self.disk.submit(now_ns, bytes);
        let cacheable = caching == Caching::Normal && self.max_object_bytes > 0 && bytes <= self.max_object_bytes;
        let inserted = cacheable.then(|| {
            let inserted = self.cache.insert(doc, bytes);
            self.forget(&inserted.evicted);
            if inserted.stored {
                self.ready_at.insert(doc, done);
            }
            inserted
        });
        StoreRead { hit: false, ready_ns: done, inserted }
    }

    /// Stores `doc` now, with its bytes already in memory (a policy's insert
    /// after a remote fetch).
    pub fn insert_now(&mut self, doc: DocId, bytes: u64) -> Inserted<DocId> {
        let inserted = self.cache.insert(doc, bytes);
        self.ready_at.remove(&doc);
        self.forget(&inserted.evicted);
        inserted
    }

    /// Looks `doc` up (a hit becomes most recent).
    pub fn touch(&mut self, doc: DocId) -> bool {
        self.cache.touch(&doc)
    }

    /// Drops `doc` from the cache.
    pub fn remove(&mut self, doc: DocId) {
        self.cache.remove(&doc);
        self.ready_at.remove(&doc);
    }

    /// A read of `bytes` through the disk with no cache involved; returns its end.
    pub fn disk_read(&mut self, now_ns: u64, bytes: u64) -> u64 {
        self.disk.submit(now_ns, bytes)
    }

    pub fn cache(&self) -> &ByteLru<DocId> {
        &self.cache
    }

    /// Total service time of the disk reads so far.
    pub fn disk_busy_ns(&self) -> u64 {
        self.disk.busy_ns()
    }

    fn forget(&mut self, evicted: &[(DocId, u64)]) {
        for (doc, _) in evicted {
            self.ready_at.remove(doc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> DiskModel {
        DiskModel::new(1_000, 1_000_000_000).unwrap()
    }

    #[test]
    fn a_hit_on_a_document_in_flight_waits_for_its_read() {
        let mut store = NodeStore::new(10_000, None, disk());
        let first = store.read(0, 7, 1_000, Caching::Normal);
        assert_eq!((first.hit, first.ready_ns), (false, 2_000));
        assert!(first.inserted.is_some_and(|i| i.stored));
        assert_eq!(
            store.read(500, 7, 1_000, Caching::Normal),
            StoreRead { hit: true, ready_ns: 2_000, inserted: None }
        );
        assert_eq!(store.read(5_000, 7, 1_000, Caching::Normal).ready_ns, 5_000, "a hit after the read: at once");
    }

    #[test]
    fn bypass_and_the_object_bound_never_insert() {
        let mut store = NodeStore::new(10_000, Some(500), disk());
        assert_eq!(store.read(0, 1, 1_000, Caching::Normal).inserted, None, "above the bound");
        assert_eq!(store.read(0, 2, 100, Caching::Bypass).inserted, None);
        assert!(!store.read(10_000, 2, 100, Caching::Normal).hit);
        assert!(store.read(20_000, 2, 100, Caching::Normal).hit);
        let mut none = NodeStore::new(0, None, disk());
        none.read(0, 3, 0, Caching::Normal);
        assert!(!none.read(1, 3, 0, Caching::Normal).hit, "a zero-byte cache caches nothing, even empty objects");
    }

    #[test]
    fn evictions_forget_their_readiness() {
        let mut store = NodeStore::new(2_000, None, disk());
        store.read(0, 1, 1_000, Caching::Normal);
        store.read(0, 2, 1_000, Caching::Normal);
        let third = store.read(0, 3, 1_000, Caching::Normal);
        assert_eq!(third.inserted.map(|i| i.evicted), Some(vec![(1, 1_000)]));
        assert!(!store.read(100_000, 1, 1_000, Caching::Normal).hit);
        store.remove(3);
        assert!(!store.touch(3));
    }
}
