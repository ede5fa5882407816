//! Exhaustive model check of the N-CoShED (and DQNL) state machine.
//!
//! The explorer runs the real [`LockClient`] of every node against a model
//! home (three words: lock, drain, fence) and a model network in which any
//! sent message may be delivered next (no ordering at all, which is weaker
//! than the fabric's per-pair order). One step is one of:
//! - a node starts the next request of its script;
//! - a node's outstanding atomic batch executes at the home (with
//!   `split_batches`, one of its atomics executes: other nodes' atomics and
//!   the break's steps interleave between the parts, as on `shm`, where the
//!   acquirer's thread executes a batch op by op);
//! - one message in flight is delivered, to a node with no batch
//!   outstanding (the driver feeds a batch's results before any other input);
//! - a step of the run's `break_lock` (at most one; see `Breaker`), whose
//!   notices are then messages like any other;
//! - a holder releases;
//! - a waiter gives up (abandons), within a per-run budget.
//!
//! Every reachable state is visited (depth-first, with a colour per state
//! fingerprint so a cycle would be found). Checked at every step:
//! - **mutual exclusion**: an exclusive grant finds no other holder, a shared
//!   grant finds no exclusive holder (abandoned grants count: they are held
//!   for an instant);
//! - **FIFO among exclusives**: grants come in the order of the successful
//!   enqueue compare-and-swaps at the home;
//! - **shared waits for queued exclusives**: a shared grant comes after every
//!   exclusive that enqueued before its fetch-and-add has released, and an
//!   exclusive is granted only after every shared request that enqueued
//!   before it was granted;
//! - **fencing tokens** strictly increase over exclusive grants;
//! - no protocol violation is reported by any client.
//!
//! Checked in every terminal state (no step enabled): every script is done,
//! every client idle, the network empty, the lock and drain words back to
//! zero (**no deadlock, no lost wake-up**), and every request was granted or
//! (try-acquire) refused. There are no cycles, so every run ends in a
//! terminal state. Also checked per configuration: shared holders **did
//! overlap** in some state (where the script makes it possible).

mod explorer;

use explorer::{Req, E, S, TE, TS};
use tierstack_base::NodeId;
use tierstack_dlm::proto::{Action, AtomicOp, Input, LockClient, LockMode, ProtoMsg, QueueKind, WordKind};
use tierstack_dlm::word::{break_floor, DrainWord, LockWord};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum User {
    Idle,
    Waiting(Req),
    /// Holds in `mode`, granted in lock-word generation `generation`.
    Holding(LockMode, u16),
    /// Gave up waiting; the request is still in the protocol.
    Gone,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct NodeState {
    client: LockClient,
    next: usize,
    /// The outstanding batch and the results of its parts executed so far.
    pending: Option<(Vec<AtomicOp>, Vec<u64>)>,
    user: User,
    /// For the current shared request: exclusive enqueues that preceded its fetch-and-add.
    shared_mark: Option<u32>,
    granted: u32,
    refused: u32,
    /// Requests ended by a break (`Aborted`).
    aborted: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Envelope {
    from: u32,
    to: u32,
    generation: u16,
    /// `None`: the break's notice (`Input::Broken`).
    msg: Option<ProtoMsg>,
}

impl PartialOrd for Envelope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Envelope {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.from, self.to, self.generation, self.msg).cmp(&(other.from, other.to, other.generation, other.msg))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    lock: u64,
    drain: u64,
    fence: u64,
    nodes: Vec<NodeState>,
    /// Messages in flight, sorted (a multiset).
    net: Vec<Envelope>,
    /// Exclusive-queue enqueues not yet granted, in home order.
    queue: Vec<u32>,
    enqueues: u32,
    dequeues: u32,
    exclusive_done: u32,
    last_token: u64,
    abandons_left: u8,
    breaks_left: u8,
    breaker: Breaker,
}

/// Where the one `break_lock` of a run stands. Its steps are those of
/// `LockManager::break_lock`, each one atomic at the home, interleaved with
/// everything else: bump the fence (the floor), read the lock word, reset
/// the drain word to the new generation, swap the lock word to the new
/// generation's free word (the runtime's compare-and-swap loop ends in
/// exactly this swap), then send every node the notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Breaker {
    Idle,
    /// The fence's count before the break's fetch-and-add.
    Fenced {
        count: u64,
    },
    Read {
        floor: u64,
        generation: u16,
    },
    Drained {
        floor: u64,
        generation: u16,
    },
    Swapped {
        floor: u64,
        generation: u16,
    },
    Done {
        floor: u64,
    },
}

