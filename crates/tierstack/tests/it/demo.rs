//! `tierstack demo`, the README's main job, as a user runs it.

use crate::exe;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

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

/// Cells of an aligned table line (cells are separated by at least two spaces).
fn cells(line: &str) -> Vec<String> {
    line.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_string).collect()
}

/// The comparison table in `text`: its header's cells and its rows' cells,
/// from the title line to the first blank line (or the end of a code block).
fn comparison_table(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines =
        text.lines().skip_while(|l| !l.starts_with("== tierstack demo: the same load through each cache =="));
    assert!(lines.next().is_some(), "a comparison table in {text}");
    let header = cells(lines.next().expect("a header line"));
    let rows = lines.take_while(|l| !l.trim().is_empty() && !l.starts_with("```")).map(cells).collect();
    (header, rows)
}

const COLUMNS: [&str; 9] = [
    "mode",
    "throughput req/s",
    "p50 µs",
    "p99 µs",
    "hit rate",
    "version checks",
    "updates",
    "errors",
    "stale responses",
];
const MODES: [&str; 4] = ["no-cache", "ttl", "poll/tcp", "poll/shm"];

fn number(cell: &str) -> u64 {
    cell.replace(',', "").parse().unwrap_or_else(|_| panic!("a count: {cell:?}"))
}

/// What a page may not contain if it loads nothing from elsewhere.
const EXTERNAL: [&str; 8] = ["http:", "https:", "src=", "href", "url(", "@import", "<link", "<script"];

