//! A full inbox on either backend: the same scenario, the same observable
//! outcome. The receiver stops draining; the sender is held back (its sends
//! wait) instead of its messages being dropped, and once the receiver drains,
//! every message arrives, in send order.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::limits::INBOX_MESSAGES_MAX;
use tierstack_base::NodeId;
use tierstack_cluster::{local_cluster_with_timeout, Backend};
use tierstack_fabric::Channel;

/// Messages that fill the inbox, then large ones that exceed every socket
/// buffer between the nodes (loopback TCP buffers reach a few tens of MiB;
/// Unix sockets hold far less): a sender that is really held back cannot
/// finish while the inbox stays full.
const SMALL_MESSAGES: usize = INBOX_MESSAGES_MAX;
const LARGE_MESSAGES: usize = 1024;
const LARGE_MESSAGE_BYTES: usize = 64 * 1024;
const TOTAL: usize = SMALL_MESSAGES + LARGE_MESSAGES;

/// Longer than the test needs to fill and drain the inbox: a send waits for
/// room rather than timing out (a timeout would be a typed error, not a loss,
/// but it is not this scenario).
const SEND_TIMEOUT: Duration = Duration::from_secs(25);
/// A bound on every wait, only so that a broken backend fails instead of hanging.
const BOUND: Duration = Duration::from_secs(25);

fn payload(seq: usize) -> Vec<u8> {
    let mut payload = (seq as u64).to_le_bytes().to_vec();
    if seq >= SMALL_MESSAGES {
        payload.resize(LARGE_MESSAGE_BYTES, 0x5a);
    }
    payload
}

#[derive(Debug, PartialEq)]
struct Outcome {
    inbox_filled_while_sender_held: bool,
    one_sided_ops_unaffected: bool,
    send_errors: usize,
    received_in_order: usize,
}

fn full_inbox_scenario(backend: Backend) -> Outcome {
    let cluster = local_cluster_with_timeout(backend, 2, SEND_TIMEOUT).unwrap();
    let sender = Arc::clone(cluster.fabric(0));
    let receiver = Arc::clone(cluster.fabric(1));
    let counter = receiver.register("counter", 8, tierstack_fabric::Access::all()).unwrap();
    let to_counter = cluster.fabric(0).connect(NodeId(1), "counter").unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let sent_by_thread = Arc::clone(&sent);
    let sending = std::thread::spawn(move || {
        let mut errors = 0;
        for seq in 0..TOTAL {
            if let Err(e) = sender.send(NodeId(1), Channel::TEST, &payload(seq)) {
                eprintln!("send {seq} failed: {e}");
                errors += 1;
            }
            sent_by_thread.fetch_add(1, Ordering::Release);
        }
        errors
    });

    // The receiver does not drain until its inbox is full.
    let deadline = tierstack_base::time::instant_now() + BOUND;
    while receiver.inbox(Channel::TEST).len() < INBOX_MESSAGES_MAX && tierstack_base::time::instant_now() < deadline {
        std::thread::yield_now();
    }
    let filled = receiver.inbox(Channel::TEST).len() == INBOX_MESSAGES_MAX;
    // With the inbox full and not drained, the sender cannot have finished:
    // the rest of its messages do not fit in the buffers between the nodes.
    let held = sent.load(Ordering::Acquire) < TOTAL;
    // Messages held back never delay one-sided operations between the same nodes.
    let one_sided_ops_unaffected = to_counter.fetch_add(0, 1) == Ok(0)
        && counter.memory().load_u64(0) == Ok(1)
        && sent.load(Ordering::Acquire) < TOTAL;

    let mut received_in_order = 0;
    while received_in_order < TOTAL {
        let Ok(message) = receiver.inbox(Channel::TEST).recv_timeout(BOUND) else { break };
        assert_eq!(message.from, NodeId(0));
        let seq = u64::from_le_bytes(message.payload[..8].try_into().unwrap()) as usize;
        assert_eq!(seq, received_in_order, "{}: messages arrive in send order, none skipped", backend.name());
        assert_eq!(message.payload, payload(seq));
        received_in_order += 1;
    }
    let send_errors = sending.join().unwrap();
    assert!(receiver.inbox(Channel::TEST).is_empty());
    Outcome { inbox_filled_while_sender_held: filled && held, one_sided_ops_unaffected, send_errors, received_in_order }
}

#[test]
fn a_full_inbox_holds_the_sender_back_and_loses_nothing_on_both_backends() {
    let expected = Outcome {
        inbox_filled_while_sender_held: true,
        one_sided_ops_unaffected: true,
        send_errors: 0,
        received_in_order: TOTAL,
    };
    for backend in [Backend::Shm, Backend::Tcp] {
        assert_eq!(full_inbox_scenario(backend), expected, "backend {}", backend.name());
    }
}
