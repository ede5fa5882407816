//! Adaptive push-pull with a shared cache state (coherency paper §4.3, §5.3).
//!
//! With pure **pull** (client polling alone) every update costs the next
//! client a miss on its critical path; with pure **push** the back end sends
//! every update to every proxy holding a copy, wasting bandwidth and evicting
//! hot entries. The paper's answer: each proxy keeps a table of its recently
//! accessed documents in registered memory, and the application tier reads it
//! one-sidedly when an update completes, to push only what will be used.
//!
//! This crate owns the three pieces that are independent of HTTP:
//! - [`state`]: the **cache state** region. Layout, the proxy-side writer
//!   ([`CacheStateWriter`], lock-free: per-slot seqlock records whose sequence
//!   word doubles as the writer's claim) and the application-side reader
//!   ([`CacheStateReader`]: one posted batch per proxy through
//!   [`tierstack_fabric::seqlock::read_many`], never torn). On `shm` the read
//!   is one-sided; on `tcp` the proxy's responder thread answers it, which is
//!   the paper's "ask the proxy module".
//! - [`policy`]: the push decision as a pure function of the document, one
//!   proxy's [`CacheStateSnapshot`] and the policy ([`PushPolicy`]): `pull`,
//!   `push`, `hybrid(fraction)` (the paper's rule) and `useful(p)` (ours:
//!   push when the copy is likely to be read before the next update).
//! - [`waste`]: the paper's *wasted update* metric as a pure tracker, and
//!   [`rate::UpdateRates`], the application tier's per-document update-rate
//!   estimate the `useful` policy needs.
//!
//! Key design choice: pushing never weakens coherence. A pushed copy carries
//! the versions it was generated at and is validated on every hit like any
//! other entry, so a push that races with a newer update is merely useless,
//! never stale. The cache state is advisory: a torn, lost or out-of-date
//! record can only cost a miss or a wasted push, so the writer may drop an
//! update under extreme contention rather than ever block a request.

pub mod policy;
pub mod rate;
pub mod state;
pub mod waste;

pub use policy::{decide, Decision, PushPolicy, UpdateContext};
pub use rate::UpdateRates;
pub use state::{
    CacheStateError, CacheStateReader, CacheStateSnapshot, CacheStateWriter, StateEntry, REGION_NAME, SLOTS_DEFAULT,
    SLOTS_MAX,
};
pub use waste::WasteTracker;

/// Where the application tier pushes a document to a proxy: `PUT
/// <proxy><prefix><name>` with the body and `X-Tierstack-Deps` installs the
/// cached copy of `/doc/<name>` (the proxy crate documents the answers).
pub const PUSH_PATH_PREFIX: &str = "/_tierstack/push/doc/";

/// The fingerprint the cache state and the push path use for a document:
/// the proxy's cache key (the request path, e.g. `/doc/z3`), hashed as the
/// version table hashes keys (never 0, so 0 marks an empty slot).
pub fn fingerprint(cache_key: &str) -> u64 {
    tierstack_coherent::version_table::fingerprint(cache_key)
}