#[test]
fn the_demo_compares_the_four_modes_and_writes_a_self_contained_report() {
    let out = tempfile::tempdir().unwrap();
    // Short runs, frequent updates (so the TTL cache has something to serve
    // stale), and no compute threads: under test the point is what is
    // counted, not the speed.
    let output = Command::new(exe())
        .args(["demo", "--duration-s", "2", "--update-interval-ms", "100", "--compute-threads", "0", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));

    let (header, rows) = comparison_table(&stdout);
    assert_eq!(header, COLUMNS, "{stdout}");
    let modes: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(modes, MODES, "{stdout}");
    let column = |name: &str| COLUMNS.iter().position(|c| *c == name).unwrap();
    for row in &rows {
        assert_eq!(row.len(), COLUMNS.len(), "{row:?}");
        let (mode, count) = (row[0].as_str(), |name: &str| number(&row[column(name)]));
        let stale = count("stale responses");
        if mode == "ttl" {
            assert!(stale > 0, "a TTL cache serves stale copies after updates: {row:?}");
        } else {
            assert_eq!(stale, 0, "{mode} is coherent: {row:?}");
        }
        assert_eq!(count("errors"), 0, "{row:?}");
        assert!(count("updates") > 0, "every mode ran under updates: {row:?}");
        assert!(count("throughput req/s") > 0, "{row:?}");
        // Only polling checks versions; its hits and the TTL cache's show.
        let checks = count("version checks");
        let hit_rate = row[column("hit rate")].trim_end_matches(" %").parse::<f64>().unwrap();
        match mode {
            "no-cache" => assert_eq!((checks, hit_rate), (0, 0.0), "{row:?}"),
            "ttl" => assert!(checks == 0 && hit_rate > 0.0, "{row:?}"),
            _ => assert!(checks > 0 && hit_rate > 0.0, "{row:?}"),
        }
    }
    let verdict = stdout.lines().find(|l| l.starts_with("verdict: ")).unwrap_or_else(|| panic!("a verdict: {stdout}"));
    assert!(verdict.starts_with("verdict: poll/shm: ") && verdict.contains("ttl: "), "{verdict}");

    // The report: every run checked, body included, by three proxies.
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("demo.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.iter().map(|r| r["mode"].as_str().unwrap()).collect::<Vec<_>>(), MODES);
    for run in runs {
        let load = &run["load"];
        let checked = load["checked_ok"].as_u64().unwrap();
        assert!(checked > 0);
        assert_eq!(load["requests"], checked, "every request was checked: {}", run["mode"]);
        assert_eq!(load["bodies_checked"], checked, "every body was checked: {}", run["mode"]);
        assert_eq!(run["proxies"].as_array().unwrap().len(), 3);
    }
    // The load client's runtime threads run on CPU 0 with the proxies (the
    // application tier has the other CPU).
    let threads = report["load_client_threads"].as_array().unwrap();
    let workers: Vec<_> = threads.iter().filter(|t| t["name"].as_str().unwrap().starts_with("tokio-")).collect();
    assert!(!workers.is_empty(), "{threads:?}");
    // SAFETY: sysconf has no preconditions.
    if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } >= 2 {
        assert!(workers.iter().all(|t| t["cpus"] == "0"), "every runtime thread is pinned to CPU 0: {threads:?}");
    }

    // What else the machine was doing is recorded beside the figures.
    assert!(report["load_average_before"].as_f64().is_some_and(|l| l >= 0.0), "{}", report["load_average_before"]);

    // The page a person opens: the table, the verdict and four inline
    // plots, loading nothing from anywhere.
    let html = std::fs::read_to_string(out.path().join("index.html")).unwrap();
    for mode in MODES {
        assert!(html.contains(&format!("<td>{mode}</td>")), "{mode} in the page's table");
    }
    assert!(html.contains(&format!("<pre>{}</pre>", verdict.replace('\'', "&#39;"))), "the verdict in the page");
    assert_eq!(html.matches("<svg").count(), 4, "throughput, stale, latency and hit-rate plots inline");
    for needle in EXTERNAL {
        assert!(!html.to_ascii_lowercase().contains(needle), "the page refers outside itself: {needle}");
    }
    for file in ["throughput.svg", "stale.svg", "latency.svg", "hit-rate.svg"] {
        assert!(out.path().join(file).metadata().unwrap().len() > 0, "{file} written");
    }

    // The README's first screen shows this table: same columns, same modes.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let (readme_header, readme_rows) = comparison_table(&readme);
    assert_eq!(readme_header, header, "README's table has the demo's columns");
    assert_eq!(readme_rows.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), MODES, "README's rows");
    assert!(readme_rows.iter().all(|r| r.len() == COLUMNS.len()), "{readme_rows:?}");
    assert!(readme.lines().any(|l| l.starts_with("verdict: poll/shm: ")), "README shows a verdict");
}

#[test]
fn one_configuration_runs_alone_with_its_details() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(exe())
        .args(["demo", "--backend", "tcp", "--duration-s", "2", "--compute-threads", "0", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    // The summary table's value of `metric` (rows are `metric  value`, aligned).
    let row = |metric: &str| -> String {
        stdout
            .lines()
            .find_map(|l| {
                let parts = cells(l);
                (parts.len() == 2 && parts[0] == metric).then(|| parts[1].to_string())
            })
            .unwrap_or_else(|| panic!("a {metric:?} row in {stdout}"))
    };
    assert_eq!(row("fabric / mode"), "tcp / poll", "--backend alone keeps the default mode");
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
    let checked: u64 = row("checked ok").parse().unwrap();
    assert!(checked > 0);
    assert_eq!(row("requests"), checked.to_string());
    assert_eq!(row("bodies checked"), checked.to_string());
    assert!(!stdout.contains("== tierstack demo: the same load"), "one configuration, no comparison: {stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("demo.json")).unwrap()).unwrap();
    assert_eq!(report["runs"].as_array().unwrap().len(), 1);
    assert_eq!(report["runs"][0]["mode"], "poll/tcp");
    assert!(out.path().join("index.html").exists());
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
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(60);
    let started = loop {
        let kids = children(pid);
        if kids.len() >= 5 {
            break kids;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "the demo did not start its processes");
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
