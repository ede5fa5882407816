//! The cooperative cache over the fabric: one [`CoopNode`] per node.
//!
//! - **Data** lives in the node's registered pool (`coop.pool`, see
//!   [`layout`]) and moves by one-sided reads (`ReadInto` straight into the
//!   reader's pool pages): a remote hit runs no CPU of the holder.
//! - **Page tables** are seqlock records in the same region. A reader learns
//!   an entity's pages from its **replica** (the soft state, kept by the
//!   holders' `Announce` broadcasts) and reads the data and then the record's
//!   sequence word in one posted batch: if the sequence is not the one
//!   announced, the slot changed (evicted, reused) and the read counts as a
//!   miss, never as bytes. A holder bumps the sequence before it reuses pages.
//! - **Metadata updates** (add/remove holder, transfer, invalidate, STORE and
//!   its acknowledgment) are two-sided messages on `Channel::COOP_CACHE`,
//!   handled by the node's receiver thread; the homes apply them serially.
//!   **Validate** is a one-sided read of the home's key table (`coop.keys`).
//! - Placement decisions are [`crate::placement`]'s, fed with the node's own
//!   cache and its replica, so the service and the model decide alike.
//! - Every message is counted by type and charged to its primitive by Table
//!   2's rule ([`crate::counts`]); broadcasts are counted apart.
//! - **Dead nodes**: a read from a dead holder, a message to a dead home or
//!   peer, a STORE never acknowledged: each costs a miss or an uncached
//!   entity, never an error to the caller or wrong bytes. A holder found dead
//!   (`PeerState::Gone`) is dropped from the replica.
//!
//! - **Groupcache** (the baseline): a key's owner is its point on the
//!   consistent-hashing ring over the proxies; a non-owner asks the owner with
//!   a two-sided `GroupGet` and gets the bytes in the `GroupReply` (the
//!   owner's receiver thread copies them out of its pool); nothing is kept at
//!   the requester. Unlike groupcache itself the owner does not load a missed
//!   key (the service has no origin): the requester loads it and offers it to
//!   the owner in one `GroupPut` (charged to Cache Store, one data message).
//!   No invalidation beyond the owner dropping its copy (`DropCopy` to the
//!   owner), no versions at a home.
//!
//! - **The last copy** (seed-notes a.7 #7, `CoopConfig::last_copy_guard`,
//!   on by default): a node evicting a copy *because another exists* (CCWR,
//!   MTACC, HYBCC's large entities) sends `RemoveIfShared` to the home and
//!   waits (state lock released, bounded) for `RemoveReply`; the home,
//!   applying requests one at a time, grants only while another holder
//!   remains ([`crate::placement::may_drop_copy`]). Refused, the node takes
//!   the copy as its sole one and plans again (at most 4 rounds); a home that
//!   does not answer counts as granted (the copy is dropped: nothing the
//!   home may have forgotten survives an invalidate). The answer is one
//!   control message the paper's Table 2 does not count (see `counts`).
//!   STOREs are placed by a store worker thread, since placing may wait for
//!   answers that the receiver thread delivers.

pub mod layout;
pub mod wire;

mod home;
mod metrics;
mod node;

pub use metrics::write_metrics;
pub use node::{CoopConfig, CoopNode, Lookup, Occupancy, ServiceError, ServiceStats};
