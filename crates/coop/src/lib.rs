//! Cooperative caching across the proxy tier (Narravula et al., CCGrid'06;
//! `../shared/seed-notes.md` part (a)).
//!
//! A tier of N proxies with M bytes of cache each holds far less than N·M
//! when every proxy caches the same hot documents on its own. The seed's
//! schemes pool the tier's memory: an entity's **home** (a fixed hash over
//! the proxies) keeps only metadata (which nodes hold it); the bytes live in
//! any node's registered pool and move by one-sided reads.
//!
//! This crate owns, bottom to top:
//! - [`key`]: fingerprints, the fixed home partition ([`Homes`]), and the
//!   groupcache baseline's consistent-hashing ring ([`HashRing`]);
//! - [`pool`]: the page-based pool accounting (4 KiB pages, not power-of-two
//!   slots, so Table 1's capacities hold);
//! - [`node`]: one node's entries in LRU order ([`NodeCache`]);
//! - [`placement`]: each scheme's placement and replacement priority as pure
//!   functions (AC, BCC, CCWR/MTACC with the swap, the one-hop receive);
//! - [`model`]: the whole cluster as one exact state machine that applies
//!   those decisions per request and logs every message it implies
//!   ([`Model`]); the simulator and the tests drive it;
//! - [`counts`]: Table 2's counting rule per primitive ([`Tally`]).
//!
//! Everything here is pure: no I/O, no clock, no randomness. The key design
//! choice is that a placement rule is written once, as a function of what the
//! deciding node knows, and both the model and the fabric service call it.

pub mod args;
pub mod counts;
pub mod handle;
pub mod key;
pub mod model;
pub mod node;
pub mod placement;
pub mod pool;
pub mod service;

pub use counts::{paper_table_2, Charge, MsgKind, Primitive, PrimitiveTally, Tally};
pub use handle::{CoopHandle, Fetched, Meta};
pub use key::{fingerprint, HashRing, Homes, Key};
pub use model::{Model, ModelConfig, ModelStats, Outcome, Served, Step};
pub use node::{Entry, NodeCache};
pub use placement::Mode;
pub use pool::{pages_for, PagePool, ENTITY_PAGES_MAX, PAGE_BYTES};

/// HYBCC's default size threshold: entities of at most 8 KiB are "small"
/// (BCC on the proxies), larger ones go MTACC (seed-notes a.7 #1: the
/// 8k-trace is the only one where BCC beats CCWR).
pub const HYBCC_SMALL_MAX_BYTES: u64 = 8 << 10;

/// A cooperative caching scheme, selectable per run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "scheme")]
pub enum Scheme {
    /// Each proxy caches on its own (Apache's default cache).
    Ac,
    /// Basic RDMA cooperative cache: remote hits keep a duplicate.
    Bcc,
    /// Cooperative cache without redundancy.
    Ccwr,
    /// CCWR over the proxies and the passive back-end nodes.
    Mtacc,
    /// BCC on the proxies for entities of at most `small_max_bytes`, MTACC
    /// for larger ones.
    Hybcc { small_max_bytes: u64 },
    /// Groupcache-style: one owner per key by consistent hashing over the
    /// proxies, fetched from it two-sidedly; no duplicates, no invalidation.
    Groupcache,
}

impl Scheme {
    /// The names the command line knows.
    pub const NAMES: [&'static str; 6] = ["ac", "bcc", "ccwr", "mtacc", "hybcc", "groupcache"];

    pub fn name(self) -> &'static str {
        match self {
            Self::Ac => "ac",
            Self::Bcc => "bcc",
            Self::Ccwr => "ccwr",
            Self::Mtacc => "mtacc",
            Self::Hybcc { .. } => "hybcc",
            Self::Groupcache => "groupcache",
        }
    }

    /// Whether the passive back-end nodes' memory is used at all.
    pub fn uses_passive(self) -> bool {
        matches!(self, Self::Mtacc | Self::Hybcc { .. })
    }

    /// How this scheme treats an entity of `bytes`, and whether the passive
    /// nodes may hold it.
    pub fn mode_for(self, bytes: u64) -> (Mode, bool) {
        match self {
            Self::Ac | Self::Groupcache => (Mode::Local, false),
            Self::Bcc => (Mode::Redundant, false),
            Self::Ccwr => (Mode::NoRedundancy, false),
            Self::Mtacc => (Mode::NoRedundancy, true),
            Self::Hybcc { small_max_bytes } if bytes <= small_max_bytes => (Mode::Redundant, false),
            Self::Hybcc { .. } => (Mode::NoRedundancy, true),
        }
    }
}

impl std::str::FromStr for Scheme {
    type Err = CoopError;

    fn from_str(s: &str) -> Result<Self, CoopError> {
        Ok(match s {
            "ac" => Self::Ac,
            "bcc" => Self::Bcc,
            "ccwr" => Self::Ccwr,
            "mtacc" => Self::Mtacc,
            "hybcc" => Self::Hybcc { small_max_bytes: HYBCC_SMALL_MAX_BYTES },
            "groupcache" => Self::Groupcache,
            other => return Err(CoopError::UnknownScheme { name: other.to_string() }),
        })
    }
}

/// Every way a cooperative-cache call can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoopError {
    #[error("unknown scheme {name:?} (known: ac, bcc, ccwr, mtacc, hybcc, groupcache)")]
    UnknownScheme { name: String },
    #[error("need {need_pages} free pages, have {free_pages}")]
    NoRoom { need_pages: u32, free_pages: u32 },
    #[error("page {page} is outside the pool, already free, or listed twice")]
    BadPage { page: u32 },
    #[error("entity {key:#x} is already cached here")]
    AlreadyCached { key: Key },
    #[error("an entity of {bytes} bytes exceeds the largest cacheable ({} pages)", ENTITY_PAGES_MAX)]
    TooLarge { bytes: u64 },
    #[error(
        "a configuration needs at least one active node and a positive cache (got {active} active, {pages} pages)"
    )]
    BadConfig { active: usize, pages: u32 },
    #[error("node {node} cannot initiate requests (it is passive or not in the cluster)")]
    NotActive { node: usize },
    #[error("node {node} is not in the cluster")]
    UnknownNode { node: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_parse_and_name_themselves() {
        for name in Scheme::NAMES {
            assert_eq!(name.parse::<Scheme>().unwrap().name(), name);
        }
        assert!(matches!("lru".parse::<Scheme>(), Err(CoopError::UnknownScheme { .. })));
        let hyb: Scheme = "hybcc".parse().unwrap();
        assert_eq!(hyb.mode_for(8 << 10), (Mode::Redundant, false));
        assert_eq!(hyb.mode_for((8 << 10) + 1), (Mode::NoRedundancy, true));
    }
}
