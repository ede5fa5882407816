//! The simulator against real processes: one small configuration run both
//! ways.
//!
//! Real: two `tierstack origin` processes (a worldcup-like trace as a
//! synthetic set, a 500 kB memory cache that evicts, an emulated disk of
//! 20 ms + 50 MB/s) loaded by `tierstack load`; simulated: `tierstack sim`
//! with the same trace, seed, nodes, cache and disk and `measured` costs. Two
//! configurations in which each node sees a deterministic sequence:
//! - two connections with fixed targets (connection w asks node w, a prefix
//!   of worker w's stream); the simulator's clients issue each node's real
//!   request count (`--client-requests`), since the real split of a shared
//!   request budget between connections depends on timing;
//! - one connection choosing a random node per request (`TargetChooser`) and
//!   opening a new TCP connection each time; requests are sequential, so the
//!   same budget gives the same per-node sequences.
//!
//! Checks: per node, requests, hits, misses, disk reads and disk busy time
//! agree exactly; throughput real/simulated within 0.75–1.10 (the bounds and
//! why: `THROUGHPUT_RATIO_MIN`/`MAX`). Why close to 1: the runs are
//! disk-bound (over 90 % of each request's modelled time is the emulated disk,
//! whose service times are the same on both sides, checked exactly through
//! disk busy time); the rest is per-request overhead (the real client, the
//! loopback, the origin's wake-up at the read's completion), which
//! `measured.toml` calibrates on hits at about 0.1 ms, which a miss pays
//! somewhat more of (about 0.2 ms more: its wake-up), and which varies with
//! the other work on this shared 2-core machine. Measured real/simulated:
//! 0.92–0.99 (fixed) and 0.95–0.98 (random, new connections), the lowest at
//! load average 41 (docs/sim.md).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tierstack_deploy::process::free_loopback_port;

const STEP: Duration = Duration::from_secs(60);
const TRACE: &str = "worldcup";
const SEED: &str = "3";
const CACHE_BYTES: &str = "500000";
const DISK_SEEK_US: &str = "20000";
const DISK_MB_PER_S: &str = "50";
const REQUESTS: u64 = 300;
/// Accepted range of real / simulated throughput. Above: the real run
/// cannot beat its emulated disk, so more than 10 % above the model means
/// the model's disk or costs are wrong. Below: the real side also pays for
/// whatever else runs on the machine (other tests of the suite, builds), which
/// the model's measured costs do not contain; 0.852 was seen with the whole
/// suite running at load average 20 on 2 cores, hence 0.75.
const THROUGHPUT_RATIO_MAX: f64 = 1.10;
const THROUGHPUT_RATIO_MIN: f64 = 0.75;

