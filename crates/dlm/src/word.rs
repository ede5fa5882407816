//! The words a lock lives in at its home node, bit by bit.
//!
//! Every lock owns one [`SLOT_BYTES`]-byte slot in its home's lock table (see
//! [`crate::table`]): four 64-bit words, operated on only with one-sided
//! atomics by the nodes that use the lock.
//!
//! | offset | word | who changes it |
//! |---|---|---|
//! | 0  | tag: lock id + 1 (0 = free slot) | `create_lock`, once |
//! | 8  | [`LockWord`] | every request and release |
//! | 16 | [`DrainWord`] | only while an exclusive waits for group-0 shared holders |
//! | 24 | [`FenceWord`]: token counter and its generation | each exclusive grantee; a recovery or break |
//! | 32 | [`HomeWord`]: the lock's membership word at this server | a claim of the home role (re-homing) |
//! | 40..64 | reserved (zero) | |

use tierstack_base::NodeId;

/// Bytes of one lock's slot in a home's table (five words used, a power of two).
pub const SLOT_BYTES: u64 = 64;
/// Offset of the tag word inside a slot.
pub const TAG_OFFSET: u64 = 0;
/// Offset of the [`LockWord`] inside a slot.
pub const LOCK_OFFSET: u64 = 8;
/// Offset of the [`DrainWord`] inside a slot.
pub const DRAIN_OFFSET: u64 = 16;
/// Offset of the fence word (the fencing-token counter) inside a slot.
pub const FENCE_OFFSET: u64 = 24;
/// Offset of the [`HomeWord`] (the lock's membership word at this server) inside a slot.
pub const HOME_OFFSET: u64 = 32;

/// Largest node id that fits the 16-bit `node + 1` fields of the words;
/// the field value `0xFFFF` is kept for [`LockWord::fenced`].
pub const WORD_NODE_MAX: u32 = u16::MAX as u32 - 2;

/// The tail field of a fenced lock word (see [`LockWord::fenced`]).
const FENCED_TAIL: u64 = 0xFFFF;

/// The balance a [`DrainWord`] reaches when its waiter's group has drained.
pub const DRAIN_BIAS: u32 = 1 << 31;

const GEN_SHIFT: u32 = 48;
const NODE_SHIFT: u32 = 32;
const LOW_MASK: u64 = 0xFFFF_FFFF;

fn encode_node(node: Option<NodeId>) -> u64 {
    match node {
        // Node ids are checked against WORD_NODE_MAX when a lock manager is
        // configured, so `id + 1` fits 16 bits; the mask keeps a bad id from
        // spilling into the generation.
        Some(n) => u64::from(n.0.wrapping_add(1)) & 0xFFFF,
        None => 0,
    }
}

fn decode_node(bits: u64) -> Option<NodeId> {
    let field = (bits >> NODE_SHIFT) & 0xFFFF;
    (field != 0).then(|| NodeId(field as u32 - 1))
}

/// The N-CoShED lock word: the paper's 64-bit window, one per lock.
///
/// ```text
///  63            48 47            32 31                              0
/// +----------------+----------------+--------------------------------+
/// |   generation   |  tail node + 1 |          shared count          |
/// +----------------+----------------+--------------------------------+
///  \______ upper 32 bits: the tail ______/ \___ lower 32 bits ___/
/// ```
///
/// - **Upper 32 bits, the tail of the distributed queue of exclusive
///   requesters** (the paper's "location of the tail"):
///   - bits 47..32, `tail node + 1`: 0 means no exclusive request is queued;
///     `n + 1` means node `n` enqueued the most recent exclusive request.
///     A node has at most one request per lock at a time, so the node names
///     the queue entry.
///   - bits 63..48, `generation`: bumped (wrapping) only by a recovery or
///     a break, which then names its own node as the tail (it holds the new
///     generation as a barrier; see `proto`). Every compare-and-swap copies
///     it, so a participant that acted before a move can never complete a
///     compare-and-swap after it.
/// - **Lower 32 bits, the shared count**: shared requests enqueued (by
///   `fetch_add(1)`) since the last exclusive enqueue. An exclusive enqueue
///   swaps it to 0 and takes the old value along: that many shared requests
///   stand between it and its predecessor. With no tail (bits 47..32 zero) it
///   is the number of *group-0* shared holders (granted directly by their
///   fetch-and-add), which decrement it on release. It never exceeds the
///   number of outstanding requests (one per node), so it cannot carry into
///   the tail.
///
/// The free lock is the word with zero tail and zero count (any generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockWord {
    pub generation: u16,
    pub tail: Option<NodeId>,
    pub shared: u32,
}

impl LockWord {
    /// The free word of `generation`.
    pub fn free(generation: u16) -> Self {
        Self { generation, tail: None, shared: 0 }
    }

