//! A home's key table: holder sets and versions of the keys homed here,
//! in memory and mirrored into `coop.keys` for one-sided validates.

use super::layout::{key_probe_start, KEY_ENTRY_BYTES, PROBE_MAX};
use crate::Key;
use std::collections::HashMap;
use std::sync::Arc;
use tierstack_fabric::LocalRegion;

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HomeEntry {
    pub index: u64,
    pub version: u64,
    pub holders: u64,
}

pub(crate) struct KeyTable {
    region: Arc<LocalRegion>,
    capacity: u64,
    entries: HashMap<Key, HomeEntry>,
    used: Vec<bool>,
    pub full: u64,
}

impl KeyTable {
    pub(super) fn new(region: Arc<LocalRegion>, capacity: u64) -> Self {
        let slots = (capacity + PROBE_MAX) as usize;
        Self { region, capacity, entries: HashMap::new(), used: vec![false; slots], full: 0 }
    }

    /// Keys with an entry now, and the most the table holds.
    pub(super) fn occupancy(&self) -> (u64, u64) {
        (self.entries.len() as u64, self.capacity)
    }

    /// The entry of `key`, created if needed (None if its window is full).
    fn entry(&mut self, key: Key) -> Option<&mut HomeEntry> {
        if !self.entries.contains_key(&key) {
            let start = key_probe_start(key, self.capacity);
            let index = (start..start + PROBE_MAX).find(|&i| !self.used[i as usize]);
            let Some(index) = index else {
                self.full += 1;
                return None;
            };
            self.used[index as usize] = true;
            let at = index * KEY_ENTRY_BYTES;
            let memory = self.region.memory();
            // In bounds: the region has capacity + PROBE_MAX entries.
            let _ = memory.store_u64(at, key);
            let _ = memory.store_u64(at + 8, 0);
            let _ = memory.store_u64(at + 16, 0);
            let _ = memory.store_u64(at + 24, 1);
            self.entries.insert(key, HomeEntry { index, version: 0, holders: 0 });
        }
        self.entries.get_mut(&key)
    }

    fn publish(&self, e: &HomeEntry) {
        let at = e.index * KEY_ENTRY_BYTES;
        let _ = self.region.memory().store_u64(at + 8, e.version);
        let _ = self.region.memory().store_u64(at + 16, e.holders);
    }

    /// `key`'s holder bitmap, if the table has an entry for it.
    pub(super) fn holders(&self, key: Key) -> Option<u64> {
        self.entries.get(&key).map(|e| e.holders)
    }

    /// `key`'s version (0 if it was never invalidated).
    pub(super) fn version(&self, key: Key) -> u64 {
        self.entries.get(&key).map_or(0, |e| e.version)
    }

    pub(super) fn update(&mut self, key: Key, remove: Option<u32>, add: Option<u32>) {
        let Some(e) = self.entry(key) else { return };
        if let Some(n) = remove.filter(|&n| n < 64) {
            e.holders &= !(1u64 << n);
        }
        if let Some(n) = add.filter(|&n| n < 64) {
            e.holders |= 1u64 << n;
        }
        let e = *e;
        self.publish(&e);
    }

    /// A guarded remove-holder (seed-notes a.7 #7): removes `node` only if
    /// another holder remains; whether it did. An entry the table could not
    /// hold is refused (the copy is kept).
    pub(super) fn remove_if_shared(&mut self, key: Key, node: u32) -> bool {
        let Some(e) = self.entries.get_mut(&key) else { return false };
        if !crate::placement::may_drop_copy(e.holders, node) {
            return false;
        }
        if node < 64 {
            e.holders &= !(1u64 << node);
        }
        let e = *e;
        self.publish(&e);
        true
    }

    /// Bumps the version and forgets every holder; returns the old holders.
    pub(super) fn invalidate(&mut self, key: Key) -> u64 {
        let Some(e) = self.entry(key) else { return 0 };
        let old = e.holders;
        e.holders = 0;
        e.version += 1;
        let e = *e;
        self.publish(&e);
        old
    }
}

/// Finds `key`'s version in a window of entries read from a key table.
pub(crate) fn version_in_window(window: &[u8], key: Key) -> Option<u64> {
    window.chunks_exact(KEY_ENTRY_BYTES as usize).find_map(|entry| {
        let word = |i: usize| u64::from_ne_bytes(entry[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        (word(3) == 1 && word(0) == key).then(|| word(1))
    })
}
