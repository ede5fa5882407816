//! One node's cache contents: entries on pages of a [`PagePool`], in LRU
//! order. Pure bookkeeping; the placement rules decide what goes where.

use crate::pool::{pages_for, PagePool, ENTITY_PAGES_MAX};
use crate::{CoopError, Key};
use std::collections::{BTreeMap, HashMap};

/// A cached entity at a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub bytes: u64,
    /// Its pages in the node's pool, in body order.
    pub pages: Vec<u32>,
    /// The content version it was stored with (see `model`).
    pub version: u64,
    last_use: u64,
}

/// A node's cache: entries, the pool they live on, and their LRU order.
#[derive(Clone, Debug)]
pub struct NodeCache {
    pool: PagePool,
    entries: HashMap<Key, Entry>,
    /// last use tick → key, oldest first.
    lru: BTreeMap<u64, Key>,
    tick: u64,
}

impl NodeCache {
    pub fn new(capacity_pages: u32) -> Self {
        Self { pool: PagePool::new(capacity_pages), entries: HashMap::new(), lru: BTreeMap::new(), tick: 0 }
    }

    pub fn capacity_pages(&self) -> u32 {
        self.pool.capacity_pages()
    }

    pub fn free_pages(&self) -> u32 {
        self.pool.free_pages()
    }

    pub fn used_pages(&self) -> u32 {
        self.pool.used_pages()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: Key) -> bool {
        self.entries.contains_key(&key)
    }

    pub fn get(&self, key: Key) -> Option<&Entry> {
        self.entries.get(&key)
    }

    /// Marks `key` most recently used; false if it is not cached.
    pub fn touch(&mut self, key: Key) -> bool {
        let Some(entry) = self.entries.get_mut(&key) else { return false };
        self.lru.remove(&entry.last_use);
        self.tick += 1;
        entry.last_use = self.tick;
        self.lru.insert(self.tick, key);
        true
    }

    /// Stores `key` on free pages, as the most recently used entry.
    pub fn insert(&mut self, key: Key, bytes: u64, version: u64) -> Result<&Entry, CoopError> {
        if self.entries.contains_key(&key) {
            return Err(CoopError::AlreadyCached { key });
        }
        let need = pages_for(bytes);
        if need > ENTITY_PAGES_MAX {
            return Err(CoopError::TooLarge { bytes });
        }
        let pages = self.pool.alloc(need)?;
        self.tick += 1;
        self.lru.insert(self.tick, key);
        Ok(self.entries.entry(key).or_insert(Entry { bytes, pages, version, last_use: self.tick }))
    }

    /// Drops `key`, freeing its pages.
    pub fn remove(&mut self, key: Key) -> Option<Entry> {
        let entry = self.entries.remove(&key)?;
        self.lru.remove(&entry.last_use);
        // The pages came from this pool and were in use: release cannot fail.
        let released = self.pool.release(&entry.pages);
        debug_assert!(released.is_ok(), "{released:?}");
        Some(entry)
    }

    /// Keys from least to most recently used.
    pub fn lru_keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.lru.values().copied()
    }

    /// Every cached key (no particular order).
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.entries.keys().copied()
    }

    /// Checks the accounting: pages of entries = used pages, disjoint, and
    /// the LRU lists exactly the entries. For tests and debug assertions.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut pages = 0u64;
        for (key, e) in &self.entries {
            if e.pages.len() as u32 != pages_for(e.bytes) {
                return Err(format!("{key:#x}: {} pages for {} bytes", e.pages.len(), e.bytes));
            }
            for &p in &e.pages {
                if !seen.insert(p) || self.pool.is_free(p) {
                    return Err(format!("{key:#x}: page {p} shared or free"));
                }
            }
            pages += e.pages.len() as u64;
            if self.lru.get(&e.last_use) != Some(key) {
                return Err(format!("{key:#x} missing from the LRU"));
            }
        }
        if pages != u64::from(self.used_pages()) || self.lru.len() != self.entries.len() {
            return Err(format!("{pages} pages in entries, {} used", self.used_pages()));
        }
        Ok(())
    }
}
