//! A node's storage: a memory cache ([`ByteLru`]) in front of a FIFO disk
//! ([`DiskQueue`]), the one decision `tierstack origin` serves with (real
//! time) and `tierstack sim` simulates with (simulated time).
//!
//! Every read decides, in this order and at its arrival: look the key up (a
//! hit becomes most recently used); on a miss, queue a disk read; then insert
//! the object (unless the caller bypasses the cache or the object is above the
//! object bound). The insert happens at the miss, not when the read completes,
//! so the hits and misses depend only on the order of arrivals, never on disk
//! timing; a later hit on an object still being read waits for that read
//! ([`ReadOutcome::Hit`]).

use crate::cache::{ByteLru, Inserted};
use crate::disk::{DiskModel, DiskQueue};
use std::collections::HashMap;
use std::hash::Hash;

/// How the storage of one node is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageConfig {
    /// Bytes the memory cache holds; 0 = no cache (every read goes to disk,
    /// nothing is ever cached, not even an empty object).
    pub cache_bytes: u64,
    /// Objects larger than this are never cached; `None` = the whole capacity
    /// (a larger bound is cut to the capacity).
    pub cache_max_object_bytes: Option<u64>,
    /// The disk; `None` = reads cost nothing (they are still counted).
    pub disk: Option<DiskModel>,
}

/// Whether a [`Storage::read`] may cache what it reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Caching {
    /// Insert after a miss (objects above the object bound are not).
    #[default]
    Normal,
    /// Serve without inserting (PRESS: files of `max_size` or more).
    Bypass,
}

/// How one [`Storage::read`] was served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome<K> {
    /// From the memory cache. `ready_ns` is when the bytes are there: the
    /// read's own arrival, or later if the read that brought the object in
    /// has not completed yet (a hit on an object in flight waits for it).
    Hit { ready_ns: u64 },
    /// From the disk: queued behind earlier reads, done at `done_ns`.
    /// `inserted` is what the insert made at the miss did (`None`: no insert
    /// was tried, because of [`Caching::Bypass`], the object bound or a
    /// cache of 0 bytes), e.g. the evictions a PRESS node would broadcast.
    Miss { done_ns: u64, queue_wait_ns: u64, service_ns: u64, inserted: Option<Inserted<K>> },
}

impl<K> ReadOutcome<K> {
    /// When the bytes are in memory, so the response may be sent.
    pub fn ready_ns(&self) -> u64 {
        match *self {
            ReadOutcome::Hit { ready_ns } => ready_ns,
            ReadOutcome::Miss { done_ns, .. } => done_ns,
        }
    }

    pub fn is_hit(&self) -> bool {
        matches!(self, ReadOutcome::Hit { .. })
    }
}

/// Counts since the storage was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageCounts {
    /// [`Storage::read`]s found in the cache / not.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Reads that went to the disk: the misses plus the
    /// [`Storage::disk_read`]s (which a server that only calls `read` never
    /// makes, so there it equals the misses).
    pub disk_reads: u64,
    pub disk_bytes: u64,
    /// Total service time of the disk reads (0 without a disk).
    pub disk_busy_ns: u64,
    /// Total time disk reads spent queued behind earlier ones.
    pub disk_wait_ns: u64,
    /// Objects evicted to make room, by reads and by [`Storage::insert_now`].
    pub evictions: u64,
    /// Bytes and objects in the memory cache now.
    pub cache_bytes: u64,
    pub cache_objects: u64,
}

/// A memory cache (LRU by bytes) in front of a FIFO disk; see the module
/// documentation for the order of a read's decisions. Pure: the caller passes
/// the time in, and calls must come in non-decreasing time (the disk queue is
/// FIFO in time).
pub struct Storage<K: Hash + Eq + Clone> {
    cache: ByteLru<K>,
    max_object_bytes: u64,
    /// When each cached object's bytes are in memory (its read's completion);
    /// absent once they are known to be there.
    ready_at_ns: HashMap<K, u64>,
    disk: Option<DiskQueue>,
    counts: StorageCounts,
}

