//! The monitoring service's `/metrics` families: a monitored node's
//! published load and what its agent served ([`write_agent`]), and what a
//! reconfiguration agent saw and did ([`ReconfigMetrics`]).
//!
//! One-sided reads of the load record take no CPU on the monitored node
//! and are not counted anywhere there; what is counted is what the node
//! itself does (records written, Socket-Sync answers, Socket-Async frames).

use crate::agent::AgentView;
use std::sync::atomic::{AtomicU64, Ordering};
use tierstack_base::NodeId;
use tierstack_stats::exposition::Exposition;

/// Writes the `tierstack_monitor_*` families of a running agent.
pub fn write_agent(view: &AgentView, out: &mut Exposition) {
    let record = view.record();
    let c = record.counters;
    let mut gauge = |name: &str, help: &str, value: f64| out.gauge(&format!("tierstack_monitor_{name}"), help, value);
    gauge("running_threads", "Published load: threads doing work.", f64::from(c.running_threads));
    gauge("open_connections", "Published load: client connections open.", f64::from(c.open_connections));
    gauge(
        "in_flight_requests",
        "Published load: requests between their start and their end.",
        f64::from(c.in_flight_requests),
    );
    gauge("queue_length", "Published load: requests waiting for a worker.", f64::from(c.queue_len));
    let k = record.kernel;
    if let Some(procs) = k.procs_running {
        gauge("procs_running", "Runnable tasks on the host, last kernel sample.", f64::from(procs));
    }
    if let Some(permille) = k.cpu_busy_permille {
        gauge(
            "cpu_busy_ratio",
            "Share of CPU time busy between the last two kernel samples.",
            f64::from(permille) / 1000.0,
        );
    }
    if let Some(kib) = k.mem_available_kib {
        gauge("memory_available_bytes", "MemAvailable of the host, last kernel sample.", kib as f64 * 1024.0);
    }
    if let Some(centi) = k.psi_cpu_some_centi {
        gauge("cpu_pressure_ratio", "PSI cpu some avg10 of the host, last kernel sample.", f64::from(centi) / 10_000.0);
    }
    let stats = view.stats();
    let mut counter =
        |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_monitor_{name}"), help, value);
    counter("sync_reads_total", "Socket-Sync requests answered.", stats.sync_reads);
    counter("frames_pushed_total", "Socket-Async frames sent to subscribers.", stats.frames_pushed);
    counter("records_written_total", "Load records written for one-sided readers (RDMA-Async).", stats.records_written);
    counter("record_errors_total", "Load records that could not be written.", stats.record_errors);
    out.gauge("tierstack_monitor_subscribers", "Socket-Async subscribers now.", stats.subscribers as f64);
}

/// What a reconfiguration agent saw and did, kept with relaxed atomics by
/// [`crate::ReconfigAgent::step`] and read by a metrics listener.
pub struct ReconfigMetrics {
    nodes: Vec<NodeId>,
    windows: AtomicU64,
    move_decisions: AtomicU64,
    moves: AtomicU64,
    lost_claims: AtomicU64,
    nodes_seen: AtomicU64,
    /// Per back end (as `nodes`): its load and site in the last window it
    /// was seen (`u64::MAX`: not seen yet).
    loads: Vec<AtomicU64>,
    sites: Vec<AtomicU64>,
}

/// What one window gave, for [`ReconfigMetrics::window`].
pub(crate) enum WindowOutcome {
    Stay,
    Moved,
    Lost,
}

impl ReconfigMetrics {
    pub(crate) fn new(nodes: &[NodeId]) -> Self {
        let unseen = || nodes.iter().map(|_| AtomicU64::new(u64::MAX)).collect();
        ReconfigMetrics {
            nodes: nodes.to_vec(),
            windows: AtomicU64::new(0),
            move_decisions: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            lost_claims: AtomicU64::new(0),
            nodes_seen: AtomicU64::new(0),
            loads: unseen(),
            sites: unseen(),
        }
    }

    /// Back end `index` was seen at `site` with `load`.
    pub(crate) fn seen(&self, index: usize, site: u16, load: u32) {
        if let (Some(l), Some(s)) = (self.loads.get(index), self.sites.get(index)) {
            l.store(u64::from(load), Ordering::Relaxed);
            s.store(u64::from(site), Ordering::Relaxed);
        }
    }

    /// A window judged over `seen` back ends.
    pub(crate) fn window(&self, seen: usize, outcome: WindowOutcome) {
        self.windows.fetch_add(1, Ordering::Relaxed);
        self.nodes_seen.store(seen as u64, Ordering::Relaxed);
        let counter = match outcome {
            WindowOutcome::Stay => return,
            WindowOutcome::Moved => &self.moves,
            WindowOutcome::Lost => &self.lost_claims,
        };
        self.move_decisions.fetch_add(1, Ordering::Relaxed);
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Windows judged so far.
    pub fn windows(&self) -> u64 {
        self.windows.load(Ordering::Relaxed)
    }

    /// Moves this agent made.
    pub fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }

    /// Writes the `tierstack_reconfig_*` families.
    pub fn write(&self, out: &mut Exposition) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.counter("tierstack_reconfig_windows_total", "Windows the agent read and judged.", self.windows());
        out.counter(
            "tierstack_reconfig_move_decisions_total",
            "Windows in which the policy asked for a move.",
            load(&self.move_decisions),
        );
        out.counter("tierstack_reconfig_moves_total", "Nodes this agent moved to another site.", self.moves());
        out.counter(
            "tierstack_reconfig_lost_claims_total",
            "Moves another agent claimed first (the compare-and-swap failed).",
            load(&self.lost_claims),
        );
        out.gauge(
            "tierstack_reconfig_backends_seen",
            "Back ends alive and readable in the last window.",
            load(&self.nodes_seen) as f64,
        );
        let names: Vec<String> = self.nodes.iter().map(|n| n.0.to_string()).collect();
        let labels: Vec<[(&str, &str); 1]> = names.iter().map(|n| [("node", n.as_str())]).collect();
        let per_node = |values: &[AtomicU64]| -> Vec<(&[(&str, &str)], f64)> {
            labels
                .iter()
                .zip(values)
                .filter(|(_, v)| load(v) != u64::MAX)
                .map(|(l, v)| (&l[..], load(v) as f64))
                .collect()
        };
        out.gauges(
            "tierstack_reconfig_backend_load",
            "A back end's load (threads plus requests in flight), last seen.",
            &per_node(&self.loads),
        );
        out.gauges(
            "tierstack_reconfig_backend_site",
            "The site a back end's role word named, last seen.",
            &per_node(&self.sites),
        );
    }
}