impl Breaker {
    /// The floor returned by a break that has bumped the fence.
    fn floor(self) -> Option<u64> {
        match self {
            Breaker::Idle | Breaker::Fenced { .. } => None,
            Breaker::Read { floor, .. }
            | Breaker::Drained { floor, .. }
            | Breaker::Swapped { floor, .. }
            | Breaker::Done { floor } => Some(floor),
        }
    }
}

struct Config {
    name: &'static str,
    kind: QueueKind,
    scripts: Vec<Vec<Req>>,
    abandons: u8,
    expect_overlap: bool,
    /// Breaks per run (0 or 1).
    breaks: u8,
    /// Execute the parts of a batch as separate steps (shm executes a batch
    /// op by op on the caller's thread; an RDMA adapter may too).
    split_batches: bool,
}

fn queued_exclusively(kind: QueueKind, mode: LockMode) -> bool {
    kind == QueueKind::Dqnl || mode == LockMode::Exclusive
}

impl World {
    fn new(config: &Config) -> Self {
        let nodes = (0..config.scripts.len())
            .map(|i| NodeState {
                client: LockClient::new(NodeId(i as u32), config.kind),
                next: 0,
                pending: None,
                user: User::Idle,
                shared_mark: None,
                granted: 0,
                refused: 0,
                aborted: 0,
            })
            .collect();
        World {
            lock: 0,
            drain: 0,
            fence: 0,
            nodes,
            net: Vec::new(),
            queue: Vec::new(),
            enqueues: 0,
            dequeues: 0,
            exclusive_done: 0,
            last_token: 0,
            abandons_left: config.abandons,
            breaks_left: config.breaks,
            breaker: Breaker::Idle,
        }
    }

    fn word(&mut self, kind: WordKind) -> &mut u64 {
        match kind {
            WordKind::Lock => &mut self.lock,
            WordKind::Drain => &mut self.drain,
            WordKind::Fence => &mut self.fence,
        }
    }

    /// Executes node `i`'s batch at the home; records the ghost effects of
    /// enqueues (exclusive order, shared marks).
    fn execute(&mut self, i: usize, ops: &[AtomicOp]) -> Input {
        let mut results = [0u64; 2];
        for (slot, op) in ops.iter().enumerate() {
            results[slot] = self.execute_one(i, *op);
        }
        Input::AtomicDone { results, len: ops.len() }
    }

    /// Executes one atomic of node `i` at the home, with its ghost effects.
    fn execute_one(&mut self, i: usize, op: AtomicOp) -> u64 {
        {
            match op {
                AtomicOp::CompareSwap { word, expected, new } => {
                    let w = self.word(word);
                    let previous = *w;
                    if previous == expected {
                        *w = new;
                    }
                    if word == WordKind::Lock && previous == expected {
                        let (before, after) = (LockWord::decode(previous), LockWord::decode(new));
                        let me = Some(NodeId(i as u32));
                        if after.tail == me && before.tail != me {
                            self.queue.push(i as u32);
                            self.enqueues += 1;
                        }
                        if after.tail.is_none() && before.tail.is_none() && after.shared == before.shared + 1 {
                            self.nodes[i].shared_mark = Some(self.enqueues); // shared try-acquire
                        }
                    }
                    previous
                }
                AtomicOp::FetchAdd { word, delta } => {
                    let w = self.word(word);
                    let previous = *w;
                    *w = previous.wrapping_add(delta);
                    if word == WordKind::Lock {
                        self.nodes[i].shared_mark = Some(self.enqueues);
                    }
                    previous
                }
            }
        }
    }

    /// The lock word's generation: the current one.
    fn generation(&self) -> u16 {
        LockWord::decode(self.lock).generation
    }

    /// Holders of the current generation (a break revokes older holds).
    fn holders(&self) -> (usize, usize) {
        let generation = self.generation();
        let count = |mode| self.nodes.iter().filter(|n| n.user == User::Holding(mode, generation)).count();
        (count(LockMode::Shared), count(LockMode::Exclusive))
    }

