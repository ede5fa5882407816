//! `bench dlm` with every lock-manager node a separate `tierstack
//! dlm-bench-node` process (the default), on both backends, including the
//! recovery after a kill (the killed holder's and waiter's successors are
//! granted without an operator, and the killed nodes start again); and a
//! node process that dies mid-run, with nobody to restart it, ends the
//! run with a clear error, not a hang.

use crate::exe;
use tierstack_bench::dlm::measure::{cascade_latency_ns, wait_quiescent};
use tierstack_bench::dlm::{run, DlmBenchConfig, NodeKind};
use tierstack_bench::dlm_nodes::ProcessNodes;
use tierstack_cluster::Backend;
use tierstack_dlm::harness::LockNodes;
use tierstack_dlm::{LockMode, Scheme};

#[test]
fn bench_dlm_drives_node_processes_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DlmBenchConfig::new(dir.path().join("dlm"), NodeKind::Processes { exe: exe() }, true);
    config.waiters = vec![1, 2];
    config.rounds = 2;
    config.uncontended_pairs = 20;
    config.contenders = vec![2];
    config.contended_pairs_per_node = 20;
    config.recovery_rounds = 2;
    let report = run(&config).unwrap();
    assert!(report.nodes_are.contains("separate processes"), "{}", report.nodes_are);
    assert_eq!(report.nodes, 4, "home, holder and two waiters");

    // 2 backends × 3 schemes × 2 modes × 2 waiter counts, every sample real.
    assert_eq!(report.cascade.len(), 24);
    for c in &report.cascade {
        assert_eq!(c.samples_ns.len(), 2, "{c:?}");
        assert!(c.samples_ns.iter().all(|&ns| ns > 0), "{c:?}");
    }
    assert_eq!(report.uncontended.len(), 12);
    assert!(report.uncontended.iter().all(|u| u.summary.count == 20 && u.summary.p50_ns > 0));
    assert_eq!(report.throughput.len(), 2 * 3 * config.shared_percents.len());
    assert!(report.throughput.iter().all(|t| t.pairs_per_sec > 0.0), "{:?}", report.throughput);
    // Every SRSL pair costs acquire, grant and release messages, counted
    // across the processes.
    for t in report.throughput.iter().filter(|t| t.scheme == "srsl") {
        assert!((t.messages_per_pair - 3.0).abs() < 0.1, "{t:?}");
    }
    // 2 backends × 3 schemes, each round's waiter granted after its
    // holder's or predecessor's kill (a round that never recovered fails
    // the run with an error instead).
    assert_eq!(report.recovery.len(), 6);
    for r in &report.recovery {
        for summary in [&r.handoff, &r.dead_holder, &r.dead_waiter] {
            assert_eq!(summary.count, 2, "{r:?}");
            assert!(summary.p50_ns > 0, "{r:?}");
        }
    }
    for backend in ["shm", "tcp"] {
        assert_eq!(report.message_errors.get(backend), Some(&0), "a lock message failed on {backend}");
    }
}

#[test]
fn a_node_process_that_dies_ends_the_measurement_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = ProcessNodes::spawn(&exe(), Backend::Shm, 4, dir.path()).unwrap();
    nodes.start(Scheme::CoShed, "died").unwrap();
    let pids = nodes.pids();
    assert_eq!(pids.len(), 4);
    assert!(pids.iter().all(|&pid| pid != std::process::id()), "every node is its own process");
    cascade_latency_ns(&mut nodes, LockMode::Exclusive, 2).unwrap();

    // SAFETY: kill(2) on a child process id this test owns.
    assert_eq!(unsafe { libc::kill(pids[3] as libc::pid_t, libc::SIGKILL) }, 0);
    let error = cascade_latency_ns(&mut nodes, LockMode::Exclusive, 2).unwrap_err().to_string();
    assert!(error.contains("node index 3"), "{error}");
    assert!(wait_quiescent(&mut nodes).is_err(), "a dead node cannot report its counters");
}
