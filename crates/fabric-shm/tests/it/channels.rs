//! Message channels on the `shm` backend: the backend-neutral scenarios of
//! `tierstack_testkit::channels`, on nodes of one process.
//!
//! The scenario of a bad channel byte on the wire has no wire to run on
//! here (messages travel in rings, whose channel is fixed when the ring is
//! made); its counterpart, a ring file naming a channel out of range or a
//! corrupt ring, refused without harming the receiver, is in `rings.rs`.

use tierstack_testkit::channels;

use channels::SEND_TIMEOUT;
use std::sync::Arc;
use tierstack_fabric::Fabric;
use tierstack_testkit::nodes::shm;

/// Nodes `0..n` under a fresh root, every send bounded by [`SEND_TIMEOUT`].
fn nodes(n: u32) -> (tempfile::TempDir, Vec<Arc<dyn Fabric>>) {
    let dir = tempfile::tempdir().unwrap();
    let fabrics = shm::nodes(dir.path(), n, SEND_TIMEOUT).into_iter().map(|f| f as Arc<dyn Fabric>).collect();
    (dir, fabrics)
}

#[test]
fn messages_stay_on_their_channel() {
    let (_dir, nodes) = nodes(2);
    channels::messages_stay_on_their_channel(nodes[0].clone(), nodes[1].clone());
}

#[test]
fn per_sender_order_holds_per_channel_with_several_senders() {
    let (_dir, nodes) = nodes(4);
    channels::per_sender_order_holds_per_channel(nodes[1..].to_vec(), nodes[0].clone());
}

#[test]
fn out_of_range_channels_are_typed_errors() {
    let (_dir, nodes) = nodes(2);
    channels::out_of_range_channels_are_typed_errors(nodes[0].as_ref(), nodes[1].as_ref());
}

#[test]
fn a_full_channel_holds_back_only_itself() {
    let (_dir, nodes) = nodes(2);
    let outcome = channels::a_full_channel_holds_back_only_itself(nodes[0].clone(), nodes[1].clone());
    assert_eq!(outcome, channels::FullChannelOutcome::EXPECTED);
}

#[test]
fn a_try_send_never_waits_on_a_full_channel() {
    let (_dir, nodes) = nodes(2);
    let outcome = channels::a_try_send_never_waits_on_a_full_channel(nodes[0].clone(), nodes[1].clone());
    assert_eq!(outcome, channels::TrySendOutcome::EXPECTED);
}
