//! Consistent one-sided reads of small records: a sequence lock.
//!
//! Multi-word one-sided reads are not atomic, so a reader can see half of a
//! concurrent write. A [`SeqRecord`] puts a sequence word in front of the
//! payload:
//!
//! ```text
//! offset+0   sequence: u64   even = stable, odd = a write is in progress;
//!                            sequence / 2 = number of completed writes
//! offset+8   payload: payload_bytes, padded to whole words
//! ```
//!
//! A writer makes the sequence odd, writes the payload, and makes it even
//! again. A reader reads sequence, payload, sequence in one posted batch and
//! accepts the payload only if both sequence reads are equal and even;
//! otherwise it retries. Writers of one record must be serialized (one
//! owner thread, or a lock); readers need no coordination.
//!
//! The word-level protocol ([`write_words`], [`read_words`]) is generic over
//! [`Word`] so that it is model-checked with loom (`--cfg tierstack_loom`).

use crate::sync::Ordering;
use crate::{FabricError, Op, RegionMemory, RemoteRegion, Result};

/// Torn reads tolerated before a read gives up with [`FabricError::TornRead`].
pub const READ_ATTEMPTS_MAX: u32 = 10_000;

/// A 64-bit atomic word as the word protocols need it (this seqlock and the
/// `shm` message rings), so that each is model-checked with loom.
pub trait Word {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64;
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64>;
    fn fence(order: Ordering);
}

impl Word for std::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::load(self, order)
    }
    fn store(&self, value: u64, order: Ordering) {
        std::sync::atomic::AtomicU64::store(self, value, order)
    }
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::fetch_or(self, bits, order)
    }
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64> {
        std::sync::atomic::AtomicU64::compare_exchange(self, current, new, success, failure)
    }
    fn fence(order: Ordering) {
        std::sync::atomic::fence(order)
    }
}

#[cfg(tierstack_loom)]
impl Word for loom::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::load(self, order)
    }
    fn store(&self, value: u64, order: Ordering) {
        loom::sync::atomic::AtomicU64::store(self, value, order)
    }
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::fetch_or(self, bits, order)
    }
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64> {
        loom::sync::atomic::AtomicU64::compare_exchange(self, current, new, success, failure)
    }
    fn fence(order: Ordering) {
        loom::sync::atomic::fence(order)
    }
}

/// Writer side on words: `words[0]` is the sequence, `words[1..]` the payload.
/// The caller must be the only writer of this record.
pub fn write_words<W: Word>(words: &[W], payload: &[u64]) {
    debug_assert_eq!(words.len(), payload.len() + 1);
    let sequence = words[0].load(Ordering::Relaxed);
    debug_assert!(sequence.is_multiple_of(2), "concurrent writers on one seqlock record");
    words[0].store(sequence.wrapping_add(1), Ordering::Relaxed);
    W::fence(Ordering::Release);
    for (word, value) in words[1..].iter().zip(payload) {
        word.store(*value, Ordering::Relaxed);
    }
    words[0].store(sequence.wrapping_add(2), Ordering::Release);
}

/// Reader side on words: one attempt. Returns the sequence if `out` holds an
/// untorn payload, `None` if the attempt overlapped a write.
pub fn read_words<W: Word>(words: &[W], out: &mut [u64]) -> Option<u64> {
    let before = words[0].load(Ordering::Acquire);
    for (slot, word) in out.iter_mut().zip(&words[1..]) {
        *slot = word.load(Ordering::Relaxed);
    }
    W::fence(Ordering::Acquire);
    let after = words[0].load(Ordering::Relaxed);
    (before == after && before.is_multiple_of(2)).then_some(before)
}

/// A seqlock-protected record at a fixed place in a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqRecord {
    offset: u64,
    payload_bytes: u32,
}

