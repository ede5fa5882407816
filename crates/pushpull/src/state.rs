//! The shared cache state: a proxy's recently accessed documents in a
//! registered region, written on the request path and read one-sidedly by
//! the application tier (coherency paper §4.3: "a table of the requested
//! files, its timestamp, frequency and an associated weight").
//!
//! Layout (every field a native-endian u64 word, 8-aligned):
//!
//! ```text
//! offset 0    0 (constant: the header reads as a seqlock record that never changes)
//! offset 8    magic "TSCSTAT1"
//! offset 16   capacity: number of slots (a multiple of WAYS, at most SLOTS_MAX)
//! offset 24   ways: slots per bucket (8)
//! offset 32   now_ns: the proxy's clock at its latest access (fetch_max)
//! offset 40   accesses: accesses recorded since start
//! offset 48   half_life_ns: the weight's decay half-life
//! offset 56   dropped: updates the writer gave up on (contention)
//! offset 64 + 48*s   slot s, a seqlock record:
//!     +0   sequence: even = stable, odd = a writer holds the slot
//!     +8   fingerprint of the document's cache key (0 = empty slot)
//!     +16  last_access_ns (the proxy's clock)
//!     +24  access_count since the slot was assigned to this document
//!     +32  weight: f64 bits, access count decayed with half_life_ns, as of last_access_ns
//!     +40  flags: bit 0 = resident (the proxy's cache holds a copy, of any version)
//! ```
//!
//! **Placement.** A document hashes to one bucket of [`WAYS`] slots; it takes
//! its own slot if present, else the bucket's least recently accessed slot.
//! So the table holds the recently accessed documents and forgets the rest.
//!
//! **Writers** are the proxy's request threads, lock-free: a writer claims a
//! slot by a compare-and-swap of its sequence from even to odd (the seqlock's
//! "write in progress"), re-checks the fingerprint it planned for, writes,
//! and releases by storing sequence + 2. Writers of one slot are therefore
//! serialized, as the seqlock requires, without a lock a reader could see.
//! Two writers may rarely place the same new document in two slots of its
//! bucket; the reader keeps the most recent of duplicates.
//!
//! **Readers** post one batch per proxy through
//! [`tierstack_fabric::seqlock::read_many`]: the header and every slot as
//! seqlock records, retrying only torn slots. The header's sequence word is
//! constant 0, and its fields are single words (atomic per word on every
//! backend), so it needs no writer protocol.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_base::limits::BATCH_OPS_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::seqlock::{self, SeqRecord};
use tierstack_fabric::{Fabric, FabricError, LocalRegion, RemoteRegion};

/// The region's name at each proxy's node.
pub const REGION_NAME: &str = "pushpull.cache-state";
/// Slots per bucket.
pub const WAYS: u32 = 8;
/// Default capacity (documents tracked per proxy).
pub const SLOTS_DEFAULT: u32 = 256;
/// Largest capacity: header and slots must fit one posted batch of
/// [`BATCH_OPS_MAX`] operations (three per seqlock record).
pub const SLOTS_MAX: u32 = 336;
/// Default half-life of the weight's decay.
pub const HALF_LIFE_MS_DEFAULT: u64 = 2_000;
/// A writer spins this long for a slot held by another writer, then drops
/// its update (counted in the header's `dropped`).
const CLAIM_SPINS_MAX: u32 = 4096;
/// Spins before a waiting writer starts yielding its CPU.
const CLAIM_SPINS_BEFORE_YIELD: u32 = 64;
/// Placement attempts when a planned slot changed under the writer.
const PLACE_ATTEMPTS_MAX: u32 = 4;

const HEADER_BYTES: u64 = 64;
const RECORD_BYTES: u64 = 48;
const PAYLOAD_BYTES: u32 = 40;
const RECORD_WORDS: usize = 6;
const MAGIC: u64 = u64::from_le_bytes(*b"TSCSTAT1");
const H_MAGIC: u64 = 8;
const H_CAPACITY: u64 = 16;
const H_WAYS: u64 = 24;
const H_NOW: u64 = 32;
const H_ACCESSES: u64 = 40;
const H_HALF_LIFE: u64 = 48;
const H_DROPPED: u64 = 56;
const FLAG_RESIDENT: u64 = 1;

