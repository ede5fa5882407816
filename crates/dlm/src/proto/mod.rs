//! The N-CoShED (and DQNL) protocol as a pure state machine: inputs in,
//! actions out, no I/O, no clock.
//!
//! One [`LockClient`] is one node's view of one lock. It holds at most one
//! request at a time (the node's queue entry: the lock word names queue
//! entries by node); the runtime queues further local callers until the
//! client is idle again. The client asks for remote atomics on the lock's
//! home words ([`Action::Atomic`]; the driver must deliver the results as
//! [`Input::AtomicDone`] before any other input) and for messages to other
//! nodes ([`Action::Send`]); it reports [`Action::Granted`] when the user
//! may enter the critical section and [`Action::Idle`] when its request is
//! completely finished, including the work a released exclusive still does
//! for the shared requests behind it.
//!
//! **Recovery** is part of the machine, so the model check explores it with
//! everything else. The runtime tells the client that a node is dead (its
//! process ended, or its lease expired) with [`Input::PeerLost`]; a client
//! blocked on that node (or blocked on parties it cannot name) then *moves
//! the lock*: it swaps the lock word to the next generation with itself as
//! the tail, resets the drain word, moves the fence word, and tells every
//! node ([`ProtoMsg::Notice`]). It holds the new generation as a **barrier**
//! until every other node has answered [`ProtoMsg::Ack`] (or is itself
//! lost), then releases it like any exclusive hold. A node acknowledges once
//! it holds nothing of an older generation: a waiting request is aborted
//! ([`AbortReason::Recovered`]: the runtime makes it again, in the new
//! generation), a hold is kept until its user releases it. So a recovery
//! never revokes a live hold, and no grant of the new generation overlaps
//! one of the old. An administrator's [`Input::Break`] moves the lock the
//! same way but revokes every hold of older generations
//! ([`AbortReason::Revoked`]) and waits for nobody.
//!
//! The protocol itself is described in the crate essay (`lib.rs`); the
//! words in [`crate::word`]. The explorer in `tests/model_check.rs` runs this
//! very code over every interleaving of small configurations.
//!
//! The machine lives in three files: this one holds what crosses its
//! boundary (inputs, actions, messages, states), the client's state and its
//! public surface with the helpers every transition uses; `queue.rs` holds
//! the queue protocol proper (enqueue, grants, hand-overs, releases, and
//! the dispatch of messages); `recovery.rs` holds moving the lock to a new
//! generation (recovery and break), the barrier and the notices.

mod queue;
mod recovery;
#[cfg(test)]
mod tests;

use crate::word::{generation_newer, LockWord};
use std::sync::Arc;
use tierstack_base::NodeId;

/// The two lock modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockMode {
    /// Any number of shared holders may overlap.
    Shared,
    /// An exclusive holder is alone.
    Exclusive,
}

impl LockMode {
    /// The mode's name in reports and command lines: `shared`, `exclusive`.
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Shared => "shared",
            LockMode::Exclusive => "exclusive",
        }
    }
}

impl std::str::FromStr for LockMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shared" => Ok(LockMode::Shared),
            "exclusive" => Ok(LockMode::Exclusive),
            other => Err(format!("unknown mode {other:?} (shared or exclusive)")),
        }
    }
}

/// Which distributed-queue protocol a client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// N-CoShED: exclusive requests enqueue by compare-and-swap, shared ones by fetch-and-add.
    CoShed,
    /// DQNL: the distributed queue without a shared mode; shared requests are queued as exclusive.
    Dqnl,
}

/// Which home word an atomic operates on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WordKind {
    Lock,
    Drain,
    Fence,
}

/// One remote atomic on the lock's home.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Yields the previous value; swapped iff it equals `expected`.
    CompareSwap { word: WordKind, expected: u64, new: u64 },
    /// Yields the previous value.
    FetchAdd { word: WordKind, delta: u64 },
}

/// How the holder of a shared grant releases it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SharedVia {
    /// A group-0 holder: it decrements the lock word's shared count (or, if an
    /// exclusive has enqueued meanwhile, counts itself into the drain word).
    Group0,
    /// It sends `SharedRelease` to the exclusive requester it queued behind.
    Coordinator,
}

