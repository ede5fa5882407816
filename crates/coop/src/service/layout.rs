//! Where things live in a node's registered regions.
//!
//! `coop.pool` (one region per node, read one-sidedly by peers):
//! ```text
//! 0                 page-table records, one per slot (slot = an entity's
//!                   first page): a seqlock record (fabric::seqlock) of
//!                   RECORD_PAYLOAD_BYTES: [key, bytes, version, pages,
//!                   page numbers packed two per word (ENTITY_PAGES_MAX)]
//! pages_at          pool pages, PAGE_BYTES each (4096-aligned)
//! after the pool    2 x STAGING_SLOTS staging areas of ENTITY_PAGES_MAX
//!                   pages: fetched entities waiting for a swap to finish,
//!                   then bodies offered by a STORE until their
//!                   acknowledgment (one area per primitive in flight, so
//!                   primitives need no node-wide lock)
//! ```
//! `coop.keys` (homes only): the key table, [`KEY_ENTRY_BYTES`] per entry:
//! `[key, version, holder bitmap, used flag]`, open addressing with linear
//! probing inside a window of [`PROBE_MAX`] entries from `mix(key) mod
//! capacity`; then one *floor* word per probe start (the version of a key
//! without an entry, `home.rs`). A validate reads the window and the floor
//! in one posted batch.

use crate::key::mix;
use crate::pool::{ENTITY_PAGES_MAX, PAGE_BYTES};
use crate::Key;
use tierstack_fabric::seqlock::SeqRecord;

pub const POOL_REGION: &str = "coop.pool";
pub const KEYS_REGION: &str = "coop.keys";

/// Record payload: 4 header words and the page list.
pub const RECORD_PAYLOAD_BYTES: u32 = 8 * (4 + ENTITY_PAGES_MAX / 2);
/// Bytes per record (sequence word + payload).
pub const RECORD_BYTES: u64 = 8 + RECORD_PAYLOAD_BYTES as u64;
/// Pages per staging area.
pub const STAGING_PAGES: u32 = ENTITY_PAGES_MAX;
/// Staging areas of each kind: swaps (or remote STOREs) a node runs at once;
/// one more waits for none, it does without (`node/locks.rs`).
pub const STAGING_SLOTS: u32 = 8;

pub const KEY_ENTRY_BYTES: u64 = 32;
/// Entries a key may probe (and a validate reads at once).
pub const PROBE_MAX: u64 = 16;

/// The pool region's geometry for `pool_pages` pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLayout {
    pub pool_pages: u32,
    pub pages_at: u64,
}

impl PoolLayout {
    pub fn new(pool_pages: u32) -> Self {
        let records = u64::from(pool_pages) * RECORD_BYTES;
        Self { pool_pages, pages_at: records.div_ceil(PAGE_BYTES) * PAGE_BYTES }
    }

    /// The region's size.
    pub fn region_bytes(&self) -> u64 {
        self.pages_at + u64::from(self.pool_pages + 2 * STAGING_SLOTS * STAGING_PAGES) * PAGE_BYTES
    }

    pub fn record(&self, slot: u32) -> SeqRecord {
        // The offset is 8-aligned (RECORD_BYTES is a multiple of 8) and the
        // payload size is a constant of the right shape: `new` cannot fail.
        SeqRecord::new(u64::from(slot) * RECORD_BYTES, RECORD_PAYLOAD_BYTES)
            .unwrap_or_else(|_| unreachable!("records are 8-aligned"))
    }

    /// Offset of the sequence word of `slot`'s record.
    pub fn record_seq_offset(&self, slot: u32) -> u64 {
        u64::from(slot) * RECORD_BYTES
    }

    pub fn page_offset(&self, page: u32) -> u64 {
        self.pages_at + u64::from(page) * PAGE_BYTES
    }

    /// First page of staging area `slot` for fetches awaiting a swap.
    pub fn fetch_staging(&self, slot: u32) -> u32 {
        self.pool_pages + slot * STAGING_PAGES
    }

    /// First page of staging area `slot` for bodies offered by STORE.
    pub fn store_staging(&self, slot: u32) -> u32 {
        self.pool_pages + (STAGING_SLOTS + slot) * STAGING_PAGES
    }
}

/// A page-table record's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: Key,
    pub bytes: u64,
    pub version: u64,
    pub pages: Vec<u32>,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut words = vec![0u64; RECORD_PAYLOAD_BYTES as usize / 8];
        words[0] = self.key;
        words[1] = self.bytes;
        words[2] = self.version;
        words[3] = self.pages.len() as u64;
        for (i, &p) in self.pages.iter().take(ENTITY_PAGES_MAX as usize).enumerate() {
            words[4 + i / 2] |= u64::from(p) << (32 * (i % 2));
        }
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    /// An empty record (a freed slot).
    pub fn empty() -> Vec<u8> {
        vec![0u8; RECORD_PAYLOAD_BYTES as usize]
    }

    pub fn decode(bytes: &[u8]) -> Option<Record> {
        let word =
            |i: usize| -> Option<u64> { Some(u64::from_ne_bytes(bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?)) };
        let n = word(3)?;
        if n == 0 || n > u64::from(ENTITY_PAGES_MAX) {
            return None;
        }
        let pages =
            (0..n as usize).map(|i| word(4 + i / 2).map(|w| (w >> (32 * (i % 2))) as u32)).collect::<Option<_>>()?;
        Some(Record { key: word(0)?, bytes: word(1)?, version: word(2)?, pages })
    }
}

/// The key table's first probe index for `key` in a table of `capacity`.
pub fn key_probe_start(key: Key, capacity: u64) -> u64 {
    mix(key ^ 0x6b65_7973) % capacity
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_pages_are_aligned() {
        let r = Record { key: 5, bytes: 9000, version: 2, pages: vec![7, 3, 9] };
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode(&Record::empty()), None);
        let l = PoolLayout::new(16384);
        assert_eq!(l.pages_at % PAGE_BYTES, 0);
        assert!(l.region_bytes() <= tierstack_base::limits::REGION_BYTES_MAX);
        assert_eq!(RECORD_BYTES % 8, 0);
    }
}
