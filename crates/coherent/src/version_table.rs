//! The version table: dependency keys → 64-bit versions, in a region the
//! application module registers once at start-up.
//!
//! Layout (all words little-endian-in-memory u64, 8-aligned):
//!
//! ```text
//! offset 0    magic "TSVTABL1"
//! offset 8    incarnation: random, nonzero, chosen at module start
//! offset 16   capacity: number of slots
//! offset 24…63 reserved
//! offset 64 + 16*s   slot s: fingerprint (hash of the key, nonzero; 0 = unused)
//! offset 72 + 16*s           version (starts at 1, +1 per granted update)
//! ```
//!
//! A slot's fingerprint is written once, before the slot's index is ever
//! handed out, and never changes; the version is one aligned word. Since the
//! fabric transfers each aligned word atomically, a 16-byte read of a slot is
//! never torn, and a proxy needs no seqlock to validate it.
//!
//! A proxy checks all dependencies of a response with one batch: the
//! incarnation word and each dependency's slot. A restarted module has a new
//! incarnation, so nothing cached from its predecessor validates.

use crate::deps::{validate_key, Dep, DepsError, DepsHeader};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tierstack_base::NodeId;
use tierstack_fabric::{Fabric, FabricError, LocalRegion, Op, OpResult, RemoteRegion};

/// The region's name at the module's node.
pub const REGION_NAME: &str = "coherent.versions";
/// Most slots a table may have.
pub const SLOTS_MAX: u32 = 1 << 22;
const MAGIC: u64 = u64::from_le_bytes(*b"TSVTABL1");
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 16;
const INCARNATION_OFFSET: u64 = 8;

/// Identifies one run of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Incarnation(pub u64);

#[derive(Debug, thiserror::Error)]
pub enum VersionTableError {
    #[error("the version table is full ({capacity} keys)")]
    Full { capacity: u32 },
    #[error("capacity {0} is not between 1 and {SLOTS_MAX}")]
    BadCapacity(u32),
    #[error(transparent)]
    Key(#[from] DepsError),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("unknown slot {0}")]
    UnknownSlot(u32),
}

/// 64-bit FNV-1a of the key, never 0 (0 marks an unused slot).
pub fn fingerprint(key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash | 1
}

/// Most dependencies a check reads without a batch where the backend can
/// (see [`VersionChecker::is_current`]); more take the batch.
pub const NOW_DEPS_MAX: usize = 8;

fn slot_offset(slot: u32) -> u64 {
    HEADER_BYTES + SLOT_BYTES * u64::from(slot)
}

/// The owner's side: the module's table.
pub struct VersionTable {
    node: NodeId,
    region: Arc<LocalRegion>,
    incarnation: Incarnation,
    capacity: u32,
    slots: Mutex<HashMap<String, u32>>,
}

impl VersionTable {
    /// Registers the table's region on `fabric` with room for `capacity` keys.
    pub fn create(fabric: &dyn Fabric, capacity: u32, incarnation: Incarnation) -> Result<Self, VersionTableError> {
        if capacity == 0 || capacity > SLOTS_MAX {
            return Err(VersionTableError::BadCapacity(capacity));
        }
        let incarnation = Incarnation(incarnation.0 | 1);
        let region = fabric.register(REGION_NAME, slot_offset(capacity), tierstack_fabric::Access::read_only())?;
        let memory = region.memory();
        memory.store_u64(16, u64::from(capacity))?;
        memory.store_u64(INCARNATION_OFFSET, incarnation.0)?;
        memory.store_u64(0, MAGIC)?;
        Ok(Self { node: fabric.local_node(), region, incarnation, capacity, slots: Mutex::new(HashMap::new()) })
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Keys in use.
    pub fn len(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of `key`, assigning a new one (version 1) on first use.
    pub fn slot_of(&self, key: &str) -> Result<u32, VersionTableError> {
        let mut slots = self.slots.lock().map_err(|_| FabricError::Closed)?;
        if let Some(slot) = slots.get(key) {
            return Ok(*slot);
        }
        validate_key(key)?;
        let slot = u32::try_from(slots.len()).map_err(|_| VersionTableError::Full { capacity: self.capacity })?;
        if slot >= self.capacity {
            return Err(VersionTableError::Full { capacity: self.capacity });
        }
        let memory = self.region.memory();
        // Version first, then the fingerprint that makes the slot valid.
        memory.store_u64(slot_offset(slot) + 8, 1)?;
        memory.store_u64(slot_offset(slot), fingerprint(key))?;
        slots.insert(key.to_string(), slot);
        Ok(slot)
    }

    fn check_slot(&self, slot: u32) -> Result<(), VersionTableError> {
        let used = self.slots.lock().map(|s| s.len()).unwrap_or(0);
        if (slot as usize) < used {
            Ok(())
        } else {
            Err(VersionTableError::UnknownSlot(slot))
        }
    }

    pub fn version(&self, slot: u32) -> Result<u64, VersionTableError> {
        self.check_slot(slot)?;
        Ok(self.region.memory().load_u64(slot_offset(slot) + 8)?)
    }

    /// Increments the slot's version; returns the new version.
    pub fn bump(&self, slot: u32) -> Result<u64, VersionTableError> {
        self.check_slot(slot)?;
        Ok(self.region.memory().fetch_add(slot_offset(slot) + 8, 1)? + 1)
    }

    /// The current header for `keys` (each `(key, slot)`).
    pub fn header(&self, keys: &[(String, u32)]) -> Result<DepsHeader, VersionTableError> {
        let deps = keys
            .iter()
            .map(|(key, slot)| Ok(Dep { key: key.clone(), version: self.version(*slot)?, slot: *slot }))
            .collect::<Result<Vec<_>, VersionTableError>>()?;
        Ok(DepsHeader { node: self.node, incarnation: self.incarnation, deps })
    }
}

/// The proxy's side: validates dependency headers against the owners'
/// tables with one batched read each.
pub struct VersionChecker {
    fabric: Arc<dyn Fabric>,
    regions: Mutex<HashMap<NodeId, Arc<dyn RemoteRegion>>>,
}

impl VersionChecker {
    pub fn new(fabric: Arc<dyn Fabric>) -> Self {
        Self { fabric, regions: Mutex::new(HashMap::new()) }
    }

    fn cached_region(&self, node: NodeId) -> Option<Arc<dyn RemoteRegion>> {
        self.regions.lock().ok()?.get(&node).cloned()
    }

    fn forget(&self, node: NodeId) {
        if let Ok(mut regions) = self.regions.lock() {
            regions.remove(&node);
        }
    }

    async fn region(&self, node: NodeId) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        if let Some(region) = self.cached_region(node) {
            return Ok(region);
        }
        let fabric = self.fabric.clone();
        // Connecting may block (a tcp lookup round trip): keep it off the runtime's threads.
        let region = tokio::task::spawn_blocking(move || fabric.connect(node, REGION_NAME))
            .await
            .map_err(|e| FabricError::Io(e.to_string()))??;
        if let Ok(mut regions) = self.regions.lock() {
            regions.insert(node, region.clone());
        }
        Ok(region)
    }

    /// The batch that validates `header`: the incarnation word, then each slot.
    fn ops(header: &DepsHeader) -> Vec<Op> {
        std::iter::once(Op::Read { offset: INCARNATION_OFFSET, len: 8 })
            .chain(header.deps.iter().map(|d| Op::Read { offset: slot_offset(d.slot), len: 16 }))
            .collect()
    }

    fn word(bytes: &[u8], at: usize) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_ne_bytes(word)
    }

