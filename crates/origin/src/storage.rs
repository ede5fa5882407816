//! What reading an object costs: the origin's memory cache in front of its
//! emulated disk. Pure: no I/O, no clock; the caller passes the time in, so
//! `tierstack origin` (real monotonic time) and the simulator (simulated
//! time) make the same decisions in the same order for the same requests.

use std::collections::HashMap;
use std::hash::Hash;
use tierstack_model::{ByteLru, DiskModel, DiskQueue};

/// How the storage of one origin node is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageConfig {
    /// Bytes the memory cache holds; 0 = no cache (every read goes to disk).
    pub cache_bytes: u64,
    /// Objects larger than this are never cached; `None` = the whole capacity.
    pub cache_max_object_bytes: Option<u64>,
    /// The emulated disk; `None` = reads cost nothing (they are still counted).
    pub disk: Option<DiskModel>,
}

/// How one read was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// From the memory cache. `ready_ns` is when the bytes are there: the
    /// request's own arrival, or later if the read that brought the object in
    /// has not completed yet (a hit on an object in flight waits for it).
    Hit { ready_ns: u64 },
    /// From the disk: queued behind earlier reads, done at `done_ns`.
    Miss { done_ns: u64, queue_wait_ns: u64, service_ns: u64 },
}

impl ReadOutcome {
    /// When the response may be sent.
    pub fn ready_ns(&self) -> u64 {
        match *self {
            ReadOutcome::Hit { ready_ns } => ready_ns,
            ReadOutcome::Miss { done_ns, .. } => done_ns,
        }
    }
}

/// Counts since the storage was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageCounts {
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Reads that went to the disk (= misses; kept apart for readers of the stats).
    pub disk_reads: u64,
    pub disk_bytes: u64,
    /// Total service time of the disk reads (0 without an emulated disk).
    pub disk_busy_ns: u64,
    /// Total time disk reads spent queued behind earlier ones.
    pub disk_wait_ns: u64,
    /// Bytes and objects in the memory cache now.
    pub cache_bytes: u64,
    pub cache_objects: u64,
}

/// A memory cache (LRU by bytes) in front of a FIFO disk.
///
/// Every read decides, in this order and at its arrival: look the key up
/// (a hit becomes most recently used); on a miss, queue a disk read; then
/// insert the object (unless it is larger than the object bound). The insert
/// happens at the miss, not when the read completes, so the counts depend
/// only on the order of arrivals, never on disk timing; a later hit on an
/// object still being read waits for that read ([`ReadOutcome::Hit`]).
pub struct Storage<K: Hash + Eq + Clone> {
    cache: Option<ByteLru<K>>,
    max_object_bytes: u64,
    /// When each cached object's bytes are in memory (its read's completion).
    ready_at_ns: HashMap<K, u64>,
    disk: Option<DiskQueue>,
    counts: StorageCounts,
}

impl<K: Hash + Eq + Clone> Storage<K> {
    pub fn new(config: StorageConfig) -> Self {
        let cache = (config.cache_bytes > 0).then(|| ByteLru::new(config.cache_bytes));
        Self {
            cache,
            max_object_bytes: config.cache_max_object_bytes.unwrap_or(config.cache_bytes).min(config.cache_bytes),
            ready_at_ns: HashMap::new(),
            disk: config.disk.map(DiskQueue::new),
            counts: StorageCounts::default(),
        }
    }

    /// Reads object `key` of `bytes` bytes, arriving at `now_ns`. Calls must
    /// come in non-decreasing `now_ns` (the disk queue is FIFO in time).
    pub fn read(&mut self, now_ns: u64, key: &K, bytes: u64) -> ReadOutcome {
        if let Some(cache) = self.cache.as_mut() {
            if cache.touch(key) {
                self.counts.cache_hits += 1;
                let ready_ns = self.ready_at_ns.get(key).copied().unwrap_or(now_ns).max(now_ns);
                return ReadOutcome::Hit { ready_ns };
            }
        }
        self.counts.cache_misses += 1;
        self.counts.disk_reads += 1;
        self.counts.disk_bytes = self.counts.disk_bytes.saturating_add(bytes);
        let (done_ns, queue_wait_ns, service_ns) = match self.disk.as_mut() {
            Some(disk) => {
                let busy_before = disk.busy_ns();
                let done_ns = disk.submit(now_ns, bytes);
                let service_ns = disk.busy_ns() - busy_before;
                let queue_wait_ns = done_ns.saturating_sub(now_ns).saturating_sub(service_ns);
                (done_ns, queue_wait_ns, service_ns)
            }
            None => (now_ns, 0, 0),
        };
        self.counts.disk_busy_ns = self.counts.disk_busy_ns.saturating_add(service_ns);
        self.counts.disk_wait_ns = self.counts.disk_wait_ns.saturating_add(queue_wait_ns);
        if let Some(cache) = self.cache.as_mut() {
            if bytes <= self.max_object_bytes {
                let inserted = cache.insert(key.clone(), bytes);
                for (evicted, _) in &inserted.evicted {
                    self.ready_at_ns.remove(evicted);
                }
                if inserted.stored {
                    self.ready_at_ns.insert(key.clone(), done_ns);
                }
            }
        }
        ReadOutcome::Miss { done_ns, queue_wait_ns, service_ns }
    }

