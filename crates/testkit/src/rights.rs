//! The conformance scenarios of access rights on registered memory
//! ([`tierstack_fabric::Access`]), written once against the `Fabric` trait
//! so every backend is held to the same rule: an operation the owner did
//! not grant the posting node fails with `Forbidden`, changes nothing, and
//! leaves the allowed operations working.
//!
//! Each function takes an `owner` (registers the regions) and peers that
//! connect to them, and uses region names of its own.

use crate::transfers::{contents, pattern};
use tierstack_fabric::{Access, Fabric, FabricError, LocalSlice, Op, OpResult, RemoteRegion, Rights};

const BYTES: u64 = 256;

/// Asserts that `result` is `Forbidden` for `node` needing `needed`.
#[track_caller]
fn assert_forbidden<T: std::fmt::Debug>(result: Result<T, FabricError>, node: &dyn Fabric, needed: Rights) {
    match result {
        Err(FabricError::Forbidden { node: who, needed: what, .. }) => {
            assert_eq!((who, what), (node.local_node(), needed), "the error names the poster and the right");
        }
        other => panic!("expected Forbidden ({needed}) for {}, got {other:?}", node.local_node()),
    }
}

/// Every writing and atomic operation `peer` can post to `remote`, each
/// expected to be refused with the right it needs.
fn assert_modifications_forbidden(peer: &dyn Fabric, remote: &dyn RemoteRegion) {
    let local = peer.register(&format!("rights-src-{}", remote.name()), 64, Access::all()).unwrap();
    local.memory().write(0, &[0xee; 64]).unwrap();
    let source = LocalSlice::new(local.clone(), 0, 16);
    assert_forbidden(remote.write(8, &[1; 8]), peer, Rights::WRITE);
    assert_forbidden(remote.write_from(8, &source), peer, Rights::WRITE);
    assert_forbidden(remote.fetch_add(8, 1), peer, Rights::ATOMIC);
    assert_forbidden(remote.compare_swap(8, 0, 1), peer, Rights::ATOMIC);
    assert_forbidden(remote.post(vec![Op::Write { offset: 0, data: vec![9; 8] }]).wait(), peer, Rights::WRITE);
    assert_forbidden(remote.post(vec![Op::WriteFrom { offset: 16, source }]).wait(), peer, Rights::WRITE);
    // A forbidden op anywhere in a batch refuses the whole batch.
    let mixed = vec![Op::Read { offset: 0, len: 8 }, Op::CompareSwap { offset: 0, expected: 0, new: 1 }];
    assert_forbidden(remote.post(mixed).wait(), peer, Rights::ATOMIC);
    let mixed = vec![Op::Read { offset: 0, len: 8 }, Op::FetchAdd { offset: 0, delta: 1 }];
    assert_forbidden(remote.post(mixed).wait(), peer, Rights::ATOMIC);
}

/// Every read `peer` can post to `remote` works and sees `expected`.
fn assert_reads_work(peer: &dyn Fabric, remote: &dyn RemoteRegion, expected: &[u8]) {
    let mut all = vec![0u8; expected.len()];
    remote.read(0, &mut all).unwrap();
    assert_eq!(all, expected);
    let word = u64::from_ne_bytes(expected[8..16].try_into().unwrap());
    assert_eq!(remote.read_u64(8).unwrap(), word);
    let results = remote.post(vec![Op::Read { offset: 8, len: 8 }]).wait().unwrap();
    assert_eq!(results, vec![OpResult::Read(expected[8..16].to_vec())]);
    let mut words = [0u64; 2];
    if let Some(result) = remote.read_words_now(&[8, 16], &mut words) {
        result.unwrap();
        assert_eq!(words[0], word);
    }
    let target = peer.register(&format!("rights-dst-{}", remote.name()), 64, Access::all()).unwrap();
    remote.read_into(0, &LocalSlice::new(target.clone(), 0, 32)).unwrap();
    assert_eq!(contents(target.memory())[..32], expected[..32]);
}

