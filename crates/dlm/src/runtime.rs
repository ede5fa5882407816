//! The lock manager on a fabric: the drivers that connect the pure state
//! machines ([`crate::proto`], [`crate::srsl`]) to home memory, messages,
//! waiting threads, timeouts, and the recovery monitor.
//!
//! Per node and lock there is one `Cell`: the scheme's client machine under
//! a mutex, plus a condition variable that waiting callers sleep on. A
//! caller that finds the cell busy (another local request still in the
//! protocol) waits for it to become idle first: one queue entry per node.
//! Atomics are executed synchronously by whichever thread drives the cell,
//! with the cell locked, so the machine sees every atomic's result before
//! any other input, as it requires. Messages are handled by one receive
//! thread per node (or by whoever calls [`LockManager::handle_message`]).
//!
//! With recovery on (the default), a **monitor** thread looks every
//! `probe_interval` at each cell whose request has been waiting since its
//! last look: it asks whether the nodes the request waits for are lost
//! (their process ended, the incarnation it talked to ended, or their
//! heartbeat stopped for a lease) and tells the machine, which moves the
//! lock (see [`crate::proto`]). A **heartbeat** thread keeps this node's
//! lease while leases are on, and notices when the node itself was stopped
//! for most of a lease: a grant that arrives across such a gap is given
//! back and requested again, and a hold that spans one releases with
//! `Broken`, since a recovery may have gone past it.

use crate::error::LockError;
use crate::msg::DlmMessage;
use crate::proto::{AbortReason, Action, BlockedOn, ClientState, Input, LockClient, LockMode, ProtoMsg, QueueKind};
use crate::srsl::{ClientAction, ServerAction, SrslClient, SrslMsg, SrslQueue};
use crate::status::{
    node_region_bytes, write_entry, StatusEntry, HEARTBEAT_OFFSET, INCARNATION_OFFSET, LEASE_OFFSET, STATUS_ENTRIES,
};
use crate::table::{alive_region, home_of, table_region, HomeMemory, TABLE_SLOTS_DEFAULT, TABLE_SLOTS_MAX};
use crate::word::{fence_seed, FENCE_OFFSET, FENCE_UNIT, SLOT_BYTES, WORD_NODE_MAX};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
// A panic while holding a cell would be a bug; the state is still the
// machine's last consistent state, so keep going rather than cascade.
use tierstack_base::sync::lock;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion, PeerState, RemoteRegion};

/// How often the receive thread looks at its stop flag while the inbox is quiet.
pub const RECEIVE_POLL_MS: u64 = 20;
/// How long a try-acquire waits for the SRSL server's answer unless configured.
pub const TRY_REPLY_TIMEOUT_MS_DEFAULT: u64 = 1000;
/// The lease unless configured: a node whose heartbeat has not advanced for
/// this long counts as dead for recovery (see [`DlmConfig::lease`]).
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// How often the monitor looks at waiting requests unless configured.
pub const PROBE_INTERVAL_MS_DEFAULT: u64 = 50;
/// How long a request may wait for parties it cannot name (group-0 shared
/// holders, say) before the monitor suspects a lost node, unless configured.
pub const SUSPECT_AFTER_MS_DEFAULT: u64 = 1000;
/// How often a barrier sends its notice again to nodes that have not answered.
const NOTICE_RESEND: Duration = Duration::from_millis(500);
/// How long `break_lock` waits for this node's part of the move (the
/// barrier's release) to finish.
const BREAK_SETTLE: Duration = Duration::from_secs(10);

/// The lock schemes, all behind [`LockScheme`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// One-sided shared/exclusive locking with a distributed queue.
    CoShed,
    /// Send/receive server locking: the home's server thread grants and queues.
    Srsl,
    /// Distributed-queue non-shared locking: N-CoShED's queue, shared requests queued as exclusive.
    Dqnl,
}

impl Scheme {
    pub const ALL: [Scheme; 3] = [Scheme::CoShed, Scheme::Srsl, Scheme::Dqnl];

    pub fn name(self) -> &'static str {
        match self {
            Scheme::CoShed => "ncoshed",
            Scheme::Srsl => "srsl",
            Scheme::Dqnl => "dqnl",
        }
    }
}

impl std::str::FromStr for Scheme {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('-', "").as_str() {
            "ncoshed" | "coshed" => Ok(Scheme::CoShed),
            "srsl" => Ok(Scheme::Srsl),
            "dqnl" => Ok(Scheme::Dqnl),
            other => Err(format!("unknown lock scheme {other:?} (expected ncoshed, srsl or dqnl)")),
        }
    }
}

/// A lock manager's configuration. Every node of a cluster must use the same
/// scheme, lock servers, table size and recovery settings.
#[derive(Clone, Debug)]
pub struct DlmConfig {
    pub scheme: Scheme,
    /// The nodes that keep lock tables (homes). Non-empty.
    pub lock_servers: Vec<NodeId>,
    /// Every node that runs a lock manager: a recovery or break tells them
    /// all, and a recovery waits for each one's acknowledgement (or death).
    pub nodes: Vec<NodeId>,
    /// Slots in each home's table: the most locks one home can hold.
    pub table_slots: u32,
    /// How long a try-acquire waits for an SRSL server's answer.
    pub try_reply_timeout: Duration,
    /// Namespace of this manager's regions (`<prefix>.<scheme>.locks`);
    /// every node of a cluster must use the same.
    pub region_prefix: String,
    /// Run a receive thread that drains the fabric's [`Channel::LOCKS`]
    /// inbox. Turn off when something else reads that channel and hands this
    /// manager its messages through [`LockManager::handle_message`] (a test
    /// driving messages by hand, say); other services have channels of
    /// their own and need not.
    pub own_inbox: bool,
    /// Recover locks from dead holders and waiters without an operator: a
    /// request blocked on a lost node moves the lock to a new generation
    /// (see the crate docs). On by default; off, a dead holder wedges its
    /// lock until someone calls [`LockManager::break_lock`].
    pub recovery: bool,
    /// This node's lease, and how long another node's heartbeat may stand
    /// still before it counts as dead for recovery. `None`: no leases; only
    /// a node whose process ended is lost, and a stopped or partitioned
    /// holder blocks its lock until it comes back.
    pub lease: Option<Duration>,
    /// How often the monitor looks at waiting requests.
    pub probe_interval: Duration,
    /// How long a request may wait for parties it cannot name before the
    /// monitor checks every node for a lost one.
    pub suspect_after: Duration,
}

impl DlmConfig {
    pub fn new(scheme: Scheme, lock_servers: Vec<NodeId>, nodes: Vec<NodeId>) -> Self {
        Self {
            scheme,
            lock_servers,
            nodes,
            table_slots: TABLE_SLOTS_DEFAULT,
            try_reply_timeout: Duration::from_millis(TRY_REPLY_TIMEOUT_MS_DEFAULT),
            region_prefix: "dlm".to_string(),
            own_inbox: true,
            recovery: true,
            lease: Some(Duration::from_millis(LEASE_MS_DEFAULT)),
            probe_interval: Duration::from_millis(PROBE_INTERVAL_MS_DEFAULT),
            suspect_after: Duration::from_millis(SUSPECT_AFTER_MS_DEFAULT),
        }
    }

    pub fn with_table_slots(mut self, slots: u32) -> Self {
        self.table_slots = slots;
        self
    }

    pub fn with_region_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.region_prefix = prefix.into();
        self
    }

    pub fn without_receiver(mut self) -> Self {
        self.own_inbox = false;
        self
    }

    /// Automatic recovery on or off (see [`DlmConfig::recovery`]).
    pub fn with_recovery(mut self, on: bool) -> Self {
        self.recovery = on;
        self
    }

    /// The lease, or `None` for no leases (see [`DlmConfig::lease`]).
    pub fn with_lease(mut self, lease: Option<Duration>) -> Self {
        self.lease = lease;
        self
    }

    pub fn with_probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    pub fn with_suspect_after(mut self, after: Duration) -> Self {
        self.suspect_after = after;
        self
    }

    fn validate(&self, me: NodeId) -> Result<(), LockError> {
        let bad = |what: String| Err(LockError::Config(what));
        if self.lock_servers.is_empty() {
            return bad("no lock servers".into());
        }
        if self.table_slots == 0 || self.table_slots > TABLE_SLOTS_MAX {
            return bad(format!("table_slots {} is not in 1..={TABLE_SLOTS_MAX}", self.table_slots));
        }
        if !self.nodes.contains(&me) {
            return bad(format!("{me} is not among the configured nodes"));
        }
        if let Some(n) = self.nodes.iter().chain(&self.lock_servers).find(|n| n.0 > WORD_NODE_MAX) {
            return bad(format!("{n} does not fit the 16-bit node field of a lock word"));
        }
        if self.lease.is_some_and(|l| l < Duration::from_millis(8)) {
            return bad(format!("lease {:?} is shorter than 8 ms", self.lease));
        }
        if self.probe_interval.is_zero() || self.suspect_after.is_zero() {
            return bad("probe_interval and suspect_after must be positive".into());
        }
        Ok(())
    }
}

/// How long an acquire may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Succeed only if the lock is available now; never enqueue.
    Try,
    /// Wait up to this long; then the request is abandoned (see [`LockError::Timeout`]).
    Timeout(Duration),
}

