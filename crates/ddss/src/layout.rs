//! Where everything lives in a node's DDSS region: the header, the per-class
//! allocation bitmaps, and the slots; and the two packed words of a slot.
//!
//! ```text
//! region offset
//! 0                      MAGIC
//! 8                      FORMAT << 32 | SIZE_CLASSES
//! 16 + 8*c               slots of class c (c < SIZE_CLASSES)
//! 16 + 8*(C + c)         used-slot counter of class c (a placement hint)
//! HEADER_BYTES           bitmap of class 0, then class 1, ... (ceil(slots/64) words each;
//!                        bit i of word w set = slot 64*w + i is allocated)
//! ...                    slots of class 0, then class 1, ...
//! ```
//!
//! A slot of class `c` holds values of up to `capacity(c) = 8 << c` bytes:
//!
//! ```text
//! slot + 0    control word (lock and liveness; see `SlotWord`)
//! slot + 8    seqlock sequence  ─┐ a `SeqRecord` (tierstack_fabric::seqlock)
//! slot + 16   value header       │ with payload = header, base, data:
//! slot + 24   base version       │ read untorn in one batch
//! slot + 32   data (capacity)   ─┘
//! ```
//!
//! The layout is a pure function of the slot counts, which the header
//! records, so a remote node learns a region's whole layout from one read.

use crate::error::{DdssError, Result};
use tierstack_base::limits::REGION_BYTES_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::seqlock::SeqRecord;

/// Number of size classes: capacities 8 B, 16 B, ... 1 MiB.
pub const SIZE_CLASSES: usize = 18;
/// Smallest slot capacity in bytes (class 0).
pub const CLASS_BYTES_MIN: u32 = 8;
/// Largest value one key can hold (the capacity of the largest class).
pub const VALUE_BYTES_MAX: u32 = CLASS_BYTES_MIN << (SIZE_CLASSES - 1);
/// Most slots one class may have on one node.
pub const SLOTS_PER_CLASS_MAX: u32 = 1 << 20;
/// "DDSS" + format tag; written last at start-up, so a reader that sees it
/// sees a complete header.
pub const MAGIC: u64 = u64::from_be_bytes(*b"DDSSv1\0\0");
/// Version of this layout.
pub const FORMAT: u64 = 1;
/// Bytes of the region header.
pub const HEADER_BYTES: u64 = 16 + 16 * SIZE_CLASSES as u64;

/// Offsets inside a slot.
pub(crate) const SLOT_CONTROL: u64 = 0;
pub(crate) const SLOT_SEQUENCE: u64 = 8;
pub(crate) const SLOT_HEADER: u64 = 16;
pub(crate) const SLOT_BASE: u64 = 24;
pub(crate) const SLOT_DATA: u64 = 32;

/// Capacity in bytes of a class.
pub fn class_capacity(class: u8) -> u32 {
    CLASS_BYTES_MIN << class
}

/// The smallest class that holds `bytes` (0 bytes fit class 0).
pub fn class_for(bytes: u64) -> Option<u8> {
    (0..SIZE_CLASSES as u8).find(|c| u64::from(class_capacity(*c)) >= bytes)
}

/// A packed slot word. The same shape serves two words of a slot:
///
/// ```text
/// bits 63..32  generation (0 = never allocated; 1, 2, ... per allocation)
/// bit  31      live (allocated and not freed)
/// bits 30..0   control word: holder token (see `holder_token`), 0 = none:
///                live: the lock holder (0 = unlocked);
///                not live: the handle allocating or freeing the slot
///                (0 = free for anyone to claim)
///              value header: value length in bytes
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotWord {
    pub generation: u32,
    pub live: bool,
    pub low: u32,
}

const LIVE_BIT: u64 = 1 << 31;
const LOW_MASK: u64 = LIVE_BIT - 1;
/// The value length a header carries when the value was lost (its writer
/// died mid-put): larger than any slot, so no real value has it.
pub(crate) const LOST_VALUE_LEN: u32 = LOW_MASK as u32;

