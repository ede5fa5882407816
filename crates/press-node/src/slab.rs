//! The Zero version's registered cache: the bytes of the files a node
//! caches, kept in a registered region (`press.cache`) so a file transfer
//! is written to the receiver's ring straight from them (`Op::WriteFrom`),
//! with no copy at the sender ("all pages containing cached files are
//! registered", §4.2).
//!
//! The storage model (`tierstack_model::Storage`) decides what is cached;
//! this slab follows its inserts and evictions. Space is allocated first-fit
//! in 8-byte units (a transfer's local and remote offsets must agree modulo
//! 8). An entry being sent is pinned: its eviction frees the space only when
//! the last send ends, so no write ever overwrites bytes in flight. A file
//! for which no contiguous space is left (fragmentation) is simply not in
//! the slab, and its transfer falls back to a copy (counted).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use tierstack_fabric::{Fabric, FabricError, LocalRegion, LocalSlice};

/// The slab region's name.
pub const REGION: &str = "press.cache";

struct Entry {
    offset: u64,
    len: u64,
    pins: u32,
    evicted: bool,
}

#[derive(Default)]
struct State {
    /// Free space: offset → length, coalesced.
    free: BTreeMap<u64, u64>,
    entries: HashMap<String, Entry>,
}

/// A node's registered cache.
pub struct Slab {
    region: Arc<LocalRegion>,
    state: Mutex<State>,
}

fn round8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// A pinned file in the slab; dropping it unpins.
pub struct Pinned<'a> {
    slab: &'a Slab,
    path: String,
    pub slice: LocalSlice,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.slab.unpin(&self.path);
    }
}

impl Slab {
    /// Registers a slab of `bytes` (at least 8).
    pub fn register(fabric: &Arc<dyn Fabric>, bytes: u64) -> Result<Slab, FabricError> {
        let bytes = round8(bytes.max(8));
        let region = fabric.register(REGION, bytes, tierstack_fabric::Access::read_only())?;
        let mut state = State::default();
        state.free.insert(0, region.len());
        Ok(Slab { region, state: Mutex::new(state) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The storage started caching `path`: store its bytes (the read from
    /// disk lands here). Returns whether there was room.
    pub fn insert(&self, path: &str, body: &[u8]) -> bool {
        let need = round8(body.len() as u64).max(8);
        let offset = {
            let mut state = self.state();
            if state.entries.contains_key(path) {
                return true;
            }
            let Some((&at, &len)) = state.free.iter().find(|(_, &len)| len >= need) else { return false };
            state.free.remove(&at);
            if len > need {
                state.free.insert(at + need, len - need);
            }
            // Pinned while its bytes are written, so nobody sends it half-filled.
            state
                .entries
                .insert(path.to_string(), Entry { offset: at, len: body.len() as u64, pins: 1, evicted: false });
            at
        };
        let written = self.region.memory().write(offset, body).is_ok();
        self.unpin(path);
        if !written {
            self.evict(path);
        }
        written
    }

    /// The storage evicted `path`.
    pub fn evict(&self, path: &str) {
        let mut state = self.state();
        let Some(entry) = state.entries.get_mut(path) else { return };
        if entry.pins > 0 {
            entry.evicted = true;
            return;
        }
        if let Some(entry) = state.entries.remove(path) {
            release(&mut state.free, entry.offset, round8(entry.len).max(8));
        }
    }

    /// Pins `path` for a transfer, if its bytes are in the slab.
    pub fn pin(&self, path: &str) -> Option<Pinned<'_>> {
        let mut state = self.state();
        let entry = state.entries.get_mut(path)?;
        if entry.evicted {
            return None;
        }
        entry.pins += 1;
        let slice = LocalSlice::new(self.region.clone(), entry.offset, u32::try_from(entry.len).ok()?);
        Some(Pinned { slab: self, path: path.to_string(), slice })
    }

    fn unpin(&self, path: &str) {
        let mut state = self.state();
        let Some(entry) = state.entries.get_mut(path) else { return };
        entry.pins = entry.pins.saturating_sub(1);
        if entry.pins == 0 && entry.evicted {
            if let Some(entry) = state.entries.remove(path) {
                release(&mut state.free, entry.offset, round8(entry.len).max(8));
            }
        }
    }

    /// Files whose bytes are in the slab (for stats and tests).
    pub fn files(&self) -> usize {
        self.state().entries.values().filter(|e| !e.evicted).count()
    }
}

/// Returns `[offset, offset + len)` to the free map, merging neighbours.
fn release(free: &mut BTreeMap<u64, u64>, mut offset: u64, mut len: u64) {
    if let Some((&before, &before_len)) = free.range(..offset).next_back() {
        if before + before_len == offset {
            free.remove(&before);
            offset = before;
            len += before_len;
        }
    }
    if let Some(&after_len) = free.get(&(offset + len)) {
        free.remove(&(offset + len));
        len += after_len;
    }
    free.insert(offset, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_file_is_freed_only_when_its_last_send_ends() {
        let cluster = tierstack_cluster::local_cluster(tierstack_cluster::Backend::Shm, 1).unwrap();
        let slab = Slab::register(cluster.fabric(0), 64).unwrap();
        assert!(slab.insert("/a", &[1; 30]));
        assert!(slab.insert("/b", &[2; 30]));
        assert!(!slab.insert("/c", &[3; 8]), "full: 32 + 32 bytes of 64");
        let pinned = slab.pin("/a").unwrap();
        assert_eq!((pinned.slice.offset(), pinned.slice.len()), (0, 30));
        slab.evict("/a");
        assert!(slab.pin("/a").is_none(), "an evicted file is not sent again");
        assert!(!slab.insert("/c", &[3; 8]), "its space is still in flight");
        drop(pinned);
        assert!(slab.insert("/c", &[3; 8]), "freed when the send ended");
        let mut bytes = [0u8; 8];
        let c = slab.pin("/c").unwrap();
        slab.region.memory().read(c.slice.offset(), &mut bytes).unwrap();
        assert_eq!(bytes, [3; 8]);
        assert_eq!(slab.files(), 2);
    }

    #[test]
    fn release_coalesces() {
        let mut free = BTreeMap::new();
        release(&mut free, 0, 8);
        release(&mut free, 16, 8);
        release(&mut free, 8, 8);
        assert_eq!(free.into_iter().collect::<Vec<_>>(), vec![(0, 24)]);
    }
}