impl SeqRecord {
    /// A record at the 8-aligned `offset` with `payload_bytes` of payload.
    pub fn new(offset: u64, payload_bytes: u32) -> Result<Self> {
        if !offset.is_multiple_of(8) {
            return Err(FabricError::Misaligned { offset });
        }
        Ok(Self { offset, payload_bytes })
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn payload_bytes(&self) -> u32 {
        self.payload_bytes
    }

    fn payload_words(&self) -> usize {
        (self.payload_bytes as usize).div_ceil(8)
    }

    /// Bytes the record occupies in its region (sequence word + padded payload).
    pub fn footprint_bytes(&self) -> u64 {
        8 + self.payload_words() as u64 * 8
    }

    /// Owner-side write through the region's own memory. The caller must be
    /// the record's only writer. Returns the record's new version.
    pub fn write_local(&self, memory: &RegionMemory, payload: &[u8]) -> Result<u64> {
        let words = memory.words(self.offset, 1 + self.payload_words())?;
        let padded = self.pad(payload)?;
        write_words(words, &padded);
        Ok(words[0].load(Ordering::Acquire) / 2)
    }

    /// One-sided write from any node: one batch of fetch_add, write,
    /// fetch_add. Writers must be serialized by the caller (a lock).
    pub fn write_remote(&self, region: &dyn RemoteRegion, payload: &[u8]) -> Result<u64> {
        let padded = self.pad(payload)?;
        let bytes: Vec<u8> = padded.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let results = region
            .post(vec![
                Op::FetchAdd { offset: self.offset, delta: 1 },
                Op::Write { offset: self.offset + 8, data: bytes },
                Op::FetchAdd { offset: self.offset, delta: 1 },
            ])
            .wait()?;
        let last = results.into_iter().nth(2).ok_or(FabricError::Closed)?.into_u64()?;
        Ok(last.wrapping_add(1) / 2)
    }

    fn pad(&self, payload: &[u8]) -> Result<Vec<u64>> {
        if payload.len() > self.payload_bytes as usize {
            return Err(FabricError::OutOfBounds {
                region: "seqlock record".into(),
                offset: self.offset + 8,
                len: payload.len() as u64,
                region_len: u64::from(self.payload_bytes),
            });
        }
        let mut words = vec![0u64; self.payload_words()];
        for (i, chunk) in payload.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            words[i] = u64::from_ne_bytes(word);
        }
        Ok(words)
    }

    fn ops(&self) -> [Op; 3] {
        [
            Op::Read { offset: self.offset, len: 8 },
            Op::Read { offset: self.offset + 8, len: self.payload_bytes },
            Op::Read { offset: self.offset, len: 8 },
        ]
    }

    /// Reads the record consistently with one round trip per attempt.
    /// Returns (version, payload), where version counts completed writes.
    pub fn read(&self, region: &dyn RemoteRegion) -> Result<(u64, Vec<u8>)> {
        read_many(region, std::slice::from_ref(self)).map(|mut v| v.remove(0))
    }

    /// As [`SeqRecord::read`], without blocking an async runtime thread.
    pub async fn read_async(&self, region: &dyn RemoteRegion) -> Result<(u64, Vec<u8>)> {
        read_many_async(region, std::slice::from_ref(self)).await.map(|mut v| v.remove(0))
    }
}

/// Accepts the three results of one record's read, if untorn.
fn accept(results: &mut impl Iterator<Item = crate::OpResult>) -> Result<Option<(u64, Vec<u8>)>> {
    let mut next = || results.next().ok_or(FabricError::Closed);
    let before = next()?.into_u64()?;
    let payload = next()?.into_bytes()?;
    let after = next()?.into_u64()?;
    Ok((before == after && before.is_multiple_of(2)).then_some((before / 2, payload)))
}

/// Reads several records of one region consistently: all in one batch, then
/// only the torn ones again. Results are in the order of `records`.
pub fn read_many(region: &dyn RemoteRegion, records: &[SeqRecord]) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut done: Vec<Option<(u64, Vec<u8>)>> = vec![None; records.len()];
    for attempt in 0..READ_ATTEMPTS_MAX {
        let pending: Vec<usize> = (0..records.len()).filter(|i| done[*i].is_none()).collect();
        if pending.is_empty() {
            break;
        }
        let ops = pending.iter().flat_map(|i| records[*i].ops()).collect();
        let mut results = region.post(ops).wait()?.into_iter();
        for i in pending {
            done[i] = accept(&mut results)?;
        }
        backoff(attempt);
    }
    finish(records, done)
}

/// As [`read_many`], without blocking an async runtime thread.
pub async fn read_many_async(region: &dyn RemoteRegion, records: &[SeqRecord]) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut done: Vec<Option<(u64, Vec<u8>)>> = vec![None; records.len()];
    for _ in 0..READ_ATTEMPTS_MAX {
        let pending: Vec<usize> = (0..records.len()).filter(|i| done[*i].is_none()).collect();
        if pending.is_empty() {
            break;
        }
        let ops = pending.iter().flat_map(|i| records[*i].ops()).collect();
        let mut results = region.post(ops).wait_async().await?.into_iter();
        for i in pending {
            done[i] = accept(&mut results)?;
        }
    }
    finish(records, done)
}

fn backoff(attempt: u32) {
    if attempt > 16 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

fn finish(records: &[SeqRecord], done: Vec<Option<(u64, Vec<u8>)>>) -> Result<Vec<(u64, Vec<u8>)>> {
    records
        .iter()
        .zip(done)
        .map(|(record, value)| value.ok_or(FabricError::TornRead { offset: record.offset, retries: READ_ATTEMPTS_MAX }))
        .collect()
}
