//! `tierstack demo`, the README's main job, as a user runs it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_tierstack")
}

/// The pids of `pid`'s child processes.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !matches!(s.rsplit(')').next().and_then(|r| r.trim_start().chars().next()), Some('Z' | 'X')))
        .unwrap_or(false)
}

#[test]
fn the_demo_runs_checks_staleness_and_writes_its_report() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(exe()).args(["demo", "--duration-s", "3", "--out"]).arg(out.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    // The summary table's value of `metric` (rows are `metric  value`, aligned).
    let row = |metric: &str| -> String {
        stdout
            .lines()
            .find_map(|l| {
                let parts: Vec<&str> = l.trim().split("  ").map(str::trim).filter(|p| !p.is_empty()).collect();
                (parts.len() == 2 && parts[0] == metric).then(|| parts[1].to_string())
            })
            .unwrap_or_else(|| panic!("a {metric:?} row in {stdout}"))
    };
    assert_eq!(row("stale responses"), "0");
    // Every error category is printed, and every one is zero.
    for category in [
        "connect",
        "io",
        "timeout",
        "status 4xx",
        "status 5xx",
        "status other",
        "missing deps",
        "malformed deps",
        "deps wrong key",
        "body mismatch",
    ] {
        assert_eq!(row(&format!("error: {category}")), "0", "{category}");
    }
    assert_eq!(row("errors"), "0");
    assert_eq!(row("update errors"), "0");
    // Every request was checked, body included.
    let checked: u64 = row("checked ok").parse().unwrap();
    assert!(checked > 0);
    assert_eq!(row("requests"), checked.to_string());
    assert_eq!(row("bodies checked"), checked.to_string());
    let hits = stdout.lines().find(|l| l.contains("hit rate")).unwrap();
    assert!(!hits.contains(" 0.0 %"), "the caches served hits: {hits}");
    for file in ["demo.json", "throughput.svg", "hit-rate.svg"] {
        assert!(out.path().join(file).metadata().unwrap().len() > 0, "{file} written");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("demo.json")).unwrap()).unwrap();
    assert!(report["load"]["ok"].as_u64().unwrap() > 0);
    assert_eq!(report["proxies"].as_array().unwrap().len(), 3);
    // The load client's runtime threads run on CPU 0 with the proxies (the
    // application tier has the other CPU).
    let threads = report["load_client_threads"].as_array().unwrap();
    let workers: Vec<_> = threads.iter().filter(|t| t["name"].as_str().unwrap().starts_with("tokio-")).collect();
    assert!(!workers.is_empty(), "{threads:?}");
    // SAFETY: sysconf has no preconditions.
    if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } >= 2 {
        assert!(workers.iter().all(|t| t["cpus"] == "0"), "every runtime thread is pinned to CPU 0: {threads:?}");
    }
}

#[test]
fn interrupting_the_demo_stops_every_process_it_started() {
    let out = tempfile::tempdir().unwrap();
    let mut demo = Command::new(exe())
        .args(["demo", "--duration-s", "60", "--out"])
        .arg(out.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = demo.id();
    // Wait (bounded) until the module, the server and the proxies run.
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = loop {
        let kids = children(pid);
        if kids.len() >= 5 {
            break kids;
        }
        assert!(Instant::now() < deadline, "the demo did not start its processes");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
    let stdout = BufReader::new(demo.stdout.take().unwrap()).lines().map_while(Result::ok).collect::<Vec<_>>();
    let stderr = BufReader::new(demo.stderr.take().unwrap()).lines().map_while(Result::ok).collect::<Vec<_>>();
    let status = demo.wait().unwrap();
    assert!(status.success(), "interrupted demo exits cleanly: {stdout:?} {stderr:?}");
    // Interrupted while starting, or while running (then with its summary).
    let during_start = stderr.iter().any(|l| l.contains("interrupted during start-up"));
    let with_summary = stdout.iter().any(|l| l.contains("stale responses"));
    assert!(during_start || with_summary, "{stdout:?} {stderr:?}");
    for child in started {
        assert!(!alive(child), "process {child} outlived the demo");
    }
}
