//! The remote-write versions' per-pair rings: layout and index arithmetic,
//! pure (the runtime in `press-node` performs the writes and polls).
//!
//! Every node registers one region holding, for each other node `s` as a
//! sender, a **control ring** of fixed-size entries (forward, caching and
//! file-info messages) and a **data ring** of bytes (file data), which `s`
//! fills with one-sided writes; and, for each other node `r` as a receiver
//! of this node's messages, two **credit words** that `r` overwrites
//! one-sidedly: how many of this node's entries it consumed, and up to
//! which byte of this node's data it released (flow control and buffer
//! management: words that "can be overwritten", §3.2); and a third word,
//! `r`'s **asleep** generation: `r` writes a new nonzero value there before
//! it sleeps, and a sender that sees a value it has not rung yet rings
//! `r`'s doorbell after its write (`press-node`'s `rings` module).
//!
//! An entry is `len: u32`, the sender's **epoch** (`u32`, nonzero, new for
//! each incarnation of the sender: a restarted peer is told apart by it),
//! the encoded message, and its
//! **sequence number in the last 8 bytes** (§4.2: "message sequence numbers
//! stored at the last position of each (fixed-size) buffer entry"). The
//! sender writes the payload first and the sequence word last, so a
//! receiver that sees sequence `last + 1` in the next slot sees the whole
//! entry. Sequence numbers start at 1 (a zeroed slot is empty); slot =
//! `(seq - 1) mod entries`.
//!
//! Data is reserved contiguously: a file that does not fit before the
//! ring's end skips the tail and starts at its beginning. Positions are
//! absolute byte counters (`head`, `released`), so wrap-around needs no
//! flag; a `FileInfo` names its data by absolute start.

/// Bytes of one control entry (header, message, sequence word).
pub const ENTRY_BYTES: u64 = 256;
/// Header of an entry: the message length and the sender's epoch.
pub const ENTRY_HEADER_BYTES: u64 = 8;
/// Largest encoded message an entry carries.
pub const ENTRY_PAYLOAD_MAX: u64 = ENTRY_BYTES - ENTRY_HEADER_BYTES - 8;

/// Bytes each receiver writes into a sender's region: consumed, released, asleep.
const RECEIVER_WORDS_BYTES: u64 = 24;

/// The shape of a node's ring region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub nodes: u64,
    /// Control entries per sender (a power of two is not required).
    pub entries: u64,
    /// Data ring bytes per sender (a multiple of 8).
    pub data_bytes: u64,
}

impl RingLayout {
    fn ctrl_bytes(&self) -> u64 {
        self.entries * ENTRY_BYTES
    }

    fn per_sender(&self) -> u64 {
        self.ctrl_bytes() + self.data_bytes
    }

    /// Offset of sender `s`'s control slot for sequence number `seq` (≥ 1).
    pub fn entry_offset(&self, sender: u64, seq: u64) -> u64 {
        sender * self.per_sender() + ((seq - 1) % self.entries) * ENTRY_BYTES
    }

    /// Offset of the sequence word of that slot.
    pub fn seq_offset(&self, sender: u64, seq: u64) -> u64 {
        self.entry_offset(sender, seq) + ENTRY_BYTES - 8
    }

    /// Offset of the byte at absolute data position `position` of sender `s`.
    pub fn data_offset(&self, sender: u64, position: u64) -> u64 {
        sender * self.per_sender() + self.ctrl_bytes() + position % self.data_bytes
    }

    /// Offset of the two credit words receiver `r` writes into this node's
    /// region: `[entries consumed, data released]`.
    pub fn credit_offset(&self, receiver: u64) -> u64 {
        self.nodes * self.per_sender() + receiver * RECEIVER_WORDS_BYTES
    }

    /// Offset of the word receiver `r` writes into this node's region
    /// before it sleeps: its sleep generation (0: it never slept).
    pub fn asleep_offset(&self, receiver: u64) -> u64 {
        self.credit_offset(receiver) + 16
    }

    /// The region's size.
    pub fn region_bytes(&self) -> u64 {
        self.nodes * self.per_sender() + self.nodes * RECEIVER_WORDS_BYTES
    }
}

/// Why a message cannot be written now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Every control slot holds an unconsumed entry.
    Entries,
    /// The data ring has no contiguous room of that size yet.
    Data,
    /// The message can never fit (larger than an entry or the data ring).
    TooLarge,
}

/// A sender's state towards one receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderRing {
    /// Sequence number of the next entry (starts at 1).
    pub next_seq: u64,
    /// Absolute data position of the next reservation.
    pub head: u64,
}

impl SenderRing {
    pub fn new() -> Self {
        SenderRing { next_seq: 1, head: 0 }
    }