    fn judge(header: &DepsHeader, results: Vec<OpResult>) -> Result<Verdict, FabricError> {
        let mut results = results.into_iter();
        let incarnation = results.next().ok_or(FabricError::Closed)?.into_u64()?;
        if incarnation != header.incarnation.0 {
            return Ok(Verdict::OtherIncarnation);
        }
        for dep in &header.deps {
            let slot = results.next().ok_or(FabricError::Closed)?.into_bytes()?;
            if slot.len() != 16 || !Self::slot_holds(dep, Self::word(&slot, 0), Self::word(&slot, 8)) {
                return Ok(Verdict::Changed);
            }
        }
        Ok(Verdict::Current)
    }

    /// Does a slot read as these two words still hold `dep` at its version?
    fn slot_holds(dep: &Dep, fingerprint_word: u64, version_word: u64) -> bool {
        fingerprint_word == fingerprint(&dep.key) && version_word == dep.version
    }

    /// [`VersionChecker::judge`] of the words [`VersionChecker::read_now`]
    /// read: the incarnation, then each slot's fingerprint and version.
    fn judge_words(header: &DepsHeader, words: &[u64]) -> Verdict {
        if words.first() != Some(&header.incarnation.0) {
            return Verdict::OtherIncarnation;
        }
        let current =
            header.deps.iter().enumerate().all(|(i, dep)| match (words.get(1 + 2 * i), words.get(2 + 2 * i)) {
                (Some(&fingerprint_word), Some(&version_word)) => Self::slot_holds(dep, fingerprint_word, version_word),
                _ => false,
            });
        if current {
            Verdict::Current
        } else {
            Verdict::Changed
        }
    }

    /// The check without a batch, if the backend reads at once (`shm`) and
    /// `header` has at most [`NOW_DEPS_MAX`] dependencies: the words on the
    /// stack, no allocation. `None`: post the batch instead.
    fn read_now(&self, region: &dyn RemoteRegion, header: &DepsHeader) -> Option<Result<bool, FabricError>> {
        const WORDS: usize = 1 + 2 * NOW_DEPS_MAX;
        let used = 1 + 2 * header.deps.len();
        if used > WORDS {
            return None;
        }
        let mut offsets = [INCARNATION_OFFSET; WORDS];
        for (i, dep) in header.deps.iter().enumerate() {
            offsets[1 + 2 * i] = slot_offset(dep.slot);
            offsets[2 + 2 * i] = slot_offset(dep.slot) + 8;
        }
        let mut words = [0u64; WORDS];
        let read = region.read_words_now(&offsets[..used], &mut words[..used])?;
        Some(self.settle(header, read.map(|()| Self::judge_words(header, &words[..used]))))
    }

