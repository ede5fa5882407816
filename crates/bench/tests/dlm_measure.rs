//! The benchmark functions run on every scheme and backend; their
//! per-round message accounting (which keeps rounds from overlapping) holds.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use tierstack_bench::dlm::measure::{cascade_latency_ns, contended_throughput, figure5, uncontended_ns, ThreadNodes};
use tierstack_cluster::{local_cluster, Backend};
use tierstack_dlm::harness::{LockNodes, BENCH_LOCK};
use tierstack_dlm::{LockMode, Scheme};

fn states(nodes: &ThreadNodes) -> String {
    let states: Vec<String> =
        nodes.managers().iter().map(|m| format!("{:?} {}", m.stats(), m.debug_state(BENCH_LOCK))).collect();
    states.join("\n")
}

#[test]
fn cascades_and_latencies_run_on_every_scheme() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 5).unwrap();
        let mut nodes = ThreadNodes::new(cluster.fabrics().to_vec());
        for (i, scheme) in Scheme::ALL.into_iter().enumerate() {
            nodes.start(scheme, &format!("bench{i}")).unwrap();
            assert_eq!(nodes.scheme().unwrap(), scheme);
            for mode in [LockMode::Shared, LockMode::Exclusive] {
                for waiters in [1, 3] {
                    cascade_latency_ns(&mut nodes, mode, waiters)
                        .unwrap_or_else(|e| panic!("{scheme:?} {mode:?} {waiters} on {backend:?}: {e}"));
                }
                assert_eq!(uncontended_ns(&mut nodes, mode, 20).unwrap().len(), 20);
            }
            let throughput = contended_throughput(&mut nodes, 4, 50, 20, 1)
                .unwrap_or_else(|e| panic!("contended {scheme:?} on {backend:?}: {e}\n{}", states(&nodes)));
            assert!(throughput > 0.0, "{scheme:?} on {backend:?}");
            assert!(cascade_latency_ns(&mut nodes, LockMode::Shared, 4).is_err(), "5 nodes host at most 3 waiters");
            assert!(contended_throughput(&mut nodes, 5, 50, 20, 1).is_err(), "5 nodes host at most 4 contenders");
            let rows = figure5(&mut nodes, &[1, 2], 2)
                .unwrap_or_else(|e| panic!("figure5 {scheme:?} on {backend:?}: {e}\n{}", states(&nodes)));
            assert_eq!(rows.len(), 4);
            assert!(rows.iter().all(|r| r.scheme == scheme && r.samples_ns.len() == 2));
            let totals = nodes.totals().unwrap();
            assert_eq!(totals.errors, 0, "{scheme:?} on {backend:?}");
            assert_eq!(totals.sent, totals.handled, "{scheme:?} on {backend:?}: a message is unaccounted for");
        }
    }
}