    pub fn decode(bits: u64) -> Self {
        Self { generation: (bits >> GEN_SHIFT) as u16, tail: decode_node(bits), shared: (bits & LOW_MASK) as u32 }
    }

    pub fn encode(self) -> u64 {
        (u64::from(self.generation) << GEN_SHIFT) | (encode_node(self.tail) << NODE_SHIFT) | u64::from(self.shared)
    }

    pub fn is_free(self) -> bool {
        self.tail.is_none() && self.shared == 0
    }

    /// `bits` with its tail field set to `0xFFFF`, which no node id has: the
    /// word of a slot that is not (or no longer) its lock's home. Every
    /// atomic on a lock word returns the previous word, and the runtime
    /// refuses to go on with a request that met a fence (it locates the
    /// lock again), so a stale mapping of a dead home cannot grant.
    /// Generation and count are kept (a fetch-and-add on a fenced word only
    /// raises its count).
    pub fn fenced(bits: u64) -> u64 {
        bits | (FENCED_TAIL << NODE_SHIFT)
    }

    /// Whether `bits` is a fenced word.
    pub fn is_fenced(bits: u64) -> bool {
        (bits >> NODE_SHIFT) & 0xFFFF == FENCED_TAIL
    }
}

/// A lock's membership word at one lock server (re-homing; see
/// `docs/internals/dlm-rehoming.md`).
///
/// ```text
///  63                             32 31            16 15             0
/// +---------------------------------+----------------+----------------+
/// |              epoch              |   home + 1     |       0        |
/// +---------------------------------+----------------+----------------+
/// ```
///
/// Zero is epoch 0 with no home named: the lock's first candidate. A claim
/// of epoch `e + 1` for candidate `C` compare-and-swaps this word at every
/// reachable server from what it read (epoch ≤ `e`) to `(e + 1, C)` and wins
/// with a majority; a node's view of the lock is the highest epoch among a
/// majority of words it could read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct HomeWord {
    pub epoch: u32,
    pub home: Option<NodeId>,
}

impl HomeWord {
    pub fn decode(bits: u64) -> Self {
        let field = (bits >> 16) & 0xFFFF;
        Self { epoch: (bits >> 32) as u32, home: (field != 0).then(|| NodeId(field as u32 - 1)) }
    }

    pub fn encode(self) -> u64 {
        (u64::from(self.epoch) << 32) | (encode_node(self.home) << 16)
    }
}

/// The drain word: how an exclusive requester that enqueued behind *group-0*
/// shared holders (holders nobody queued behind, so nobody will message) is
/// woken by the last of them.
///
/// ```text
///  63            48 47            32 31                              0
/// +----------------+----------------+--------------------------------+
/// |   generation   | waiter node + 1|            balance             |
/// +----------------+----------------+--------------------------------+
/// ```
///
/// - bits 63..48, `generation`: the lock word's generation; a recovery or
///   break resets the word to its new generation, so stale releases fail.
/// - bits 47..32, `waiter node + 1`: 0 until the exclusive requester
///   registers; then its node + 1.
/// - bits 31..0, `balance`: before registration, the number of group-0
///   holders that released after the exclusive enqueued (starting from 0).
///   Registration with `target` holders sets it to
///   `DRAIN_BIAS + released - target`, so it reaches exactly [`DRAIN_BIAS`]
///   with the last release, and never wraps: at most one registration per
///   episode and at most `target` releases. The releaser that would make it
///   reach `DRAIN_BIAS` instead resets the word to `(generation, 0, 0)` and
///   messages the waiter, so the word is clean for the next episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DrainWord {
    pub generation: u16,
    pub waiter: Option<NodeId>,
    pub balance: u32,
}

impl DrainWord {
    /// The idle drain word of `generation`.
    pub fn idle(generation: u16) -> Self {
        Self { generation, waiter: None, balance: 0 }
    }

    pub fn decode(bits: u64) -> Self {
        Self { generation: (bits >> GEN_SHIFT) as u16, waiter: decode_node(bits), balance: (bits & LOW_MASK) as u32 }
    }

    pub fn encode(self) -> u64 {
        (u64::from(self.generation) << GEN_SHIFT) | (encode_node(self.waiter) << NODE_SHIFT) | u64::from(self.balance)
    }

    /// The word after one more group-0 release, and whether that release
    /// completed a registered waiter's drain (then the word is reset).
    pub fn after_release(self) -> (Self, bool) {
        match self.waiter {
            Some(_) if self.balance.wrapping_add(1) == DRAIN_BIAS => (Self::idle(self.generation), true),
            _ => (Self { balance: self.balance.wrapping_add(1), ..self }, false),
        }
    }

