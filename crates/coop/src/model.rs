//! The whole cluster as one exact state machine: every node's cache, every
//! home's holder sets, and the messages each request implies.
//!
//! [`Model::request`] runs one client request at an active node to its end
//! by the scheme's rules (`placement`), applying every decision at once on a
//! consistent global state, and returns what happened ([`Outcome`]): how it
//! was served, and the message log ([`Step`]s) with which primitive each
//! message belongs to and whether Table 2's rule charges it. The simulator
//! turns those steps into costs; the tests check the seed's rules on them.
//!
//! Request path of the cooperative schemes (seed-notes a.2): a local hit is
//! served from the node's pool; else, if some node holds the entity, Cache
//! Fetch from it (a remote hit); else a miss goes to the back end and Cache
//! Store places the entity. Nodes `0..active` are proxies (active, homes),
//! `active..active+passive` passive back-end modules (never homes, never
//! initiators).
//!
//! Content versions make "no wrong bytes" checkable: an entity's version is
//! bumped by Cache Invalidate, which drops every copy first, so every copy
//! the model serves carries the current version ([`Model::check`]).

use crate::counts::{Charge, MsgKind, Primitive, Tally};
use crate::key::{mix, HashRing, Homes, Key};
use crate::node::NodeCache;
use crate::placement::{
    plan_fetch, plan_receive, plan_store, redundant_pages, FetchPlan, Mode, Room, Space, StorePlan,
};
use crate::pool::{cacheable, pages_for};
use crate::{CoopError, Scheme};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// Bytes of a control message or a key-table entry read (kind, key, node,
/// size, version): the service's wire size.
pub const CONTROL_BYTES: u64 = 32;

/// A model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModelConfig {
    pub scheme: Scheme,
    /// Proxies: they take client requests and are the homes.
    pub active: usize,
    /// Passive back-end modules (used by MTACC and HYBCC only).
    pub passive: usize,
    /// Pool pages per node.
    pub pages_per_node: u32,
}

/// One message a request caused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The sender, or for a one-sided read the reader.
    pub from: usize,
    /// The receiver, or for a one-sided read the node whose memory is read.
    pub to: usize,
    pub kind: MsgKind,
    pub bytes: u64,
    pub primitive: Primitive,
    /// Charged to the primitive by Table 2's rule (else consequential).
    pub charged: bool,
}

/// How a request was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Served {
    /// From the initial node's own pool.
    LocalHit,
    /// From another node's memory (`holder`).
    RemoteHit { holder: usize },
    /// From the back end; `by` is the node that went there (the initial node,
    /// or the groupcache owner).
    Miss { by: usize },
}

/// What one call did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub served: Served,
    /// The content version served (or, for validate, the current one).
    pub version: u64,
    pub steps: Vec<Step>,
    /// The primitives called, with their charges, in order.
    pub charges: Vec<(Primitive, Charge)>,
    /// Sole copies dropped (entities that left the system by replacement).
    pub lost: u32,
}

/// Counts of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModelStats {
    pub requests: u64,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    /// Stores placed on the initiating node / on a peer.
    pub stores_local: u64,
    pub stores_remote: u64,
    /// CCWR swaps.
    pub swaps: u64,
    /// Sole copies replaced (the entity left the system).
    pub lost: u64,
    /// Redundant copies dropped to make room.
    pub duplicates_dropped: u64,
    /// Entities served but not cached (larger than a cache or a record).
    pub uncached: u64,
    pub invalidations: u64,
}

/// The cluster model. See the module docs.
#[derive(Clone, Debug)]
pub struct Model {
    config: ModelConfig,
    nodes: Vec<NodeCache>,
    holders: HashMap<Key, BTreeSet<usize>>,
    versions: HashMap<Key, u64>,
    homes: Homes,
    ring: HashRing,
    tally: Tally,
    stats: ModelStats,
    /// Redundant copies' evictions ask the home first (seed-notes a.7 #7).
    last_copy_guard: bool,
    /// Per node, how many times its contents changed (a copy added or
    /// dropped): the service announces each change to every member.
    changes: Vec<u64>,
}

