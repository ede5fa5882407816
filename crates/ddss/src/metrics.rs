//! What an operator watches of a node daemon ([`crate::ipc::DdssDaemon`]):
//! the control-path operations it served per coherence model and kind,
//! their errors and latency, its client connections, and its node's
//! region (allocated and total bytes, read from the region's own
//! per-class counters) and substrate counters.
//!
//! Only what goes through the daemon is counted here: a client's one-sided
//! gets and puts on its own data path never reach the daemon (that is the
//! point of the data path), and show in that client's own counters.
//! Counting is relaxed atomics and one histogram record per request.

use crate::ipc::Request;
use crate::key::Coherence;
use crate::substrate::Ddss;
use std::sync::atomic::{AtomicU64, Ordering};
use tierstack_stats::exposition::{Exposition, SecondsHistogram, REQUEST_SECONDS_BOUNDS};

/// The operation kinds of the control path, as the `op` label spells them.
const OPS: [&str; 4] = ["allocate", "free", "put", "get"];

/// The coherence models, as the `model` label spells them.
const MODELS: [&str; 6] = ["null", "temporal", "delta", "read", "write", "strict"];

fn model_index(coherence: &Coherence) -> usize {
    match coherence {
        Coherence::Null => 0,
        Coherence::Temporal { .. } => 1,
        Coherence::Delta { .. } => 2,
        Coherence::Read => 3,
        Coherence::Write => 4,
        Coherence::Strict => 5,
    }
}

/// The (op, model) of a request, `None` for `hello`.
fn classify(request: &Request) -> Option<(usize, usize)> {
    match request {
        Request::Hello => None,
        Request::Allocate { coherence, .. } => Some((0, model_index(coherence))),
        Request::Free { key } => Some((1, model_index(&key.coherence()))),
        Request::Put { key, .. } => Some((2, model_index(&key.coherence()))),
        Request::Get { key } => Some((3, model_index(&key.coherence()))),
    }
}

/// A daemon's counters (see the module documentation).
pub struct DaemonMetrics {
    /// `[op][model]`.
    operations: [[AtomicU64; MODELS.len()]; OPS.len()],
    /// `[op]`: requests answered with an error.
    errors: [AtomicU64; OPS.len()],
    /// Requests that did not parse (answered `bad_request`).
    malformed: AtomicU64,
    operation_seconds: SecondsHistogram,
    clients: AtomicU64,
    connections: AtomicU64,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        DaemonMetrics {
            operations: Default::default(),
            errors: Default::default(),
            malformed: AtomicU64::new(0),
            operation_seconds: SecondsHistogram::new(REQUEST_SECONDS_BOUNDS),
            clients: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        }
    }
}

impl DaemonMetrics {
    /// Runs `serve` on `request` and counts it: its op and model, whether
    /// it failed (by `failed` of the answer), how long it took.
    pub(crate) fn count<R>(
        &self,
        request: Request,
        serve: impl FnOnce(Request) -> R,
        failed: impl Fn(&R) -> bool,
    ) -> R {
        let kind = classify(&request);
        let start = tierstack_base::time::instant_now();
        let answer = serve(request);
        if let Some((op, model)) = kind {
            self.operation_seconds.record(tierstack_base::time::instant_now().saturating_duration_since(start));
            self.operations[op][model].fetch_add(1, Ordering::Relaxed);
            if failed(&answer) {
                self.errors[op].fetch_add(1, Ordering::Relaxed);
            }
        }
        answer
    }

    pub(crate) fn malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn client_opened(&self) {
        self.clients.fetch_add(1, Ordering::Relaxed);
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn client_closed(&self) {
        self.clients.fetch_sub(1, Ordering::Relaxed);
    }

    /// Operations of kind `op` (`allocate`, `free`, `put`, `get`) served
    /// under `model`, or 0 for a name that is neither.
    pub fn operations(&self, op: &str, model: &str) -> u64 {
        let (Some(op), Some(model)) = (OPS.iter().position(|o| *o == op), MODELS.iter().position(|m| *m == model))
        else {
            return 0;
        };
        self.operations[op][model].load(Ordering::Relaxed)
    }

    /// Writes the `tierstack_ddss_*` families; `ddss` is the daemon's
    /// substrate (its node's region and counters).
    pub fn write(&self, ddss: &Ddss, out: &mut Exposition) {
        let mut samples = Vec::with_capacity(OPS.len() * MODELS.len());
        let labels: Vec<[(&str, &str); 2]> =
            OPS.iter().flat_map(|op| MODELS.iter().map(move |model| [("model", *model), ("op", *op)])).collect();
        for (i, labels) in labels.iter().enumerate() {
            samples.push((&labels[..], self.operations[i / MODELS.len()][i % MODELS.len()].load(Ordering::Relaxed)));
        }
        out.counters(
            "tierstack_ddss_operations_total",
            "Control-path requests the daemon served, by coherence model and operation.",
            &samples,
        );
        let op_labels: Vec<[(&str, &str); 1]> = OPS.iter().map(|op| [("op", *op)]).collect();
        let errors: Vec<_> =
            op_labels.iter().zip(&self.errors).map(|(l, n)| (&l[..], n.load(Ordering::Relaxed))).collect();
        out.counters("tierstack_ddss_operation_errors_total", "Control-path requests answered with an error.", &errors);
        out.counter(
            "tierstack_ddss_malformed_requests_total",
            "Control-path lines that were not a request (answered bad_request).",
            self.malformed.load(Ordering::Relaxed),
        );
        out.histogram(
            "tierstack_ddss_operation_seconds",
            "Time the daemon took to serve a control-path request.",
            &self.operation_seconds,
        );
        out.gauge(
            "tierstack_ddss_clients",
            "Client connections open now.",
            self.clients.load(Ordering::Relaxed) as f64,
        );
        out.counter(
            "tierstack_ddss_client_connections_total",
            "Client connections accepted.",
            self.connections.load(Ordering::Relaxed),
        );
        if let Ok(usage) = ddss.usage(ddss.node()) {
            let allocated: u64 = usage.iter().map(|(capacity, _, used)| u64::from(*capacity) * used).sum();
            let total: u64 = usage.iter().map(|(capacity, slots, _)| u64::from(*capacity) * u64::from(*slots)).sum();
            out.gauge(
                "tierstack_ddss_allocated_bytes",
                "Capacity of the allocations live in this node's region.",
                allocated as f64,
            );
            out.gauge(
                "tierstack_ddss_region_capacity_bytes",
                "Capacity of every slot of this node's region.",
                total as f64,
            );
        }
        let stats = ddss.stats();
        out.counters(
            "tierstack_ddss_gets_total",
            "Gets by this node's substrate handle, by how they were answered.",
            &[
                (&[("path", "copy")], stats.gets_from_copy),
                (&[("path", "validated")], stats.gets_validated),
                (&[("path", "fetched")], stats.gets_fetched),
                (&[("path", "locked")], stats.gets_locked),
            ],
        );
        out.counter("tierstack_ddss_puts_total", "Puts by this node's substrate handle.", stats.puts);
        out.counter(
            "tierstack_ddss_lock_takeovers_total",
            "Key locks taken over from a holder whose process is gone.",
            stats.lock_takeovers,
        );
        out.counter(
            "tierstack_ddss_values_lost_total",
            "Takeovers that found a value half-written and marked it lost.",
            stats.values_lost,
        );
    }
}