/// A granted request. Only a [`LockScheme`] creates one; release it through
/// the same scheme (the guards do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    lock: LockId,
    mode: LockMode,
    token: Option<u64>,
    serial: u64,
    /// This node's lease lapses counted when the request began.
    lapses: u64,
}

impl Grant {
    pub fn lock(&self) -> LockId {
        self.lock
    }

    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// The fencing token of an exclusive grant: strictly larger than the
    /// token of every earlier exclusive grant of this lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }
}

/// Counters for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DlmStats {
    /// Lock-manager messages this node has handled.
    pub messages_handled: u64,
    /// Of those, messages whose handling failed (a protocol violation, a
    /// send to a dead peer while handling it, or a home that died under it).
    pub message_errors: u64,
    /// Of those, protocol violations: a bug, or a peer speaking another
    /// protocol; 0 in a sound run, deaths and restarts included.
    pub violations: u64,
    /// Lock-manager messages this node has handed to its fabric (to itself
    /// included). Counted before the send, so across a cluster the sum of
    /// `messages_sent` is never below the sum of `messages_handled`, and the
    /// two are equal exactly when no message is in flight (see
    /// [`crate::bench`], which waits for that between measurements).
    pub messages_sent: u64,
    /// Locks this node moved to a new generation (recoveries it led, and breaks).
    pub moves: u64,
    /// Times the monitor reported a lost node to a waiting request.
    pub peers_lost: u64,
}

