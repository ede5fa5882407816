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
