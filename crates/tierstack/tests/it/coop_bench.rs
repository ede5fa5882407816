//! `tierstack bench coop` on real processes: `--figure 7` (the lookup cost
//! of each kind, every scheme, shm and tcp) and `--http` (Fig. 5/6 with CPU
//! per request), quick runs.

use crate::exe;
use serde_json::Value;
use std::process::Command;

fn run(args: &[&str], out: &std::path::Path) -> String {
    let output = Command::new(exe()).args(["bench", "coop"]).args(args).arg("--out").arg(out).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// Every scheme × {shm, tcp} × {local, remote, home} is measured from node
/// processes, with lookups that found what their kind expects, and printed
/// beside the paper's Fig. 7.
#[test]
fn bench_coop_figure_7_measures_every_lookup_kind_on_shm_and_tcp() {
    let out = tempfile::tempdir().unwrap();
    let stdout = run(&["--figure", "7", "--quick"], out.path());
    assert!(stdout.contains("Fig. 7 measured"), "{stdout}");
    assert!(stdout.contains("RDMA Read"), "the paper's column: {stdout}");
    let rows: Value = serde_json::from_slice(&std::fs::read(out.path().join("fig7.json")).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    for backend in ["shm", "tcp"] {
        for scheme in ["bcc", "ccwr", "mtacc", "hybcc", "groupcache"] {
            for kind in ["local", "remote", "home"] {
                let row = rows
                    .iter()
                    .find(|r| r["backend"] == backend && r["scheme"] == scheme && r["kind"] == kind)
                    .unwrap_or_else(|| panic!("no row {backend} {scheme} {kind}"));
                assert!(row["lookups"].as_u64().unwrap() > 0, "{row}");
                assert!(row["p50_ns"].as_u64().unwrap() > 0, "{row}");
                assert!(row["p50_min_ns"].as_u64() <= row["p50_max_ns"].as_u64(), "{row}");
                // The cooperative schemes find exactly what was stored where it was stored.
                if scheme != "groupcache" {
                    assert_eq!(row["unexpected"], 0, "{row}");
                }
            }
        }
    }
}

/// The quick real-process Fig. 5/6 run: every scheme on both quick traces,
/// each row with its CPU per request measured from the server processes
/// (positive, from a positive number of requests, no client error), the
/// simulator's derived columns beside it with a hit split within 10 points
/// of the real one, and the agreement line printed.
#[test]
fn bench_coop_http_quick_prints_every_scheme_with_its_cpu_per_request() {
    let out = tempfile::tempdir().unwrap();
    let stdout = run(&["--http", "--quick"], out.path());
    for heading in ["CPU us/req", "sim CPU us/req", "derived simulator costs", "agreement of the derived simulator"] {
        assert!(stdout.contains(heading), "missing {heading:?} in\n{stdout}");
    }
    let report: Value = serde_json::from_slice(&std::fs::read(out.path().join("coop-http.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    for trace in ["8k", "32k"] {
        for scheme in ["ac", "bcc", "ccwr", "mtacc", "hybcc", "groupcache"] {
            let row = rows
                .iter()
                .find(|r| r["trace"] == trace && r["scheme"] == scheme)
                .unwrap_or_else(|| panic!("no row {trace} {scheme}"));
            assert_eq!(row["errors"], 0, "{row}");
            assert!(row["cpu_us_per_request"].as_f64().unwrap() > 0.0, "{row}");
            assert!(row["sim_cpu_us_per_request"].as_f64().unwrap() > 0.0, "{row}");
            let split = ["local_hit_pct", "remote_hit_pct", "miss_pct"].map(|k| row[k].as_f64().unwrap());
            assert!((split.iter().sum::<f64>() - 100.0).abs() < 0.01, "{row}");
            // The simulator on the same configuration decides as the real
            // proxies do: its split is theirs within the stated bound
            // (docs/results.md: within 7 points over 96 rows; 10 here).
            for k in ["local_hit_pct", "remote_hit_pct", "miss_pct"] {
                let gap = (row[k].as_f64().unwrap() - row[format!("sim_{k}")].as_f64().unwrap()).abs();
                assert!(gap <= 10.0, "{k}: {gap:.1} points apart: {row}");
            }
        }
    }
    for sample in report["samples"].as_array().unwrap() {
        assert!(sample["requests"].as_u64().unwrap() > 0, "{sample}");
    }
}