    /// The word after `waiter` registers for `target` group-0 holders, and
    /// whether they have all released already (then the word is reset).
    pub fn after_register(self, waiter: NodeId, target: u32) -> (Self, bool) {
        if self.balance >= target {
            (Self::idle(self.generation), true)
        } else {
            (
                Self {
                    generation: self.generation,
                    waiter: Some(waiter),
                    balance: DRAIN_BIAS - (target - self.balance),
                },
                false,
            )
        }
    }
}

/// The fence word: the lock's fencing-token counter and the generation it
/// counts for.
///
/// ```text
///  63                                              16 15              0
/// +--------------------------------------------------+----------------+
/// |                      count                       |   generation   |
/// +--------------------------------------------------+----------------+
/// ```
///
/// - bits 63..16, `count`: exclusive grants and lock moves so far, on top of
///   the seed the lock was created with ([`fence_seed`]). Every exclusive
///   grantee adds [`FENCE_UNIT`] inside its hold; a recovery or break adds
///   one when it moves the generation.
/// - bits 15..0, `generation`: the lock-word generation the count belongs
///   to, moved by a recovery or break *after* it moved the lock word.
///
/// **A fencing token is the fence word a grantee's fetch-and-add left**
/// ([`fencing_token`]): `(count + 1) << 16 | generation`. Tokens therefore
/// strictly increase in the order of the fetch-and-adds, whatever the
/// generation. A grantee whose fetch-and-add returns a generation other than
/// its request's was overtaken by a recovery or break: it does not hold (see
/// `proto`), so no token handed to a user was fetched after the generation
/// moved on, and every token of a revoked hold is below the floor the move
/// leaves ([`FenceWord::moved_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FenceWord {
    /// 48 bits.
    pub count: u64,
    pub generation: u16,
}

/// What an exclusive grantee adds to the fence word: one count.
pub const FENCE_UNIT: u64 = 1 << FENCE_GENERATION_BITS;
const FENCE_GENERATION_BITS: u32 = 16;
const FENCE_COUNT_MASK: u64 = (1 << 48) - 1;

impl FenceWord {
    pub fn decode(bits: u64) -> Self {
        Self { count: bits >> FENCE_GENERATION_BITS, generation: bits as u16 }
    }

    pub fn encode(self) -> u64 {
        ((self.count & FENCE_COUNT_MASK) << FENCE_GENERATION_BITS) | u64::from(self.generation)
    }

    /// The word a recovery or break that moves the lock to `generation`
    /// leaves: one count more, the new generation. Its encoding is the
    /// move's *floor*: above every token fetched before, below every token
    /// fetched after.
    pub fn moved_to(self, generation: u16) -> Self {
        Self { count: self.count.wrapping_add(1) & FENCE_COUNT_MASK, generation }
    }
}

/// The fencing token of an exclusive grant whose fetch-and-add of
/// [`FENCE_UNIT`] on the fence word returned `previous`.
pub fn fencing_token(previous: u64) -> u64 {
    previous.wrapping_add(FENCE_UNIT)
}

/// Milliseconds from the UNIX epoch to 2024-01-01, the origin of [`fence_seed`].
pub const FENCE_SEED_EPOCH_MS: u64 = 1_704_067_200_000;
/// Counts per millisecond of a lock's life that [`fence_seed`] leaves room for.
pub const FENCE_SEED_COUNTS_PER_MS: u64 = 1 << 8;

/// The fence word a lock is created with, given the wall-clock time in
/// milliseconds since the UNIX epoch: count `(milliseconds since 2024) ×
/// 256`, generation 0.
///
/// Why: a home that restarts has lost its table, and the lock is created
/// again; its tokens must still be above the old incarnation's, or a
/// resource that remembers the largest token would reject every new holder.
/// Seeding the count with the creation time keeps the new tokens above the
/// old ones unless the old incarnation averaged more than 256 exclusive
/// grants per millisecond (256 000 per second) over its whole life, or the
/// wall clock stepped back between the two creations. The count's 48 bits
/// last until 2058.
pub fn fence_seed(unix_ms: u64) -> u64 {
    let count = unix_ms.saturating_sub(FENCE_SEED_EPOCH_MS).saturating_mul(FENCE_SEED_COUNTS_PER_MS);
    FenceWord { count: count.min(FENCE_COUNT_MASK), generation: 0 }.encode()
}

