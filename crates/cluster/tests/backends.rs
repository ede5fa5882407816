//! The same operations on `shm`, `tcp` and `ucx` must give the same results,
//! from threads and from async tasks. (`ucx` is left out, saying why, when
//! this build has no UCX; CI builds with it.)

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tierstack_base::NodeId;
use tierstack_cluster::{
    local_cluster, local_ucx_cluster, ucx_available, ucx_unavailable_reason, Backend, LocalCluster,
};
use tierstack_fabric::{Channel, FabricError, Op, OpResult};

const REGION_BYTES: u64 = 256;

fn op_strategy() -> impl Strategy<Value = Op> {
    // Offsets slightly past the region and unaligned ones exercise the errors too.
    let offset = 0u64..(REGION_BYTES + 16);
    prop_oneof![
        (offset.clone(), 0u32..40).prop_map(|(offset, len)| Op::Read { offset, len }),
        (offset.clone(), proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(offset, data)| Op::Write { offset, data }),
        (offset.clone(), any::<u64>()).prop_map(|(offset, delta)| Op::FetchAdd { offset, delta }),
        (offset, 0u64..4, 0u64..4).prop_map(|(offset, expected, new)| Op::CompareSwap { offset, expected, new }),
    ]
}

fn run_all(cluster: &LocalCluster, region: &str, batches: &[Vec<Op>]) -> Vec<Result<Vec<OpResult>, FabricError>> {
    cluster.fabric(0).register(region, REGION_BYTES, tierstack_fabric::Access::all()).unwrap();
    let remote = cluster.fabric(1).connect(NodeId(0), region).unwrap();
    batches.iter().map(|batch| remote.post(batch.clone()).wait()).collect()
}

static CASE: AtomicUsize = AtomicUsize::new(0);

/// Every backend this build has.
fn backends() -> Vec<Backend> {
    if ucx_available() {
        vec![Backend::Shm, Backend::Tcp, Backend::Ucx]
    } else {
        eprintln!("ucx left out: {}", ucx_unavailable_reason());
        vec![Backend::Shm, Backend::Tcp]
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn shm_and_tcp_agree(batches in proptest::collection::vec(proptest::collection::vec(op_strategy(), 0..6), 1..12)) {
        let region = format!("diff-{}", CASE.fetch_add(1, Ordering::Relaxed));
        let shm = local_cluster(Backend::Shm, 2).unwrap();
        let tcp = local_cluster(Backend::Tcp, 2).unwrap();
        let on_shm = run_all(&shm, &region, &batches);
        let on_tcp = run_all(&tcp, &region, &batches);
        prop_assert_eq!(&on_shm, &on_tcp);
    }

    /// UCX over shared memory and over TCP against shm.
    #[test]
    fn ucx_agrees_with_shm(batches in proptest::collection::vec(proptest::collection::vec(op_strategy(), 0..6), 1..12)) {
        if !ucx_available() {
            eprintln!("skipped: {}", ucx_unavailable_reason());
            return Ok(());
        }
        let region = format!("diff-ucx-{}", CASE.fetch_add(1, Ordering::Relaxed));
        let shm = local_cluster(Backend::Shm, 2).unwrap();
        let on_shm = run_all(&shm, &region, &batches);
        for transports in ["sysv,self", "tcp,self"] {
            let ucx = local_ucx_cluster(2, std::time::Duration::from_secs(2), Some(transports)).unwrap();
            let on_ucx = run_all(&ucx, &region, &batches);
            prop_assert_eq!(&on_shm, &on_ucx, "ucx over {}", transports);
        }
    }
}

#[test]
fn batches_and_messages_work_from_async_tasks_on_both_backends() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for backend in backends() {
        let cluster = local_cluster(backend, 2).unwrap();
        let owner = cluster.fabric(0).clone();
        let peer = cluster.fabric(1).clone();
        owner.register("async", 64, tierstack_fabric::Access::all()).unwrap();
        runtime.block_on(async move {
            let region = peer.connect(NodeId(0), "async").unwrap();
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let region = region.clone();
                    tokio::spawn(async move {
                        for _ in 0..100 {
                            region.post(vec![Op::FetchAdd { offset: 0, delta: 1 }]).wait_async().await.unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let total = region.post(vec![Op::Read { offset: 0, len: 8 }]).wait_async().await.unwrap();
            assert_eq!(total, vec![OpResult::Read(800u64.to_ne_bytes().to_vec())], "backend {}", backend.name());
            peer.send(NodeId(0), Channel::TEST, b"ping").unwrap();
            let message = owner.inbox(Channel::TEST).recv_async().await.unwrap();
            assert_eq!((message.from, message.payload.as_slice()), (NodeId(1), &b"ping"[..]));
        });
    }
}

#[test]
fn a_dead_peer_is_reported_on_both_backends() {
    for backend in backends() {
        let cluster = local_cluster(backend, 3).unwrap();
        cluster.fabric(2).register("gone", 8, tierstack_fabric::Access::all()).unwrap();
        let fabrics: Vec<_> = cluster.fabrics().to_vec();
        drop(cluster);
        // Node 2's fabric is gone once the cluster and our clones are dropped.
        let survivor = fabrics[0].clone();
        drop(fabrics);
        let result = survivor.connect(NodeId(2), "gone");
        assert!(
            matches!(result, Err(FabricError::PeerDead { .. } | FabricError::Closed)),
            "{}: {:?}",
            backend.name(),
            result.err()
        );
    }
}
