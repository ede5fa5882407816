//! `bench ddss` end to end on a tiny configuration (home node in this
//! process, since the `tierstack` binary is not built for this crate's
//! tests): every cell is measured, the JSON and both plots are written, and
//! every latency is a real sample.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use tierstack_bench::ddss::{run, DdssBenchConfig, Home};
use tierstack_cluster::Backend;
use tierstack_ddss::Coherence;

#[test]
fn tiny_ddss_bench_writes_json_and_plots_with_positive_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DdssBenchConfig::new(dir.path().join("ddss"), Home::InProcess, true);
    config.backends = vec![Backend::Shm, Backend::Tcp];
    config.iterations = 5;
    config.warmup = 1;
    config.sizes = vec![1, 4096];
    config.redis = false;
    let report = run(&config).unwrap();

    for file in ["ddss.json", "ddss-put-latency.svg", "ddss-size.svg"] {
        let path = config.out_dir.join(file);
        assert!(std::fs::metadata(&path).map(|m| m.len() > 0).unwrap_or(false), "{} missing or empty", path.display());
    }
    assert!(report.home.contains("inside this process"), "{}", report.home);
    assert_eq!(report.redis_skipped.as_deref(), Some("not requested"));
    let json = std::fs::read_to_string(config.out_dir.join("ddss.json")).unwrap();
    assert!(json.contains("one code path for all six models"), "the report says the put paths coincide");

    let models = Coherence::examples();
    for system in ["ddss-shm", "ddss-tcp"] {
        for model in &models {
            let name = model.to_string();
            for op in ["put", "get"] {
                let cell = report.cell(system, "model", op, &name, 1).unwrap_or_else(|| panic!("{system} {op} {name}"));
                assert_eq!(cell.latency.count, 5);
                assert!(cell.latency.p50_ns > 0 && cell.latency.mean_ns > 0.0, "{cell:?}");
            }
            for bytes in [1, 4096] {
                let cell = report.cell(system, "grid", "put", &name, bytes).expect("grid cell");
                assert!(cell.latency.p50_ns > 0, "{cell:?}");
            }
        }
        for bytes in [1, 4096] {
            for op in ["put", "get"] {
                let cell = report.cell(system, "size", op, "write", bytes).expect("size cell");
                assert!(cell.latency.p50_ns > 0, "{cell:?}");
            }
        }
    }
    // 2 backends × (6 models × 2 ops + 2 sizes × 2 ops + 6 models × 2 sizes).
    assert_eq!(report.cells.len(), 2 * (12 + 4 + 12));

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(config.out_dir.join("ddss.json")).unwrap()).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), report.cells.len());
    assert!(cells.iter().all(|c| c["latency"]["p50_ns"].as_u64().unwrap() > 0));
    let svg = std::fs::read_to_string(config.out_dir.join("ddss-put-latency.svg")).unwrap();
    assert!(svg.contains("ddss-tcp strict"), "the plot has a line per backend and model");
}

#[test]
fn a_redis_comparison_that_fails_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DdssBenchConfig::new(dir.path().join("ddss"), Home::InProcess, true);
    config.backends = vec![Backend::Shm];
    config.iterations = 2;
    config.warmup = 0;
    config.sizes = vec![1];
    config.models = vec![Coherence::Write];
    // A "redis-server" that exits at once: found, started, never answers.
    config.redis_server = Some("false".into());
    let error = run(&config).expect_err("a failed comparison must fail the run");
    assert!(error.to_string().contains("redis comparison failed"), "{error:#}");
    let json = std::fs::read_to_string(config.out_dir.join("ddss.json")).expect("what was measured is written");
    assert!(json.contains("failed: "), "the report says redis failed: {json}");
}
