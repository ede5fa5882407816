//! One node of the cooperative cache service (see the module docs above):
//! the request path (get, put, validate, invalidate) is here, the receiver
//! thread's side (every message a node handles) in `receive`, groupcache's
//! two-sided path in `group`, and the bytes of the pool's pages (local, and
//! read one-sided from a peer) in `pages`.

mod group;
mod occupancy;
mod pages;
mod receive;

pub use occupancy::Occupancy;

use super::home::{version_in_window, KeyTable};
use super::layout::{key_probe_start, PoolLayout, Record, KEYS_REGION, KEY_ENTRY_BYTES, POOL_REGION, PROBE_MAX};
use super::wire::{Held, Item, Msg, UNCHECKED};
use crate::counts::{MsgKind, Primitive, Tally};
use crate::key::{mix, HashRing, Homes};
use crate::model::CONTROL_BYTES;
use crate::node::NodeCache;
use crate::placement::{
    guarded_eviction, plan_fetch, plan_receive, plan_store, FetchPlan, Mode, Room, Space, StorePlan,
};
use crate::pool::{cacheable, pages_for, PAGE_BYTES};
use crate::{Key, Scheme};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::time::instant_now;
// A panic while holding a lock is a bug elsewhere; the state is still the
// best there is, so keep serving with it.
use tierstack_base::sync::lock;
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion, NodeId, Op, PeerState, RemoteRegion};

/// A service's configuration; every node of a cluster gets the same.
#[derive(Clone, Debug)]
pub struct CoopConfig {
    pub scheme: Scheme,
    /// The proxies, in order (their index is their node index in the model).
    pub active: Vec<NodeId>,
    /// The passive back-end modules.
    pub passive: Vec<NodeId>,
    /// Each node's pool (whole pages).
    pub pool_bytes: u64,
    /// Key-table entries at each home.
    pub key_table_entries: u64,
    /// How long an initiator waits for a STORE's acknowledgment (and a
    /// home's answer to a guarded remove-holder).
    pub ack_timeout: Duration,
    /// A redundant copy's eviction asks its home first and is refused if it
    /// would drop the last copy (seed-notes a.7 #7). On by default.
    pub last_copy_guard: bool,
}

impl CoopConfig {
    pub fn new(scheme: Scheme, active: Vec<NodeId>, passive: Vec<NodeId>, pool_bytes: u64) -> Self {
        Self {
            scheme,
            active,
            passive,
            pool_bytes,
            key_table_entries: 1 << 16,
            ack_timeout: Duration::from_secs(2),
            last_copy_guard: true,
        }
    }
}

/// A service call that cannot run (set-up only: the request path turns
/// operating errors into misses).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("bad cooperative cache configuration: {0}")]
    Config(String),
    #[error("this node is passive: it takes no requests")]
    Passive,
}

/// What a lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Local { body: Vec<u8>, version: u64 },
    Remote { body: Vec<u8>, version: u64, holder: NodeId },
    Miss,
}

/// A node's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServiceStats {
    /// Messages by Table 2's rule (this node's charged and consequential).
    pub tally: Tally,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    /// Remote reads refused because the slot changed since it was announced.
    pub stale_reads: u64,
    /// Reads, messages or STOREs that failed on a dead or silent peer.
    pub peer_failures: u64,
    pub announces: u64,
    pub announce_bytes: u64,
    pub key_table_full: u64,
    /// Malformed messages dropped.
    pub malformed: u64,
    /// Redundant copies' evictions asked at their homes (a.7 #7), and how
    /// many the homes refused (this node held the last copy after all).
    pub guarded_evictions: u64,
    pub last_copy_refusals: u64,
}

#[derive(Clone, Debug)]
struct Loc {
    seq: u64,
    bytes: u64,
    version: u64,
    pages: Vec<u32>,
}

struct State {
    cache: NodeCache,
    /// Entries whose pages are reserved but whose bytes are not in yet.
    pending: HashSet<Key>,
    /// Who holds what, as announced (this node's own entries included).
    replica: HashMap<Key, BTreeMap<usize, Loc>>,
    free: Vec<u32>,
    keys: Option<KeyTable>,
    stats: ServiceStats,
}

struct Shared {
    fabric: Arc<dyn Fabric>,
    config: CoopConfig,
    me: usize,
    members: Vec<NodeId>,
    homes: Homes,
    /// Groupcache's owners (consistent hashing over the proxies).
    ring: HashRing,
    layout: PoolLayout,
    pool: Arc<LocalRegion>,
    op: Mutex<()>,
    state: Mutex<State>,
    acks: Mutex<HashMap<u64, SyncSender<(u32, u32)>>>,
    /// Groupcache GETs waiting for the owner's reply.
    replies: Mutex<HashMap<u64, SyncSender<Found>>>,
    next_id: AtomicU64,
    regions: Mutex<Handles>,
    stop: AtomicBool,
    /// Messages this node sent, and handled (for quiescence checks).
    sent: AtomicU64,
    handled: AtomicU64,
}