    /// Feeds `input` to node `i` and applies its actions, checking the invariants.
    fn feed(&mut self, kind: QueueKind, i: usize, input: Input) -> Result<(), String> {
        let mut out = Vec::new();
        self.nodes[i].client.handle(input, &mut out).map_err(|e| e.to_string())?;
        for action in out {
            match action {
                Action::Atomic(ops) => {
                    if self.nodes[i].pending.is_some() {
                        return Err(format!("node {i}: second batch while one is outstanding"));
                    }
                    self.nodes[i].pending = Some((ops, Vec::new()));
                }
                Action::Send { to, generation, msg } => {
                    if generation != 0 && self.breaker == Breaker::Idle {
                        return Err(format!("node {i}: generation {generation} without a break"));
                    }
                    self.post(Envelope { from: i as u32, to: to.0, generation, msg: Some(msg) });
                }
                Action::Granted { mode, token, abandoned } => self.granted(kind, i, mode, token, abandoned)?,
                Action::WouldBlock => match self.nodes[i].user {
                    User::Waiting(req) if req.try_only => {
                        self.nodes[i].user = User::Idle;
                        self.nodes[i].refused += 1;
                        self.nodes[i].shared_mark = None;
                    }
                    other => return Err(format!("node {i}: WouldBlock for {other:?}")),
                },
                Action::Aborted(reason) => {
                    if self.breaker == Breaker::Idle {
                        return Err(format!("node {i}: aborted without a break: {reason:?}"));
                    }
                    let node = &mut self.nodes[i];
                    match node.user {
                        // The waiter gets `Broken`.
                        User::Waiting(_) | User::Gone => node.aborted += 1,
                        // A revoked hold (granted already; its release returns
                        // `Broken`), or a released one whose handoff work ended.
                        User::Holding(..) | User::Idle => {}
                    }
                    node.user = User::Idle;
                    node.shared_mark = None;
                }
                Action::Idle => {
                    if !self.nodes[i].client.is_idle() {
                        return Err(format!("node {i}: Idle reported by a busy client"));
                    }
                }
            }
        }
        Ok(())
    }

    fn post(&mut self, envelope: Envelope) {
        let at = self.net.binary_search(&envelope).unwrap_or_else(|at| at);
        self.net.insert(at, envelope);
    }

    fn granted(
        &mut self,
        kind: QueueKind,
        i: usize,
        mode: LockMode,
        token: Option<u64>,
        abandoned: bool,
    ) -> Result<(), String> {
        let exclusive_grant = queued_exclusively(kind, mode);
        let generation = self.nodes[i].client.generation();
        if generation != self.generation() {
            // A request of a broken generation granted after the break (its
            // grant message or its batch overtook the break's notice). It is
            // revoked: the fencing floor must reject it.
            return self.granted_stale(i, mode, token, abandoned, generation);
        }
        let (shared, exclusive) = self.holders();
        if exclusive_grant && shared + exclusive > 0 {
            return Err(format!("node {i}: exclusive grant while {shared} shared and {exclusive} exclusive hold"));
        }
        if !exclusive_grant && exclusive > 0 {
            return Err(format!("node {i}: shared grant while an exclusive holds"));
        }
        if exclusive_grant {
            if self.queue.first() != Some(&(i as u32)) {
                return Err(format!("node {i}: exclusive grant out of FIFO order; queue {:?}", self.queue));
            }
            self.queue.remove(0);
            // Every shared request that enqueued before this exclusive must
            // have been granted already.
            let position = self.dequeues;
            self.dequeues += 1;
            if let Some(j) = self.nodes.iter().position(|n| n.shared_mark.is_some_and(|m| m <= position)) {
                return Err(format!("node {i}: exclusive overtook node {j}'s earlier shared request"));
            }
        } else {
            let mark =
                self.nodes[i].shared_mark.take().ok_or_else(|| format!("node {i}: shared grant without an enqueue"))?;
            if self.exclusive_done < mark {
                return Err(format!("node {i}: shared grant before the {mark} exclusives queued ahead released"));
            }
        }
        match (mode, token) {
            (LockMode::Exclusive, Some(t)) => {
                if t <= self.last_token {
                    return Err(format!("node {i}: fencing token {t} after {}", self.last_token));
                }
                self.last_token = t;
            }
            (LockMode::Exclusive, None) if !abandoned => {
                return Err(format!("node {i}: exclusive grant without a token"))
            }
            (LockMode::Shared, Some(_)) => return Err(format!("node {i}: shared grant with a token")),
            _ => {}
        }
        let node = &mut self.nodes[i];
        node.granted += 1;
        if abandoned {
            if node.user != User::Gone {
                return Err(format!("node {i}: abandoned grant for {:?}", node.user));
            }
            node.user = User::Idle;
            if exclusive_grant {
                self.exclusive_done += 1;
            }
        } else {
            if !matches!(node.user, User::Waiting(_)) {
                return Err(format!("node {i}: grant for {:?}", node.user));
            }
            node.user = User::Holding(if exclusive_grant { LockMode::Exclusive } else { LockMode::Shared }, generation);
        }
        Ok(())
    }