impl SlotWord {
    pub(crate) fn pack(self) -> u64 {
        debug_assert!(u64::from(self.low) <= LOW_MASK);
        (u64::from(self.generation) << 32) | if self.live { LIVE_BIT } else { 0 } | (u64::from(self.low) & LOW_MASK)
    }

    pub(crate) fn unpack(word: u64) -> Self {
        Self { generation: (word >> 32) as u32, live: word & LIVE_BIT != 0, low: (word & LOW_MASK) as u32 }
    }

    /// The control word of a live, unlocked slot of `generation`.
    pub(crate) fn unlocked(generation: u32) -> u64 {
        Self { generation, live: true, low: 0 }.pack()
    }

    /// The control word of a live slot of `generation` locked by `token`.
    pub(crate) fn locked(generation: u32, token: u32) -> u64 {
        Self { generation, live: true, low: token }.pack()
    }
}

/// Bits of a [`holder_token`] that carry the holder's incarnation.
const INCARNATION_BITS: u32 = 15;
/// Largest incarnation number (incarnations are 1 ..= this; 0 is no holder).
pub(crate) const INCARNATION_MAX: u32 = (1 << INCARNATION_BITS) - 1;
/// Largest node id a lock or claim word can name (`node + 1` fills 16 bits).
pub const HOLDER_NODE_MAX: u32 = 0xFFFE;

/// The 31-bit token a handle writes into a control word it locks or claims:
/// `(node + 1) << 15 | incarnation`. The incarnation tells a handle of a
/// reopened node id (a new process) from the one that wrote the word, so a
/// dead incarnation's lock or claim can be taken over although its node id
/// runs again. Callers check `node <= HOLDER_NODE_MAX` and
/// `1 <= incarnation <= INCARNATION_MAX`.
pub(crate) fn holder_token(node: NodeId, incarnation: u32) -> u32 {
    ((node.0 + 1) << INCARNATION_BITS) | (incarnation & INCARNATION_MAX)
}

/// The (node, incarnation) a non-zero token names.
pub(crate) fn token_holder(token: u32) -> Option<(NodeId, u32)> {
    let node_plus_one = token >> INCARNATION_BITS;
    (node_plus_one != 0).then(|| (NodeId(node_plus_one - 1), token & INCARNATION_MAX))
}

/// The generation after `generation`: wraps from `u32::MAX` to 1, never to 0.
pub(crate) fn next_generation(generation: u32) -> u32 {
    generation.checked_add(1).unwrap_or(1)
}

/// The layout of one node's DDSS region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    slots: [u32; SIZE_CLASSES],
    bitmap_offsets: [u64; SIZE_CLASSES],
    slot_offsets: [u64; SIZE_CLASSES],
    region_bytes: u64,
}

impl Layout {
    /// Computes the layout for `slots[c]` slots of class `c`.
    pub fn new(slots: [u32; SIZE_CLASSES]) -> Result<Self> {
        let mut offset = HEADER_BYTES;
        let mut bitmap_offsets = [0u64; SIZE_CLASSES];
        for (c, count) in slots.iter().enumerate() {
            if *count > SLOTS_PER_CLASS_MAX {
                return Err(DdssError::Config(format!(
                    "class {c} asks for {count} slots; the limit is {SLOTS_PER_CLASS_MAX}"
                )));
            }
            bitmap_offsets[c] = offset;
            offset += u64::from(count.div_ceil(64)) * 8;
        }
        let mut slot_offsets = [0u64; SIZE_CLASSES];
        for (c, count) in slots.iter().enumerate() {
            slot_offsets[c] = offset;
            offset += u64::from(*count) * slot_bytes(c as u8);
        }
        if offset > REGION_BYTES_MAX {
            return Err(DdssError::Config(format!(
                "the slots need a region of {offset} bytes; the limit is {REGION_BYTES_MAX}"
            )));
        }
        if slots.iter().all(|s| *s == 0) {
            return Err(DdssError::Config("no class has any slot".into()));
        }
        Ok(Self { slots, bitmap_offsets, slot_offsets, region_bytes: offset })
    }

    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    pub fn slots(&self, class: u8) -> u32 {
        self.slots.get(class as usize).copied().unwrap_or(0)
    }

