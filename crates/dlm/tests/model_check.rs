//! Exhaustive model check of the N-CoShED (and DQNL) state machine.
//!
//! The explorer runs the real [`LockClient`] of every node against a model
//! home (three words: lock, drain, fence) and a model network in which any
//! sent message may be delivered next (no ordering at all, which is weaker
//! than the fabric's per-pair order). One step is one of:
//! - a node starts the next request of its script;
//! - a node's outstanding atomic batch executes at the home;
//! - one message in flight is delivered;
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

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use tierstack_base::NodeId;
use tierstack_dlm::proto::{Action, AtomicOp, Input, LockClient, LockMode, ProtoMsg, QueueKind, WordKind};
use tierstack_dlm::word::LockWord;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Req {
    mode: LockMode,
    try_only: bool,
}

const E: Req = Req { mode: LockMode::Exclusive, try_only: false };
const S: Req = Req { mode: LockMode::Shared, try_only: false };
const TE: Req = Req { mode: LockMode::Exclusive, try_only: true };
const TS: Req = Req { mode: LockMode::Shared, try_only: true };

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum User {
    Idle,
    Waiting(Req),
    Holding(LockMode),
    /// Gave up waiting; the request is still in the protocol.
    Gone,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct NodeState {
    client: LockClient,
    next: usize,
    pending: Option<Vec<AtomicOp>>,
    user: User,
    /// For the current shared request: exclusive enqueues that preceded its fetch-and-add.
    shared_mark: Option<u32>,
    granted: u32,
    refused: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Envelope {
    from: u32,
    to: u32,
    msg: ProtoMsg,
}

impl PartialOrd for Envelope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Envelope {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.from, self.to, self.msg).cmp(&(other.from, other.to, other.msg))
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
}

struct Config {
    name: &'static str,
    kind: QueueKind,
    scripts: Vec<Vec<Req>>,
    abandons: u8,
    expect_overlap: bool,
}

#[derive(Debug, Default)]
struct Report {
    states: usize,
    terminals: usize,
    max_shared_holders: usize,
    max_depth: usize,
}

fn fingerprint(world: &World) -> u128 {
    let mut a = DefaultHasher::new();
    world.hash(&mut a);
    let mut b = DefaultHasher::new();
    0xDEAD_BEEF_u64.hash(&mut b);
    world.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
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
            let previous = match *op {
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
            };
            results[slot] = previous;
        }
        Input::AtomicDone { results, len: ops.len() }
    }

    fn holders(&self) -> (usize, usize) {
        let shared = self.nodes.iter().filter(|n| n.user == User::Holding(LockMode::Shared)).count();
        let exclusive = self.nodes.iter().filter(|n| n.user == User::Holding(LockMode::Exclusive)).count();
        (shared, exclusive)
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
                    self.nodes[i].pending = Some(ops);
                }
                Action::Send { to, generation, msg } => {
                    if generation != 0 {
                        return Err(format!("node {i}: generation {generation} without a break"));
                    }
                    let envelope = Envelope { from: i as u32, to: to.0, msg };
                    let at = self.net.binary_search(&envelope).unwrap_or_else(|at| at);
                    self.net.insert(at, envelope);
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
                Action::Aborted(reason) => return Err(format!("node {i}: aborted without a break: {reason:?}")),
                Action::Idle => {
                    if !self.nodes[i].client.is_idle() {
                        return Err(format!("node {i}: Idle reported by a busy client"));
                    }
                }
            }
        }
        Ok(())
    }

    fn granted(
        &mut self,
        kind: QueueKind,
        i: usize,
        mode: LockMode,
        token: Option<u64>,
        abandoned: bool,
    ) -> Result<(), String> {
        let (shared, exclusive) = self.holders();
        let exclusive_grant = queued_exclusively(kind, mode);
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
            node.user = User::Holding(if exclusive_grant { LockMode::Exclusive } else { LockMode::Shared });
        }
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
            if let Some(ops) = &node.pending {
                let mut w = self.clone();
                w.nodes[i].pending = None;
                let input = w.execute(i, ops);
                w.feed(kind, i, input)?;
                next.push(w);
            }
            if let User::Holding(mode) = node.user {
                let mut w = self.clone();
                w.nodes[i].user = User::Idle;
                if mode == LockMode::Exclusive {
                    w.exclusive_done += 1;
                }
                w.feed(kind, i, Input::Release)?;
                next.push(w);
            }
            if matches!(node.user, User::Waiting(r) if !r.try_only)
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
            let mut w = self.clone();
            w.net.remove(k);
            let input = Input::Message { from: NodeId(envelope.from), generation: 0, msg: envelope.msg };
            w.feed(kind, envelope.to as usize, input)?;
            next.push(w);
        }
        Ok(next)
    }

    fn check_terminal(&self, config: &Config) -> Result<(), String> {
        for (i, node) in self.nodes.iter().enumerate() {
            if node.next != config.scripts[i].len() || !node.client.is_idle() || node.user != User::Idle {
                return Err(format!("deadlock: node {i} stuck at {node:?}"));
            }
            if node.granted + node.refused != config.scripts[i].len() as u32 {
                return Err(format!(
                    "node {i}: {} grants and {} refusals for {} requests",
                    node.granted,
                    node.refused,
                    config.scripts[i].len()
                ));
            }
            let must_grant = config.scripts[i].iter().filter(|r| !r.try_only).count() as u32;
            if node.granted < must_grant {
                return Err(format!("node {i}: lost wake-up, {} of {must_grant} requests granted", node.granted));
            }
        }
        if !self.net.is_empty() {
            return Err(format!("messages left over: {:?}", self.net));
        }
        if self.lock != 0 || self.drain != 0 {
            return Err(format!("home not clean: lock {:?} drain {:#x}", LockWord::decode(self.lock), self.drain));
        }
        if !self.queue.is_empty() {
            return Err(format!("exclusive enqueues never granted: {:?}", self.queue));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Colour {
    OnStack,
    Done,
}

fn explore(config: &Config) -> Report {
    let mut report = Report::default();
    let mut colours: HashMap<u128, Colour> = HashMap::new();
    let start = World::new(config);
    colours.insert(fingerprint(&start), Colour::OnStack);
    let first = start.successors(config).unwrap_or_else(|e| panic!("{}: {e}", config.name));
    let mut stack: Vec<(u128, Vec<World>)> = vec![(fingerprint(&start), first)];
    if stack[0].1.is_empty() {
        start.check_terminal(config).unwrap_or_else(|e| panic!("{}: {e}", config.name));
    }
    report.states = 1;
    while let Some((_, children)) = stack.last_mut() {
        let Some(world) = children.pop() else {
            let (fp, _) = stack.pop().expect("non-empty stack");
            colours.insert(fp, Colour::Done);
            continue;
        };
        let fp = fingerprint(&world);
        match colours.get(&fp) {
            Some(Colour::OnStack) => panic!("{}: cycle (livelock) through {world:#?}", config.name),
            Some(Colour::Done) => continue,
            None => {}
        }
        report.states += 1;
        let (shared, _) = world.holders();
        report.max_shared_holders = report.max_shared_holders.max(shared);
        let children = world.successors(config).unwrap_or_else(|e| panic!("{}: {e}\nin {world:#?}", config.name));
        if children.is_empty() {
            report.terminals += 1;
            world.check_terminal(config).unwrap_or_else(|e| panic!("{}: {e}\nin {world:#?}", config.name));
        }
        colours.insert(fp, Colour::OnStack);
        stack.push((fp, children));
        report.max_depth = report.max_depth.max(stack.len());
    }
    if config.expect_overlap {
        assert!(report.max_shared_holders >= 2, "{}: shared holders never overlapped", config.name);
    } else {
        assert!(report.max_shared_holders <= 1 || config.kind == QueueKind::CoShed, "{}: overlap in DQNL", config.name);
    }
    assert!(report.terminals > 0, "{}: no terminal state", config.name);
    eprintln!("{}: {report:?}", config.name);
    report
}

fn check(name: &'static str, kind: QueueKind, scripts: Vec<Vec<Req>>, abandons: u8, expect_overlap: bool) -> Report {
    explore(&Config { name, kind, scripts, abandons, expect_overlap })
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
