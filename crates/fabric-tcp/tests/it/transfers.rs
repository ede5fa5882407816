//! Transfers naming local registered memory on the tcp backend: the shared
//! conformance suite (`tierstack_testkit::transfers`), and
//! what only tcp can get wrong: a `ReadInto`'s data is copied from the
//! received frame into the local slice by the reader thread, so a late
//! answer (after a timeout) and a malformed answer must write nothing.

use crate::common;
use tierstack_testkit::transfers as suite;

use common::{cluster, node, Proxy};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Fabric, FabricError, LocalSlice, Op, OpResult, RemoteRegion};
use tierstack_fabric_tcp::{TcpConfig, TcpFabric};
use tierstack_fabric_wire::{read_frame, write_frame, Frame};

const TIMEOUT: Duration = Duration::from_secs(5);
const SHORT_TIMEOUT: Duration = Duration::from_millis(200);

/// Node 0 owns the remote regions; node 1 operates on them.
fn pair() -> (Arc<TcpFabric>, Arc<TcpFabric>) {
    let mut nodes = cluster(0, 2, TIMEOUT);
    let peer = nodes.pop().unwrap();
    (nodes.pop().unwrap(), peer)
}

#[test]
fn round_trips_match_plain_reads_and_writes() {
    let (owner, peer) = pair();
    suite::round_trips_match_plain_reads_and_writes(owner.as_ref(), peer.as_ref());
}

#[test]
fn words_read_at_once_match_a_batch_of_reads() {
    let (owner, peer) = pair();
    suite::words_read_at_once_match_a_batch_of_reads(owner.as_ref(), peer.as_ref());
}

#[test]
fn large_transfers_round_trip() {
    let (owner, peer) = pair();
    suite::large_transfers_round_trip(owner.as_ref(), peer.as_ref());
}

#[test]
fn bounds_errors_are_typed_and_execute_nothing() {
    let (owner, peer) = pair();
    suite::bounds_errors_are_typed_and_execute_nothing(owner.as_ref(), peer.as_ref());
}

#[test]
fn alignment_follows_the_same_phase_rule() {
    let (owner, peer) = pair();
    suite::alignment_follows_the_same_phase_rule(owner.as_ref(), peer.as_ref());
}

#[test]
fn a_batch_mixes_old_and_new_ops() {
    let (owner, peer) = pair();
    suite::a_batch_mixes_old_and_new_ops(owner.as_ref(), peer.as_ref());
}

#[test]
fn a_view_sees_the_bytes_that_arrived_before_it() {
    let (owner, peer) = pair();
    suite::a_view_sees_the_bytes_that_arrived_before_it(owner.as_ref(), peer.as_ref());
}

/// The owner shuts down (its listener closes): transfers fail with `PeerDead`.
#[test]
fn read_into_a_dead_peer_is_peer_dead() {
    let (owner, peer) = pair();
    let (remote, local) = suite::before_the_owner_dies(owner.as_ref(), peer.as_ref());
    drop(owner);
    suite::read_into_a_dead_peer_fails_and_writes_nothing(remote.as_ref(), &local);
}

/// A `ReadInto` that timed out never writes its target, even though its
/// answer arrives later: the answer finds no waiter and is dropped whole.
#[test]
fn a_read_into_that_timed_out_never_writes_its_target() {
    let owner = node(1, TIMEOUT);
    let at_owner = owner.register("slow", 64, tierstack_fabric::Access::all()).unwrap();
    at_owner.memory().write(0, &suite::pattern(64, 1)).unwrap();
    let proxy = Proxy::start(owner.local_addr());
    let client = TcpFabric::open(
        TcpConfig::new(NodeId(0), common::loopback()).with_op_timeout(SHORT_TIMEOUT).with_peer(NodeId(1), proxy.addr),
    )
    .unwrap();
    let local = client.register("slot", 64, tierstack_fabric::Access::all()).unwrap();
    let remote = client.connect(NodeId(1), "slow").unwrap();

    proxy.freeze_answers();
    let target = LocalSlice::new(local.clone(), 0, 64);
    assert_eq!(remote.read_into(0, &target), Err(FabricError::Timeout { node: NodeId(1), timeout_ms: 200 }));
    proxy.thaw();
    // Answers come back in order on the connection: once this one is in,
    // the late one was read (and dropped) before it.
    assert_eq!(remote.read_u64(8).unwrap(), u64::from_ne_bytes(suite::pattern(64, 1)[8..16].try_into().unwrap()));
    assert_eq!(suite::contents(local.memory()), vec![0; 64], "the late answer wrote nothing");
}

