//! The life of a slot: allocation (rank the members by free slots, claim a
//! bitmap bit and the slot's control word, publish the key), free, and the
//! sweep that finishes or undoes what a dead handle's claim left behind.

use super::*;
use crate::alloc::{claim, clear_bit, Claim, RegionBitmap};
use crate::error::{DdssError, Result};
use crate::key::{Coherence, Key, Placement};
use crate::layout::{
    class_capacity, class_for, next_generation, Layout, SlotWord, SIZE_CLASSES, SLOT_CONTROL, SLOT_HEADER,
    SLOT_SEQUENCE, VALUE_BYTES_MAX,
};
use rand::Rng;
use tierstack_base::sync::lock;
use tierstack_base::NodeId;
use tierstack_fabric::{Op, RemoteRegion};

impl Ddss {
    /// Allocates room for a value of up to `bytes` bytes with `coherence`,
    /// in the smallest size class that fits and that the home has slots of
    /// (a full class does not spill into larger ones: that is `RegionFull`).
    /// The new key's value is empty, at version 0.
    pub fn allocate(&self, bytes: u64, placement: Placement, coherence: Coherence) -> Result<Key> {
        let class = class_for(bytes).ok_or(DdssError::AllocationTooLarge { bytes, max: VALUE_BYTES_MAX })?;
        let candidates = match placement {
            Placement::Local => {
                if self.local.is_none() {
                    return Err(DdssError::NoLocalRegion);
                }
                vec![self.node]
            }
            Placement::Node(node) => {
                if !self.members().contains(&node) {
                    return Err(DdssError::NotMember { node });
                }
                vec![node]
            }
            Placement::Auto => self.rank_by_free_slots(class)?,
        };
        let mut last_error = DdssError::RegionFull { node: self.node, class_bytes: class_capacity(class) };
        for node in candidates {
            match self.allocate_on(node, class, coherence) {
                Ok(key) => {
                    bump(&self.stats.allocations);
                    return Ok(key);
                }
                // Auto placement routes around full and unreachable members.
                Err(e) if placement == Placement::Auto => last_error = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_error)
    }

    /// Members ordered by free slots of `class`, most first; ties in RNG order.
    fn rank_by_free_slots(&self, class: u8) -> Result<Vec<NodeId>> {
        let mut ranked = Vec::new();
        let mut last_error = None;
        for node in self.members() {
            let free = self.home(node).and_then(|home| {
                let Some(class) = home.layout.class_with_slots(class) else { return Ok(0) };
                let used = home.region.read_u64(Layout::used_counter_offset(class))?;
                Ok(u64::from(home.layout.slots(class)).saturating_sub(used))
            });
            match free {
                Ok(free) => {
                    let tie: u64 = lock(&self.rng).gen();
                    ranked.push((std::cmp::Reverse(free), tie, node));
                }
                Err(e) => {
                    tracing::debug!(%node, error = %e, "member skipped by automatic placement");
                    last_error = Some(e);
                }
            }
        }
        if ranked.is_empty() {
            return Err(last_error.unwrap_or(DdssError::NotStarted { node: self.node }));
        }
        ranked.sort();
        Ok(ranked.into_iter().map(|(_, _, node)| node).collect())
    }

    /// Claims a slot on `node` one-sidedly and initializes it: of the
    /// smallest class at least `min_class` that the node has slots of. A
    /// class that looks full is swept once for claims of dead handles.
    fn allocate_on(&self, node: NodeId, min_class: u8, coherence: Coherence) -> Result<Key> {
        let home = self.home(node)?;
        let class = home
            .layout
            .class_with_slots(min_class)
            .ok_or(DdssError::RegionFull { node, class_bytes: class_capacity(min_class) })?;
        let (slot, claimed) = self.claim_on(&home, node, class)?;
        self.publish(&home, node, class, slot, claimed, coherence)
    }

    /// Claims a free slot of `class` on `node`: returns its offset and its
    /// control word as claimed by this handle.
    pub(super) fn claim_on(&self, home: &Home, node: NodeId, class: u8) -> Result<(u64, u64)> {
        let slots = home.layout.slots(class);
        let (bitmap_offset, words) = home.layout.bitmap(class);
        let bitmap = RegionBitmap { region: &*home.region, offset: bitmap_offset, words };
        let start = lock(&self.rng).gen_range(0..slots);
        let mut swept = false;
        loop {
            let mut claimed = 0;
            let outcome = claim(&bitmap, slots, start, self.config.alloc_attempts_max, |index| {
                let slot = home.layout.slot_offset(class, index);
                Ok(match self.claim_slot(&*home.region, slot)? {
                    Some(word) => {
                        claimed = word;
                        true
                    }
                    None => false,
                })
            })?;
            match outcome {
                Claim::Claimed(index) => return Ok((home.layout.slot_offset(class, index), claimed)),
                Claim::Full if !swept && self.sweep_class(home, class)? > 0 => swept = true,
                Claim::Full => return Err(DdssError::RegionFull { node, class_bytes: class_capacity(class) }),
                Claim::Contended => {
                    return Err(DdssError::Contended { node, attempts: self.config.alloc_attempts_max });
                }
            }
        }
    }

    /// Takes the claim of the slot at `slot` if it is free, or claimed by a
    /// handle that is gone; returns the claimed control word.
    pub(super) fn claim_slot(&self, region: &dyn RemoteRegion, slot: u64) -> Result<Option<u64>> {
        let current = region.read_u64(slot + SLOT_CONTROL)?;
        let word = SlotWord::unpack(current);
        if word.live || (word.low != 0 && !self.holder_gone(word.low)) {
            return Ok(None);
        }
        let mine = SlotWord { generation: word.generation, live: false, low: self.token }.pack();
        if region.compare_swap(slot + SLOT_CONTROL, current, mine)? != current {
            return Ok(None);
        }
        if word.low != 0 {
            bump(&self.stats.claims_taken_over);
            tracing::warn!(slot, holder = word.low, "took over the slot claim of a handle that is gone");
        }
        Ok(Some(mine))
    }

    /// Initializes and publishes the slot this handle claimed (control word
    /// `claimed`): a new generation, an empty value at version 0.
    fn publish(
        &self,
        home: &Home,
        node: NodeId,
        class: u8,
        slot: u64,
        claimed: u64,
        coherence: Coherence,
    ) -> Result<Key> {
        let sequence = home.region.read_u64(slot + SLOT_SEQUENCE)?;
        // A claimer that died inside its own initialization left the
        // sequence odd; the write below then starts from there.
        let odd = sequence % 2;
        let generation = next_generation(SlotWord::unpack(claimed).generation);
        let base = (sequence + 2 - odd) / 2;
        let header = SlotWord { generation, live: true, low: 0 }.pack();
        let mut init = header.to_ne_bytes().to_vec();
        init.extend_from_slice(&base.to_ne_bytes());
        let results = home
            .region
            .post(vec![
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 - odd },
                Op::Write { offset: slot + SLOT_HEADER, data: init },
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
                Op::CompareSwap { offset: slot + SLOT_CONTROL, expected: claimed, new: SlotWord::unlocked(generation) },
                Op::FetchAdd { offset: Layout::used_counter_offset(class), delta: 1 },
            ])
            .wait()?;
        let swapped = nth_u64(results, 3)?;
        if swapped != claimed {
            return Err(DdssError::Corrupt { node, reason: format!("claim on slot {slot} changed under us") });
        }
        let offset = u32::try_from(slot).map_err(|_| DdssError::Corrupt { node, reason: "slot offset".into() })?;
        Ok(Key::new(node, offset, generation, class, coherence))
    }

