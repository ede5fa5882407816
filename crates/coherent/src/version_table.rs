//! The version table: dependency keys → 64-bit versions, in a region the
//! application module registers once at start-up.
//!
//! Layout (all words little-endian-in-memory u64, 8-aligned):
//!
//! ```text
//! offset 0    magic "TSVTABL1"
//! offset 8    incarnation: random, nonzero, chosen at module start
//! offset 16   capacity: number of slots
//! offset 24   published pages: offset of the area (0: none)
//! offset 32   published pages: records
//! offset 40   published pages: payload bytes per record
//! offset 48…63 reserved
//! offset 64 + 16*s   slot s: fingerprint (hash of the key, nonzero; 0 = unused)
//! offset 72 + 16*s           version (starts at 1, +1 per granted update;
//!                            +2 for an update given up, see `update_plan`)
//! then, 8-aligned, the published pages (`crate::pages`)
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
use crate::pages::{self, PageError, PageMiss, PageParts, PageVerdict, PagesLayout, SlotRead, StoredPage};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tierstack_base::NodeId;
use tierstack_fabric::seqlock::SeqRecord;
use tierstack_fabric::{Fabric, FabricError, LocalRegion, Op, OpResult, RemoteRegion};

/// The region's name at the module's node.
pub const REGION_NAME: &str = "coherent.versions";
/// Most slots a table may have.
pub const SLOTS_MAX: u32 = 1 << 22;
const MAGIC: u64 = u64::from_le_bytes(*b"TSVTABL1");
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 16;
const INCARNATION_OFFSET: u64 = 8;
const PAGES_WORDS_OFFSET: u64 = 24;
/// Torn page reads retried before a proxy gives up on the page.
const PAGE_READ_ATTEMPTS: u32 = 3;

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
    #[error(transparent)]
    Page(#[from] PageError),
    #[error("published pages: {count} records of {page_bytes} bytes is outside 0..={max_count} records of 8..={max_bytes} bytes (a multiple of 8)", max_count = pages::PAGES_MAX, max_bytes = pages::PAGE_BYTES_MAX)]
    BadPages { count: u32, page_bytes: u32 },
    #[error("slot {slot}: version {to} is not above the current {current}")]
    VersionBackwards { slot: u32, current: u64, to: u64 },
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

/// How many pages a table keeps published, and how large each may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagesConfig {
    /// Records (0: publish nothing).
    pub count: u32,
    /// Payload bytes per record (rounded up to a multiple of 8).
    pub page_bytes: u32,
}

impl PagesConfig {
    /// No published pages.
    pub const NONE: PagesConfig = PagesConfig { count: 0, page_bytes: 0 };
    pub const DEFAULT: PagesConfig = PagesConfig { count: pages::PAGES_DEFAULT, page_bytes: pages::PAGE_BYTES_DEFAULT };
}

/// The owner's side: the module's table.
pub struct VersionTable {
    node: NodeId,
    region: Arc<LocalRegion>,
    incarnation: Incarnation,
    capacity: u32,
    slots: Mutex<HashMap<String, u32>>,
    /// The published pages' area, and the lock that keeps its writers
    /// one at a time (a seqlock record has one writer).
    pages: Option<Mutex<PagesLayout>>,
}

impl VersionTable {
    /// Registers the table's region on `fabric` with room for `capacity`
    /// keys and no published pages.
    pub fn create(fabric: &dyn Fabric, capacity: u32, incarnation: Incarnation) -> Result<Self, VersionTableError> {
        Self::create_with_pages(fabric, capacity, PagesConfig::NONE, incarnation)
    }

