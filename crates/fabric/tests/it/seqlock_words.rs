//! The word-level seqlock protocol on std atomics (loom checks interleavings
//! under `--cfg tierstack_loom`; these check the values, on every build).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tierstack_fabric::seqlock::{read_words, write_words, Word};

fn words(values: &[u64]) -> Vec<AtomicU64> {
    values.iter().map(|v| AtomicU64::new(*v)).collect()
}

#[test]
fn a_write_bumps_the_sequence_by_two_and_stores_the_payload() {
    let record = words(&[4, 0, 0]);
    write_words(&record, &[7, 8]);
    let values: Vec<u64> = record.iter().map(|w| w.load(Ordering::Relaxed)).collect();
    assert_eq!(values, vec![6, 7, 8]);
    let mut out = [0u64; 2];
    assert_eq!(read_words(&record, &mut out), Some(6), "an untorn read returns the sequence it saw");
    assert_eq!(out, [7, 8]);
}

#[test]
fn a_write_in_progress_is_refused() {
    let record = words(&[5, 1, 2]);
    let mut out = [0u64; 2];
    assert_eq!(read_words(&record, &mut out), None);
}

/// A sequence word whose loads return scripted values: a writer that
/// completes a whole write between the reader's two sequence loads.
struct Scripted {
    loads: Vec<u64>,
    next: AtomicUsize,
}

impl Word for Scripted {
    fn load(&self, _: Ordering) -> u64 {
        self.loads[self.next.fetch_add(1, Ordering::Relaxed).min(self.loads.len() - 1)]
    }
    fn store(&self, _: u64, _: Ordering) {}
    fn fetch_or(&self, _: u64, _: Ordering) -> u64 {
        unreachable!("the seqlock never calls fetch_or")
    }
    fn compare_exchange(&self, _: u64, _: u64, _: Ordering, _: Ordering) -> Result<u64, u64> {
        unreachable!("the seqlock never calls compare_exchange")
    }
    fn fence(_: Ordering) {}
}

#[test]
fn sequences_that_differ_are_refused_even_when_both_are_even() {
    let scripted = |first: u64, second: u64| {
        vec![
            Scripted { loads: vec![first, second], next: AtomicUsize::new(0) },
            Scripted { loads: vec![9], next: AtomicUsize::new(0) },
        ]
    };
    let mut out = [0u64; 1];
    assert_eq!(read_words(&scripted(2, 4), &mut out), None, "a write completed in between");
    assert_eq!(read_words(&scripted(3, 3), &mut out), None, "a writer stopped mid-write");
    assert_eq!(read_words(&scripted(8, 8), &mut out), Some(8));
    assert_eq!(out, [9]);
}
