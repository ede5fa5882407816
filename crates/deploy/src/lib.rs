//! Deployment: the tier processes of a topology, launched, made ready and
//! stopped, on this host.
//!
//! This is production code, not measurement: `tierstack cluster` runs it,
//! and the demo, the experiments of `tierstack-bench` and the end-to-end
//! tests launch their processes through it.
//!
//! - [`process`]: one child process ([`process::ChildNode`]): spawned with
//!   stop-on-stdin-eof set, ready once it prints `ready` (bounded by
//!   [`process::READY_TIMEOUT`]), killed on drop; also generated topologies
//!   and detached services ([`process::spawn_service`]).
//! - [`deployment`]: a 2-tier data-center (module, application server,
//!   proxies) as child processes.
//! - [`cluster`]: `tierstack cluster up|status|down`, a topology's
//!   `[node.service]` sections as detached processes, tracked in a state
//!   file so that `down` never signals a reused pid.
//! - [`supervise`]: the supervisor `cluster up` runs detached and the demo
//!   in-process: starts a topology's services in order, restarts what dies
//!   with back-off, stops them in reverse order.
//! - [`top`]: `tierstack top`'s tier view: every service's `/metrics`,
//!   scraped twice, one line each.
//! - [`haproxy`]: a real HAProxy as a child process (the PRESS baseline).
//!
//! Invariant: this crate sits above the tiers and below the experiments and
//! the binary; it depends on no experiment (`tierstack-bench`) and no tier
//! depends on it.

pub mod cluster;
pub mod deployment;
pub mod haproxy;
pub mod nginx;
pub mod process;
pub mod supervise;
pub mod top;
