//! A home's key table: holder sets and versions of the keys homed here,
//! in memory and mirrored into `coop.keys` for one-sided validates.
//!
//! **Entries live only while someone holds a copy.** An entry is created by
//! the first add-holder and freed when its last holder drops its copy (or an
//! invalidate drops them all), so the table holds at most the pooled
//! entities homed here, not every key ever seen.
//!
//! **A full window refuses, it never forgets.** When a key's probe window
//! has no free entry, its add-holder is refused ([`Add::Refused`]): the home
//! tells the node to drop the copy, so no copy exists that an invalidate
//! could miss (the entity stays unpooled; counted as `pool_refusals`).
//!
//! **Versions survive freeing.** A key without an entry reads the *floor*
//! of its probe start (one word per start, in the region after the
//! entries). Freeing an entry raises that floor to the entry's version; an
//! invalidate of a key without an entry raises it by one; a new entry starts
//! at the floor. So a key's version never goes back: a ticket read before an
//! invalidate never matches after it, with or without an entry between.
//! Every version of this table starts at a `base` chosen at start, so a
//! version handed out by another home, or by this node before a restart,
//! does not match one of this table (see `docs/internals/coop.md`).

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

/// What an add-holder did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Add {
    /// The node is listed (or was already).
    Listed,
    /// No room in the key's probe window: the node must drop its copy.
    Refused,
}

pub(crate) struct KeyTable {
    region: Arc<LocalRegion>,
    capacity: u64,
    entries: HashMap<Key, HomeEntry>,
    used: Vec<bool>,
    /// Per probe start: the version of a key without an entry.
    floors: Vec<u64>,
    /// Add-holders refused because the key's window was full.
    pub refused: u64,
    base: u64,
}

/// Bytes of the `coop.keys` region for a table of `capacity` entries: the
/// entries (with the probe overhang), then one floor word per start.
pub(crate) fn keys_region_bytes(capacity: u64) -> u64 {
    (capacity + PROBE_MAX) * KEY_ENTRY_BYTES + capacity * 8
}

/// Offset of the floor word of probe start `start`.
pub(crate) fn floor_offset(capacity: u64, start: u64) -> u64 {
    (capacity + PROBE_MAX) * KEY_ENTRY_BYTES + start * 8
}

impl KeyTable {
    /// A table of `capacity` entries in `region` (at least
    /// [`keys_region_bytes`]); every version starts at `base`.
    pub(super) fn new(region: Arc<LocalRegion>, capacity: u64, base: u64) -> Self {
        let slots = (capacity + PROBE_MAX) as usize;
        for start in 0..capacity {
            let _ = region.memory().store_u64(floor_offset(capacity, start), base);
        }
        Self {
            region,
            capacity,
            entries: HashMap::new(),
            used: vec![false; slots],
            floors: vec![base; capacity as usize],
            refused: 0,
            base,
        }
    }

    /// The version of every key at start.
    pub(super) fn base(&self) -> u64 {
        self.base
    }

    /// Keys with an entry now, and the most the table holds.
    pub(super) fn occupancy(&self) -> (u64, u64) {
        (self.entries.len() as u64, self.capacity)
    }

    fn start(&self, key: Key) -> u64 {
        key_probe_start(key, self.capacity)
    }

    /// The entry of `key`, created at its floor if needed (None if its
    /// window is full).
    fn entry(&mut self, key: Key) -> Option<&mut HomeEntry> {
        if !self.entries.contains_key(&key) {
            let start = self.start(key);
            let index = (start..start + PROBE_MAX).find(|&i| !self.used[i as usize])?;
            self.used[index as usize] = true;
            let version = self.floors[start as usize];
            let at = index * KEY_ENTRY_BYTES;
            let memory = self.region.memory();
            // In bounds: the region has capacity + PROBE_MAX entries. The
            // key word goes last, so a reader matching it sees this entry's
            // other words (see `free`).
            let _ = memory.store_u64(at + 8, version);
            let _ = memory.store_u64(at + 16, 0);
            let _ = memory.store_u64(at + 24, 1);
            let _ = memory.store_u64(at, key);
            self.entries.insert(key, HomeEntry { index, version, holders: 0 });
        }
        self.entries.get_mut(&key)
    }

    fn publish(&self, e: &HomeEntry) {
        let at = e.index * KEY_ENTRY_BYTES;
        let _ = self.region.memory().store_u64(at + 8, e.version);
        let _ = self.region.memory().store_u64(at + 16, e.holders);
    }