const _: () = assert!((1 + SLOTS_MAX as usize) * 3 <= BATCH_OPS_MAX);
const _: () = assert!(SLOTS_MAX.is_multiple_of(WAYS) && SLOTS_DEFAULT.is_multiple_of(WAYS));

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheStateError {
    #[error("cache state capacity {slots} must be a multiple of {WAYS} between {WAYS} and {SLOTS_MAX}")]
    BadCapacity { slots: u32 },
    #[error("the weight's half-life must be at least 1 ms")]
    BadHalfLife,
    #[error("region is not a cache state: {0}")]
    BadRegion(String),
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// How a proxy's cache state is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheStateConfig {
    /// Documents tracked (a multiple of [`WAYS`], at most [`SLOTS_MAX`]).
    pub slots: u32,
    /// Half-life of the weight's decay.
    pub half_life_ms: u64,
}

impl Default for CacheStateConfig {
    fn default() -> Self {
        Self { slots: SLOTS_DEFAULT, half_life_ms: HALF_LIFE_MS_DEFAULT }
    }
}

impl CacheStateConfig {
    /// Checks the capacity and half-life.
    pub fn validate(&self) -> Result<(), CacheStateError> {
        if self.slots < WAYS || self.slots > SLOTS_MAX || !self.slots.is_multiple_of(WAYS) {
            return Err(CacheStateError::BadCapacity { slots: self.slots });
        }
        if self.half_life_ms == 0 {
            return Err(CacheStateError::BadHalfLife);
        }
        Ok(())
    }
}

/// Bytes of a cache state region with `slots` slots.
pub fn region_bytes(slots: u32) -> u64 {
    HEADER_BYTES + RECORD_BYTES * u64::from(slots)
}

fn record_offset(slot: u32) -> u64 {
    HEADER_BYTES + RECORD_BYTES * u64::from(slot)
}

/// `weight` decayed over `elapsed_ns` with `half_life_ns`.
fn decay(weight: f64, elapsed_ns: u64, half_life_ns: u64) -> f64 {
    if elapsed_ns == 0 || half_life_ns == 0 {
        return weight;
    }
    weight * (-(elapsed_ns as f64) / half_life_ns as f64).exp2()
}

