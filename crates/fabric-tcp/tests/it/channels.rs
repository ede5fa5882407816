//! Message channels on the `tcp` backend: the backend-neutral scenarios of
//! `tierstack_testkit::channels`, on loopback nodes of one process.

use crate::common;
use tierstack_testkit::channels;

use channels::{RawStream, BOUND, SEND_TIMEOUT};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::Fabric;

/// `n` loopback nodes with ids from `first`, every send bounded by [`SEND_TIMEOUT`].
fn nodes(first: u32, n: u32) -> Vec<Arc<dyn Fabric>> {
    common::cluster(first, n, SEND_TIMEOUT).into_iter().map(|f| f as Arc<dyn Fabric>).collect()
}

/// A raw connection to a node's listener, where message connections arrive.
fn raw_to(addr: SocketAddr) -> Box<dyn RawStream> {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(BOUND)).unwrap();
    Box::new(stream)
}

#[test]
fn messages_stay_on_their_channel() {
    let nodes = nodes(0, 2);
    channels::messages_stay_on_their_channel(nodes[0].clone(), nodes[1].clone());
}

#[test]
fn per_sender_order_holds_per_channel_with_several_senders() {
    let nodes = nodes(0, 4);
    channels::per_sender_order_holds_per_channel(nodes[1..].to_vec(), nodes[0].clone());
}

#[test]
fn out_of_range_channels_are_typed_errors() {
    let nodes = nodes(0, 2);
    channels::out_of_range_channels_are_typed_errors(nodes[0].as_ref(), nodes[1].as_ref());
}

#[test]
fn a_bad_channel_byte_on_the_wire_closes_that_connection_only() {
    let nodes = common::cluster(0, 2, SEND_TIMEOUT);
    let addr = nodes[1].local_addr();
    let open_raw = || raw_to(addr);
    channels::a_bad_channel_byte_on_the_wire_closes_that_connection_only(
        &open_raw,
        NodeId(7),
        nodes[0].as_ref(),
        nodes[1].as_ref(),
    );
}

#[test]
fn a_full_channel_holds_back_only_itself() {
    let nodes = nodes(0, 2);
    let outcome = channels::a_full_channel_holds_back_only_itself(nodes[0].clone(), nodes[1].clone());
    assert_eq!(outcome, channels::FullChannelOutcome::EXPECTED);
}

#[test]
fn a_try_send_never_waits_on_a_full_channel() {
    let nodes = nodes(0, 2);
    let outcome = channels::a_try_send_never_waits_on_a_full_channel(nodes[0].clone(), nodes[1].clone());
    assert_eq!(outcome, channels::TrySendOutcome::EXPECTED);
}
