//! What a run reports: exact counts, modelled throughput and latency, and
//! per-resource utilization, as a text table and as JSON.

use crate::config::{Load, SimConfig};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use tierstack_model::DiskModel;
use tierstack_workload::{TargetChoice, Trace};

/// Rows of the per-node table in the text report (the JSON has every node).
pub const TEXT_NODE_ROWS: usize = 16;

/// Exact counts of one node (or, summed, of the cluster).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeCounts {
    /// Client requests that arrived here (this node was their initial node).
    pub requests: u64,
    /// Client connections opened to this node.
    pub connections: u64,
    /// `Serve` actions run here (local and for other nodes).
    pub served: u64,
    /// Of those, for requests whose initial node is another.
    pub served_for_others: u64,
    /// `Serve` lookups that found the document / did not.
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub disk_reads: u64,
    pub disk_bytes: u64,
    /// Replies sent to clients from here, and their body bytes.
    pub replies: u64,
    pub reply_bytes: u64,
    /// Intra-cluster messages and one-sided operations initiated here.
    pub messages_sent: u64,
    pub message_bytes_sent: u64,
    pub cpu_busy_ns: u64,
    pub disk_busy_ns: u64,
    pub nic_busy_ns: u64,
}

impl NodeCounts {
    fn add(&mut self, o: &NodeCounts) {
        self.requests += o.requests;
        self.connections += o.connections;
        self.served += o.served;
        self.served_for_others += o.served_for_others;
        self.hits += o.hits;
        self.misses += o.misses;
        self.evictions += o.evictions;
        self.disk_reads += o.disk_reads;
        self.disk_bytes += o.disk_bytes;
        self.replies += o.replies;
        self.reply_bytes += o.reply_bytes;
        self.messages_sent += o.messages_sent;
        self.message_bytes_sent += o.message_bytes_sent;
        self.cpu_busy_ns += o.cpu_busy_ns;
        self.disk_busy_ns += o.disk_busy_ns;
        self.nic_busy_ns += o.nic_busy_ns;
    }

    /// hits / (hits + misses), or 0 with no lookups.
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.hits + self.misses)
    }
}

/// Messages (or one-sided operations) of one kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MessageCount {
    pub messages: u64,
    pub bytes: u64,
}

/// Request latencies from issue (open loop: from the scheduled time) to the
/// reply's arrival at the client: `tierstack_stats`'s summary (nearest-rank
/// percentiles), part of this crate's API as [`SimReport::latency`].
pub use tierstack_stats::LatencySummary;

/// Busy time over the makespan (CPU: over makespan × cores), across nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Utilization {
    pub cpu_mean: f64,
    pub cpu_max: f64,
    pub disk_mean: f64,
    pub disk_max: f64,
    pub nic_mean: f64,
    pub nic_max: f64,
}

/// Everything one run reports. Deterministic: the same inputs give the same
/// report, byte for byte (no wall-clock time in it).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    pub policy: String,
    pub trace: String,
    /// Where the costs came from (set by the caller, e.g. the file name).
    pub costs: String,
    pub nodes: usize,
    pub clients: usize,
    pub seed: u64,
    pub load: Load,
    pub target_choice: TargetChoice,
    pub new_connection_per_request: bool,
    pub cache_bytes: u64,
    pub disk: DiskModel,
    /// CPU cores per node (from the costs).
    pub cpu_cores: u32,
    /// Requests issued and completed (equal in every finished run).
    pub requests: u64,
    /// Time of the last reply's arrival.
    pub makespan_ns: u64,
    /// requests / makespan.
    pub throughput_per_s: f64,
    pub latency: LatencySummary,
    /// The per-node counts summed.
    pub totals: NodeCounts,
    /// totals.hits / (totals.hits + totals.misses).
    pub hit_rate: f64,
    /// Requests served (at least once) by a node other than their initial node.
    pub forwarded_requests: u64,
    pub forwarded_share: f64,
    /// By message kind (a policy's labels).
    pub messages: BTreeMap<String, MessageCount>,
    pub utilization: Utilization,
    pub policy_counters: BTreeMap<String, u64>,
    /// Index = node.
    pub per_node: Vec<NodeCounts>,
}

