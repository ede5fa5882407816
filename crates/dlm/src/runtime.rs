//! The lock manager on a fabric: the drivers that connect the pure state
//! machines ([`crate::proto`], [`crate::srsl`]) to home memory, messages,
//! waiting threads and timeouts.
//!
//! Per node and lock there is one `Cell`: the scheme's client machine under
//! a mutex, plus a condition variable that waiting callers sleep on. A
//! caller that finds the cell busy (another local request still in the
//! protocol) waits for it to become idle first: one queue entry per node.
//! Atomics are executed synchronously by whichever thread drives the cell,
//! with the cell locked, so the machine sees every atomic's result before
//! any other input, as it requires. Messages are handled by one receive
//! thread per node (or by whoever calls [`LockManager::handle_message`]).

use crate::error::LockError;
use crate::msg::DlmMessage;
use crate::proto::{Action, BlockedOn, Input, LockClient, LockMode, QueueKind};
use crate::srsl::{ClientAction, ServerAction, SrslClient, SrslMsg, SrslQueue};
use crate::table::{alive_region, home_of, table_region, HomeMemory, TABLE_SLOTS_DEFAULT, TABLE_SLOTS_MAX};
use crate::word::{
    break_floor, DrainWord, LockWord, DRAIN_OFFSET, FENCE_OFFSET, LOCK_OFFSET, SLOT_BYTES, WORD_NODE_MAX,
};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion};

