//! Model-checks the message ring's word protocols (`tierstack_fabric_shm::ring`)
//! over all interleavings loom explores:
//! - one producer and one consumer on a ring small enough to wrap and fill:
//!   every record arrives once, in order, with its bytes, never torn;
//! - a producer that stops between writing a record and publishing it (as
//!   a crash would) leaves nothing readable;
//! - the doorbell: a waiter that decides to sleep is always either woken
//!   (the doorbell moved past the value it sleeps on, and the producer that
//!   moved it makes the wake-up call) or finds the record; of two notifiers
//!   of one sleeper exactly one makes the call.
//!
//! Run with: RUSTFLAGS="--cfg tierstack_loom" cargo test -p tierstack-fabric-shm --test loom_ring --release
#![cfg(tierstack_loom)]
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use std::sync::atomic::Ordering;
use tierstack_fabric_shm::ring::{begin_wait, ring_doorbell, Consumer, Producer, RecordHeader, RingWords};

/// head, tail, then the data words.
fn ring_words(data: usize) -> Arc<Vec<AtomicU64>> {
    Arc::new((0..2 + data).map(|_| AtomicU64::new(0)).collect())
}

fn ring(words: &[AtomicU64]) -> RingWords<'_, AtomicU64> {
    RingWords::new(&words[0], &words[1], &words[2..]).expect("a power of two")
}

fn header(len: usize) -> RecordHeader {
    RecordHeader { len: len as u32, first: true, last: true }
}

/// Record `i`'s payload: 9 bytes (two words), each `i + 1`, so a torn or
/// misplaced word shows.
fn payload(i: u8) -> Vec<u8> {
    vec![i + 1; 9]
}

#[test]
fn records_arrive_once_in_order_and_whole_through_a_wrapping_full_ring() {
    const RECORDS: u8 = 3;
    loom::model(|| {
        // 4 data words and records of 3 (a header, two payload words): the
        // ring holds one record at a time, the second and third wrap around
        // its end, and the producer must wait for the consumer.
        let words = ring_words(4);
        let producer_words = words.clone();
        let producer = loom::thread::spawn(move || {
            let ring = ring(&producer_words);
            let mut producer = Producer::attach(&ring).unwrap();
            for i in 0..RECORDS {
                let payload = payload(i);
                while !producer.push(&ring, header(payload.len()), &payload).unwrap() {
                    loom::thread::yield_now();
                }
            }
        });
        let ring = ring(&words);
        let mut consumer = Consumer::attach(&ring).unwrap();
        for i in 0..RECORDS {
            let header = loop {
                match consumer.peek(&ring).unwrap() {
                    Some(header) => break header,
                    None => loom::thread::yield_now(),
                }
            };
            let mut out = Vec::new();
            consumer.take(&ring, header, Some(&mut out));
            consumer.release(&ring);
            assert_eq!(out, payload(i), "record {i} arrives whole and in order");
        }
        producer.join().unwrap();
        assert_eq!(consumer.peek(&ring).unwrap(), None, "nothing arrives twice");
    });
}

#[test]
fn a_record_written_but_never_published_is_never_read() {
    loom::model(|| {
        let words = ring_words(8);
        let producer_words = words.clone();
        let producer = loom::thread::spawn(move || {
            let ring = ring(&producer_words);
            let mut producer = Producer::attach(&ring).unwrap();
            assert!(producer.push(&ring, header(9), &payload(4)).unwrap());
            // Written, then the producer "dies" before publishing.
            assert!(producer.write(&ring, header(9), &payload(1)).unwrap());
        });
        let ring = ring(&words);
        let mut consumer = Consumer::attach(&ring).unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            if let Some(header) = consumer.peek(&ring).unwrap() {
                let mut out = Vec::new();
                consumer.take(&ring, header, Some(&mut out));
                seen.push(out);
            }
        }
        producer.join().unwrap();
        while let Some(header) = consumer.peek(&ring).unwrap() {
            let mut out = Vec::new();
            consumer.take(&ring, header, Some(&mut out));
            seen.push(out);
        }
        assert_eq!(seen, vec![payload(4)], "only the published record");
    });
}

#[test]
fn a_waiter_that_sleeps_is_always_woken_or_sees_the_record() {
    loom::model(|| {
        // head, tail, data (2 words), doorbell.
        let words: Arc<Vec<AtomicU64>> = Arc::new((0..5).map(|_| AtomicU64::new(0)).collect());
        let producer_words = words.clone();
        let producer = loom::thread::spawn(move || {
            let ring = RingWords::new(&producer_words[0], &producer_words[1], &producer_words[2..4]).unwrap();
            let mut producer = Producer::attach(&ring).unwrap();
            assert!(producer.push(&ring, header(0), &[]).unwrap());
            ring_doorbell(&producer_words[4])
        });
        let ring = RingWords::new(&words[0], &words[1], &words[2..4]).unwrap();
        let mut consumer = Consumer::attach(&ring).unwrap();
        let doorbell = &words[4];
        let expected = begin_wait(doorbell);
        let found = consumer.has_records(&ring).unwrap();
        // If not found, the waiter sleeps now: the producer runs to its end
        // meanwhile.
        let rang = producer.join().unwrap();
        if !found {
            // A futex wait on `expected` returns only if the doorbell moved.
            assert_ne!(doorbell.load(Ordering::Relaxed), expected, "lost wake-up: asleep with a record waiting");
            assert!(rang, "the producer that moved it wakes the sleeper");
        }
    });
}

#[test]
fn of_two_notifiers_exactly_one_wakes_a_sleeper() {
    loom::model(|| {
        let doorbell = Arc::new(AtomicU64::new(0));
        let expected = begin_wait(&*doorbell);
        let notifiers: Vec<_> = (0..2)
            .map(|_| {
                let doorbell = doorbell.clone();
                loom::thread::spawn(move || ring_doorbell(&*doorbell))
            })
            .collect();
        let rang: Vec<bool> = notifiers.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(rang.iter().filter(|r| **r).count(), 1, "one wake-up call, not two, not none");
        assert_ne!(doorbell.load(Ordering::Relaxed), expected);
    });
}
