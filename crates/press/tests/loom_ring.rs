//! Model-checks the remote-write rings' protocol (seed §4.2; `press::ring`
//! for the arithmetic, `press-node`'s `rings` for the runtime) over all the
//! interleavings loom explores, with the memory operations modelled as
//! `RegionMemory` performs them on `shm`: a write is a release fence then
//! relaxed word stores, in order; a read is relaxed word loads then an
//! acquire fence.
//!
//! A sender writes three files through a ring of two control slots and a
//! data ring of a few words, so slots and data wrap and the sender must
//! wait for credits (one test per kind of credit): per message, the data word(s), the entry's payload
//! word, then the sequence word last. The receiver polls the next slot's
//! sequence word, reads the entry and the data, and overwrites its two
//! credit words in the sender's memory. Checked: every message arrives
//! once, in order, with its entry and data whole (never a previous lap's),
//! and the sender never overwrites a slot or data word the receiver has not
//! released.
//!
//! Run with: RUSTFLAGS="--cfg tierstack_loom" cargo test -p tierstack-press --test loom_ring --release
#![cfg(tierstack_loom)]
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;
use tierstack_press::ring::{ReceiverRing, RingLayout, SenderRing};

const ENTRIES: u64 = 2;

/// Word-addressed memory: the receiver's rings, then the sender's credit words.
struct Memory {
    /// Per slot: payload word, sequence word.
    slots: Vec<AtomicU64>,
    data: Vec<AtomicU64>,
    /// In the sender's region: entries consumed, data words released.
    credits: [AtomicU64; 2],
}

fn write(words: &[(&AtomicU64, u64)]) {
    fence(Ordering::Release);
    for (word, value) in words {
        word.store(*value, Ordering::Relaxed);
    }
}

fn read(word: &AtomicU64) -> u64 {
    let v = word.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    v
}

/// Message `m`'s file: `sizes[m]` words, word `k` being `100 * (m + 1) + k`.
fn file(sizes: &[u64], m: u64) -> Vec<u64> {
    (0..sizes[m as usize]).map(|k| 100 * (m + 1) + k).collect()
}

/// Files of 1, 2, 1 words through 3 data words: message 1 skips nothing,
/// message 2 wraps to word 0 and must wait for message 0's release (the
/// data check holds it).
#[test]
fn data_wraps_and_waits_for_its_release() {
    check(3, &[1, 2, 1]);
}

/// Files of 1, 2, 1 words through 4 data words: message 2 fits the data
/// ring but needs slot 0 back (only the entry check holds it).
#[test]
fn slots_wait_for_their_consumption() {
    check(4, &[1, 2, 1]);
}

fn check(data_words: u64, sizes: &'static [u64]) {
    let messages = sizes.len() as u64;
    loom::model(move || {
        let layout = RingLayout { nodes: 1, entries: ENTRIES, data_bytes: data_words };
        let memory = Arc::new(Memory {
            slots: (0..2 * ENTRIES).map(|_| AtomicU64::new(0)).collect(),
            data: (0..data_words).map(|_| AtomicU64::new(0)).collect(),
            credits: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let sender_memory = memory.clone();
        let sender = loom::thread::spawn(move || {
            let m = &sender_memory;
            let mut ring = SenderRing::new();
            for msg in 0..messages {
                let data = file(sizes, msg);
                let (seq, start) = loop {
                    // The credit words, as the receiver last wrote them.
                    let consumed = read(&m.credits[0]);
                    let released = read(&m.credits[1]);
                    if ring.has_entry(&layout, consumed) {
                        if let Ok(start) = ring.reserve_data(&layout, data.len() as u64, released) {
                            break (ring.take_entry(&layout, consumed).unwrap(), start);
                        }
                    }
                    loom::thread::yield_now();
                };
                // Data words (positions are in words here), the entry's
                // payload (the data's start and length), the sequence word last.
                let slot = ((seq - 1) % ENTRIES) as usize;
                let mut words: Vec<(&AtomicU64, u64)> = Vec::new();
                for (k, value) in data.iter().enumerate() {
                    words.push((&m.data[((start + k as u64) % data_words) as usize], *value));
                }
                words.push((&m.slots[2 * slot], (start << 8) | data.len() as u64));
                write(&words);
                write(&[(&m.slots[2 * slot + 1], seq)]);
            }
        });
        let mut ring = ReceiverRing::default();
        for msg in 0..messages {
            let seq = ring.last_seq + 1;
            let slot = ((seq - 1) % ENTRIES) as usize;
            loop {
                let seq_word = read(&memory.slots[2 * slot + 1]);
                if ring.is_next(seq_word) {
                    break;
                }
                assert!(seq_word < seq, "a sequence number from the future: {seq_word} before {seq}");
                loom::thread::yield_now();
            }
            let entry = read(&memory.slots[2 * slot]);
            let (start, len) = (entry >> 8, entry & 0xff);
            let got: Vec<u64> = (0..len).map(|k| read(&memory.data[((start + k) % data_words) as usize])).collect();
            assert_eq!(got, file(sizes, msg), "message {msg} arrives whole, in order, not a previous lap's");
            ring.consume();
            ring.release(start, len);
            write(&[(&memory.credits[0], ring.last_seq), (&memory.credits[1], ring.released)]);
        }
        sender.join().unwrap();
    });
}
