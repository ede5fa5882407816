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
    let stale_row = stdout.lines().find(|l| l.contains("stale responses")).expect("a stale-responses row");
    assert!(stale_row.trim_end().ends_with(" 0"), "{stale_row}");
    let hits = stdout.lines().find(|l| l.contains("hit rate")).unwrap();
    assert!(!hits.contains(" 0.0 %"), "the caches served hits: {hits}");
    for file in ["demo.json", "throughput.svg", "hit-rate.svg"] {
        assert!(out.path().join(file).metadata().unwrap().len() > 0, "{file} written");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("demo.json")).unwrap()).unwrap();
    assert!(report["load"]["ok"].as_u64().unwrap() > 0);
    assert_eq!(report["proxies"].as_array().unwrap().len(), 3);
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