    /// Whether `key` is cached now (without touching it).
    pub fn is_cached(&self, key: &K) -> bool {
        self.cache.as_ref().is_some_and(|cache| cache.contains(key))
    }

    pub fn counts(&self) -> StorageCounts {
        let (cache_bytes, cache_objects) =
            self.cache.as_ref().map_or((0, 0), |cache| (cache.bytes(), u64::try_from(cache.len()).unwrap_or(u64::MAX)));
        StorageCounts { cache_bytes, cache_objects, ..self.counts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> DiskModel {
        // 1 ms seek, 1 byte per microsecond.
        DiskModel::new(1_000_000, 1_000_000).unwrap()
    }

    #[test]
    fn a_miss_pays_the_disk_and_a_hit_does_not() {
        let mut storage =
            Storage::new(StorageConfig { cache_bytes: 10_000, cache_max_object_bytes: None, disk: Some(disk()) });
        assert_eq!(
            storage.read(0, &"a", 1_000),
            ReadOutcome::Miss { done_ns: 2_000_000, queue_wait_ns: 0, service_ns: 2_000_000 }
        );
        assert_eq!(storage.read(5_000_000, &"a", 1_000), ReadOutcome::Hit { ready_ns: 5_000_000 });
        let counts = storage.counts();
        assert_eq!((counts.cache_hits, counts.cache_misses, counts.disk_reads), (1, 1, 1));
        assert_eq!(
            (counts.disk_bytes, counts.disk_busy_ns, counts.cache_bytes, counts.cache_objects),
            (1_000, 2_000_000, 1_000, 1)
        );
    }

    #[test]
    fn concurrent_misses_queue_and_a_hit_on_an_object_in_flight_waits_for_its_read() {
        let mut storage =
            Storage::new(StorageConfig { cache_bytes: 10_000, cache_max_object_bytes: None, disk: Some(disk()) });
        assert_eq!(storage.read(0, &"a", 0).ready_ns(), 1_000_000);
        assert_eq!(
            storage.read(0, &"b", 0),
            ReadOutcome::Miss { done_ns: 2_000_000, queue_wait_ns: 1_000_000, service_ns: 1_000_000 }
        );
        assert_eq!(storage.read(10, &"b", 0), ReadOutcome::Hit { ready_ns: 2_000_000 });
        let counts = storage.counts();
        assert_eq!((counts.disk_reads, counts.disk_busy_ns, counts.disk_wait_ns), (2, 2_000_000, 1_000_000));
    }

    #[test]
    fn without_a_cache_every_read_is_a_miss_and_without_a_disk_reads_are_free() {
        let mut storage = Storage::new(StorageConfig { cache_bytes: 0, cache_max_object_bytes: None, disk: None });
        for now in 0..3 {
            assert_eq!(storage.read(now, &"a", 0), ReadOutcome::Miss { done_ns: now, queue_wait_ns: 0, service_ns: 0 });
        }
        assert!(!storage.is_cached(&"a"), "a zero-byte object is not cached by a zero-byte cache");
        let counts = storage.counts();
        assert_eq!((counts.cache_misses, counts.disk_reads, counts.disk_busy_ns), (3, 3, 0));
    }

    #[test]
    fn objects_above_the_object_bound_are_never_cached() {
        let mut storage =
            Storage::new(StorageConfig { cache_bytes: 1_000, cache_max_object_bytes: Some(100), disk: None });
        storage.read(0, &"small", 100);
        storage.read(0, &"big", 101);
        storage.read(0, &"big", 101);
        assert!(storage.is_cached(&"small"));
        assert!(!storage.is_cached(&"big"));
        assert_eq!((storage.counts().cache_misses, storage.counts().cache_hits), (3, 0));
    }

    #[test]
    fn eviction_follows_recency_and_forgets_the_evicted_readiness() {
        let mut storage =
            Storage::new(StorageConfig { cache_bytes: 200, cache_max_object_bytes: None, disk: Some(disk()) });
        storage.read(0, &"a", 100);
        storage.read(0, &"b", 100);
        assert!(matches!(storage.read(0, &"a", 100), ReadOutcome::Hit { .. }));
        assert!(matches!(storage.read(0, &"c", 100), ReadOutcome::Miss { .. }), "c evicts b, the least recent");
        assert!(storage.is_cached(&"a") && storage.is_cached(&"c") && !storage.is_cached(&"b"));
        assert_eq!(storage.ready_at_ns.len(), 2, "readiness is kept only for cached objects");
    }
}
