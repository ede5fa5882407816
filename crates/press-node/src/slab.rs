//! The node's memory cache of file bytes. For Zero it is a registered
//! region (`press.cache`) so a file transfer is written to the receiver's
//! ring straight from it (`Op::WriteFrom`), with no copy at the sender
//! ("all pages containing cached files are registered", §4.2); for the
//! other versions the same slab lives in plain heap memory.
//!
//! Each entry is a forwarded reply's payload as it goes on the wire: the
//! file's [`FileMeta`] (size and mtime, `META_BYTES`) then its bytes
//! (`crate::files::reply_payload`). So the Zero send of a cached file is
//! [`Slab::get`]'s `slice`, whole, and a local hit copies the bytes after
//! the metadata out ([`CachedFile::body`]). An entry whose metadata differs
//! from a fresh stat is stale: the caller evicts it and reads the file anew.
//!
//! The storage model (`tierstack_model::Storage`) decides what is cached;
//! this slab follows its inserts and evictions. Space is allocated first-fit
//! in 8-byte units (a transfer's local and remote offsets must agree modulo
//! 8). An entry being sent is pinned: its eviction frees the space only when
//! the last send ends, so no write ever overwrites bytes in flight. A file
//! for which no contiguous space is left (fragmentation) is simply not in
//! the slab, and its transfer falls back to a copy (counted).

use crate::files::{FileMeta, META_BYTES};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use tierstack_fabric::{Fabric, FabricError, LocalRegion, LocalSlice, RegionMemory};

/// The slab region's name.
pub const REGION: &str = "press.cache";

struct Entry {
    meta: FileMeta,
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

/// A cached file, pinned in the slab (its space is not reused while this
/// lives); dropping it unpins.
pub struct CachedFile<'a> {
    slab: &'a Slab,
    path: String,
    /// The file's size and mtime when it was cached.
    pub meta: FileMeta,
    /// The reply payload in the slab: metadata, then the file's bytes.
    pub slice: LocalSlice,
}

/// The former name of a pinned slab entry.
pub type Pinned<'a> = CachedFile<'a>;

impl CachedFile<'_> {
    /// A copy of the file's bytes (a local hit's answer).
    pub fn body(&self) -> Result<Bytes, FabricError> {
        let mut out = vec![0u8; usize::try_from(self.meta.size).unwrap_or(0)];
        self.slab.region.memory().read(self.slice.offset() + META_BYTES as u64, &mut out)?;
        Ok(Bytes::from(out))
    }
}

impl Drop for CachedFile<'_> {
    fn drop(&mut self) {
        self.slab.unpin(&self.path);
    }
}

impl Slab {
    /// Registers a slab of `bytes` (at least 8).
    pub fn register(fabric: &Arc<dyn Fabric>, bytes: u64) -> Result<Slab, FabricError> {
        let bytes = round8(bytes.max(8));
        let region = fabric.register(REGION, bytes, tierstack_fabric::Access::read_only())?;
        Ok(Slab::over(region))
    }

    /// A slab of `bytes` in plain memory (the versions that do not send
    /// from it by remote writes).
    pub fn heap(bytes: u64) -> Result<Slab, FabricError> {
        let bytes = round8(bytes.max(8));
        Ok(Slab::over(Arc::new(LocalRegion::new(REGION, RegionMemory::heap(REGION, bytes)?))))
    }

    fn over(region: Arc<LocalRegion>) -> Slab {
        let mut state = State::default();
        state.free.insert(0, region.len());
        Slab { region, state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The storage started caching `path`: store its metadata and bytes
    /// (the read from disk lands here). Returns whether there was room. An
    /// entry of other metadata is replaced.
    pub fn insert(&self, path: &str, meta: FileMeta, body: &[u8]) -> bool {
        let payload = crate::files::reply_payload(&meta, body);
        let need = round8(payload.len() as u64).max(8);
        let offset = {
            let mut state = self.state();
            match state.entries.get(path) {
                Some(entry) if entry.meta == meta && !entry.evicted => return true,
                Some(_) => {
                    drop(state);
                    self.evict(path);
                    state = self.state();
                    if state.entries.contains_key(path) {
                        // Still being sent: no second entry under one name.
                        return false;
                    }
                }
                None => {}
            }
            let Some((&at, &len)) = state.free.iter().find(|(_, &len)| len >= need) else { return false };
            state.free.remove(&at);
            if len > need {
                state.free.insert(at + need, len - need);
            }
            // Pinned while its bytes are written, so nobody sends it half-filled.
            state.entries.insert(
                path.to_string(),
                Entry { meta, offset: at, len: payload.len() as u64, pins: 1, evicted: false },
            );
            at
        };
        let written = self.region.memory().write(offset, &payload).is_ok();
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

    /// The cached file `path`, pinned, if its bytes are in the slab: what
    /// a Zero send writes from, and what a local hit copies. The caller
    /// compares `meta` with a fresh stat (a changed file is stale).
    pub fn get(&self, path: &str) -> Option<CachedFile<'_>> {
        let mut state = self.state();
        let entry = state.entries.get_mut(path)?;
        if entry.evicted {
            return None;
        }
        let slice = LocalSlice::new(self.region.clone(), entry.offset, u32::try_from(entry.len).ok()?);
        entry.pins += 1;
        Some(CachedFile { slab: self, path: path.to_string(), meta: entry.meta, slice })
    }

    /// [`Slab::get`] under its former name.
    pub fn pin(&self, path: &str) -> Option<CachedFile<'_>> {
        self.get(path)
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
        let slab = Slab::register(cluster.fabric(0), 96).unwrap();
        let meta = |size| FileMeta { size, mtime_ns: 1 };
        assert!(slab.insert("/a", meta(30), &[1; 30]));
        assert!(slab.insert("/b", meta(30), &[2; 30]));
        assert!(!slab.insert("/c", meta(8), &[3; 8]), "full: 48 + 48 bytes of 96");
        let pinned = slab.get("/a").unwrap();
        assert_eq!((pinned.slice.offset(), pinned.slice.len(), pinned.meta), (0, 46, meta(30)));
        slab.evict("/a");
        assert!(slab.get("/a").is_none(), "an evicted file is not sent again");
        assert!(!slab.insert("/c", meta(8), &[3; 8]), "its space is still in flight");
        drop(pinned);
        assert!(slab.insert("/c", meta(8), &[3; 8]), "freed when the send ended");
        let c = slab.get("/c").unwrap();
        assert_eq!(c.body().unwrap(), Bytes::from(vec![3; 8]));
        let mut payload = [0u8; 24];
        slab.region.memory().read(c.slice.offset(), &mut payload).unwrap();
        assert_eq!(
            crate::files::split_reply(Bytes::copy_from_slice(&payload)),
            Some((meta(8), Bytes::from(vec![3; 8])))
        );
        drop(c);
        assert_eq!(slab.files(), 2);
        assert!(slab.insert("/c", FileMeta { size: 8, mtime_ns: 2 }, &[4; 8]), "a changed file replaces its entry");
        assert_eq!(slab.get("/c").unwrap().body().unwrap(), Bytes::from(vec![4; 8]));
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
