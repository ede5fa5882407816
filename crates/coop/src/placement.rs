//! The schemes' placement and replacement decisions, as pure functions of
//! what the deciding node knows: its own cache, the free and redundant pages
//! of its peers (from its replica of their page tables, seed-notes a.1), and
//! which entities have copies elsewhere (the home's holder sets).
//!
//! The runtime and the model ([`crate::model`]) both call these, so a rule
//! is written once.
//!
//! - **AC** ([`Mode::Local`]): local free space, else evict the local LRU.
//! - **BCC** ([`Mode::Redundant`], coop §3.1): a store goes to local free
//!   space, else to a remote node with free space (the one with the most),
//!   else evicts the local LRU. A fetch keeps a duplicate: local free space,
//!   else evict the local LRU.
//! - **CCWR / MTACC** ([`Mode::NoRedundancy`], coop §3.2): the priority
//!   (i) local free space, (ii) remote free space, (iii) local redundant
//!   copies, (iv) remote redundant copies, (v) replacement of an entity
//!   (redundant copies first, then the LRU sole copy). A fetch lands in local
//!   free space or in place of local redundant copies, else **swaps**: the
//!   local victims go to the holder, which places them by its own priority
//!   with the fetched entity's slot now redundant.
//! - A node that receives a STORE places it locally by its own priority and
//!   never forwards it (one hop, seed-notes a.7 #9).
//! - A redundant copy's eviction is granted by the home only while another
//!   holder remains ([`may_drop_copy`], seed-notes a.7 #7).

use crate::node::NodeCache;
use crate::Key;

/// How a scheme treats an entity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// AC: each node on its own.
    Local,
    /// BCC: cooperative, duplicates allowed.
    Redundant,
    /// CCWR and MTACC: cooperative, duplicates replaced first.
    NoRedundancy,
}

/// What a node knows of a peer's space: free pages, and pages it could
/// free by dropping copies that exist elsewhere too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    pub node: usize,
    pub free_pages: u32,
    pub redundant_pages: u32,
}

/// Where room for an entity comes from at one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Room {
    /// Free pages suffice.
    Free,
    /// Drop these redundant copies (LRU first); each has a copy elsewhere.
    Redundant(Vec<Key>),
    /// Drop these entries (a replacement); some may be sole copies.
    Evict(Vec<Key>),
}

/// Where a store goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorePlan {
    Local(Room),
    /// Send STORE to this node (it finds room by [`plan_receive`]).
    Remote(usize),
}

/// Where a fetched entity lands at the fetching node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchPlan {
    Local(Room),
    /// CCWR's swap: send these local sole copies to the holder.
    Swap(Vec<Key>),
}

/// LRU-first victims among the keys `pick` accepts (never `exclude`) until
/// `free + their pages >= need`; `None` if they cannot make enough room.
fn victims(cache: &NodeCache, need: u32, exclude: Key, pick: &dyn Fn(Key) -> bool) -> Option<Vec<Key>> {
    let mut room = cache.free_pages();
    let mut out = Vec::new();
    for key in cache.lru_keys() {
        if room >= need {
            break;
        }
        if key == exclude || !pick(key) {
            continue;
        }
        room += cache.get(key).map_or(0, |e| e.pages.len() as u32);
        out.push(key);
    }
    (room >= need).then_some(out)
}

/// Replacement victims: LRU; with `redundant_first`, every redundant copy
/// (LRU first) goes before any sole copy.
fn replacement(
    cache: &NodeCache,
    need: u32,
    exclude: Key,
    redundant_first: bool,
    is_redundant: &dyn Fn(Key) -> bool,
) -> Option<Vec<Key>> {
    replacement_among(cache, need, exclude, redundant_first, is_redundant, &|_| true)
}

/// [`replacement`] among the entries `allowed` accepts.
fn replacement_among(
    cache: &NodeCache,
    need: u32,
    exclude: Key,
    redundant_first: bool,
    is_redundant: &dyn Fn(Key) -> bool,
    allowed: &dyn Fn(Key) -> bool,
) -> Option<Vec<Key>> {
    if !redundant_first {
        return victims(cache, need, exclude, allowed);
    }
    let mut out = Vec::new();
    let mut room = cache.free_pages();
    let order = cache
        .lru_keys()
        .filter(|&k| is_redundant(k))
        .chain(cache.lru_keys().filter(|&k| !is_redundant(k)))
        .filter(|&k| allowed(k));
    for key in order {
        if room >= need {
            break;
        }
        if key == exclude {
            continue;
        }
        room += cache.get(key).map_or(0, |e| e.pages.len() as u32);
        out.push(key);
    }
    (room >= need).then_some(out)
}

/// The home's rule for a redundant copy's eviction (seed-notes a.7 #7): a
/// node that drops its copy of an entity *because another copy exists* asks
/// the entity's home first, and the home, applying such requests one at a
/// time, grants it only if some other node still holds the entity
/// (`holders` is the home's bitmap). Two nodes evicting the two copies of
/// one entity at once each believe the other keeps it; the home grants the
/// first and refuses the second, so the entity keeps one copy. A refused
/// node treats the copy as its sole one and picks its next victim.
pub fn may_drop_copy(holders: u64, node: u32) -> bool {
    let others = if node < 64 { holders & !(1u64 << node) } else { holders };
    others != 0
}

