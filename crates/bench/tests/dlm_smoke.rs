//! `bench dlm` end to end on a tiny configuration: it runs every scheme,
//! writes its JSON and plots, and every latency it reports is a real sample.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use tierstack_bench::dlm::{run, DlmBenchConfig, NodeKind, Scheme};
use tierstack_cluster::Backend;

#[test]
fn tiny_dlm_bench_writes_json_and_plots_with_positive_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DlmBenchConfig::new(dir.path().join("dlm"), NodeKind::Threads, true);
    config.backends = vec![Backend::Shm];
    config.waiters = vec![1, 2];
    config.rounds = 2;
    config.uncontended_pairs = 20;
    config.contenders = vec![2];
    config.contended_pairs_per_node = 20;
    let report = run(&config).unwrap();

    for file in ["dlm.json", "dlm-cascade-shared.svg", "dlm-cascade-exclusive.svg"] {
        let path = config.out_dir.join(file);
        assert!(std::fs::metadata(&path).map(|m| m.len() > 0).unwrap_or(false), "{} missing or empty", path.display());
    }

    // 3 schemes × 2 modes × 2 waiter counts, each with 2 positive samples.
    assert_eq!(report.cascade.len(), 12);
    for scheme in Scheme::ALL {
        assert_eq!(report.cascade.iter().filter(|c| c.scheme == scheme.name()).count(), 4, "{scheme:?}");
    }
    for c in &report.cascade {
        assert_eq!(c.samples_ns.len(), 2, "{c:?}");
        assert!(c.samples_ns.iter().all(|&ns| ns > 0), "{c:?}");
        assert!(c.summary.p50_ns > 0, "{c:?}");
    }
    assert_eq!(report.uncontended.len(), 6);
    assert!(
        report.uncontended.iter().all(|u| u.summary.count == 20 && u.summary.p50_ns > 0),
        "{:?}",
        report.uncontended
    );
    assert_eq!(report.throughput.len(), 3 * config.shared_percents.len());
    assert!(report.throughput.iter().all(|t| t.pairs_per_sec > 0.0), "{:?}", report.throughput);
    // SRSL costs exactly acquire, grant and release messages per pair: the
    // counting around the throughput runs sees every message of its run.
    for t in report.throughput.iter().filter(|t| t.scheme == "srsl") {
        assert!((t.messages_per_pair - 3.0).abs() < 0.1, "{t:?}");
    }
    assert_eq!(report.message_errors.get("shm"), Some(&0), "a lock message failed");
    assert!(report
        .ratios
        .iter()
        .all(|r| r.srsl_over_ncoshed.is_some_and(|x| x > 0.0) && r.dqnl_over_ncoshed.is_some_and(|x| x > 0.0)));

    // The JSON holds the same cells.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(config.out_dir.join("dlm.json")).unwrap()).unwrap();
    let cascade = json["cascade"].as_array().unwrap();
    assert_eq!(cascade.len(), 12);
    assert!(cascade.iter().all(|c| c["summary"]["p50_ns"].as_u64().unwrap() > 0));
    assert!(json["ratios"].as_array().unwrap().iter().any(|r| r["srsl_over_ncoshed"].as_f64().is_some()));
}