/// One node of the service: its regions, its receiver thread, its API.
pub struct CoopNode {
    shared: Arc<Shared>,
    receiver: Option<JoinHandle<()>>,
    store_worker: Option<JoinHandle<()>>,
}

/// Handles to peers' regions, by (node index, region name).
type Handles = HashMap<(usize, &'static str), Arc<dyn RemoteRegion>>;

/// Plans a primitive makes at most, when homes refuse redundant evictions.
const PLAN_ROUNDS_MAX: usize = 4;

/// A groupcache owner's answer: the version and bytes, if it holds the key.
type Found = Option<(u64, Vec<u8>)>;

/// Messages of one primitive call: (kind, bytes, charged).
type Sent = Vec<(MsgKind, u64, bool)>;

impl CoopNode {
    /// Registers this node's regions and starts its receiver thread.
    pub fn start(fabric: Arc<dyn Fabric>, config: CoopConfig) -> Result<Self, ServiceError> {
        let members: Vec<NodeId> = config.active.iter().chain(&config.passive).copied().collect();
        if members.len() > 64 {
            return Err(ServiceError::Config("at most 64 nodes (holder bitmaps are one word)".into()));
        }
        let me = members
            .iter()
            .position(|&n| n == fabric.local_node())
            .ok_or_else(|| ServiceError::Config(format!("{} is not a member", fabric.local_node())))?;
        let homes = Homes::new(config.active.len()).ok_or_else(|| ServiceError::Config("no active node".into()))?;
        let ring = HashRing::new(config.active.len()).ok_or_else(|| ServiceError::Config("no active node".into()))?;
        let pool_pages =
            u32::try_from(config.pool_bytes / PAGE_BYTES).map_err(|_| ServiceError::Config("pool too large".into()))?;
        if pool_pages == 0 || !config.key_table_entries.is_power_of_two() {
            return Err(ServiceError::Config("the pool needs a page; key-table entries a power of two".into()));
        }
        let passive_here = me >= config.active.len();
        let pages = if passive_here && !config.scheme.uses_passive() { 0 } else { pool_pages };
        let layout = PoolLayout::new(pool_pages);
        let pool = fabric.register(POOL_REGION, layout.region_bytes(), tierstack_fabric::Access::read_only())?;
        let keys = if passive_here {
            None
        } else {
            let region = fabric.register(
                KEYS_REGION,
                (config.key_table_entries + PROBE_MAX) * KEY_ENTRY_BYTES,
                tierstack_fabric::Access::read_only(),
            )?;
            Some(KeyTable::new(region, config.key_table_entries))
        };
        let state = State {
            cache: NodeCache::new(pages),
            pending: HashSet::new(),
            replica: HashMap::new(),
            free: members
                .iter()
                .enumerate()
                .map(|(i, _)| if i < config.active.len() || config.scheme.uses_passive() { pool_pages } else { 0 })
                .collect(),
            keys,
            stats: ServiceStats::default(),
        };
        let shared = Arc::new(Shared {
            fabric,
            config,
            me,
            members,
            homes,
            ring,
            layout,
            pool,
            op: Mutex::new(()),
            state: Mutex::new(state),
            acks: Mutex::new(HashMap::new()),
            replies: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            regions: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            handled: AtomicU64::new(0),
        });
        let (stores_tx, stores_rx) = std::sync::mpsc::channel();
        let s = shared.clone();
        let store_worker = std::thread::Builder::new()
            .name("coop-store".into())
            .spawn(move || s.store_loop(stores_rx))
            .map_err(|e| ServiceError::Fabric(e.into()))?;
        let s = shared.clone();
        let receiver = std::thread::Builder::new()
            .name("coop-receiver".into())
            .spawn(move || s.receive_loop(stores_tx))
            .map_err(|e| ServiceError::Fabric(e.into()))?;
        Ok(Self { shared, receiver: Some(receiver), store_worker: Some(store_worker) })
    }

    /// Looks `key` up: a local hit, a remote hit (Cache Fetch), or a miss.
    pub fn get(&self, key: Key) -> Result<Lookup, ServiceError> {
        self.shared.check_active()?;
        let _op = lock(&self.shared.op);
        Ok(self.shared.get(key))
    }

    /// A local hit only, without waiting for another primitive in progress
    /// on this node (no message, no peer read): the entity's bytes and
    /// version if this node holds it. Counts a local hit when it does.
    pub fn get_local(&self, key: Key) -> Option<(Vec<u8>, u64)> {
        self.shared.check_active().ok()?;
        let mut state = lock(&self.shared.state);
        if state.pending.contains(&key) || !state.cache.touch(key) {
            return None;
        }
        let e = state.cache.get(key)?;
        let found = (self.shared.read_body(&e.pages, e.bytes), e.version);
        state.stats.local_hits += 1;
        Some(found)
    }

    /// Drops this node's copy of `key` if it has one (its home is told).
    pub fn drop_local(&self, key: Key) {
        let _op = lock(&self.shared.op);
        let mut state = lock(&self.shared.state);
        let mut dropped = Vec::new();
        self.shared.evict(&mut state, &[key], &mut Vec::new(), false, &mut dropped);
        self.shared.announce(&mut state, Vec::new(), dropped);
    }

    /// Cache Store of `body` (version `version`) after a miss.
    pub fn put(&self, key: Key, version: u64, body: &[u8]) -> Result<(), ServiceError> {
        self.shared.check_active()?;
        let _op = lock(&self.shared.op);
        self.shared.put(key, version, body);
        Ok(())
    }

    /// Cache Validate: `key`'s current version at its home (one one-sided
    /// read), or `None` if the home cannot be read (the caller misses).
    pub fn validate(&self, key: Key) -> Option<u64> {
        self.shared.validate(key)
    }

    /// Cache Invalidate: one message to the home, which drops every copy.
    pub fn invalidate(&self, key: Key) {
        self.shared.invalidate(key)
    }

    pub fn stats(&self) -> ServiceStats {
        lock(&self.shared.state).stats.clone()
    }

    /// Messages this node has sent and has handled so far: a cluster whose
    /// sums are equal (and stay so) has nothing in flight.
    pub fn message_counts(&self) -> (u64, u64) {
        (self.shared.sent.load(Ordering::SeqCst), self.shared.handled.load(Ordering::SeqCst))
    }

    /// The holders (bitmap of member indices) the key table of this node, as
    /// `key`'s home, lists now; `None` if this node is not its home or does
    /// not know the key.
    pub fn holders_at_home(&self, key: Key) -> Option<u64> {
        if self.shared.home(key) != self.shared.me {
            return None;
        }
        lock(&self.shared.state).keys.as_ref().and_then(|k| k.holders(key))
    }

    /// Keys this node holds now.
    pub fn held(&self) -> Vec<Key> {
        lock(&self.shared.state).cache.keys().collect()
    }
}

impl Drop for CoopNode {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The receiver ends first and drops the worker's queue; the worker
        // then ends after the STORE it is placing.
        if let Some(handle) = self.receiver.take() {
            let _ = handle.join();
        }
        if let Some(handle) = self.store_worker.take() {
            let _ = handle.join();
        }
    }
}

