//! The shm backend in one process: several nodes, each its own ShmFabric.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, Op, OpResult};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};

fn pair() -> (tempfile::TempDir, Arc<ShmFabric>, Arc<ShmFabric>) {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![NodeId(0), NodeId(1)];
    let a = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0)).with_nodes(nodes.clone())).unwrap();
    let b = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(1)).with_nodes(nodes)).unwrap();
    (dir, a, b)
}

#[test]
fn one_sided_operations_reach_the_owners_memory() {
    let (_dir, owner, peer) = pair();
    let local = owner.register("data", 100, tierstack_fabric::Access::all()).unwrap();
    assert_eq!(local.len(), 104);
    let remote = peer.connect(NodeId(0), "data").unwrap();
    assert_eq!(remote.len(), 104);
    remote.write(3, b"hello").unwrap();
    let mut seen = [0u8; 5];
    local.memory().read(3, &mut seen).unwrap();
    assert_eq!(&seen, b"hello");
    local.memory().store_u64(16, 41).unwrap();
    assert_eq!(remote.fetch_add(16, 1).unwrap(), 41);
    assert_eq!(remote.compare_swap(16, 42, 7).unwrap(), 42);
    assert_eq!(remote.compare_swap(16, 42, 9).unwrap(), 7, "a failed swap returns the current value");
    assert_eq!(local.memory().load_u64(16).unwrap(), 7);
    let results = remote
        .post(vec![
            Op::Read { offset: 3, len: 5 },
            Op::FetchAdd { offset: 16, delta: 3 },
            Op::Write { offset: 24, data: vec![1; 8] },
            Op::CompareSwap { offset: 16, expected: 10, new: 11 },
            Op::Read { offset: 16, len: 8 },
        ])
        .wait()
        .unwrap();
    assert_eq!(
        results,
        vec![
            OpResult::Read(b"hello".to_vec()),
            OpResult::FetchAdd(7),
            OpResult::Written,
            OpResult::CompareSwap(10),
            OpResult::Read(11u64.to_ne_bytes().to_vec()),
        ],
        "batch results come back in order"
    );
}

#[test]
fn errors_are_typed() {
    let (_dir, owner, peer) = pair();
    owner.register("r", 64, tierstack_fabric::Access::all()).unwrap();
    assert!(matches!(owner.register("r", 64, tierstack_fabric::Access::all()), Err(FabricError::RegionExists { .. })));
    assert!(matches!(
        owner.register("../x", 64, tierstack_fabric::Access::all()),
        Err(FabricError::InvalidName { .. })
    ));
    assert!(matches!(
        owner.register("big", 1 << 40, tierstack_fabric::Access::all()),
        Err(FabricError::RegionSize { .. })
    ));
    assert!(matches!(peer.connect(NodeId(0), "nope"), Err(FabricError::UnknownRegion { .. })));
    assert!(matches!(peer.connect(NodeId(7), "r"), Err(FabricError::UnknownNode { .. })));
    let r = peer.connect(NodeId(0), "r").unwrap();
    assert!(matches!(r.fetch_add(4, 1), Err(FabricError::Misaligned { offset: 4 })));
    assert!(matches!(r.read_u64(64), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(r.write(60, &[0; 8]), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(r.post(vec![]).wait(), Err(FabricError::BatchSize { .. })));
    // An invalid op fails the whole batch before anything executes.
    let batch = vec![Op::FetchAdd { offset: 0, delta: 1 }, Op::Read { offset: 100, len: 8 }];
    assert!(matches!(r.post(batch).wait(), Err(FabricError::OutOfBounds { .. })));
    assert_eq!(r.read_u64(0).unwrap(), 0, "the valid op of a rejected batch must not have run");
}

#[test]
fn a_node_id_cannot_be_opened_twice_and_a_closed_node_is_dead() {
    let (dir, owner, peer) = pair();
    let again = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0)));
    assert!(matches!(again, Err(FabricError::NodeInUse { node: NodeId(0), .. })));
    owner.register("r", 8, tierstack_fabric::Access::all()).unwrap();
    drop(owner);
    assert!(matches!(peer.connect(NodeId(0), "r"), Err(FabricError::PeerDead { .. })));
    assert!(matches!(peer.send(NodeId(0), Channel::TEST, b"x"), Err(FabricError::PeerDead { .. })));
    // The id can be opened again once its owner is gone.
    let reopened = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0))).unwrap();
    reopened.register("r", 8, tierstack_fabric::Access::all()).unwrap();
    assert_eq!(peer.connect(NodeId(0), "r").unwrap().read_u64(0).unwrap(), 0);
}

#[test]
fn messages_arrive_in_order_per_pair() {
    let (_dir, a, b) = pair();
    for i in 0u32..1000 {
        a.send(NodeId(1), Channel::TEST, &i.to_le_bytes()).unwrap();
    }
    for i in 0u32..1000 {
        let m = b.inbox(Channel::TEST).recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(m.from, NodeId(0));
        assert_eq!(m.payload, i.to_le_bytes());
    }
    a.send(NodeId(0), Channel::TEST, b"self").unwrap();
    assert_eq!(a.inbox(Channel::TEST).recv_timeout(Duration::from_secs(10)).unwrap().payload, b"self");
    assert!(matches!(
        b.inbox(Channel::TEST).recv_timeout(Duration::from_millis(1)),
        Err(FabricError::RecvTimeout { .. })
    ));
}

#[test]
fn concurrent_fetch_add_from_many_threads_is_exact() {
    let (_dir, owner, peer) = pair();
    let local = owner.register("counter", 8, tierstack_fabric::Access::all()).unwrap();
    let remote = peer.connect(NodeId(0), "counter").unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let remote = remote.clone();
            s.spawn(move || {
                for _ in 0..10_000 {
                    remote.fetch_add(0, 1).unwrap();
                }
            });
        }
    });
    assert_eq!(local.memory().load_u64(0).unwrap(), 40_000);
}

#[test]
fn a_closed_owners_regions_are_revoked_for_peers_holding_handles() {
    let (_dir, owner, peer) = pair();
    owner.register("r", 64, tierstack_fabric::Access::all()).unwrap();
    let remote = peer.connect(NodeId(0), "r").unwrap();
    assert_eq!(remote.fetch_add(0, 1).unwrap(), 0);
    drop(owner);
    for result in [
        remote.read_u64(0).map(|_| ()),
        remote.fetch_add(0, 1).map(|_| ()),
        remote.post(vec![Op::Read { offset: 0, len: 8 }]).wait().map(|_| ()),
    ] {
        assert!(matches!(result, Err(FabricError::PeerDead { node: NodeId(0), .. })), "{result:?}");
    }
}
