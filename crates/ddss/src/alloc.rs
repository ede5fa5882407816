//! The slot allocator: one bitmap per size class, plus a claim in each
//! slot's control word.
//!
//! Choice: **size classes with a bitmap each; a slot is claimed by
//! compare_swap on its own control word**. A region is carved once, at
//! start-up, into slots of 18 power-of-two classes (8 B .. 1 MiB; see
//! [`crate::layout`]). Bit `i` of a class's bitmap is set while slot `i` is
//! allocated (or being allocated or freed). Any node allocates in any
//! member's region without the owner's CPU: it reads the bitmap (one read),
//! picks a clear bit ([`pick_free`], pure), and asks the caller's `own`
//! callback to claim that slot; the substrate swaps the slot's control word
//! from "free" to "claimed by (node, incarnation)" (see
//! `layout::SlotWord`). Only the claim's owner then changes the
//! slot's bit ([`set_bit`], [`clear_bit`]: a read and, if needed, one exact
//! `fetch_add`, since nobody else touches that bit meanwhile).
//!
//! Why the claim lives in the control word and not in the bit: a bit cannot
//! say who set it, so a process that died between setting it and publishing
//! the slot leaked the slot for good. A claim names its owner's
//! incarnation; a claim whose owner is gone is taken over by the next
//! allocator that picks the slot (bit still clear) or by the substrate's
//! sweep of a full class (bit already set).
//!
//! Why not a free list: a one-sided free-list pop needs a pointer plus an
//! ABA tag in one CAS word and a second read of the next link; a bitmap word
//! indexes 64 slots with one read and no links, and its state is trivially
//! auditable. Fragmentation is bounded by the power-of-two classes (at most
//! half of a slot is unused).
//!
//! The algorithm is generic over [`BitmapWords`] so that the model-based
//! test runs it on plain words and the substrate runs it on fabric regions.

use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use tierstack_fabric::RemoteRegion;

/// Storage of one class's bitmap.
pub trait BitmapWords {
    /// Reads every word (not atomically across words).
    fn load_all(&self) -> Result<Vec<u64>>;
    /// Reads word `word`.
    fn load(&self, word: usize) -> Result<u64>;
    /// Adds `delta` (wrapping) to word `word`; returns the previous value.
    fn fetch_add(&self, word: usize, delta: u64) -> Result<u64>;
}

/// The outcome of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Slot index now owned by the caller.
    Claimed(u32),
    /// Every slot was allocated in the caller's view.
    Full,
    /// Every attempt lost a race; try again later.
    Contended,
}

/// Lowest clear bit at or after `start` (wrapping) among the first `slots`
/// bits of `snapshot`; bits at or beyond `slots` count as allocated. Pure.
pub fn pick_free(snapshot: &[u64], slots: u32, start: u32) -> Option<u32> {
    let words = slots.div_ceil(64) as usize;
    if words == 0 || snapshot.len() < words {
        return None;
    }
    let start = if start < slots { start } else { 0 };
    let first_word = (start / 64) as usize;
    for step in 0..=words {
        let w = (first_word + step) % words;
        let mut used = snapshot[w] | beyond_mask(w, slots);
        if step == 0 {
            // On the first visit, only bits at or after `start`.
            used |= (1u64 << (start % 64)).wrapping_sub(1);
        }
        if used != u64::MAX {
            return Some(w as u32 * 64 + (!used).trailing_zeros());
        }
    }
    None
}

/// Bits of word `w` that name no slot (beyond `slots`).
fn beyond_mask(w: usize, slots: u32) -> u64 {
    let valid = u64::from(slots).saturating_sub(w as u64 * 64).min(64);
    if valid == 64 {
        0
    } else {
        !((1u64 << valid) - 1)
    }
}

/// Claims a slot whose bit is clear, starting the search at `start`, with
/// at most `attempts_max` calls of `own`. `own(slot)` tries to take the
/// slot's claim (true: the caller now owns it alone); a slot it refuses is
/// skipped for the rest of this call. The owned slot's bit is then set.
pub fn claim<W, F>(words: &W, slots: u32, start: u32, attempts_max: u32, mut own: F) -> Result<Claim>
where
    W: BitmapWords + ?Sized,
    F: FnMut(u32) -> Result<bool>,
{
    let mut snapshot = words.load_all()?;
    for _ in 0..attempts_max {
        let Some(slot) = pick_free(&snapshot, slots, start) else { return Ok(Claim::Full) };
        if own(slot)? {
            set_bit(words, slot)?;
            return Ok(Claim::Claimed(slot));
        }
        snapshot[(slot / 64) as usize] |= 1 << (slot % 64);
    }
    Ok(Claim::Contended)
}

