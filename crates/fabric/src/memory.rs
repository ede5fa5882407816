//! Registered memory, accessed only through atomics.
//!
//! A region's bytes are shared with other threads and, in the `shm` backend,
//! other processes that read and write them at any time. Plain `memcpy` on
//! such memory is a data race, so every access here goes through atomic
//! loads and stores: 64-bit words where aligned, single bytes at unaligned
//! edges. Relaxed word copies compile to ordinary moves; the fences around a
//! copy give it the ordering the [`crate::seqlock`] protocol needs:
//! a read ends with an acquire fence, a write begins with a release fence.
//!
//! **The one exception** is [`RegionBytes`]: a plain `&[u8]` view of a slice
//! of a local region, for code that must hand registered bytes to a socket
//! write (a cached file served straight from its slot). Its constructor is
//! `unsafe`, and its safety contract is the ownership rule of the protocol
//! that owns the slot: no writer touches the slot's bytes between their
//! arrival and their release. This is the only place that reads registered
//! memory without atomics.

use crate::{FabricError, LocalRegion, LocalSlice, Result};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// A registered region's memory: a base pointer, 8-byte aligned, and a
/// length that is a multiple of 8. All accessors check bounds and alignment
/// and return typed errors.
pub struct RegionMemory {
    name: String,
    base: NonNull<u8>,
    len: u64,
    // Keeps the allocation or mapping behind `base` alive.
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: the memory is only accessed through atomics (see the module docs),
// and `_owner` keeps it alive for as long as this value exists.
unsafe impl Send for RegionMemory {}
// SAFETY: as above; shared references only perform atomic accesses.
unsafe impl Sync for RegionMemory {}

impl RegionMemory {
    /// Zero-filled memory on this process's heap (the `tcp` backend's regions).
    pub fn heap(name: &str, len: u64) -> Result<Self> {
        let len = crate::validate_region_bytes(len)?;
        let words = usize::try_from(len / 8).map_err(|_| FabricError::RegionSize { bytes: len, max: len })?;
        let mut storage: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let base = NonNull::new(storage.as_mut_ptr().cast::<u8>()).ok_or(FabricError::Closed)?;
        Ok(Self { name: name.to_string(), base, len, _owner: Box::new(storage) })
    }

    /// Wraps memory owned by `owner` (a mapping, for example).
    ///
    /// # Safety
    /// `base` must point to `len` bytes, 8-byte aligned, valid for reads for
    /// as long as `owner` lives, and accessed by others only through atomic
    /// operations. `len` must be a multiple of 8. The bytes must be valid for
    /// writes too, unless the caller guarantees no write reaches them: a
    /// peer's read-only view of a region (`fabric-shm` maps a region
    /// `PROT_READ` for a peer without write or atomic rights and refuses its
    /// writing operations before they reach the memory).
    pub unsafe fn from_raw(name: &str, base: NonNull<u8>, len: u64, owner: Box<dyn Send + Sync>) -> Result<Self> {
        if !(base.as_ptr() as usize).is_multiple_of(8) || !len.is_multiple_of(8) {
            return Err(FabricError::Misaligned { offset: base.as_ptr() as u64 });
        }
        Ok(Self { name: name.to_string(), base, len, _owner: owner })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(FabricError::OutOfBounds { region: self.name.clone(), offset, len, region_len: self.len }),
        }
    }

    fn check_word(&self, offset: u64) -> Result<()> {
        if !offset.is_multiple_of(8) {
            return Err(FabricError::Misaligned { offset });
        }
        self.check(offset, 8)
    }