    /// Registers the table's region with room for `capacity` keys and the
    /// published pages `pages` asks for, after the slots.
    pub fn create_with_pages(
        fabric: &dyn Fabric,
        capacity: u32,
        pages: PagesConfig,
        incarnation: Incarnation,
    ) -> Result<Self, VersionTableError> {
        if capacity == 0 || capacity > SLOTS_MAX {
            return Err(VersionTableError::BadCapacity(capacity));
        }
        let page_bytes = pages.page_bytes.div_ceil(8).saturating_mul(8);
        let bad_pages = VersionTableError::BadPages { count: pages.count, page_bytes: pages.page_bytes };
        let layout = match pages.count {
            0 => None,
            count if count > pages::PAGES_MAX || !(8..=pages::PAGE_BYTES_MAX).contains(&page_bytes) => {
                return Err(bad_pages)
            }
            count => Some(PagesLayout { offset: slot_offset(capacity), count, page_bytes }),
        };
        let len = slot_offset(capacity) + layout.map_or(0, |l| l.bytes());
        let incarnation = Incarnation(incarnation.0 | 1);
        let region = fabric.register(REGION_NAME, len, tierstack_fabric::Access::read_only())?;
        let memory = region.memory();
        memory.store_u64(16, u64::from(capacity))?;
        if let Some(layout) = layout {
            memory.store_u64(PAGES_WORDS_OFFSET, layout.offset)?;
            memory.store_u64(PAGES_WORDS_OFFSET + 8, u64::from(layout.count))?;
            memory.store_u64(PAGES_WORDS_OFFSET + 16, u64::from(layout.page_bytes))?;
        }
        memory.store_u64(INCARNATION_OFFSET, incarnation.0)?;
        memory.store_u64(0, MAGIC)?;
        Ok(Self {
            node: fabric.local_node(),
            region,
            incarnation,
            capacity,
            slots: Mutex::new(HashMap::new()),
            pages: layout.map(Mutex::new),
        })
    }

    /// The published pages' area, if the table has one.
    pub fn pages_layout(&self) -> Option<PagesLayout> {
        self.pages.as_ref().and_then(|p| p.lock().ok().map(|l| *l))
    }

    /// Publishes `page`, generated at `deps` (the `X-Tierstack-Deps` value),
    /// as the page of `key_slot`, replacing whatever its record held
    /// (`crate::pages`: placement and eviction). Refused, changing
    /// nothing, if the table has no area or the page does not fit a record.
    pub fn publish(&self, key_slot: u32, deps: &str, page: &PageParts) -> Result<(), VersionTableError> {
        self.check_slot(key_slot)?;
        let area = self.pages.as_ref().ok_or(PageError::NoArea)?;
        let layout = area.lock().map_err(|_| FabricError::Closed)?;
        let payload = pages::encode(key_slot, deps, page, layout.page_bytes)?;
        let record = SeqRecord::new(layout.record_offset(layout.record_of(key_slot)), layout.page_bytes)?;
        record.write_local(self.region.memory(), &payload)?;
        Ok(())
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

    /// Sets the slot's version to `version`, which must be above the
    /// current one (versions never go back: a proxy's copy at an older
    /// version must never validate again). The module is the only writer.
    pub fn advance_to(&self, slot: u32, version: u64) -> Result<(), VersionTableError> {
        let current = self.version(slot)?;
        if version <= current {
            return Err(VersionTableError::VersionBackwards { slot, current, to: version });
        }
        Ok(self.region.memory().store_u64(slot_offset(slot) + 8, version)?)
    }

    /// The header for `keys` (each `(key, slot)`) at the given `versions`
    /// (one per key), whether or not they are visible yet.
    pub fn header_at(&self, keys: &[(String, u32)], versions: &[u64]) -> DepsHeader {
        let deps = keys
            .iter()
            .zip(versions)
            .map(|((key, slot), version)| Dep { key: key.clone(), version: *version, slot: *slot })
            .collect();
        DepsHeader { node: self.node, incarnation: self.incarnation, deps }
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
    tables: Mutex<HashMap<NodeId, Arc<OwnerTable>>>,
}

/// An owner's table as a checker sees it: the region, and what its header
/// says (read once per connection).
struct OwnerTable {
    region: Arc<dyn RemoteRegion>,
    /// Where the slots end: a header naming a slot at or beyond it is not current.
    slots_end: u64,
    /// The published-pages area, if the table has one.
    pages: Option<PagesLayout>,
}

impl OwnerTable {
    /// Reads the header words that say where the slots and pages are.
    fn describe(region: Arc<dyn RemoteRegion>) -> Result<OwnerTable, FabricError> {
        let read = Op::Read { offset: 16, len: 32 };
        let words = region.post(vec![read]).wait()?.into_iter().next().ok_or(FabricError::Closed)?.into_bytes()?;
        if words.len() != 32 {
            return Err(FabricError::Closed);
        }
        let word = |i: usize| VersionChecker::word(&words, 8 * i);
        let capacity = word(0).min(u64::from(SLOTS_MAX));
        let slots_end = (HEADER_BYTES + SLOT_BYTES * capacity).min(region.len());
        let pages = PagesLayout::from_words(word(1), word(2), word(3), region.len()).filter(|l| l.offset >= slots_end);
        Ok(OwnerTable { region, slots_end, pages })
    }
}

/// A published page found current ([`VersionChecker::published_page`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedPage {
    pub page: StoredPage,
    /// The versions it was generated at (`page.deps` parsed).
    pub deps: DepsHeader,
}

impl VersionChecker {
    pub fn new(fabric: Arc<dyn Fabric>) -> Self {
        Self { fabric, tables: Mutex::new(HashMap::new()) }
    }

