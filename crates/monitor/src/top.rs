//! `tierstack top`'s view: every node's published load read one-sidedly —
//! the counters word as RDMA-Sync reads it (no thread of the node runs for
//! it) and the sampled record as RDMA-Async reads it (with the kernel's
//! fields and its age) — and the table it is drawn as. The binary only
//! parses its flags and loops; what a row holds and how it prints live here,
//! where a unit test pins them.

use crate::scheme::RdmaSource;
use crate::{Health, LoadSource, Reading, Scheme, SourceConfig};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::Fabric;

/// One node's line.
#[derive(Debug, Serialize)]
pub struct TopRow {
    pub node: NodeId,
    pub role: String,
    /// The counters word, read now.
    pub now: Reading,
    /// The sampler's record (kernel fields, age).
    pub sampled: Reading,
}

/// Reads the rows of a set of nodes, both ways at once.
pub struct TopReader {
    /// The watched nodes and their roles, in the order of the sources' indices.
    nodes: Vec<(NodeId, String)>,
    now: RdmaSource,
    sampled: RdmaSource,
}

impl TopReader {
    /// Watches `nodes` (id and role name) from `fabric`, redrawn every `interval`.
    pub fn new(fabric: Arc<dyn Fabric>, nodes: Vec<(NodeId, String)>, interval: Duration) -> Self {
        let ids: Vec<NodeId> = nodes.iter().map(|(id, _)| *id).collect();
        let config = SourceConfig::for_interval(interval);
        let now = RdmaSource::new(Scheme::RdmaSync, fabric.clone(), ids.clone(), config);
        let sampled = RdmaSource::new(Scheme::RdmaAsync, fabric, ids, config);
        Self { nodes, now, sampled }
    }

    /// One row per node that publishes a load (or did).
    pub fn rows(&self) -> Vec<TopRow> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, (node, role))| TopRow {
                node: *node,
                role: role.clone(),
                now: self.now.read(i),
                sampled: self.sampled.read(i),
            })
            .filter(|row| row.now.health != Health::Unknown || row.sampled.health != Health::Unknown)
            .collect()
    }
}

fn health(h: Health) -> &'static str {
    match h {
        Health::Fresh => "fresh",
        Health::Stale => "stale",
        Health::Suspect => "suspect",
        Health::Dead => "dead",
        Health::Unknown => "-",
    }
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The table: one line per row, kernel fields only from a live sample.
pub fn render(rows: &[TopRow]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Counters, KernelSample, LoadRecord};

    #[test]
    fn the_table_shows_counters_and_only_sampled_kernel_fields() {
        let counters = Counters { running_threads: 3, open_connections: 7, in_flight_requests: 2, queue_len: 1 };
        let kernel = KernelSample { procs_running: Some(4), cpu_busy_permille: Some(512), ..KernelSample::default() };
        let record = LoadRecord { t_ns: 1_000_000, counters, progress: 1, kernel };
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
