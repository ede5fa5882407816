//! Fig. 8a's truth is independent of the scheme it judges: a real
//! `tierstack monitor-node` (4 workers woken and idled by its walk, 8
//! compute threads), read through RDMA-Sync by this process while the
//! observer (`tierstack_bench::monitor::truth`) scans the node's
//! `/proc/<pid>/task`. With every running thread counted, RDMA-Sync agrees
//! with the observer; with the node's test fault `--fault
//! uncounted-compute` (compute threads run but are not counted) the
//! observer sees RDMA-Sync under-report by about the 8 compute threads.
//! Assertions are on deviations and counts only, with margins of 2 threads
//! around 0 and −8: the walk (0..=4 busy workers) can move during a scan,
//! by at most 4, and a loaded machine stretches scans, not the counts.

use crate::exe;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_bench::monitor::truth::{join, Observer, Truth};
use tierstack_bench::monitor_node::{Fault, MonitorNodeArgs};
use tierstack_cluster::{open_fabric, Backend, NodeArgs, Topology};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_monitor::{open_source, BackendAddress, Health, Scheme, SourceConfig};

const COMPUTE_THREADS: usize = 8;
const WORKERS: usize = 4;
/// Joined readings per run.
const READINGS: usize = 400;
/// A reading is joined to a scan at most this far away (the observer may be
/// descheduled on a loaded machine: a wide bound keeps readings, and the
/// walk moves by at most one worker per step whatever the gap).
const MAX_GAP_NS: u64 = 50_000_000;

/// (joined readings, mean |reported − actual|, mean reported − actual).
fn rdma_sync_against_the_observer(fault: Option<Fault>) -> (usize, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [NodeLine { id: 0, role: "app", cpu: None }, NodeLine { id: 1, role: "proxy", cpu: None }];
    let topology_path = write_topology(dir.path(), "truth", Backend::Shm, 1000, &nodes).unwrap();
    let socket = free_loopback_port().unwrap();
    let at = NodeArgs { topology: topology_path.clone(), node: 0 };
    let node = MonitorNodeArgs {
        compute_threads: COMPUTE_THREADS,
        walk_max: WORKERS,
        step_us: 1000,
        fault,
        ..MonitorNodeArgs::new(at, socket)
    };
    let mut args = vec!["monitor-node".to_string()];
    args.extend(node.to_args());
    // Its own session: its spinning threads do not starve this process's observer.
    let child = ChildNode::spawn_in_own_session(&exe(), &args).unwrap();
    let observer = Observer::start(child.pid(), Duration::from_millis(1)).unwrap();
    let fabric = open_fabric(&Topology::load(&topology_path).unwrap(), NodeId(1)).unwrap();
    let backends = [BackendAddress { node: Some(NodeId(0)), socket: Some(socket) }];
    let config = SourceConfig::for_interval(Duration::from_millis(10));
    let source = open_source(Scheme::RdmaSync, Some(fabric), &backends, config).unwrap();
    let mut readings = Vec::new();
    // Read until enough readings fall among the observer's scans (a count,
    // not a time): at least READINGS, and the observer has scanned past them.
    while readings.len() < READINGS || observer.scans() < 10 {
        let reading = source.read(0);
        let used_ns = tierstack_base::host_monotonic_ns();
        assert_eq!(reading.health, Health::Fresh, "RDMA-Sync reads a live node fresh");
        readings.push((used_ns, i64::from(reading.record.counters.running_threads)));
        // Pacing of the reads (the walk steps about every millisecond).
        std::thread::sleep(Duration::from_micros(500));
    }
    let scans = observer.stop().unwrap();
    let walk = child.finish().unwrap();
    assert!(walk.lines().count() > 1, "the walk moved");
    let truth = Truth::new(scans).unwrap();
    let deviations = join(&truth, &readings, MAX_GAP_NS);
    let n = deviations.len().max(1) as f64;
    let mean_abs = deviations.iter().map(|(_, d)| d.unsigned_abs() as f64).sum::<f64>() / n;
    let mean = deviations.iter().map(|(_, d)| *d as f64).sum::<f64>() / n;
    (deviations.len(), mean_abs, mean)
}

#[test]
fn rdma_sync_agrees_with_the_observer_until_compute_threads_go_uncounted() {
    let (joined, mean_abs, mean) = rdma_sync_against_the_observer(None);
    assert!(joined >= READINGS / 2, "only {joined} readings near a scan");
    assert!(mean_abs < 2.0, "every running thread counted: mean |dev| {mean_abs:.2} (mean {mean:+.2})");

    let (joined, mean_abs, mean) = rdma_sync_against_the_observer(Some(Fault::UncountedCompute));
    assert!(joined >= READINGS / 2, "only {joined} readings near a scan");
    let expected = -(COMPUTE_THREADS as f64);
    assert!(
        (mean - expected).abs() < 2.0,
        "compute threads uncounted: mean dev {mean:+.2} (|dev| {mean_abs:.2}), expected about {expected}"
    );
}
