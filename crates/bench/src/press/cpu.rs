//! `tierstack bench press --cpu`: what the paper's versions differ in, on a
//! host too small and too shared to saturate them.
//!
//! - **CPU per request**: user + system CPU-seconds of every node process
//!   (`/proc/<pid>/stat`, all threads) over the measured window, divided by
//!   the requests the nodes counted in it, per 1,000 requests. It does not
//!   depend on how busy the host is the way throughput does, and it is the
//!   quantity the versions trade (copies, messages, polling, wake-ups).
//!   Every version runs in every round, the order alternated between
//!   rounds; each version's ratio to TCP is taken within a round, and the
//!   spread (min–max over the rounds) is printed beside the mean.
//! - **Throughput with several client processes** (`--clients N`: `N`
//!   `tierstack load` processes, the connections split among them) and each
//!   node's CPU utilisation in the window: the nodes are saturated only
//!   when their utilisation is near 100 % of a core each, which this host
//!   (2 cores shared with other work) allows only for one or two nodes.
//! - **Fig. 1's branches per T** (`--thresholds`): the share of client
//!   requests decided by each line of Fig. 1; with T = 256 the
//!   load-balancing lines (15-22) never run at these connection counts.

use super::{load_average, run_at, PressBenchConfig, PressRun};
use crate::html::Page;
use crate::report::{write_json, Table};
use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};
use tierstack_press_node::transport::BRANCHES;

/// The five versions, in the paper's order of falling CPU cost.
const VERSIONS: [&str; 5] = ["press-tcp", "press-base", "press-rdma-1c", "press-rdma", "press-zero"];

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory effects; it returns -1 on error.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU-seconds of a process from the text of its
/// `/proc/<pid>/stat` (fields 14 and 15; the command name, field 2, may
/// hold spaces and parentheses, so the fields are counted after its last `)`).
pub(crate) fn parse_stat(text: &str, ticks: f64) -> Option<f64> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) is index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks)
}

/// CPU-seconds so far of each process in `pids`.
pub(super) fn cpu_seconds(pids: &[u32]) -> Result<Vec<f64>> {
    let ticks = ticks_per_second();
    pids.iter()
        .map(|pid| {
            let path = format!("/proc/{pid}/stat");
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
            parse_stat(&text, ticks).with_context(|| format!("parsing {path}"))
        })
        .collect()
}

/// Drives `targets` with `config.clients` `tierstack load` processes for
/// `duration_s`, the connections split among them; returns their summed
/// throughput, their mean latency (weighted by requests) and their errors.
/// Every process replays the same synthesized trace (seed 1, as the nodes
/// serve it), its connections' streams those of the in-bench client.
pub(super) fn load_processes(
    config: &PressBenchConfig,
    targets: &[String],
    spec: &str,
    duration_s: u64,
) -> Result<(f64, f64, u64)> {
    let dir = tempfile::tempdir()?;
    let clients = config.clients.max(1);
    let mut children = Vec::with_capacity(clients);
    for i in 0..clients {
        let connections = (config.connections / clients + usize::from(i < config.connections % clients)).max(1);
        let json = dir.path().join(format!("client-{i}.json"));
        let child = Command::new(&config.exe)
            .args(["load", "--target", &targets.join(","), "--target-choice", "random"])
            .args(["--new-connection-per-request", "--static-content", "--trace", spec])
            .args(["--connections", &connections.to_string(), "--duration-s", &duration_s.to_string()])
            .arg("--json")
            .arg(&json)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a `tierstack load` client")?;
        children.push((child, json));
    }
    let (mut rps, mut latency_weighted, mut requests, mut errors) = (0.0, 0.0, 0u64, 0u64);
    for (mut child, json) in children {
        let status = child.wait()?;
        if !status.success() {
            bail!("a `tierstack load` client failed: {status}");
        }
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
        let n = report["requests"].as_u64().unwrap_or(0);
        rps += report["throughput_rps"].as_f64().unwrap_or(0.0);
        latency_weighted += report["latency"]["mean_ns"].as_f64().unwrap_or(0.0) * n as f64;
        requests += n;
        errors += report_errors(&report);
    }
    let latency_ms = if requests == 0 { f64::NAN } else { latency_weighted / requests as f64 / 1e6 };
    Ok((rps, latency_ms, errors))
}

/// The error total of a `tierstack load` JSON report (every error kind summed).
fn report_errors(report: &serde_json::Value) -> u64 {
    report["errors"].as_object().map_or(0, |kinds| kinds.values().filter_map(serde_json::Value::as_u64).sum())
}