/// What every lock scheme offers; [`LockManager`] wraps one.
pub trait LockScheme: Send + Sync {
    fn scheme(&self) -> Scheme;
    fn node(&self) -> NodeId;
    /// Creates the lock at its home (idempotent).
    fn create_lock(&self, lock: LockId) -> Result<(), LockError>;
    fn acquire(&self, lock: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError>;
    fn release(&self, grant: &Grant) -> Result<(), LockError>;
    /// Revokes every hold and request of `lock` (an administrator's tool for
    /// a holder that is stuck but alive). Returns the fencing floor: every
    /// token granted before the break is below it, every token granted
    /// after is above it.
    fn break_lock(&self, lock: LockId) -> Result<u64, LockError>;
    /// Handles one lock-manager message (payload starting with tag `0x01`).
    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError>;
    fn stats(&self) -> DlmStats;
    /// One round of the recovery monitor: look at waiting requests and
    /// report lost nodes to them. The manager's monitor thread calls it
    /// every `probe_interval`; a test may call it by hand.
    fn tick(&self) {}
    /// Whom this node's request for `lock` waits for, if the scheme can say
    /// (N-CoShED and DQNL), for diagnostics and tests.
    fn waits(&self, _lock: LockId) -> Option<crate::proto::Waits> {
        None
    }
    /// A one-line description of this node's protocol state for `lock`
    /// (and, where readable, the lock's home words), for diagnosing a stuck
    /// lock. The format is not stable.
    fn debug_state(&self, lock: LockId) -> String {
        format!("{}: no state dump for {lock}", self.node())
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a lock lives.
struct Slot {
    home_node: NodeId,
    home: Arc<HomeMemory>,
    /// Byte offset of the lock's slot in the home table.
    base: u64,
    /// The home's incarnation: every message about the lock carries it (see [`crate::msg`]).
    epoch: u64,
}

/// This node's lease: the heartbeat thread's record of its own renewals.
struct Lease {
    lease: Duration,
    /// Renewals that came later than [`Lease::gap`] after the previous one:
    /// the node was stopped (or starved) for most of a lease.
    lapses: AtomicU64,
    /// `CLOCK_MONOTONIC` nanoseconds of the last renewal.
    last_ns: AtomicU64,
}

impl Lease {
    /// A gap between renewals at least this long counts as a lapse: below
    /// the lease, so a node that others judged expired (they saw its
    /// heartbeat stand still for a whole lease) always sees its own lapse.
    fn gap(&self) -> Duration {
        self.lease * 3 / 4
    }

    fn period(&self) -> Duration {
        self.lease / 8
    }

    fn renew(&self, memory: &tierstack_fabric::RegionMemory) {
        let now = host_monotonic_ns();
        let last = self.last_ns.load(Ordering::SeqCst);
        if now.saturating_sub(last) >= duration_ns(self.gap()) {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        self.last_ns.store(now, Ordering::SeqCst);
        // The word is ours; a failure would mean a bad offset, which the layout rules out.
        let _ = memory.fetch_add(HEARTBEAT_OFFSET, 1);
    }

    fn mark(&self) -> u64 {
        self.lapses.load(Ordering::SeqCst)
    }

    /// True if the node lapsed since `mark` was taken, or is lapsing now
    /// (its heartbeat thread has not run since it was woken).
    fn lapsed_since(&self, mark: u64) -> bool {
        // `last_ns` first: a renewal that counted a lapse stored it after the count.
        let last = self.last_ns.load(Ordering::SeqCst);
        let lapses = self.lapses.load(Ordering::SeqCst);
        lapses != mark || host_monotonic_ns().saturating_sub(last) >= duration_ns(self.gap())
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the monitor knows of one peer: a handle to its node region (bound
/// to the incarnation it was obtained from) and its heartbeat's progress.
struct Watch {
    handle: Option<Arc<dyn RemoteRegion>>,
    beat: Option<u64>,
    since: Instant,
}

/// What the fabric-facing half of every scheme shares.
struct Core {
    fabric: Arc<dyn Fabric>,
    me: NodeId,
    config: DlmConfig,
    nodes: Arc<[NodeId]>,
    table: Option<Arc<LocalRegion>>,
    table_name: String,
    node_region_name: String,
    node_region: Arc<LocalRegion>,
    /// This manager's incarnation (word 0 of its node region).
    incarnation: u64,
    next_entry: AtomicU64,
    lease: Option<Arc<Lease>>,
    /// Per home node: its table and its incarnation.
    homes: Mutex<HashMap<NodeId, (Arc<HomeMemory>, u64)>>,
    watches: Mutex<HashMap<NodeId, Watch>>,
    messages_handled: AtomicU64,
    message_errors: AtomicU64,
    violations: AtomicU64,
    messages_sent: AtomicU64,
    moves: AtomicU64,
    peers_lost: AtomicU64,
}

impl Core {
    fn new(fabric: Arc<dyn Fabric>, config: DlmConfig) -> Result<Self, LockError> {
        let me = fabric.local_node();
        config.validate(me)?;
        let register = |name: &str, bytes: u64| {
            fabric.register(name, bytes).map_err(|e| LockError::Config(format!("cannot register {name:?}: {e}")))
        };
        let (prefix, scheme) = (&config.region_prefix, config.scheme.name());
        let (table_name, node_region_name) = (table_region(prefix, scheme), alive_region(prefix, scheme));
        // The node region first, its incarnation written: whoever finds the
        // table finds the incarnation it belongs to.
        let node_region = register(&node_region_name, node_region_bytes())?;
        let memory = node_region.memory();
        let incarnation = rand::random::<u64>() | 1;
        let lease_ms = config.lease.map_or(0, |l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1));
        let setup = |e: FabricError| LockError::Config(format!("cannot write the node region: {e}"));
        memory.store_u64(INCARNATION_OFFSET, incarnation).map_err(setup)?;
        memory.store_u64(LEASE_OFFSET, lease_ms).map_err(setup)?;
        let table = if config.lock_servers.contains(&me) {
            Some(register(&table_name, u64::from(config.table_slots) * SLOT_BYTES)?)
        } else {
            None
        };
        let lease = config.lease.map(|lease| {
            Arc::new(Lease { lease, lapses: AtomicU64::new(0), last_ns: AtomicU64::new(host_monotonic_ns()) })
        });
        let nodes: Arc<[NodeId]> = config.nodes.iter().copied().collect();
        Ok(Self {
            fabric,
            me,
            config,
            nodes,
            table,
            table_name,
            node_region_name,
            node_region,
            incarnation,
            next_entry: AtomicU64::new(0),
            lease,
            homes: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            messages_handled: AtomicU64::new(0),
            message_errors: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            peers_lost: AtomicU64::new(0),
        })
    }

    /// `node`'s table and the incarnation it belongs to.
    fn home(&self, lock_id: LockId, node: NodeId) -> Result<(Arc<HomeMemory>, u64), LockError> {
        if let Some(home) = lock(&self.homes).get(&node) {
            return Ok(home.clone());
        }
        let fabric_err = |e| LockError::from_fabric(lock_id, node, e);
        let home = match (&self.table, node == self.me) {
            (Some(table), true) => (Arc::new(HomeMemory::Local(table.clone())), self.incarnation),
            _ => {
                let table = self.fabric.connect(node, &self.table_name).map_err(fabric_err)?;
                // Registered before the table: the incarnation the table
                // belongs to, or (if the home restarted just now) a newer one,
                // whose table the first atomic then misses (PeerDead).
                let epoch = self
                    .fabric
                    .connect(node, &self.node_region_name)
                    .and_then(|region| region.read_u64(INCARNATION_OFFSET))
                    .map_err(fabric_err)?;
                (Arc::new(HomeMemory::Remote(table)), epoch)
            }
        };
        Ok(lock(&self.homes).entry(node).or_insert(home).clone())
    }

    /// Drops the handle to `node`'s table after its incarnation ended, so the
    /// next use connects to the node's next incarnation.
    fn forget_home(&self, node: NodeId, home: &Arc<HomeMemory>) {
        let mut homes = lock(&self.homes);
        if homes.get(&node).is_some_and(|(h, _)| Arc::ptr_eq(h, home)) {
            homes.remove(&node);
        }
    }

    /// Finds (or, with `create`, claims) the slot of `id` at its home.
    fn locate(&self, id: LockId, create: bool) -> Result<Slot, LockError> {
        if id.0 == u64::MAX {
            return Err(LockError::InvalidLockId { lock: id });
        }
        let home_node =
            home_of(id, &self.config.lock_servers).ok_or_else(|| LockError::Config("no lock servers".into()))?;
        let (home, epoch) = self.home(id, home_node)?;
        let fabric_err = |e: FabricError| {
            if matches!(e, FabricError::PeerDead { .. }) {
                self.forget_home(home_node, &home);
            }
            LockError::from_fabric(id, home_node, e)
        };
        let base = if create {
            home.claim(id, fence_seed(unix_ms()))
                .map_err(fabric_err)?
                .ok_or(LockError::TableFull { home: home_node, slots: home.slots() })?
        } else {
            home.lookup(id).map_err(fabric_err)?.ok_or(LockError::UnknownLock { lock: id, home: home_node })?
        };
        Ok(Slot { home_node, home, base, epoch })
    }

    /// Sends a message on [`Channel::LOCKS`]; to ourselves it goes through our
    /// own inbox of that channel, like any other.
    fn send(&self, lock_id: LockId, to: NodeId, message: &DlmMessage) -> Result<(), LockError> {
        let payload = message.encode();
        // Counted first: a receiver may handle the message before this thread
        // runs again, and handled must never overtake sent.
        self.messages_sent.fetch_add(1, Ordering::AcqRel);
        let sent = if to == self.me {
            self.fabric.inbox(Channel::LOCKS).deliver(self.me, payload.to_vec())
        } else {
            self.fabric.send(to, Channel::LOCKS, &payload)
        };
        if sent.is_err() {
            self.messages_sent.fetch_sub(1, Ordering::AcqRel);
        }
        sent.map_err(|e| LockError::from_fabric(lock_id, to, e))
    }

    /// Makes sure the monitor holds a handle to `node`'s node region before
    /// this node starts to wait for it: the handle is then bound to the
    /// incarnation the message goes to (or an older one), so that
    /// incarnation's end shows as `PeerDead` on reads through it.
    fn watch(&self, node: NodeId) {
        if node == self.me || !self.config.recovery {
            return;
        }
        if lock(&self.watches).get(&node).is_some_and(|w| w.handle.is_some()) {
            return;
        }
        let handle = self.fabric.connect(node, &self.node_region_name).ok();
        let mut watches = lock(&self.watches);
        let watch = watches.entry(node).or_insert_with(|| Watch { handle: None, beat: None, since: Instant::now() });
        if watch.handle.is_none() {
            watch.handle = handle;
        }
    }

    /// Drops the handle to `node`'s node region: the next look connects to
    /// the incarnation running then.
    fn forget_watch(&self, node: NodeId) {
        if let Some(watch) = lock(&self.watches).get_mut(&node) {
            watch.handle = None;
        }
    }

    /// Reads `node`'s incarnation, heartbeat and lease words through the
    /// watch's handle. `Err(reason)` if the node is dead: its process ended,
    /// or the incarnation the handle is bound to did; `Ok(None)` if it
    /// could not be read (slow, stopped, no lock manager).
    fn read_node(&self, node: NodeId) -> Result<Option<[u64; 3]>, String> {
        if self.fabric.peer_state(node) == PeerState::Gone {
            // A handle bound to the ended process must not outlive it: read
            // through later, it would call the node's next incarnation dead.
            self.forget_watch(node);
            return Err("its process ended".into());
        }
        self.watch(node);
        let Some(handle) = lock(&self.watches).get(&node).and_then(|w| w.handle.clone()) else { return Ok(None) };
        let mut bytes = [0u8; 24];
        match handle.read(INCARNATION_OFFSET, &mut bytes) {
            Ok(()) => {
                let word = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
                Ok(Some([word(0), word(1), word(2)]))
            }
            Err(FabricError::PeerDead { reason, .. }) => {
                if let Some(watch) = lock(&self.watches).get_mut(&node) {
                    watch.handle = None;
                }
                Err(format!("the incarnation it talked to ended ({reason})"))
            }
            Err(_) => Ok(None),
        }
    }

    /// `Some(reason)` if `node` is lost: its process ended, the incarnation
    /// this node talked to ended, or (with leases) its heartbeat has not
    /// advanced for a lease. Never for a node that is merely slow within
    /// its lease, nor for this node.
    fn lost(&self, node: NodeId) -> Option<String> {
        if node == self.me {
            return None;
        }
        let words = match self.read_node(node) {
            Err(reason) => return Some(reason),
            Ok(words) => words,
        };
        // The node's own lease if it told us, else ours (every node shares
        // the configuration; a node we cannot read cannot renew either).
        let lease = match words.map(|w| w[2]) {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => self.config.lease,
        }?;
        let beat = words.map(|w| w[1]);
        let mut watches = lock(&self.watches);
        let watch = watches.entry(node).or_insert_with(|| Watch { handle: None, beat: None, since: Instant::now() });
        if beat.is_some() && beat != watch.beat {
            watch.beat = beat;
            watch.since = Instant::now();
            return None;
        }
        (watch.since.elapsed() >= lease).then(|| format!("no heartbeat for its lease of {} ms", lease.as_millis()))
    }

    /// The incarnation `node` runs now, if it can be read (a handle bound
    /// to an ended incarnation is dropped by the first read and a fresh one
    /// reads the next).
    fn running_incarnation(&self, node: NodeId) -> Option<u64> {
        let read = match self.read_node(node) {
            Err(_) => self.read_node(node),
            read => read,
        };
        match read {
            Ok(Some([incarnation, ..])) => Some(incarnation),
            _ => None,
        }
    }

    /// `Some(reason)` if the incarnation `epoch` of home `node` is over: its
    /// process ended, or another incarnation runs now. Not a lease: a home's
    /// table works while its process is stopped.
    fn home_lost(&self, node: NodeId, epoch: u64) -> Option<String> {
        if node == self.me {
            return (epoch != self.incarnation).then(|| "this node restarted".into());
        }
        // A failed read may be of a handle older than the lock's incarnation:
        // `read_node` dropped it, and a second read uses a fresh one.
        let read = match self.read_node(node) {
            Err(_) => self.read_node(node),
            read => read,
        };
        match read {
            Err(reason) => Some(reason),
            Ok(Some([incarnation, ..])) if incarnation != epoch => {
                Some(format!("it restarted (incarnation {incarnation:#x}, the lock was of {epoch:#x})"))
            }
            Ok(_) => None,
        }
    }

    /// The error for a wait that ran out: `PeerDead` if the node we wait
    /// for is lost, else `Timeout`.
    fn timeout_error(&self, lock_id: LockId, waited: Duration, blocked_on: Option<NodeId>) -> LockError {
        if let Some(node) = blocked_on {
            let dead = self.lost(node).or_else(|| match self.fabric.connect(node, &self.node_region_name) {
                Err(e @ FabricError::PeerDead { .. }) => Some(e.to_string()),
                _ => None,
            });
            if let Some(reason) = dead {
                return LockError::PeerDead { lock: lock_id, node, reason };
            }
        }
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        LockError::Timeout { lock: lock_id, waited_ms, blocked_on }
    }

    fn lease_mark(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.mark())
    }

    fn lapsed_since(&self, mark: u64) -> bool {
        self.lease.as_ref().is_some_and(|l| l.lapsed_since(mark))
    }

    /// Counts a handled message (and its failure).
    fn counted(&self, result: Result<(), LockError>) -> Result<(), LockError> {
        if let Err(e) = &result {
            self.message_errors.fetch_add(1, Ordering::Relaxed);
            if matches!(e, LockError::Protocol(_)) {
                self.violations.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.messages_handled.fetch_add(1, Ordering::Release);
        result
    }

    fn stats(&self) -> DlmStats {
        DlmStats {
            messages_handled: self.messages_handled.load(Ordering::Acquire),
            message_errors: self.message_errors.load(Ordering::Relaxed),
            violations: self.violations.load(Ordering::Relaxed),
            messages_sent: self.messages_sent.load(Ordering::Acquire),
            moves: self.moves.load(Ordering::Relaxed),
            peers_lost: self.peers_lost.load(Ordering::Relaxed),
        }
    }

    /// An index into this node's status entries for a new cell, while any are left.
    fn claim_entry(&self) -> Option<u64> {
        let index = self.next_entry.fetch_add(1, Ordering::Relaxed);
        (index < STATUS_ENTRIES).then_some(index)
    }
}

/// What the waiting caller of the current request is told.
enum Outcome {
    Granted(Option<u64>),
    WouldBlock,
    Broken,
    /// A recovery moved the lock past the request: make it again.
    Requeue,
    Failed(LockError),
}

struct CellState<M> {
    machine: M,
    /// Serial number of the current (or last) request.
    serial: u64,
    /// Mode of the current (or last) request.
    mode: LockMode,
    outcome: Option<Outcome>,
    /// The serial of the last request that a break revoked.
    broken: u64,
    /// Inputs driven so far: the monitor reads it to tell a request that
    /// waits from one that moves.
    progress: u64,
    /// The floor of the last move this node made.
    moved: Option<u64>,
    /// The status entry last written.
    shown: u64,
    /// An atomic reached the home since this was last cleared.
    touched: bool,
}

/// The monitor's bookkeeping for one cell.
#[derive(Default)]
struct Watching {
    /// `progress` at the last look, and since when it has not changed.
    progress: Option<(u64, Instant)>,
    /// Last time every node was checked for a request that waits for parties it cannot name.
    scanned: Option<Instant>,
    /// Last time a barrier's notice went out again.
    resent: Option<Instant>,
}

struct Cell<M> {
    id: LockId,
    slot: Slot,
    state: Mutex<CellState<M>>,
    changed: Condvar,
    /// Its home's incarnation ended: callers locate the lock afresh.
    retired: AtomicBool,
    /// This cell's entry in the node region, if it got one.
    entry: Option<u64>,
    watching: Mutex<Watching>,
}

/// The scheme-specific half of a lock manager; the algorithms for waiting,
/// timeouts and release checks are shared (`acquire_in`, `release_in`).
trait Engine: Send + Sync {
    type Machine: Send;
    fn core(&self) -> &Core;
    fn cells(&self) -> &Mutex<HashMap<LockId, Arc<Cell<Self::Machine>>>>;
    fn new_machine(&self) -> Self::Machine;
    fn idle(machine: &Self::Machine) -> bool;
    fn holding(machine: &Self::Machine) -> bool;
    fn blocked_on(&self, cell: &Cell<Self::Machine>, machine: &Self::Machine) -> Option<NodeId>;
    /// The state shown in the node region.
    fn shown(&self, cell: &Cell<Self::Machine>, st: &CellState<Self::Machine>) -> (ClientState, u16, Option<NodeId>);
    fn start(
        &self,
        cell: &Cell<Self::Machine>,
        st: &mut CellState<Self::Machine>,
        mode: LockMode,
        try_only: bool,
    ) -> Result<(), LockError>;
    fn abandon(&self, cell: &Cell<Self::Machine>, st: &mut CellState<Self::Machine>);
    fn release(&self, cell: &Cell<Self::Machine>, st: &mut CellState<Self::Machine>) -> Result<(), LockError>;
}

fn cell_of<E: Engine>(engine: &E, id: LockId) -> Result<Arc<Cell<E::Machine>>, LockError> {
    let cached = lock(engine.cells()).get(&id).cloned();
    if let Some(cell) = cached.as_ref().filter(|c| !c.retired.load(Ordering::Acquire)) {
        return Ok(cell.clone());
    }
    let slot = engine.core().locate(id, false)?;
    let mut cells = lock(engine.cells());
    if cells.get(&id).is_some_and(|c| c.retired.load(Ordering::Acquire)) {
        cells.remove(&id);
    }
    let cell = cells.entry(id).or_insert_with(|| {
        Arc::new(Cell {
            id,
            slot,
            state: Mutex::new(CellState {
                machine: engine.new_machine(),
                serial: 0,
                mode: LockMode::Exclusive,
                outcome: None,
                broken: 0,
                progress: 0,
                moved: None,
                shown: u64::MAX,
                touched: false,
            }),
            changed: Condvar::new(),
            retired: AtomicBool::new(false),
            entry: engine.core().claim_entry(),
            watching: Mutex::new(Watching::default()),
        })
    });
    Ok(cell.clone())
}

/// Takes a cell out of use after its home's incarnation ended: the next
/// acquire locates the lock afresh. It stays in the map until then, so the
/// release of a hold it revoked still says `Broken`.
fn retire<E: Engine>(engine: &E, cell: &Cell<E::Machine>) {
    cell.retired.store(true, Ordering::Release);
    engine.core().forget_home(cell.slot.home_node, &cell.slot.home);
}

/// Whether the home incarnation a hold was granted at still stands, asked
/// at the release of a hold that did not touch the home (a hand-over by
/// message, an SRSL release): one read of the lock's slot. A home that
/// restarted has created the lock again and may have granted it: a hold of
/// its old incarnation overlapped that, and its release must not say it
/// held. Its next incarnation exists only after the old table was revoked
/// (shm: the node id's reclaim; tcp: the incarnation every request
/// carries), so a read that succeeds proves no new incarnation granted
/// before it. `PeerDead` if the home's incarnation ended; any other
/// failure (a slow home) leaves the answer yes.
fn home_stands<E: Engine>(engine: &E, cell: &Cell<E::Machine>) -> Result<(), LockError> {
    match cell.slot.home.read_u64(cell.slot.base + crate::word::TAG_OFFSET) {
        Err(e @ FabricError::PeerDead { .. }) => {
            retire(engine, cell);
            Err(LockError::from_fabric(cell.id, cell.slot.home_node, e))
        }
        _ => Ok(()),
    }
}

/// Writes the cell's state to this node's status entry if it changed.
fn show<E: Engine>(engine: &E, cell: &Cell<E::Machine>, st: &mut CellState<E::Machine>) {
    let Some(index) = cell.entry else { return };
    let (state, generation, peer) = engine.shown(cell, st);
    let word = StatusEntry::state_word(state, generation, peer);
    if word == st.shown {
        return;
    }
    st.shown = word;
    let memory = engine.core().node_region.memory();
    // Advisory: a failed write (impossible for an in-bounds entry) only hides a state.
    let _ = write_entry(memory, index, cell.id, word, host_monotonic_ns(), st.serial);
}

fn wait_until<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>, deadline: Instant) -> MutexGuard<'a, T> {
    let left = deadline.saturating_duration_since(Instant::now());
    match cv.wait_timeout(guard, left) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

/// What one attempt at a request came to.
enum Attempt {
    Granted(Grant),
    /// A recovery moved the lock past the request, or this node lapsed
    /// while it waited: make it again.
    Again,
}

fn acquire_in<E: Engine>(engine: &E, id: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
    let started = Instant::now();
    let (try_only, budget) = match wait {
        Wait::Try => (true, engine.core().config.try_reply_timeout),
        Wait::Timeout(budget) => (false, budget),
    };
    let deadline = started.checked_add(budget).unwrap_or_else(|| started + Duration::from_secs(86_400 * 365));
    loop {
        match attempt(engine, id, mode, try_only, started, deadline)? {
            Attempt::Granted(grant) => return Ok(grant),
            Attempt::Again if try_only => return Err(LockError::WouldBlock { lock: id }),
            Attempt::Again if Instant::now() >= deadline => {
                return Err(engine.core().timeout_error(id, started.elapsed(), None));
            }
            Attempt::Again => {}
        }
    }
}

fn attempt<E: Engine>(
    engine: &E,
    id: LockId,
    mode: LockMode,
    try_only: bool,
    started: Instant,
    deadline: Instant,
) -> Result<Attempt, LockError> {
    let cell = cell_of(engine, id)?;
    let lapses = engine.core().lease_mark();
    let mut st = lock(&cell.state);
    // One queue entry per node: wait for our previous request to finish.
    while !E::idle(&st.machine) {
        if try_only {
            return Err(LockError::WouldBlock { lock: id });
        }
        if Instant::now() >= deadline {
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Err(LockError::Timeout { lock: id, waited_ms, blocked_on: Some(engine.core().me) });
        }
        st = wait_until(&cell.changed, st, deadline);
    }
    if cell.retired.load(Ordering::Acquire) {
        return Ok(Attempt::Again);
    }
    st.serial += 1;
    st.outcome = None;
    st.mode = mode;
    let serial = st.serial;
    if let Err(e) = engine.start(&cell, &mut st, mode, try_only) {
        if !E::idle(&st.machine) {
            engine.abandon(&cell, &mut st);
        }
        return Err(e);
    }
    loop {
        if let Some(outcome) = st.outcome.take() {
            return match outcome {
                Outcome::Granted(token) => {
                    if engine.core().lapsed_since(lapses) {
                        // This node was stopped for most of a lease while it
                        // waited: a recovery may have gone past the request.
                        // Give the grant back and ask again.
                        if let Err(e) = engine.release(&cell, &mut st) {
                            tracing::debug!(lock = %id, error = %e, "giving back a grant across a lapse");
                        }
                        return Ok(Attempt::Again);
                    }
                    Ok(Attempt::Granted(Grant { lock: id, mode, token, serial, lapses }))
                }
                Outcome::WouldBlock => Err(LockError::WouldBlock { lock: id }),
                Outcome::Broken => Err(LockError::Broken { lock: id }),
                Outcome::Requeue => Ok(Attempt::Again),
                Outcome::Failed(e) => Err(e),
            };
        }
        if Instant::now() >= deadline {
            let blocked_on = engine.blocked_on(&cell, &st.machine);
            engine.abandon(&cell, &mut st);
            drop(st);
            return Err(engine.core().timeout_error(id, started.elapsed(), blocked_on));
        }
        st = wait_until(&cell.changed, st, deadline);
    }
}

fn release_in<E: Engine>(engine: &E, grant: &Grant) -> Result<(), LockError> {
    let not_held = LockError::NotHeld { lock: grant.lock };
    let cell = lock(engine.cells()).get(&grant.lock).cloned().ok_or(not_held.clone())?;
    let mut st = lock(&cell.state);
    if st.serial != grant.serial || !E::holding(&st.machine) {
        return Err(if st.broken == grant.serial { LockError::Broken { lock: grant.lock } } else { not_held });
    }
    engine.release(&cell, &mut st)?;
    drop(st);
    if engine.core().lapsed_since(grant.lapses) {
        // Stopped for most of a lease during the hold: others may have
        // judged the lease expired and moved on. Fencing rejects what this
        // holder wrote after that.
        return Err(LockError::Broken { lock: grant.lock });
    }
    Ok(())
}

// ---------------------------------------------------------------- N-CoShED / DQNL

/// N-CoShED and DQNL: the distributed queue of [`crate::proto`].
struct QueueScheme {
    core: Core,
    kind: QueueKind,
    cells: Mutex<HashMap<LockId, Arc<Cell<LockClient>>>>,
}

impl QueueScheme {
    /// Feeds `input` and carries out every action, atomics first-hand.
    /// Failed sends are not errors of the request: the monitor notices a
    /// dead receiver, and a slow one gets the message later.
    fn drive(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>, input: Input) -> Result<(), LockError> {
        let result = self.drive_inner(cell, st, input);
        st.progress = st.progress.wrapping_add(1);
        show(self, cell, st);
        cell.changed.notify_all();
        result
    }

    fn drive_inner(
        &self,
        cell: &Cell<LockClient>,
        st: &mut CellState<LockClient>,
        input: Input,
    ) -> Result<(), LockError> {
        let mut next = Some(input);
        while let Some(input) = next.take() {
            let mut actions = Vec::new();
            if let Err(violation) = st.machine.handle(input, &mut actions) {
                return Err(LockError::Protocol(violation.to_string()));
            }
            for action in actions {
                match action {
                    Action::Atomic(ops) => match cell.slot.home.execute(cell.slot.base, &ops) {
                        Ok(results) => {
                            st.touched = true;
                            next = Some(Input::AtomicDone { results, len: ops.len() });
                        }
                        Err(e) => {
                            // We cannot know whether the atomic applied: forget
                            // the request. Whoever queued behind it is told
                            // `Nack` and recovers the lock.
                            let dead_home = matches!(e, FabricError::PeerDead { .. });
                            let error = LockError::from_fabric(cell.id, cell.slot.home_node, e);
                            st.machine.reset();
                            st.outcome = Some(Outcome::Failed(error.clone()));
                            if dead_home {
                                retire(self, cell);
                            }
                            return Err(error);
                        }
                    },
                    Action::Send { to, generation, msg } => {
                        self.send_proto(cell.id, cell.slot.epoch, to, generation, msg)
                    }
                    Action::Granted { token, abandoned, .. } => {
                        if !abandoned {
                            st.outcome = Some(Outcome::Granted(token));
                        }
                    }
                    Action::WouldBlock => st.outcome = Some(Outcome::WouldBlock),
                    Action::Aborted(AbortReason::Revoked { .. }) => {
                        st.broken = st.serial;
                        st.outcome = Some(Outcome::Broken);
                    }
                    Action::Aborted(AbortReason::Recovered { .. }) => st.outcome = Some(Outcome::Requeue),
                    Action::Moved { generation, floor, revoke } => {
                        self.core.moves.fetch_add(1, Ordering::Relaxed);
                        st.moved = Some(floor);
                        tracing::warn!(
                            node = %self.core.me, lock = %cell.id, generation, floor, revoke,
                            "lock moved to a new generation"
                        );
                    }
                    Action::Idle => {}
                }
            }
        }
        Ok(())
    }

    fn send_proto(&self, lock_id: LockId, epoch: u64, to: NodeId, generation: u16, msg: ProtoMsg) {
        self.core.watch(to);
        let message = DlmMessage::Proto { lock: lock_id, epoch, generation, msg };
        if let Err(e) = self.core.send(lock_id, to, &message) {
            tracing::info!(node = %self.core.me, %to, ?msg, error = %e, "lock message not delivered");
        }
    }

    fn on_input(&self, lock_id: LockId, from: NodeId, epoch: u64, input: Input) -> Result<(), LockError> {
        let cell = lock(&self.cells).get(&lock_id).cloned().filter(|cell| cell.slot.epoch == epoch);
        let Some(cell) = cell else {
            // A lock this node never used (or not in this incarnation of its
            // home): it holds nothing of it, so it acknowledges a recovery,
            // and a sender that expects a request here learns there is none.
            if let Input::Message { generation, msg, .. } = input {
                match msg {
                    ProtoMsg::Notice { revoke: false } => {
                        self.send_proto(lock_id, epoch, from, generation, ProtoMsg::Ack)
                    }
                    ProtoMsg::Notice { revoke: true } | ProtoMsg::Ack | ProtoMsg::Nack => {}
                    _ => self.send_proto(lock_id, epoch, from, generation, ProtoMsg::Nack),
                }
            }
            return Ok(());
        };
        let mut st = lock(&cell.state);
        self.drive(&cell, &mut st, input)
    }

    /// One monitor look at one cell.
    fn watch_cell(&self, cell: &Arc<Cell<LockClient>>) {
        let (waits, barrier, progress) = {
            let st = lock(&cell.state);
            (st.machine.waits(), st.machine.barrier().map(|(g, p)| (g, p.to_vec())), st.progress)
        };
        let now = Instant::now();
        let mut watching = lock(&cell.watching);
        if waits.nodes.is_empty() && !waits.unknown {
            *watching = Watching::default();
            return;
        }
        let stuck_since = match watching.progress {
            Some((seen, since)) if seen == progress => since,
            _ => {
                // It moved since the last look: not stuck (yet).
                watching.progress = Some((progress, now));
                return;
            }
        };
        let mut lost = Vec::new();
        // The home's process, not its lease: one-sided operations need no
        // thread of the home's, so a stopped home still serves N-CoShED.
        if let Some(reason) = self.core.home_lost(cell.slot.home_node, cell.slot.epoch) {
            drop(watching);
            let mut st = lock(&cell.state);
            if st.progress == progress && !st.machine.is_idle() {
                tracing::warn!(node = %self.core.me, lock = %cell.id, home = %cell.slot.home_node, %reason, "the lock's home is lost");
                st.machine.reset();
                let error = LockError::PeerDead { lock: cell.id, node: cell.slot.home_node, reason };
                st.outcome = Some(Outcome::Failed(error));
                st.progress = st.progress.wrapping_add(1);
                show(self, cell, &mut st);
                cell.changed.notify_all();
                drop(st);
                retire(self, cell);
            }
            return;
        }
        for &node in &waits.nodes {
            if let Some(reason) = self.core.lost(node) {
                tracing::info!(node = %self.core.me, lock = %cell.id, lost = %node, %reason, "a node the lock waits for is lost");
                lost.push(node);
            }
        }
        let suspect = self.core.config.suspect_after;
        if waits.unknown
            && now.duration_since(stuck_since) >= suspect
            && watching.scanned.is_none_or(|at| now.duration_since(at) >= suspect)
        {
            watching.scanned = Some(now);
            for &node in self.core.nodes.iter() {
                if let Some(reason) = self.core.lost(node) {
                    tracing::info!(node = %self.core.me, lock = %cell.id, lost = %node, %reason, "a lost node may be what the lock waits for");
                    lost.push(node);
                    break;
                }
            }
        }
        let resend = barrier.filter(|_| watching.resent.is_none_or(|at| now.duration_since(at) >= NOTICE_RESEND));
        if resend.is_some() {
            watching.resent = Some(now);
        }
        drop(watching);
        if let Some((generation, pending)) = resend {
            for to in pending.into_iter().filter(|n| !lost.contains(n)) {
                self.send_proto(cell.id, cell.slot.epoch, to, generation, ProtoMsg::Notice { revoke: false });
            }
        }
        if lost.is_empty() {
            return;
        }
        let mut st = lock(&cell.state);
        for &node in &lost {
            self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.drive(cell, &mut st, Input::PeerLost { node }) {
                tracing::warn!(node = %self.core.me, lock = %cell.id, error = %e, "recovery step failed");
            }
        }
        // A move just made (its atomics run inside `drive`) waits for every
        // node's acknowledgement, the lost ones' included: they are still
        // lost, so tell the barrier now rather than a look or two later.
        // Looked at again first: a loss seen through a handle of an older
        // incarnation than the one that runs now is not confirmed (the
        // failed read dropped that handle, this one reads the live node), and
        // the barrier must wait for a live node.
        let pending_lost: Vec<NodeId> = st
            .machine
            .barrier()
            .map(|(_, pending)| pending.iter().copied().filter(|n| lost.contains(n)).collect())
            .unwrap_or_default();
        let pending_lost: Vec<NodeId> = pending_lost.into_iter().filter(|&n| self.core.lost(n).is_some()).collect();
        for node in pending_lost {
            if let Err(e) = self.drive(cell, &mut st, Input::PeerLost { node }) {
                tracing::warn!(node = %self.core.me, lock = %cell.id, error = %e, "recovery step failed");
            }
        }
    }
}

impl Engine for QueueScheme {
    type Machine = LockClient;

    fn core(&self) -> &Core {
        &self.core
    }

    fn cells(&self) -> &Mutex<HashMap<LockId, Arc<Cell<LockClient>>>> {
        &self.cells
    }

    fn new_machine(&self) -> LockClient {
        LockClient::new(self.core.me, self.kind, self.core.nodes.clone())
    }

    fn idle(machine: &LockClient) -> bool {
        machine.is_idle()
    }

    fn holding(machine: &LockClient) -> bool {
        machine.is_holding()
    }

    fn blocked_on(&self, cell: &Cell<LockClient>, machine: &LockClient) -> Option<NodeId> {
        match machine.blocked_on() {
            BlockedOn::Node(node) => Some(node),
            BlockedOn::SharedHolders => None,
            BlockedOn::Nothing => Some(cell.slot.home_node),
        }
    }

    fn shown(&self, _cell: &Cell<LockClient>, st: &CellState<LockClient>) -> (ClientState, u16, Option<NodeId>) {
        st.machine.state()
    }

    fn start(
        &self,
        cell: &Cell<LockClient>,
        st: &mut CellState<LockClient>,
        mode: LockMode,
        try_only: bool,
    ) -> Result<(), LockError> {
        self.drive(cell, st, Input::Acquire { mode, try_only, fencing: true })
    }

    fn abandon(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>) {
        // Abandon produces no actions; an error here is impossible.
        let _ = self.drive(cell, st, Input::Abandon);
    }

    fn release(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>) -> Result<(), LockError> {
        st.touched = false;
        self.drive(cell, st, Input::Release)?;
        // The release itself may be what discovers a revoking break (its
        // atomic sees a newer generation).
        if st.broken == st.serial {
            return Err(LockError::Broken { lock: cell.id });
        }
        if !st.touched {
            // Passed on by messages alone: make sure the home the hold was
            // granted at still stands (see `home_stands`).
            home_stands(self, cell)?;
        }
        Ok(())
    }
}

impl LockScheme for QueueScheme {
    fn scheme(&self) -> Scheme {
        match self.kind {
            QueueKind::CoShed => Scheme::CoShed,
            QueueKind::Dqnl => Scheme::Dqnl,
        }
    }

    fn node(&self) -> NodeId {
        self.core.me
    }

    fn create_lock(&self, lock_id: LockId) -> Result<(), LockError> {
        self.core.locate(lock_id, true).map(|_| ())
    }

    fn acquire(&self, lock_id: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
        acquire_in(self, lock_id, mode, wait)
    }

    fn release(&self, grant: &Grant) -> Result<(), LockError> {
        release_in(self, grant)
    }

    /// Moves the lock to a new generation from this node, revoking every
    /// hold and request of older ones (this node's own included), then
    /// waits (bounded) until this node has passed the new generation on.
    fn break_lock(&self, lock_id: LockId) -> Result<u64, LockError> {
        let cell = cell_of(self, lock_id)?;
        let mut st = lock(&cell.state);
        st.moved = None;
        self.drive(&cell, &mut st, Input::Break)?;
        let floor = st.moved.ok_or_else(|| {
            LockError::Protocol(format!("{lock_id}: a concurrent recovery overtook the break; break it again"))
        })?;
        let settle = Instant::now() + BREAK_SETTLE;
        while !st.machine.is_idle() && Instant::now() < settle {
            st = wait_until(&cell.changed, st, settle);
        }
        Ok(floor)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let result = match DlmMessage::decode(payload).map_err(|e| LockError::Protocol(e.to_string())) {
            Ok(DlmMessage::Proto { lock, epoch, generation, msg }) => {
                self.on_input(lock, from, epoch, Input::Message { from, generation, msg })
            }
            Ok(DlmMessage::Srsl { lock, .. }) => {
                Err(LockError::Protocol(format!("{lock}: SRSL message from {from} to a {} node", self.scheme().name())))
            }
            Err(e) => Err(e),
        };
        self.core.counted(result)
    }

    fn stats(&self) -> DlmStats {
        self.core.stats()
    }

    fn tick(&self) {
        let cells: Vec<_> = lock(&self.cells).values().cloned().collect();
        for cell in cells {
            self.watch_cell(&cell);
        }
    }

    fn waits(&self, lock_id: LockId) -> Option<crate::proto::Waits> {
        let cell = lock(&self.cells).get(&lock_id).cloned()?;
        let waits = lock(&cell.state).machine.waits();
        Some(waits)
    }

    fn debug_state(&self, lock_id: LockId) -> String {
        let Some(cell) = lock(&self.cells).get(&lock_id).cloned() else {
            return format!("{}: {lock_id} never used", self.core.me);
        };
        let st = lock(&cell.state);
        let read = |offset: u64| cell.slot.home.read_u64(cell.slot.base + offset);
        let words = match (read(crate::word::LOCK_OFFSET), read(crate::word::DRAIN_OFFSET), read(FENCE_OFFSET)) {
            (Ok(word), Ok(drain), Ok(fence)) => format!(
                "{:?} {:?} {:?}",
                crate::word::LockWord::decode(word),
                crate::word::DrainWord::decode(drain),
                crate::word::FenceWord::decode(fence)
            ),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => format!("home words unreadable: {e}"),
        };
        format!("{}: serial {} {:?}; {words}", self.core.me, st.serial, st.machine)
    }
}

// ---------------------------------------------------------------- SRSL

/// SRSL: the home's receive thread serves every request.
struct SrslScheme {
    core: Core,
    cells: Mutex<HashMap<LockId, Arc<Cell<SrslClient>>>>,
    /// Server side (at homes): each lock's queue and its slot in our table.
    served: Mutex<HashMap<LockId, (SrslQueue, u64)>>,
}

impl SrslScheme {
    fn drive(
        &self,
        cell: &Cell<SrslClient>,
        st: &mut CellState<SrslClient>,
        actions: Vec<ClientAction>,
    ) -> Result<(), LockError> {
        let mut first_error = None;
        for action in actions {
            match action {
                ClientAction::Send(msg) => {
                    let message = DlmMessage::Srsl { lock: cell.id, epoch: cell.slot.epoch, msg };
                    if let Err(e) = self.core.send(cell.id, cell.slot.home_node, &message) {
                        first_error.get_or_insert(e);
                    }
                }
                ClientAction::Granted { token, abandoned, .. } => {
                    if !abandoned {
                        st.outcome = Some(Outcome::Granted(token));
                    }
                }
                ClientAction::WouldBlock => st.outcome = Some(Outcome::WouldBlock),
                ClientAction::Aborted => {
                    st.broken = st.serial;
                    st.outcome = Some(Outcome::Broken);
                }
                ClientAction::Idle => {}
            }
        }
        st.progress = st.progress.wrapping_add(1);
        show(self, cell, st);
        cell.changed.notify_all();
        first_error.map_or(Ok(()), Err)
    }

    fn protocol(violation: crate::proto::ProtocolViolation) -> LockError {
        LockError::Protocol(violation.to_string())
    }

    /// Server side: runs `op` on the lock's queue and sends what it decides.
    fn serve(
        &self,
        lock_id: LockId,
        op: impl FnOnce(&mut SrslQueue, &mut Vec<ServerAction>) -> Result<(), crate::proto::ProtocolViolation>,
    ) -> Result<(), LockError> {
        let table = self.core.table.as_ref().ok_or_else(|| {
            LockError::Protocol(format!("{lock_id}: SRSL request to {}, which serves no locks", self.core.me))
        })?;
        let mut served = lock(&self.served);
        let (queue, base) = match served.entry(lock_id) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let base = HomeMemory::Local(table.clone())
                    .lookup(lock_id)
                    .map_err(|e| LockError::Fabric { lock: lock_id, source: e })?
                    .ok_or(LockError::UnknownLock { lock: lock_id, home: self.core.me })?;
                entry.insert((SrslQueue::default(), base))
            }
        };
        let mut actions = Vec::new();
        op(queue, &mut actions).map_err(Self::protocol)?;
        let mut first_error = None;
        for action in actions {
            let (to, msg) = match action {
                ServerAction::Grant { to, mode } => {
                    let token = if mode == LockMode::Exclusive {
                        let fence = table.memory().fetch_add(*base + FENCE_OFFSET, FENCE_UNIT);
                        crate::word::fencing_token(fence.map_err(|e| LockError::Fabric { lock: lock_id, source: e })?)
                    } else {
                        0
                    };
                    (to, SrslMsg::Grant { mode, token })
                }
                ServerAction::Refuse { to } => (to, SrslMsg::WouldBlock),
                ServerAction::Broken { to, held } => (to, SrslMsg::Broken { held }),
            };
            let message = DlmMessage::Srsl { lock: lock_id, epoch: self.core.incarnation, msg };
            if let Err(e) = self.core.send(lock_id, to, &message) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Server side of the monitor: takes lost holders out of locks that
    /// have waiters (a lost holder of a lock nobody waits for harms nobody
    /// yet; a lost waiter harms nobody until it is granted, and then it is
    /// a holder).
    fn watch_served(&self) {
        let blocked: Vec<(LockId, Vec<NodeId>)> = lock(&self.served)
            .iter()
            .filter(|(_, (queue, _))| queue.has_waiters())
            .map(|(lock_id, (queue, _))| (*lock_id, queue.holders()))
            .collect();
        for (lock_id, holders) in blocked {
            for holder in holders {
                // Died and started again under the same id before anybody
                // judged it dead: the hold is its old incarnation's.
                let recorded = lock(&self.served).get(&lock_id).and_then(|(queue, _)| queue.incarnation_of(holder));
                if let (Some(recorded), Some(running)) = (recorded, self.core.running_incarnation(holder)) {
                    if running != recorded {
                        tracing::warn!(node = %self.core.me, lock = %lock_id, restarted = %holder, "SRSL: a holder restarted");
                        self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
                        let served = self.serve(lock_id, |queue, out| {
                            queue.incarnation(holder, running, out);
                            Ok(())
                        });
                        if let Err(e) = served {
                            tracing::debug!(lock = %lock_id, error = %e, "SRSL: recovery messages");
                        }
                        continue;
                    }
                }
                let Some(reason) = self.core.lost(holder) else { continue };
                tracing::warn!(node = %self.core.me, lock = %lock_id, lost = %holder, %reason, "SRSL: a holder is lost");
                self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
                let served = self.serve(lock_id, |queue, out| {
                    queue.peer_lost(holder, out);
                    Ok(())
                });
                if let Err(e) = served {
                    // The lost holder is told too; that send fails.
                    tracing::debug!(lock = %lock_id, error = %e, "SRSL: recovery messages");
                }
            }
        }
    }

    /// Client side of the monitor: a request that waits for a server whose
    /// process ended (or whose lease expired) fails at once; a hold at a
    /// server whose incarnation ended is revoked (its release says
    /// `Broken`), since the server's next incarnation knows nothing of it.
    fn watch_cell(&self, cell: &Arc<Cell<SrslClient>>) {
        let (waiting, holding, progress) = {
            let st = lock(&cell.state);
            (!st.machine.is_idle() && !st.machine.is_holding(), st.machine.is_holding(), st.progress)
        };
        let home = cell.slot.home_node;
        if holding {
            let Some(reason) = self.core.home_lost(home, cell.slot.epoch) else { return };
            let mut st = lock(&cell.state);
            if st.progress == progress && st.machine.is_holding() {
                tracing::warn!(node = %self.core.me, lock = %cell.id, %home, %reason, "SRSL: a hold's server is lost");
                st.machine = SrslClient::new(self.core.me, self.core.incarnation);
                st.broken = st.serial;
                st.progress = st.progress.wrapping_add(1);
                show(self, cell, &mut st);
                cell.changed.notify_all();
                drop(st);
                retire(self, cell);
            }
            return;
        }
        let mut watching = lock(&cell.watching);
        if !waiting {
            *watching = Watching::default();
            return;
        }
        if watching.progress.is_none_or(|(seen, _)| seen != progress) {
            watching.progress = Some((progress, Instant::now()));
            return;
        }
        drop(watching);
        // The server's thread serves every request: a stopped server is as
        // good as dead once its lease runs out.
        let Some(reason) = self.core.home_lost(home, cell.slot.epoch).or_else(|| self.core.lost(home)) else {
            return;
        };
        let mut st = lock(&cell.state);
        if st.progress == progress && !st.machine.is_idle() && !st.machine.is_holding() {
            tracing::warn!(node = %self.core.me, lock = %cell.id, %home, %reason, "SRSL: the server is lost");
            st.machine = SrslClient::new(self.core.me, self.core.incarnation);
            st.outcome = Some(Outcome::Failed(LockError::PeerDead { lock: cell.id, node: home, reason }));
            st.progress = st.progress.wrapping_add(1);
            show(self, cell, &mut st);
            cell.changed.notify_all();
            drop(st);
            retire(self, cell);
        }
    }
}

impl Engine for SrslScheme {
    type Machine = SrslClient;

    fn core(&self) -> &Core {
        &self.core
    }

    fn cells(&self) -> &Mutex<HashMap<LockId, Arc<Cell<SrslClient>>>> {
        &self.cells
    }

    fn new_machine(&self) -> SrslClient {
        SrslClient::new(self.core.me, self.core.incarnation)
    }

    fn idle(machine: &SrslClient) -> bool {
        machine.is_idle()
    }

    fn holding(machine: &SrslClient) -> bool {
        machine.is_holding()
    }

    fn blocked_on(&self, cell: &Cell<SrslClient>, _machine: &SrslClient) -> Option<NodeId> {
        Some(cell.slot.home_node)
    }

    fn shown(&self, cell: &Cell<SrslClient>, st: &CellState<SrslClient>) -> (ClientState, u16, Option<NodeId>) {
        if st.machine.is_idle() {
            (ClientState::Idle, 0, None)
        } else if st.machine.is_holding() {
            (ClientState::Holding { mode: st.mode }, 0, None)
        } else {
            (ClientState::Waiting { mode: st.mode }, 0, Some(cell.slot.home_node))
        }
    }

    fn start(
        &self,
        cell: &Cell<SrslClient>,
        st: &mut CellState<SrslClient>,
        mode: LockMode,
        try_only: bool,
    ) -> Result<(), LockError> {
        let mut actions = Vec::new();
        st.machine.acquire(mode, try_only, &mut actions).map_err(Self::protocol)?;
        let sent = self.drive(cell, st, actions);
        if sent.is_err() {
            // The request never reached the server: nothing is queued.
            st.machine = SrslClient::new(self.core.me, self.core.incarnation);
        }
        sent
    }

    fn abandon(&self, _cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) {
        st.machine.abandon();
    }

    fn release(&self, cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) -> Result<(), LockError> {
        let mut actions = Vec::new();
        st.machine.release(&mut actions).map_err(Self::protocol)?;
        self.drive(cell, st, actions)?;
        home_stands(self, cell)
    }
}

impl LockScheme for SrslScheme {
    fn scheme(&self) -> Scheme {
        Scheme::Srsl
    }

    fn node(&self) -> NodeId {
        self.core.me
    }

    fn create_lock(&self, lock_id: LockId) -> Result<(), LockError> {
        self.core.locate(lock_id, true).map(|_| ())
    }

    fn acquire(&self, lock_id: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
        acquire_in(self, lock_id, mode, wait)
    }

    fn release(&self, grant: &Grant) -> Result<(), LockError> {
        release_in(self, grant)
    }

    fn break_lock(&self, lock_id: LockId) -> Result<u64, LockError> {
        let slot = self.core.locate(lock_id, false)?;
        let floor = crate::word::fencing_token(
            slot.home
                .fetch_add(slot.base + FENCE_OFFSET, FENCE_UNIT)
                .map_err(|e| LockError::from_fabric(lock_id, slot.home_node, e))?,
        );
        tracing::warn!(lock = %lock_id, floor, "lock broken");
        self.core.moves.fetch_add(1, Ordering::Relaxed);
        let message = DlmMessage::Srsl { lock: lock_id, epoch: slot.epoch, msg: SrslMsg::Break };
        self.core.send(lock_id, slot.home_node, &message)?;
        Ok(floor)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let result = self.handle_srsl(from, payload);
        self.core.counted(result)
    }

    fn stats(&self) -> DlmStats {
        self.core.stats()
    }

    fn tick(&self) {
        if self.core.table.is_some() {
            self.watch_served();
        }
        let cells: Vec<_> = lock(&self.cells).values().cloned().collect();
        for cell in cells {
            self.watch_cell(&cell);
        }
    }
}

impl SrslScheme {
    fn handle_srsl(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let (lock_id, epoch, msg) = match DlmMessage::decode(payload).map_err(|e| LockError::Protocol(e.to_string()))? {
            DlmMessage::Srsl { lock, epoch, msg } => (lock, epoch, msg),
            other => return Err(LockError::Protocol(format!("{other:?} from {from} to an SRSL node"))),
        };
        let to_server = matches!(msg, SrslMsg::Acquire { .. } | SrslMsg::Release | SrslMsg::Break);
        if to_server && epoch != self.core.incarnation {
            // For an earlier incarnation of this server: nothing of it is left here.
            tracing::debug!(lock = %lock_id, %from, ?msg, "SRSL: a message for an earlier incarnation of this server");
            return Ok(());
        }
        match msg {
            SrslMsg::Acquire { mode, try_only, incarnation } => {
                // The requester's incarnation runs now; a handle to an older
                // one would later make the monitor revoke this live hold.
                self.core.forget_watch(from);
                self.serve(lock_id, |q, out| {
                    // What an earlier incarnation of it left here goes first.
                    q.incarnation(from, incarnation, out);
                    q.acquire(from, mode, try_only, out)
                })
            }
            SrslMsg::Release => self.serve(lock_id, |q, out| q.release(from, out)),
            SrslMsg::Break => self.serve(lock_id, |q, out| {
                q.break_all(out);
                Ok(())
            }),
            SrslMsg::Grant { .. } | SrslMsg::WouldBlock | SrslMsg::Broken { .. } => {
                let cell = lock(&self.cells).get(&lock_id).cloned().ok_or_else(|| {
                    LockError::Protocol(format!("{lock_id}: {msg:?} for a lock this node never used"))
                })?;
                if cell.slot.epoch != epoch {
                    // From another incarnation of the server than this cell's.
                    return Ok(());
                }
                let mut st = lock(&cell.state);
                let mut actions = Vec::new();
                st.machine.message(msg, &mut actions).map_err(Self::protocol)?;
                self.drive(&cell, &mut st, actions)
            }
        }
    }
}

// ---------------------------------------------------------------- manager and guards

/// A node's lock manager: one scheme, plus the threads that read the
/// fabric's [`Channel::LOCKS`] inbox (unless configured off), watch for
/// lost nodes (with recovery) and keep this node's lease (with leases).
pub struct LockManager {
    scheme: Arc<dyn LockScheme>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LockManager {
    /// Starts the lock manager of `fabric`'s node: registers its lock table
    /// (at lock servers) and its node region, and starts its threads.
    pub fn start(fabric: Arc<dyn Fabric>, config: DlmConfig) -> Result<Self, LockError> {
        let own_inbox = config.own_inbox;
        let scheme_kind = config.scheme;
        let recovery = config.recovery;
        let probe = config.probe_interval;
        let core = Core::new(fabric.clone(), config)?;
        let me = core.me;
        let lease = core.lease.clone();
        let node_region = core.node_region.clone();
        let scheme: Arc<dyn LockScheme> = match scheme_kind {
            Scheme::CoShed => {
                Arc::new(QueueScheme { core, kind: QueueKind::CoShed, cells: Mutex::new(HashMap::new()) })
            }
            Scheme::Dqnl => Arc::new(QueueScheme { core, kind: QueueKind::Dqnl, cells: Mutex::new(HashMap::new()) }),
            Scheme::Srsl => {
                Arc::new(SrslScheme { core, cells: Mutex::new(HashMap::new()), served: Mutex::new(HashMap::new()) })
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut manager = Self { scheme, stop: stop.clone(), threads: Vec::new() };
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| LockError::Config(format!("cannot start a lock manager thread: {e}")))
        };
        if own_inbox {
            let (weak, stop) = (Arc::downgrade(&manager.scheme), stop.clone());
            manager
                .threads
                .push(spawn(format!("dlm-recv-{}", me.0), Box::new(move || receive_loop(fabric, weak, stop)))?);
        }
        if let Some(lease) = lease {
            let stop = stop.clone();
            let run = move || heartbeat_loop(&lease, &node_region, &stop);
            manager.threads.push(spawn(format!("dlm-beat-{}", me.0), Box::new(run))?);
        }
        if recovery {
            let (weak, stop) = (Arc::downgrade(&manager.scheme), stop.clone());
            let run = move || monitor_loop(weak, &stop, probe);
            manager.threads.push(spawn(format!("dlm-watch-{}", me.0), Box::new(run))?);
        }
        Ok(manager)
    }

    /// The scheme behind this manager (for code that is generic over schemes).
    pub fn scheme(&self) -> &Arc<dyn LockScheme> {
        &self.scheme
    }

    pub fn node(&self) -> NodeId {
        self.scheme.node()
    }

    /// Creates `lock` at its home; idempotent. Locks must exist before use.
    pub fn create_lock(&self, lock: LockId) -> Result<(), LockError> {
        self.scheme.create_lock(lock)
    }

    pub fn acquire_shared(&self, lock: LockId, timeout: Duration) -> Result<SharedGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Shared, Wait::Timeout(timeout))?;
        Ok(SharedGuard(GuardInner::new(&self.scheme, grant)))
    }

    pub fn acquire_exclusive(&self, lock: LockId, timeout: Duration) -> Result<ExclusiveGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Exclusive, Wait::Timeout(timeout))?;
        ExclusiveGuard::new(&self.scheme, grant)
    }

    /// Shared if available now, else [`LockError::WouldBlock`] (nothing enqueued).
    pub fn try_acquire_shared(&self, lock: LockId) -> Result<SharedGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Shared, Wait::Try)?;
        Ok(SharedGuard(GuardInner::new(&self.scheme, grant)))
    }

    /// Exclusive if available now, else [`LockError::WouldBlock`] (nothing enqueued).
    pub fn try_acquire_exclusive(&self, lock: LockId) -> Result<ExclusiveGuard, LockError> {
        let grant = self.scheme.acquire(lock, LockMode::Exclusive, Wait::Try)?;
        ExclusiveGuard::new(&self.scheme, grant)
    }

    /// See [`LockScheme::break_lock`].
    pub fn break_lock(&self, lock: LockId) -> Result<u64, LockError> {
        self.scheme.break_lock(lock)
    }

    /// Handles one lock-manager message (a payload of [`Channel::LOCKS`]),
    /// for a caller that reads that channel itself ([`DlmConfig::without_receiver`]).
    pub fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        self.scheme.handle_message(from, payload)
    }