    fn word(&self, offset: u64) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: the caller checked bounds and alignment; the memory is valid
        // and 8-aligned (constructor contract) and only accessed atomically.
        unsafe { &*self.base.as_ptr().add(offset as usize).cast::<AtomicU64>() }
    }

    fn byte(&self, offset: u64) -> &AtomicU8 {
        debug_assert!(offset < self.len);
        // SAFETY: the caller checked bounds; AtomicU8 has alignment 1.
        unsafe { &*self.base.as_ptr().add(offset as usize).cast::<AtomicU8>() }
    }

    /// `count` words starting at the 8-aligned `offset`, for protocols (such
    /// as the seqlock writer) that operate on words directly.
    pub fn words(&self, offset: u64, count: usize) -> Result<&[AtomicU64]> {
        if !offset.is_multiple_of(8) {
            return Err(FabricError::Misaligned { offset });
        }
        self.check(offset, count as u64 * 8)?;
        // SAFETY: bounds and alignment checked above; see `word`.
        Ok(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset as usize).cast::<AtomicU64>(), count) })
    }

    /// Copies bytes out; ends with an acquire fence.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let mut pos = offset;
        let mut done = 0;
        while done < buf.len() {
            if pos.is_multiple_of(8) && buf.len() - done >= 8 {
                let word = self.word(pos).load(Ordering::Relaxed);
                buf[done..done + 8].copy_from_slice(&word.to_ne_bytes());
                pos += 8;
                done += 8;
            } else {
                buf[done] = self.byte(pos).load(Ordering::Relaxed);
                pos += 1;
                done += 1;
            }
        }
        fence(Ordering::Acquire);
        Ok(())
    }

    /// Copies bytes in; begins with a release fence.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        fence(Ordering::Release);
        let mut pos = offset;
        let mut done = 0;
        while done < data.len() {
            if pos.is_multiple_of(8) && data.len() - done >= 8 {
                let mut word = [0u8; 8];
                word.copy_from_slice(&data[done..done + 8]);
                self.word(pos).store(u64::from_ne_bytes(word), Ordering::Relaxed);
                pos += 8;
                done += 8;
            } else {
                self.byte(pos).store(data[done], Ordering::Relaxed);
                pos += 1;
                done += 1;
            }
        }
        Ok(())
    }

    /// Copies `len` bytes at `source_offset` of `source` to `offset` of this
    /// memory: one pass, no intermediate buffer. `offset` and `source_offset`
    /// must be equal modulo 8 ([`FabricError::Misaligned`] otherwise), so that
    /// each aligned word is moved with one atomic load and one atomic store.
    /// Begins with a release fence (it writes) and ends with an acquire fence
    /// (it reads). If both ranges are the same memory and overlap, the
    /// result is unspecified (every word holds some word's value), as with
    /// RDMA.
    pub fn copy_from(&self, offset: u64, source: &RegionMemory, source_offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        source.check(source_offset, len)?;
        if offset % 8 != source_offset % 8 {
            return Err(FabricError::Misaligned { offset });
        }
        fence(Ordering::Release);
        let (mut to, mut from, end) = (offset, source_offset, offset + len);
        while to < end {
            if to.is_multiple_of(8) && end - to >= 8 {
                self.word(to).store(source.word(from).load(Ordering::Relaxed), Ordering::Relaxed);
                to += 8;
                from += 8;
            } else {
                self.byte(to).store(source.byte(from).load(Ordering::Relaxed), Ordering::Relaxed);
                to += 1;
                from += 1;
            }
        }
        fence(Ordering::Acquire);
        Ok(())
    }

    pub fn load_u64(&self, offset: u64) -> Result<u64> {
        self.check_word(offset)?;
        Ok(self.word(offset).load(Ordering::Acquire))
    }

    pub fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.check_word(offset)?;
        self.word(offset).store(value, Ordering::Release);
        Ok(())
    }

    /// Wrapping add; returns the previous value.
    pub fn fetch_add(&self, offset: u64, delta: u64) -> Result<u64> {
        self.check_word(offset)?;
        Ok(self.word(offset).fetch_add(delta, Ordering::SeqCst))
    }

    /// Returns the previous value; the swap happened iff it equals `expected`.
    pub fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.check_word(offset)?;
        Ok(match self.word(offset).compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(previous) | Err(previous) => previous,
        })
    }
}

impl std::fmt::Debug for RegionMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionMemory").field("name", &self.name).field("len", &self.len).finish()
    }
}

/// A read-only view of a slice of a local registered region as plain bytes:
/// what a socket write needs to send a cached file straight out of its slot
/// (for example as `bytes::Bytes::from_owner(view)`). It holds the region,
/// so the memory stays mapped for as long as the view or any owner of it
/// lives.
///
/// This is the single audited exception to "memory shared across processes
/// is touched only through atomics" (see the module docs and
/// ARCHITECTURE.md). It is sound only under the ownership rule stated on
/// [`RegionBytes::new`], which the protocol handing out slots (a receive
/// ring's head and tail words, a cache pool's free list) must guarantee.
pub struct RegionBytes {
    slice: LocalSlice,
}