/// An owner answering a `ReadInto` batch with a wrong shape is a protocol
/// error, and no result of the batch is copied, not even the well-formed
/// ones before the bad one.
#[test]
fn a_malformed_answer_to_a_read_into_writes_nothing() {
    let listener = std::net::TcpListener::bind(common::loopback()).unwrap();
    let addr = listener.local_addr().unwrap();
    let fake_owner = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let next = |stream: &mut std::net::TcpStream| read_frame(stream).unwrap().unwrap();
        assert_eq!(next(&mut stream), Frame::Hello { node: NodeId(0) });
        let Frame::Lookup { request, .. } = next(&mut stream) else { panic!("expected a lookup") };
        write_frame(&mut stream, &Frame::LookupOk { request, region: 0, incarnation: 1, len: 64 }).unwrap();
        // Two reads of 8 bytes on the wire (they were ReadInto at the client):
        // the first answered right, the second with 3 bytes.
        let Frame::Ops { request, ops, .. } = next(&mut stream) else { panic!("expected ops") };
        assert_eq!(
            ops,
            vec![Op::Read { offset: 0, len: 8 }, Op::Read { offset: 8, len: 8 }],
            "plain reads on the wire"
        );
        let results = vec![OpResult::Read(vec![0xaa; 8]), OpResult::Read(vec![0xbb; 3])];
        write_frame(&mut stream, &Frame::OpsOk { request, results }).unwrap();
        // Then a well-formed answer, to show the connection goes on.
        let Frame::Ops { request, .. } = next(&mut stream) else { panic!("expected ops") };
        write_frame(&mut stream, &Frame::OpsOk { request, results: vec![OpResult::Read(vec![0xcc; 8])] }).unwrap();
        let _ = read_frame(&mut stream);
    });
    let client = node(0, TIMEOUT);
    client.add_peer(NodeId(6), addr);
    let local = client.register("slot", 16, tierstack_fabric::Access::all()).unwrap();
    let remote = client.connect(NodeId(6), "fake").unwrap();
    let err = remote
        .post(vec![
            Op::ReadInto { offset: 0, target: LocalSlice::new(local.clone(), 0, 8) },
            Op::ReadInto { offset: 8, target: LocalSlice::new(local.clone(), 8, 8) },
        ])
        .wait()
        .unwrap_err();
    assert!(matches!(err, FabricError::Protocol { node: NodeId(6), .. }), "{err:?}");
    assert_eq!(suite::contents(local.memory()), vec![0; 16], "no result of the bad answer was copied");
    remote.read_into(0, &LocalSlice::new(local.clone(), 8, 8)).unwrap();
    assert_eq!(suite::contents(local.memory()), [vec![0; 8], vec![0xcc; 8]].concat());
    drop(client);
    fake_owner.join().unwrap();
}

/// A node reaches its own region through its socket like any other.
#[test]
fn a_node_transfers_between_its_own_regions() {
    let nodes = cluster(0, 1, TIMEOUT);
    let me = &nodes[0];
    let from = me.register("from", 32, tierstack_fabric::Access::all()).unwrap();
    from.memory().write(0, &suite::pattern(32, 5)).unwrap();
    let to = me.register("to", 32, tierstack_fabric::Access::all()).unwrap();
    let remote: Arc<dyn RemoteRegion> = me.connect(NodeId(0), "to").unwrap();
    remote.write_from(0, &LocalSlice::new(from.clone(), 0, 32)).unwrap();
    assert_eq!(suite::contents(to.memory()), suite::pattern(32, 5));
}