    pub fn stats(&self) -> DlmStats {
        self.scheme.stats()
    }

    /// See [`LockScheme::debug_state`].
    pub fn debug_state(&self, lock: LockId) -> String {
        self.scheme.debug_state(lock)
    }

    /// See [`LockScheme::waits`].
    pub fn waits(&self, lock: LockId) -> Option<crate::proto::Waits> {
        self.scheme.waits(lock)
    }
}

impl Drop for LockManager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn receive_loop(fabric: Arc<dyn Fabric>, scheme: Weak<dyn LockScheme>, stop: Arc<AtomicBool>) {
    let poll = Duration::from_millis(RECEIVE_POLL_MS);
    while !stop.load(Ordering::Acquire) {
        match fabric.inbox(Channel::LOCKS).recv_timeout(poll) {
            Ok(message) => {
                let Some(scheme) = scheme.upgrade() else { return };
                if let Err(e) = scheme.handle_message(message.from, &message.payload) {
                    tracing::warn!(node = %scheme.node(), from = %message.from, error = %e, "lock message failed");
                }
            }
            Err(FabricError::RecvTimeout { .. }) => {}
            Err(e) => {
                tracing::info!(error = %e, "lock manager inbox (channel LOCKS) closed");
                return;
            }
        }
    }
}