/// The protocol's messages. Each travels with the lock id and the
/// generation of the lock word it belongs to (see [`crate::msg`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtoMsg {
    /// Exclusive requester → the tail it replaced: "I come after you, and
    /// `shared` shared requests were enqueued between us."
    Successor { shared: u32 },
    /// Shared requester → the tail it saw: "grant me when you are done."
    SharedRequest,
    /// Predecessor → its exclusive successor: the lock is yours.
    GrantExclusive,
    /// A released exclusive → a shared requester behind it.
    GrantShared { via: SharedVia },
    /// A coordinated shared holder → the exclusive it queued behind.
    SharedRelease,
    /// The last group-0 releaser → the exclusive registered in the drain word.
    Drained,
    /// The node that moved the lock to the message's generation → every
    /// other node. `revoke`: an administrator's break (holds of older
    /// generations are revoked, nobody answers); otherwise a recovery,
    /// which waits for an [`ProtoMsg::Ack`] from each node.
    Notice { revoke: bool },
    /// → the mover of the message's generation: this node holds nothing of
    /// an older generation any more.
    Ack,
    /// → the sender of a message of the current generation that found no
    /// request here (this node restarted, or reset its request after losing
    /// the home): whoever waits for this node will wait forever.
    Nack,
}

/// Why a request ended without the user releasing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// An administrator's break moved the lock to `generation`: the request
    /// or hold is revoked (its user sees `Broken`).
    Revoked { generation: u16 },
    /// A recovery moved the lock past the request's generation before it was
    /// granted: the runtime makes the request again, in the new generation.
    Recovered { generation: u16 },
}

/// What the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Execute these atomics as one batch on the home and feed the previous
    /// values back as [`Input::AtomicDone`] before anything else.
    Atomic(Vec<AtomicOp>),
    /// Send `msg` (about this lock, in `generation`) to `to`.
    Send { to: NodeId, generation: u16, msg: ProtoMsg },
    /// The request is granted. `token` is the fencing token of an exclusive
    /// grant that asked for one. `abandoned` grants were given up by their
    /// caller: they are released in the same step and nobody is told.
    Granted { mode: LockMode, token: Option<u64>, abandoned: bool },
    /// A try-acquire found the lock unavailable; nothing was enqueued.
    WouldBlock,
    /// The request ended without a release (its waiter or holder must be told).
    Aborted(AbortReason),
    /// This node moved the lock to `generation` (a recovery, or with
    /// `revoke` a break) and holds it as a barrier; `floor` is the fence
    /// word the move left: every token fetched before is below it, every
    /// later one above.
    Moved { generation: u16, floor: u64, revoke: bool },
    /// The client holds no request any more; a new one may start.
    Idle,
}

/// What happened to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// Start a request. `try_only` never waits: it succeeds only if the lock
    /// is available at once and otherwise leaves no trace. `fencing` asks for
    /// a fencing token with an exclusive grant.
    Acquire { mode: LockMode, try_only: bool, fencing: bool },
    /// The previous values of the last [`Action::Atomic`] batch, in order.
    AtomicDone { results: [u64; 2], len: usize },
    /// A protocol message from `from`.
    Message { from: NodeId, generation: u16, msg: ProtoMsg },
    /// The user leaves the critical section.
    Release,
    /// The user stopped waiting (timeout): the request stays queued and is
    /// released the moment it is granted.
    Abandon,
    /// The runtime judged `node` dead: its process ended, or its lease
    /// expired. A client blocked on it recovers the lock; a barrier stops
    /// waiting for its acknowledgement.
    PeerLost { node: NodeId },
    /// An administrator breaks the lock from this node: whatever this
    /// node's request was is revoked, and the lock moves to a new
    /// generation with every older hold revoked.
    Break,
    /// Re-homing: this node makes the lock's slot at its new home usable.
    /// The slot's lock word is the fenced `word`; the machine moves
    /// it to the next generation like a recovery (barrier, notices, a
    /// fencing floor) and releases it once every other node has
    /// acknowledged or is lost. Only fed to an idle client of a fresh cell.
    Rehome { word: u64 },
}