    fn conclude(&self, header: &DepsHeader, outcome: Result<Vec<OpResult>, FabricError>) -> Result<bool, FabricError> {
        self.settle(header, outcome.and_then(|results| Self::judge(header, results)))
    }

    fn settle(&self, header: &DepsHeader, verdict: Result<Verdict, FabricError>) -> Result<bool, FabricError> {
        match verdict {
            Ok(Verdict::Current) => Ok(true),
            Ok(Verdict::Changed) => Ok(false),
            Ok(Verdict::OtherIncarnation) => {
                // The module may have restarted: the next check connects afresh.
                self.forget(header.node);
                Ok(false)
            }
            Err(e) => {
                self.forget(header.node);
                Err(e)
            }
        }
    }

    /// True iff every dependency in `header` is still at its version, read
    /// now from the owner's table. Errors mean "could not check": callers
    /// must fail closed (treat as not current). One batch of reads; on a
    /// backend that reads at once (`shm`), up to [`NOW_DEPS_MAX`]
    /// dependencies are read as words on the stack instead (the same reads,
    /// without the batch's allocations).
    pub async fn is_current(&self, header: &DepsHeader) -> Result<bool, FabricError> {
        let region = self.region(header.node).await?;
        let slots_end = header.deps.iter().map(|d| slot_offset(d.slot) + SLOT_BYTES).max().unwrap_or(0);
        if slots_end > region.len() {
            return Ok(false);
        }
        if let Some(verdict) = self.read_now(region.as_ref(), header) {
            return verdict;
        }
        let outcome = region.post(Self::ops(header)).wait_async().await;
        self.conclude(header, outcome)
    }

    /// [`VersionChecker::is_current`] for several headers at once: one
    /// batched read per owner node (the incarnation word, then every
    /// header's slots), each header judged on its part. The verdicts come
    /// in `headers`' order; an error means "could not check" for that
    /// header (callers fail closed).
    pub async fn are_current(&self, headers: &[&DepsHeader]) -> Vec<Result<bool, FabricError>> {
        let mut verdicts: Vec<Option<Result<bool, FabricError>>> = headers.iter().map(|_| None).collect();
        let mut nodes: Vec<NodeId> = headers.iter().map(|h| h.node).collect();
        nodes.sort_unstable_by_key(|n| n.0);
        nodes.dedup();
        for node in nodes {
            let region = match self.region(node).await {
                Ok(region) => region,
                Err(e) => {
                    for (i, h) in headers.iter().enumerate() {
                        if h.node == node {
                            verdicts[i] = Some(Err(e.clone()));
                        }
                    }
                    continue;
                }
            };
            let mut batch = vec![Op::Read { offset: INCARNATION_OFFSET, len: 8 }];
            let mut members = Vec::new();
            for (i, header) in headers.iter().enumerate().filter(|(_, h)| h.node == node) {
                let slots_end = header.deps.iter().map(|d| slot_offset(d.slot) + SLOT_BYTES).max().unwrap_or(0);
                if slots_end > region.len() {
                    verdicts[i] = Some(Ok(false));
                    continue;
                }
                batch.extend(header.deps.iter().map(|d| Op::Read { offset: slot_offset(d.slot), len: 16 }));
                members.push(i);
            }
            if members.is_empty() {
                continue;
            }
            let outcome = region.post(batch).wait_async().await;
            let mut results = match outcome {
                Ok(results) => results.into_iter(),
                Err(e) => {
                    for &i in &members {
                        verdicts[i] = Some(self.conclude(headers[i], Err(e.clone())));
                    }
                    continue;
                }
            };
            let incarnation = results.next();
            for &i in &members {
                // Each header's part: the shared incarnation word, then its slots.
                let part: Vec<OpResult> =
                    incarnation.iter().cloned().chain(results.by_ref().take(headers[i].deps.len())).collect();
                verdicts[i] = Some(self.conclude(headers[i], Ok(part)));
            }
        }
        verdicts.into_iter().map(|v| v.unwrap_or(Err(FabricError::Closed))).collect()
    }

    /// Blocking form of [`VersionChecker::is_current`] for threads.
    pub fn is_current_blocking(&self, header: &DepsHeader) -> Result<bool, FabricError> {
        let region = match self.cached_region(header.node) {
            Some(region) => region,
            None => {
                let region = self.fabric.connect(header.node, REGION_NAME)?;
                if let Ok(mut regions) = self.regions.lock() {
                    regions.insert(header.node, region.clone());
                }
                region
            }
        };
        let slots_end = header.deps.iter().map(|d| slot_offset(d.slot) + SLOT_BYTES).max().unwrap_or(0);
        if slots_end > region.len() {
            return Ok(false);
        }
        if let Some(verdict) = self.read_now(region.as_ref(), header) {
            return verdict;
        }
        let outcome = region.post(Self::ops(header)).wait();
        self.conclude(header, outcome)
    }
}

enum Verdict {
    Current,
    Changed,
    OtherIncarnation,
}
