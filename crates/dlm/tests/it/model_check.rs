//! Exhaustive model check of the N-CoShED (and DQNL) state machine,
//! recovery and breaks included.
//!
//! The explorer runs the real [`LockClient`] of every node against a model
//! home (three words: lock, drain, fence) and a model network in which any
//! sent message may be delivered next (no ordering at all, which is weaker
//! than the fabric's per-pair order). One step is one of:
//! - a node starts the next request of its script (or makes again a request
//!   a recovery aborted, as the runtime does);
//! - a node's outstanding atomic batch executes at the home (with
//!   `split_batches`, one of its atomics executes: other nodes' atomics
//!   interleave between the parts, as on `shm`, where the acquirer's thread
//!   executes a batch op by op);
//! - one message in flight is delivered, to a node with no batch
//!   outstanding (the driver feeds a batch's results before any other input);
//! - a holder releases (a revoked holder's release changes nothing: the
//!   runtime answers it `Broken` without touching the machine);
//! - a waiter gives up (abandons), within a per-run budget;
//! - a node breaks the lock ([`Input::Break`], an administrator's call
//!   there), within a per-run budget: the move's atomics and notices are
//!   the machine's own steps and interleave with everything else;
//! - a node **dies** (within a per-run budget): it takes no step any more,
//!   its outstanding batch never executes, messages to it vanish, and
//!   each message it had in flight may still arrive or be lost (a step of
//!   its own: a killed process loses what its writer threads had queued);
//! - the runtime's monitor tells a live node that the dead node is lost
//!   ([`Input::PeerLost`]): whenever the node waits for it by name (a
//!   predecessor, coordinator, coordinated shared holder, or a barrier's
//!   acknowledgement), and, for a request waiting for parties it cannot
//!   name, while the request's generation is not newer than the one the
//!   node died in (the runtime reports those after a delay, possibly
//!   spuriously: the model lets it, once per generation).
//!
//! Every reachable state is visited (depth-first, with a colour per state
//! fingerprint so a cycle would be found). Checked at every step:
//! - **mutual exclusion** among live, unrevoked holds of any generation:
//!   an exclusive grant finds no other holder, a shared grant no exclusive
//!   holder (abandoned grants count: they are held for an instant). This is
//!   what the barrier is for: a recovery keeps the holds of the generation
//!   it leaves, and no grant of the new one may overlap them;
//! - **FIFO among exclusives** of one generation: grants come in the order
//!   of the successful enqueue compare-and-swaps at the home (a move's swap
//!   is the first of its generation);
//! - **shared waits for queued exclusives**, in one generation: a shared
//!   grant comes after every exclusive (the barrier included) that enqueued
//!   before its fetch-and-add has released, and an exclusive is granted only
//!   after every shared request that enqueued before it was granted;
//! - **fencing tokens** strictly increase over every exclusive grant of the
//!   run, whatever its generation, and every move's **floor** lies above
//!   every earlier token and below every later one;
//! - one move per generation, no `Nack` (without restarts every message
//!   finds its request), no protocol violation reported by any client.
//!
//! Checked in every terminal state (no step enabled): every live node's
//! script is done and its client idle, no message is left, every request
//! was granted, refused or (by a break) revoked, and without breaks every
//! request of a live node was granted (or, if its waiter gave up, a
//! recovery ended it): **a death never costs a live node its request** (no
//! deadlock, no lost wake-up). Without deaths the home
//! words are back to free and idle; with one, all that may remain is the
//! dead node's own share. The state graph has no cycles, so every run ends
//! in a terminal state. Also checked per configuration: shared holders
//! **did overlap** in some state (where the script makes it possible), and,
//! where a death is explored, that some run did recover (a move happened).

use crate::explorer;