struct Origin {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Origin {
    fn start() -> Origin {
        for attempt in 0.. {
            let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
            let mut child = Command::new(env!("CARGO_BIN_EXE_tierstack"))
                .args(["origin", "--listen", &listen.to_string(), "--admin", &admin.to_string()])
                .args(["--trace", TRACE, "--seed", SEED, "--cache-bytes", CACHE_BYTES])
                .args(["--disk-seek-us", DISK_SEEK_US, "--disk-mb-per-s", DISK_MB_PER_S])
                .arg("--stop-on-stdin-eof")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let (tx, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in stdout.lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            match lines.recv_timeout(STEP) {
                Ok(line) if line == "ready" => return Origin { child, listen, admin },
                other if attempt < 2 => {
                    eprintln!("origin did not start ({other:?}); retrying");
                    let _ = child.kill();
                    let _ = child.wait();
                }
                other => panic!("origin did not start: {other:?}"),
            }
        }
        unreachable!()
    }

    fn stats(&self) -> Value {
        let mut stream = TcpStream::connect(self.admin).unwrap();
        stream.set_read_timeout(Some(STEP)).unwrap();
        write!(stream, "GET /stats HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a header block");
        serde_json::from_slice(&answer[split + 4..]).expect("/stats is JSON")
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        drop(self.child.stdin.take()); // the origin serves until its stdin closes
        let _ = self.child.wait();
    }
}

fn count(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {value}"))
}

fn tierstack(args: &[String]) {
    let status = Command::new(env!("CARGO_BIN_EXE_tierstack"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    assert!(status.success(), "tierstack {args:?} failed: {status}");
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Runs `tierstack load` with `load_flags` against two fresh origins, then
/// `tierstack sim` with the same trace, seed, cache and disk plus `sim_flags`
/// (a function of the real per-node request counts); checks the counts
/// exactly and the throughput within the tolerance.
fn run_both(load_flags: &[&str], sim_flags: impl Fn(&[u64]) -> Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let origins = [Origin::start(), Origin::start()];
    let targets: Vec<String> = origins.iter().map(|o| format!("http://{}", o.listen)).collect();

    let load_json = dir.path().join("load.json");
    let mut load = strings(&["load", "--trace", TRACE, "--seed", SEED, "--update-interval-ms", "0"]);
    load.extend(["--target".to_string(), targets.join(","), "--requests".to_string(), REQUESTS.to_string()]);
    load.extend(["--json".to_string(), load_json.display().to_string()]);
    load.extend(strings(load_flags));
    tierstack(&load);
    let real: Value = serde_json::from_slice(&std::fs::read(&load_json).unwrap()).unwrap();
    let stats: Vec<Value> = origins.iter().map(Origin::stats).collect();
    drop(origins);

    let per_node: Vec<u64> = stats.iter().map(|s| count(s, "requests")).collect();
    assert_eq!(per_node.iter().sum::<u64>(), REQUESTS, "every request reached one origin");
    let sim_json = dir.path().join("sim.json");
    let mut sim = strings(&["sim", "--nodes", "2", "--trace", TRACE, "--seed", SEED, "--costs", "measured"]);
    sim.extend(strings(&["--cache-bytes", CACHE_BYTES, "--disk-seek-us", DISK_SEEK_US]));
    sim.extend(strings(&["--disk-mb-per-s", DISK_MB_PER_S]));
    sim.extend(["--json".to_string(), sim_json.display().to_string()]);
    sim.extend(sim_flags(&per_node));
    tierstack(&sim);
    let simulated: Value = serde_json::from_slice(&std::fs::read(&sim_json).unwrap()).unwrap();

    for (node, real_node) in stats.iter().enumerate() {
        let sim_node = &simulated["per_node"][node];
        for (real_key, sim_key) in [
            ("requests", "requests"),
            ("cache_hits", "hits"),
            ("cache_misses", "misses"),
            ("disk_reads", "disk_reads"),
            ("disk_busy_ns", "disk_busy_ns"),
        ] {
            assert_eq!(count(real_node, real_key), count(sim_node, sim_key), "node {node}: {real_key}");
        }
        assert!(count(real_node, "cache_hits") > 0 && count(real_node, "cache_misses") > 0, "both paths exercised");
        assert!(count(sim_node, "evictions") > 0, "the cache is small enough to evict");
    }
    let connections = |v: &Value, key: &str| count(v, key);
    if load_flags.contains(&"--new-connection-per-request") {
        assert_eq!(connections(&simulated["totals"], "connections"), REQUESTS);
    }

    let real_throughput = real["throughput_rps"].as_f64().unwrap();
    let sim_throughput = simulated["throughput_per_s"].as_f64().unwrap();
    let ratio = real_throughput / sim_throughput;
    eprintln!("throughput: real {real_throughput:.1} req/s, simulated {sim_throughput:.1} req/s, ratio {ratio:.3}");
    assert!(
        (THROUGHPUT_RATIO_MIN..=THROUGHPUT_RATIO_MAX).contains(&ratio),
        "real {real_throughput} vs simulated {sim_throughput}: ratio {ratio:.3} outside {THROUGHPUT_RATIO_MIN}..={THROUGHPUT_RATIO_MAX}"
    );
}

/// Two connections, fixed targets (connection w asks node w); the simulator
/// replays each connection's real request count.
#[test]
fn fixed_targets_two_connections_agree() {
    run_both(&["--connections", "2", "--target-choice", "fixed"], |per_node| {
        let counts = per_node.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        vec!["--client-requests".to_string(), counts]
    });
}

/// One connection choosing a random node per request, a new TCP connection
/// each time: requests are sequential, so each node's sequence is fixed by the
/// seed, and the simulator runs the same budget.
#[test]
fn random_targets_new_connections_agree() {
    run_both(&["--connections", "1", "--target-choice", "random", "--new-connection-per-request"], |_| {
        strings(&["--clients", "1", "--target-choice", "random", "--new-connection-per-request"])
            .into_iter()
            .chain(["--requests".to_string(), REQUESTS.to_string()])
            .collect()
    });
}
