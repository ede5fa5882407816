//! Strongly coherent caching of dynamic content by client polling
//! (coherency paper §3), as a service on the fabric.
//!
//! The pieces, and who uses them:
//! - [`table1`]: the application module's per-document read/update protocol,
//!   Table 1 of the paper row for row, as a pure state machine.
//! - [`module_core`]: the module's bookkeeping above Table 1: requests that
//!   span several dependency keys, and updates waiting to be admitted. Pure.
//! - [`version_table`]: dependency keys → 64-bit versions in a registered
//!   region owned by the module. The owner assigns slots and bumps versions;
//!   proxies validate a cached response's dependencies with **one batched
//!   one-sided read** ([`version_table::VersionChecker`]).
//! - [`deps`]: the `X-Tierstack-Deps` response header that carries a
//!   response's versions from the application server through the proxy to
//!   the client (`docs/coherence-protocol.md`).
//! - [`module`]: the module process's local socket server (JSON lines, usable
//!   from any language) and its async Rust client.
//! - [`module_socket`]: who may reach the module: the socket file's mode,
//!   peer credentials, one live module per path.
//!
//! - [`update_plan`]: when an update's versions become visible (at
//!   UPDATE_PROCEED, the paper's; or at UPDATE_DONE) and the order of the
//!   module's steps. Pure.
//! - [`pages`]: pages published with UPDATE_DONE in the version table's
//!   region, read one-sidedly by proxies whose copy went out of date.
//!
//! Why it is coherent: an update's versions change before it completes (when
//! it is granted, or, in the `done` mode, once its page is published and
//! before its UPDATE_DONE is answered); no read of those keys proceeds at the
//! module until the update is done; a proxy serves a cached copy, or a
//! published page, only after reading, at request time, that every version it
//! was generated at is current. So a response can only be older than an
//! update that had not yet completed when the request began.

pub mod deps;
pub mod module;
pub mod module_core;
pub mod module_socket;
pub mod pages;
pub mod table1;
pub mod update_plan;
pub mod version_table;

pub use deps::{Dep, DepsError, DepsHeader, DEPS_HEADER};
pub use pages::{Page, PageMiss};
pub use update_plan::VersionsAt;
pub use version_table::{Incarnation, PagesConfig, PublishedPage, VersionChecker, VersionTable, VersionTableError};