impl RegionBytes {
    /// A view of `slice`'s bytes. Fails with
    /// [`FabricError::LocalOutOfBounds`] if the slice is outside its region.
    /// Ends with an acquire fence, so writes that the caller has observed to
    /// be complete (through an atomic or a waited completion) are visible.
    ///
    /// # Safety
    /// **The ownership rule: no writer touches the slot between its arrival
    /// and its release.**
    /// - *Arrival*: every write that filled `slice` (a local store, a peer's
    ///   one-sided `Write`/`WriteFrom`, a `ReadInto` targeting it) has
    ///   completed and happens-before this call: the caller waited on the
    ///   completion, or observed an arrival word written after the bytes
    ///   with an acquire load.
    /// - *Release*: the view and every owner it was moved into (a `Bytes`, a
    ///   buffer queued on a socket) are dropped.
    ///
    /// Between the two, nothing may write any byte of `slice`: not this
    /// process (stores, atomics, a `ReadInto` or `copy_from` into an
    /// overlapping range), and not any peer (on `shm` a peer's one-sided
    /// writes land in this memory directly, with no owner code to stop them).
    /// A write in that interval is a data race: undefined behaviour.
    pub unsafe fn new(slice: LocalSlice) -> Result<Self> {
        slice.check_bounds()?;
        fence(Ordering::Acquire);
        Ok(Self { slice })
    }

    /// The slice this view shows.
    pub fn slice(&self) -> &LocalSlice {
        &self.slice
    }

    /// The region holding the bytes.
    pub fn region(&self) -> &Arc<LocalRegion> {
        self.slice.region()
    }

    pub fn as_slice(&self) -> &[u8] {
        let memory = self.slice.region().memory();
        // SAFETY: the constructor checked that the slice lies inside the
        // region, whose memory stays valid while `self` holds the region's
        // Arc; the offset fits usize since it is below the region's length,
        // which was allocated or mapped in this address space. Nothing
        // writes these bytes while the view lives (the constructor's safety
        // contract), so a shared non-atomic read is race-free.
        unsafe { std::slice::from_raw_parts(memory.base.as_ptr().add(self.slice.offset() as usize), self.len()) }
    }

    pub fn len(&self) -> usize {
        self.slice.len() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }
}

impl AsRef<[u8]> for RegionBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::Deref for RegionBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for RegionBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionBytes").field("slice", &self.slice).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn atomics_and_errors() {
        let mem = RegionMemory::heap("t", 20).unwrap();
        assert_eq!(mem.len(), 24, "length rounds up to a multiple of 8");
        assert_eq!(mem.fetch_add(8, 5).unwrap(), 0);
        assert_eq!(mem.compare_swap(8, 4, 9).unwrap(), 5, "failed CAS returns the current value");
        assert_eq!(mem.compare_swap(8, 5, 9).unwrap(), 5);
        assert_eq!(mem.load_u64(8).unwrap(), 9);
        assert!(matches!(mem.fetch_add(4, 1), Err(FabricError::Misaligned { offset: 4 })));
        assert!(matches!(mem.load_u64(24), Err(FabricError::OutOfBounds { .. })));
        assert!(matches!(mem.read(20, &mut [0u8; 5]), Err(FabricError::OutOfBounds { .. })));
        assert!(matches!(mem.read(u64::MAX, &mut [0u8; 2]), Err(FabricError::OutOfBounds { .. })));
        assert!(RegionMemory::heap("t", 0).is_err());
    }

    proptest! {
        /// Writes at arbitrary offsets and lengths behave like a byte array.
        #[test]
        fn behaves_like_a_byte_array(writes in proptest::collection::vec((0u64..100, proptest::collection::vec(any::<u8>(), 0..40)), 1..20)) {
            let mem = RegionMemory::heap("model", 128).unwrap();
            let mut model = vec![0u8; 128];
            for (offset, data) in &writes {
                let result = mem.write(*offset, data);
                if *offset as usize + data.len() <= 128 {
                    prop_assert!(result.is_ok());
                    model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
                } else {
                    prop_assert!(result.is_err());
                }
                let mut all = vec![0u8; 128];
                mem.read(0, &mut all).unwrap();
                prop_assert_eq!(&all, &model);
            }
        }
    }
}
