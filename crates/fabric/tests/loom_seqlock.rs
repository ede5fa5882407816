//! Model-checks the seqlock word protocol over all interleavings loom explores:
//! a reader that accepts a payload never sees a mix of two writes.
//! Run with: RUSTFLAGS="--cfg tierstack_loom" cargo test -p tierstack-fabric --test loom_seqlock --release
#![cfg(tierstack_loom)]
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use tierstack_fabric::seqlock::{read_words, write_words};

#[test]
fn accepted_reads_are_never_torn() {
    loom::model(|| {
        let words: Arc<[AtomicU64; 3]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        let writer_words = words.clone();
        let writer = loom::thread::spawn(move || {
            write_words(&writer_words[..], &[1, 1]);
            write_words(&writer_words[..], &[2, 2]);
        });
        let mut out = [0u64; 2];
        if let Some(sequence) = read_words(&words[..], &mut out) {
            assert_eq!(out[0], out[1], "torn payload accepted");
            assert_eq!(out[0], sequence / 2, "payload does not match its sequence");
        }
        writer.join().unwrap();
    });
}