    /// Frees `key`'s entry, folding its version into its start's floor.
    fn free(&mut self, key: Key) {
        let Some(e) = self.entries.remove(&key) else { return };
        let start = self.start(key) as usize;
        let floor = self.floors[start].max(e.version);
        self.floors[start] = floor;
        let memory = self.region.memory();
        let _ = memory.store_u64(floor_offset(self.capacity, start as u64), floor);
        let at = e.index * KEY_ENTRY_BYTES;
        let _ = memory.store_u64(at, 0);
        let _ = memory.store_u64(at + 24, 0);
        self.used[e.index as usize] = false;
    }

    /// Publishes `key`'s entry, or frees it if nobody holds a copy.
    fn settle(&mut self, key: Key) {
        match self.entries.get(&key).copied() {
            Some(e) if e.holders == 0 => self.free(key),
            Some(e) => self.publish(&e),
            None => {}
        }
    }

    /// `key`'s holder bitmap, if the table has an entry for it.
    pub(super) fn holders(&self, key: Key) -> Option<u64> {
        self.entries.get(&key).map(|e| e.holders)
    }

    /// `key`'s version: its entry's, or its start's floor.
    pub(super) fn version(&self, key: Key) -> u64 {
        self.entries.get(&key).map_or_else(|| self.floors[self.start(key) as usize], |e| e.version)
    }

    /// Lists `node` as a holder of `key` (and unlists `remove` first, for a
    /// transfer). A full window refuses the add, never silently.
    pub(super) fn update(&mut self, key: Key, remove: Option<u32>, add: Option<u32>) -> Add {
        if let Some(n) = remove.filter(|&n| n < 64) {
            if let Some(e) = self.entries.get_mut(&key) {
                e.holders &= !(1u64 << n);
            }
        }
        let mut outcome = Add::Listed;
        if let Some(n) = add.filter(|&n| n < 64) {
            match self.entry(key) {
                Some(e) => e.holders |= 1u64 << n,
                None => {
                    self.refused += 1;
                    outcome = Add::Refused;
                }
            }
        }
        self.settle(key);
        outcome
    }

    /// A guarded remove-holder (seed-notes a.7 #7): removes `node` only if
    /// another holder remains; whether it did. A key without an entry is
    /// refused (the copy is kept; if its add was refused, the home's
    /// `Refused` drops it).
    pub(super) fn remove_if_shared(&mut self, key: Key, node: u32) -> bool {
        let Some(e) = self.entries.get_mut(&key) else { return false };
        if !crate::placement::may_drop_copy(e.holders, node) {
            return false;
        }
        if node < 64 {
            e.holders &= !(1u64 << node);
        }
        self.settle(key);
        true
    }

    /// Bumps the version and forgets every holder (freeing the entry);
    /// returns the old holders. Needs no free entry: a key without one has
    /// its floor raised.
    pub(super) fn invalidate(&mut self, key: Key) -> u64 {
        if let Some(e) = self.entries.get_mut(&key) {
            let old = e.holders;
            e.holders = 0;
            e.version += 1;
            self.free(key);
            return old;
        }
        let start = self.start(key) as usize;
        self.floors[start] += 1;
        let floor = self.floors[start];
        let _ = self.region.memory().store_u64(floor_offset(self.capacity, start as u64), floor);
        0
    }
}

impl KeyTable {
    /// Frees the entries of the keys `moved` says are no longer homed here
    /// (their holders drop those copies), as an invalidate would: should a
    /// key come back, no copy listed before matches its version.
    pub(super) fn forget_where(&mut self, moved: impl Fn(Key) -> bool) {
        let gone: Vec<Key> = self.entries.keys().copied().filter(|&k| moved(k)).collect();
        for key in gone {
            self.invalidate(key);
        }
    }
}

