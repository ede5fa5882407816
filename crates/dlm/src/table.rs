//! The lock table at each lock-serving node, and how a lock finds its slot.
//!
//! A lock's **home** is `lock_servers[h(id) >> 32 mod n]`; inside the home's
//! region [`table_region`] (a fixed number of [`SLOT_BYTES`]-byte slots,
//! registered once at start-up) it occupies the first slot, probing
//! linearly from `h(id) mod slots`, whose tag is free (0) or already its
//! own (`id + 1`). `h` is a fixed mixer, so every process computes the same
//! home and slot. Slots are claimed by compare-and-swap on the tag and never
//! freed, so a probe sequence never has holes: a lookup that meets a free
//! tag knows the lock does not exist. A table with no free slot on the
//! probe sequence is full ([`crate::LockError::TableFull`]). A claimer seeds
//! a fresh slot's fence word ([`crate::word::fence_seed`]) before it claims
//! the tag, so nobody fetches a token from an unseeded fence.

use crate::proto::{AtomicOp, WordKind};
use crate::word::{
    DrainWord, FenceWord, HomeWord, LockWord, DRAIN_OFFSET, FENCE_OFFSET, HOME_OFFSET, LOCK_OFFSET, SLOT_BYTES,
    TAG_OFFSET,
};
use crate::LockId;
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::{FabricError, LocalRegion, Op, RemoteRegion};

/// Name of the lock table region at each lock-serving node: a namespace
/// (`DlmConfig::region_prefix`, default `dlm`) and the scheme
/// (`dlm.ncoshed.locks`, ...), so one node can host managers of several
/// schemes, or several rounds of one, one after another.
pub fn table_region(prefix: &str, scheme: &str) -> String {
    format!("{prefix}.{scheme}.locks")
}

/// Name of the node region every lock manager registers: its incarnation,
/// heartbeat and per-lock states (see [`crate::status`]).
pub fn alive_region(prefix: &str, scheme: &str) -> String {
    format!("{prefix}.{scheme}.alive")
}

/// Slots per home table unless configured otherwise.
pub const TABLE_SLOTS_DEFAULT: u32 = 4096;
/// Largest configurable table (32 MiB of lock words).
pub const TABLE_SLOTS_MAX: u32 = 1 << 20;