/// Generation `a` is newer than `b` (wrapping, like TCP sequence numbers).
pub fn generation_newer(a: u16, b: u16) -> bool {
    a != b && a.wrapping_sub(b) < 0x8000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_word_fields_are_where_the_doc_says() {
        let w = LockWord { generation: 0xABCD, tail: Some(NodeId(0x1233)), shared: 0x0102_0304 };
        assert_eq!(w.encode(), 0xABCD_1234_0102_0304);
        assert_eq!(LockWord::decode(w.encode()), w);
        assert_eq!(LockWord::free(7).encode(), 7 << 48);
        assert!(LockWord::decode(7 << 48).is_free());
        // A shared enqueue is a plain fetch_add(1) on the low half.
        let after = LockWord::decode(w.encode() + 1);
        assert_eq!(after.shared, 0x0102_0305);
        assert_eq!(after.tail, w.tail);
        assert_eq!(LockWord::decode(LockWord::free(0).encode() + 1).tail, None);
    }

    #[test]
    fn drain_word_reaches_bias_exactly_with_the_last_release() {
        let d = DrainWord::idle(3);
        // One release before registration, target three holders.
        let (d, done) = d.after_release();
        assert!(!done);
        assert_eq!(d.balance, 1);
        let (d, done) = d.after_register(NodeId(5), 3);
        assert!(!done);
        assert_eq!(d.waiter, Some(NodeId(5)));
        assert_eq!(DrainWord::decode(d.encode()), d);
        let (d, done) = d.after_release();
        assert!(!done);
        let (d, done) = d.after_release();
        assert!(done, "the third release completes the drain");
        assert_eq!(d, DrainWord::idle(3));
        // Everybody released before registration: drained at once.
        let (d, _) = DrainWord::idle(0).after_release();
        let (d, done) = d.after_register(NodeId(1), 1);
        assert!(done);
        assert_eq!(d, DrainWord::idle(0));
    }

    #[test]
    fn tokens_increase_with_every_fetch_and_add_and_moves_leave_a_floor_between() {
        let fence = FenceWord { count: 41, generation: 3 };
        assert_eq!(fence.encode(), 41 << 16 | 3);
        assert_eq!(FenceWord::decode(fence.encode()), fence);
        let token = fencing_token(fence.encode());
        assert_eq!(FenceWord::decode(token), FenceWord { count: 42, generation: 3 });
        assert_eq!(
            FenceWord::decode(fence.encode() + FENCE_UNIT),
            FenceWord::decode(token),
            "a grant's token is the word it left"
        );
        // A move to generation 4 after that grant: its floor is above the
        // grant's token, and the next grant's token above the floor.
        let floor = FenceWord::decode(token).moved_to(4).encode();
        assert!(floor > token);
        assert!(fencing_token(floor) > floor);
        assert_eq!(FenceWord::decode(fencing_token(floor)).generation, 4);
        // The generation wraps; the count decides the order.
        let wrapped = FenceWord { count: 7, generation: u16::MAX }.moved_to(0);
        assert!(wrapped.encode() > FenceWord { count: 7, generation: u16::MAX }.encode());
    }

    #[test]
    fn the_seed_puts_a_later_creation_above_an_earlier_one() {
        let created = FENCE_SEED_EPOCH_MS + 1000;
        let old = fence_seed(created);
        assert_eq!(FenceWord::decode(old).generation, 0);
        // The old incarnation issued a million tokens in 10 s; the lock is
        // created again right then.
        let old_last = old + 1_000_000 * FENCE_UNIT;
        assert!(fence_seed(created + 10_000) > old_last);
        assert!(fence_seed(created + 1) > old, "a millisecond later is enough for a quiet lock");
        assert_eq!(fence_seed(0), 0, "before the epoch: zero, not a wrap");
        assert!(FenceWord::decode(fence_seed(u64::MAX)).count <= FENCE_COUNT_MASK);
    }

    #[test]
    fn a_fence_survives_every_atomic_the_protocol_makes_and_no_node_id_looks_like_one() {
        let w = LockWord { generation: 9, tail: None, shared: 3 }.encode();
        let f = LockWord::fenced(w);
        assert!(LockWord::is_fenced(f));
        assert!(!LockWord::is_fenced(w));
        assert!(LockWord::is_fenced(f + 1), "a shared fetch-and-add keeps the fence");
        assert_eq!(LockWord::decode(f).generation, 9);
        let last = LockWord { generation: u16::MAX, tail: Some(NodeId(WORD_NODE_MAX)), shared: u32::MAX };
        assert!(!LockWord::is_fenced(last.encode()), "the largest node id is not a fence");
        let home = HomeWord { epoch: 0xDEAD_BEEF, home: Some(NodeId(7)) };
        assert_eq!(home.encode(), 0xDEAD_BEEF_0008_0000);
        assert_eq!(HomeWord::decode(home.encode()), home);
        assert_eq!(HomeWord::decode(0), HomeWord::default());
    }

    #[test]
    fn generations_compare_with_wrapping() {
        assert!(generation_newer(1, 0));
        assert!(generation_newer(0, u16::MAX));
        assert!(!generation_newer(0, 1));
        assert!(!generation_newer(4, 4));
    }
}
