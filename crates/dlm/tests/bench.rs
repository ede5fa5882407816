//! The benchmark functions run on every scheme and backend; their
//! per-round message accounting (which keeps rounds from overlapping) holds.

mod common;

use common::{Backend, Cluster};
use std::sync::Arc;
use tierstack_dlm::bench::{
    cascade_latency_ns, contended_throughput, figure5, start_managers, uncontended_ns, BENCH_LOCK,
};
use tierstack_dlm::{LockMode, Scheme};
use tierstack_fabric::Fabric;

#[test]
fn cascades_and_latencies_run_on_every_scheme() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = Cluster::new(backend, 5);
        let fabrics: Vec<Arc<dyn Fabric>> = (0..5).map(|i| cluster.fabric(i)).collect();
        for scheme in Scheme::ALL {
            let managers = start_managers(&fabrics, scheme, "bench").unwrap();
            for mode in [LockMode::Shared, LockMode::Exclusive] {
                for waiters in [1, 3] {
                    cascade_latency_ns(&managers, mode, waiters)
                        .unwrap_or_else(|e| panic!("{scheme:?} {mode:?} {waiters} on {backend:?}: {e}"));
                }
                assert_eq!(uncontended_ns(&managers, mode, 20).unwrap().len(), 20);
            }
            let throughput = contended_throughput(&managers, 4, 50, 20, 1).unwrap_or_else(|e| {
                let states: Vec<String> = managers.iter().map(|m| m.debug_state(BENCH_LOCK)).collect();
                panic!("contended {scheme:?} on {backend:?}: {e}\n{}", states.join("\n"))
            });
            assert!(throughput > 0.0, "{scheme:?} on {backend:?}");
            assert!(cascade_latency_ns(&managers, LockMode::Shared, 4).is_err(), "5 nodes host at most 3 waiters");
            let rows = figure5(&managers, &[1, 2], 2).unwrap_or_else(|e| {
                let states: Vec<String> =
                    managers.iter().map(|m| format!("{:?} {}", m.stats(), m.debug_state(BENCH_LOCK))).collect();
                panic!("figure5 {scheme:?} on {backend:?}: {e}\n{}", states.join("\n"))
            });
            assert_eq!(rows.len(), 4);
            assert!(rows.iter().all(|r| r.scheme == scheme && r.samples_ns.len() == 2));
            for m in &managers {
                assert_eq!(m.stats().message_errors, 0, "{scheme:?} on {backend:?}");
            }
        }
    }
}
