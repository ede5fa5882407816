//! The word protocols of the `shm` message transport, generic over [`Word`]
//! so that loom model-checks them (`tests/loom_ring.rs`, run with
//! `--cfg tierstack_loom`, as the seqlock's).
//!
//! **The ring.** One ring carries the messages of one sender to one receiver
//! on one channel: exactly one producer and one consumer, so no
//! compare-and-swap and no producer can leave another's record half
//! written. Three kinds of words:
//!
//! ```text
//! head   written by the producer only: words ever published
//! tail   written by the consumer only: words ever released
//! data   `capacity` words (a power of two); position p is data[p % capacity]
//! ```
//!
//! `tail <= head <= tail + capacity` always. A record is a header word (its
//! payload length and the fragment flags, see [`RecordHeader`]) followed by
//! the payload padded to whole words; records wrap around the end of `data`.
//!
//! The producer reads `tail` (acquire) to learn the free room, writes the
//! record's words (relaxed), then publishes them by storing `head`
//! (release). A record is visible only through that store, so a producer
//! that dies while writing leaves nothing a consumer can read. The consumer
//! reads `head` (acquire), copies the record's words out (relaxed), and
//! releases them by storing `tail` (release), after which the producer may
//! overwrite them. Both cache the other side's word and reread it only when
//! the cached value says the ring is full (producer) or empty (consumer).
//!
//! **The doorbell.** A side that found nothing to do (a consumer with an
//! empty ring, a producer with a full one) may sleep on a futex instead of
//! polling. The doorbell is one word: bit 0 says "someone may sleep", the
//! rest counts rings. [`begin_wait`] sets bit 0 and returns the value to
//! sleep on; the waiter then checks its condition once more and sleeps
//! (a futex wait on that value) only if it still does not hold. The other
//! side, after making the condition true, calls [`ring_doorbell`]: if bit 0
//! is set it clears it and counts a ring in one compare-and-swap, and the
//! one that succeeded wakes the futex. So a sleeping side costs its
//! partner exactly one wake-up system call, and a side that never sleeps
//! costs none. A sequentially consistent fence on each side, between its
//! write and its read of the other's word, makes at least one of them see
//! the other, so no wake-up is lost; a futex wait whose value changed
//! returns at once.

use std::sync::atomic::Ordering;
pub use tierstack_fabric::seqlock::Word;

/// The shared words are inconsistent (another process wrote garbage, or a
/// file is not a ring): the ring is unusable and nothing more is read from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingCorrupt(pub &'static str);

impl std::fmt::Display for RingCorrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "corrupt message ring: {}", self.0)
    }
}

/// Marks a header word, so that a consumer reading garbage notices.
const RECORD_TAG: u64 = 0x7153;
const TAG_SHIFT: u32 = 48;
const FIRST_BIT: u64 = 1 << 32;
const LAST_BIT: u64 = 1 << 33;
const LEN_MASK: u64 = u32::MAX as u64;

/// A record's header word: its payload length and where it lies in its
/// message. A message that fits one record is `first` and `last`; a larger
/// one is split into fragments, consecutive in the ring (the producer holds
/// the ring for the whole message), the first `first`, the last `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Payload bytes of this record.
    pub len: u32,
    pub first: bool,
    pub last: bool,
}

impl RecordHeader {
    pub fn encode(self) -> u64 {
        u64::from(self.len)
            | if self.first { FIRST_BIT } else { 0 }
            | if self.last { LAST_BIT } else { 0 }
            | RECORD_TAG << TAG_SHIFT
    }

    /// `None` unless `word` is a header this module wrote.
    pub fn decode(word: u64) -> Option<RecordHeader> {
        let known = LEN_MASK | FIRST_BIT | LAST_BIT | RECORD_TAG << TAG_SHIFT;
        if word >> TAG_SHIFT != RECORD_TAG || word & !known != 0 {
            return None;
        }
        Some(RecordHeader { len: (word & LEN_MASK) as u32, first: word & FIRST_BIT != 0, last: word & LAST_BIT != 0 })
    }

    /// Words the record occupies: the header and the padded payload.
    pub fn record_words(self) -> u64 {
        1 + u64::from(self.len).div_ceil(8)
    }
}

/// A ring's shared words, borrowed from wherever they live (a mapping, or
/// loom's atomics in the model check).
pub struct RingWords<'a, W> {
    head: &'a W,
    tail: &'a W,
    data: &'a [W],
    mask: u64,
}

impl<'a, W: Word> RingWords<'a, W> {
    /// `None` unless `data` holds a power of two of at least two words.
    pub fn new(head: &'a W, tail: &'a W, data: &'a [W]) -> Option<Self> {
        let capacity = data.len() as u64;
        (capacity >= 2 && capacity.is_power_of_two()).then(|| RingWords { head, tail, data, mask: capacity - 1 })
    }

