//! PRESS, the locality-conscious request-reply cluster web server (Carrera
//! and Bianchini, TPDS 2005): its pure core.
//!
//! Any node of a PRESS cluster accepts client requests (it is their
//! *initial node*) and decides with Fig. 1 of the paper ([`decide`]) whether
//! to serve a request itself or forward it to the *service node* that caches
//! the file, balancing by load. The service node reads the file from its
//! disk if needed, caches it, and sends it back; the initial node relays it
//! to the client and never caches it. A forwarded request is served where it
//! lands: one hop, never re-forwarded.
//!
//! This crate owns what every runtime of PRESS shares and performs no I/O:
//! - [`view`]: a node's [`ClusterView`] (`Servers[]` per file, every node's
//!   load), changed only by what PRESS disseminates: caching broadcasts,
//!   loads piggy-backed on every message, and Fig. 1's own additions;
//! - [`policy`]: Fig. 1 exactly ([`decide`]), with `max_size` = 256 KiB and
//!   the threshold `T` (default 256, configurable);
//! - [`proto`]: the intra-cluster messages (forward, file, caching, flow
//!   control, buffer management), each carrying the sender's load, and
//!   their encoding (`docs/wire-format.md`);
//! - [`breaker`]: a circuit breaker per peer, so a dead or hung service
//!   node costs one bounded wait, then is skipped for a cool-down;
//! - [`lard`]: the dispatcher hand-off server's LARD choice of back-end;
//! - [`counters`]: per-type message and byte counts, Table 2;
//! - [`ring`]: the remote-write versions' per-pair rings (layout, slots,
//!   data reservations, releases), pure arithmetic, property-tested and
//!   model-checked with loom (`tests/loom_ring.rs`).
//!
//! The HTTP node and its transports (TCP, Base, RDMA-1c, RDMA, Zero) live
//! in `tierstack-press-node`; the simulator (`tierstack_sim::press`) drives
//! the same [`decide`] over the same view.

pub mod breaker;
pub mod counters;
pub mod lard;
pub mod policy;
pub mod proto;
pub mod ring;
pub mod view;

pub use breaker::{Admit, BreakerCounts, Breakers, COOL_DOWN_MS_DEFAULT};
pub use counters::{Counters, Counts, Table2Row};
pub use lard::{Lard, LardConfig, LardError};
pub use policy::{decide, Branch, Decision, Outcome, PolicyConfig, MAX_SIZE_BYTES, THRESHOLD_DEFAULT};
pub use proto::{decode, encode, Body, FileStatus, Message, MsgType, ProtoError};
pub use view::{CachingEvent, ClusterView, Member, ViewError};
