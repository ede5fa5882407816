//! A handle's configuration ([`DdssConfig`]) and its counters
//! ([`DdssStats`], kept as atomics in `Stats`).

use super::{ALLOC_ATTEMPTS_MAX, LOCK_ATTEMPTS_MAX, REGION_NAME};
use crate::layout::{class_for, SIZE_CLASSES};
use std::sync::atomic::{AtomicU64, Ordering};
use tierstack_base::NodeId;

/// How a node takes part in the substrate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DdssConfig {
    /// Name of the registered region (the same on every node).
    pub region_name: String,
    /// Slots of each size class in this node's region (class `c` holds up to `8 << c` bytes).
    pub slots_per_class: [u32; SIZE_CLASSES],
    /// Nodes that run the substrate: targets of `Placement::Node` and `Placement::Auto`.
    /// Empty means only this node.
    pub members: Vec<NodeId>,
    pub lock_attempts_max: u32,
    pub alloc_attempts_max: u32,
    /// Seed of the RNG that spreads allocations over nodes and bitmap words.
    pub seed: u64,
}

impl Default for DdssConfig {
    /// About 7 MiB per node: 256 slots of each class up to 1 KiB, 64 up to
    /// 8 KiB, 16 up to 64 KiB, 2 up to 1 MiB.
    fn default() -> Self {
        let mut slots = [0u32; SIZE_CLASSES];
        for (c, s) in slots.iter_mut().enumerate() {
            *s = match c {
                0..=7 => 256,
                8..=10 => 64,
                11..=13 => 16,
                _ => 2,
            };
        }
        Self {
            region_name: REGION_NAME.to_string(),
            slots_per_class: slots,
            members: Vec::new(),
            lock_attempts_max: LOCK_ATTEMPTS_MAX,
            alloc_attempts_max: ALLOC_ATTEMPTS_MAX,
            seed: 0x0dd5_5eed,
        }
    }
}

impl DdssConfig {
    /// A config with no slots at all; add classes with [`DdssConfig::with_slots`].
    pub fn empty() -> Self {
        Self { slots_per_class: [0; SIZE_CLASSES], ..Self::default() }
    }

    /// Sets the slot count of the class that holds `capacity_bytes`.
    pub fn with_slots(mut self, capacity_bytes: u32, slots: u32) -> Self {
        let class = class_for(u64::from(capacity_bytes)).unwrap_or(SIZE_CLASSES as u8 - 1);
        self.slots_per_class[class as usize] = slots;
        self
    }

    pub fn with_members(mut self, members: Vec<NodeId>) -> Self {
        self.members = members;
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn with_region_name(mut self, name: impl Into<String>) -> Self {
        self.region_name = name.into();
        self
    }
}

/// Counters of what a handle's operations did (for tests and reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DdssStats {
    /// Gets answered from the local copy with no remote operation.
    pub gets_from_copy: u64,
    /// Gets answered from the local copy after a one-sided version read.
    pub gets_validated: u64,
    /// Gets that read the value from its home (seqlock read).
    pub gets_fetched: u64,
    /// Gets under the key's lock (strict).
    pub gets_locked: u64,
    pub puts: u64,
    /// Failed lock attempts (contention).
    pub lock_retries: u64,
    /// Locks taken over from a holder whose process is gone.
    pub lock_takeovers: u64,
    /// Of those, takeovers that found the value half-written and marked it lost.
    pub values_lost: u64,
    /// Slot claims (an allocation or free in progress) taken over from a
    /// handle whose process is gone, by an allocation or a sweep.
    pub claims_taken_over: u64,
    pub allocations: u64,
    pub frees: u64,
}

#[derive(Default)]
pub(super) struct Stats {
    pub(super) gets_from_copy: AtomicU64,
    pub(super) gets_validated: AtomicU64,
    pub(super) gets_fetched: AtomicU64,
    pub(super) gets_locked: AtomicU64,
    pub(super) puts: AtomicU64,
    pub(super) lock_retries: AtomicU64,
    pub(super) lock_takeovers: AtomicU64,
    pub(super) values_lost: AtomicU64,
    pub(super) claims_taken_over: AtomicU64,
    pub(super) allocations: AtomicU64,
    pub(super) frees: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