/// The client was driven outside the protocol: a bug or a peer speaking
/// another protocol. The runtime logs it; the model checker fails on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("protocol violation at {node} in {phase}: {what}")]
pub struct ProtocolViolation {
    pub node: NodeId,
    pub phase: &'static str,
    pub what: String,
}

/// Shared requests an exclusive request has collected, and its successor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Group {
    /// Shared requesters that messaged us and are not yet granted, in arrival order.
    waiting: Vec<NodeId>,
    /// Shared requests granted by us.
    granted: u32,
    /// Coordinated shared holders that released back to us.
    released: u32,
    /// Coordinated shared holders granted by us that have not released yet.
    holding: Vec<NodeId>,
    /// Our successor and the number of shared requests enqueued between us.
    successor: Option<(NodeId, u32)>,
}

impl Group {
    fn received(&self) -> u32 {
        self.granted.saturating_add(self.waiting.len() as u32)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    // ---- exclusive ----
    /// Enqueue compare-and-swap in flight (`first`: the batch also fetched a token).
    Enqueue {
        expected: u64,
        first: bool,
    },
    /// Successor message sent; waiting for `GrantExclusive`.
    WaitPredecessor {
        predecessor: NodeId,
    },
    /// Registering for `target` group-0 holders in the drain word.
    RegisterDrain {
        expected: u64,
        target: u32,
    },
    /// Registered; waiting for `Drained`.
    WaitDrain,
    /// Granted; fetching the fencing token (which confirms the grant).
    FetchToken,
    HoldExclusive,
    /// Released with no known successor: trying to hand our shared group to group 0.
    Convert {
        expected: u64,
    },
    /// Converted: our `total` shared requesters are group-0 holders; grant
    /// each as its request arrives.
    HandoffGroup0 {
        total: u32,
    },
    /// A successor exists: grant our shared requesters, collect their
    /// releases, then grant the successor.
    HandoffCoordinated,
    // ---- shared ----
    /// Shared fetch-and-add in flight.
    SharedAdd,
    /// Try-acquire compare-and-swap in flight.
    SharedTry {
        expected: u64,
    },
    WaitShared {
        coordinator: NodeId,
    },
    /// Holding shared; released to `coordinator`, or (none) as a group-0 holder.
    HoldShared {
        coordinator: Option<NodeId>,
    },
    /// Group-0 release: decrementing the shared count.
    ReleaseWord {
        expected: u64,
    },
    /// Group-0 release after an exclusive enqueued: counting into the drain word.
    ReleaseDrain {
        expected: u64,
    },
    // ---- moving the lock (recovery, break) ----
    /// Swapping the lock word of generation `from` for the next one, with
    /// this node as the tail.
    MoveLock {
        expected: u64,
        from: u16,
    },
    /// Resetting the drain word to the new generation.
    MoveDrain {
        expected: u64,
    },
    /// Moving the fence word to the new generation.
    MoveFence {
        expected: u64,
    },
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Enqueue { .. } => "Enqueue",
            Phase::WaitPredecessor { .. } => "WaitPredecessor",
            Phase::RegisterDrain { .. } => "RegisterDrain",
            Phase::WaitDrain => "WaitDrain",
            Phase::FetchToken => "FetchToken",
            Phase::HoldExclusive => "HoldExclusive",
            Phase::Convert { .. } => "Convert",
            Phase::HandoffGroup0 { .. } => "HandoffGroup0",
            Phase::HandoffCoordinated => "HandoffCoordinated",
            Phase::SharedAdd => "SharedAdd",
            Phase::SharedTry { .. } => "SharedTry",
            Phase::WaitShared { .. } => "WaitShared",
            Phase::HoldShared { .. } => "HoldShared",
            Phase::ReleaseWord { .. } => "ReleaseWord",
            Phase::ReleaseDrain { .. } => "ReleaseDrain",
            Phase::MoveLock { .. } => "MoveLock",
            Phase::MoveDrain { .. } => "MoveDrain",
            Phase::MoveFence { .. } => "MoveFence",
        }
    }

    fn is_hold(self) -> bool {
        matches!(self, Phase::HoldExclusive | Phase::HoldShared { .. })
    }
}