    /// Data words.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    fn slot(&self, position: u64) -> &W {
        // `mask < data.len()`, so the index is in bounds.
        &self.data[(position & self.mask) as usize]
    }

    /// Checks the ring invariant for a head and tail read from shared words.
    fn check(&self, head: u64, tail: u64) -> Result<(), RingCorrupt> {
        match head.checked_sub(tail) {
            Some(used) if used <= self.capacity() => Ok(()),
            Some(_) => Err(RingCorrupt("more words published than the ring holds")),
            None => Err(RingCorrupt("tail beyond head")),
        }
    }
}

/// The producer's side: its own head and the last tail it read.
#[derive(Debug)]
pub struct Producer {
    head: u64,
    tail_seen: u64,
}

impl Producer {
    /// Takes over the producer's side of a ring (a fresh one: both words 0).
    pub fn attach<W: Word>(ring: &RingWords<'_, W>) -> Result<Producer, RingCorrupt> {
        let head = ring.head.load(Ordering::Relaxed);
        let tail_seen = ring.tail.load(Ordering::Acquire);
        ring.check(head, tail_seen)?;
        Ok(Producer { head, tail_seen })
    }

    /// Free words as far as the cached tail tells; rereads the tail only if
    /// fewer than `wanted` are known free.
    pub fn free_words<W: Word>(&mut self, ring: &RingWords<'_, W>, wanted: u64) -> Result<u64, RingCorrupt> {
        let known = ring.capacity() - (self.head - self.tail_seen);
        if known >= wanted {
            return Ok(known);
        }
        let tail = ring.tail.load(Ordering::Acquire);
        ring.check(self.head, tail)?;
        if tail < self.tail_seen {
            return Err(RingCorrupt("tail moved backwards"));
        }
        self.tail_seen = tail;
        Ok(ring.capacity() - (self.head - tail))
    }

    /// Writes one record's words after the published ones without
    /// publishing them: `Ok(false)` if the ring lacks room. [`publish`]
    /// makes them visible. (Split so the model check can stop a producer
    /// between the two, as a crash would.)
    ///
    /// [`publish`]: Producer::publish
    pub fn write<W: Word>(
        &mut self,
        ring: &RingWords<'_, W>,
        header: RecordHeader,
        payload: &[u8],
    ) -> Result<bool, RingCorrupt> {
        debug_assert_eq!(payload.len(), header.len as usize);
        let need = header.record_words();
        if need > ring.capacity() {
            return Err(RingCorrupt("record larger than the ring"));
        }
        if self.free_words(ring, need)? < need {
            return Ok(false);
        }
        let mut position = self.head;
        ring.slot(position).store(header.encode(), Ordering::Relaxed);
        position += 1;
        let mut chunks = payload.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            ring.slot(position).store(u64::from_ne_bytes(word), Ordering::Relaxed);
            position += 1;
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            ring.slot(position).store(u64::from_ne_bytes(word), Ordering::Relaxed);
            position += 1;
        }
        self.head = position;
        Ok(true)
    }

    /// Publishes every record written so far: one release store.
    pub fn publish<W: Word>(&self, ring: &RingWords<'_, W>) {
        ring.head.store(self.head, Ordering::Release);
    }

    /// Writes and publishes one record: `Ok(false)` if the ring lacks room.
    pub fn push<W: Word>(
        &mut self,
        ring: &RingWords<'_, W>,
        header: RecordHeader,
        payload: &[u8],
    ) -> Result<bool, RingCorrupt> {
        let written = self.write(ring, header, payload)?;
        if written {
            self.publish(ring);
        }
        Ok(written)
    }
}

/// The consumer's side: its own tail (records taken, maybe not yet
/// released) and the last head it read.
#[derive(Debug)]
pub struct Consumer {
    tail: u64,
    released: u64,
    head_seen: u64,
}

impl Consumer {
    /// Takes over the consumer's side of a ring.
    pub fn attach<W: Word>(ring: &RingWords<'_, W>) -> Result<Consumer, RingCorrupt> {
        let tail = ring.tail.load(Ordering::Relaxed);
        let head_seen = ring.head.load(Ordering::Acquire);
        ring.check(head_seen, tail)?;
        Ok(Consumer { tail, released: tail, head_seen })
    }