impl<K: Hash + Eq + Clone> Storage<K> {
    pub fn new(config: StorageConfig) -> Self {
        Self {
            cache: ByteLru::new(config.cache_bytes),
            max_object_bytes: config.cache_max_object_bytes.unwrap_or(config.cache_bytes).min(config.cache_bytes),
            ready_at_ns: HashMap::new(),
            disk: config.disk.map(DiskQueue::new),
            counts: StorageCounts::default(),
        }
    }

    /// Reads object `key` of `bytes` bytes, arriving at `now_ns`.
    pub fn read(&mut self, now_ns: u64, key: &K, bytes: u64, caching: Caching) -> ReadOutcome<K> {
        if self.cache.touch(key) {
            self.counts.cache_hits += 1;
            let ready_ns = self.ready_at_ns.get(key).copied().unwrap_or(now_ns).max(now_ns);
            return ReadOutcome::Hit { ready_ns };
        }
        self.counts.cache_misses += 1;
        let (done_ns, queue_wait_ns, service_ns) = self.disk_submit(now_ns, bytes);
        let inserted = (caching == Caching::Normal && self.cacheable(bytes)).then(|| {
            let inserted = self.insert(key.clone(), bytes);
            if inserted.stored {
                self.ready_at_ns.insert(key.clone(), done_ns);
            }
            inserted
        });
        ReadOutcome::Miss { done_ns, queue_wait_ns, service_ns, inserted }
    }

    /// A read of `bytes` through the disk with no cache involved, arriving at
    /// `now_ns`; returns when it completes.
    pub fn disk_read(&mut self, now_ns: u64, bytes: u64) -> u64 {
        self.disk_submit(now_ns, bytes).0
    }

    /// Stores `key` now, its bytes already in memory (e.g. a simulated
    /// policy's insert after a remote fetch). Never stores an object the
    /// cache would not take from a read (above the object bound, or a cache
    /// of 0 bytes): then `stored` is false and nothing changes.
    pub fn insert_now(&mut self, key: K, bytes: u64) -> Inserted<K> {
        if !self.cacheable(bytes) {
            return Inserted { stored: false, evicted: Vec::new() };
        }
        self.ready_at_ns.remove(&key);
        self.insert(key, bytes)
    }

    /// Looks `key` up (a hit becomes most recently used). Not a read: it is
    /// not counted as a hit or a miss.
    pub fn touch(&mut self, key: &K) -> bool {
        self.cache.touch(key)
    }

    /// Drops `key` from the cache; returns whether it was there.
    pub fn remove(&mut self, key: &K) -> bool {
        self.ready_at_ns.remove(key);
        self.cache.remove(key).is_some()
    }

    /// Whether `key` is cached now (without touching it).
    pub fn is_cached(&self, key: &K) -> bool {
        self.cache.contains(key)
    }

    /// The memory cache, read-only.
    pub fn cache(&self) -> &ByteLru<K> {
        &self.cache
    }

    pub fn counts(&self) -> StorageCounts {
        StorageCounts {
            cache_bytes: self.cache.bytes(),
            cache_objects: u64::try_from(self.cache.len()).unwrap_or(u64::MAX),
            ..self.counts
        }
    }

    /// Whether an object of `bytes` may be cached at all.
    fn cacheable(&self, bytes: u64) -> bool {
        self.cache.capacity() > 0 && bytes <= self.max_object_bytes
    }

    /// Inserts into the cache and forgets the readiness of what it evicted.
    fn insert(&mut self, key: K, bytes: u64) -> Inserted<K> {
        let inserted = self.cache.insert(key, bytes);
        for (evicted, _) in &inserted.evicted {
            self.ready_at_ns.remove(evicted);
        }
        self.counts.evictions += inserted.evicted.len() as u64;
        inserted
    }

