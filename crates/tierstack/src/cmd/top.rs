//! `tierstack top`: every node's published load (`monitor.load`), read
//! one-sidedly from this process's own fabric node — the counters word as
//! RDMA-Sync reads it (no thread of the node runs for it) and the sampled
//! record as RDMA-Async reads it (with the kernel's fields and its age).
//! Redraws every interval; `--once` prints one table (or `--json`, one
//! line) and exits.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_monitor::scheme::RdmaSource;
use tierstack_monitor::{Health, LoadSource, Reading, Scheme, SourceConfig};

#[derive(Args)]
pub(crate) struct TopArgs {
    /// This process's node (an otherwise idle one, e.g. role `passive`).
    #[command(flatten)]
    at: super::NodeArgs,
    /// Redraw period.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Print once and exit.
    #[arg(long)]
    once: bool,
    /// With --once: one JSON line instead of a table.
    #[arg(long, requires = "once")]
    json: bool,
}

/// One node's line.
#[derive(Debug, Serialize)]
pub(crate) struct TopRow {
    pub node: NodeId,
    pub role: String,
    /// The counters word, read now.
    pub now: Reading,
    /// The sampler's record (kernel fields, age).
    pub sampled: Reading,
}

fn health(h: Health) -> &'static str {
    match h {
        Health::Fresh => "fresh",
        Health::Stale => "stale",
        Health::Dead => "dead",
        Health::Unknown => "-",
    }
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The table: one line per node that publishes a load (or did).
pub(crate) fn render(rows: &[TopRow]) -> String {
    let mut out = format!(
        "{:>5} {:<8} {:<6} {:>7} {:>6} {:>9} {:>6} | {:<6} {:>8} {:>6} {:>6} {:>10} {:>7}\n",
        "node",
        "role",
        "health",
        "running",
        "conns",
        "in-flight",
        "queue",
        "sample",
        "age ms",
        "procs",
        "cpu‰",
        "mem MiB",
        "psi %"
    );
    for row in rows {
        let c = row.now.record.counters;
        let k = row.sampled.record.kernel;
        let sampled = matches!(row.sampled.health, Health::Fresh | Health::Stale);
        let age = sampled.then(|| format!("{:.1}", row.sampled.age_ns() as f64 / 1e6));
        out.push_str(&format!(
            "{:>5} {:<8} {:<6} {:>7} {:>6} {:>9} {:>6} | {:<6} {:>8} {:>6} {:>6} {:>10} {:>7}\n",
            row.node.0,
            row.role,
            health(row.now.health),
            c.running_threads,
            c.open_connections,
            c.in_flight_requests,
            c.queue_len,
            health(row.sampled.health),
            opt(age),
            opt(k.procs_running.filter(|_| sampled)),
            opt(k.cpu_busy_permille.filter(|_| sampled)),
            opt(k.mem_available_kib.filter(|_| sampled).map(|kib| kib / 1024)),
            opt(k.psi_cpu_some_centi.filter(|_| sampled).map(|c| format!("{:.2}", f64::from(c) / 100.0))),
        ));
    }
    out
}

pub(crate) fn run(args: TopArgs) -> Result<()> {
    let (topology, fabric) = args.at.open()?;
    let others: Vec<_> = topology.nodes.iter().filter(|n| n.id != args.at.id()).collect();
    let ids: Vec<NodeId> = others.iter().map(|n| n.id).collect();
    let interval = Duration::from_millis(args.interval_ms.max(1));
    let config = SourceConfig::for_interval(interval);
    let now = RdmaSource::new(Scheme::RdmaSync, fabric.clone(), ids.clone(), config);
    let sampled = RdmaSource::new(Scheme::RdmaAsync, fabric, ids, config);
    loop {
        let rows: Vec<TopRow> = others
            .iter()
            .enumerate()
            .map(|(i, spec)| TopRow {
                node: spec.id,
                role: format!("{:?}", spec.role).to_lowercase(),
                now: now.read(i),
                sampled: sampled.read(i),
            })
            .filter(|row| row.now.health != Health::Unknown || row.sampled.health != Health::Unknown)
            .collect();
        let mut stdout = std::io::stdout().lock();
        if args.once {
            if args.json {
                writeln!(stdout, "{}", serde_json::to_string(&rows)?)?;
            } else {
                write!(stdout, "{}", render(&rows))?;
            }
            return Ok(());
        }
        // Home, clear, table.
        write!(stdout, "\x1b[H\x1b[2J{}", render(&rows))?;
        stdout.flush()?;
        drop(stdout);
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_monitor::{Counters, KernelSample, LoadRecord};

    #[test]
    fn the_table_shows_counters_and_only_sampled_kernel_fields() {
        let counters = Counters { running_threads: 3, open_connections: 7, in_flight_requests: 2, queue_len: 1 };
        let kernel = KernelSample { procs_running: Some(4), cpu_busy_permille: Some(512), ..KernelSample::default() };
        let record = LoadRecord { t_ns: 1_000_000, counters, kernel };
        let fresh = Reading { record, read_ns: 3_500_000, health: Health::Fresh };
        let unknown =
            Reading { record: LoadRecord { kernel, ..LoadRecord::default() }, read_ns: 0, health: Health::Unknown };
        let rows = [
            TopRow { node: NodeId(1), role: "app".into(), now: fresh, sampled: fresh },
            TopRow { node: NodeId(2), role: "app".into(), now: fresh, sampled: unknown },
        ];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        let first: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(first, ["1", "app", "fresh", "3", "7", "2", "1", "|", "fresh", "2.5", "4", "512", "-", "-"]);
        let second: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&second[8..], ["-", "-", "-", "-", "-", "-"], "no sample: no kernel fields shown");
    }
}