/// Sleeps `total`, looking at `stop` every [`RECEIVE_POLL_MS`]; false if stopped.
fn nap(total: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + total;
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(RECEIVE_POLL_MS)));
    }
}

fn monitor_loop(scheme: Weak<dyn LockScheme>, stop: &AtomicBool, interval: Duration) {
    while nap(interval, stop) {
        let Some(scheme) = scheme.upgrade() else { return };
        scheme.tick();
    }
}

fn heartbeat_loop(lease: &Lease, region: &LocalRegion, stop: &AtomicBool) {
    loop {
        lease.renew(region.memory());
        if !nap(lease.period(), stop) {
            return;
        }
    }
}

/// A grant and the scheme to release it to. Guards do not keep the manager
/// alive: after the manager is dropped, release fails with `ShutDown`.
struct GuardInner {
    scheme: Weak<dyn LockScheme>,
    grant: Option<Grant>,
}

impl GuardInner {
    fn new(scheme: &Arc<dyn LockScheme>, grant: Grant) -> Self {
        Self { scheme: Arc::downgrade(scheme), grant: Some(grant) }
    }

    fn release(&mut self) -> Result<(), LockError> {
        let Some(grant) = self.grant.take() else { return Ok(()) };
        self.scheme.upgrade().ok_or(LockError::ShutDown)?.release(&grant)
    }
}