/// The splitmix64 finalizer: a fixed, well-spread hash of a lock id.
pub fn mix(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The home of `id` among `servers` (which must not be empty).
pub fn home_of(id: LockId, servers: &[NodeId]) -> Option<NodeId> {
    let n = servers.len() as u64;
    (n > 0).then(|| servers[((mix(id.0) >> 32) % n) as usize])
}

/// The candidate homes of `id`, in order: the servers on a ring, starting
/// at `id`'s hash position ([`home_of`], the home of epoch 0) and going
/// round. A re-homing claims the home role for the next live candidate
/// after the current home (see `docs/internals/dlm-rehoming.md`).
pub fn candidates(id: LockId, servers: &[NodeId]) -> Vec<NodeId> {
    let n = servers.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let first = ((mix(id.0) >> 32) % n) as usize;
    servers[first..].iter().chain(&servers[..first]).copied().collect()
}

/// How many compare-and-swap attempts [`HomeMemory::fence_lock`] and
/// [`HomeMemory::raise_fence`] make against concurrent changes before
/// giving up (each failure means another atomic got in: bounded by the
/// nodes, so this is never reached in a sound cluster).
const CAS_ATTEMPTS_MAX: usize = 10_000;

/// Where `id`'s probe sequence starts in a table of `slots` slots.
pub fn first_slot(id: LockId, slots: u64) -> u64 {
    mix(id.0) % slots.max(1)
}

/// A lock's home memory: our own table (plain atomics) or a peer's (fabric ops).
pub(crate) enum HomeMemory {
    Local(Arc<LocalRegion>),
    Remote(Arc<dyn RemoteRegion>),
}

fn word_offset(base: u64, word: WordKind) -> u64 {
    base + match word {
        WordKind::Lock => LOCK_OFFSET,
        WordKind::Drain => DRAIN_OFFSET,
        WordKind::Fence => FENCE_OFFSET,
    }
}

impl HomeMemory {
    fn len(&self) -> u64 {
        match self {
            HomeMemory::Local(r) => r.len(),
            HomeMemory::Remote(r) => r.len(),
        }
    }

    pub(crate) fn slots(&self) -> u64 {
        self.len() / SLOT_BYTES
    }

    pub(crate) fn read_u64(&self, offset: u64) -> Result<u64, FabricError> {
        match self {
            HomeMemory::Local(r) => r.memory().load_u64(offset),
            HomeMemory::Remote(r) => r.read_u64(offset),
        }
    }

    pub(crate) fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64, FabricError> {
        match self {
            HomeMemory::Local(r) => r.memory().compare_swap(offset, expected, new),
            HomeMemory::Remote(r) => r.compare_swap(offset, expected, new),
        }
    }

    pub(crate) fn fetch_add(&self, offset: u64, delta: u64) -> Result<u64, FabricError> {
        match self {
            HomeMemory::Local(r) => r.memory().fetch_add(offset, delta),
            HomeMemory::Remote(r) => r.fetch_add(offset, delta),
        }
    }

    fn one(&self, base: u64, op: AtomicOp) -> Result<u64, FabricError> {
        match op {
            AtomicOp::CompareSwap { word, expected, new } => self.compare_swap(word_offset(base, word), expected, new),
            AtomicOp::FetchAdd { word, delta } => self.fetch_add(word_offset(base, word), delta),
        }
    }

    /// Executes a protocol batch (one or two atomics) on the slot at `base`;
    /// a remote pair is posted as one batch (one round trip).
    pub(crate) fn execute(&self, base: u64, ops: &[AtomicOp]) -> Result<[u64; 2], FabricError> {
        let mut results = [0u64; 2];
        match (self, ops) {
            (_, [op]) => results[0] = self.one(base, *op)?,
            (HomeMemory::Local(_), [a, b]) => {
                results[0] = self.one(base, *a)?;
                results[1] = self.one(base, *b)?;
            }
            (HomeMemory::Remote(r), [a, b]) => {
                let to_op = |op: &AtomicOp| match *op {
                    AtomicOp::CompareSwap { word, expected, new } => {
                        Op::CompareSwap { offset: word_offset(base, word), expected, new }
                    }
                    AtomicOp::FetchAdd { word, delta } => Op::FetchAdd { offset: word_offset(base, word), delta },
                };
                let done = r.post(vec![to_op(a), to_op(b)]).wait()?;
                for (slot, result) in done.into_iter().take(2).enumerate() {
                    results[slot] = result.into_u64()?;
                }
            }
            _ => return Err(FabricError::BatchSize { ops: ops.len(), max: 2 }),
        }
        Ok(results)
    }

    /// Fences the lock word of the slot at `base` ([`LockWord::fenced`]),
    /// whatever it holds; returns the fenced word.
    pub(crate) fn fence_lock(&self, node: NodeId, base: u64) -> Result<u64, FabricError> {
        let offset = base + LOCK_OFFSET;
        let mut seen = self.read_u64(offset)?;
        for _ in 0..CAS_ATTEMPTS_MAX {
            if LockWord::is_fenced(seen) {
                return Ok(seen);
            }
            let previous = self.compare_swap(offset, seen, LockWord::fenced(seen))?;
            if previous == seen {
                return Ok(LockWord::fenced(seen));
            }
            seen = previous;
        }
        Err(FabricError::Protocol { node, reason: "a lock word changed under every attempt to fence it".into() })
    }

    /// Raises the fence word's count at `base` to at least `count` (its
    /// generation kept); returns the word it leaves.
    pub(crate) fn raise_fence(&self, node: NodeId, base: u64, count: u64) -> Result<u64, FabricError> {
        let offset = base + FENCE_OFFSET;
        let mut seen = self.read_u64(offset)?;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let word = FenceWord::decode(seen);
            if word.count >= count {
                return Ok(seen);
            }
            let new = FenceWord { count, generation: word.generation }.encode();
            let previous = self.compare_swap(offset, seen, new)?;
            if previous == seen {
                return Ok(new);
            }
            seen = previous;
        }
        Err(FabricError::Protocol { node, reason: "a fence word changed under every attempt to raise it".into() })
    }

    /// The slot offset of `id`, if the lock exists.
    pub(crate) fn lookup(&self, id: LockId) -> Result<Option<u64>, FabricError> {
        let tag = id.0.wrapping_add(1);
        let slots = self.slots();
        let start = first_slot(id, slots);
        for probe in 0..slots {
            let base = ((start + probe) % slots) * SLOT_BYTES;
            match self.read_u64(base + TAG_OFFSET)? {
                t if t == tag => return Ok(Some(base)),
                0 => return Ok(None),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Claims a slot for `id` (or finds the one it has), seeding a fresh
    /// slot's fence word with `fence_seed`. `None`: the table is full.
    pub(crate) fn claim(&self, id: LockId, fence_seed: u64) -> Result<Option<u64>, FabricError> {
        let tag = id.0.wrapping_add(1);
        let slots = self.slots();
        let start = first_slot(id, slots);
        for probe in 0..slots {
            let base = ((start + probe) % slots) * SLOT_BYTES;
            if self.read_u64(base + TAG_OFFSET)? == 0 {
                // Seeded before the tag is claimed: a slot's fence is never
                // zero once its lock exists. A seed left in a slot another
                // lock then claims is just as good (both are "now").
                self.compare_swap(base + FENCE_OFFSET, 0, fence_seed)?;
            }
            match self.compare_swap(base + TAG_OFFSET, 0, tag)? {
                0 => return Ok(Some(base)),
                t if t == tag => return Ok(Some(base)),
                _ => {}
            }
        }
        Ok(None)
    }
}

/// One lock's words, as read from its home's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotView {
    pub lock: LockId,
    pub word: LockWord,
    pub drain: DrainWord,
    pub fence: FenceWord,
    /// The lock's membership word at this server (re-homing).
    pub home: HomeWord,
    /// The lock word is fenced: this slot is not (or no longer) the lock's home.
    pub fenced: bool,
}

/// Reads every claimed slot of a home's lock table, one-sidedly (one read of
/// the whole table: each word is read atomically, the slot as a whole is
/// not a snapshot).
pub fn read_table(region: &dyn RemoteRegion) -> Result<Vec<SlotView>, FabricError> {
    let mut bytes = vec![0u8; usize::try_from(region.len()).unwrap_or(0)];
    let chunk = 1 << 20;
    for start in (0..bytes.len()).step_by(chunk) {
        let end = (start + chunk).min(bytes.len());
        region.read(start as u64, &mut bytes[start..end])?;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    let slot = SLOT_BYTES as usize;
    Ok((0..bytes.len() / slot)
        .map(|i| i * slot)
        .filter(|&base| word(base + TAG_OFFSET as usize) != 0)
        .map(|base| SlotView {
            lock: LockId(word(base + TAG_OFFSET as usize).wrapping_sub(1)),
            word: LockWord::decode(word(base + LOCK_OFFSET as usize)),
            drain: DrainWord::decode(word(base + DRAIN_OFFSET as usize)),
            fence: FenceWord::decode(word(base + FENCE_OFFSET as usize)),
            home: HomeWord::decode(word(base + HOME_OFFSET as usize)),
            fenced: LockWord::is_fenced(word(base + LOCK_OFFSET as usize)),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_fabric::RegionMemory;

    fn table(slots: u64) -> HomeMemory {
        let memory = RegionMemory::heap("t", slots * SLOT_BYTES).unwrap();
        HomeMemory::Local(Arc::new(LocalRegion::new("t", memory)))
    }

    #[test]
    fn claim_then_lookup_and_a_full_table() {
        let t = table(4);
        assert_eq!(t.lookup(LockId(10)).unwrap(), None);
        let a = t.claim(LockId(10), 77).unwrap().unwrap();
        assert_eq!(t.read_u64(a + FENCE_OFFSET).unwrap(), 77, "the fence is seeded");
        assert_eq!(t.claim(LockId(10), 99).unwrap(), Some(a), "claiming twice finds the same slot");
        assert_eq!(t.read_u64(a + FENCE_OFFSET).unwrap(), 77, "and keeps its fence");
        assert_eq!(t.lookup(LockId(10)).unwrap(), Some(a));
        for id in 11..14 {
            assert!(t.claim(LockId(id), 1).unwrap().is_some());
        }
        assert_eq!(t.claim(LockId(99), 1).unwrap(), None, "four slots, five locks");
        assert_eq!(t.lookup(LockId(99)).unwrap(), None);
        for id in 10..14 {
            assert!(t.lookup(LockId(id)).unwrap().is_some());
        }
    }

    #[test]
    fn homes_spread_over_the_servers() {
        let servers = [NodeId(0), NodeId(1), NodeId(2)];
        let mut counts = [0usize; 3];
        for id in 0..3000 {
            let home = home_of(LockId(id), &servers).unwrap();
            counts[home.0 as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        assert_eq!(home_of(LockId(1), &[]), None);
    }

    #[test]
    fn candidates_start_at_the_home_and_go_round_the_ring() {
        let servers = [NodeId(0), NodeId(1), NodeId(2)];
        for id in 0..50 {
            let c = candidates(LockId(id), &servers);
            assert_eq!(c[0], home_of(LockId(id), &servers).unwrap());
            assert_eq!(c[1].0, (c[0].0 + 1) % 3);
            assert_eq!(c[2].0, (c[0].0 + 2) % 3);
        }
        assert!(candidates(LockId(1), &[]).is_empty());
    }

    #[test]
    fn a_fence_and_a_raised_fence_word_hold() {
        let t = table(4);
        let a = t.claim(LockId(3), 77).unwrap().unwrap();
        t.compare_swap(a + LOCK_OFFSET, 0, LockWord { generation: 2, tail: Some(NodeId(1)), shared: 0 }.encode())
            .unwrap();
        let fenced = t.fence_lock(NodeId(0), a).unwrap();
        assert!(LockWord::is_fenced(fenced));
        assert_eq!(t.read_u64(a + LOCK_OFFSET).unwrap(), fenced);
        assert_eq!(t.fence_lock(NodeId(0), a).unwrap(), fenced, "fencing twice changes nothing");
        assert_eq!(FenceWord::decode(t.raise_fence(NodeId(0), a, 500).unwrap()).count, 500);
        assert_eq!(FenceWord::decode(t.raise_fence(NodeId(0), a, 10).unwrap()).count, 500, "never lowered");
    }
}