    fn cached_table(&self, node: NodeId) -> Option<Arc<OwnerTable>> {
        self.tables.lock().ok()?.get(&node).cloned()
    }

    fn forget(&self, node: NodeId) {
        if let Ok(mut tables) = self.tables.lock() {
            tables.remove(&node);
        }
    }

    fn remember(&self, node: NodeId, table: OwnerTable) -> Arc<OwnerTable> {
        let table = Arc::new(table);
        if let Ok(mut tables) = self.tables.lock() {
            tables.insert(node, table.clone());
        }
        table
    }

    /// The page published for `header`'s first key, if it serves `path`
    /// at versions current now (`crate::pages`, [`pages::judge`]): one
    /// batch of the incarnation, the page's record and `header`'s slots,
    /// repeated only for a torn read or a page longer than the
    /// `expect_bytes` read the first time. `Ok(Err(miss))`: no usable page
    /// (go to the application tier); `Err`: the owner could not be read.
    pub async fn published_page(
        &self,
        header: &DepsHeader,
        path: &str,
        expect_bytes: usize,
    ) -> Result<Result<PublishedPage, PageMiss>, FabricError> {
        let table = self.table(header.node).await?;
        let Some(layout) = table.pages else { return Ok(Err(PageMiss::NoArea)) };
        let Some(first) = header.deps.first() else { return Ok(Err(PageMiss::Absent)) };
        if Self::slots_end(header) > table.slots_end {
            return Ok(Err(PageMiss::Unverifiable));
        }
        let record = layout.record_offset(layout.record_of(first.slot));
        let page_bytes = layout.page_bytes as usize;
        let mut len = expect_bytes.clamp(pages::PAYLOAD_HEADER_BYTES, page_bytes);
        let mut verdict = PageVerdict::Unusable(PageMiss::Torn);
        for _ in 0..PAGE_READ_ATTEMPTS {
            let mut batch = vec![
                Op::Read { offset: INCARNATION_OFFSET, len: 8 },
                Op::Read { offset: record, len: 8 },
                Op::Read { offset: record + 8, len: len as u32 },
                Op::Read { offset: record, len: 8 },
            ];
            batch.extend(header.deps.iter().map(|d| Op::Read { offset: slot_offset(d.slot), len: 16 }));
            let results = match table.region.post(batch).wait_async().await {
                Ok(results) => results,
                Err(e) => {
                    self.forget(header.node);
                    return Err(e);
                }
            };
            let mut results = results.into_iter();
            let mut next = || results.next().ok_or(FabricError::Closed).and_then(OpResult::into_bytes);
            let incarnation = next()?;
            let before = next()?;
            let payload = next()?;
            let after = next()?;
            if [&incarnation, &before, &after].iter().any(|w| w.len() != 8) {
                return Err(FabricError::Closed);
            }
            let mut slots = Vec::with_capacity(header.deps.len());
            for dep in &header.deps {
                let slot = next()?;
                if slot.len() != 16 {
                    return Err(FabricError::Closed);
                }
                slots.push(SlotRead {
                    slot: dep.slot,
                    fingerprint: Self::word(&slot, 0),
                    version: Self::word(&slot, 8),
                });
            }
            let incarnation = Self::word(&incarnation, 0);
            let sequence = (Self::word(&before, 0), Self::word(&after, 0));
            verdict = pages::judge(header, path, incarnation, &slots, sequence, &payload);
            match verdict {
                PageVerdict::ReadMore(more) if more <= page_bytes && more > len => len = more,
                PageVerdict::Unusable(PageMiss::Torn) => {}
                _ => break,
            }
        }
        Ok(match verdict {
            PageVerdict::Current(found) => {
                let (page, deps) = *found;
                Ok(PublishedPage { page, deps })
            }
            PageVerdict::Unusable(PageMiss::OtherIncarnation) => {
                self.forget(header.node);
                Err(PageMiss::OtherIncarnation)
            }
            PageVerdict::Unusable(miss) => Err(miss),
            PageVerdict::ReadMore(_) => Err(PageMiss::Malformed),
        })
    }

