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
//!
//! One file per concern: [`node`] (what every scheme's fabric-facing half
//! shares: regions, homes, sends, counters), [`liveness`] (the lease and
//! the monitor's judgement of lost nodes), [`cell`] (the per-lock cell and
//! the shared algorithms for waiting, timeouts and release checks),
//! [`queue_scheme`] (the N-CoShED and DQNL driver), [`srsl_scheme`] (the
//! SRSL driver, client and server side) and [`manager`] ([`LockManager`],
//! its threads and guards). This file holds the public configuration and
//! the [`LockScheme`] trait.

mod cell;
mod liveness;
mod manager;
mod metered;
mod node;
mod queue_scheme;
mod rehome;
mod srsl_scheme;

pub use manager::{ExclusiveGuard, LockManager, SharedGuard};
pub use metered::DlmMetrics;
pub use rehome::REHOMING_SERVERS_MIN;

use crate::error::LockError;
use crate::proto::LockMode;
use crate::table::{TABLE_SLOTS_DEFAULT, TABLE_SLOTS_MAX};
use crate::word::WORD_NODE_MAX;
use crate::LockId;
use std::time::Duration;
use tierstack_base::NodeId;

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
    /// Run a receive thread that drains the fabric's [`Channel::LOCKS`](tierstack_fabric::Channel::LOCKS)
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
    /// From the request to the grant (the clock read the request's own
    /// deadline started from, so the metrics pay one read, not two).
    waited: std::time::Duration,
}

impl Grant {
    pub fn lock(&self) -> LockId {
        self.lock
    }

    /// How long the acquire took, from the request to the grant.
    pub fn waited(&self) -> std::time::Duration {
        self.waited
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
    /// `bench dlm`, which waits for that between measurements).
    pub messages_sent: u64,
    /// Locks this node moved to a new generation (recoveries it led, and breaks).
    pub moves: u64,
    /// Locks taken from lost holders without an operator: moves this node
    /// led for a recovery (not a break), and SRSL holds its server
    /// took back from a lost or restarted holder.
    pub recoveries: u64,
    /// Locks this node made usable at a new home after their home was lost
    /// (re-homing moves it led; see `docs/internals/dlm-rehoming.md`).
    pub rehomes: u64,
    /// Times the monitor reported a lost node to a waiting request.
    pub peers_lost: u64,
}

/// Where a lock lives: its home, the home epoch and its candidates in
/// order (see `docs/internals/dlm-rehoming.md`). Without re-homing the
/// epoch is 0 and the home the first candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub home: NodeId,
    pub epoch: u32,
    pub candidates: Vec<NodeId>,
    /// A majority of lock servers name this home for this epoch (always,
    /// without re-homing); otherwise a claim is under way.
    pub settled: bool,
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
    /// Where `lock` lives now, as this node reads it (the lock servers'
    /// membership words with re-homing; one read each).
    fn placement(&self, lock: LockId) -> Result<Placement, LockError>;
    /// A one-line description of this node's protocol state for `lock`
    /// (and, where readable, the lock's home words), for diagnosing a stuck
    /// lock. The format is not stable.
    fn debug_state(&self, lock: LockId) -> String {
        format!("{}: no state dump for {lock}", self.node())
    }
}
