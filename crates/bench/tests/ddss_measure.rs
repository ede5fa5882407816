//! The benchmark functions run end to end with few iterations (numbers are
//! not asserted: machines are shared; shapes and outcomes are).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use std::path::Path;
use tierstack_base::NodeId;
use tierstack_bench::ddss::measure::{measure, measure_redis, measure_redis_server, table, BenchOptions, RedisOutcome};
use tierstack_cluster::Backend;
use tierstack_ddss::Coherence;
use tierstack_testkit::ddss::{small_config, start};

fn options() -> BenchOptions {
    BenchOptions { iterations: 20, warmup: 2, sizes: vec![1, 1024, 64 * 1024], models: Coherence::examples().to_vec() }
}

#[test]
fn ddss_rows_cover_every_model_and_size_on_both_backends() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let nodes = start(backend, 2, small_config(2));
        let rows = measure(&nodes.ddss[0], NodeId(1), &options()).unwrap();
        assert_eq!(rows.len(), 6 * 2 + 3 * 2);
        assert!(rows.iter().all(|r| r.samples_ns.len() == 20 && r.system == format!("ddss-{}", backend.name())));
        let puts: Vec<_> =
            rows.iter().filter(|r| r.op == "put" && r.value_bytes == 1).map(|r| r.model.as_str()).collect();
        assert_eq!(puts, ["null", "temporal:10", "delta:2", "read", "write", "strict", "write"]);
        let usage = nodes.ddss[0].usage(NodeId(1)).unwrap();
        assert!(usage.iter().all(|(_, _, used)| *used == 0), "the benchmark frees what it allocates");
        assert!(table(&rows).lines().count() == rows.len() + 1);
    }
}

/// Measures when `redis-server` is installed, and then must succeed; a
/// missing server is a skip printed for all to see, not a silent pass.
#[test]
fn redis_comparison_measures_or_prints_skipped_without_redis_server() {
    match measure_redis(&options()) {
        RedisOutcome::Measured(rows) => {
            assert_eq!(rows.len(), 3 * 2);
            assert!(rows.iter().all(|r| r.system == "redis" && r.samples_ns.len() == 20), "{rows:?}");
            assert!(rows.iter().all(|r| r.samples_ns.iter().all(|&ns| ns > 0)), "every sample is a real time");
        }
        RedisOutcome::Skipped(reason) => {
            assert!(reason.contains("not installed"), "only a missing server is a skip: {reason}");
            eprintln!("SKIPPED: redis comparison not measured: {reason}");
        }
        RedisOutcome::Failed(why) => panic!("the redis comparison failed: {why}"),
    }
}

#[test]
fn a_redis_server_that_does_not_work_is_a_failure_not_a_skip() {
    // A "server" that exits at once, and one that cannot be started.
    for binary in ["false", "/nonexistent/redis-server"] {
        match measure_redis_server(Path::new(binary), &options()) {
            RedisOutcome::Failed(why) => assert!(!why.is_empty()),
            other => panic!("{binary}: {other:?}"),
        }
    }
}