/// A message log under construction, for one call.
struct Log {
    steps: Vec<Step>,
    charges: Vec<(Primitive, Charge)>,
    lost: u32,
    /// Steps before this index belong to recorded calls.
    mark: usize,
}

impl Log {
    fn new() -> Self {
        Self { steps: Vec::new(), charges: Vec::new(), lost: 0, mark: 0 }
    }

    /// Logs a message unless it is addressed to its own sender (a home's
    /// update of itself is applied locally).
    fn push(&mut self, from: usize, to: usize, kind: MsgKind, bytes: u64, primitive: Primitive, charged: bool) {
        if from != to {
            self.steps.push(Step { from, to, kind, bytes, primitive, charged });
        }
    }
}

impl Model {
    pub fn new(config: ModelConfig) -> Result<Self, CoopError> {
        let bad = || CoopError::BadConfig { active: config.active, pages: config.pages_per_node };
        if config.pages_per_node == 0 || config.active + config.passive > tierstack_base::limits::NODES_MAX as usize {
            return Err(bad());
        }
        let homes = Homes::new(config.active).ok_or_else(bad)?;
        let ring = HashRing::new(config.active).ok_or_else(bad)?;
        let passive = if config.scheme.uses_passive() { config.passive } else { 0 };
        let nodes = (0..config.active + config.passive)
            .map(|i| NodeCache::new(if i < config.active || passive > 0 { config.pages_per_node } else { 0 }))
            .collect();
        Ok(Self {
            config,
            nodes,
            holders: HashMap::new(),
            versions: HashMap::new(),
            homes,
            ring,
            tally: Tally::default(),
            stats: ModelStats::default(),
            last_copy_guard: false,
            changes: vec![0; config.active + config.passive],
        })
    }