    /// Takes the next control slot if the receiver consumed enough
    /// (`consumed`: entries it reports consumed). Returns the sequence number.
    pub fn take_entry(&mut self, layout: &RingLayout, consumed: u64) -> Result<u64, Full> {
        if self.next_seq - 1 - consumed.min(self.next_seq - 1) >= layout.entries {
            return Err(Full::Entries);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Would [`SenderRing::take_entry`] succeed?
    pub fn has_entry(&self, layout: &RingLayout, consumed: u64) -> bool {
        self.next_seq - 1 - consumed.min(self.next_seq - 1) < layout.entries
    }

    /// Reserves `len` contiguous data bytes given the receiver's `released`
    /// position; returns the absolute start.
    /// (Units are whatever `layout.data_bytes` counts: bytes at runtime,
    /// words in the loom model.)
    pub fn reserve_data(&mut self, layout: &RingLayout, len: u64, released: u64) -> Result<u64, Full> {
        if len > layout.data_bytes {
            return Err(Full::TooLarge);
        }
        let released = released.min(self.head);
        let pos = self.head % layout.data_bytes;
        let skip = if pos + len > layout.data_bytes { layout.data_bytes - pos } else { 0 };
        let end = self.head + skip + len;
        if end - released > layout.data_bytes {
            return Err(Full::Data);
        }
        let start = self.head + skip;
        self.head = end;
        Ok(start)
    }
}

/// A receiver's state towards one sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverRing {
    /// The last sequence number consumed (0: none).
    pub last_seq: u64,
    /// Absolute data position released so far.
    pub released: u64,
}

impl ReceiverRing {
    /// Whether the sequence word read from the next slot means a complete
    /// entry: it must be exactly `last + 1` (an older value is the previous
    /// lap's entry, still unread by nobody).
    pub fn is_next(&self, seq_word: u64) -> bool {
        seq_word == self.last_seq + 1
    }

    /// The entry was consumed.
    pub fn consume(&mut self) {
        self.last_seq += 1;
    }

    /// The file data `[start, start + len)` is no longer needed; data is
    /// released in order, so everything before its end is free.
    pub fn release(&mut self, start: u64, len: u64) {
        self.released = self.released.max(start + len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: RingLayout = RingLayout { nodes: 3, entries: 4, data_bytes: 1024 };

    #[test]
    fn layout_does_not_overlap() {
        assert_eq!(L.entry_offset(0, 1), 0);
        assert_eq!(L.entry_offset(0, 5), 0, "slot wraps");
        assert_eq!(L.seq_offset(0, 2), 2 * ENTRY_BYTES - 8);
        assert_eq!(L.data_offset(0, 0), 4 * ENTRY_BYTES);
        assert_eq!(L.data_offset(0, 1024), 4 * ENTRY_BYTES);
        assert_eq!(L.entry_offset(1, 1), 4 * ENTRY_BYTES + 1024);
        assert_eq!(L.credit_offset(0), 3 * (4 * ENTRY_BYTES + 1024));
        assert_eq!(L.region_bytes(), L.credit_offset(2) + 24);
        assert_eq!(L.asleep_offset(1), L.credit_offset(1) + 16);
        assert_eq!(L.asleep_offset(1) + 8, L.credit_offset(2));
        assert_eq!(L.region_bytes() % 8, 0);
    }

    #[test]
    fn entries_stop_at_the_window_and_resume_on_consumption() {
        let mut s = SenderRing::new();
        for expected in 1..=4 {
            assert_eq!(s.take_entry(&L, 0), Ok(expected));
        }
        assert_eq!(s.take_entry(&L, 0), Err(Full::Entries));
        assert!(!s.has_entry(&L, 0));
        assert_eq!(s.take_entry(&L, 1), Ok(5));
        let mut r = ReceiverRing::default();
        assert!(!r.is_next(0));
        assert!(r.is_next(1));
        r.consume();
        assert!(!r.is_next(1), "the previous lap's number is not new");
    }

    #[test]
    fn data_wraps_by_skipping_the_tail_and_waits_for_release() {
        let mut s = SenderRing::new();
        assert_eq!(s.reserve_data(&L, 1025, 0), Err(Full::TooLarge));
        assert_eq!(s.reserve_data(&L, 600, 0), Ok(0));
        assert_eq!(s.reserve_data(&L, 500, 0), Err(Full::Data), "would skip 424 and overrun");
        // Released the first file: the next one skips the tail, starts at 1024.
        assert_eq!(s.reserve_data(&L, 500, 600), Ok(1024));
        assert_eq!(L.data_offset(0, 1024), L.data_offset(0, 0));
        assert_eq!(s.head, 1524);
        assert_eq!(s.reserve_data(&L, 100, 600), Ok(1524), "exactly the room left");
        assert_eq!(s.reserve_data(&L, 1, 600), Err(Full::Data));
    }
}