    /// The smallest class at least `class` that has slots here.
    pub fn class_with_slots(&self, class: u8) -> Option<u8> {
        (class..SIZE_CLASSES as u8).find(|c| self.slots(*c) > 0)
    }

    /// (offset, words) of the class's bitmap.
    pub(crate) fn bitmap(&self, class: u8) -> (u64, usize) {
        (self.bitmap_offsets[class as usize], self.slots(class).div_ceil(64) as usize)
    }

    pub(crate) fn used_counter_offset(class: u8) -> u64 {
        16 + 8 * (SIZE_CLASSES as u64 + u64::from(class))
    }

    pub(crate) fn slot_offset(&self, class: u8, index: u32) -> u64 {
        debug_assert!(index < self.slots(class));
        self.slot_offsets[class as usize] + u64::from(index) * slot_bytes(class)
    }

    /// The slot index of `offset` in `class`, if `offset` is the start of one.
    pub(crate) fn slot_index(&self, class: u8, offset: u64) -> Option<u32> {
        let c = class as usize;
        if c >= SIZE_CLASSES {
            return None;
        }
        let relative = offset.checked_sub(self.slot_offsets[c])?;
        let size = slot_bytes(class);
        let index = relative / size;
        (relative % size == 0 && index < u64::from(self.slots[c])).then_some(index as u32)
    }

    /// The header as written at region offset 0.
    pub(crate) fn header_words(&self) -> Vec<u64> {
        let mut words = vec![MAGIC, (FORMAT << 32) | SIZE_CLASSES as u64];
        words.extend(self.slots.iter().map(|s| u64::from(*s)));
        words.extend(std::iter::repeat_n(0, SIZE_CLASSES));
        words
    }