/// Mean, min and max of `values` (NaN for none).
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, min, max)
}

fn per_k(n: u64, requests: u64) -> f64 {
    if requests == 0 {
        f64::NAN
    } else {
        n as f64 * 1000.0 / requests as f64
    }
}

/// The PRESS versions among `config.systems` (all five if none is).
pub(super) fn versions(config: &PressBenchConfig) -> Vec<&'static str> {
    let versions: Vec<&str> = VERSIONS.iter().copied().filter(|v| config.systems.iter().any(|s| s == v)).collect();
    if versions.is_empty() {
        VERSIONS.to_vec()
    } else {
        versions
    }
}

/// Runs every version at every T, `config.repeats` rounds, on the largest
/// node count; prints the capacity tables and writes `cpu.json`.
pub(super) fn run(config: &PressBenchConfig) -> Result<Vec<PressRun>> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let nodes = config.nodes.iter().copied().max().unwrap_or(2).max(2);
    let versions = versions(config);
    let mut runs = Vec::new();
    for repeat in 0..config.repeats.max(1) {
        for trace in &config.traces {
            for &threshold in &config.thresholds {
                let order: Vec<&str> =
                    if repeat % 2 == 0 { versions.clone() } else { versions.iter().rev().copied().collect() };
                for system in order {
                    eprintln!(
                        "bench press --cpu: round {repeat} {trace} T={threshold} {system} on {nodes} nodes (load \
                         average {:.2})",
                        load_average()
                    );
                    runs.push(run_at(config, trace, system, nodes, repeat, threshold)?);
                }
            }
        }
    }
    write_json(&config.out.join("cpu.json"), &runs)?;
    let mut page = Page::new("tierstack bench press --cpu: the PRESS versions' CPU cost and capacity");
    page.paragraph(&format!(
        "{nodes} nodes, traces at scale {}, {} closed-loop connections over {} client process(es) (a new connection \
         per request, random targets), {} s measured after {} s of warm-up, {} round(s), versions alternated; CPU = \
         user + system CPU-seconds of the node processes (/proc/<pid>/stat) in the measured window; host load \
         average beside each row; sends inline: {}.",
        config.scale,
        config.connections,
        config.clients,
        config.duration_s,
        config.warmup_s,
        config.repeats.max(1),
        config.send_inline
    ));
    print_tables(&mut page, config, &runs, &versions, nodes);
    page.write(&config.out)?;
    Ok(runs)
}

