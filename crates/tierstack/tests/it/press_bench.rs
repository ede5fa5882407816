//! `tierstack bench press` runs end to end (one trace, one and two nodes,
//! short runs) and prints every table with the paper's values beside ours,
//! writes its JSON, draws its plots and its report page.

use crate::exe;
use std::process::Command;

#[test]
fn bench_press_prints_its_tables_and_draws_its_plots() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(exe())
        .args(["bench", "press", "--quick", "--duration-s", "1", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for heading in [
        "Fig. 3",
        "Fig. 4",
        "Table 2: press-base",
        "Table 2: press-rdma-1c",
        "Table 2: press-rdma,",
        "Table 2: press-zero",
        "Fig. 5",
        "traditional",
        "Fig. 6 and Table 3",
        "distrib-ho",
        "dispatch-ho",
        "The versions' order per round",
    ] {
        assert!(stdout.contains(heading), "missing {heading:?} in\n{stdout}");
    }
    // The paper's Table 2 (Base, Clarknet) is printed beside ours.
    assert!(stdout.contains("766.7") && stdout.contains("1969.5"), "{stdout}");
    for file in ["runs.json", "fig3.svg", "fig5.svg", "index.html"] {
        assert!(out.path().join(file).is_file(), "{file} written");
    }
    let runs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("runs.json")).unwrap()).unwrap();
    let runs = runs.as_array().unwrap();
    // Quick: clarknet, 8 systems on 2 nodes (9 with HAProxy), 4 on 1 node.
    let haproxy = usize::from(tierstack_deploy::haproxy::haproxy_path().is_some());
    assert_eq!(runs.len(), 8 + haproxy + 4);
    // Table 3's paper values are printed beside ours (Clarknet, PRESS-Zero).
    assert!(stdout.contains("99.6 / 99.9 / 87.4"), "{stdout}");
    for run in runs {
        assert_eq!(run["errors"], 0, "{run}");
        assert!(run["throughput_rps"].as_f64().unwrap() > 0.0, "{run}");
    }
}

/// `tierstack bench press --cpu` runs every version with two client
/// processes, prints CPU per 1,000 requests with spreads, the order per
/// round and Fig. 1's branches, and its runs account for every Zero file
/// (sent from the slab or counted as a copy) and for T's branches.
#[test]
fn bench_press_cpu_prints_cpu_per_request_for_every_version() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(exe())
        .args(["bench", "press", "--cpu", "--quick", "--duration-s", "1", "--repeats", "2"])
        .args(["--thresholds", "1", "--clients", "2", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for heading in ["CPU per 1,000 requests", "The CPU order per round", "Fig. 1's branches"] {
        assert!(stdout.contains(heading), "missing {heading:?} in\n{stdout}");
    }
    let runs: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("cpu.json")).unwrap()).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 5 * 2, "five versions, two rounds");
    for version in ["press-tcp", "press-base", "press-rdma-1c", "press-rdma", "press-zero"] {
        assert!(stdout.contains(version), "{version} printed");
        assert_eq!(runs.iter().filter(|r| r["system"] == version).count(), 2, "{version} in both rounds");
    }
    let n = |run: &serde_json::Value, key: &str| run[key].as_u64().unwrap();
    for run in runs {
        assert_eq!(run["errors"], 0, "{run}");
        assert_eq!(run["clients"], 2, "{run}");
        assert!(n(run, "requests") > 0 && run["cpu_s"].as_f64().unwrap() > 0.0, "the nodes used CPU: {run}");
        assert_eq!(run["node_cpu_pct"].as_array().unwrap().len(), 2, "{run}");
        // The nodes send inline from the request's task (issue 33's try path).
        assert!(n(run, "sends_inline") > 0, "{run}");
        let branches: Vec<u64> = run["branches"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
        // T = 1 is passed by every busy node: lines 15-22 decide requests.
        assert!(branches[4..].iter().sum::<u64>() > 0, "the load-balancing lines ran: {run}");
        if run["system"] == "press-zero" {
            // Every file Zero sent went from the slab or is counted as a copy.
            let files = run["messages"][3].as_u64().unwrap();
            assert!(files > 0, "{run}");
            assert_eq!(n(run, "files_from_slab") + n(run, "zero_copy_fallbacks"), files, "{run}");
        } else {
            assert_eq!(n(run, "files_from_slab"), 0, "{run}");
        }
    }
}

/// `--bisect-t balancing` probes T by bisection (the two ends of 1..=256,
/// then halving) and prints the T found and every probe's branch shares;
/// at T = 1 the load-balancing lines decide requests, at 256 they do not.
#[test]
fn bench_press_bisects_t_where_the_balancing_branches_start_to_matter() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(exe())
        .args(["bench", "press", "--cpu", "--quick", "--duration-s", "1", "--systems", "press-zero"])
        .args(["--bisect-t", "balancing", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for heading in ["T found per version", "Fig. 1's branches per probed T"] {
        assert!(stdout.contains(heading), "missing {heading:?} in\n{stdout}");
    }
    let runs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("bisect.json")).unwrap()).unwrap();
    let runs = runs.as_array().unwrap();
    let balancing = |t: u64| -> Option<u64> {
        let run = runs.iter().find(|r| r["threshold"] == t)?;
        Some(run["branches"].as_array().unwrap()[4..].iter().map(|b| b.as_u64().unwrap()).sum())
    };
    assert_eq!(balancing(256), Some(0), "T = 256 probed, no balancing at 16 connections: {runs:?}");
    assert!(balancing(1).unwrap() > 0, "T = 1 probed, the balancing lines ran: {runs:?}");
    // Bisection, not a sweep: the ends and at most log2(255) + 1 more.
    assert!((3..=10).contains(&runs.len()), "{} probes", runs.len());
    assert!(runs.iter().all(|r| r["system"] == "press-zero" && r["errors"] == 0), "{runs:?}");
}