impl Drop for GuardInner {
    fn drop(&mut self) {
        if self.grant.is_some() {
            if let Err(e) = self.release() {
                tracing::warn!(error = %e, "releasing a dropped lock guard failed");
            }
        }
    }
}

/// A shared hold; released on drop, or explicitly with [`SharedGuard::release`].
pub struct SharedGuard(GuardInner);

impl SharedGuard {
    pub fn lock(&self) -> Option<LockId> {
        self.0.grant.as_ref().map(Grant::lock)
    }

    /// Releases the hold and reports whether the release worked
    /// (`Broken` if `break_lock` revoked it meanwhile).
    pub fn release(mut self) -> Result<(), LockError> {
        self.0.release()
    }
}

/// An exclusive hold with its fencing token; released on drop, or
/// explicitly with [`ExclusiveGuard::release`].
pub struct ExclusiveGuard {
    inner: GuardInner,
    token: u64,
}

impl ExclusiveGuard {
    fn new(scheme: &Arc<dyn LockScheme>, grant: Grant) -> Result<Self, LockError> {
        let lock_id = grant.lock;
        let mut inner = GuardInner::new(scheme, grant);
        match inner.grant.as_ref().and_then(Grant::fencing_token) {
            Some(token) => Ok(Self { inner, token }),
            None => {
                let _ = inner.release();
                Err(LockError::Protocol(format!("{lock_id}: exclusive grant without a fencing token")))
            }
        }
    }