    /// True if a published record waits (rereads the head only if the cached
    /// one says the ring is empty).
    pub fn has_records<W: Word>(&mut self, ring: &RingWords<'_, W>) -> Result<bool, RingCorrupt> {
        if self.tail != self.head_seen {
            return Ok(true);
        }
        let head = ring.head.load(Ordering::Acquire);
        ring.check(head, self.tail)?;
        if head < self.head_seen {
            return Err(RingCorrupt("head moved backwards"));
        }
        self.head_seen = head;
        Ok(head != self.tail)
    }

    /// The next record's header, if one is published; checks that the
    /// header is one and that its record lies within what is published.
    pub fn peek<W: Word>(&mut self, ring: &RingWords<'_, W>) -> Result<Option<RecordHeader>, RingCorrupt> {
        if !self.has_records(ring)? {
            return Ok(None);
        }
        let header = RecordHeader::decode(ring.slot(self.tail).load(Ordering::Relaxed))
            .ok_or(RingCorrupt("a record header that is not one"))?;
        if header.record_words() > self.head_seen - self.tail {
            return Err(RingCorrupt("a record longer than what is published"));
        }
        Ok(Some(header))
    }

    /// Takes the record [`peek`](Consumer::peek) returned: appends its
    /// payload to `out` (or drops it if `out` is `None`). Its words stay
    /// the consumer's until [`release`](Consumer::release).
    pub fn take<W: Word>(&mut self, ring: &RingWords<'_, W>, header: RecordHeader, out: Option<&mut Vec<u8>>) {
        debug_assert!(header.record_words() <= self.head_seen - self.tail);
        if let Some(out) = out {
            let len = header.len as usize;
            out.reserve(len);
            let mut position = self.tail + 1;
            let mut left = len;
            while left > 0 {
                let word = ring.slot(position).load(Ordering::Relaxed).to_ne_bytes();
                let n = left.min(8);
                out.extend_from_slice(&word[..n]);
                left -= n;
                position += 1;
            }
        }
        self.tail += header.record_words();
    }

    /// True if records were taken since the last release.
    pub fn has_unreleased(&self) -> bool {
        self.released != self.tail
    }

    /// Hands every taken record's words back to the producer: one release
    /// store (none if nothing was taken).
    pub fn release<W: Word>(&mut self, ring: &RingWords<'_, W>) {
        if self.has_unreleased() {
            ring.tail.store(self.tail, Ordering::Release);
            self.released = self.tail;
        }
    }
}

/// Bit 0 of a doorbell: someone may sleep on it.
pub const DOORBELL_SLEEPING: u64 = 1;

/// The waiter's half of the doorbell protocol (see the module docs): marks
/// the doorbell as slept on and returns the value to sleep on. The caller
/// then checks its condition and sleeps on `doorbell` with this value
/// (a futex wait) only if the condition still does not hold.
pub fn begin_wait<W: Word>(doorbell: &W) -> u64 {
    let value = doorbell.fetch_or(DOORBELL_SLEEPING, Ordering::Relaxed) | DOORBELL_SLEEPING;
    W::fence(Ordering::SeqCst);
    value
}