/// Whose request it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Role {
    /// A user's acquire.
    User,
    /// This node moving the lock and then holding the new generation as a
    /// barrier until every node in `pending` has acknowledged or is lost.
    Mover { revoke: bool, pending: Vec<NodeId> },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Request {
    /// The mode the user asked for (DQNL queues shared requests as exclusive).
    mode: LockMode,
    try_only: bool,
    fencing: bool,
    abandoned: bool,
    /// The lock word generation this request lives in.
    generation: u16,
    phase: Phase,
    group: Group,
    role: Role,
}

impl Request {
    fn is_user_hold(&self) -> bool {
        self.role == Role::User && self.phase.is_hold()
    }

    /// A user still waits for this request's grant.
    fn has_waiting_user(&self) -> bool {
        self.role == Role::User && !self.abandoned && is_waiting_phase(self.phase)
    }
}

fn is_waiting_phase(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::Enqueue { .. }
            | Phase::WaitPredecessor { .. }
            | Phase::RegisterDrain { .. }
            | Phase::WaitDrain
            | Phase::FetchToken
            | Phase::SharedAdd
            | Phase::SharedTry { .. }
            | Phase::WaitShared { .. }
    )
}

/// Where a waiting request is blocked, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedOn {
    /// Waiting for a message from this node.
    Node(NodeId),
    /// Waiting for group-0 shared holders (unknown nodes) to release.
    SharedHolders,
    /// An atomic or local step is in progress.
    Nothing,
}

/// Whom a client waits for before it can go on, for the runtime's monitor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waits {
    /// Nodes a message is awaited from (a predecessor, a coordinator, a
    /// coordinated shared holder's release, a barrier's acknowledgements).
    pub nodes: Vec<NodeId>,
    /// Also waits for parties it cannot name: group-0 shared holders, shared
    /// requests or a successor counted at the home whose messages have not
    /// arrived. The runtime reports a lost node for these only after a delay.
    pub unknown: bool,
}

/// A client's state in one word, for status tables and diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientState {
    Idle,
    /// A user's request waits (`peer`: the node it waits for, if one).
    Waiting {
        mode: LockMode,
    },
    Holding {
        mode: LockMode,
    },
    /// Released; still passing the lock on.
    Releasing,
    /// Moving the lock to a new generation.
    Moving,
    /// Holding a new generation as a barrier, waiting for acknowledgements.
    Barrier,
}

/// One node's protocol state for one lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockClient {
    node: NodeId,
    kind: QueueKind,
    /// Every node that may use the lock (this one included): a barrier waits
    /// for each other one's acknowledgement.
    nodes: Arc<[NodeId]>,
    /// The newest lock word generation this node has seen.
    generation: u16,
    request: Option<Request>,
    /// Acknowledgements owed, per (mover, generation), once the hold of an
    /// older generation that a recovery kept ends.
    owed: Vec<(NodeId, u16)>,
    /// The generation of a request [`LockClient::reset`] forgot. Messages
    /// meant for it may still come, and would be taken for a later request
    /// of the same generation; so before its next request this node moves
    /// the lock past that generation, and they are all dropped.
    tainted: Option<u16>,
}

type Out = Vec<Action>;
type Step = Result<(), ProtocolViolation>;

