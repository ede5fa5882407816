//! The ucx backend's life cycle in one process: every operation and a
//! message once over each transport set (and to the node itself), and
//! clusters opened, used both ways and closed many times, which must never
//! hang (a close waits for its peers' answers to `BYE`, bounded) and must
//! leave every handle of the closed node failing with `PeerDead`.

use crate::common;

use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, Op, OpResult, PeerState};

fn every_operation_once(transports: &str) {
    if !common::ucx_or_skip() {
        return;
    }
    let nodes = common::cluster(0, 2, transports, Duration::from_secs(2));
    let owner = nodes[0].register("smoke", 64, tierstack_fabric::Access::all()).unwrap();
    owner.memory().store_u64(8, 41).unwrap();
    let remote = nodes[1].connect(NodeId(0), "smoke").unwrap();
    assert_eq!(remote.read_u64(8).unwrap(), 41);
    remote.write(16, b"hello ucx").unwrap();
    let mut buf = [0u8; 9];
    owner.memory().read(16, &mut buf).unwrap();
    assert_eq!(&buf, b"hello ucx");
    assert_eq!(remote.fetch_add(8, 1).unwrap(), 41);
    assert_eq!(remote.compare_swap(8, 42, 7).unwrap(), 42);
    assert_eq!(remote.compare_swap(8, 42, 9).unwrap(), 7);
    let results = remote
        .post(vec![
            Op::Write { offset: 0, data: vec![1; 8] },
            Op::Read { offset: 0, len: 8 },
            Op::FetchAdd { offset: 0, delta: 1 },
        ])
        .wait()
        .unwrap();
    assert_eq!(results[1], OpResult::Read(vec![1; 8]));
    nodes[1].send(NodeId(0), Channel::TEST, b"ping").unwrap();
    let message = nodes[0].inbox(Channel::TEST).recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(message.payload, b"ping");
    nodes[0].send(NodeId(0), Channel::TEST, b"self").unwrap();
    let message = nodes[0].inbox(Channel::TEST).recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(message.payload, b"self");
}

#[test]
fn every_operation_once_over_shm() {
    every_operation_once(common::SHM);
}

#[test]
fn every_operation_once_over_tcp() {
    every_operation_once(common::TCP);
}

fn open_use_and_close_cycles(transports: &str, cycles: usize) {
    if !common::ucx_or_skip() {
        return;
    }
    for cycle in 0..cycles {
        let nodes = common::cluster(0, 3, transports, Duration::from_secs(2));
        for node in &nodes {
            node.register("cycle", 64, tierstack_fabric::Access::all()).unwrap();
        }
        let mut handles = Vec::new();
        for (i, a) in nodes.iter().enumerate() {
            for j in 0..nodes.len() {
                let remote = a.connect(NodeId(j as u32), "cycle").unwrap();
                remote.fetch_add(0, 1).unwrap();
                a.send(NodeId(j as u32), Channel::TEST, &[i as u8]).unwrap();
                handles.push((j, remote));
            }
        }
        for node in &nodes {
            for _ in 0..nodes.len() {
                node.inbox(Channel::TEST).recv_timeout(Duration::from_secs(2)).unwrap();
            }
        }
        // Close the nodes in a varying order; every handle to a closed node
        // fails with PeerDead (or Closed, from the closed node itself).
        let mut nodes: Vec<_> = nodes.into_iter().map(Some).collect();
        let first = cycle % 3;
        nodes[first].take();
        for (owner, remote) in &handles {
            if *owner == first {
                let result = remote.fetch_add(0, 1);
                assert!(
                    matches!(result, Err(FabricError::PeerDead { .. } | FabricError::Closed)),
                    "cycle {cycle}: {result:?}"
                );
            }
        }
    }
}

#[test]
fn open_use_and_close_cycles_over_shm() {
    open_use_and_close_cycles(common::SHM, 20);
}

#[test]
fn open_use_and_close_cycles_over_tcp() {
    open_use_and_close_cycles(common::TCP, 20);
}

/// A peer that saw a node's process close says Gone while nothing runs at
/// its address, and Running once a new process of the same node id does:
/// what the old process held is gone, the node is not (DDSS takes over a
/// lock only from a holder that is gone).
fn a_node_reopened_by_a_new_process_runs_again(transports: &str) {
    if !common::ucx_or_skip() {
        return;
    }
    let mut nodes = common::cluster(0, 2, transports, Duration::from_secs(2));
    nodes[1].register("old", 64, tierstack_fabric::Access::all()).unwrap();
    let remote = nodes[0].connect(NodeId(1), "old").unwrap();
    remote.fetch_add(0, 1).unwrap();
    assert_eq!(nodes[0].peer_state(NodeId(1)), PeerState::Running);
    drop(nodes.pop());
    assert!(matches!(remote.fetch_add(0, 1), Err(FabricError::PeerDead { .. })));
    assert_eq!(nodes[0].peer_state(NodeId(1)), PeerState::Gone);

    let reopened = common::cluster(1, 1, transports, Duration::from_secs(2)).remove(0);
    reopened.add_peer(NodeId(0), nodes[0].local_addr());
    nodes[0].add_peer(NodeId(1), reopened.local_addr());
    assert_eq!(nodes[0].peer_state(NodeId(1)), PeerState::Running);
    reopened.register("new", 64, tierstack_fabric::Access::all()).unwrap();
    assert_eq!(nodes[0].connect(NodeId(1), "new").unwrap().fetch_add(0, 1).unwrap(), 0);
    assert!(matches!(nodes[0].connect(NodeId(1), "old"), Err(FabricError::UnknownRegion { .. })));
}

#[test]
fn a_node_reopened_by_a_new_process_runs_again_over_shm() {
    a_node_reopened_by_a_new_process_runs_again(common::SHM);
}

#[test]
fn a_node_reopened_by_a_new_process_runs_again_over_tcp() {
    a_node_reopened_by_a_new_process_runs_again(common::TCP);
}