impl Shared {
    fn check_active(&self) -> Result<(), ServiceError> {
        if self.me >= self.config.active.len() {
            return Err(ServiceError::Passive);
        }
        Ok(())
    }

    fn home(&self, key: Key) -> usize {
        self.homes.home(key)
    }

    fn cooperative(&self) -> bool {
        !matches!(self.config.scheme, Scheme::Ac | Scheme::Groupcache)
    }

    fn region(&self, node: usize, name: &'static str) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        if let Some(r) = lock(&self.regions).get(&(node, name)) {
            return Ok(r.clone());
        }
        let r = self.fabric.connect(self.members[node], name)?;
        lock(&self.regions).insert((node, name), r.clone());
        Ok(r)
    }

    /// Forgets a peer's handles after an error (a restarted peer is reached
    /// through a fresh connect).
    fn forget(&self, node: usize, state: &mut State) {
        lock(&self.regions).retain(|(n, _), _| *n != node);
        state.stats.peer_failures += 1;
        if self.fabric.peer_state(self.members[node]) == PeerState::Gone {
            // Metadata naming a dead holder is dropped.
            for holders in state.replica.values_mut() {
                holders.remove(&node);
            }
            state.replica.retain(|_, h| !h.is_empty());
            state.free[node] = 0;
        }
    }

    fn send(&self, to: usize, msg: &Msg) -> bool {
        if to == self.me {
            return true;
        }
        // Counted before it leaves, so a receiver never handles a message
        // the counts do not show as sent yet (the quiescence check).
        self.sent.fetch_add(1, Ordering::SeqCst);
        let ok = self.fabric.send(self.members[to], Channel::COOP_CACHE, &msg.encode()).is_ok();
        if !ok {
            self.sent.fetch_sub(1, Ordering::SeqCst);
        }
        ok
    }

    /// Sends a metadata update to `key`'s home, or applies it locally.
    fn tell_home(&self, state: &mut State, key: Key, msg: Msg, sent: &mut Sent, charged: bool) {
        let home = self.home(key);
        let kind = match msg {
            Msg::AddHolder { .. } => MsgKind::AddHolder,
            Msg::RemoveHolder { .. } => MsgKind::RemoveHolder,
            Msg::Invalidate { .. } => MsgKind::Invalidate,
            _ => MsgKind::Transfer,
        };
        if home == self.me {
            self.apply_home(state, self.me, &msg);
            return;
        }
        if charged {
            sent.push((kind, CONTROL_BYTES, true));
        } else {
            state.stats.tally.record_consequential(kind, CONTROL_BYTES);
        }
        if !self.send(home, &msg) {
            state.stats.peer_failures += 1;
        }
    }

    fn apply_home(&self, state: &mut State, from: usize, msg: &Msg) {
        let node = |n: usize| u32::try_from(n).ok();
        let Some(keys) = state.keys.as_mut() else { return };
        match *msg {
            Msg::AddHolder { key } => keys.update(key, None, node(from)),
            Msg::RemoveHolder { key } => keys.update(key, node(from), None),
            Msg::Transfer { key, remove, add } => keys.update(key, remove, add),
            _ => {}
        }
        state.stats.key_table_full = keys.full;
    }

    fn announce(&self, state: &mut State, held: Vec<Held>, dropped: Vec<Key>) {
        if !self.cooperative() || (held.is_empty() && dropped.is_empty()) {
            return;
        }
        let msg = Msg::Announce { free_pages: state.cache.free_pages(), held, dropped }.encode();
        for (i, &node) in self.members.iter().enumerate() {
            if i != self.me {
                state.stats.announces += 1;
                state.stats.announce_bytes += msg.len() as u64;
                self.sent.fetch_add(1, Ordering::SeqCst);
                if self.fabric.send(node, Channel::COOP_CACHE, &msg).is_err() {
                    self.sent.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn is_redundant(state: &State, key: Key) -> bool {
        state.replica.get(&key).is_some_and(|h| h.len() >= 2)
    }

    /// Writes `key`'s page-table record; returns what to announce.
    fn publish(&self, state: &mut State, key: Key) -> Option<Held> {
        let e = state.cache.get(key)?.clone();
        let slot = *e.pages.first()?;
        let record = Record { key, bytes: e.bytes, version: e.version, pages: e.pages.clone() };
        let memory = self.pool.memory();
        self.layout.record(slot).write_local(memory, &record.encode()).ok()?;
        let seq = memory.load_u64(self.layout.record_seq_offset(slot)).ok()?;
        let loc = Loc { seq, bytes: e.bytes, version: e.version, pages: e.pages.clone() };
        state.replica.entry(key).or_default().insert(self.me, loc);
        Some(Held { key, seq, bytes: e.bytes, version: e.version, pages: e.pages })
    }

    /// Drops this node's copy: the record's sequence moves before any page
    /// is reused, so a reader holding the old sequence refuses what it read.
    fn drop_local(&self, state: &mut State, key: Key) -> bool {
        let Some(e) = state.cache.remove(key) else { return false };
        state.pending.remove(&key);
        if let Some(&slot) = e.pages.first() {
            let _ = self.layout.record(slot).write_local(self.pool.memory(), &Record::empty());
        }
        if let Some(h) = state.replica.get_mut(&key) {
            h.remove(&self.me);
            if h.is_empty() {
                state.replica.remove(&key);
            }
        }
        true
    }

    /// Drops `victims` here, telling their homes (charged to the caller's
    /// primitive, or consequential).
    fn evict(&self, state: &mut State, victims: &[Key], sent: &mut Sent, charged: bool, dropped: &mut Vec<Key>) {
        for &v in victims {
            if self.drop_local(state, v) {
                dropped.push(v);
                if self.cooperative() {
                    self.tell_home(state, v, Msg::RemoveHolder { key: v }, sent, charged);
                }
            }
        }
    }

    /// Records a message of a primitive in progress: charged to it, or
    /// consequential.
    fn note(state: &mut State, sent: &mut Sent, kind: MsgKind, charged: bool) {
        if charged {
            sent.push((kind, CONTROL_BYTES, true));
        } else {
            state.stats.tally.record_consequential(kind, CONTROL_BYTES);
        }
    }

    /// Whether evicting `key` here asks its home first (a.7 #7).
    fn needs_guard(&self, state: &State, key: Key) -> bool {
        self.config.last_copy_guard
            && self.cooperative()
            && state.cache.get(key).is_some_and(|e| {
                guarded_eviction(self.config.scheme.mode_for(e.bytes).0, Self::is_redundant(state, key))
            })
    }

    /// Frees `victims` (a plan made under `state`). A victim chosen because
    /// another copy exists is first offered to its home (`RemoveIfShared`),
    /// which grants only if another holder remains; the state lock is
    /// released while the answers come (bounded by `ack_timeout`). Granted
    /// and plain victims are dropped. Returns false if a home refused: that
    /// copy is now known as this node's sole one and the caller plans again.
    /// A home that does not answer (dead, silent) counts as granted: the
    /// copy is dropped, so no copy the home may have forgotten survives an
    /// invalidate.
    fn clear_room<'s>(
        &'s self,
        mut state: MutexGuard<'s, State>,
        victims: &[Key],
        sent: &mut Sent,
        charged: bool,
        dropped: &mut Vec<Key>,
    ) -> (MutexGuard<'s, State>, bool) {
        let (guarded, plain): (Vec<Key>, Vec<Key>) = victims.iter().partition(|&&v| self.needs_guard(&state, v));
        self.evict(&mut state, &plain, sent, charged, dropped);
        if guarded.is_empty() {
            return (state, true);
        }
        state.stats.guarded_evictions += guarded.len() as u64;
        let me = u32::try_from(self.me).unwrap_or(u32::MAX);
        let mut answers: Vec<(Key, bool)> = Vec::new();
        let mut waiting = Vec::new();
        for &v in &guarded {
            let home = self.home(v);
            if home == self.me {
                // Our own table, under the state lock: serialized with
                // every request the receiver applies.
                let granted = state.keys.as_mut().is_some_and(|k| k.remove_if_shared(v, me));
                answers.push((v, granted));
                continue;
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = sync_channel(1);
            lock(&self.acks).insert(id, tx);
            Self::note(&mut state, sent, MsgKind::RemoveHolder, charged);
            if self.send(home, &Msg::RemoveIfShared { id, key: v }) {
                waiting.push((v, id, rx));
            } else {
                lock(&self.acks).remove(&id);
                state.stats.peer_failures += 1;
                answers.push((v, true));
            }
        }
        if !waiting.is_empty() {
            drop(state);
            let deadline = instant_now() + self.config.ack_timeout;
            let got: Vec<(Key, Option<(u32, u32)>)> = waiting
                .into_iter()
                .map(|(v, id, rx)| {
                    let reply = rx.recv_timeout(deadline.saturating_duration_since(instant_now())).ok();
                    lock(&self.acks).remove(&id);
                    (v, reply)
                })
                .collect();
            state = lock(&self.state);
            for (v, reply) in got {
                match reply {
                    Some((granted, _)) => {
                        Self::note(&mut state, sent, MsgKind::RemoveGrant, charged);
                        answers.push((v, granted == 1));
                    }
                    None => {
                        state.stats.peer_failures += 1;
                        answers.push((v, true));
                    }
                }
            }
        }
        let mut all_granted = true;
        for (v, granted) in answers {
            if granted {
                // The home has removed this node already: no message.
                if self.drop_local(&mut state, v) {
                    dropped.push(v);
                }
            } else {
                all_granted = false;
                state.stats.last_copy_refusals += 1;
                // The home says this is the last copy: believe it.
                let me = self.me;
                if let Some(h) = state.replica.get_mut(&v) {
                    h.retain(|&n, _| n == me);
                }
            }
        }
        (state, all_granted)
    }

    fn spaces(&self, state: &State, bytes: u64) -> Vec<Space> {
        let (_, passive) = self.config.scheme.mode_for(bytes);
        let n = if passive { self.members.len() } else { self.config.active.len() };
        (0..n)
            .filter(|&i| i != self.me)
            .map(|node| {
                let redundant = state
                    .replica
                    .iter()
                    .filter(|(_, h)| h.len() >= 2)
                    .filter_map(|(_, h)| h.get(&node))
                    .map(|l| l.pages.len() as u32)
                    .sum();
                Space { node, free_pages: state.free[node], redundant_pages: redundant }
            })
            .collect()
    }

    fn get(&self, key: Key) -> Lookup {
        if self.config.scheme == Scheme::Groupcache {
            let owner = self.ring.owner(key);
            if owner != self.me {
                return self.group_get(key, owner);
            }
        }
        let mut state = lock(&self.state);
        if !state.pending.contains(&key) && state.cache.touch(key) {
            state.stats.local_hits += 1;
            // Copied out under the lock: no STORE handled meanwhile can
            // evict the entry and reuse its pages.
            return match state.cache.get(key) {
                Some(e) => Lookup::Local { body: self.read_body(&e.pages, e.bytes), version: e.version },
                None => Lookup::Miss,
            };
        }
        if !self.cooperative() {
            state.stats.misses += 1;
            return Lookup::Miss;
        }
        // The holder: as the model picks it.
        let others: Vec<usize> =
            state.replica.get(&key).map(|h| h.keys().copied().filter(|&n| n != self.me).collect()).unwrap_or_default();
        if others.is_empty() {
            state.stats.misses += 1;
            return Lookup::Miss;
        }
        let holder = others[(mix(key ^ self.me as u64) % others.len() as u64) as usize];
        let Some(loc) = state.replica.get(&key).and_then(|h| h.get(&holder)).cloned() else { return Lookup::Miss };
        let (mut state, result) = self.fetch(state, key, holder, &loc);
        match result {
            Some((body, version)) => {
                state.stats.remote_hits += 1;
                Lookup::Remote { body, version, holder: self.members[holder] }
            }
            None => {
                state.stats.misses += 1;
                Lookup::Miss
            }
        }
    }

    /// Cache Fetch. Runs under the state lock except while waiting for a
    /// swap's acknowledgment.
    fn fetch<'s>(
        &'s self,
        mut state: MutexGuard<'s, State>,
        key: Key,
        holder: usize,
        loc: &Loc,
    ) -> (MutexGuard<'s, State>, Option<(Vec<u8>, u64)>) {
        let (mode, _) = self.config.scheme.mode_for(loc.bytes);
        let need = pages_for(loc.bytes);
        let Some(&slot) = loc.pages.first() else { return (state, None) };
        let holder_passive = holder >= self.config.active.len();
        let mut sent: Sent = vec![(MsgKind::DataRead, loc.bytes, true)];
        let mut dropped = Vec::new();
        let mut held = Vec::new();
        let mut result = None;
        for _round in 0..PLAN_ROUNDS_MAX {
            let plan = {
                let st: &State = &state;
                let red = |k: Key| Self::is_redundant(st, k);
                let swappable =
                    |k: Key| !holder_passive || st.cache.get(k).is_some_and(|e| self.config.scheme.mode_for(e.bytes).1);
                plan_fetch(mode, &st.cache, need, key, &red, &swappable)
            };
            match plan {
                None => break,
                Some(FetchPlan::Local(room)) => {
                    let victims = match &room {
                        Room::Free => Vec::new(),
                        Room::Redundant(v) | Room::Evict(v) => v.clone(),
                    };
                    let (s, cleared) = self.clear_room(state, &victims, &mut sent, true, &mut dropped);
                    state = s;
                    if !cleared {
                        continue;
                    }
                    let pages = state.cache.insert(key, loc.bytes, loc.version).ok().map(|e| e.pages.clone());
                    if let Some(pages) = pages {
                        match self.read_remote(holder, &loc.pages, &pages, loc.bytes, Some((slot, loc.seq))) {
                            Ok(true) => {
                                held.extend(self.publish(&mut state, key));
                                self.tell_home(&mut state, key, Msg::AddHolder { key }, &mut sent, true);
                                result = Some((self.read_body(&pages, loc.bytes), loc.version));
                            }
                            outcome => {
                                state.cache.remove(key);
                                self.read_failed(&mut state, key, holder, outcome);
                            }
                        }
                    }
                    break;
                }
                Some(FetchPlan::Swap(victims)) => {
                    let (s, r) = self.swap(state, key, holder, loc, &victims, &mut sent, &mut dropped, &mut held);
                    state = s;
                    result = r;
                    break;
                }
            }
        }
        state.stats.tally.record(Primitive::Fetch, &sent);
        self.announce(&mut state, held, dropped);
        (state, result)
    }

    fn read_failed(&self, state: &mut State, key: Key, holder: usize, outcome: Result<bool, FabricError>) {
        match outcome {
            Ok(_) => {
                // The slot changed since it was announced: forget that copy.
                state.stats.stale_reads += 1;
                if let Some(h) = state.replica.get_mut(&key) {
                    h.remove(&holder);
                }
            }
            Err(_) => self.forget(holder, state),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn swap<'s>(
        &'s self,
        mut state: MutexGuard<'s, State>,
        key: Key,
        holder: usize,
        loc: &Loc,
        victims: &[Key],
        sent: &mut Sent,
        dropped: &mut Vec<Key>,
        held: &mut Vec<Held>,
    ) -> (MutexGuard<'s, State>, Option<(Vec<u8>, u64)>) {
        let staging: Vec<u32> = (0..pages_for(loc.bytes)).map(|i| self.layout.fetch_staging() + i).collect();
        let Some(&slot) = loc.pages.first() else { return (state, None) };
        match self.read_remote(holder, &loc.pages, &staging, loc.bytes, Some((slot, loc.seq))) {
            Ok(true) => {}
            outcome => {
                self.read_failed(&mut state, key, holder, outcome);
                return (state, None);
            }
        }
        let redundant: Vec<Key> = victims.iter().copied().filter(|&v| Self::is_redundant(&state, v)).collect();
        // Redundant copies are dropped (asked at their homes first); one a
        // home refused is a sole copy after all and moves with the others.
        let (s, _) = self.clear_room(state, &redundant, sent, true, dropped);
        state = s;
        let items: Vec<Item> = victims
            .iter()
            .filter(|&&v| !dropped.contains(&v))
            .filter_map(|&v| {
                let e = state.cache.get(v)?;
                let seq = state.replica.get(&v).and_then(|h| h.get(&self.me)).map_or(UNCHECKED, |l| l.seq);
                Some(Item { key: v, version: e.version, bytes: e.bytes, seq, pages: e.pages.clone() })
            })
            .collect();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.acks).insert(id, tx);
        sent.push((MsgKind::Store, CONTROL_BYTES, true));
        let ok = self.send(holder, &Msg::Store { id, swap_for: Some(key), items: items.clone() });
        // Wait without the state lock: the receiver thread needs it.
        drop(state);
        let ack = if ok { rx.recv_timeout(self.config.ack_timeout).ok() } else { None };
        let mut state = lock(&self.state);
        lock(&self.acks).remove(&id);
        for it in &items {
            self.drop_local(&mut state, it.key);
            dropped.push(it.key);
        }
        match ack {
            Some((_, reads)) => {
                sent.push((MsgKind::StoreAck, CONTROL_BYTES, true));
                sent.extend((0..reads).map(|_| (MsgKind::DataRead, 0, true)));
            }
            None => {
                state.stats.peer_failures += 1;
                for it in &items {
                    self.tell_home(&mut state, it.key, Msg::RemoveHolder { key: it.key }, sent, true);
                }
            }
        }
        let body = self.read_body(&staging, loc.bytes);
        let Some(pages) = state.cache.insert(key, loc.bytes, loc.version).ok().map(|e| e.pages.clone()) else {
            // Room was taken meanwhile (a peer's STORE): serve, do not cache.
            return (state, Some((body, loc.version)));
        };
        self.write_body(&pages, &body);
        held.extend(self.publish(&mut state, key));
        if ack.is_none() {
            self.tell_home(&mut state, key, Msg::AddHolder { key }, sent, true);
        }
        (state, Some((body, loc.version)))
    }

    fn put(&self, key: Key, version: u64, body: &[u8]) {
        if self.config.scheme == Scheme::Groupcache {
            let owner = self.ring.owner(key);
            if owner != self.me {
                self.group_put(key, owner, version, body);
                return;
            }
        }
        self.store(key, version, body);
    }

    /// Cache Store on this node's own behalf (every scheme; groupcache's
    /// owner for its keys).
    pub(super) fn store(&self, key: Key, version: u64, body: &[u8]) {
        let bytes = body.len() as u64;
        let mut state = lock(&self.state);
        if !cacheable(bytes) || state.cache.contains(key) {
            return;
        }
        let (mode, _) = self.config.scheme.mode_for(bytes);
        let need = pages_for(bytes);
        let peers = if mode == Mode::Local { Vec::new() } else { self.spaces(&state, bytes) };
        let plan = {
            let st: &State = &state;
            let red = |k: Key| Self::is_redundant(st, k);
            plan_store(mode, &st.cache, need, key, &peers, &red)
        };
        let mut sent: Sent = Vec::new();
        let mut dropped = Vec::new();
        let mut held = Vec::new();
        let mut room = match plan {
            None => None,
            Some(StorePlan::Local(room)) => Some(room),
            Some(StorePlan::Remote(peer)) => {
                let staging: Vec<u32> = (0..need).map(|i| self.layout.store_staging() + i).collect();
                self.write_body(&staging, body);
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (tx, rx) = sync_channel(1);
                lock(&self.acks).insert(id, tx);
                sent.push((MsgKind::Store, CONTROL_BYTES, true));
                let item = Item { key, version, bytes, seq: UNCHECKED, pages: staging };
                let ok = self.send(peer, &Msg::Store { id, swap_for: None, items: vec![item] });
                drop(state);
                let ack = if ok { rx.recv_timeout(self.config.ack_timeout).ok() } else { None };
                state = lock(&self.state);
                lock(&self.acks).remove(&id);
                match ack {
                    Some((placed, reads)) => {
                        sent.push((MsgKind::StoreAck, CONTROL_BYTES, true));
                        sent.extend((0..reads).map(|_| (MsgKind::DataRead, bytes, true)));
                        if placed == 1 {
                            None
                        } else {
                            // Declined: place it here by our own priority.
                            let st: &State = &state;
                            plan_receive(mode, &st.cache, need, key, &|k| Self::is_redundant(st, k))
                        }
                    }
                    None => {
                        state.stats.peer_failures += 1;
                        let st: &State = &state;
                        plan_receive(mode, &st.cache, need, key, &|k| Self::is_redundant(st, k))
                    }
                }
            }
        };
        for _round in 0..PLAN_ROUNDS_MAX {
            let Some(r) = room.take() else { break };
            let victims = match &r {
                Room::Free => Vec::new(),
                Room::Redundant(v) | Room::Evict(v) => v.clone(),
            };
            let (s, cleared) = self.clear_room(state, &victims, &mut sent, true, &mut dropped);
            state = s;
            if !cleared {
                // A home refused: plan again, here.
                let st: &State = &state;
                room = plan_receive(mode, &st.cache, need, key, &|k| Self::is_redundant(st, k));
                continue;
            }
            if state.cache.contains(key) {
                break;
            }
            if let Some(pages) = state.cache.insert(key, bytes, version).ok().map(|e| e.pages.clone()) {
                self.write_body(&pages, body);
                held.extend(self.publish(&mut state, key));
                if self.cooperative() {
                    self.tell_home(&mut state, key, Msg::AddHolder { key }, &mut sent, true);
                }
            }
            break;
        }
        if self.cooperative() {
            state.stats.tally.record(Primitive::Store, &sent);
        }
        self.announce(&mut state, held, dropped);
    }

    fn validate(&self, key: Key) -> Option<u64> {
        let home = self.home(key);
        if home == self.me {
            // Our own table: no message.
            let mut state = lock(&self.state);
            state.stats.tally.record(Primitive::Validate, &[]);
            return state.keys.as_ref().map(|k| k.version(key));
        }
        let start = key_probe_start(key, self.config.key_table_entries);
        let len = PROBE_MAX * KEY_ENTRY_BYTES;
        lock(&self.state).stats.tally.record(Primitive::Validate, &[(MsgKind::HomeRead, len, true)]);
        let window = self.region(home, KEYS_REGION).and_then(|r| {
            // `len` is 512 bytes: it fits a u32.
            r.post(vec![Op::Read { offset: start * KEY_ENTRY_BYTES, len: len as u32 }]).wait()
        });
        match window.and_then(|mut r| r.pop().ok_or(FabricError::Closed)?.into_bytes()) {
            Ok(bytes) => Some(version_in_window(&bytes, key).unwrap_or(0)),
            Err(_) => {
                let mut state = lock(&self.state);
                self.forget(home, &mut state);
                None
            }
        }
    }

    fn invalidate(&self, key: Key) {
        if self.config.scheme == Scheme::Groupcache {
            // No cluster invalidation: the owner drops its copy (the only one).
            let owner = self.ring.owner(key);
            let mut state = lock(&self.state);
            if owner == self.me {
                self.drop_local(&mut state, key);
                state.stats.tally.record(Primitive::Invalidate, &[]);
            } else {
                if !self.send(owner, &Msg::DropCopy { key }) {
                    state.stats.peer_failures += 1;
                }
                state.stats.tally.record(Primitive::Invalidate, &[(MsgKind::DropCopy, CONTROL_BYTES, true)]);
            }
            return;
        }
        let home = self.home(key);
        let mut state = lock(&self.state);
        let mut sent: Sent = Vec::new();
        if home == self.me {
            self.home_invalidate(&mut state, key);
        } else {
            sent.push((MsgKind::Invalidate, CONTROL_BYTES, true));
            if !self.send(home, &Msg::Invalidate { key }) {
                state.stats.peer_failures += 1;
            }
        }
        state.stats.tally.record(Primitive::Invalidate, &sent);
    }

    fn home_invalidate(&self, state: &mut State, key: Key) {
        let Some(keys) = state.keys.as_mut() else { return };
        let holders = keys.invalidate(key);
        for n in (0..64usize).filter(|n| holders & (1u64 << n) != 0) {
            if n == self.me {
                if self.drop_local(state, key) {
                    self.announce(state, Vec::new(), vec![key]);
                }
            } else if n < self.members.len() {
                state.stats.tally.record_consequential(MsgKind::DropCopy, CONTROL_BYTES);
                if !self.send(n, &Msg::DropCopy { key }) {
                    state.stats.peer_failures += 1;
                }
            }
        }
    }
}