impl LockClient {
    /// The client of `node`; `nodes` are every node that may use the lock.
    pub fn new(node: NodeId, kind: QueueKind, nodes: Arc<[NodeId]>) -> Self {
        Self { node, kind, nodes, generation: 0, request: None, owed: Vec::new(), tainted: None }
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The newest generation seen.
    pub fn generation(&self) -> u16 {
        self.generation
    }

    /// No request is in progress: a new one may start.
    pub fn is_idle(&self) -> bool {
        self.request.is_none()
    }

    /// The user holds the lock (granted, not yet released).
    pub fn is_holding(&self) -> bool {
        self.request.as_ref().is_some_and(Request::is_user_hold)
    }

    /// A request is in progress whose user is still waiting for its grant.
    pub fn is_waiting(&self) -> bool {
        self.request.as_ref().is_some_and(Request::has_waiting_user)
    }

    /// What a waiting request is blocked on.
    pub fn blocked_on(&self) -> BlockedOn {
        match self.request.as_ref().map(|r| r.phase) {
            Some(Phase::WaitPredecessor { predecessor }) => BlockedOn::Node(predecessor),
            Some(Phase::WaitShared { coordinator }) => BlockedOn::Node(coordinator),
            Some(Phase::WaitDrain) => BlockedOn::SharedHolders,
            _ => BlockedOn::Nothing,
        }
    }

    /// Whom the client waits for (see [`Waits`]); empty when it waits for
    /// nobody (idle, holding, or an atomic in progress).
    pub fn waits(&self) -> Waits {
        let Some(request) = self.request.as_ref() else { return Waits::default() };
        match (&request.role, request.phase) {
            (Role::Mover { pending, .. }, Phase::HoldExclusive) => Waits { nodes: pending.clone(), unknown: false },
            (_, Phase::WaitPredecessor { predecessor }) => Waits { nodes: vec![predecessor], unknown: false },
            (_, Phase::WaitShared { coordinator }) => Waits { nodes: vec![coordinator], unknown: false },
            (_, Phase::WaitDrain | Phase::HandoffGroup0 { .. }) => Waits { nodes: Vec::new(), unknown: true },
            (_, Phase::HandoffCoordinated) => {
                let group = &request.group;
                let all_arrived = group.successor.is_some_and(|(_, shared)| group.received() >= shared);
                Waits { nodes: group.holding.clone(), unknown: !all_arrived }
            }
            _ => Waits::default(),
        }
    }

    /// The client's state, the generation of its request (or the newest
    /// seen) and the node it waits for, if one.
    pub fn state(&self) -> (ClientState, u16, Option<NodeId>) {
        let Some(request) = self.request.as_ref() else { return (ClientState::Idle, self.generation, None) };
        let peer = match self.blocked_on() {
            BlockedOn::Node(node) => Some(node),
            _ => None,
        };
        let state = match (&request.role, request.phase) {
            (Role::Mover { .. }, Phase::MoveLock { .. } | Phase::MoveDrain { .. } | Phase::MoveFence { .. }) => {
                ClientState::Moving
            }
            (Role::Mover { .. }, Phase::HoldExclusive) => ClientState::Barrier,
            (_, phase) if phase.is_hold() && request.role == Role::User => ClientState::Holding { mode: request.mode },
            _ if request.has_waiting_user() => ClientState::Waiting { mode: request.mode },
            _ => ClientState::Releasing,
        };
        (state, request.generation, peer)
    }

    /// The barrier this client holds: its generation and the nodes whose
    /// acknowledgement it still waits for (the runtime resends them the
    /// notice now and then, in case it was lost).
    pub fn barrier(&self) -> Option<(u16, &[NodeId])> {
        match self.request.as_ref() {
            Some(Request {
                role: Role::Mover { revoke: false, pending },
                phase: Phase::HoldExclusive,
                generation,
                ..
            }) if !pending.is_empty() => Some((*generation, pending)),
            _ => None,
        }
    }

    /// Forgets the request: the driver lost an atomic's result (the home is
    /// unreachable) and cannot tell whether it applied. If the lock word
    /// still names this node, whoever queues behind it is answered `Nack`
    /// and recovers the lock; this node's own next request first moves the
    /// lock past the forgotten request's generation (see `tainted`).
    pub fn reset(&mut self) {
        if let Some(request) = self.request.take() {
            self.tainted = Some(request.generation);
        }
        self.owed.clear();
    }

    /// [`LockClient::reset`], returning the acknowledgements the forgotten
    /// request still owed (per mover and generation): the runtime sends
    /// them, so a barrier waiting for this node does not wait forever.
    pub fn reset_owing(&mut self) -> Vec<(NodeId, u16)> {
        let owed = std::mem::take(&mut self.owed);
        self.reset();
        owed
    }

    /// Feeds one input; appends the resulting actions to `out`.
    pub fn handle(&mut self, input: Input, out: &mut Out) -> Step {
        match input {
            Input::Acquire { mode, try_only, fencing } => self.start(mode, try_only, fencing, out),
            Input::AtomicDone { results, len } => self.atomic_done(&results[..len.min(2)], out),
            Input::Message { from, generation, msg } => self.message(from, generation, msg, out),
            Input::Release => self.release(out),
            Input::Abandon => {
                if let Some(request) = self.request.as_mut() {
                    request.abandoned = true;
                }
                Ok(())
            }
            Input::PeerLost { node } => self.peer_lost(node, out),
            Input::Break => self.start_move(true, None, out),
            Input::Rehome { word } => {
                if self.request.is_some() {
                    return Err(self.violation("a re-homing move while a request is in progress"));
                }
                // The move starts from the fenced word (its first
                // compare-and-swap expects it); a move that finds another
                // generation there stands down (another node moved the slot
                // first).
                self.generation = LockWord::decode(word).generation;
                self.start_move(false, Some(word), out)
            }
        }
    }

    fn violation(&self, what: impl Into<String>) -> ProtocolViolation {
        let phase = self.request.as_ref().map_or("Idle", |r| r.phase.name());
        ProtocolViolation { node: self.node, phase, what: what.into() }
    }

    /// Adopts the generation of a lock word just read, if it is newer.
    fn adopt_generation(&mut self, seen: &LockWord) {
        if generation_newer(seen.generation, self.generation) {
            self.generation = seen.generation;
        }
    }

    /// The word an atomic of the current request returned, or `None` if the
    /// lock moved to another generation meanwhile (now observed).
    fn word_of_this_generation(&mut self, previous: u64, out: &mut Out) -> Result<Option<LockWord>, ProtocolViolation> {
        let seen = LockWord::decode(previous);
        Ok(self.of_this_generation(seen.generation, out)?.then_some(seen))
    }

    /// True if `generation` (read from a lock or drain word) is the current
    /// request's; otherwise only a move can have changed it, and the move
    /// is observed.
    fn of_this_generation(&mut self, generation: u16, out: &mut Out) -> Result<bool, ProtocolViolation> {
        if generation != self.req()?.generation {
            self.observe_generation(generation, out);
            return Ok(false);
        }
        Ok(true)
    }

    /// Adopts a newer generation: a request of an older one is over, unless
    /// it is a user's hold (a recovery keeps those; only a revoking notice
    /// ends them).
    ///
    /// The request is compared with `generation` itself, not with the
    /// newest generation seen: a node can learn the new generation from the
    /// drain word (which a move resets) and then still enqueue in the old
    /// lock word before the move swaps it; the move's notice must abort
    /// that request although it brings no news to the node.
    fn observe_generation(&mut self, generation: u16, out: &mut Out) {
        if generation_newer(generation, self.generation) {
            self.generation = generation;
        }
        let superseded =
            self.request.as_ref().is_some_and(|r| generation_newer(generation, r.generation) && !r.is_user_hold());
        if superseded {
            self.end_request(AbortReason::Recovered { generation }, out);
        }
    }

    /// Ends the request without a release: its waiting user (if any) is
    /// told `reason`, a revoked hold is told so too, and owed
    /// acknowledgements go out once no hold is left.
    fn end_request(&mut self, reason: AbortReason, out: &mut Out) {
        let Some(request) = self.request.take() else { return };
        let tell_user = match reason {
            AbortReason::Revoked { .. } => request.has_waiting_user() || request.is_user_hold(),
            AbortReason::Recovered { .. } => request.has_waiting_user(),
        };
        if tell_user {
            out.push(Action::Aborted(reason));
        }
        self.flush_owed(out);
        out.push(Action::Idle);
    }

    fn flush_owed(&mut self, out: &mut Out) {
        for (to, generation) in self.owed.drain(..) {
            out.push(Action::Send { to, generation, msg: ProtoMsg::Ack });
        }
    }

    /// The request and its phase; only called where a request exists.
    fn req(&mut self) -> Result<&mut Request, ProtocolViolation> {
        match self.request.as_mut() {
            Some(request) => Ok(request),
            None => Err(ProtocolViolation { node: self.node, phase: "Idle", what: "no request".into() }),
        }
    }

    fn set_phase(&mut self, phase: Phase) -> Step {
        self.req()?.phase = phase;
        Ok(())
    }

    fn finish(&mut self, out: &mut Out) {
        self.request = None;
        out.push(Action::Idle);
    }
}
