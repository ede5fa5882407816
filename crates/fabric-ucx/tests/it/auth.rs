//! The security boundary of the ucx backend: with a cluster key, worker
//! addresses and remote keys go only to peers that prove they hold it, and
//! a region's rights bound what a peer's handle may post.

use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Access, Channel, Fabric, FabricError, Rights};
use tierstack_secret::ClusterKey;
use tierstack_testkit::nodes::ucx::{keyed_cluster, ucx_or_skip, SHM};

const TIMEOUT: Duration = Duration::from_secs(5);

fn key(digit: u8) -> ClusterKey {
    ClusterKey::parse(&[digit; 64]).unwrap()
}

#[test]
fn peers_with_the_key_reach_each_other() {
    if !ucx_or_skip() {
        return;
    }
    let k = key(b'1');
    let nodes = keyed_cluster(0, SHM, TIMEOUT, &[Some(&k), Some(&k)]);
    let region = nodes[0].register("r", 64, Access::all()).unwrap();
    let remote = nodes[1].connect(NodeId(0), "r").unwrap();
    remote.write(0, &9u64.to_ne_bytes()).unwrap();
    assert_eq!(region.memory().load_u64(0).unwrap(), 9);
    nodes[1].send(NodeId(0), Channel::TEST, b"hi").unwrap();
    assert_eq!(nodes[0].inbox(Channel::TEST).recv_timeout(TIMEOUT).unwrap().payload, b"hi");
}

#[test]
fn a_peer_with_a_wrong_or_missing_key_gets_no_remote_key() {
    if !ucx_or_skip() {
        return;
    }
    let (k, other) = (key(b'1'), key(b'2'));
    let nodes = keyed_cluster(0, SHM, TIMEOUT, &[Some(&k), Some(&other), None]);
    let region = nodes[0].register("r", 64, Access::all()).unwrap();
    for (i, what) in [(1, "another key"), (2, "no key")] {
        match nodes[i].connect(NodeId(0), "r") {
            Err(e) => assert!(e.is_unreachable() || matches!(e, FabricError::Unauthenticated { .. }), "{what}: {e}"),
            Ok(_) => panic!("a peer with {what} was handed the region's remote key"),
        }
        assert!(nodes[i].send(NodeId(0), Channel::TEST, b"x").is_err(), "a peer with {what} sent a message");
    }
    // And the keyed node refuses to hand its own hello to a keyless acceptor.
    assert!(nodes[0].connect(NodeId(2), "r").is_err());
    assert!(nodes[0].inbox(Channel::TEST).try_recv().is_none());
    assert_eq!(region.memory().load_u64(0).unwrap(), 0);
}

#[test]
fn an_op_the_region_does_not_allow_is_forbidden() {
    if !ucx_or_skip() {
        return;
    }
    let k = key(b'3');
    let nodes = keyed_cluster(0, SHM, TIMEOUT, &[Some(&k), Some(&k), Some(&k)]);
    let table = nodes[0].register("vt", 64, Access::read_only().grant(NodeId(2), Rights::ALL)).unwrap();
    table.memory().store_u64(0, 7).unwrap();
    let reader = nodes[1].connect(NodeId(0), "vt").unwrap();
    assert_eq!(reader.read_u64(0).unwrap(), 7);
    for result in [reader.write(0, &[1; 8]).map(|()| 0), reader.fetch_add(0, 1), reader.compare_swap(0, 7, 8)] {
        assert!(matches!(result, Err(FabricError::Forbidden { granted: Rights::READ, .. })), "{result:?}");
    }
    assert_eq!(table.memory().load_u64(0).unwrap(), 7);
    let writer = nodes[2].connect(NodeId(0), "vt").unwrap();
    assert_eq!(writer.fetch_add(0, 1).unwrap(), 7);
    assert_eq!(table.memory().load_u64(0).unwrap(), 8);
    // No rights at all: no remote key, so no handle.
    nodes[0].register("private", 8, Access::new(Rights::NONE)).unwrap();
    assert!(matches!(nodes[1].connect(NodeId(0), "private"), Err(FabricError::Forbidden { .. })));
}

/// The shared access-rights scenarios (`tierstack_testkit::rights`), on a keyed cluster.
mod rights_suite {
    use super::*;
    use std::sync::Arc;
    use tierstack_fabric_ucx::UcxFabric;
    use tierstack_testkit::rights as suite;

    fn three() -> Option<Vec<Arc<UcxFabric>>> {
        let k = key(b'9');
        ucx_or_skip().then(|| keyed_cluster(0, SHM, TIMEOUT, &[Some(&k), Some(&k), Some(&k)]))
    }

    #[test]
    fn a_read_only_region_refuses_a_peers_writes_and_atomics() {
        let Some(nodes) = three() else { return };
        suite::a_read_only_region_refuses_a_peers_writes_and_atomics(nodes[0].as_ref(), nodes[1].as_ref());
    }

    #[test]
    fn a_grant_allows_its_node_only() {
        let Some(nodes) = three() else { return };
        suite::a_grant_allows_its_node_only(nodes[0].as_ref(), nodes[2].as_ref(), nodes[1].as_ref());
    }

    #[test]
    fn rights_are_granted_separately() {
        let Some(nodes) = three() else { return };
        suite::rights_are_granted_separately(nodes[0].as_ref(), nodes[1].as_ref());
    }

    #[test]
    fn the_owner_may_do_everything_through_its_own_handle() {
        let Some(nodes) = three() else { return };
        let region = nodes[0].register("own", 8, Access::read_only()).unwrap();
        let own = nodes[0].connect(NodeId(0), "own").unwrap();
        assert_eq!(own.fetch_add(0, 3).unwrap(), 0);
        assert_eq!(region.memory().load_u64(0).unwrap(), 3);
    }
}
