//! The ring arithmetic under random interleavings of a sender and a
//! receiver: live file data never overlaps nor leaves the ring, a reservation
//! is refused only when it truly does not fit, and control slots are never
//! reused before the receiver consumed them.

use proptest::prelude::*;
use std::collections::VecDeque;
use tierstack_press::ring::{Full, ReceiverRing, RingLayout, SenderRing};

#[derive(Clone, Debug)]
enum Step {
    Send(u64),
    Consume,
}

proptest! {
    #[test]
    fn live_data_never_overlaps(steps in prop::collection::vec(prop_oneof![(1u64..400).prop_map(Step::Send), Just(Step::Consume)], 0..200)) {
        let layout = RingLayout { nodes: 2, entries: 5, data_bytes: 1000 };
        let mut sender = SenderRing::new();
        let mut receiver = ReceiverRing::default();
        // In flight: (seq, start, len), oldest first.
        let mut live: VecDeque<(u64, u64, u64)> = VecDeque::new();
        for step in steps {
            match step {
                Step::Send(len) => {
                    if !sender.has_entry(&layout, receiver.last_seq) {
                        prop_assert_eq!(live.len() as u64, layout.entries);
                        continue;
                    }
                    let before = sender;
                    match sender.reserve_data(&layout, len, receiver.released) {
                        Ok(start) => {
                            let seq = sender.take_entry(&layout, receiver.last_seq).unwrap();
                            prop_assert!(start >= before.head && start + len == sender.head);
                            let pos = start % layout.data_bytes;
                            prop_assert!(pos + len <= layout.data_bytes, "contiguous");
                            for &(_, s, l) in &live {
                                let p = s % layout.data_bytes;
                                prop_assert!(pos + len <= p || p + l <= pos, "overlap");
                            }
                            // Distinct slots for all live entries.
                            for &(q, _, _) in &live {
                                prop_assert_ne!(layout.entry_offset(1, q), layout.entry_offset(1, seq));
                            }
                            live.push_back((seq, start, len));
                        }
                        Err(Full::Data) => {
                            prop_assert_eq!(sender, before);
                            // Truly no room: the used span plus any skip plus len exceeds the ring.
                            let pos = before.head % layout.data_bytes;
                            let skip = if pos + len > layout.data_bytes { layout.data_bytes - pos } else { 0 };
                            prop_assert!(before.head + skip + len - receiver.released > layout.data_bytes);
                        }
                        Err(other) => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                Step::Consume => {
                    if let Some((seq, start, len)) = live.pop_front() {
                        prop_assert!(receiver.is_next(seq));
                        receiver.consume();
                        receiver.release(start, len);
                    }
                }
            }
        }
    }
}