    fn granted_stale(
        &mut self,
        i: usize,
        mode: LockMode,
        token: Option<u64>,
        abandoned: bool,
        generation: u16,
    ) -> Result<(), String> {
        let floor = self.breaker.floor().ok_or_else(|| format!("node {i}: generation {generation} without a break"))?;
        if let Some(t) = token {
            if t >= floor {
                return Err(format!(
                    "node {i}: a grant of broken generation {generation} got token {t}, not below the floor {floor}"
                ));
            }
        }
        let node = &mut self.nodes[i];
        node.granted += 1;
        node.shared_mark = None;
        node.user = match (abandoned, node.user) {
            (true, User::Gone) => User::Idle,
            (false, User::Waiting(_)) => User::Holding(mode, generation),
            (_, other) => return Err(format!("node {i}: stale grant for {other:?}")),
        };
        Ok(())
    }

    fn successors(&self, config: &Config) -> Result<Vec<World>, String> {
        let kind = config.kind;
        let mut next = Vec::new();
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            if node.client.is_idle() && node.user == User::Idle && node.next < config.scripts[i].len() {
                let req = config.scripts[i][node.next];
                let mut w = self.clone();
                w.nodes[i].next += 1;
                w.nodes[i].user = User::Waiting(req);
                w.feed(kind, i, Input::Acquire { mode: req.mode, try_only: req.try_only, fencing: true })?;
                next.push(w);
            }
            if let Some((ops, done)) = &node.pending {
                let mut w = self.clone();
                let input = if config.split_batches {
                    let mut done = done.clone();
                    done.push(w.execute_one(i, ops[done.len()]));
                    if done.len() < ops.len() {
                        w.nodes[i].pending = Some((ops.clone(), done));
                        None
                    } else {
                        let mut results = [0u64; 2];
                        results[..done.len()].copy_from_slice(&done);
                        Some(Input::AtomicDone { results, len: done.len() })
                    }
                } else {
                    Some(w.execute(i, ops))
                };
                if let Some(input) = input {
                    w.nodes[i].pending = None;
                    w.feed(kind, i, input)?;
                }
                next.push(w);
            }
            if let User::Holding(mode, generation) = node.user {
                let mut w = self.clone();
                w.nodes[i].user = User::Idle;
                if mode == LockMode::Exclusive && generation == self.generation() {
                    w.exclusive_done += 1;
                }
                w.feed(kind, i, Input::Release)?;
                next.push(w);
            }
            if matches!(node.user, User::Waiting(r) if !r.try_only)
                && node.pending.is_none()
                && self.abandons_left > 0
                && node.client.is_waiting()
            {
                let mut w = self.clone();
                w.abandons_left -= 1;
                w.nodes[i].user = User::Gone;
                w.feed(kind, i, Input::Abandon)?;
                next.push(w);
            }
        }
        for (k, envelope) in self.net.iter().enumerate() {
            if k > 0 && self.net[k - 1] == *envelope {
                continue; // identical message: same successor
            }
            if self.nodes[envelope.to as usize].pending.is_some() {
                // The driver feeds a batch's results before any other input
                // (the runtime executes it under the lock's cell mutex).
                continue;
            }
            let mut w = self.clone();
            w.net.remove(k);
            let input = match envelope.msg {
                Some(msg) => Input::Message { from: NodeId(envelope.from), generation: envelope.generation, msg },
                None => Input::Broken { generation: envelope.generation },
            };
            w.feed(kind, envelope.to as usize, input)?;
            next.push(w);
        }
        if let Some(w) = self.break_step() {
            next.push(w);
        }
        Ok(next)
    }

    /// The break's next step, if one is due.
    fn break_step(&self) -> Option<World> {
        let mut w = self.clone();
        w.breaker = match self.breaker {
            Breaker::Idle if self.breaks_left > 0 => {
                w.breaks_left -= 1;
                w.fence += 1;
                Breaker::Fenced { count: self.fence }
            }
            Breaker::Fenced { count } => {
                let generation = self.generation().wrapping_add(1);
                Breaker::Read { floor: break_floor(generation, count), generation }
            }
            Breaker::Read { floor, generation } => {
                w.drain = DrainWord::idle(generation).encode();
                Breaker::Drained { floor, generation }
            }
            Breaker::Drained { floor, generation } => {
                w.lock = LockWord::free(generation).encode();
                // The old generation's queue is gone; its members abort.
                w.queue.clear();
                w.enqueues = 0;
                w.dequeues = 0;
                w.exclusive_done = 0;
                w.last_token = floor;
                for node in &mut w.nodes {
                    node.shared_mark = None;
                }
                Breaker::Swapped { floor, generation }
            }
            Breaker::Swapped { floor, generation } => {
                for to in 0..self.nodes.len() as u32 {
                    w.post(Envelope { from: u32::MAX, to, generation, msg: None });
                }
                Breaker::Done { floor }
            }
            Breaker::Idle | Breaker::Done { .. } => return None,
        };
        Some(w)
    }

    fn check_terminal(&self, config: &Config) -> Result<(), String> {
        for (i, node) in self.nodes.iter().enumerate() {
            if node.next != config.scripts[i].len() || !node.client.is_idle() || node.user != User::Idle {
                return Err(format!("deadlock: node {i} stuck at {node:?}"));
            }
            if node.granted + node.refused + node.aborted != config.scripts[i].len() as u32 {
                return Err(format!(
                    "node {i}: {} grants, {} refusals and {} aborts for {} requests",
                    node.granted,
                    node.refused,
                    node.aborted,
                    config.scripts[i].len()
                ));
            }
            let must_grant = config.scripts[i].iter().filter(|r| !r.try_only).count() as u32;
            if self.breaker == Breaker::Idle && node.granted < must_grant {
                return Err(format!("node {i}: lost wake-up, {} of {must_grant} requests granted", node.granted));
            }
        }
        if !self.net.is_empty() {
            return Err(format!("messages left over: {:?}", self.net));
        }
        if !LockWord::decode(self.lock).is_free() || self.drain != DrainWord::idle(self.generation()).encode() {
            return Err(format!("home not clean: lock {:?} drain {:#x}", LockWord::decode(self.lock), self.drain));
        }
        if !self.queue.is_empty() {
            return Err(format!("exclusive enqueues never granted: {:?}", self.queue));
        }
        Ok(())
    }
}