    /// Releases every slot of `node` whose allocation or free was left
    /// unfinished by a handle that is gone (its claim still in the control
    /// word, the bitmap bit possibly set); returns how many. Allocation runs
    /// it by itself when a class looks full.
    pub fn sweep(&self, node: NodeId) -> Result<u32> {
        let home = self.home(node)?;
        let mut reclaimed = 0;
        for class in 0..SIZE_CLASSES as u8 {
            reclaimed += self.sweep_class(&home, class)?;
        }
        Ok(reclaimed)
    }

    fn sweep_class(&self, home: &Home, class: u8) -> Result<u32> {
        let (bitmap_offset, words) = home.layout.bitmap(class);
        let bitmap = RegionBitmap { region: &*home.region, offset: bitmap_offset, words };
        let mut reclaimed = 0;
        for index in 0..home.layout.slots(class) {
            let slot = home.layout.slot_offset(class, index);
            let word = SlotWord::unpack(home.region.read_u64(slot + SLOT_CONTROL)?);
            if word.live || word.low == 0 {
                continue; // allocated, or free: nothing unfinished
            }
            let Some(mine) = self.claim_slot(&*home.region, slot)? else { continue };
            clear_bit(&bitmap, index)?;
            let free = SlotWord { generation: word.generation, live: false, low: 0 }.pack();
            if home.region.compare_swap(slot + SLOT_CONTROL, mine, free)? != mine {
                return Err(DdssError::Corrupt {
                    node: home.region.node(),
                    reason: format!("claim on slot {slot} changed under us"),
                });
            }
            reclaimed += 1;
        }
        Ok(reclaimed)
    }

    /// Frees the key's slot. Later gets and puts of the key, from any node,
    /// fail with `KeyFreed` (a local copy under null or temporal coherence
    /// elsewhere may still answer until it is refreshed).
    pub fn free(&self, key: Key) -> Result<()> {
        let (home, slot) = self.slot(&key)?;
        let locked_word = self.lock(&*home.region, slot, key)?;
        let dead = SlotWord { generation: key.generation(), live: false, low: 0 }.pack();
        // Not live, and claimed by us until the bit is clear: a free that
        // dies midway leaves a claim that allocation or a sweep takes over.
        let claimed = SlotWord { generation: key.generation(), live: false, low: self.token }.pack();
        let results = home
            .region
            .post(vec![
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
                Op::Write { offset: slot + SLOT_HEADER, data: dead.to_ne_bytes().to_vec() },
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
                Op::CompareSwap { offset: slot + SLOT_CONTROL, expected: locked_word, new: claimed },
                Op::FetchAdd { offset: Layout::used_counter_offset(key.class()), delta: 1u64.wrapping_neg() },
            ])
            .wait()?;
        if nth_u64(results, 3)? != locked_word {
            return Err(DdssError::Corrupt { node: key.home(), reason: "lock word changed while held".into() });
        }
        lock(&self.copies).remove(&key);
        let index = home.layout.slot_index(key.class(), slot).ok_or_else(|| DdssError::UnknownKey {
            key: key.to_string(),
            reason: "slot vanished from the layout".into(),
        })?;
        let (bitmap_offset, words) = home.layout.bitmap(key.class());
        let was_set = clear_bit(&RegionBitmap { region: &*home.region, offset: bitmap_offset, words }, index)?;
        if home.region.compare_swap(slot + SLOT_CONTROL, claimed, dead)? != claimed {
            return Err(DdssError::Corrupt { node: key.home(), reason: "claim changed while held".into() });
        }
        if !was_set {
            // Freed all the same (the control word is the authority); reported.
            return Err(DdssError::Corrupt { node: key.home(), reason: format!("slot {index} was not allocated") });
        }
        bump(&self.stats.frees);
        Ok(())
    }
}