/// How often the receive thread looks at its stop flag while the inbox is quiet.
pub const RECEIVE_POLL_MS: u64 = 20;
/// How long a try-acquire waits for the SRSL server's answer unless configured.
pub const TRY_REPLY_TIMEOUT_MS_DEFAULT: u64 = 1000;

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
/// scheme, lock servers and table size.
#[derive(Clone, Debug)]
pub struct DlmConfig {
    pub scheme: Scheme,
    /// The nodes that keep lock tables (homes). Non-empty.
    pub lock_servers: Vec<NodeId>,
    /// Every node that may use locks: `break_lock` tells them all.
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
    /// Of those, messages whose handling failed (a protocol violation, or a
    /// send to a dead peer while handling it).
    pub message_errors: u64,
    /// Lock-manager messages this node has handed to its fabric (to itself
    /// included). Counted before the send, so across a cluster the sum of
    /// `messages_sent` is never below the sum of `messages_handled`, and the
    /// two are equal exactly when no message is in flight (see
    /// [`crate::bench`], which waits for that between measurements).
    pub messages_sent: u64,
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
    /// a dead holder). Returns the fencing floor: every token granted before
    /// the break is below it, every token granted after is above it.
    fn break_lock(&self, lock: LockId) -> Result<u64, LockError>;
    /// Handles one lock-manager message (payload starting with tag `0x01`).
    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError>;
    fn stats(&self) -> DlmStats;
    /// A one-line description of this node's protocol state for `lock`
    /// (and, where readable, the lock's home words), for diagnosing a stuck
    /// lock. The format is not stable.
    fn debug_state(&self, lock: LockId) -> String {
        format!("{}: no state dump for {lock}", self.node())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a cell would be a bug; the state is still the
    // machine's last consistent state, so keep going rather than cascade.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where a lock lives.
struct Slot {
    home_node: NodeId,
    home: Arc<HomeMemory>,
    /// Byte offset of the lock's slot in the home table.
    base: u64,
}

/// What the fabric-facing half of every scheme shares.
struct Core {
    fabric: Arc<dyn Fabric>,
    me: NodeId,
    config: DlmConfig,
    table: Option<Arc<LocalRegion>>,
    table_name: String,
    alive_name: String,
    _alive: Arc<LocalRegion>,
    homes: Mutex<HashMap<NodeId, Arc<HomeMemory>>>,
    messages_handled: AtomicU64,
    message_errors: AtomicU64,
    messages_sent: AtomicU64,
}

impl Core {
    fn new(fabric: Arc<dyn Fabric>, config: DlmConfig) -> Result<Self, LockError> {
        let me = fabric.local_node();
        config.validate(me)?;
        let register = |name: &str, bytes: u64| {
            fabric.register(name, bytes).map_err(|e| LockError::Config(format!("cannot register {name:?}: {e}")))
        };
        let (prefix, scheme) = (&config.region_prefix, config.scheme.name());
        let (table_name, alive_name) = (table_region(prefix, scheme), alive_region(prefix, scheme));
        let table = if config.lock_servers.contains(&me) {
            Some(register(&table_name, u64::from(config.table_slots) * SLOT_BYTES)?)
        } else {
            None
        };
        let alive = register(&alive_name, 8)?;
        Ok(Self {
            fabric,
            me,
            config,
            table,
            table_name,
            alive_name,
            _alive: alive,
            homes: Mutex::new(HashMap::new()),
            messages_handled: AtomicU64::new(0),
            message_errors: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
        })
    }

    fn home(&self, lock_id: LockId, node: NodeId) -> Result<Arc<HomeMemory>, LockError> {
        if let Some(home) = lock(&self.homes).get(&node) {
            return Ok(home.clone());
        }
        let home = match (&self.table, node == self.me) {
            (Some(table), true) => Arc::new(HomeMemory::Local(table.clone())),
            _ => Arc::new(HomeMemory::Remote(
                self.fabric.connect(node, &self.table_name).map_err(|e| LockError::from_fabric(lock_id, node, e))?,
            )),
        };
        Ok(lock(&self.homes).entry(node).or_insert(home).clone())
    }

    /// Finds (or, with `create`, claims) the slot of `id` at its home.
    fn locate(&self, id: LockId, create: bool) -> Result<Slot, LockError> {
        if id.0 == u64::MAX {
            return Err(LockError::InvalidLockId { lock: id });
        }
        let home_node =
            home_of(id, &self.config.lock_servers).ok_or_else(|| LockError::Config("no lock servers".into()))?;
        let home = self.home(id, home_node)?;
        let fabric_err = |e| LockError::from_fabric(id, home_node, e);
        let base = if create {
            home.claim(id).map_err(fabric_err)?.ok_or(LockError::TableFull { home: home_node, slots: home.slots() })?
        } else {
            home.lookup(id).map_err(fabric_err)?.ok_or(LockError::UnknownLock { lock: id, home: home_node })?
        };
        Ok(Slot { home_node, home, base })
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

    /// `Err(reason)` if `node` is known to be dead or unreachable.
    fn probe(&self, node: NodeId) -> Result<(), String> {
        if node == self.me {
            return Ok(());
        }
        match self.fabric.connect(node, &self.alive_name).and_then(|region| region.read_u64(0)) {
            Err(e) if e.is_unreachable() => Err(e.to_string()),
            _ => Ok(()),
        }
    }

    /// The error for a wait that ran out: `PeerDead` if the node we wait
    /// for is dead, else `Timeout`.
    fn timeout_error(&self, lock_id: LockId, waited: Duration, blocked_on: Option<NodeId>) -> LockError {
        if let Some(node) = blocked_on {
            if let Err(reason) = self.probe(node) {
                return LockError::PeerDead { lock: lock_id, node, reason };
            }
        }
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        LockError::Timeout { lock: lock_id, waited_ms, blocked_on }
    }

    /// Counts a handled message (and its failure).
    fn counted(&self, result: Result<(), LockError>) -> Result<(), LockError> {
        if result.is_err() {
            self.message_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.messages_handled.fetch_add(1, Ordering::Release);
        result
    }

    fn stats(&self) -> DlmStats {
        DlmStats {
            messages_handled: self.messages_handled.load(Ordering::Acquire),
            message_errors: self.message_errors.load(Ordering::Relaxed),
            messages_sent: self.messages_sent.load(Ordering::Acquire),
        }
    }
}

/// What the waiting caller of the current request is told.
enum Outcome {
    Granted(Option<u64>),
    WouldBlock,
    Broken,
    Failed(LockError),
}

struct CellState<M> {
    machine: M,
    /// Serial number of the current (or last) request.
    serial: u64,
    outcome: Option<Outcome>,
    /// The serial of the last request that `break_lock` revoked.
    broken: u64,
}

struct Cell<M> {
    id: LockId,
    slot: Slot,
    state: Mutex<CellState<M>>,
    changed: Condvar,
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
    if let Some(cell) = lock(engine.cells()).get(&id) {
        return Ok(cell.clone());
    }
    let slot = engine.core().locate(id, false)?;
    let mut cells = lock(engine.cells());
    let cell = cells.entry(id).or_insert_with(|| {
        Arc::new(Cell {
            id,
            slot,
            state: Mutex::new(CellState { machine: engine.new_machine(), serial: 0, outcome: None, broken: 0 }),
            changed: Condvar::new(),
        })
    });
    Ok(cell.clone())
}

fn wait_until<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>, deadline: Instant) -> MutexGuard<'a, T> {
    let left = deadline.saturating_duration_since(Instant::now());
    match cv.wait_timeout(guard, left) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

fn acquire_in<E: Engine>(engine: &E, id: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
    let cell = cell_of(engine, id)?;
    let started = Instant::now();
    let (try_only, budget) = match wait {
        Wait::Try => (true, engine.core().config.try_reply_timeout),
        Wait::Timeout(budget) => (false, budget),
    };
    let deadline = started.checked_add(budget).unwrap_or_else(|| started + Duration::from_secs(86_400 * 365));
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
    st.serial += 1;
    st.outcome = None;
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
                Outcome::Granted(token) => Ok(Grant { lock: id, mode, token, serial }),
                Outcome::WouldBlock => Err(LockError::WouldBlock { lock: id }),
                Outcome::Broken => Err(LockError::Broken { lock: id }),
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
    engine.release(&cell, &mut st)
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
    fn drive(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>, input: Input) -> Result<(), LockError> {
        let mut next = Some(input);
        let mut first_error = None;
        while let Some(input) = next.take() {
            let mut actions = Vec::new();
            if let Err(violation) = st.machine.handle(input, &mut actions) {
                cell.changed.notify_all();
                return Err(LockError::Protocol(violation.to_string()));
            }
            for action in actions {
                match action {
                    Action::Atomic(ops) => match cell.slot.home.execute(cell.slot.base, &ops) {
                        Ok(results) => next = Some(Input::AtomicDone { results, len: ops.len() }),
                        Err(e) => {
                            // We cannot know whether the atomic applied: forget
                            // the request. The lock may need break_lock.
                            let error = LockError::from_fabric(cell.id, cell.slot.home_node, e);
                            st.machine.reset();
                            st.outcome = Some(Outcome::Failed(error.clone()));
                            cell.changed.notify_all();
                            return Err(error);
                        }
                    },
                    Action::Send { to, generation, msg } => {
                        let message = DlmMessage::Proto { lock: cell.id, generation, msg };
                        if let Err(e) = self.core.send(cell.id, to, &message) {
                            first_error.get_or_insert(e);
                        }
                    }
                    Action::Granted { token, abandoned, .. } => {
                        if !abandoned {
                            st.outcome = Some(Outcome::Granted(token));
                        }
                    }
                    Action::WouldBlock => st.outcome = Some(Outcome::WouldBlock),
                    Action::Aborted(_) => {
                        st.broken = st.serial;
                        st.outcome = Some(Outcome::Broken);
                    }
                    Action::Idle => {}
                }
            }
        }
        cell.changed.notify_all();
        first_error.map_or(Ok(()), Err)
    }

    fn on_input(&self, lock_id: LockId, input: Input) -> Result<(), LockError> {
        let Some(cell) = lock(&self.cells).get(&lock_id).cloned() else {
            return match input {
                Input::Broken { .. } => Ok(()), // never used here: nothing to revoke
                _ => Err(LockError::Protocol(format!("{lock_id}: message for a lock this node never used"))),
            };
        };
        let mut st = lock(&cell.state);
        self.drive(&cell, &mut st, input)
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
        LockClient::new(self.core.me, self.kind)
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
        self.drive(cell, st, Input::Release)?;
        // The release itself may be what discovers a break (its atomic sees
        // a newer generation).
        if st.broken == st.serial {
            return Err(LockError::Broken { lock: cell.id });
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

    fn break_lock(&self, lock_id: LockId) -> Result<u64, LockError> {
        let slot = self.core.locate(lock_id, false)?;
        let (home, base) = (&slot.home, slot.base);
        let err = |e| LockError::from_fabric(lock_id, slot.home_node, e);
        let fenced = home.fetch_add(base + FENCE_OFFSET, 1).map_err(err)?;
        let word = home.read_u64(base + LOCK_OFFSET).map_err(err)?;
        let generation = LockWord::decode(word).generation.wrapping_add(1);
        let floor = break_floor(generation, fenced);
        // The drain word first: once the lock word shows the new generation,
        // new-generation requests may use the drain word at once.
        let mut seen = home.read_u64(base + DRAIN_OFFSET).map_err(err)?;
        loop {
            let previous =
                home.compare_swap(base + DRAIN_OFFSET, seen, DrainWord::idle(generation).encode()).map_err(err)?;
            if previous == seen {
                break;
            }
            seen = previous;
        }
        let mut seen = word;
        loop {
            let previous =
                home.compare_swap(base + LOCK_OFFSET, seen, LockWord::free(generation).encode()).map_err(err)?;
            if previous == seen || LockWord::decode(previous).generation != LockWord::decode(seen).generation {
                break; // done, or a concurrent break got there first
            }
            seen = previous;
        }
        tracing::warn!(lock = %lock_id, generation, floor, "lock broken");
        let notice = DlmMessage::Broken { lock: lock_id, generation };
        for &node in &self.core.config.nodes {
            if node == self.core.me {
                self.on_input(lock_id, Input::Broken { generation })?;
            } else if let Err(e) = self.core.send(lock_id, node, &notice) {
                tracing::info!(%node, error = %e, "break notice not delivered (node down?)");
            }
        }
        Ok(floor)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let result = match DlmMessage::decode(payload).map_err(|e| LockError::Protocol(e.to_string())) {
            Ok(DlmMessage::Proto { lock, generation, msg }) => {
                self.on_input(lock, Input::Message { from, generation, msg })
            }
            Ok(DlmMessage::Broken { lock, generation }) => self.on_input(lock, Input::Broken { generation }),
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

    fn debug_state(&self, lock_id: LockId) -> String {
        let Some(cell) = lock(&self.cells).get(&lock_id).cloned() else {
            return format!("{}: {lock_id} never used", self.core.me);
        };
        let st = lock(&cell.state);
        let read = |offset: u64| cell.slot.home.read_u64(cell.slot.base + offset);
        let words = match (read(LOCK_OFFSET), read(DRAIN_OFFSET)) {
            (Ok(word), Ok(drain)) => format!("{:?} {:?}", LockWord::decode(word), DrainWord::decode(drain)),
            (Err(e), _) | (_, Err(e)) => format!("home words unreadable: {e}"),
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
                    let message = DlmMessage::Srsl { lock: cell.id, msg };
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
                        let fence = table.memory().fetch_add(*base + FENCE_OFFSET, 1);
                        fence.map_err(|e| LockError::Fabric { lock: lock_id, source: e })?.wrapping_add(1)
                    } else {
                        0
                    };
                    (to, SrslMsg::Grant { mode, token })
                }
                ServerAction::Refuse { to } => (to, SrslMsg::WouldBlock),
                ServerAction::Broken { to, held } => (to, SrslMsg::Broken { held }),
            };
            if let Err(e) = self.core.send(lock_id, to, &DlmMessage::Srsl { lock: lock_id, msg }) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
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
        SrslClient::new(self.core.me)
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
            st.machine = SrslClient::new(self.core.me);
        }
        sent
    }

    fn abandon(&self, _cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) {
        st.machine.abandon();
    }

    fn release(&self, cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) -> Result<(), LockError> {
        let mut actions = Vec::new();
        st.machine.release(&mut actions).map_err(Self::protocol)?;
        self.drive(cell, st, actions)
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
        let floor = slot
            .home
            .fetch_add(slot.base + FENCE_OFFSET, 1)
            .map_err(|e| LockError::from_fabric(lock_id, slot.home_node, e))?
            .wrapping_add(1);
        tracing::warn!(lock = %lock_id, floor, "lock broken");
        self.core.send(lock_id, slot.home_node, &DlmMessage::Srsl { lock: lock_id, msg: SrslMsg::Break })?;
        Ok(floor)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let result = self.handle_srsl(from, payload);
        self.core.counted(result)
    }

    fn stats(&self) -> DlmStats {
        self.core.stats()
    }
}

impl SrslScheme {
    fn handle_srsl(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let (lock_id, msg) = match DlmMessage::decode(payload).map_err(|e| LockError::Protocol(e.to_string()))? {
            DlmMessage::Srsl { lock, msg } => (lock, msg),
            other => return Err(LockError::Protocol(format!("{other:?} from {from} to an SRSL node"))),
        };
        match msg {
            SrslMsg::Acquire { mode, try_only } => self.serve(lock_id, |q, out| q.acquire(from, mode, try_only, out)),
            SrslMsg::Release => self.serve(lock_id, |q, out| q.release(from, out)),
            SrslMsg::Break => self.serve(lock_id, |q, out| {
                q.break_all(out);
                Ok(())
            }),
            SrslMsg::Grant { .. } | SrslMsg::WouldBlock | SrslMsg::Broken { .. } => {
                let cell = lock(&self.cells).get(&lock_id).cloned().ok_or_else(|| {
                    LockError::Protocol(format!("{lock_id}: {msg:?} for a lock this node never used"))
                })?;
                let mut st = lock(&cell.state);
                let mut actions = Vec::new();
                st.machine.message(msg, &mut actions).map_err(Self::protocol)?;
                self.drive(&cell, &mut st, actions)
            }
        }
    }
}

// ---------------------------------------------------------------- manager and guards

/// A node's lock manager: one scheme, plus the thread that reads the
/// fabric's [`Channel::LOCKS`] inbox (unless configured off).
pub struct LockManager {
    scheme: Arc<dyn LockScheme>,
    stop: Arc<AtomicBool>,
    receiver: Option<JoinHandle<()>>,
}

impl LockManager {
    /// Starts the lock manager of `fabric`'s node: registers its lock table
    /// (at lock servers) and its liveness word, and starts the receive thread.
    pub fn start(fabric: Arc<dyn Fabric>, config: DlmConfig) -> Result<Self, LockError> {
        let own_inbox = config.own_inbox;
        let scheme_kind = config.scheme;
        let core = Core::new(fabric.clone(), config)?;
        let me = core.me;
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
        let receiver = if own_inbox {
            let (weak, stop) = (Arc::downgrade(&scheme), stop.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("dlm-recv-{}", me.0))
                .spawn(move || receive_loop(fabric, weak, stop))
                .map_err(|e| LockError::Config(format!("cannot start the receive thread: {e}")))?;
            Some(spawned)
        } else {
            None
        };
        Ok(Self { scheme, stop, receiver })
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
}

impl Drop for LockManager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(receiver) = self.receiver.take() {
            let _ = receiver.join();
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