/// Spreads a fingerprint over buckets (FNV fingerprints have weak high bits).
fn mix(fingerprint: u64) -> u64 {
    let mut x = fingerprint ^ (fingerprint >> 31);
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// Claims a slot for writing: sequence even → odd. `None` after
/// [`CLAIM_SPINS_MAX`] failed attempts.
fn claim(sequence: &AtomicU64) -> Option<u64> {
    for attempt in 0..CLAIM_SPINS_MAX {
        let current = sequence.load(Ordering::Relaxed);
        if current.is_multiple_of(2)
            && sequence.compare_exchange_weak(current, current + 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            // The odd sequence is ordered before the payload stores that
            // follow, as in `seqlock::write_words`.
            fence(Ordering::Release);
            return Some(current);
        }
        if attempt < CLAIM_SPINS_BEFORE_YIELD {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    None
}

/// Ends a claim taken at sequence `claimed`: payload stores happen before.
fn release(sequence: &AtomicU64, claimed: u64) {
    sequence.store(claimed.wrapping_add(2), Ordering::Release);
}

/// The proxy's side: records accesses and residency into its region.
pub struct CacheStateWriter {
    region: Arc<LocalRegion>,
    slots: u32,
    half_life_ns: u64,
    /// Serializes the placement of documents not yet in the table, so that
    /// two threads recording a new document's first accesses cannot put it
    /// in two slots (the duplicate would later evict another document's
    /// record in a full bucket, losing its counts). Accesses to documents
    /// already placed never take it.
    placing: std::sync::Mutex<()>,
}

impl std::fmt::Debug for CacheStateWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStateWriter").field("slots", &self.slots).finish()
    }
}

impl CacheStateWriter {
    /// Registers [`REGION_NAME`] on `fabric` and initializes it.
    pub fn create(fabric: &dyn Fabric, config: CacheStateConfig) -> Result<Self, CacheStateError> {
        config.validate()?;
        let region = fabric.register(REGION_NAME, region_bytes(config.slots), tierstack_fabric::Access::read_only())?;
        Self::on_region(region, config)
    }

    /// Initializes an already registered, zero-filled region of at least
    /// [`region_bytes`]`(config.slots)` bytes.
    pub fn on_region(region: Arc<LocalRegion>, config: CacheStateConfig) -> Result<Self, CacheStateError> {
        config.validate()?;
        if region.len() < region_bytes(config.slots) {
            return Err(CacheStateError::BadRegion(format!(
                "{} bytes is too small for {} slots",
                region.len(),
                config.slots
            )));
        }
        let half_life_ns = config.half_life_ms.saturating_mul(1_000_000);
        let memory = region.memory();
        memory.store_u64(H_CAPACITY, u64::from(config.slots))?;
        memory.store_u64(H_WAYS, u64::from(WAYS))?;
        memory.store_u64(H_HALF_LIFE, half_life_ns)?;
        // Magic last: a reader that sees it sees the fields above.
        memory.store_u64(H_MAGIC, MAGIC)?;
        Ok(Self { region, slots: config.slots, half_life_ns, placing: std::sync::Mutex::new(()) })
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    fn header_word(&self, offset: u64) -> Option<&AtomicU64> {
        self.region.memory().words(offset, 1).ok().and_then(|w| w.first())
    }

    fn record(&self, slot: u32) -> Option<&[AtomicU64]> {
        self.region.memory().words(record_offset(slot), RECORD_WORDS).ok()
    }

    fn bucket(&self, fingerprint: u64) -> std::ops::Range<u32> {
        let buckets = u64::from(self.slots / WAYS);
        let start = (mix(fingerprint) % buckets) as u32 * WAYS;
        start..start + WAYS
    }

    /// The slot holding `fingerprint`, if any: its bucket's records are
    /// adjacent, so they are bounds-checked once, not once per way.
    fn find(&self, fingerprint: u64) -> Option<u32> {
        let ways = self.bucket(fingerprint);
        let records = self.region.memory().words(record_offset(ways.start), WAYS as usize * RECORD_WORDS).ok()?;
        let at = records.chunks_exact(RECORD_WORDS).position(|r| r[1].load(Ordering::Relaxed) == fingerprint)?;
        Some(ways.start + at as u32)
    }

    /// Where `fingerprint` goes: its own slot, or the bucket's least
    /// recently accessed (empty first). Returns the slot and the fingerprint
    /// it held when chosen.
    fn place(&self, fingerprint: u64) -> Option<(u32, u64)> {
        if let Some(slot) = self.find(fingerprint) {
            return Some((slot, fingerprint));
        }
        self.bucket(fingerprint)
            .filter_map(|slot| {
                let record = self.record(slot)?;
                let held = record[1].load(Ordering::Relaxed);
                let age_key = if held == 0 { 0 } else { record[2].load(Ordering::Relaxed).saturating_add(1) };
                Some((age_key, slot, held))
            })
            .min_by_key(|(age_key, slot, _)| (*age_key, *slot))
            .map(|(_, slot, held)| (slot, held))
    }

    fn note_dropped(&self) {
        if let Some(word) = self.header_word(H_DROPPED) {
            word.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records one request for the document `fingerprint` at `now_ns` (the
    /// proxy's monotonic clock), and whether the proxy's cache holds a copy
    /// of it now. Returns false if the update was dropped under contention.
    pub fn record_access(&self, fingerprint: u64, resident: bool, now_ns: u64) -> bool {
        if fingerprint == 0 {
            return false;
        }
        if let Some(word) = self.header_word(H_NOW) {
            word.fetch_max(now_ns, Ordering::Relaxed);
        }
        if let Some(word) = self.header_word(H_ACCESSES) {
            word.fetch_add(1, Ordering::Relaxed);
        }
        let flags = if resident { FLAG_RESIDENT } else { 0 };
        // Fast path, lock-free: the document already has a slot.
        if let Some(slot) = self.find(fingerprint) {
            match self.update_in(slot, fingerprint, fingerprint, flags, now_ns) {
                Some(true) => return true,
                Some(false) => {} // moved meanwhile: place it below
                None => {
                    self.note_dropped();
                    return false;
                }
            }
        }
        // Slow path: placing a document, one thread at a time.
        let Ok(_placing) = self.placing.lock() else {
            self.note_dropped();
            return false;
        };
        for _ in 0..PLACE_ATTEMPTS_MAX {
            let Some((slot, planned)) = self.place(fingerprint) else { break };
            match self.update_in(slot, fingerprint, planned, flags, now_ns) {
                Some(true) => return true,
                Some(false) => continue,
                None => break,
            }
        }
        self.note_dropped();
        false
    }

    /// Under the slot's claim: counts an access if the slot holds
    /// `fingerprint`, or gives the slot to it if it still holds `planned` (a
    /// victim chosen by `place`). `Some(false)`: the slot changed meanwhile;
    /// `None`: the slot could not be claimed.
    fn update_in(&self, slot: u32, fingerprint: u64, planned: u64, flags: u64, now_ns: u64) -> Option<bool> {
        let record = self.record(slot)?;
        let claimed = claim(&record[0])?;
        let held = record[1].load(Ordering::Relaxed);
        let updated = if held == fingerprint {
            let last_ns = record[2].load(Ordering::Relaxed);
            let count = record[3].load(Ordering::Relaxed);
            let weight = f64::from_bits(record[4].load(Ordering::Relaxed));
            let weight = decay(weight, now_ns.saturating_sub(last_ns), self.half_life_ns) + 1.0;
            let old_flags = record[5].load(Ordering::Relaxed);
            record[2].store(now_ns.max(last_ns), Ordering::Relaxed);
            record[3].store(count.saturating_add(1), Ordering::Relaxed);
            record[4].store(weight.to_bits(), Ordering::Relaxed);
            record[5].store((old_flags & !FLAG_RESIDENT) | flags, Ordering::Relaxed);
            true
        } else if held == planned {
            // Still the victim we chose: the document takes the slot.
            record[1].store(fingerprint, Ordering::Relaxed);
            record[2].store(now_ns, Ordering::Relaxed);
            record[3].store(1, Ordering::Relaxed);
            record[4].store(1.0f64.to_bits(), Ordering::Relaxed);
            record[5].store(flags, Ordering::Relaxed);
            true
        } else {
            // Another writer placed a different document here meanwhile.
            false
        };
        release(&record[0], claimed);
        Some(updated)
    }

    /// Marks whether the cache holds a copy of `fingerprint` (a store, an
    /// eviction, a drop). Does nothing for a document the table does not
    /// track. Returns true if a slot was updated.
    pub fn set_resident(&self, fingerprint: u64, resident: bool) -> bool {
        if fingerprint == 0 {
            return false;
        }
        let Some(slot) = self.find(fingerprint) else { return false };
        let Some(record) = self.record(slot) else { return false };
        let Some(claimed) = claim(&record[0]) else {
            self.note_dropped();
            return false;
        };
        let updated = record[1].load(Ordering::Relaxed) == fingerprint;
        if updated {
            let flags = record[5].load(Ordering::Relaxed);
            record[5].store(if resident { flags | FLAG_RESIDENT } else { flags & !FLAG_RESIDENT }, Ordering::Relaxed);
        }
        release(&record[0], claimed);
        updated
    }

    /// Updates the writer gave up on.
    pub fn dropped(&self) -> u64 {
        self.header_word(H_DROPPED).map_or(0, |w| w.load(Ordering::Relaxed))
    }
}

/// One tracked document, as read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateEntry {
    pub fingerprint: u64,
    pub last_access_ns: u64,
    pub access_count: u64,
    /// Access count decayed with the snapshot's half-life, as of `last_access_ns`.
    pub weight: f64,
    /// The proxy's cache holds a copy (of some version).
    pub resident: bool,
}

/// One proxy's cache state, read consistently (each entry untorn).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheStateSnapshot {
    pub slots: u32,
    /// The proxy's clock at its latest recorded access.
    pub now_ns: u64,
    pub accesses: u64,
    pub half_life_ns: u64,
    pub dropped: u64,
    /// Occupied slots, one per document, in no particular order.
    pub entries: Vec<StateEntry>,
}

impl CacheStateSnapshot {
    /// A snapshot of `entries` (for tests and simulation).
    pub fn from_entries(now_ns: u64, half_life_ns: u64, entries: Vec<StateEntry>) -> Self {
        let accesses = entries.iter().map(|e| e.access_count).sum();
        Self { slots: entries.len() as u32, now_ns, accesses, half_life_ns, dropped: 0, entries }
    }

    pub fn entry(&self, fingerprint: u64) -> Option<&StateEntry> {
        self.entries.iter().find(|e| e.fingerprint == fingerprint)
    }

    /// 0 for the most recently accessed document: the number of tracked
    /// documents accessed strictly later than this one.
    pub fn recency_rank(&self, fingerprint: u64) -> Option<usize> {
        let entry = self.entry(fingerprint)?;
        Some(self.entries.iter().filter(|e| e.last_access_ns > entry.last_access_ns).count())
    }

    /// The document's request rate at this proxy, estimated from its weight
    /// decayed to `now_ns`: a decayed count of a Poisson stream of rate λ
    /// averages λ·half-life/ln 2.
    pub fn request_rate_hz(&self, entry: &StateEntry) -> f64 {
        if self.half_life_ns == 0 {
            return 0.0;
        }
        let weight = decay(entry.weight, self.now_ns.saturating_sub(entry.last_access_ns), self.half_life_ns);
        weight * std::f64::consts::LN_2 / (self.half_life_ns as f64 / 1e9)
    }
}

fn records_for(region_len: u64) -> Result<Vec<SeqRecord>, CacheStateError> {
    let slots = region_len.saturating_sub(HEADER_BYTES) / RECORD_BYTES;
    if region_len < region_bytes(WAYS) || slots > u64::from(SLOTS_MAX) {
        return Err(CacheStateError::BadRegion(format!("unexpected length {region_len}")));
    }
    let mut records = vec![SeqRecord::new(0, (HEADER_BYTES - 8) as u32)?];
    for slot in 0..slots as u32 {
        records.push(SeqRecord::new(record_offset(slot), PAYLOAD_BYTES)?);
    }
    Ok(records)
}

fn words_of(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            u64::from_ne_bytes(word)
        })
        .collect()
}

fn parse(results: Vec<(u64, Vec<u8>)>) -> Result<CacheStateSnapshot, CacheStateError> {
    let mut results = results.into_iter();
    let header = words_of(&results.next().ok_or(FabricError::Closed)?.1);
    if header.len() < 7 || header[0] != MAGIC {
        return Err(CacheStateError::BadRegion("no magic (not initialized yet?)".into()));
    }
    let slots = header[1];
    let remaining = results.len() as u64;
    if slots != remaining || header[2] != u64::from(WAYS) {
        return Err(CacheStateError::BadRegion(format!(
            "header says {slots} slots of {} ways, region holds {remaining}",
            header[2]
        )));
    }
    let mut by_fingerprint: HashMap<u64, StateEntry> = HashMap::new();
    for (_, payload) in results {
        let w = words_of(&payload);
        if w.len() < 5 || w[0] == 0 {
            continue;
        }
        let entry = StateEntry {
            fingerprint: w[0],
            last_access_ns: w[1],
            access_count: w[2],
            weight: f64::from_bits(w[3]),
            resident: w[4] & FLAG_RESIDENT != 0,
        };
        // A rare duplicate placement: keep the most recent record.
        by_fingerprint
            .entry(entry.fingerprint)
            .and_modify(|kept| {
                if entry.last_access_ns > kept.last_access_ns {
                    *kept = entry;
                }
            })
            .or_insert(entry);
    }
    Ok(CacheStateSnapshot {
        slots: slots as u32,
        now_ns: header[3],
        accesses: header[4],
        half_life_ns: header[5],
        dropped: header[6],
        entries: by_fingerprint.into_values().collect(),
    })
}

/// Reads a cache state region consistently (blocking): one posted batch,
/// then only torn slots again.
pub fn read_region(region: &dyn RemoteRegion) -> Result<CacheStateSnapshot, CacheStateError> {
    let records = records_for(region.len())?;
    parse(seqlock::read_many(region, &records)?)
}

/// As [`read_region`], without blocking an async runtime thread.
pub async fn read_region_async(region: &dyn RemoteRegion) -> Result<CacheStateSnapshot, CacheStateError> {
    let records = records_for(region.len())?;
    parse(seqlock::read_many_async(region, &records).await?)
}

/// The application tier's side: reads proxies' cache states, keeping one
/// connection per proxy (dropped after any error, so a restarted proxy is
/// reached afresh).
pub struct CacheStateReader {
    fabric: Arc<dyn Fabric>,
    regions: Mutex<HashMap<NodeId, Arc<dyn RemoteRegion>>>,
}

impl CacheStateReader {
    pub fn new(fabric: Arc<dyn Fabric>) -> Self {
        Self { fabric, regions: Mutex::new(HashMap::new()) }
    }

    fn cached(&self, node: NodeId) -> Option<Arc<dyn RemoteRegion>> {
        self.regions.lock().ok()?.get(&node).cloned()
    }

    fn remember(&self, node: NodeId, region: &Arc<dyn RemoteRegion>) {
        if let Ok(mut regions) = self.regions.lock() {
            regions.insert(node, region.clone());
        }
    }

    fn forget(&self, node: NodeId) {
        if let Ok(mut regions) = self.regions.lock() {
            regions.remove(&node);
        }
    }

    /// Reads `node`'s cache state.
    pub async fn read(&self, node: NodeId) -> Result<CacheStateSnapshot, CacheStateError> {
        let region = match self.cached(node) {
            Some(region) => region,
            None => {
                let fabric = self.fabric.clone();
                // Connecting may block (a tcp round trip): keep it off the runtime's threads.
                let region = tokio::task::spawn_blocking(move || fabric.connect(node, REGION_NAME))
                    .await
                    .map_err(|e| FabricError::Io(e.to_string()))??;
                self.remember(node, &region);
                region
            }
        };
        let outcome = read_region_async(region.as_ref()).await;
        if outcome.is_err() {
            self.forget(node);
        }
        outcome
    }

    /// Blocking form of [`CacheStateReader::read`], for threads.
    pub fn read_blocking(&self, node: NodeId) -> Result<CacheStateSnapshot, CacheStateError> {
        let region = match self.cached(node) {
            Some(region) => region,
            None => {
                let region = self.fabric.connect(node, REGION_NAME)?;
                self.remember(node, &region);
                region
            }
        };
        let outcome = read_region(region.as_ref());
        if outcome.is_err() {
            self.forget(node);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tierstack_cluster::{local_cluster, Backend};
    use tierstack_fabric::RegionMemory;

    fn local_writer(slots: u32) -> CacheStateWriter {
        let memory = RegionMemory::heap(REGION_NAME, region_bytes(slots)).unwrap();
        let region = Arc::new(LocalRegion::new(REGION_NAME, memory));
        CacheStateWriter::on_region(region, CacheStateConfig { slots, half_life_ms: 1000 }).unwrap()
    }

    /// Reads the writer's own region through the seqlock protocol, as a
    /// remote reader would (the region's memory executes the batch).
    struct Loopback(Arc<LocalRegion>);
    impl RemoteRegion for Loopback {
        fn node(&self) -> NodeId {
            NodeId(0)
        }
        fn name(&self) -> &str {
            self.0.name()
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn post(&self, ops: Vec<tierstack_fabric::Op>) -> tierstack_fabric::Completion {
            let result = tierstack_fabric::check_batch(self.0.name(), self.0.len(), &ops)
                .and_then(|()| tierstack_fabric::execute_on_memory(self.0.memory(), &ops));
            tierstack_fabric::Completion::ready(result)
        }
    }

    fn snapshot(writer: &CacheStateWriter) -> CacheStateSnapshot {
        read_region(&Loopback(writer.region.clone())).unwrap()
    }

    #[test]
    fn rejects_bad_configurations() {
        let memory = RegionMemory::heap("x", 4096).unwrap();
        let region = Arc::new(LocalRegion::new("x", memory));
        for slots in [0, 7, 12, SLOTS_MAX + WAYS] {
            let config = CacheStateConfig { slots, half_life_ms: 10 };
            assert_eq!(
                CacheStateWriter::on_region(region.clone(), config).unwrap_err(),
                CacheStateError::BadCapacity { slots }
            );
        }
        let config = CacheStateConfig { slots: 8, half_life_ms: 0 };
        assert_eq!(CacheStateWriter::on_region(region.clone(), config).unwrap_err(), CacheStateError::BadHalfLife);
        let config = CacheStateConfig { slots: 336, half_life_ms: 10 };
        assert!(matches!(CacheStateWriter::on_region(region, config), Err(CacheStateError::BadRegion(_))));
    }

    #[test]
    fn records_accesses_counts_weights_and_residency() {
        let writer = local_writer(16);
        assert!(writer.record_access(11, false, 1_000));
        assert!(writer.record_access(11, true, 2_000));
        assert!(writer.record_access(22, false, 3_000));
        assert!(writer.set_resident(22, true));
        assert!(writer.set_resident(22, false));
        assert!(!writer.set_resident(33, true), "untracked documents are not added by residency");
        let state = snapshot(&writer);
        assert_eq!(state.slots, 16);
        assert_eq!(state.accesses, 3);
        assert_eq!(state.now_ns, 3_000);
        assert_eq!(state.entries.len(), 2);
        let a = state.entry(11).unwrap();
        assert_eq!((a.access_count, a.last_access_ns, a.resident), (2, 2_000, true));
        assert!(a.weight > 1.99 && a.weight <= 2.0, "1 µs of decay with a 1 s half-life: {}", a.weight);
        let b = state.entry(22).unwrap();
        assert_eq!((b.access_count, b.resident), (1, false));
        assert_eq!(state.recency_rank(22), Some(0));
        assert_eq!(state.recency_rank(11), Some(1));
        assert_eq!(state.recency_rank(33), None);
    }

    #[test]
    fn weight_decays_with_the_half_life() {
        let writer = local_writer(8);
        writer.record_access(5, true, 0);
        writer.record_access(5, true, 1_000_000_000); // one half-life later: 1/2 + 1
        let state = snapshot(&writer);
        let entry = state.entry(5).unwrap();
        assert!((entry.weight - 1.5).abs() < 1e-9, "{}", entry.weight);
        // Rate estimate: weight · ln2 / half-life (1 s).
        assert!((state.request_rate_hz(entry) - 1.5 * std::f64::consts::LN_2).abs() < 1e-9);
    }

    #[test]
    fn a_full_bucket_forgets_its_least_recently_accessed_document() {
        // 8 slots = one bucket: the 9th document replaces the oldest.
        let writer = local_writer(8);
        for fp in 1..=8u64 {
            writer.record_access(fp * 1000, true, fp);
        }
        writer.record_access(1000, true, 100); // document 1 is now the most recent
        writer.record_access(9000, false, 101);
        let state = snapshot(&writer);
        assert_eq!(state.entries.len(), 8);
        assert!(state.entry(2000).is_none(), "the least recently accessed document was replaced");
        assert!(state.entry(1000).is_some() && state.entry(9000).is_some());
        assert_eq!(state.entry(9000).unwrap().access_count, 1, "a new occupant starts afresh");
        assert_eq!(state.recency_rank(9000), Some(0));
    }

    #[test]
    fn concurrent_writers_lose_no_access_and_readers_never_see_torn_records() {
        // 64 slots, 24 documents: every document fits, so nothing is evicted.
        let writer = Arc::new(local_writer(64));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (writer, stop) = (writer.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for entry in snapshot(&writer).entries {
                        // Writers encode the document in the low bits of the time.
                        assert_eq!(entry.last_access_ns & 0xff, entry.fingerprint & 0xff, "torn: {entry:?}");
                        assert!(entry.access_count >= 1 && entry.weight >= 1.0 - 1e-9);
                        assert!(entry.weight <= entry.access_count as f64 + 1e-9, "torn: {entry:?}");
                    }
                    reads += 1;
                }
                reads
            })
        };
        let per_thread = 50_000u64;
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (writer, start) = (writer.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut recorded = 0u64;
                    for i in 0..per_thread {
                        // All threads walk the documents in step: maximal contention per slot.
                        let fp = 1 + (i * 7 + t / 2) % 24;
                        recorded += u64::from(writer.record_access(fp, i % 2 == 0, ((i + 1) << 8) | fp));
                    }
                    recorded
                })
            })
            .collect();
        let recorded: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        let state = snapshot(&writer);
        assert_eq!(state.entries.len(), 24, "every document has exactly one slot");
        // No access is lost silently: each is counted in its document's slot,
        // or reported dropped (a claim that stayed contended, by design).
        assert_eq!(state.entries.iter().map(|e| e.access_count).sum::<u64>(), recorded);
        assert_eq!(recorded + writer.dropped(), 4 * per_thread);
        assert_eq!(state.accesses, 4 * per_thread);
    }

    #[test]
    fn replacement_under_contention_keeps_records_consistent() {
        // 8 slots, 40 documents: constant replacement races.
        let writer = Arc::new(local_writer(8));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let fp = 1 + (i * 13 + t * 7) % 40;
                        writer.record_access(fp, true, ((i + 1) << 8) | fp);
                        let state = snapshot(&writer);
                        for e in state.entries {
                            assert_eq!(e.last_access_ns & 0xff, e.fingerprint & 0xff, "torn: {e:?}");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let state = snapshot(&writer);
        assert!(state.entries.len() <= 8);
        assert!(state.accesses == 80_000);
    }

    fn over_the_fabric(backend: Backend) {
        let cluster = local_cluster(backend, 2).unwrap();
        let writer = CacheStateWriter::create(cluster.fabric(1).as_ref(), CacheStateConfig::default()).unwrap();
        for fp in 1..=100u64 {
            for _ in 0..fp {
                writer.record_access(fp, fp % 2 == 0, fp * 10);
            }
        }
        let reader = CacheStateReader::new(cluster.fabric(0).clone());
        let state = reader.read_blocking(NodeId(1)).unwrap();
        assert_eq!(state.slots, SLOTS_DEFAULT);
        assert_eq!(state.accesses, 5050);
        assert!(state.entries.len() >= 90, "most of 100 documents fit 256 slots in 8-way buckets");
        for e in &state.entries {
            assert_eq!(e.access_count, e.fingerprint);
            assert_eq!(e.resident, e.fingerprint % 2 == 0);
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let again = runtime.block_on(reader.read(NodeId(1))).unwrap();
        assert_eq!(again.accesses, 5050);
        // A node without a cache state: a typed error, and nothing cached.
        assert!(reader.read_blocking(NodeId(0)).is_err());
    }

    #[test]
    fn reads_over_shm() {
        over_the_fabric(Backend::Shm);
    }

    #[test]
    fn reads_over_tcp() {
        over_the_fabric(Backend::Tcp);
    }
}
