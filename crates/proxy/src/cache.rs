//! The proxy's cache: least recently used entries evicted first, bounded by
//! the bytes of the bodies it holds.

use bytes::Bytes;
use hyper::header::HeaderValue;
use lru::LruCache;
use std::sync::Arc;
use tierstack_coherent::DepsHeader;

/// One cached response.
pub(crate) struct Entry {
    pub body: Bytes,
    pub content_type: Option<HeaderValue>,
    /// The dependency header as received, passed on to clients on hits.
    pub deps_raw: HeaderValue,
    pub deps: DepsHeader,
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
}

impl Cache {
    pub fn new(bytes_max: usize) -> Self {
        Self { entries: LruCache::unbounded(), bytes: 0, bytes_max, evictions: 0 }
    }

    pub fn get(&mut self, key: &str) -> Option<Arc<Entry>> {
        self.entries.get(key).cloned()
    }

    pub fn remove(&mut self, key: &str) {
        if let Some(old) = self.entries.pop(key) {
            self.bytes -= old.bytes();
        }
    }

    /// Inserts, evicting least recently used entries to stay within the
    /// bound. An entry larger than an eighth of the cache is not stored.
    pub fn insert(&mut self, key: String, entry: Arc<Entry>) {
        let size = entry.bytes();
        if size > self.bytes_max / 8 {
            return;
        }
        if let Some(old) = self.entries.put(key, entry) {
            self.bytes -= old.bytes();
        }
        self.bytes += size;
        while self.bytes > self.bytes_max {
            match self.entries.pop_lru() {
                Some((_, old)) => {
                    self.bytes -= old.bytes();
                    self.evictions += 1;
                }
                None => break,
            }
        }
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
        for key in
            ["d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x"]
        {
            cache.insert(key.into(), entry(100));
        }
        assert!(cache.bytes() <= 8 * (100 + overhead) * 3);
        assert!(cache.get("b").is_none(), "the least recently used entry went first");
        assert!(cache.evictions() > 0);
        cache.insert("huge".into(), entry(10_000_000));
        assert!(cache.get("huge").is_none(), "oversized entries are not cached");
        let before = cache.bytes();
        cache.remove("x");
        assert_eq!(cache.bytes(), before - entry(100).bytes());
    }
}