fn print_tables(page: &mut Page, config: &PressBenchConfig, runs: &[PressRun], versions: &[&str], nodes: usize) {
    let rounds = config.repeats.max(1);
    let mut cpu = Table::new(
        &format!(
            "CPU per 1,000 requests: node CPU-seconds, {nodes} nodes, {rounds} round(s) (paper's order: TCP highest \
             … Zero lowest)"
        ),
        &[
            "trace",
            "T",
            "version",
            "CPU-s / 1K (mean)",
            "min–max",
            "÷ TCP same round (mean)",
            "min–max",
            "req/s",
            "node CPU % (mean per node)",
            "Zero slab / copies",
            "doorbells / 1K",
            "wake-ups / 1K",
            "sends inline / pool",
            "load avg",
        ],
    );
    let mut order = Table::new(
        "The CPU order per round (holds: TCP ≥ Base ≥ RDMA-1c ≥ RDMA ≥ Zero in CPU-s per 1K)",
        &["trace", "T", "round", "TCP", "Base", "RDMA-1c", "RDMA", "Zero", "order holds", "load avg"],
    );
    let mut branches = Table::new(
        "Fig. 1's branches: share of client requests per line, all rounds (lines 15-22 are the load balancing)",
        &["trace", "T", "version", "Fwd %"].into_iter().chain(BRANCHES.iter().copied()).collect::<Vec<&str>>(),
    );
    let pick = |trace: &str, t: u32, v: &str| -> Vec<&PressRun> {
        runs.iter().filter(|r| r.trace == trace && r.threshold == t && r.system == v).collect()
    };
    for trace in &config.traces {
        for &t in &config.thresholds {
            for &v in versions {
                let rs = pick(trace, t, v);
                if rs.is_empty() {
                    continue;
                }
                let (mean, min, max) = spread(&rs.iter().map(|r| r.cpu_s_per_k()).collect::<Vec<_>>());
                let ratios: Vec<f64> = rs
                    .iter()
                    .filter_map(|r| {
                        let tcp = runs.iter().find(|x| {
                            x.trace == r.trace && x.threshold == t && x.system == "press-tcp" && x.repeat == r.repeat
                        })?;
                        Some(r.cpu_s_per_k() / tcp.cpu_s_per_k())
                    })
                    .collect();
                let (rmean, rmin, rmax) = spread(&ratios);
                let (rps, _, _) = spread(&rs.iter().map(|r| r.throughput_rps).collect::<Vec<_>>());
                let node_pct: Vec<f64> = rs.iter().flat_map(|r| r.node_cpu_pct.iter().copied()).collect();
                let (pct, pmin, pmax) = spread(&node_pct);
                let requests: u64 = rs.iter().map(|r| r.requests).sum();
                let slab: u64 = rs.iter().map(|r| r.files_from_slab).sum();
                let copies: u64 = rs.iter().map(|r| r.zero_copy_fallbacks).sum();
                let (la, _, _) = spread(&rs.iter().map(|r| r.load_average).collect::<Vec<_>>());
                cpu.row(vec![
                    trace.clone(),
                    t.to_string(),
                    v.into(),
                    format!("{mean:.3}"),
                    format!("{min:.3}–{max:.3}"),
                    format!("{rmean:.2}"),
                    format!("{rmin:.2}–{rmax:.2}"),
                    format!("{rps:.0}"),
                    format!("{pct:.0} ({pmin:.0}–{pmax:.0})"),
                    if v == "press-zero" { format!("{slab} / {copies}") } else { "–".into() },
                    format!("{:.1}", per_k(rs.iter().map(|r| r.doorbells).sum(), requests)),
                    format!("{:.1}", per_k(rs.iter().map(|r| r.wakeups).sum(), requests)),
                    format!(
                        "{} / {}",
                        rs.iter().map(|r| r.sends_inline).sum::<u64>(),
                        rs.iter().map(|r| r.sends_blocking).sum::<u64>()
                    ),
                    format!("{la:.2}"),
                ]);
                let decided: u64 = rs.iter().map(|r| r.branches.iter().sum::<u64>()).sum();
                let (fwd, _, _) = spread(&rs.iter().map(|r| r.forwarded_pct).collect::<Vec<_>>());
                let mut cells = vec![trace.clone(), t.to_string(), v.into(), format!("{fwd:.1}")];
                cells.extend((0..BRANCHES.len()).map(|i| {
                    let n: u64 = rs.iter().map(|r| r.branches[i]).sum();
                    format!("{:.1}", if decided == 0 { f64::NAN } else { 100.0 * n as f64 / decided as f64 })
                }));
                branches.row(cells);
            }
            for repeat in 0..rounds {
                let row: Vec<Option<&PressRun>> = VERSIONS
                    .iter()
                    .map(|v| {
                        runs.iter()
                            .find(|r| &r.trace == trace && r.threshold == t && r.system == *v && r.repeat == repeat)
                    })
                    .collect();
                if row.iter().any(Option::is_none) {
                    continue;
                }
                let c: Vec<f64> = row.iter().flatten().map(|r| r.cpu_s_per_k()).collect();
                let holds = c.windows(2).all(|w| w[0] >= w[1]);
                let la = row.iter().flatten().map(|r| r.load_average).sum::<f64>() / c.len() as f64;
                let mut cells = vec![trace.clone(), t.to_string(), repeat.to_string()];
                cells.extend(c.iter().map(|v| format!("{v:.3}")));
                cells.push(if holds { "yes".into() } else { "no".into() });
                cells.push(format!("{la:.2}"));
                order.row(cells);
            }
        }
    }
    page.print(&cpu);
    page.print(&order);
    page.print(&branches);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_read_after_the_command_name() {
        // A command name with spaces and a parenthesis does not shift the fields.
        let text = "1234 (tier stack) x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0 100 0 0";
        assert_eq!(parse_stat(text, 100.0), Some(3.0));
        assert_eq!(parse_stat("1 (x) S 1 2", 100.0), None, "short: an error, not a panic");
        assert_eq!(parse_stat("no parenthesis", 100.0), None);
        // This process's own line parses, and its CPU time only grows.
        let me = cpu_seconds(&[std::process::id()]).unwrap()[0];
        assert!(me >= 0.0);
        assert!(cpu_seconds(&[std::process::id()]).unwrap()[0] >= me);
    }

    #[test]
    fn spreads_ignore_missing_values() {
        assert_eq!(spread(&[1.0, f64::NAN, 3.0]), (2.0, 1.0, 3.0));
        assert!(spread(&[]).0.is_nan());
    }
}