/// Sets the bit of `slot`; returns whether it was set already. Exact only
/// for the owner of the slot's claim (nobody else changes the bit
/// meanwhile, so the read stays true and the `fetch_add` cannot carry).
pub fn set_bit<W: BitmapWords + ?Sized>(words: &W, slot: u32) -> Result<bool> {
    let (w, bit) = ((slot / 64) as usize, 1u64 << (slot % 64));
    if words.load(w)? & bit != 0 {
        return Ok(true);
    }
    words.fetch_add(w, bit)?;
    Ok(false)
}

/// Clears the bit of `slot`; returns whether it was set. Exact only for the
/// owner of the slot's claim, as [`set_bit`].
pub fn clear_bit<W: BitmapWords + ?Sized>(words: &W, slot: u32) -> Result<bool> {
    let (w, bit) = ((slot / 64) as usize, 1u64 << (slot % 64));
    if words.load(w)? & bit == 0 {
        return Ok(false);
    }
    words.fetch_add(w, bit.wrapping_neg())?;
    Ok(true)
}

/// A bitmap in plain memory: for tests and for reasoning about the algorithm.
#[derive(Debug)]
pub struct VecBitmap(Vec<AtomicU64>);

impl VecBitmap {
    pub fn new(slots: u32) -> Self {
        Self((0..slots.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
}

impl BitmapWords for VecBitmap {
    fn load_all(&self) -> Result<Vec<u64>> {
        Ok(self.0.iter().map(|w| w.load(Ordering::Acquire)).collect())
    }

    fn load(&self, word: usize) -> Result<u64> {
        Ok(self.0[word].load(Ordering::Acquire))
    }

    fn fetch_add(&self, word: usize, delta: u64) -> Result<u64> {
        Ok(self.0[word].fetch_add(delta, Ordering::SeqCst))
    }
}

/// A class's bitmap in a (possibly remote) region.
pub(crate) struct RegionBitmap<'a> {
    pub region: &'a dyn RemoteRegion,
    pub offset: u64,
    pub words: usize,
}

impl BitmapWords for RegionBitmap<'_> {
    fn load_all(&self) -> Result<Vec<u64>> {
        let mut bytes = vec![0u8; self.words * 8];
        self.region.read(self.offset, &mut bytes)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                u64::from_ne_bytes(w)
            })
            .collect())
    }

    fn load(&self, word: usize) -> Result<u64> {
        Ok(self.region.read_u64(self.offset + word as u64 * 8)?)
    }

    fn fetch_add(&self, word: usize, delta: u64) -> Result<u64> {
        Ok(self.region.fetch_add(self.offset + word as u64 * 8, delta)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn pick_free_respects_start_wrap_and_the_slot_count() {
        assert_eq!(pick_free(&[0], 10, 0), Some(0));
        assert_eq!(pick_free(&[0], 10, 7), Some(7));
        assert_eq!(pick_free(&[0b1000_0000], 10, 7), Some(8));
        assert_eq!(pick_free(&[0b11_1000_0000], 10, 7), Some(0), "wraps around");
        assert_eq!(pick_free(&[0b11_1111_1111], 10, 3), None, "bits beyond 10 slots are not slots");
        assert_eq!(pick_free(&[u64::MAX, 0], 70, 0), Some(64));
        assert_eq!(pick_free(&[0, 0], 70, 69), Some(69));
        assert_eq!(pick_free(&[0, 0b11_1111], 70, 69), Some(0));
        assert_eq!(pick_free(&[1, u64::MAX], 128, 64), Some(1));
        assert_eq!(pick_free(&[0], 10, 99), Some(0), "a start past the end begins at 0");
        assert_eq!(pick_free(&[], 0, 0), None);
    }

    /// Per-slot claims for the tests: what the control words are to the substrate.
    fn claims(slots: u32) -> Vec<std::sync::atomic::AtomicBool> {
        (0..slots).map(|_| std::sync::atomic::AtomicBool::new(false)).collect()
    }

    fn own(claims: &[std::sync::atomic::AtomicBool], slot: u32) -> Result<bool> {
        Ok(claims[slot as usize].compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok())
    }

    #[test]
    fn bits_are_set_and_cleared_exactly_once() {
        let bitmap = VecBitmap::new(64);
        let taken = claims(64);
        assert_eq!(claim(&bitmap, 64, 0, 4, |s| own(&taken, s)).unwrap(), Claim::Claimed(0));
        assert!(!clear_bit(&bitmap, 5).unwrap(), "a clear bit stays clear");
        assert!(set_bit(&bitmap, 0).unwrap(), "a set bit stays set (no carry)");
        assert_eq!(bitmap.load_all().unwrap(), vec![1]);
        assert!(clear_bit(&bitmap, 0).unwrap());
        assert_eq!(bitmap.load_all().unwrap(), vec![0]);
    }

    #[test]
    fn a_refused_claim_is_skipped_and_its_bit_left_alone() {
        let bitmap = VecBitmap::new(10);
        // Slot 0's claim is held by someone else (say, a dead allocator's
        // claim not yet taken over): the next clear bit is claimed instead.
        let got = claim(&bitmap, 10, 0, 4, |s| Ok(s != 0)).unwrap();
        assert_eq!(got, Claim::Claimed(1));
        assert_eq!(bitmap.load_all().unwrap(), vec![0b10]);
        assert_eq!(claim(&bitmap, 10, 0, 3, |_| Ok(false)).unwrap(), Claim::Contended);
        assert_eq!(claim(&bitmap, 2, 0, 9, |s| Ok(s != 0)).unwrap(), Claim::Full);
    }

    #[test]
    fn concurrent_claims_never_hand_out_a_slot_twice() {
        let bitmap = std::sync::Arc::new(VecBitmap::new(200));
        let taken = std::sync::Arc::new(claims(200));
        let claimed: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let (bitmap, taken) = (bitmap.clone(), taken.clone());
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        loop {
                            match claim(&*bitmap, 200, t * 50, 1000, |s| own(&taken, s)).unwrap() {
                                Claim::Claimed(slot) => mine.push(slot),
                                Claim::Full => break mine,
                                Claim::Contended => {}
                            }
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: Vec<u32> = claimed.concat();
        let unique: BTreeSet<u32> = all.iter().copied().collect();
        assert_eq!(all.len(), 200, "every slot claimed exactly once");
        assert_eq!(unique, (0..200).collect());
        assert_eq!(bitmap.load_all().unwrap(), vec![u64::MAX, u64::MAX, u64::MAX, (1 << 8) - 1]);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Alloc { start: u32 },
        Free { pick: usize },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => any::<u32>().prop_map(|start| Step::Alloc { start }),
            2 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        ]
    }

    proptest! {
        /// The allocator against a trivially correct model (the set of
        /// allocated slots), checked after every step: a claim succeeds iff
        /// the model has room, returns a slot the model has free (the lowest
        /// one at or after `start`, wrapping), and the bitmap always equals
        /// the model.
        #[test]
        fn allocator_matches_a_set_model(slots in 1u32..200, steps in proptest::collection::vec(step(), 1..300)) {
            let bitmap = VecBitmap::new(slots);
            let mut model: BTreeSet<u32> = BTreeSet::new();
            for step in steps {
                match step {
                    Step::Alloc { start } => {
                        let start = start % (slots + 8);
                        let got = claim(&bitmap, slots, start, 1, |_| Ok(true)).unwrap();
                        let from = if start < slots { start } else { 0 };
                        let want = (from..slots).chain(0..from).find(|s| !model.contains(s));
                        match want {
                            Some(slot) => {
                                prop_assert_eq!(got, Claim::Claimed(slot));
                                model.insert(slot);
                            }
                            None => prop_assert_eq!(got, Claim::Full),
                        }
                    }
                    Step::Free { pick } => {
                        if model.is_empty() {
                            continue;
                        }
                        let slot = *model.iter().nth(pick % model.len()).unwrap();
                        prop_assert!(clear_bit(&bitmap, slot).unwrap());
                        model.remove(&slot);
                    }
                }
                let words = bitmap.load_all().unwrap();
                for s in 0..slots {
                    prop_assert_eq!(words[(s / 64) as usize] >> (s % 64) & 1 == 1, model.contains(&s));
                }
            }
        }
    }
}