/// Whether evicting `key` at a node asks its home first: the scheme treats
/// it without redundancy and the node believes another copy exists.
pub fn guarded_eviction(mode: Mode, redundant: bool) -> bool {
    mode == Mode::NoRedundancy && redundant
}

/// Pages of `cache`'s redundant copies.
pub fn redundant_pages(cache: &NodeCache, is_redundant: &dyn Fn(Key) -> bool) -> u32 {
    cache.lru_keys().filter(|&k| is_redundant(k)).map(|k| cache.get(k).map_or(0, |e| e.pages.len() as u32)).sum()
}

/// Room for `need` pages for `key` at a node under `mode`, by the node's own
/// priority (free, redundant copies if `NoRedundancy`, replacement).
/// `None` only if the entity is larger than the whole cache.
pub fn plan_receive(
    mode: Mode,
    cache: &NodeCache,
    need: u32,
    key: Key,
    is_redundant: &dyn Fn(Key) -> bool,
) -> Option<Room> {
    if cache.free_pages() >= need {
        return Some(Room::Free);
    }
    if mode == Mode::NoRedundancy {
        if let Some(v) = victims(cache, need, key, is_redundant) {
            return Some(Room::Redundant(v));
        }
    }
    replacement(cache, need, key, mode == Mode::NoRedundancy, is_redundant).map(Room::Evict)
}

/// Where to store `key` (`need` pages) after a miss at a node whose cache is
/// `cache`, knowing its peers' `peers` spaces (candidates only).
pub fn plan_store(
    mode: Mode,
    cache: &NodeCache,
    need: u32,
    key: Key,
    peers: &[Space],
    is_redundant: &dyn Fn(Key) -> bool,
) -> Option<StorePlan> {
    // (i) local free space.
    if cache.free_pages() >= need {
        return Some(StorePlan::Local(Room::Free));
    }
    if mode == Mode::Local {
        return replacement(cache, need, key, false, is_redundant).map(|v| StorePlan::Local(Room::Evict(v)));
    }
    // (ii) remote free space: the peer with the most, lowest id on ties.
    let best = |score: &dyn Fn(&Space) -> u32| {
        peers
            .iter()
            .filter(|s| score(s) >= need)
            .max_by(|a, b| score(a).cmp(&score(b)).then(b.node.cmp(&a.node)))
            .map(|s| s.node)
    };
    if let Some(node) = best(&|s| s.free_pages) {
        return Some(StorePlan::Remote(node));
    }
    if mode == Mode::NoRedundancy {
        // (iii) local redundant copies.
        if let Some(v) = victims(cache, need, key, is_redundant) {
            return Some(StorePlan::Local(Room::Redundant(v)));
        }
        // (iv) remote redundant copies.
        if let Some(node) = best(&|s| s.free_pages.saturating_add(s.redundant_pages)) {
            return Some(StorePlan::Remote(node));
        }
    }
    // (v) replacement.
    replacement(cache, need, key, mode == Mode::NoRedundancy, is_redundant).map(|v| StorePlan::Local(Room::Evict(v)))
}

/// Where a fetched `key` (`need` pages) lands at the fetching node.
/// `swappable` says which local entries the holder may take in a swap
/// (HYBCC's small entities may not go to a passive node); when those cannot
/// make room, the fetch replaces locally instead.
pub fn plan_fetch(
    mode: Mode,
    cache: &NodeCache,
    need: u32,
    key: Key,
    is_redundant: &dyn Fn(Key) -> bool,
    swappable: &dyn Fn(Key) -> bool,
) -> Option<FetchPlan> {
    if cache.free_pages() >= need {
        return Some(FetchPlan::Local(Room::Free));
    }
    match mode {
        Mode::Local | Mode::Redundant => {
            replacement(cache, need, key, false, is_redundant).map(|v| FetchPlan::Local(Room::Evict(v)))
        }
        Mode::NoRedundancy => {
            if let Some(v) = victims(cache, need, key, is_redundant) {
                return Some(FetchPlan::Local(Room::Redundant(v)));
            }
            // No free space or local duplicates: swap LRU sole copies out to
            // the holder (the redundant copies there are go first).
            let movable = |k: Key| is_redundant(k) || swappable(k);
            match replacement_among(cache, need, key, true, is_redundant, &movable) {
                Some(v) => Some(FetchPlan::Swap(v)),
                None => replacement(cache, need, key, true, is_redundant).map(|v| FetchPlan::Local(Room::Evict(v))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_grants_a_redundant_eviction_only_while_another_holder_remains() {
        assert!(may_drop_copy(0b011, 0), "node 1 keeps it");
        assert!(may_drop_copy(0b110, 2));
        assert!(!may_drop_copy(0b001, 0), "node 0 holds the last copy");
        assert!(!may_drop_copy(0, 3), "nobody listed: keep it");
        assert!(may_drop_copy(0b100, 0), "not listed, but another holds it");
        assert!(!may_drop_copy(1 << 63, 63));
        assert!(may_drop_copy(1, 64), "an index beyond the bitmap removes nothing");
        assert!(guarded_eviction(Mode::NoRedundancy, true));
        assert!(!guarded_eviction(Mode::NoRedundancy, false));
        assert!(!guarded_eviction(Mode::Redundant, true), "BCC replaces by LRU regardless");
    }
}