/// What the engine hands over at the end of a run.
pub(crate) struct Outcome<'a> {
    pub config: &'a SimConfig,
    pub trace: &'a Trace,
    pub policy: &'static str,
    pub policy_counters: BTreeMap<String, u64>,
    pub issued: u64,
    pub completed: u64,
    pub makespan_ns: u64,
    pub latencies: Vec<u64>,
    pub forwarded: u64,
    pub messages: BTreeMap<String, MessageCount>,
    pub per_node: Vec<NodeCounts>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl SimReport {
    pub(crate) fn build(o: Outcome<'_>) -> Self {
        let latency = tierstack_stats::summarize(o.latencies);
        let mut totals = NodeCounts::default();
        for n in &o.per_node {
            totals.add(n);
        }
        let span = o.makespan_ns.max(1) as f64;
        let cores = f64::from(o.config.costs.cpu.cores.max(1));
        let spread = |f: &dyn Fn(&NodeCounts) -> f64| {
            let values: Vec<f64> = o.per_node.iter().map(f).collect();
            let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
            let max = values.iter().copied().fold(0.0, f64::max);
            (mean, max)
        };
        let (cpu_mean, cpu_max) = spread(&|n| n.cpu_busy_ns as f64 / (span * cores));
        let (disk_mean, disk_max) = spread(&|n| n.disk_busy_ns as f64 / span);
        let (nic_mean, nic_max) = spread(&|n| n.nic_busy_ns as f64 / span);
        SimReport {
            policy: o.policy.to_string(),
            trace: o.trace.label().to_string(),
            costs: String::new(),
            nodes: o.config.nodes,
            clients: o.config.clients(),
            seed: o.config.seed,
            load: o.config.load.clone(),
            target_choice: o.config.target_choice,
            new_connection_per_request: o.config.new_connection_per_request,
            cache_bytes: o.config.cache_bytes,
            disk: o.config.disk,
            cpu_cores: o.config.costs.cpu.cores,
            requests: o.completed.min(o.issued),
            makespan_ns: o.makespan_ns,
            throughput_per_s: if o.makespan_ns == 0 { 0.0 } else { o.completed as f64 * 1e9 / o.makespan_ns as f64 },
            latency,
            hit_rate: totals.hit_rate(),
            forwarded_requests: o.forwarded,
            forwarded_share: ratio(o.forwarded, o.completed),
            totals,
            messages: o.messages,
            utilization: Utilization { cpu_mean, cpu_max, disk_mean, disk_max, nic_mean, nic_max },
            policy_counters: o.policy_counters,
            per_node: o.per_node,
        }
    }

    /// The report as a text table.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let load = match &self.load {
            Load::Closed { .. } => format!("closed loop, {} clients", self.clients),
            Load::Open { rate_per_s, arrivals, .. } => {
                format!("open loop, {rate_per_s} req/s ({arrivals:?} arrivals) over {} streams", self.clients)
            }
        };
        let _ = writeln!(
            s,
            "tierstack sim: policy {}, {} nodes, {load}, target choice {}{}",
            self.policy,
            self.nodes,
            serde_json::to_value(self.target_choice)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            if self.new_connection_per_request { ", a new connection per request" } else { "" }
        );
        let _ = writeln!(
            s,
            "trace {}, seed {}, cache {} B/node, disk {} µs + {} B/s, costs {}",
            self.trace,
            self.seed,
            self.cache_bytes,
            self.disk.seek_ns as f64 / 1e3,
            self.disk.bandwidth_bytes_per_s,
            self.costs
        );
        let t = &self.totals;
        let _ = writeln!(
            s,
            "requests {}  modelled time {:.6} s  throughput {:.1} req/s",
            self.requests,
            self.makespan_ns as f64 / 1e9,
            self.throughput_per_s
        );
        let l = &self.latency;
        let _ = writeln!(
            s,
            "latency ms: mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            l.mean_ns / 1e6,
            l.p50_ns as f64 / 1e6,
            l.p90_ns as f64 / 1e6,
            l.p99_ns as f64 / 1e6,
            l.p999_ns as f64 / 1e6,
            l.max_ns as f64 / 1e6
        );
        let _ = writeln!(
            s,
            "hits {} misses {} (hit rate {:.2} %)  disk reads {}  evictions {}  forwarded {} ({:.2} %)  connections {}",
            t.hits,
            t.misses,
            100.0 * self.hit_rate,
            t.disk_reads,
            t.evictions,
            self.forwarded_requests,
            100.0 * self.forwarded_share,
            t.connections
        );
        let _ = writeln!(s, "bytes to clients {}  from disk {}", t.reply_bytes, t.disk_bytes);
        let u = &self.utilization;
        let _ = writeln!(s, "\n| utilization | mean % | max % |\n|---|---|---|");
        for (name, mean, max) in
            [("cpu", u.cpu_mean, u.cpu_max), ("disk", u.disk_mean, u.disk_max), ("nic", u.nic_mean, u.nic_max)]
        {
            let _ = writeln!(s, "| {name} | {:.2} | {:.2} |", 100.0 * mean, 100.0 * max);
        }
        if self.messages.is_empty() {
            let _ = writeln!(s, "\nintra-cluster messages: none");
        } else {
            let _ = writeln!(s, "\n| message kind | messages | bytes | mean bytes |\n|---|---|---|---|");
            for (kind, m) in &self.messages {
                let _ = writeln!(s, "| {kind} | {} | {} | {:.1} |", m.messages, m.bytes, ratio(m.bytes, m.messages));
            }
        }
        if !self.policy_counters.is_empty() {
            let _ = writeln!(s, "\n| policy counter | value |\n|---|---|");
            for (name, value) in &self.policy_counters {
                let _ = writeln!(s, "| {name} | {value} |");
            }
        }
        let shown = self.per_node.len().min(TEXT_NODE_ROWS);
        let _ = writeln!(
            s,
            "\n| node | requests | served | hits | misses | disk reads | bytes to clients | cpu % | disk % | nic % |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        let span = self.makespan_ns.max(1) as f64;
        let cores = f64::from(self.cpu_cores.max(1));
        for (i, n) in self.per_node.iter().take(shown).enumerate() {
            let _ = writeln!(
                s,
                "| {i} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
                n.requests,
                n.served,
                n.hits,
                n.misses,
                n.disk_reads,
                n.reply_bytes,
                100.0 * n.cpu_busy_ns as f64 / (span * cores),
                100.0 * n.disk_busy_ns as f64 / span,
                100.0 * n.nic_busy_ns as f64 / span
            );
        }
        if shown < self.per_node.len() {
            let _ = writeln!(s, "({} more nodes in the JSON report)", self.per_node.len() - shown);
        }
        s
    }
}
