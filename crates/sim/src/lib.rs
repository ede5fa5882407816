//! `tierstack sim`: a trace-driven discrete-event simulator of a cluster of
//! web server nodes, where the cluster services' pure policies plug in.
//!
//! What is modelled (see `docs/sim.md` for the full account):
//! - **clients**: a closed loop of workers (each with one request
//!   outstanding, drawing documents from `Trace::stream(seed, w, workers)`
//!   and targets from `TargetChooser`, exactly as `tierstack load` does), or
//!   an open loop on its seeded schedule (`tierstack_workload::arrival`, the
//!   load client's own rule); persistent connections or one per request;
//! - **per node**: a CPU (FIFO, `cores` servers) charged per operation, a NIC
//!   transmitter (FIFO), and storage: [`tierstack_model::Storage`], a memory
//!   cache ([`tierstack_model::ByteLru`]) before a disk
//!   ([`tierstack_model::DiskQueue`]), the very code `tierstack origin` serves
//!   with: lookup (touch) → on a miss, disk read → insert;
//! - **networks**: the client network and named intra-cluster transports,
//!   each a latency plus bytes over a bandwidth ([`costs`]).
//!
//! Beside it, [`balance`] models Fig. 8b's load balancing over many back
//! ends (the monitor crate's `Balancer` fed by a model of each monitoring
//! scheme), a smaller event loop of its own.
//!
//! A [`Policy`] decides, per request, what happens ([`policy`]); the engine
//! ([`run`]) turns its actions into events and costs. Time is integer
//! nanoseconds, events are ordered by (time, sequence number), and a run is a
//! pure function of its configuration, trace, policy and seed: the same inputs
//! give a byte-identical [`SimReport`].

pub mod balance;
pub mod config;
pub mod coop;
pub mod costs;
mod engine;
pub mod policy;
pub mod press;
pub mod report;

pub use config::{Budget, ConfigError, Load, SimConfig};
pub use costs::{Costs, CostsError, TransportChoice};
pub use engine::{run, SimError};
pub use policy::{
    Action, Actions, Caching, Copies, Delivery, DocId, Done, Independent, Outcome, Policy, Request, RequestId, Served,
    Via, View,
};
pub use report::{LatencySummary, MessageCount, NodeCounts, SimReport, Utilization};
pub use tierstack_model::DiskModel;
pub use tierstack_workload::Arrivals;

/// The policies the command line can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    /// [`Independent`].
    Independent,
    /// [`coop::Coop`] with a scheme (`coop:ac`, `coop:bcc`, `coop:ccwr`,
    /// `coop:mtacc`, `coop:hybcc`, `coop:groupcache`): the proxies are the
    /// client nodes (`SimConfig::client_nodes`), the other nodes web servers.
    Coop(tierstack_coop::Scheme),
    /// [`press::Press`] in one of its communication versions (T = 256).
    Press(press::PressVersion),
}

impl PolicyName {
    pub const ALL: [&'static str; 11] = [
        "independent",
        "press-base",
        "press-rdma-1c",
        "press-rdma",
        "press-zero",
        "coop:ac",
        "coop:bcc",
        "coop:ccwr",
        "coop:mtacc",
        "coop:hybcc",
        "coop:groupcache",
    ];
}

impl std::str::FromStr for PolicyName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "independent" => Ok(Self::Independent),
            "press-base" => Ok(Self::Press(press::PressVersion::Base)),
            "press-rdma-1c" => Ok(Self::Press(press::PressVersion::Rdma1c)),
            "press-rdma" => Ok(Self::Press(press::PressVersion::Rdma)),
            "press-zero" => Ok(Self::Press(press::PressVersion::Zero)),
            other => match other.strip_prefix("coop:").map(str::parse::<tierstack_coop::Scheme>) {
                Some(Ok(scheme)) => Ok(Self::Coop(scheme)),
                _ => Err(format!("unknown policy {other:?} (known: {})", Self::ALL.join(", "))),
            },
        }
    }
}

/// Runs the named policy. For a `coop:` policy, `config.cache_bytes` is each
/// node's cooperative pool and the engine's own storage caches nothing (a
/// miss reads the web server's disk, the calibrated miss cost).
pub fn run_named(
    name: PolicyName,
    config: &SimConfig,
    trace: &tierstack_workload::Trace,
) -> Result<SimReport, SimError> {
    match name {
        PolicyName::Independent => run(config, trace, Independent),
        PolicyName::Coop(scheme) => {
            let proxies = config.client_nodes.unwrap_or(config.nodes);
            let what = |what: String| SimError::Policy { policy: "coop", what };
            if proxies >= config.nodes {
                return Err(what("needs web servers: give --client-nodes below --nodes".into()));
            }
            let sim = coop::CoopSim {
                scheme,
                proxies,
                backends: config.nodes - proxies,
                cache_bytes: config.cache_bytes,
                lookup_ns: coop::LOOKUP_NS_DEFAULT,
                lookup_fixed_ns: 0,
                announce_bytes: 0,
                miss_cpu_ns: 0,
            };
            let policy = coop::Coop::new(sim).map_err(|e| what(e.to_string()))?;
            let engine_config = SimConfig { cache_bytes: 0, ..config.clone() };
            let mut report = run(&engine_config, trace, policy)?;
            report.cache_bytes = config.cache_bytes;
            Ok(report)
        }
        PolicyName::Press(version) => {
            let policy = press::Press::new(config.nodes, version, tierstack_press::PolicyConfig::default())
                .map_err(|e| SimError::Policy { policy: version.name(), what: e.to_string() })?;
            run(config, trace, policy)
        }
    }
}
