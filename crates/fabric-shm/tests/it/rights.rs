//! Access rights on the shm backend: the shared conformance scenarios
//! (`tierstack_testkit::rights`), and what only shm shows: a peer without
//! write or atomic rights maps the region file read-only, so even a bug
//! past the rights check could not write.

use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::{Access, Fabric, Rights};
use tierstack_fabric_shm::ShmFabric;
use tierstack_testkit::nodes::shm;
use tierstack_testkit::rights as suite;

/// Node 0 owns the regions; 1 and 2 are peers.
fn three() -> (tempfile::TempDir, Vec<Arc<ShmFabric>>) {
    let dir = tempfile::tempdir().unwrap();
    let nodes = shm::nodes(dir.path(), 3, std::time::Duration::from_secs(5));
    (dir, nodes)
}

#[test]
fn a_read_only_region_refuses_a_peers_writes_and_atomics() {
    let (_dir, nodes) = three();
    suite::a_read_only_region_refuses_a_peers_writes_and_atomics(nodes[0].as_ref(), nodes[1].as_ref());
}

#[test]
fn a_grant_allows_its_node_only() {
    let (_dir, nodes) = three();
    suite::a_grant_allows_its_node_only(nodes[0].as_ref(), nodes[2].as_ref(), nodes[1].as_ref());
}

#[test]
fn rights_are_granted_separately() {
    let (_dir, nodes) = three();
    suite::rights_are_granted_separately(nodes[0].as_ref(), nodes[1].as_ref());
}

/// The protection of every mapping of `file` in this process, from
/// `/proc/self/maps` (e.g. `rw-s`, `r--s`), sorted.
fn mapping_protections(file: &std::path::Path) -> Vec<String> {
    let file = file.canonicalize().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut protections: Vec<String> = maps
        .lines()
        .filter(|line| line.ends_with(&*file.to_string_lossy()))
        .map(|line| line.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    protections.sort();
    protections
}

#[test]
fn a_peer_without_write_or_atomic_rights_maps_the_region_read_only() {
    let (dir, nodes) = three();
    let access = Access::read_only().grant(NodeId(2), Rights::ATOMIC);
    let _region = nodes[0].register("vt", 4096, access).unwrap();
    let file = dir.path().join("node-0").join("r.vt");
    assert_eq!(mapping_protections(&file), ["rw-s"], "the owner's own mapping");
    let reader = nodes[1].connect(NodeId(0), "vt").unwrap();
    assert_eq!(mapping_protections(&file), ["r--s", "rw-s"], "the read-only peer's mapping is not writable");
    let atomic = nodes[2].connect(NodeId(0), "vt").unwrap();
    assert_eq!(mapping_protections(&file), ["r--s", "rw-s", "rw-s"], "an atomic right needs a writable mapping");
    assert_eq!(reader.read_u64(0).unwrap(), 0);
    assert_eq!(atomic.fetch_add(0, 1).unwrap(), 0);
    assert_eq!(reader.read_u64(0).unwrap(), 1, "a read-only mapping sees the owner's memory change");
}

#[test]
fn a_node_connecting_to_its_own_region_has_every_right() {
    let (_dir, nodes) = three();
    let region = nodes[0].register("own", 64, Access::new(Rights::NONE)).unwrap();
    let own = nodes[0].connect(NodeId(0), "own").unwrap();
    own.write(0, &[1; 8]).unwrap();
    assert_eq!(own.fetch_add(8, 2).unwrap(), 0);
    assert_eq!(region.memory().load_u64(8).unwrap(), 2);
}