fn explore(config: &Config) {
    let mut max_shared_holders = 0;
    let explored = explorer::explore(
        World::new(config),
        |world| world.successors(config),
        |world| world.check_terminal(config),
        |world| max_shared_holders = max_shared_holders.max(world.holders().0),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", config.name));
    if config.expect_overlap {
        assert!(max_shared_holders >= 2, "{}: shared holders never overlapped", config.name);
    } else {
        assert!(max_shared_holders <= 1 || config.kind == QueueKind::CoShed, "{}: overlap in DQNL", config.name);
    }
    assert!(explored.terminals > 0, "{}: no terminal state", config.name);
    eprintln!("{}: {explored:?}, {max_shared_holders} shared holders at most", config.name);
}

fn check(name: &'static str, kind: QueueKind, scripts: Vec<Vec<Req>>, abandons: u8, expect_overlap: bool) {
    explore(&Config { name, kind, scripts, abandons, expect_overlap, breaks: 0, split_batches: false })
}

#[test]
fn two_nodes_exclusive_twice_each() {
    check("2n EE/EE", QueueKind::CoShed, vec![vec![E, E], vec![E, E]], 0, false);
}

#[test]
fn two_nodes_mixed_modes() {
    check("2n SE/ES", QueueKind::CoShed, vec![vec![S, E], vec![E, S]], 0, false);
    check("2n SS/SS", QueueKind::CoShed, vec![vec![S, S], vec![S, S]], 0, true);
}

#[test]
fn three_nodes_exclusive_between_shared() {
    check("3n E/S/S", QueueKind::CoShed, vec![vec![E], vec![S], vec![S]], 0, true);
    check("3n S/E/S", QueueKind::CoShed, vec![vec![S], vec![E], vec![S]], 0, true);
}

#[test]
fn three_nodes_two_requests_each() {
    check("3n SE/ES/S", QueueKind::CoShed, vec![vec![S, E], vec![E, S], vec![S]], 0, true);
    check("3n ES/S/SE", QueueKind::CoShed, vec![vec![E, S], vec![S], vec![S, E]], 0, true);
}

#[test]
fn three_nodes_exclusive_queue_with_shared_group() {
    // Exclusives queue behind each other with shared requests in between:
    // coordinated handoff and group-0 conversion both occur.
    check("3n EE/S/SE", QueueKind::CoShed, vec![vec![E, E], vec![S], vec![S, E]], 0, true);
}

#[test]
fn try_acquire_never_enqueues() {
    check("3n TE S/TS E/S", QueueKind::CoShed, vec![vec![TE, S], vec![TS, E], vec![S]], 0, true);
}

#[test]
fn abandoned_waiters_pass_the_lock_on() {
    check("3n E/E/S abandon", QueueKind::CoShed, vec![vec![E], vec![E], vec![S]], 1, false);
    check("3n S/E/SE abandon", QueueKind::CoShed, vec![vec![S], vec![E], vec![S, E]], 1, true);
}

#[test]
fn dqnl_queues_everything_exclusively() {
    check("dqnl 3n S/S/E", QueueKind::Dqnl, vec![vec![S], vec![S], vec![E]], 0, false);
    check("dqnl 2n SE/ES abandon", QueueKind::Dqnl, vec![vec![S, E], vec![E, S]], 1, false);
}

#[test]
fn four_nodes_mixed() {
    check("4n E/S/S/E", QueueKind::CoShed, vec![vec![E], vec![S], vec![S], vec![E]], 0, true);
    check("4n S/E/S/TE abandon", QueueKind::CoShed, vec![vec![S], vec![E], vec![S], vec![TE, S]], 1, true);
}

#[test]
fn three_nodes_three_requests_each() {
    check("3n ESE/SES/SE", QueueKind::CoShed, vec![vec![E, S, E], vec![S, E, S], vec![S, E]], 1, true);
}

fn check_with(config: Config) {
    explore(&config)
}

fn config(name: &'static str, scripts: Vec<Vec<Req>>, breaks: u8, split_batches: bool) -> Config {
    Config { name, kind: QueueKind::CoShed, scripts, abandons: 0, expect_overlap: false, breaks, split_batches }
}

#[test]
fn batches_split_into_their_parts() {
    check_with(config("3n EE/E/S split", vec![vec![E, E], vec![E], vec![S]], 0, true));
    check_with(Config {
        abandons: 1,
        ..config("3n ES/SE/TE split abandon", vec![vec![E, S], vec![S, E], vec![TE]], 0, true)
    });
}

/// `break_lock` at any point of the run, its steps interleaved with
/// everything else: old-generation requests end (granted, aborted or
/// refused), nothing deadlocks, the home ends free in the new generation,
/// exclusive grants of the new generation are mutually exclusive, FIFO and
/// above the floor, and a grant of the broken generation that still comes
/// through (its grant message overtook the notice) has a token below it.
/// `2n SE/E` found a deadlock: a node that learned the new generation from
/// the drain word, then enqueued in the old lock word, was never aborted.
#[test]
fn break_lock_with_atomic_batches() {
    check_with(config("2n SE/E break", vec![vec![S, E], vec![E]], 1, false));
    check_with(config("2n EE/E break", vec![vec![E, E], vec![E]], 1, false));
    check_with(config("3n E/E/S break", vec![vec![E], vec![E], vec![S]], 1, false));
    check_with(Config { kind: QueueKind::Dqnl, ..config("dqnl 2n SE/E break", vec![vec![S, E], vec![E]], 1, true) });
}

/// The same with every batch split into its parts: the uncontended
/// acquire's token fetch-and-add may come after the break's.
#[test]
fn break_lock_with_split_batches() {
    check_with(config("2n SE/E break split", vec![vec![S, E], vec![E]], 1, true));
    check_with(config("2n EE/E break split", vec![vec![E, E], vec![E]], 1, true));
}
