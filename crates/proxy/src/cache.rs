//! The proxy's cache: least recently used entries evicted first, bounded by
//! the bytes of the bodies it holds.

use bytes::Bytes;
use hyper::header::HeaderValue;
use lru::LruCache;
use std::sync::Arc;
use tierstack_coherent::DepsHeader;
use tierstack_pushpull::WasteTracker;

/// One cached response.
pub(crate) struct Entry {
    pub body: Bytes,
    pub content_type: Option<HeaderValue>,
    /// The dependency header as received, passed on to clients on hits.
    pub deps_raw: HeaderValue,
    pub deps: DepsHeader,
    /// Installed by a push from the application tier (not fetched by a miss).
    pub pushed: bool,
}

/// What an insert did.
#[derive(Debug, Default)]
pub(crate) struct Inserted {
    /// False if the entry was too large to cache.
    pub stored: bool,
    /// Keys evicted to make room.
    pub evicted: Vec<String>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.body.len() + self.deps_raw.len() + 64
    }
}

pub(crate) struct Cache {
    entries: LruCache<String, Arc<Entry>>,
    bytes: usize,
    bytes_max: usize,
    evictions: u64,
    /// Pushed documents not requested since (the wasted-update metric),
    /// kept under the cache's lock so requests pay no second lock.
    pub waste: WasteTracker,
}

impl Cache {
    pub fn new(bytes_max: usize) -> Self {
        Self { entries: LruCache::unbounded(), bytes: 0, bytes_max, evictions: 0, waste: WasteTracker::default() }
    }

    pub fn get(&mut self, key: &str) -> Option<Arc<Entry>> {
        self.entries.get(key).cloned()
    }

    /// The entry for `key` without making it more recently used.
    pub fn peek(&self, key: &str) -> Option<Arc<Entry>> {
        self.entries.peek(key).cloned()
    }

    /// Removes `key`; true if it was cached.
    pub fn remove(&mut self, key: &str) -> bool {
        match self.entries.pop(key) {
            Some(old) => {
                self.bytes -= old.bytes();
                true
            }
            None => false,
        }
    }

    /// Inserts, evicting least recently used entries to stay within the
    /// bound. An entry larger than an eighth of the cache is not stored.
    pub fn insert(&mut self, key: String, entry: Arc<Entry>) -> Inserted {
        let size = entry.bytes();
        if size > self.bytes_max / 8 {
            return Inserted::default();
        }
        if let Some(old) = self.entries.put(key, entry) {
            self.bytes -= old.bytes();
        }
        self.bytes += size;
        let mut evicted = Vec::new();
        while self.bytes > self.bytes_max {
            match self.entries.pop_lru() {
                Some((key, old)) => {
                    self.bytes -= old.bytes();
                    self.evictions += 1;
                    evicted.push(key);
                }
                None => break,
            }
        }
        Inserted { stored: true, evicted }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_coherent::Incarnation;

    fn entry(size: usize) -> Arc<Entry> {
        Arc::new(Entry {
            body: Bytes::from(vec![0u8; size]),
            content_type: None,
            deps_raw: HeaderValue::from_static("n=0;i=0000000000000001;a=1@0"),
            deps: DepsHeader { node: tierstack_fabric::NodeId(0), incarnation: Incarnation(1), deps: vec![] },
            pushed: false,
        })
    }

    #[test]
    fn evicts_least_recently_used_within_the_byte_bound() {
        let overhead = entry(0).bytes();
        let mut cache = Cache::new(8 * (100 + overhead) * 3);
        for key in ["a", "b", "c"] {
            cache.insert(key.into(), entry(100));
        }
        assert!(cache.get("a").is_some(), "touch a so b is the oldest");
        let mut evicted = Vec::new();
        for key in [
            "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x",
            "y",
        ] {
            evicted.extend(cache.insert(key.into(), entry(100)).evicted);
        }
        assert_eq!(evicted.len() as u64, cache.evictions(), "every eviction is reported");
        assert_eq!(evicted, ["b"], "24 entries fit; the 25th evicts the least recently used");
        assert!(cache.bytes() <= 8 * (100 + overhead) * 3);
        assert!(cache.get("b").is_none(), "the least recently used entry went first");
        assert!(cache.evictions() > 0);
        assert!(!cache.insert("huge".into(), entry(10_000_000)).stored);
        assert!(cache.get("huge").is_none(), "oversized entries are not cached");
        let before = cache.bytes();
        assert!(cache.remove("x"));
        assert!(!cache.remove("x"));
        assert_eq!(cache.bytes(), before - entry(100).bytes());
    }
}