    async fn table(&self, node: NodeId) -> Result<Arc<OwnerTable>, FabricError> {
        if let Some(table) = self.cached_table(node) {
            return Ok(table);
        }
        let fabric = self.fabric.clone();
        // Connecting may block (a tcp lookup round trip): keep it off the runtime's threads.
        let table = tokio::task::spawn_blocking(move || OwnerTable::describe(fabric.connect(node, REGION_NAME)?))
            .await
            .map_err(|e| FabricError::Io(e.to_string()))??;
        Ok(self.remember(node, table))
    }

    /// Where `header`'s slots end in the table.
    fn slots_end(header: &DepsHeader) -> u64 {
        header.deps.iter().map(|d| slot_offset(d.slot) + SLOT_BYTES).max().unwrap_or(0)
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
        let table = self.table(header.node).await?;
        if Self::slots_end(header) > table.slots_end {
            return Ok(false);
        }
        if let Some(verdict) = self.read_now(table.region.as_ref(), header) {
            return verdict;
        }
        let outcome = table.region.post(Self::ops(header)).wait_async().await;
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
            let table = match self.table(node).await {
                Ok(table) => table,
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
                if Self::slots_end(header) > table.slots_end {
                    verdicts[i] = Some(Ok(false));
                    continue;
                }
                batch.extend(header.deps.iter().map(|d| Op::Read { offset: slot_offset(d.slot), len: 16 }));
                members.push(i);
            }
            if members.is_empty() {
                continue;
            }
            let outcome = table.region.post(batch).wait_async().await;
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
        let table = match self.cached_table(header.node) {
            Some(table) => table,
            None => self.remember(header.node, OwnerTable::describe(self.fabric.connect(header.node, REGION_NAME)?)?),
        };
        if Self::slots_end(header) > table.slots_end {
            return Ok(false);
        }
        if let Some(verdict) = self.read_now(table.region.as_ref(), header) {
            return verdict;
        }
        let outcome = table.region.post(Self::ops(header)).wait();
        self.conclude(header, outcome)
    }
}

enum Verdict {
    Current,
    Changed,
    OtherIncarnation,
}
