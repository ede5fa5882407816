//! Base types every tierstack layer shares, and nothing else.
//!
//! This crate owns four small things:
//! - [`NodeId`], the one name for a node of a cluster (a process);
//! - [`limits`], the named bounds the rest of the system is sized by;
//! - [`sync::lock`], the one poison-tolerant mutex lock (and why poisoning
//!   is tolerated);
//! - the **time and randomness seam**: [`Clock`] and [`SeededRng`]. Code that a
//!   simulator will drive takes a `&dyn Clock` and a seeded RNG instead of
//!   calling `Instant::now` or `thread_rng`, so a failing run replays from its seed.
//!   Real I/O (deadlines on sockets, rings and UCX, measurements of real runs)
//!   reads the OS clocks through [`time::instant_now`] and [`time::system_now`];
//!   a run that picks its own seed takes it from [`fresh_seed`]; clippy's
//!   `disallowed_methods` (`clippy.toml`) forbids every other call.
//!
//! It depends on no other tierstack crate and performs no I/O.

pub mod limits;
pub mod sync;
pub mod time;

pub use time::{host_monotonic_ns, Clock, HostClock, ManualClock, SystemClock};

use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one node (one OS process) of a cluster. Dense small integers:
/// they index tables and, in the lock manager, fit in 32 bits of a lock word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// The project's seeded random number generator: fast, reproducible from its
/// seed, never the thread-local generator.
pub type SeededRng = rand::rngs::SmallRng;

/// Builds the seeded RNG for `seed`. Every randomized component takes its seed
/// from configuration or a test so that a run can be replayed.
pub fn seeded_rng(seed: u64) -> SeededRng {
    SeededRng::seed_from_u64(seed)
}

/// A fresh seed from the OS's entropy: for the one place a run picks its seed
/// (and reports it, so that the run replays) and for incarnation stamps that
/// must differ between processes. Everything else draws from [`seeded_rng`].
#[allow(clippy::disallowed_methods)] // The RNG seam itself.
pub fn fresh_seed() -> u64 {
    rand::random()
}
