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
//! | 24 | fence: exclusive grants so far (+ breaks) | each exclusive grantee, `break_lock` |

use tierstack_base::NodeId;

/// Bytes of one lock's slot in a home's table.
pub const SLOT_BYTES: u64 = 32;
/// Offset of the tag word inside a slot.
pub const TAG_OFFSET: u64 = 0;
/// Offset of the [`LockWord`] inside a slot.
pub const LOCK_OFFSET: u64 = 8;
/// Offset of the [`DrainWord`] inside a slot.
pub const DRAIN_OFFSET: u64 = 16;
/// Offset of the fence word (the fencing-token counter) inside a slot.
pub const FENCE_OFFSET: u64 = 24;

/// Largest node id that fits the 16-bit `node + 1` fields of the words.
pub const WORD_NODE_MAX: u32 = u16::MAX as u32 - 1;

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
///   - bits 63..48, `generation`: bumped (wrapping) only by `break_lock`.
///     Every compare-and-swap copies it, so a participant that acted before a
///     break can never complete a compare-and-swap after it.
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
/// - bits 63..48, `generation`: the lock word's generation; `break_lock`
///   resets the word to its new generation, so stale releases fail.
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

/// Bits of a fencing token that carry the fence word's count; the bits
/// above carry the lock-word generation the grant belongs to.
const TOKEN_COUNT_BITS: u32 = 48;

/// The fencing token of an exclusive grant of `generation` whose fetch-and-add
/// on the fence word returned `previous`: `generation << 48 | previous + 1`.
///
/// Why the generation: a request of a generation that `break_lock` has
/// already left may still be granted after the break (its predecessor's
/// grant message, or the second half of its own batch, overtakes the break
/// notice) and fetch its count after the break's. With the generation in
/// the high bits its token is still below the floor
/// ([`break_floor`]), and every token of the new generation is above it.
/// (Tokens compare correctly for 65 536 breaks of one lock, until the
/// 16-bit generation wraps.)
pub fn fencing_token(generation: u16, previous: u64) -> u64 {
    (u64::from(generation) << TOKEN_COUNT_BITS) | (previous.wrapping_add(1) & ((1 << TOKEN_COUNT_BITS) - 1))
}

/// The floor `break_lock` returns when it moved the lock to `generation`
/// after its own fetch-and-add on the fence word returned `previous`: above
/// every token of older generations, below every later token of `generation`.
pub fn break_floor(generation: u16, previous: u64) -> u64 {
    fencing_token(generation, previous)
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
    fn tokens_of_a_broken_generation_stay_below_the_floor() {
        assert_eq!(fencing_token(0, 41), 42, "generation 0: the plain count");
        let floor = break_floor(1, 5);
        assert!(fencing_token(0, 9) < floor, "an old grant that fetched after the break");
        assert!(fencing_token(1, 5) > fencing_token(0, 4));
        assert!(fencing_token(1, 6) > floor);
        assert_eq!(fencing_token(3, u64::MAX >> 16), 3 << 48, "the count wraps inside its bits");
    }

    #[test]
    fn generations_compare_with_wrapping() {
        assert!(generation_newer(1, 0));
        assert!(generation_newer(0, u16::MAX));
        assert!(!generation_newer(0, 1));
        assert!(!generation_newer(4, 4));
    }
}