    pub fn lock(&self) -> Option<LockId> {
        self.inner.grant.as_ref().map(Grant::lock)
    }

    /// Strictly larger than every earlier exclusive grant's token of this
    /// lock; a resource that remembers the largest token it has seen can
    /// reject a stale holder.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    pub fn release(mut self) -> Result<(), LockError> {
        self.inner.release()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_fabric::RegionMemory;

    fn lease(ms: u64) -> (Lease, RegionMemory) {
        let lease = Lease {
            lease: Duration::from_millis(ms),
            lapses: AtomicU64::new(0),
            last_ns: AtomicU64::new(host_monotonic_ns()),
        };
        (lease, RegionMemory::heap("node", node_region_bytes()).unwrap())
    }

    /// A renewal that comes three quarters of a lease or more after the
    /// previous one counts a lapse, and a hold or wait that spans it (or is
    /// in one now) reports it; renewals on time do not.
    #[test]
    fn a_gap_in_the_heartbeat_is_a_lapse() {
        let (lease, memory) = lease(40);
        let mark = lease.mark();
        lease.renew(&memory);
        lease.renew(&memory);
        assert!(!lease.lapsed_since(mark), "renewals on time");
        assert_eq!(memory.load_u64(HEARTBEAT_OFFSET).unwrap(), 2, "each renewal advances the heartbeat");
        std::thread::sleep(Duration::from_millis(31));
        assert!(lease.lapsed_since(mark), "no renewal for 3/4 of the lease: lapsing now");
        lease.renew(&memory);
        assert!(lease.lapsed_since(mark), "the late renewal counted the lapse");
        let after = lease.mark();
        assert!(!lease.lapsed_since(after), "a request made after the lapse is unaffected");
        assert_eq!(lease.period(), Duration::from_millis(5));
    }
}