/// A region registered read-only (a version table, to a proxy): every
/// write and atomic of a peer is `Forbidden` and changes nothing; its
/// reads work.
pub fn a_read_only_region_refuses_a_peers_writes_and_atomics(owner: &dyn Fabric, peer: &dyn Fabric) {
    let region = owner.register("rights-vt", BYTES, Access::read_only()).unwrap();
    let before = pattern(BYTES as usize, 7);
    region.memory().write(0, &before).unwrap();
    let remote = peer.connect(owner.local_node(), "rights-vt").unwrap();
    assert_modifications_forbidden(peer, remote.as_ref());
    assert_eq!(contents(region.memory()), before, "a refused operation changed the region");
    assert_reads_work(peer, remote.as_ref(), &before);
}

/// A per-node grant (`read_only().grant(writer, ALL)`) lets that node write
/// and use atomics, and no other.
pub fn a_grant_allows_its_node_only(owner: &dyn Fabric, reader: &dyn Fabric, writer: &dyn Fabric) {
    let access = Access::read_only().grant(writer.local_node(), Rights::ALL);
    let region = owner.register("rights-granted", BYTES, access).unwrap();
    let by_writer = writer.connect(owner.local_node(), "rights-granted").unwrap();
    by_writer.write(0, &[5; 8]).unwrap();
    assert_eq!(by_writer.fetch_add(8, 3).unwrap(), 0);
    assert_eq!(by_writer.compare_swap(8, 3, 4).unwrap(), 3);
    by_writer.post(vec![Op::Write { offset: 16, data: vec![6; 8] }]).wait().unwrap();
    let after_writer = contents(region.memory());
    assert_eq!(after_writer[..8], [5; 8]);
    assert_eq!(region.memory().load_u64(8).unwrap(), 4);
    assert_eq!(after_writer[16..24], [6; 8]);

    let by_reader = reader.connect(owner.local_node(), "rights-granted").unwrap();
    assert_modifications_forbidden(reader, by_reader.as_ref());
    assert_eq!(contents(region.memory()), after_writer, "the reader's refused operations changed the region");
    assert_reads_work(reader, by_reader.as_ref(), &after_writer);
}

/// Read, write and atomic are granted separately, as RDMA's access flags:
/// lock words atomic-only, a ring write-only, a region with no rights.
pub fn rights_are_granted_separately(owner: &dyn Fabric, peer: &dyn Fabric) {
    let locks = owner.register("rights-locks", BYTES, Access::new(Rights::ATOMIC)).unwrap();
    let remote = peer.connect(owner.local_node(), "rights-locks").unwrap();
    assert_eq!(remote.fetch_add(0, 2).unwrap(), 0);
    assert_eq!(remote.compare_swap(0, 2, 9).unwrap(), 2);
    assert_forbidden(remote.write(0, &[1; 8]), peer, Rights::WRITE);
    assert_forbidden(remote.read_u64(0), peer, Rights::READ);
    assert_forbidden(remote.post(vec![Op::Read { offset: 0, len: 8 }]).wait(), peer, Rights::READ);
    assert_eq!(locks.memory().load_u64(0).unwrap(), 9);

    let ring = owner.register("rights-ring", BYTES, Access::new(Rights::WRITE)).unwrap();
    let remote = peer.connect(owner.local_node(), "rights-ring").unwrap();
    remote.write(0, &[3; 8]).unwrap();
    assert_eq!(contents(ring.memory())[..8], [3; 8]);
    let mut buf = [0u8; 8];
    assert_forbidden(remote.read(0, &mut buf), peer, Rights::READ);
    if let Some(result) = remote.read_words_now(&[0], &mut [0]) {
        assert_forbidden(result, peer, Rights::READ);
    }
    assert_forbidden(remote.fetch_add(0, 1), peer, Rights::ATOMIC);

    owner.register("rights-none", BYTES, Access::new(Rights::NONE)).unwrap();
    // A backend may refuse the handle itself (ucx hands out no remote key
    // for a region a peer has no right on), or every operation on it.
    match peer.connect(owner.local_node(), "rights-none") {
        Err(FabricError::Forbidden { granted: Rights::NONE, .. }) => {}
        Err(other) => panic!("connecting to a region without rights: {other}"),
        Ok(remote) => {
            assert_forbidden(remote.read_u64(0), peer, Rights::READ);
            assert_forbidden(remote.write(0, &[1; 8]), peer, Rights::WRITE);
            assert_forbidden(remote.compare_swap(0, 0, 1), peer, Rights::ATOMIC);
        }
    }
}
