//! One node of the cooperative cache service (see the module docs above):
//! the request path (get, put, validate, invalidate) is here, the receiver
//! thread's side (every message a node handles) in `receive`, groupcache's
//! two-sided path in `group`, and the bytes of the pool's pages (local, and
//! read one-sided from a peer) in `pages`.

mod group;
mod homeward;
mod locks;
mod members;
mod occupancy;
mod pages;
mod receive;

pub use occupancy::Occupancy;

use super::home::{keys_region_bytes, KeyTable};
use super::layout::{PoolLayout, Record, KEYS_REGION, POOL_REGION};
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
use locks::{KeyLocks, Staging, StagingSlots};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::host_monotonic_ns;
use tierstack_base::time::instant_now;
// A panic while holding a lock is a bug elsewhere; the state is still the
// best there is, so keep serving with it.
use tierstack_base::sync::lock;
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion, NodeId, PeerState, RemoteRegion};

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
    /// How often each node asks the fabric whether its peers live (a home
    /// found `Gone` is taken over by its ring successor; one seen running
    /// again takes its keys back).
    pub liveness_interval: Duration,
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
            liveness_interval: Duration::from_millis(500),
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
    /// Announces not sent to a peer whose inbox stayed full (skipped for a
    /// back-off after a failed send).
    pub announces_skipped: u64,
    /// Add-holders this node's key table refused, as a home (the key's
    /// probe window was full; the holder was told to drop its copy).
    pub key_table_full: u64,
    /// Copies this node dropped because their home refused to list them
    /// (the entity stays unpooled rather than unreachable by a purge).
    pub pool_refusals: u64,
    /// Primitives that waited on a peer's answer (STORE or swap
    /// acknowledgment, a home's grant or purge acknowledgment, a
    /// groupcache reply), and those whose wait ran out.
    pub stalls: u64,
    pub stall_timeouts: u64,
    /// Validates answered by this node's own key table, and by a one-sided
    /// read of another home's.
    pub validates_home_local: u64,
    pub validates_home_remote: u64,
    /// Membership changes this node applied (a home declared dead and taken
    /// over by its successor, or back), and the copies it dropped because
    /// their home changed.
    pub takeovers: u64,
    pub takeover_drops: u64,
    /// Purges whose home did not acknowledge: their copies were dropped by
    /// a broadcast `DropCopy` instead.
    pub purges_unconfirmed: u64,
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
    /// Keys with a primitive in progress (per-key ordering; no node-wide
    /// lock is held across a round trip).
    key_locks: KeyLocks,
    staging: StagingSlots,
    /// Members declared dead (bit i: member i), from the fabric's peer state.
    dead: AtomicU64,
    /// Members seen running at least once (only those can be declared dead).
    seen_alive: AtomicU64,
    /// A number new at each start of this node, and the latest known of
    /// each peer (`Msg::Joined`).
    incarnation: u64,
    incarnations: Mutex<HashMap<usize, u64>>,
    /// Peers whose announces are skipped until a moment, and the current
    /// back-off (a send to them failed).
    paused: Mutex<HashMap<usize, (std::time::Instant, Duration)>>,
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
    membership: Option<JoinHandle<()>>,
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
        if pool_pages == 0 || !config.key_table_entries.is_power_of_two() || config.key_table_entries > 1 << 24 {
            return Err(ServiceError::Config(
                "the pool needs a page; key-table entries a power of two, at most 2^24".into(),
            ));
        }
        let passive_here = me >= config.active.len();
        // This start's number; the key table's versions start from it, so a
        // version another home (or this node before a restart) handed out
        // never matches one of ours.
        let incarnation = mix(host_monotonic_ns() ^ (me as u64) << 48 ^ u64::from(std::process::id()));
        let pages = if passive_here && !config.scheme.uses_passive() { 0 } else { pool_pages };
        let layout = PoolLayout::new(pool_pages);
        let pool = fabric.register(POOL_REGION, layout.region_bytes(), tierstack_fabric::Access::read_only())?;
        let keys = if passive_here {
            None
        } else {
            let region = fabric.register(
                KEYS_REGION,
                keys_region_bytes(config.key_table_entries),
                tierstack_fabric::Access::read_only(),
            )?;
            // This incarnation's versions: a version another home (or this
            // node before a restart) handed out never matches one of ours.
            Some(KeyTable::new(region, config.key_table_entries, incarnation & !0xffff_ffff))
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
            key_locks: KeyLocks::default(),
            staging: StagingSlots::default(),
            dead: AtomicU64::new(0),
            seen_alive: AtomicU64::new(0),
            incarnation,
            incarnations: Mutex::new(HashMap::new()),
            paused: Mutex::new(HashMap::new()),
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
        let s = shared.clone();
        let membership = std::thread::Builder::new()
            .name("coop-members".into())
            .spawn(move || s.membership_loop())
            .map_err(|e| ServiceError::Fabric(e.into()))?;
        // Whatever a previous incarnation of this node held or homed is gone.
        shared.announce_joined();
        Ok(Self { shared, receiver: Some(receiver), store_worker: Some(store_worker), membership: Some(membership) })
    }

    /// Looks `key` up: a local hit, a remote hit (Cache Fetch), or a miss.
    pub fn get(&self, key: Key) -> Result<Lookup, ServiceError> {
        self.shared.check_active()?;
        let _key = self.shared.key_locks.hold(key);
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
        let _key = self.shared.key_locks.hold(key);
        let mut state = lock(&self.shared.state);
        let mut dropped = Vec::new();
        self.shared.evict(&mut state, &[key], &mut Vec::new(), false, &mut dropped);
        self.shared.announce(&mut state, Vec::new(), dropped);
    }

    /// Cache Store of `body` (version `version`) after a miss.
    pub fn put(&self, key: Key, version: u64, body: &[u8]) -> Result<(), ServiceError> {
        self.shared.check_active()?;
        let _key = self.shared.key_locks.hold(key);
        self.shared.put(key, version, body);
        Ok(())
    }

    /// Cache Validate: `key`'s current version at its home (one one-sided
    /// read), or `None` if the home cannot be read (the caller misses).
    pub fn validate(&self, key: Key) -> Option<u64> {
        self.shared.validate(key)
    }

    /// Cache Invalidate: one message to the home, which drops every copy
    /// and acknowledges (bounded by `ack_timeout`; unacknowledged, every
    /// member is told to drop its copy).
    pub fn invalidate(&self, key: Key) {
        let _key = self.shared.key_locks.hold(key);
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

    /// The first version of this node's key table (its versions count up
    /// from it; `None` on a node that is no home).
    pub fn version_base(&self) -> Option<u64> {
        lock(&self.shared.state).keys.as_ref().map(|k| k.base())
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
        if let Some(handle) = self.membership.take() {
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

    /// `key`'s home now: its ring successor among the members not declared dead.
    fn home(&self, key: Key) -> usize {
        self.homes.home_among(key, !self.dead.load(Ordering::SeqCst))
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

    fn announce(&self, state: &mut State, held: Vec<Held>, dropped: Vec<Key>) {
        if !self.cooperative() || (held.is_empty() && dropped.is_empty()) {
            return;
        }
        let msg = Msg::Announce { free_pages: state.cache.free_pages(), held, dropped }.encode();
        for (i, &node) in self.members.iter().enumerate() {
            if i == self.me {
                continue;
            }
            // Soft state: a peer whose inbox stayed full (stopped, or far
            // behind) is skipped for a while rather than waited for under
            // the state lock; what it misses costs it remote hits, never
            // wrong bytes (reads are checked against the record's sequence).
            if self.announces_paused(i) {
                state.stats.announces_skipped += 1;
                continue;
            }
            state.stats.announces += 1;
            state.stats.announce_bytes += msg.len() as u64;
            self.sent.fetch_add(1, Ordering::SeqCst);
            if self.fabric.send(node, Channel::COOP_CACHE, &msg).is_err() {
                self.sent.fetch_sub(1, Ordering::SeqCst);
                self.pause_announces(i);
            } else {
                lock(&self.paused).remove(&i);
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
            state.stats.stalls += 1;
            state.stats.stall_timeouts += u64::from(got.iter().any(|(_, reply)| reply.is_none()));
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

    /// Cache Fetch. The entity is read one-sidedly into a staging area of
    /// this fetch's own with the state lock released (on tcp a read is a
    /// round trip, and a stopped holder must not stall the node), then
    /// placed under the lock: copied into pool pages made free by the
    /// scheme's plan, or swapped (the lock released again while the holder
    /// acknowledges). No staging area free: a miss.
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
        let Some(area) = self.staging.take(Staging::Fetch) else { return (state, None) };
        let first = self.layout.fetch_staging(area.slot);
        let staging: Vec<u32> = (0..need).map(|i| first + i).collect();
        let mut sent: Sent = vec![(MsgKind::DataRead, loc.bytes, true)];
        drop(state);
        let outcome = self.read_remote(holder, &loc.pages, &staging, loc.bytes, Some((slot, loc.seq)));
        state = lock(&self.state);
        if !matches!(outcome, Ok(true)) {
            self.read_failed(&mut state, key, holder, outcome);
            state.stats.tally.record(Primitive::Fetch, &sent);
            return (state, None);
        }
        let holder_passive = holder >= self.config.active.len();
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
                    let body = self.read_body(&staging, loc.bytes);
                    let pages = state.cache.insert(key, loc.bytes, loc.version).ok().map(|e| e.pages.clone());
                    if let Some(pages) = pages {
                        self.write_body(&pages, &body);
                        held.extend(self.publish(&mut state, key));
                        self.tell_home(&mut state, key, Msg::AddHolder { key }, &mut sent, true);
                    }
                    // Not placed (a concurrent primitive placed it first):
                    // served all the same, the bytes are right.
                    result = Some((body, loc.version));
                    break;
                }
                Some(FetchPlan::Swap(victims)) => {
                    let (s, r) =
                        self.swap(state, key, holder, loc, &staging, &victims, &mut sent, &mut dropped, &mut held);
                    state = s;
                    result = r;
                    break;
                }
            }
        }
        drop(area);
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
        staging: &[u32],
        victims: &[Key],
        sent: &mut Sent,
        dropped: &mut Vec<Key>,
        held: &mut Vec<Held>,
    ) -> (MutexGuard<'s, State>, Option<(Vec<u8>, u64)>) {
        // The entity is in `staging` already (read by `fetch`).
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
        let ack = self.wait_answer(ok, &rx);
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
        let body = self.read_body(staging, loc.bytes);
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
            Some(StorePlan::Remote(peer)) => 'remote: {
                // A staging area of our own; none free: place it here.
                let Some(area) = self.staging.take(Staging::Store) else {
                    let st: &State = &state;
                    break 'remote plan_receive(mode, &st.cache, need, key, &|k| Self::is_redundant(st, k));
                };
                let first = self.layout.store_staging(area.slot);
                let staging: Vec<u32> = (0..need).map(|i| first + i).collect();
                self.write_body(&staging, body);
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (tx, rx) = sync_channel(1);
                lock(&self.acks).insert(id, tx);
                sent.push((MsgKind::Store, CONTROL_BYTES, true));
                let item = Item { key, version, bytes, seq: UNCHECKED, pages: staging };
                let ok = self.send(peer, &Msg::Store { id, swap_for: None, items: vec![item] });
                drop(state);
                let ack = self.wait_answer(ok, &rx);
                drop(area);
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
                        // A silent peer is no STORE target until it
                        // announces its free space again.
                        if let Some(f) = state.free.get_mut(peer) {
                            *f = 0;
                        }
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
}
