//! What to simulate: the cluster, the clients and the costs.

use crate::costs::Costs;
use serde::Serialize;
use tierstack_model::DiskModel;
use tierstack_workload::{Arrivals, TargetChoice};

/// Most clients (closed-loop workers or open-loop streams).
pub const CLIENTS_MAX: usize = 1 << 20;
/// Most requests in one run (each keeps a few words of state).
pub const REQUESTS_MAX: u64 = 1 << 28;

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("nodes must be in 1..={max} (got {got})", max = tierstack_base::limits::NODES_MAX)]
    Nodes { got: usize },
    #[error("clients must be in 1..={CLIENTS_MAX} (got {got})")]
    Clients { got: usize },
    #[error("requests must be in 1..={REQUESTS_MAX} (got {got})")]
    Requests { got: u64 },
    #[error("open-loop rate must be a positive finite number of requests per second (got {got})")]
    Rate { got: String },
    #[error("the trace has no documents")]
    EmptyTrace,
}

/// How requests are generated.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Load {
    /// `clients` workers, each with one request outstanding (as `tierstack
    /// load`'s connections): worker `w` draws documents from
    /// `trace.stream(seed, w, clients)` and targets from
    /// `TargetChooser::new(choice, nodes, seed, w)`, one `next()` each per
    /// request.
    Closed { clients: usize, budget: Budget },
    /// Requests arrive at `rate_per_s` on `tierstack load`'s seeded schedule
    /// (`tierstack_workload::arrival`, the rule both share), whatever the state of earlier ones; request `k`
    /// takes the next document and target of stream `k % streams` (built as
    /// a closed-loop worker's). Persistent connections come from a pool of
    /// idle ones per node, as the load client's. No bound on requests in
    /// flight is modelled.
    Open { rate_per_s: f64, requests: u64, streams: usize, arrivals: Arrivals },
}

/// When a closed loop stops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Stop issuing once this many requests were issued in all (a worker
    /// checks before each request, as `tierstack load --requests` does).
    Total(u64),
    /// Worker `w` issues exactly `counts[w]` requests (replaying a real run's
    /// per-connection counts; the number of workers is `counts.len()`).
    PerClient(Vec<u64>),
}

/// Everything one run needs besides the trace and the policy.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub nodes: usize,
    /// Clients send requests to nodes `0..client_nodes` only (the front
    /// tier, e.g. the proxies before the web servers); `None`: every node.
    pub client_nodes: Option<usize>,
    pub load: Load,
    pub target_choice: TargetChoice,
    /// Every request opens (and closes) its own client connection; otherwise
    /// a client opens one connection before its first request and keeps it.
    pub new_connection_per_request: bool,
    /// Each node's memory cache.
    pub cache_bytes: u64,
    /// Larger documents are served but not cached (default: `cache_bytes`).
    pub cache_max_object_bytes: Option<u64>,
    pub disk: DiskModel,
    pub costs: Costs,
    pub seed: u64,
}

impl SimConfig {
    /// Checks the bounds a run relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nodes == 0 || self.nodes > tierstack_base::limits::NODES_MAX as usize {
            return Err(ConfigError::Nodes { got: self.nodes });
        }
        if self.client_nodes.is_some_and(|n| n == 0 || n > self.nodes) {
            return Err(ConfigError::Nodes { got: self.client_nodes.unwrap_or(0) });
        }
        let (clients, requests) = match &self.load {
            Load::Closed { clients, budget: Budget::Total(total) } => (*clients, *total),
            Load::Closed { budget: Budget::PerClient(counts), .. } => {
                (counts.len(), counts.iter().fold(0u64, |a, &c| a.saturating_add(c)))
            }
            Load::Open { rate_per_s, requests, streams, .. } => {
                if !(rate_per_s.is_finite() && *rate_per_s > 0.0) {
                    return Err(ConfigError::Rate { got: rate_per_s.to_string() });
                }
                (*streams, *requests)
            }
        };
        if clients == 0 || clients > CLIENTS_MAX {
            return Err(ConfigError::Clients { got: clients });
        }
        if requests == 0 || requests > REQUESTS_MAX {
            return Err(ConfigError::Requests { got: requests });
        }
        Ok(())
    }

    /// Number of clients (workers or streams).
    pub fn clients(&self) -> usize {
        match &self.load {
            Load::Closed { budget: Budget::PerClient(counts), .. } => counts.len(),
            Load::Closed { clients, .. } => *clients,
            Load::Open { streams, .. } => *streams,
        }
    }
}
