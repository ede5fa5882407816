//! Fig. 8a's truth is independent of the scheme it judges: a real
//! `tierstack monitor-node` (4 workers woken and idled by its walk, 12
//! compute threads), read through RDMA-Sync by this process while the
//! observer (`tierstack_bench::monitor::truth`) scans the node's
//! `/proc/<pid>/task`. With every running thread counted, RDMA-Sync agrees
//! with the observer; with the node's test fault `--fault
//! uncounted-compute` (compute threads run but are not counted) the
//! observer sees RDMA-Sync under-report by about the 12 compute threads.
//! Assertions are on deviations and counts only, with margins of 3 threads
//! around 0 and −12. Every reading is joined to its nearest scan however
//! far (a loaded machine may deschedule the observer for a while): the
//! compute threads run throughout, and the walk's 0..=4 busy workers bound
//! what a distant scan can differ by, so even then a reading is off by at
//! most 4 and the means stay well inside the margins.

use crate::exe;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_bench::monitor::truth::{join, Observer, Truth};
use tierstack_bench::monitor_node::{Fault, MonitorNodeArgs};
use tierstack_cluster::{open_fabric, Backend, NodeArgs, Topology};
use tierstack_deploy::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use tierstack_monitor::{open_source, BackendAddress, Health, Scheme, SourceConfig};

const COMPUTE_THREADS: usize = 12;
const WORKERS: usize = 4;
/// Joined readings per run.
const READINGS: usize = 400;
/// Every reading joins its nearest scan (see the module's comment).
const MAX_GAP_NS: u64 = u64::MAX;
/// Allowed distance of a mean from what it should be, in threads.
const MARGIN: f64 = 3.0;

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
    // A count of readings, not a time.
    while readings.len() < READINGS {
        let reading = source.read(0);
        let used_ns = tierstack_base::host_monotonic_ns();
        assert!(!matches!(reading.health, Health::Dead | Health::Unknown), "a live node read: {:?}", reading.health);
        readings.push((used_ns, i64::from(reading.record.counters.running_threads)));
        // Pacing of the reads (the walk steps about every millisecond).
        std::thread::sleep(Duration::from_micros(500));
    }
    // At least one scan after the last reading (polled, bounded).
    let scanned = observer.scans();
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(30);
    while observer.scans() <= scanned {
        assert!(tierstack_base::time::instant_now() < deadline, "the observer stopped scanning");
        std::thread::sleep(Duration::from_millis(1));
    }
    let scans = observer.stop().unwrap();
    let walk = child.finish().unwrap();
    assert!(walk.lines().count() > 1, "the walk moved");
    let truth = Truth::new(scans).unwrap();
    let deviations = join(&truth, &readings, MAX_GAP_NS);
    let n = deviations.len().max(1) as f64;
    let mean_abs = deviations.iter().map(|(_, d)| d.unsigned_abs() as f64).sum::<f64>() / n;
    let mean = deviations.iter().map(|(_, d)| *d as f64).sum::<f64>() / n;
    eprintln!(
        "{fault:?}: {} readings, {} joined, mean |dev| {mean_abs:.2}, mean {mean:+.2}",
        readings.len(),
        deviations.len()
    );
    (deviations.len(), mean_abs, mean)
}

#[test]
fn rdma_sync_agrees_with_the_observer_until_compute_threads_go_uncounted() {
    let (joined, mean_abs, mean) = rdma_sync_against_the_observer(None);
    assert_eq!(joined, READINGS, "every reading has its scan");
    assert!(mean_abs < MARGIN, "every running thread counted: mean |dev| {mean_abs:.2} (mean {mean:+.2})");

    let (joined, mean_abs, mean) = rdma_sync_against_the_observer(Some(Fault::UncountedCompute));
    assert_eq!(joined, READINGS, "every reading has its scan");
    let expected = -(COMPUTE_THREADS as f64);
    assert!(
        (mean - expected).abs() < MARGIN,
        "compute threads uncounted: mean dev {mean:+.2} (|dev| {mean_abs:.2}), expected about {expected}"
    );
}
