//! A least-recently-used cache bounded by the bytes it holds.

use lru::LruCache;
use std::hash::Hash;

/// What [`ByteLru::insert`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inserted<K> {
    /// False when the object is larger than the whole capacity (never stored).
    pub stored: bool,
    /// Entries evicted to make room, least recently used first, with their sizes.
    pub evicted: Vec<(K, u64)>,
}

/// An LRU cache of object sizes, bounded by their total.
///
/// Holds only keys and sizes: a caller keeps the bytes wherever it wants
/// (a map, a registered region) and follows the evictions this reports.
pub struct ByteLru<K: Hash + Eq> {
    entries: LruCache<K, u64>,
    bytes: u64,
    capacity: u64,
}

impl<K: Hash + Eq + Clone> ByteLru<K> {
    /// An empty cache that holds at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self { entries: LruCache::unbounded(), bytes: 0, capacity }
    }

    /// Looks `key` up; a hit becomes the most recently used entry.
    pub fn touch(&mut self, key: &K) -> bool {
        self.entries.get(key).is_some()
    }

    /// Whether `key` is cached, without changing the recency order.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains(key)
    }

    /// The cached size of `key`, without changing the recency order.
    pub fn size_of(&self, key: &K) -> Option<u64> {
        self.entries.peek(key).copied()
    }

    /// Stores `key` of `size` bytes as the most recently used entry, evicting
    /// least recently used ones until it fits. Re-inserting a key replaces its
    /// size. An object larger than the capacity is not stored and evicts
    /// nothing (and drops an older copy of the same key).
    pub fn insert(&mut self, key: K, size: u64) -> Inserted<K> {
        if let Some(old) = self.entries.pop(&key) {
            self.bytes -= old;
        }
        if size > self.capacity {
            return Inserted { stored: false, evicted: Vec::new() };
        }
        let mut evicted = Vec::new();
        while self.bytes + size > self.capacity {
            match self.entries.pop_lru() {
                Some((victim, victim_size)) => {
                    self.bytes -= victim_size;
                    evicted.push((victim, victim_size));
                }
                None => break,
            }
        }
        self.entries.put(key, size);
        self.bytes += size;
        Inserted { stored: true, evicted }
    }

    /// Removes `key`, returning its size.
    pub fn remove(&mut self, key: &K) -> Option<u64> {
        let size = self.entries.pop(key)?;
        self.bytes -= size;
        Some(size)
    }

    /// The least recently used key, without changing the order.
    pub fn peek_lru(&self) -> Option<(&K, u64)> {
        self.entries.peek_lru().map(|(k, s)| (k, *s))
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The bound on [`ByteLru::bytes`].
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes still free.
    pub fn free(&self) -> u64 {
        self.capacity - self.bytes
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys from most to least recently used.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn evicts_least_recently_used_first_and_reports_sizes() {
        let mut cache = ByteLru::new(300);
        assert!(cache.insert("a", 100).stored);
        assert!(cache.insert("b", 100).stored);
        assert!(cache.insert("c", 100).stored);
        assert!(cache.touch(&"a"), "a is a hit and becomes most recent");
        let inserted = cache.insert("d", 150);
        assert_eq!(inserted.evicted, [("b", 100), ("c", 100)]);
        assert_eq!(cache.bytes(), 250);
        assert!(cache.contains(&"a") && cache.contains(&"d"));
        assert!(!cache.touch(&"b"));
    }

    #[test]
    fn an_object_larger_than_the_capacity_is_never_stored_and_evicts_nothing() {
        let mut cache = ByteLru::new(100);
        cache.insert(1, 60);
        let inserted = cache.insert(2, 101);
        assert!(!inserted.stored);
        assert!(inserted.evicted.is_empty());
        assert_eq!((cache.len(), cache.bytes()), (1, 60));
        assert!(cache.insert(3, 100).stored, "exactly the capacity fits");
        assert_eq!(cache.bytes(), 100);
    }

    #[test]
    fn reinserting_a_key_replaces_its_size() {
        let mut cache = ByteLru::new(100);
        cache.insert("x", 40);
        cache.insert("x", 70);
        assert_eq!((cache.len(), cache.bytes(), cache.size_of(&"x")), (1, 70, Some(70)));
        assert_eq!(cache.remove(&"x"), Some(70));
        assert_eq!(cache.bytes(), 0);
    }

    /// The reference: a list ordered from least to most recently used.
    fn reference(capacity: u64, ops: &[(bool, u8, u64)]) -> Vec<(bool, Vec<(u8, u64)>)> {
        let mut order: VecDeque<(u8, u64)> = VecDeque::new();
        let mut out = Vec::new();
        for &(is_insert, key, size) in ops {
            let position = order.iter().position(|(k, _)| *k == key);
            if !is_insert {
                let hit = position.is_some();
                if let Some(i) = position {
                    let entry = order.remove(i).expect("present");
                    order.push_back(entry);
                }
                out.push((hit, Vec::new()));
                continue;
            }
            if let Some(i) = position {
                order.remove(i);
            }
            if size > capacity {
                out.push((false, Vec::new()));
                continue;
            }
            let mut evicted = Vec::new();
            while order.iter().map(|(_, s)| s).sum::<u64>() + size > capacity {
                evicted.push(order.pop_front().expect("something to evict"));
            }
            order.push_back((key, size));
            out.push((true, evicted));
        }
        out
    }

    proptest! {
        #[test]
        fn agrees_with_a_list_model(
            capacity in 0u64..400,
            ops in proptest::collection::vec((any::<bool>(), 0u8..12, 0u64..200), 0..200),
        ) {
            let mut cache = ByteLru::new(capacity);
            let expected = reference(capacity, &ops);
            for (&(is_insert, key, size), (want_flag, want_evicted)) in ops.iter().zip(expected) {
                if is_insert {
                    let got = cache.insert(key, size);
                    prop_assert_eq!(got.stored, want_flag);
                    prop_assert_eq!(got.evicted, want_evicted);
                } else {
                    prop_assert_eq!(cache.touch(&key), want_flag);
                }
                prop_assert!(cache.bytes() <= cache.capacity());
                let sum: u64 = cache.keys().map(|k| cache.size_of(k).unwrap_or(0)).sum();
                prop_assert_eq!(sum, cache.bytes());
            }
        }
    }
}