    /// Queues a disk read and counts it: (done, queue wait, service).
    fn disk_submit(&mut self, now_ns: u64, bytes: u64) -> (u64, u64, u64) {
        let (done_ns, queue_wait_ns, service_ns) = match self.disk.as_mut() {
            Some(disk) => {
                let busy_before = disk.busy_ns();
                let done_ns = disk.submit(now_ns, bytes);
                let service_ns = disk.busy_ns() - busy_before;
                (done_ns, done_ns.saturating_sub(now_ns).saturating_sub(service_ns), service_ns)
            }
            None => (now_ns, 0, 0),
        };
        let counts = &mut self.counts;
        counts.disk_reads += 1;
        counts.disk_bytes = counts.disk_bytes.saturating_add(bytes);
        counts.disk_busy_ns = counts.disk_busy_ns.saturating_add(service_ns);
        counts.disk_wait_ns = counts.disk_wait_ns.saturating_add(queue_wait_ns);
        (done_ns, queue_wait_ns, service_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 1 ms seek, 1 byte per microsecond.
    fn slow_disk() -> DiskModel {
        DiskModel::new(1_000_000, 1_000_000).unwrap()
    }

    /// 1 µs seek, 1 byte per nanosecond.
    fn fast_disk() -> DiskModel {
        DiskModel::new(1_000, 1_000_000_000).unwrap()
    }

    fn storage<K: Hash + Eq + Clone>(cache_bytes: u64, max_object: Option<u64>, disk: Option<DiskModel>) -> Storage<K> {
        Storage::new(StorageConfig { cache_bytes, cache_max_object_bytes: max_object, disk })
    }

    const NORMAL: Caching = Caching::Normal;

    #[test]
    fn a_miss_pays_the_disk_and_a_hit_does_not() {
        let mut storage = storage(10_000, None, Some(slow_disk()));
        let miss = storage.read(0, &"a", 1_000, NORMAL);
        let stored = Some(Inserted { stored: true, evicted: vec![] });
        assert_eq!(
            miss,
            ReadOutcome::Miss { done_ns: 2_000_000, queue_wait_ns: 0, service_ns: 2_000_000, inserted: stored }
        );
        assert_eq!(storage.read(5_000_000, &"a", 1_000, NORMAL), ReadOutcome::Hit { ready_ns: 5_000_000 });
        let counts = storage.counts();
        assert_eq!((counts.cache_hits, counts.cache_misses, counts.disk_reads), (1, 1, 1));
        assert_eq!(
            (counts.disk_bytes, counts.disk_busy_ns, counts.cache_bytes, counts.cache_objects),
            (1_000, 2_000_000, 1_000, 1)
        );
    }

    #[test]
    fn concurrent_misses_queue_and_a_hit_on_an_object_in_flight_waits_for_its_read() {
        let mut storage = storage(10_000, None, Some(slow_disk()));
        assert_eq!(storage.read(0, &"a", 0, NORMAL).ready_ns(), 1_000_000);
        let second = storage.read(0, &"b", 0, NORMAL);
        assert!(matches!(
            second,
            ReadOutcome::Miss { done_ns: 2_000_000, queue_wait_ns: 1_000_000, service_ns: 1_000_000, .. }
        ));
        assert_eq!(storage.read(10, &"b", 0, NORMAL), ReadOutcome::Hit { ready_ns: 2_000_000 });
        assert_eq!(storage.read(3_000_000, &"b", 0, NORMAL).ready_ns(), 3_000_000, "after the read: at once");
        let counts = storage.counts();
        assert_eq!((counts.disk_reads, counts.disk_busy_ns, counts.disk_wait_ns), (2, 2_000_000, 1_000_000));
    }

    #[test]
    fn without_a_cache_every_read_is_a_miss_and_without_a_disk_reads_are_free() {
        let mut storage = storage(0, None, None);
        for now in 0..3 {
            let read = storage.read(now, &"a", 0, NORMAL);
            assert_eq!(read, ReadOutcome::Miss { done_ns: now, queue_wait_ns: 0, service_ns: 0, inserted: None });
        }
        assert!(!storage.is_cached(&"a"), "a zero-byte object is not cached by a zero-byte cache");
        assert!(!storage.insert_now("a", 0).stored, "not even by an explicit insert");
        let counts = storage.counts();
        assert_eq!((counts.cache_misses, counts.disk_reads, counts.disk_busy_ns), (3, 3, 0));
    }

    #[test]
    fn objects_above_the_object_bound_and_bypassed_reads_are_never_cached() {
        let mut storage = storage(1_000, Some(100), None);
        storage.read(0, &"small", 100, NORMAL);
        assert!(matches!(storage.read(0, &"big", 101, NORMAL), ReadOutcome::Miss { inserted: None, .. }));
        storage.read(0, &"big", 101, NORMAL);
        assert!(matches!(storage.read(0, &"bypassed", 10, Caching::Bypass), ReadOutcome::Miss { inserted: None, .. }));
        assert!(storage.is_cached(&"small"));
        assert!(!storage.is_cached(&"big") && !storage.is_cached(&"bypassed"));
        assert!(!storage.insert_now("big", 101).stored, "the bound holds for explicit inserts too");
        assert_eq!((storage.counts().cache_misses, storage.counts().cache_hits), (4, 0));
        assert!(!storage.read(0, &"bypassed", 10, NORMAL).is_hit());
        assert!(storage.read(0, &"bypassed", 10, NORMAL).is_hit(), "a normal read caches it");
    }

    #[test]
    fn a_zero_object_bound_still_caches_empty_objects() {
        let mut storage = storage(1_000, Some(0), None);
        storage.read(0, &"empty", 0, NORMAL);
        storage.read(0, &"one", 1, NORMAL);
        assert!(storage.is_cached(&"empty") && !storage.is_cached(&"one"));
    }

    #[test]
    fn eviction_follows_recency_is_counted_and_forgets_the_evicted_readiness() {
        let mut storage = storage(200, None, Some(slow_disk()));
        storage.read(0, &"a", 100, NORMAL);
        storage.read(0, &"b", 100, NORMAL);
        assert!(storage.read(0, &"a", 100, NORMAL).is_hit());
        let c = storage.read(0, &"c", 100, NORMAL);
        assert!(
            matches!(&c, ReadOutcome::Miss { inserted: Some(i), .. } if i.evicted == [("b", 100)]),
            "c evicts b, the least recent: {c:?}"
        );
        assert!(storage.is_cached(&"a") && storage.is_cached(&"c") && !storage.is_cached(&"b"));
        assert_eq!(storage.ready_at_ns.len(), 2, "readiness is kept only for cached objects");
        assert_eq!(storage.counts().evictions, 1);
    }

    #[test]
    fn explicit_inserts_touches_removes_and_plain_disk_reads() {
        let mut storage = storage(2_000, None, Some(fast_disk()));
        let first = storage.read(0, &1, 1_000, NORMAL);
        assert_eq!(first.ready_ns(), 2_000);
        // Inserted now: its bytes are in memory, so a hit does not wait for
        // the read that was in flight.
        assert_eq!(storage.insert_now(1, 1_000), Inserted { stored: true, evicted: vec![] });
        assert_eq!(storage.read(500, &1, 1_000, NORMAL), ReadOutcome::Hit { ready_ns: 500 });
        storage.insert_now(2, 1_000);
        let third = storage.insert_now(3, 1_000);
        assert_eq!(third.evicted, [(1, 1_000)]);
        assert!(!storage.touch(&1) && storage.touch(&2), "a touch finds what is cached");
        assert!(storage.remove(&3) && !storage.remove(&3));
        assert!(!storage.is_cached(&3));
        // A plain disk read queues behind the first read and is counted as
        // a disk read, not as a miss.
        assert_eq!(storage.disk_read(600, 500), 3_500);
        let counts = storage.counts();
        assert_eq!((counts.cache_hits, counts.cache_misses, counts.disk_reads), (1, 1, 2));
        assert_eq!((counts.disk_bytes, counts.disk_busy_ns, counts.disk_wait_ns), (1_500, 3_500, 1_400));
        assert_eq!((counts.evictions, counts.cache_bytes, counts.cache_objects), (1, 1_000, 1));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the sequence: the counts add up, the cache stays within
        /// its capacity and bound, a hit is never ready before its arrival
        /// nor after the read that brought its object in, and bypassed or
        /// oversized objects are never cached.
        #[test]
        fn the_counts_add_up_and_the_bounds_hold(
            cache_bytes in prop_oneof![Just(0u64), 1u64..20_000],
            max_object in proptest::option::of(0u64..20_000),
            with_disk in any::<bool>(),
            ops in proptest::collection::vec((0u8..5, 0usize..30, 0u64..3_000), 1..300),
            sizes in proptest::collection::vec(0u64..6_000, 30),
        ) {
            let disk = with_disk.then(fast_disk);
            let mut storage = storage(cache_bytes, max_object, disk);
            let bound = max_object.unwrap_or(cache_bytes).min(cache_bytes);
            let (mut now, mut reads, mut plain, mut bytes_read, mut busy) = (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut read_done: HashMap<usize, u64> = HashMap::new();
            for (op, key, gap) in ops {
                now += gap;
                let bytes = sizes[key];
                match op {
                    0 | 1 => {
                        let caching = if op == 0 { Caching::Normal } else { Caching::Bypass };
                        let was_cached = storage.is_cached(&key);
                        let outcome = storage.read(now, &key, bytes, caching);
                        reads += 1;
                        prop_assert_eq!(outcome.is_hit(), was_cached);
                        prop_assert!(outcome.ready_ns() >= now);
                        match &outcome {
                            ReadOutcome::Hit { ready_ns } => {
                                prop_assert!(*ready_ns <= read_done.get(&key).copied().unwrap_or(now).max(now));
                            }
                            ReadOutcome::Miss { done_ns, service_ns, inserted, .. } => {
                                bytes_read += bytes;
                                busy += service_ns;
                                prop_assert_eq!(*service_ns, disk.map_or(0, |d| d.service_ns(bytes)));
                                read_done.insert(key, *done_ns);
                                let should_try = caching == Caching::Normal && cache_bytes > 0 && bytes <= bound;
                                prop_assert_eq!(inserted.is_some(), should_try);
                            }
                        }
                        if caching == Caching::Bypass && !was_cached {
                            prop_assert!(!storage.is_cached(&key));
                        }
                    }
                    2 => {
                        let done = storage.disk_read(now, bytes);
                        plain += 1;
                        bytes_read += bytes;
                        busy += disk.map_or(0, |d| d.service_ns(bytes));
                        prop_assert!(done >= now);
                    }
                    3 => {
                        let inserted = storage.insert_now(key, bytes);
                        prop_assert_eq!(inserted.stored, cache_bytes > 0 && bytes <= bound);
                        read_done.remove(&key);
                    }
                    _ => {
                        storage.remove(&key);
                    }
                }
                let counts = storage.counts();
                prop_assert_eq!(counts.cache_hits + counts.cache_misses, reads);
                prop_assert_eq!(counts.disk_reads, counts.cache_misses + plain);
                prop_assert_eq!((counts.disk_bytes, counts.disk_busy_ns), (bytes_read, busy));
                prop_assert!(counts.cache_bytes <= cache_bytes);
                prop_assert!(storage.cache().keys().all(|k| storage.cache().size_of(k).unwrap_or(0) <= bound));
                prop_assert!(storage.ready_at_ns.keys().all(|k| storage.is_cached(k)));
            }
        }
    }
}