use explorer::{Req, E, S, TE, TS};
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_dlm::proto::{
    AbortReason, Action, AtomicOp, ClientState, Input, LockClient, LockMode, ProtoMsg, QueueKind, WordKind,
};
use tierstack_dlm::word::{generation_newer, DrainWord, LockWord};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum User {
    Idle,
    Waiting(Req),
    /// Holds in `mode` (as queued: DQNL holds every request exclusively),
    /// granted in lock-word generation `generation`.
    Holding(LockMode, u16),
    /// Held, and a break revoked it; its release returns `Broken`.
    Revoked,
    /// Gave up waiting; the request is still in the protocol.
    Gone,
    /// A recovery aborted the request before its grant: it is made again.
    Retry(Req),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct NodeState {
    client: LockClient,
    next: usize,
    /// The outstanding batch and the results of its parts executed so far.
    pending: Option<(Vec<AtomicOp>, Vec<u64>)>,
    user: User,
    /// For the current shared request: exclusive enqueues of the current
    /// generation that preceded its fetch-and-add.
    shared_mark: Option<u32>,
    granted: u32,
    refused: u32,
    /// Requests a break revoked while waiting.
    aborted: u32,
    /// Abandoned requests a recovery ended before their grant (nobody waited).
    dropped: u32,
    dead: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Envelope {
    from: u32,
    to: u32,
    generation: u16,
    msg: ProtoMsg,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    lock: u64,
    drain: u64,
    fence: u64,
    nodes: Vec<NodeState>,
    /// Messages in flight, sorted (a multiset).
    net: Vec<Envelope>,
    /// Ghost state of the lock word's current generation: exclusive
    /// enqueues not yet granted, in home order, and the counts the
    /// ordering checks use. Reset when a move changes the generation.
    queue: Vec<u32>,
    enqueues: u32,
    dequeues: u32,
    exclusive_done: u32,
    /// A barrier is held (by the node named) and not yet released.
    barrier: Option<u32>,
    last_token: u64,
    /// Generations some node moved the lock to.
    moves: Vec<u16>,
    /// The newest generation a break moved the lock to: every hold of an
    /// older generation is revoked from that moment (its holder learns it
    /// later, from the notice or at release).
    revoked_before: Option<u16>,
    /// The lock word's generation when the node died.
    died_in: Option<u16>,
    abandons_left: u8,
    breaks_left: u8,
    deaths_left: u8,
}

struct Config {
    name: &'static str,
    kind: QueueKind,
    scripts: Vec<Vec<Req>>,
    abandons: u8,
    expect_overlap: bool,
    /// Breaks per run.
    breaks: u8,
    /// Deaths per run.
    deaths: u8,
    /// Execute the parts of a batch as separate steps (shm executes a batch
    /// op by op on the caller's thread; an RDMA adapter may too).
    split_batches: bool,
}

fn queued_exclusively(kind: QueueKind, mode: LockMode) -> bool {
    kind == QueueKind::Dqnl || mode == LockMode::Exclusive
}

impl World {
    fn new(config: &Config) -> Self {
        let all: Arc<[NodeId]> = (0..config.scripts.len() as u32).map(NodeId).collect();
        let nodes = (0..config.scripts.len())
            .map(|i| NodeState {
                client: LockClient::new(NodeId(i as u32), config.kind, all.clone()),
                next: 0,
                pending: None,
                user: User::Idle,
                shared_mark: None,
                granted: 0,
                refused: 0,
                aborted: 0,
                dropped: 0,
                dead: false,
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
            barrier: None,
            last_token: 0,
            moves: Vec::new(),
            revoked_before: None,
            died_in: None,
            abandons_left: config.abandons,
            breaks_left: config.breaks,
            deaths_left: config.deaths,
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
        match op {
            AtomicOp::CompareSwap { word, expected, new } => {
                let w = self.word(word);
                let previous = *w;
                if previous == expected {
                    *w = new;
                }
                if word == WordKind::Lock && previous == expected {
                    let (before, after) = (LockWord::decode(previous), LockWord::decode(new));
                    if before.generation != after.generation {
                        // A move: the old generation's ghost queue is gone.
                        self.queue.clear();
                        self.enqueues = 0;
                        self.dequeues = 0;
                        self.exclusive_done = 0;
                        self.barrier = None;
                        for node in &mut self.nodes {
                            node.shared_mark = None;
                        }
                    }
                    let me = Some(NodeId(i as u32));
                    if after.tail == me && (before.tail != me || before.generation != after.generation) {
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

    /// The lock word's generation: the current one.
    fn generation(&self) -> u16 {
        LockWord::decode(self.lock).generation
    }

    /// Live, unrevoked holders: (shared, exclusive).
    fn holders(&self) -> (usize, usize) {
        let valid = |generation: u16| self.revoked_before.is_none_or(|b| !generation_newer(b, generation));
        let count = |mode| {
            self.nodes
                .iter()
                .filter(|n| !n.dead && matches!(n.user, User::Holding(m, g) if m == mode && valid(g)))
                .count()
        };
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
                Action::Send { msg: ProtoMsg::Nack, to, .. } => {
                    return Err(format!("node {i}: a message from node {} found no request", to.0));
                }
                Action::Send { to, generation, msg } => {
                    if generation_newer(generation, self.generation()) {
                        return Err(format!("node {i}: generation {generation} ahead of the lock word"));
                    }
                    if !self.nodes[to.0 as usize].dead {
                        self.post(Envelope { from: i as u32, to: to.0, generation, msg });
                    }
                }
                Action::Granted { mode, token, abandoned } => self.granted(kind, i, mode, token, abandoned)?,
                Action::WouldBlock => match self.nodes[i].user {
                    User::Waiting(req) | User::Retry(req) if req.try_only => {
                        self.nodes[i].user = User::Idle;
                        self.nodes[i].refused += 1;
                        self.nodes[i].shared_mark = None;
                    }
                    other => return Err(format!("node {i}: WouldBlock for {other:?}")),
                },
                Action::Aborted(reason) => self.aborted(i, reason)?,
                Action::Moved { generation, floor, revoke } => {
                    if self.moves.contains(&generation) {
                        return Err(format!("node {i}: a second move to generation {generation}"));
                    }
                    self.moves.push(generation);
                    if revoke && self.revoked_before.is_none_or(|b| generation_newer(generation, b)) {
                        self.revoked_before = Some(generation);
                    }
                    if floor <= self.last_token {
                        return Err(format!("node {i}: floor {floor} not above token {}", self.last_token));
                    }
                    self.last_token = floor;
                    // The mover holds the new generation: it is the first
                    // of its queue, and shared requests behind it wait.
                    if generation == self.generation() {
                        if self.queue.first() != Some(&(i as u32)) {
                            return Err(format!("node {i}: barrier not first in its queue {:?}", self.queue));
                        }
                        self.queue.remove(0);
                        self.dequeues += 1;
                        self.barrier = Some(i as u32);
                    }
                }
                Action::Idle => {
                    if !self.nodes[i].client.is_idle() {
                        return Err(format!("node {i}: Idle reported by a busy client"));
                    }
                    if self.nodes[i].user == User::Gone {
                        // An abandoned request a recovery ended: nobody waited for it.
                        self.nodes[i].user = User::Idle;
                        self.nodes[i].dropped += 1;
                    }
                }
            }
        }
        if self.barrier == Some(i as u32) && self.nodes[i].client.state().0 != ClientState::Barrier {
            self.barrier = None;
            self.exclusive_done += 1;
        }
        Ok(())
    }

    fn aborted(&mut self, i: usize, reason: AbortReason) -> Result<(), String> {
        let node = &mut self.nodes[i];
        node.shared_mark = None;
        node.user = match (reason, node.user) {
            (AbortReason::Recovered { .. }, User::Waiting(req) | User::Retry(req)) => User::Retry(req),
            (AbortReason::Revoked { .. }, User::Waiting(_) | User::Retry(_)) => {
                node.aborted += 1;
                User::Idle
            }
            (AbortReason::Revoked { .. }, User::Holding(..)) => User::Revoked,
            (reason, user) => return Err(format!("node {i}: {reason:?} for {user:?}")),
        };
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
        let generation = self.nodes[i].client.state().1;
        if self.revoked_before.is_some_and(|b| generation_newer(b, generation)) {
            // A grant of a generation a break revoked (its message overtook
            // the notice). Revoked from the start: only one without a token
            // can come through (shared; a DQNL shared request); one with a
            // token fails its confirmation at the fence.
            if token.is_some() {
                return Err(format!("node {i}: an exclusive grant of revoked generation {generation}"));
            }
            let node = &mut self.nodes[i];
            node.granted += 1;
            node.shared_mark = None;
            node.user = match (abandoned, node.user) {
                (true, User::Gone) => User::Idle,
                (false, User::Waiting(_) | User::Retry(_)) => User::Holding(mode, generation),
                (_, other) => return Err(format!("node {i}: revoked grant for {other:?}")),
            };
            return Ok(());
        }
        let (shared, exclusive) = self.holders();
        if exclusive_grant && shared + exclusive > 0 {
            return Err(format!("node {i}: exclusive grant while {shared} shared and {exclusive} exclusive hold"));
        }
        if !exclusive_grant && exclusive > 0 {
            return Err(format!("node {i}: shared grant while an exclusive holds"));
        }
        if generation == self.generation() {
            self.check_order(i, exclusive_grant)?;
        } else {
            // A grant of an older generation (its message overtook the
            // move's notice): valid, and checked for mutual exclusion above,
            // but outside the current generation's queue.
            self.nodes[i].shared_mark = None;
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
            if exclusive_grant && generation == self.generation() {
                self.exclusive_done += 1;
            }
        } else {
            if !matches!(node.user, User::Waiting(_) | User::Retry(_)) {
                return Err(format!("node {i}: grant for {:?}", node.user));
            }
            let mode = if exclusive_grant { LockMode::Exclusive } else { LockMode::Shared };
            node.user = User::Holding(mode, generation);
        }
        Ok(())
    }

    /// FIFO among exclusives and the order between shared and exclusive
    /// requests, within the current generation.
    fn check_order(&mut self, i: usize, exclusive_grant: bool) -> Result<(), String> {
        if exclusive_grant {
            if self.queue.first() != Some(&(i as u32)) {
                return Err(format!("node {i}: exclusive grant out of FIFO order; queue {:?}", self.queue));
            }
            self.queue.remove(0);
            // Every shared request that enqueued before this exclusive must
            // have been granted already.
            let position = self.dequeues;
            self.dequeues += 1;
            if let Some(j) = self.nodes.iter().position(|n| !n.dead && n.shared_mark.is_some_and(|m| m <= position)) {
                return Err(format!("node {i}: exclusive overtook node {j}'s earlier shared request"));
            }
        } else {
            let mark =
                self.nodes[i].shared_mark.take().ok_or_else(|| format!("node {i}: shared grant without an enqueue"))?;
            if self.exclusive_done < mark {
                return Err(format!("node {i}: shared grant before the {mark} exclusives queued ahead released"));
            }
        }
        Ok(())
    }

    /// Whether the monitor may report dead node `d` to live node `j` now.
    fn may_report_lost(&self, j: usize, d: usize) -> bool {
        let waits = self.nodes[j].client.waits();
        if waits.nodes.contains(&NodeId(d as u32)) {
            return true;
        }
        let request_generation = self.nodes[j].client.state().1;
        waits.unknown && self.died_in.is_some_and(|died| !generation_newer(request_generation, died))
    }

    fn successors(&self, config: &Config) -> Result<Vec<World>, String> {
        let kind = config.kind;
        let mut next = Vec::new();
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            if node.dead {
                continue;
            }
            let start = match node.user {
                User::Idle if node.next < config.scripts[i].len() => Some((config.scripts[i][node.next], true)),
                User::Retry(req) => Some((req, false)),
                _ => None,
            };
            if let Some((req, fresh)) = start.filter(|_| node.client.is_idle()) {
                let mut w = self.clone();
                if fresh {
                    w.nodes[i].next += 1;
                }
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
            match node.user {
                User::Holding(mode, generation) => {
                    let mut w = self.clone();
                    w.nodes[i].user = User::Idle;
                    if mode == LockMode::Exclusive && generation == self.generation() {
                        w.exclusive_done += 1;
                    }
                    w.feed(kind, i, Input::Release)?;
                    next.push(w);
                }
                User::Revoked => {
                    let mut w = self.clone();
                    w.nodes[i].user = User::Idle;
                    next.push(w);
                }
                _ => {}
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
            if node.pending.is_none() && self.breaks_left > 0 {
                let mut w = self.clone();
                w.breaks_left -= 1;
                w.feed(kind, i, Input::Break)?;
                next.push(w);
            }
            if self.deaths_left > 0 {
                let mut w = self.clone();
                w.deaths_left -= 1;
                w.died_in = Some(self.generation());
                w.nodes[i].dead = true;
                w.nodes[i].pending = None;
                w.nodes[i].shared_mark = None;
                w.net.retain(|e| e.to != i as u32);
                if w.barrier == Some(i as u32) {
                    w.barrier = None;
                }
                next.push(w);
            }
            if node.pending.is_none() {
                for d in (0..self.nodes.len()).filter(|&d| self.nodes[d].dead) {
                    if self.may_report_lost(i, d) {
                        let mut w = self.clone();
                        w.feed(kind, i, Input::PeerLost { node: NodeId(d as u32) })?;
                        if w != *self {
                            next.push(w);
                        }
                    }
                }
            }
        }
        for (k, envelope) in self.net.iter().enumerate() {
            if k > 0 && self.net[k - 1] == *envelope {
                continue; // identical message: same successor
            }
            if self.nodes[envelope.from as usize].dead {
                // A dead sender's message may be lost.
                let mut w = self.clone();
                w.net.remove(k);
                next.push(w);
            }
            if self.nodes[envelope.to as usize].pending.is_some() {
                // The driver feeds a batch's results before any other input
                // (the runtime executes it under the lock's cell mutex).
                continue;
            }
            let mut w = self.clone();
            w.net.remove(k);
            let input =
                Input::Message { from: NodeId(envelope.from), generation: envelope.generation, msg: envelope.msg };
            w.feed(kind, envelope.to as usize, input)?;
            next.push(w);
        }
        Ok(next)
    }

    fn check_terminal(&self, config: &Config) -> Result<(), String> {
        let died = self.nodes.iter().any(|n| n.dead);
        for (i, node) in self.nodes.iter().enumerate().filter(|(_, n)| !n.dead) {
            if node.next != config.scripts[i].len() || !node.client.is_idle() || node.user != User::Idle {
                return Err(format!("deadlock: node {i} stuck at {node:?}"));
            }
            if node.granted + node.refused + node.aborted + node.dropped != config.scripts[i].len() as u32 {
                return Err(format!(
                    "node {i}: {} grants, {} refusals, {} aborts and {} dropped for {} requests",
                    node.granted,
                    node.refused,
                    node.aborted,
                    node.dropped,
                    config.scripts[i].len()
                ));
            }
            let must_grant = config.scripts[i].iter().filter(|r| !r.try_only).count() as u32;
            if self.breaks_left == config.breaks && node.granted + node.dropped < must_grant {
                return Err(format!("node {i}: lost wake-up, {} of {must_grant} requests granted", node.granted));
            }
        }
        if !self.net.is_empty() {
            return Err(format!("messages left over: {:?}", self.net));
        }
        let word = LockWord::decode(self.lock);
        let drain = DrainWord::decode(self.drain);
        if !died {
            if !word.is_free() || drain != DrainWord::idle(self.generation()) {
                return Err(format!("home not clean: lock {word:?} drain {drain:?}"));
            }
            if !self.queue.is_empty() {
                return Err(format!("exclusive enqueues never granted: {:?}", self.queue));
            }
        } else {
            let dead = |n: Option<NodeId>| n.is_none_or(|n| self.nodes[n.0 as usize].dead);
            if !dead(word.tail) || !dead(drain.waiter) {
                return Err(format!("home holds a live node's residue: lock {word:?} drain {drain:?}"));
            }
        }
        Ok(())
    }
}

fn explore(config: &Config) {
    let mut max_shared_holders = 0;
    let mut moved = false;
    let explored = explorer::explore(
        World::new(config),
        |world| world.successors(config),
        |world| world.check_terminal(config),
        |world| {
            max_shared_holders = max_shared_holders.max(world.holders().0);
            moved |= !world.moves.is_empty();
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", config.name));
    if config.expect_overlap {
        assert!(max_shared_holders >= 2, "{}: shared holders never overlapped", config.name);
    } else {
        assert!(max_shared_holders <= 1 || config.kind == QueueKind::CoShed, "{}: overlap in DQNL", config.name);
    }
    if config.deaths + config.breaks > 0 {
        assert!(moved, "{}: no run moved the lock", config.name);
    }
    assert!(explored.terminals > 0, "{}: no terminal state", config.name);
    eprintln!("{}: {explored:?}, {max_shared_holders} shared holders at most", config.name);
}

fn check(name: &'static str, kind: QueueKind, scripts: Vec<Vec<Req>>, abandons: u8, expect_overlap: bool) {
    explore(&Config { name, kind, scripts, abandons, expect_overlap, breaks: 0, deaths: 0, split_batches: false })
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

fn config(name: &'static str, scripts: Vec<Vec<Req>>) -> Config {
    Config {
        name,
        kind: QueueKind::CoShed,
        scripts,
        abandons: 0,
        expect_overlap: false,
        breaks: 0,
        deaths: 0,
        split_batches: false,
    }
}

#[test]
fn batches_split_into_their_parts() {
    check_with(Config { split_batches: true, ..config("3n EE/E/S split", vec![vec![E, E], vec![E], vec![S]]) });
    check_with(Config {
        abandons: 1,
        split_batches: true,
        ..config("3n ES/SE/TE split abandon", vec![vec![E, S], vec![S, E], vec![TE]])
    });
}

/// An administrator's break from any node at any point, its steps
/// interleaved with everything else: old-generation requests end (granted,
/// revoked or refused), nothing deadlocks, the home ends free in the new
/// generation, and tokens stay increasing across the floor. `2n SE/E`
/// found (with the earlier break) a deadlock: a node that learned the new
/// generation from the drain word, then enqueued in the old lock word, was
/// never aborted.
#[test]
fn break_lock_with_atomic_batches() {
    check_with(Config { breaks: 1, ..config("2n SE/E break", vec![vec![S, E], vec![E]]) });
    check_with(Config { breaks: 1, ..config("2n EE/E break", vec![vec![E, E], vec![E]]) });
    check_with(Config { breaks: 1, ..config("3n E/E/S break", vec![vec![E], vec![E], vec![S]]) });
    check_with(Config {
        kind: QueueKind::Dqnl,
        breaks: 1,
        split_batches: true,
        ..config("dqnl 2n SE/E break split", vec![vec![S, E], vec![E]])
    });
}

/// The same with every batch split into its parts: the uncontended
/// acquire's token fetch-and-add may come after the break's fence step, and
/// must then not hold.
#[test]
fn break_lock_with_split_batches() {
    check_with(Config { breaks: 1, split_batches: true, ..config("2n SE/E break split", vec![vec![S, E], vec![E]]) });
    check_with(Config { breaks: 1, split_batches: true, ..config("2n EE/E break split", vec![vec![E, E], vec![E]]) });
}

/// A node dies at any point: holding (exclusive or shared, group 0 or
/// coordinated), queued (as predecessor, coordinator or drain waiter), in
/// the middle of a handoff, or moving the lock itself; its in-flight
/// messages may be lost. The survivors recover every request: live holds
/// are kept and never overlap a grant of the new generation, tokens keep
/// increasing, and nothing deadlocks.
#[test]
fn a_dead_holder_or_waiter_is_recovered() {
    check_with(Config { deaths: 1, ..config("2n E/E death", vec![vec![E], vec![E]]) });
    check_with(Config { deaths: 1, ..config("2n S/E death", vec![vec![S], vec![E]]) });
    check_with(Config { deaths: 1, ..config("3n E/E/E death", vec![vec![E], vec![E], vec![E]]) });
    check_with(Config { deaths: 1, expect_overlap: true, ..config("3n E/S/S death", vec![vec![E], vec![S], vec![S]]) });
    check_with(Config { deaths: 1, ..config("3n S/E/S death", vec![vec![S], vec![E], vec![S]]) });
}

/// Deaths with more requests per node, and with split batches (a node may
/// die between the two atomics of its batch).
#[test]
fn a_death_among_repeated_requests_and_split_batches() {
    check_with(Config { deaths: 1, ..config("2n EE/SE death", vec![vec![E, E], vec![S, E]]) });
    check_with(Config {
        deaths: 1,
        split_batches: true,
        ..config("3n E/E/S death split", vec![vec![E], vec![E], vec![S]])
    });
    check_with(Config {
        deaths: 1,
        kind: QueueKind::Dqnl,
        ..config("dqnl 3n S/E/S death", vec![vec![S], vec![E], vec![S]])
    });
}

/// A death and a waiter that gives up, and a death and a break.
#[test]
fn a_death_with_an_abandon_or_a_break() {
    check_with(Config { deaths: 1, abandons: 1, ..config("3n E/E/S death abandon", vec![vec![E], vec![E], vec![S]]) });
    check_with(Config { deaths: 1, breaks: 1, ..config("2n E/SE death break", vec![vec![E], vec![S, E]]) });
}