    /// Parses a header read from `node`'s region of `region_bytes` bytes.
    pub(crate) fn from_header(node: NodeId, header: &[u8], region_bytes: u64) -> Result<Self> {
        let word = |i: usize| -> u64 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&header[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        if header.len() < HEADER_BYTES as usize || word(0) != MAGIC {
            return Err(DdssError::NotStarted { node });
        }
        if word(1) != (FORMAT << 32) | SIZE_CLASSES as u64 {
            return Err(DdssError::Corrupt { node, reason: format!("unknown header format word {:#x}", word(1)) });
        }
        let mut slots = [0u32; SIZE_CLASSES];
        for (c, s) in slots.iter_mut().enumerate() {
            *s = u32::try_from(word(2 + c))
                .map_err(|_| DdssError::Corrupt { node, reason: format!("slot count of class {c} out of range") })?;
        }
        let layout =
            Layout::new(slots).map_err(|e| DdssError::Corrupt { node, reason: format!("header layout: {e}") })?;
        if layout.region_bytes > region_bytes {
            return Err(DdssError::Corrupt {
                node,
                reason: format!("layout needs {} bytes; the region has {region_bytes}", layout.region_bytes),
            });
        }
        Ok(layout)
    }
}

/// Bytes of one slot of `class`: control word, sequence, header, base, data.
pub(crate) fn slot_bytes(class: u8) -> u64 {
    SLOT_DATA + u64::from(class_capacity(class))
}

/// The seqlock record of the slot at `slot_offset`.
pub(crate) fn record(slot_offset: u64, class: u8) -> Result<SeqRecord> {
    Ok(SeqRecord::new(slot_offset + SLOT_SEQUENCE, (SLOT_DATA - SLOT_HEADER) as u32 + class_capacity(class))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_cover_every_size_up_to_the_maximum() {
        assert_eq!(class_for(0), Some(0));
        assert_eq!(class_for(1), Some(0));
        assert_eq!(class_for(8), Some(0));
        assert_eq!(class_for(9), Some(1));
        assert_eq!(class_for(64 * 1024), Some(13));
        assert_eq!(class_for(u64::from(VALUE_BYTES_MAX)), Some(SIZE_CLASSES as u8 - 1));
        assert_eq!(class_for(u64::from(VALUE_BYTES_MAX) + 1), None);
    }

    #[test]
    fn slot_word_round_trips_and_flags_are_independent() {
        let w = SlotWord { generation: 0xdead_beef, live: true, low: 0x7fff_fffe };
        assert_eq!(SlotWord::unpack(w.pack()), w);
        assert_eq!(SlotWord::unpack(SlotWord::unlocked(3)), SlotWord { generation: 3, live: true, low: 0 });
        assert_ne!(SlotWord::unlocked(3), SlotWord::locked(3, 1));
        assert_eq!(next_generation(u32::MAX), 1);
        assert_eq!(next_generation(0), 1);
    }

    #[test]
    fn layout_rejects_bad_configs() {
        assert!(matches!(Layout::new([0; SIZE_CLASSES]), Err(DdssError::Config(_))));
        let mut too_many = [0; SIZE_CLASSES];
        too_many[0] = SLOTS_PER_CLASS_MAX + 1;
        assert!(matches!(Layout::new(too_many), Err(DdssError::Config(_))));
        let mut too_big = [0; SIZE_CLASSES];
        too_big[SIZE_CLASSES - 1] = 2048; // 2 GiB of 1 MiB slots
        assert!(matches!(Layout::new(too_big), Err(DdssError::Config(_))));
    }

    #[test]
    fn header_round_trips_and_is_checked() {
        let mut slots = [0; SIZE_CLASSES];
        slots[0] = 100;
        slots[5] = 3;
        let layout = Layout::new(slots).unwrap();
        let bytes: Vec<u8> = layout.header_words().iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(bytes.len() as u64, HEADER_BYTES);
        assert_eq!(Layout::from_header(NodeId(1), &bytes, layout.region_bytes()).unwrap(), layout);
        assert!(matches!(
            Layout::from_header(NodeId(1), &bytes, layout.region_bytes() - 8),
            Err(DdssError::Corrupt { .. })
        ));
        let zero = vec![0u8; bytes.len()];
        assert!(matches!(Layout::from_header(NodeId(1), &zero, 1 << 20), Err(DdssError::NotStarted { .. })));
        let mut bad_format = bytes.clone();
        bad_format[8] ^= 1;
        assert!(matches!(Layout::from_header(NodeId(1), &bad_format, 1 << 20), Err(DdssError::Corrupt { .. })));
    }

    proptest! {
        /// Slots never overlap each other, the bitmaps or the header, and
        /// `slot_index` inverts `slot_offset` and rejects everything else.
        #[test]
        fn slots_are_disjoint_and_indexable(counts in proptest::collection::vec(0u32..70, SIZE_CLASSES)) {
            let mut slots = [0u32; SIZE_CLASSES];
            slots.copy_from_slice(&counts[..SIZE_CLASSES]);
            slots[SIZE_CLASSES - 1] = slots[SIZE_CLASSES - 1].min(3);
            slots[0] += 1;
            let layout = Layout::new(slots).unwrap();
            let mut spans = vec![(0, HEADER_BYTES)];
            for c in 0..SIZE_CLASSES as u8 {
                let (bitmap, words) = layout.bitmap(c);
                if words > 0 {
                    spans.push((bitmap, bitmap + words as u64 * 8));
                }
                for i in 0..layout.slots(c) {
                    let offset = layout.slot_offset(c, i);
                    prop_assert_eq!(offset % 8, 0);
                    prop_assert_eq!(layout.slot_index(c, offset), Some(i));
                    prop_assert_eq!(layout.slot_index(c, offset + 8), None);
                    spans.push((offset, offset + slot_bytes(c)));
                }
            }
            spans.sort();
            for pair in spans.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "overlap {:?}", pair);
            }
            prop_assert!(spans.last().unwrap().1 <= layout.region_bytes());
        }
    }
}
