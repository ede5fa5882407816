//! Transfers naming local registered memory on the shm backend: the shared
//! conformance suite (`tierstack_testkit::transfers`),
//! one pair of nodes per test. Here every transfer is one copy, mapping to
//! mapping, executed by the caller's thread.

use tierstack_testkit::transfers as suite;

use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::ShmFabric;
use tierstack_testkit::nodes::shm;

/// Node 0 owns the remote regions; node 1 operates on them.
fn pair() -> (tempfile::TempDir, Arc<ShmFabric>, Arc<ShmFabric>) {
    let dir = tempfile::tempdir().unwrap();
    let (owner, peer) = shm::pair(dir.path());
    (dir, owner, peer)
}

#[test]
fn round_trips_match_plain_reads_and_writes() {
    let (_dir, owner, peer) = pair();
    suite::round_trips_match_plain_reads_and_writes(owner.as_ref(), peer.as_ref());
}

#[test]
fn large_transfers_round_trip() {
    let (_dir, owner, peer) = pair();
    suite::large_transfers_round_trip(owner.as_ref(), peer.as_ref());
}

#[test]
fn bounds_errors_are_typed_and_execute_nothing() {
    let (_dir, owner, peer) = pair();
    suite::bounds_errors_are_typed_and_execute_nothing(owner.as_ref(), peer.as_ref());
}

#[test]
fn alignment_follows_the_same_phase_rule() {
    let (_dir, owner, peer) = pair();
    suite::alignment_follows_the_same_phase_rule(owner.as_ref(), peer.as_ref());
}

#[test]
fn a_batch_mixes_old_and_new_ops() {
    let (_dir, owner, peer) = pair();
    suite::a_batch_mixes_old_and_new_ops(owner.as_ref(), peer.as_ref());
}

#[test]
fn a_view_sees_the_bytes_that_arrived_before_it() {
    let (_dir, owner, peer) = pair();
    suite::a_view_sees_the_bytes_that_arrived_before_it(owner.as_ref(), peer.as_ref());
}

/// The owner closes its node (its regions are revoked): the peer's mapping
/// is still there, but every transfer fails with `PeerDead`.
#[test]
fn words_read_at_once_match_a_batch_of_reads() {
    let (_dir, owner, peer) = pair();
    let (_at_owner_keep, remote) = {
        let region = owner.register("xfer.words.offered", 64, tierstack_fabric::Access::all()).unwrap();
        (region, peer.connect(NodeId(0), "xfer.words.offered").unwrap())
    };
    // shm offers it: the suite below is not passed trivially.
    assert!(remote.read_words_now(&[0], &mut [0u64; 1]).is_some());
    suite::words_read_at_once_match_a_batch_of_reads(owner.as_ref(), peer.as_ref());
}

#[test]
fn words_read_at_once_from_a_dead_peer_fail() {
    let (_dir, owner, peer) = pair();
    let (remote, _local) = suite::before_the_owner_dies(owner.as_ref(), peer.as_ref());
    drop(owner);
    assert!(remote.read_words_now(&[0], &mut [0u64; 1]).is_some());
    suite::words_read_at_once_from_a_dead_peer_fail(remote.as_ref());
}

#[test]
fn read_into_a_dead_peer_is_peer_dead() {
    let (_dir, owner, peer) = pair();
    let (remote, local) = suite::before_the_owner_dies(owner.as_ref(), peer.as_ref());
    drop(owner);
    suite::read_into_a_dead_peer_fails_and_writes_nothing(remote.as_ref(), &local);
}