    /// With the home-serialized rule for redundant evictions (seed-notes a.7
    /// #7), as the service runs by default: a node evicting a copy because
    /// another exists asks the home (a remove-holder) and waits for its
    /// answer (a remove-grant, one more control message). The model applies
    /// every decision on an exact global state, so the home always grants;
    /// the service can be refused (two nodes racing on the two copies).
    /// Off by default: the paper's protocol, whose counts are Table 2's.
    pub fn with_last_copy_guard(mut self, on: bool) -> Self {
        self.last_copy_guard = on;
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn node(&self, node: usize) -> Option<&NodeCache> {
        self.nodes.get(node)
    }

    /// How many times `node`'s contents have changed so far (a copy added
    /// or dropped). The service announces its contents to every other
    /// member after each primitive that changed them: a simulator charges
    /// that traffic from these counts.
    pub fn changes(&self, node: usize) -> u64 {
        self.changes.get(node).copied().unwrap_or(0)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The nodes that hold `key` now.
    pub fn holders(&self, key: Key) -> Vec<usize> {
        self.holders.get(&key).map(|h| h.iter().copied().collect()).unwrap_or_default()
    }

    /// `key`'s home node.
    pub fn home(&self, key: Key) -> usize {
        self.homes.home(key)
    }

    /// `key`'s current content version.
    pub fn version(&self, key: Key) -> u64 {
        self.versions.get(&key).copied().unwrap_or(0)
    }

    /// Forgets the counts (tally and stats), keeping the caches: after a
    /// warm-up, so that a run measures the steady state.
    pub fn reset_counts(&mut self) {
        self.tally = Tally::default();
        self.stats = ModelStats::default();
    }

    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    pub fn stats(&self) -> &ModelStats {
        &self.stats
    }

    /// Distinct entities cached somewhere.
    pub fn distinct_entities(&self) -> usize {
        self.holders.len()
    }

    /// Whether `key` has a copy at two nodes or more.
    pub fn is_redundant(&self, key: Key) -> bool {
        self.holders.get(&key).is_some_and(|h| h.len() >= 2)
    }

    /// Free and redundant pages of `node`, as its page-table summary shows.
    pub fn space(&self, node: usize) -> Space {
        let cache = &self.nodes[node];
        let red = |k: Key| self.is_redundant(k);
        Space { node, free_pages: cache.free_pages(), redundant_pages: redundant_pages(cache, &red) }
    }

    /// The nodes an entity of `bytes` may be placed on.
    fn candidates(&self, bytes: u64) -> std::ops::Range<usize> {
        let (_, passive) = self.config.scheme.mode_for(bytes);
        0..if passive { self.nodes.len() } else { self.config.active }
    }

    /// One client request for `key` (`bytes` long) at active node `node`.
    pub fn request(&mut self, node: usize, key: Key, bytes: u64) -> Result<Outcome, CoopError> {
        if node >= self.config.active {
            return Err(CoopError::NotActive { node });
        }
        self.stats.requests += 1;
        let mut log = Log::new();
        let served = if self.config.scheme == Scheme::Groupcache {
            self.groupcache(node, key, bytes, &mut log)
        } else if self.nodes[node].touch(key) {
            Served::LocalHit
        } else if self.config.scheme == Scheme::Ac || !cacheable(bytes) {
            self.store(node, key, bytes, &mut log);
            Served::Miss { by: node }
        } else if let Some(holder) = self.pick_holder(node, key) {
            self.fetch(node, key, holder, &mut log);
            Served::RemoteHit { holder }
        } else {
            self.store(node, key, bytes, &mut log);
            Served::Miss { by: node }
        };
        match served {
            Served::LocalHit => self.stats.local_hits += 1,
            Served::RemoteHit { .. } => self.stats.remote_hits += 1,
            Served::Miss { .. } => self.stats.misses += 1,
        }
        let version = match served {
            Served::LocalHit => self.nodes[node].get(key).map_or(0, |e| e.version),
            Served::RemoteHit { holder } => self.served_version(holder, node, key),
            Served::Miss { .. } => self.version(key),
        };
        Ok(self.finish(served, version, log))
    }

    /// The version a remote hit served: the copy now at the initiator, or at
    /// the holder (it may have moved in a swap).
    fn served_version(&self, holder: usize, node: usize, key: Key) -> u64 {
        self.nodes[node]
            .get(key)
            .or_else(|| self.nodes[holder].get(key))
            .map_or_else(|| self.version(key), |e| e.version)
    }

    /// Cache Validate of `key` by `node`: one one-sided read of the home's
    /// key-table entry; returns the current version in `version`.
    pub fn validate(&mut self, node: usize, key: Key) -> Result<Outcome, CoopError> {
        if node >= self.nodes.len() {
            return Err(CoopError::UnknownNode { node });
        }
        let mut log = Log::new();
        log.push(node, self.homes.home(key), MsgKind::HomeRead, CONTROL_BYTES, Primitive::Validate, true);
        self.charge(Primitive::Validate, &mut log);
        let version = self.version(key);
        Ok(self.finish(Served::LocalHit, version, log))
    }

    /// Cache Invalidate of `key`, initiated by any node (a back end may):
    /// one message to the home, which drops every copy and bumps the version.
    pub fn invalidate(&mut self, node: usize, key: Key) -> Result<Outcome, CoopError> {
        if node >= self.nodes.len() {
            return Err(CoopError::UnknownNode { node });
        }
        let home = self.homes.home(key);
        let mut log = Log::new();
        log.push(node, home, MsgKind::Invalidate, CONTROL_BYTES, Primitive::Invalidate, true);
        for holder in self.holders.remove(&key).unwrap_or_default() {
            self.nodes[holder].remove(key);
            self.changes[holder] += 1;
            log.push(home, holder, MsgKind::DropCopy, CONTROL_BYTES, Primitive::Invalidate, false);
        }
        *self.versions.entry(key).or_default() += 1;
        self.stats.invalidations += 1;
        self.charge(Primitive::Invalidate, &mut log);
        let version = self.version(key);
        Ok(self.finish(Served::Miss { by: node }, version, log))
    }

    fn finish(&self, served: Served, version: u64, log: Log) -> Outcome {
        Outcome { served, version, steps: log.steps, charges: log.charges, lost: log.lost }
    }

    /// Records a call of `primitive` made of the steps logged since the
    /// previous call was recorded.
    fn charge(&mut self, primitive: Primitive, log: &mut Log) {
        let messages: Vec<(MsgKind, u64, bool)> =
            log.steps[log.mark..].iter().map(|s| (s.kind, s.bytes, s.charged)).collect();
        debug_assert!(log.steps[log.mark..].iter().all(|s| s.primitive == primitive));
        log.mark = log.steps.len();
        let charge = self.tally.record(primitive, &messages);
        log.charges.push((primitive, charge));
    }

    /// The holder a remote hit reads from: one of the holders, spread by a
    /// hash of (key, reader) so readers do not all pick the same copy.
    fn pick_holder(&self, node: usize, key: Key) -> Option<usize> {
        let holders = self.holders.get(&key)?;
        if holders.is_empty() {
            return None;
        }
        let index = (mix(key ^ node as u64) % holders.len() as u64) as usize;
        holders.iter().nth(index).copied()
    }

    fn add_copy(&mut self, node: usize, key: Key, bytes: u64, version: u64) -> bool {
        if self.nodes[node].insert(key, bytes, version).is_ok() {
            self.changes[node] += 1;
            self.holders.entry(key).or_default().insert(node);
            true
        } else {
            false
        }
    }

    /// Drops `key` at `node`; returns whether it was the last copy.
    fn drop_copy(&mut self, node: usize, key: Key) -> bool {
        if self.nodes[node].remove(key).is_some() {
            self.changes[node] += 1;
        }
        let Some(set) = self.holders.get_mut(&key) else { return false };
        set.remove(&node);
        if set.is_empty() {
            self.holders.remove(&key);
            self.stats.lost += 1;
            true
        } else {
            self.stats.duplicates_dropped += 1;
            false
        }
    }

    /// Frees room at `node` by dropping `victims`, logging a remove-holder
    /// to each victim's home (charged or not).
    fn make_room(&mut self, node: usize, victims: &[Key], primitive: Primitive, charged: bool, log: &mut Log) {
        // AC and groupcache keep no cluster metadata: nothing to tell.
        let tell = !matches!(self.config.scheme, Scheme::Ac | Scheme::Groupcache);
        for &v in victims {
            let guarded = self.last_copy_guard
                && tell
                && self.nodes[node].get(v).is_some_and(|e| {
                    crate::placement::guarded_eviction(self.config.scheme.mode_for(e.bytes).0, self.is_redundant(v))
                });
            if self.drop_copy(node, v) {
                log.lost += 1;
            }
            if !tell {
                continue;
            }
            let home = self.homes.home(v);
            log.push(node, home, MsgKind::RemoveHolder, CONTROL_BYTES, primitive, charged);
            if guarded {
                log.push(home, node, MsgKind::RemoveGrant, CONTROL_BYTES, primitive, charged);
            }
        }
    }

    fn room_victims(room: &Room) -> &[Key] {
        match room {
            Room::Free => &[],
            Room::Redundant(v) | Room::Evict(v) => v,
        }
    }

    /// Cache Store after a miss at `node` (which has the bytes).
    fn store(&mut self, node: usize, key: Key, bytes: u64, log: &mut Log) {
        let version = self.version(key);
        let need = pages_for(bytes);
        let (mode, _) = self.config.scheme.mode_for(bytes);
        if !cacheable(bytes) {
            self.stats.uncached += 1;
            return;
        }
        let peers: Vec<Space> = if mode == Mode::Local {
            Vec::new()
        } else {
            self.candidates(bytes).filter(|&n| n != node).map(|n| self.space(n)).collect()
        };
        let plan = {
            let red = |k: Key| self.is_redundant(k);
            plan_store(mode, &self.nodes[node], need, key, &peers, &red)
        };
        // AC and groupcache keep no cluster metadata: no messages.
        let cooperative = mode != Mode::Local;
        match plan {
            None => self.stats.uncached += 1,
            Some(StorePlan::Local(room)) => {
                let victims = Self::room_victims(&room).to_vec();
                self.make_room(node, &victims, Primitive::Store, true, log);
                self.add_copy(node, key, bytes, version);
                if cooperative {
                    log.push(node, self.homes.home(key), MsgKind::AddHolder, CONTROL_BYTES, Primitive::Store, true);
                }
                self.stats.stores_local += 1;
            }
            Some(StorePlan::Remote(peer)) => {
                log.push(node, peer, MsgKind::Store, CONTROL_BYTES, Primitive::Store, true);
                // The peer reads the body from the initiator's buffer.
                log.push(peer, node, MsgKind::DataRead, bytes, Primitive::Store, true);
                let room = {
                    let red = |k: Key| self.is_redundant(k);
                    plan_receive(mode, &self.nodes[peer], need, key, &red)
                };
                match room {
                    Some(room) => {
                        let victims = Self::room_victims(&room).to_vec();
                        self.make_room(peer, &victims, Primitive::Store, false, log);
                        self.add_copy(peer, key, bytes, version);
                        log.push(peer, self.homes.home(key), MsgKind::Transfer, CONTROL_BYTES, Primitive::Store, false);
                        self.stats.stores_remote += 1;
                    }
                    None => self.stats.uncached += 1,
                }
                log.push(peer, node, MsgKind::StoreAck, CONTROL_BYTES, Primitive::Store, true);
            }
        }
        if cooperative {
            self.charge(Primitive::Store, log);
        }
    }

    /// Cache Fetch of `key` at `node` from `holder`.
    fn fetch(&mut self, node: usize, key: Key, holder: usize, log: &mut Log) {
        let Some(entry) = self.nodes[holder].get(key).cloned() else { return };
        let need = pages_for(entry.bytes);
        let (mode, _) = self.config.scheme.mode_for(entry.bytes);
        // (p reads k first, into its destination or a staging buffer: a.7 #8.)
        log.push(node, holder, MsgKind::DataRead, entry.bytes, Primitive::Fetch, true);
        let holder_passive = holder >= self.config.active;
        let plan = {
            let red = |k: Key| self.is_redundant(k);
            let cache = &self.nodes[node];
            let swappable =
                |k: Key| !holder_passive || cache.get(k).is_some_and(|e| self.config.scheme.mode_for(e.bytes).1);
            plan_fetch(mode, cache, need, key, &red, &swappable)
        };
        match plan {
            None => self.stats.uncached += 1,
            Some(FetchPlan::Local(room)) => {
                let victims = Self::room_victims(&room).to_vec();
                self.make_room(node, &victims, Primitive::Fetch, true, log);
                self.add_copy(node, key, entry.bytes, entry.version);
                log.push(node, self.homes.home(key), MsgKind::AddHolder, CONTROL_BYTES, Primitive::Fetch, true);
            }
            Some(FetchPlan::Swap(victims)) => self.swap(node, key, holder, &entry, &victims, log),
        }
        self.charge(Primitive::Fetch, log);
    }

    /// CCWR's swap (coop Fig. 3): `node` sends STORE(victims) to `holder`,
    /// which reads them, places them by its own priority (where `key`'s copy
    /// has just become redundant) and acknowledges; `holder` reports both
    /// transfers to the homes (consequential).
    fn swap(
        &mut self,
        node: usize,
        key: Key,
        holder: usize,
        entry: &crate::node::Entry,
        victims: &[Key],
        log: &mut Log,
    ) {
        self.stats.swaps += 1;
        let (redundant, sole): (Vec<Key>, Vec<Key>) = victims.iter().partition(|&&v| self.is_redundant(v));
        // Redundant copies among the victims are simply dropped.
        self.make_room(node, &redundant, Primitive::Fetch, true, log);
        log.push(node, holder, MsgKind::Store, CONTROL_BYTES, Primitive::Fetch, true);
        let moving: Vec<(Key, u64, u64)> =
            sole.iter().filter_map(|&v| self.nodes[node].get(v).map(|e| (v, e.bytes, e.version))).collect();
        for &(_, v_bytes, _) in &moving {
            log.push(holder, node, MsgKind::DataRead, v_bytes, Primitive::Fetch, true);
        }
        // The initiator frees the victims' pages and installs the entity;
        // from now on it holds `key`, so the holder's copy is redundant.
        for &(v, _, _) in &moving {
            if self.nodes[node].remove(v).is_some() {
                self.changes[node] += 1;
            }
            if let Some(set) = self.holders.get_mut(&v) {
                set.remove(&node);
            }
        }
        self.add_copy(node, key, entry.bytes, entry.version);
        let (mode, _) = self.config.scheme.mode_for(entry.bytes);
        for &(v, v_bytes, v_version) in &moving {
            let room = {
                let red = |k: Key| self.is_redundant(k);
                plan_receive(mode, &self.nodes[holder], pages_for(v_bytes), v, &red)
            };
            if let Some(room) = room {
                let dropped = Self::room_victims(&room).to_vec();
                self.make_room(holder, &dropped, Primitive::Fetch, false, log);
                self.add_copy(holder, v, v_bytes, v_version);
            }
            if self.holders.get(&v).is_none_or(BTreeSet::is_empty) {
                // The holder could not take it: the entity is gone.
                self.holders.remove(&v);
                self.stats.lost += 1;
                log.lost += 1;
            }
            log.push(holder, self.homes.home(v), MsgKind::Transfer, CONTROL_BYTES, Primitive::Fetch, false);
        }
        log.push(holder, self.homes.home(key), MsgKind::Transfer, CONTROL_BYTES, Primitive::Fetch, false);
        log.push(holder, node, MsgKind::StoreAck, CONTROL_BYTES, Primitive::Fetch, true);
    }

    /// Groupcache: the owner serves (loading from the back end on a miss),
    /// over a two-sided GET and reply when the owner is another node.
    fn groupcache(&mut self, node: usize, key: Key, bytes: u64, log: &mut Log) -> Served {
        let owner = self.ring.owner(key);
        let hit = self.nodes[owner].touch(key);
        if !hit {
            // The owner loads from the back end and keeps the only copy.
            self.store(owner, key, bytes, log);
        }
        if owner == node {
            return if hit { Served::LocalHit } else { Served::Miss { by: node } };
        }
        log.push(node, owner, MsgKind::GroupGet, CONTROL_BYTES, Primitive::Fetch, true);
        log.push(owner, node, MsgKind::GroupReply, bytes, Primitive::Fetch, true);
        self.charge(Primitive::Fetch, log);
        if hit {
            Served::RemoteHit { holder: owner }
        } else {
            Served::Miss { by: owner }
        }
    }

    /// Checks every invariant: each node's page accounting, capacity, the
    /// holder sets against the caches, no stale copy, passive nodes used only
    /// by the schemes that may use them, and only for the entities they may
    /// hold. For tests.
    pub fn check(&self) -> Result<(), String> {
        for (i, n) in self.nodes.iter().enumerate() {
            n.check().map_err(|e| format!("node {i}: {e}"))?;
            if n.used_pages() > n.capacity_pages() {
                return Err(format!("node {i} over capacity"));
            }
            for k in n.keys() {
                if !self.holders.get(&k).is_some_and(|h| h.contains(&i)) {
                    return Err(format!("node {i} holds {k:#x} unknown to its home"));
                }
                let e = n.get(k).ok_or("vanished")?;
                if e.version != self.version(k) {
                    return Err(format!("node {i} holds a stale copy of {k:#x}"));
                }
                if i >= self.config.active {
                    let (_, passive_ok) = self.config.scheme.mode_for(e.bytes);
                    if !passive_ok {
                        return Err(format!("passive node {i} holds {k:#x}, which the scheme keeps on proxies"));
                    }
                }
            }
        }
        for (k, hs) in &self.holders {
            if hs.is_empty() {
                return Err(format!("{k:#x} has an empty holder set"));
            }
            if let Some(&h) = hs.iter().find(|&&h| !self.nodes[h].contains(*k)) {
                return Err(format!("{k:#x} listed at node {h}, which does not hold it"));
            }
        }
        Ok(())
    }
}
