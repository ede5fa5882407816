//! Fine-grained resource monitoring by one-sided reads (svc §5.2, Fig. 7–8),
//! the load balancing it drives, and reconfiguration between sites (svc §3,
//! §6). Specification: `seed-notes.md` part (b).
//!
//! - [`record`]: what is read — four counters the serving code keeps in one
//!   packed word, and the kernel's fields a sampler adds.
//! - [`publisher`]: the monitored node's load region (`monitor.load`), kept
//!   with atomics by the code that changes the load ([`LoadPublisher`],
//!   [`GaugeGuard`]).
//! - [`agent`]: the monitored node's monitor thread and socket server (every
//!   scheme but RDMA-Sync needs one).
//! - [`scheme`]: the four schemes, front-end side ([`LoadSource`]); a reading
//!   says whether it is fresh, stale or from a dead node.
//! - [`sampler`]: `/proc` parsers.
//! - [`deviation`]: the accuracy experiment's offline join (pure).
//! - [`balance`]: the load-balancing policy (pure state machine).
//! - [`top`]: `tierstack top`'s rows (both RDMA readings of every node) and table.
//! - [`metrics`]: the `tierstack_monitor_*` and `tierstack_reconfig_*`
//!   families of `/metrics` (the monitor agent's, the reconfiguration agent's).
//! - [`reconfig`]: the role word, its one-CAS claim, and the sensitivity and
//!   history rules (pure).

pub mod agent;
mod args;
pub mod balance;
pub mod deviation;
pub mod metrics;
pub mod publisher;
pub mod reconfig;
pub mod record;
pub mod sampler;
pub mod scheme;
pub mod top;

pub use agent::{AgentConfig, AgentStats, AgentView, MonitorAgent};
pub use balance::{Balancer, BalancerConfig, Decision, FailureConfig, Failures, Policy};
pub use publisher::{GaugeGuard, LoadPublisher};
pub use reconfig::{AgentEvent, ReconfigAgent, ReconfigConfig, RoleStamp, RoleWord, ROLE_HEADER};
pub use record::{Counters, Gauge, KernelSample, LoadRecord};
pub use scheme::{open_source, BackendAddress, Health, LoadSource, Reading, Scheme, SourceConfig};

use tierstack_base::NodeId;
use tierstack_fabric::FabricError;

/// What can go wrong in the monitoring service.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("{0}")]
    BadConfig(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("a lock of the monitor was poisoned by a panic")]
    Poisoned,
    #[error("{node}'s {name} region holds no role word", name = reconfig::ROLE_REGION)]
    NotARoleRegion { node: NodeId },
    #[error("the role word changed under its holder: it reads {found:?}")]
    NotHolder { found: reconfig::RoleWord },
}