/// Finds `key`'s version in a window of entries read from a key table.
pub(crate) fn version_in_window(window: &[u8], key: Key) -> Option<u64> {
    window.chunks_exact(KEY_ENTRY_BYTES as usize).find_map(|entry| {
        let word = |i: usize| u64::from_ne_bytes(entry[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        (word(3) == 1 && word(0) == key).then(|| word(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use tierstack_fabric::RegionMemory;

    fn table(capacity: u64) -> KeyTable {
        let memory = RegionMemory::heap("coop.keys", keys_region_bytes(capacity)).unwrap();
        KeyTable::new(Arc::new(LocalRegion::new("coop.keys", memory)), capacity, 1 << 32)
    }

    /// The version a remote validate would read from the region.
    fn read_version(t: &KeyTable, key: Key) -> u64 {
        let start = key_probe_start(key, t.capacity);
        let mut window = vec![0u8; (PROBE_MAX * KEY_ENTRY_BYTES) as usize];
        t.region.memory().read(start * KEY_ENTRY_BYTES, &mut window).unwrap();
        version_in_window(&window, key)
            .unwrap_or_else(|| t.region.memory().load_u64(floor_offset(t.capacity, start)).unwrap())
    }

    /// Item 1 of issue 34: churn far more distinct keys than the table
    /// holds, on 8 nodes, with purges; the nodes do what the service does
    /// (a refused add drops the copy). After every purge no copy of the key
    /// survives, and a version once read never comes back.
    #[test]
    fn churning_millions_of_keys_with_purges_leaves_no_copy_a_purge_misses() {
        const NODES: u32 = 8;
        let mut t = table(1 << 10);
        // Who really holds a copy.
        let mut copies: HashMap<Key, HashSet<u32>> = HashMap::new();
        let mut seen_version: HashMap<Key, u64> = HashMap::new();
        let (mut refused, mut purges, mut fresh) = (0u64, 0u64, 0u64);
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            rng = crate::key::mix(rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
            rng
        };
        let mut live: Vec<Key> = Vec::new();
        for step in 0..3_000_000u64 {
            let r = next();
            let node = (r % u64::from(NODES)) as u32;
            match (r >> 8) % 10 {
                // A copy of a fresh key (most steps: millions of keys).
                0..=4 => {
                    let key = next() | 1;
                    fresh += 1;
                    if t.update(key, None, Some(node)) == Add::Listed {
                        copies.entry(key).or_default().insert(node);
                        live.push(key);
                    } else {
                        refused += 1;
                    }
                }
                // Another copy of a live key.
                5 | 6 if !live.is_empty() => {
                    let key = live[(next() % live.len() as u64) as usize];
                    if t.update(key, None, Some(node)) == Add::Listed {
                        copies.entry(key).or_default().insert(node);
                    } else {
                        refused += 1;
                    }
                }
                // A node drops a copy (eviction).
                7 | 8 if !live.is_empty() => {
                    let i = (next() % live.len() as u64) as usize;
                    let key = live[i];
                    if let Some(holders) = copies.get_mut(&key) {
                        if let Some(&n) = holders.iter().next() {
                            holders.remove(&n);
                            t.update(key, Some(n), None);
                        }
                        if holders.is_empty() {
                            copies.remove(&key);
                            live.swap_remove(i);
                        }
                    }
                }
                // A purge: the home drops every copy it lists.
                _ if !live.is_empty() => {
                    let i = (next() % live.len() as u64) as usize;
                    let key = live[i];
                    let before = read_version(&t, key);
                    let listed = t.invalidate(key);
                    for n in 0..NODES {
                        if listed & (1 << n) != 0 {
                            if let Some(h) = copies.get_mut(&key) {
                                h.remove(&n);
                            }
                        }
                    }
                    let left = copies.remove(&key).unwrap_or_default();
                    assert!(left.is_empty(), "step {step}: a purge missed the copies at {left:?}");
                    live.swap_remove(i);
                    assert!(read_version(&t, key) > before, "step {step}: the version did not move");
                    seen_version.insert(key, read_version(&t, key));
                    purges += 1;
                }
                _ => {}
            }
            // Keep live keys bounded (old keys dropped by every holder), so
            // the table frees as much as it fills.
            if live.len() > 600 {
                let key = live.swap_remove(0);
                for n in copies.remove(&key).unwrap_or_default() {
                    t.update(key, Some(n), None);
                }
            }
        }
        for (key, v) in &seen_version {
            assert!(read_version(&t, *key) >= *v, "a version went back");
        }
        let (entries, _) = t.occupancy();
        assert_eq!(entries as usize, copies.len(), "every entry has a holder");
        assert!(purges > 100_000, "{purges}");
        assert!(fresh > 1_400_000, "{fresh} distinct keys");
        assert_eq!(t.refused, refused);
        println!("{fresh} distinct keys, {purges} purges, {refused} refused adds, {entries} entries left");
    }

    /// A full window refuses the add and says so.
    #[test]
    fn a_full_window_refuses_and_an_absent_key_reads_its_floor() {
        let mut t = table(16);
        let mut refused = 0;
        for key in 1..=200u64 {
            if t.update(key, None, Some(0)) == Add::Refused {
                refused += 1;
                assert_eq!(t.holders(key), None);
            }
        }
        assert!(refused > 0);
        assert_eq!(t.refused, refused);
        // An invalidate of a key without an entry still moves its version.
        let absent = (1000..).find(|&k| t.holders(k).is_none()).unwrap();
        let v = read_version(&t, absent);
        assert_eq!(t.invalidate(absent), 0);
        assert_eq!(read_version(&t, absent), v + 1);
        assert_eq!(t.version(absent), v + 1);
    }
}