/// The notifier's half, called after making a waiter's condition true: if
/// someone may sleep on `doorbell`, rings it (clears the sleeping bit and
/// counts a ring, so a wait on the old value returns) and returns true, and
/// the caller must then wake the doorbell's sleepers. Of several notifiers,
/// one rings; a doorbell no one sleeps on costs a fence and a load.
pub fn ring_doorbell<W: Word>(doorbell: &W) -> bool {
    W::fence(Ordering::SeqCst);
    let mut value = doorbell.load(Ordering::Relaxed);
    while value & DOORBELL_SLEEPING != 0 {
        let rung = (value | DOORBELL_SLEEPING).wrapping_add(1);
        match doorbell.compare_exchange(value, rung, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(current) => value = current,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    fn header(len: usize) -> RecordHeader {
        RecordHeader { len: len as u32, first: true, last: true }
    }

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        for (len, first, last) in [(0, true, true), (7, true, false), (u32::MAX, false, true), (9, false, false)] {
            let h = RecordHeader { len, first, last };
            assert_eq!(RecordHeader::decode(h.encode()), Some(h));
        }
        assert_eq!(RecordHeader::decode(0), None);
        assert_eq!(RecordHeader::decode(u64::MAX), None);
        assert_eq!(RecordHeader::decode(header(3).encode() | 1 << 40), None, "unknown bits");
        assert_eq!(header(0).record_words(), 1);
        assert_eq!(header(8).record_words(), 2);
        assert_eq!(header(9).record_words(), 3);
    }

    #[test]
    fn records_wrap_and_come_out_in_order_with_their_bytes() {
        let (head, tail, data) = (AtomicU64::new(0), AtomicU64::new(0), words(16));
        let ring = RingWords::new(&head, &tail, &data).unwrap();
        let mut producer = Producer::attach(&ring).unwrap();
        let mut consumer = Consumer::attach(&ring).unwrap();
        let mut next_expected = 0u32;
        for i in 0u32..500 {
            let payload: Vec<u8> = (0..(i % 37) as u8).map(|b| b ^ i as u8).collect();
            while !producer.push(&ring, header(payload.len()), &payload).unwrap() {
                // Full: drain one record, as a consumer would.
                let h = consumer.peek(&ring).unwrap().expect("a full ring has a record");
                let mut out = Vec::new();
                consumer.take(&ring, h, Some(&mut out));
                consumer.release(&ring);
                let expected: Vec<u8> = (0..(next_expected % 37) as u8).map(|b| b ^ next_expected as u8).collect();
                assert_eq!(out, expected);
                next_expected += 1;
            }
        }
        while let Some(h) = consumer.peek(&ring).unwrap() {
            let mut out = Vec::new();
            consumer.take(&ring, h, Some(&mut out));
            let expected: Vec<u8> = (0..(next_expected % 37) as u8).map(|b| b ^ next_expected as u8).collect();
            assert_eq!(out, expected);
            next_expected += 1;
        }
        consumer.release(&ring);
        assert_eq!(next_expected, 500);
        assert_eq!(head.load(Ordering::Relaxed), tail.load(Ordering::Relaxed));
    }

    #[test]
    fn a_full_ring_refuses_and_unpublished_words_stay_invisible() {
        let (head, tail, data) = (AtomicU64::new(0), AtomicU64::new(0), words(8));
        let ring = RingWords::new(&head, &tail, &data).unwrap();
        let mut producer = Producer::attach(&ring).unwrap();
        let mut consumer = Consumer::attach(&ring).unwrap();
        assert!(producer.push(&ring, header(16), &[1; 16]).unwrap()); // 3 words
        assert!(producer.push(&ring, header(16), &[2; 16]).unwrap()); // 6
        assert!(!producer.push(&ring, header(16), &[3; 16]).unwrap(), "3 more words do not fit in 2");
        assert!(producer.write(&ring, header(8), &[4; 8]).unwrap(), "2 words fit");
        assert_eq!(
            producer.write(&ring, header(64), &[0; 64]),
            Err(RingCorrupt("record larger than the ring")),
            "a record larger than the ring is refused, not waited for"
        );
        let mut seen = Vec::new();
        while let Some(h) = consumer.peek(&ring).unwrap() {
            let mut out = Vec::new();
            consumer.take(&ring, h, Some(&mut out));
            seen.push(out[0]);
        }
        assert_eq!(seen, [1, 2], "the unpublished record is not read");
        producer.publish(&ring);
        assert_eq!(consumer.peek(&ring).unwrap(), Some(header(8)));
    }

    #[test]
    fn inconsistent_words_are_reported_not_trusted() {
        let (head, tail, data) = (AtomicU64::new(0), AtomicU64::new(0), words(8));
        let ring = RingWords::new(&head, &tail, &data).unwrap();
        let mut consumer = Consumer::attach(&ring).unwrap();
        head.store(9, Ordering::Relaxed);
        assert_eq!(consumer.peek(&ring), Err(RingCorrupt("more words published than the ring holds")));
        head.store(2, Ordering::Relaxed);
        assert_eq!(consumer.peek(&ring), Err(RingCorrupt("a record header that is not one")));
        data[0].store(header(64).encode(), Ordering::Relaxed);
        assert_eq!(consumer.peek(&ring), Err(RingCorrupt("a record longer than what is published")));
        tail.store(3, Ordering::Relaxed);
        let mut producer = Producer { head: 2, tail_seen: 2 };
        assert_eq!(producer.free_words(&ring, 9), Err(RingCorrupt("tail beyond head")), "rereads the tail");
        assert!(RingWords::new(&head, &tail, &data[..6]).is_none(), "not a power of two");
    }

    #[test]
    fn the_doorbell_rings_once_per_wait_and_only_for_waiters() {
        let doorbell = AtomicU64::new(0);
        assert!(!ring_doorbell(&doorbell), "no one waits");
        let first = begin_wait(&doorbell);
        assert_eq!(begin_wait(&doorbell), first, "two waiters sleep on the same value");
        assert!(ring_doorbell(&doorbell));
        let rung = doorbell.load(Ordering::Relaxed);
        assert_ne!(rung, first, "a futex wait on the old value returns at once");
        assert_eq!(rung & DOORBELL_SLEEPING, 0);
        assert!(!ring_doorbell(&doorbell), "rung once: the next notifier makes no system call");
        let second = begin_wait(&doorbell);
        assert!(second > first);
        assert!(ring_doorbell(&doorbell));
    }
}
