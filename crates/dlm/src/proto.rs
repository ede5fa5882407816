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

use crate::word::{fencing_token, generation_newer, DrainWord, FenceWord, LockWord};
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
            Input::Break => self.start_move(true, out),
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

    fn start(&mut self, mode: LockMode, try_only: bool, fencing: bool, out: &mut Out) -> Step {
        if self.request.is_some() {
            return Err(self.violation("acquire while a request is in progress"));
        }
        if let Some(tainted) = self.tainted {
            if generation_newer(self.generation, tainted) {
                self.tainted = None;
            } else {
                // Move the lock past the forgotten request first; the user's
                // request is made again after the move.
                out.push(Action::Aborted(AbortReason::Recovered { generation: tainted.wrapping_add(1) }));
                self.tainted = None;
                return self.start_move(false, out);
            }
        }
        let generation = self.generation;
        let queued_as = if self.kind == QueueKind::Dqnl { LockMode::Exclusive } else { mode };
        let fencing = fencing && mode == LockMode::Exclusive;
        let (phase, ops) = match queued_as {
            LockMode::Exclusive => {
                let expected = LockWord::free(generation).encode();
                let mut ops = vec![self.enqueue_op(expected)];
                if fencing {
                    // Fetched in the same batch: the uncontended acquire is one
                    // round trip. Wasted (a gap in the tokens) if we must queue.
                    ops.push(AtomicOp::FetchAdd { word: WordKind::Fence, delta: crate::word::FENCE_UNIT });
                }
                (Phase::Enqueue { expected, first: true }, ops)
            }
            LockMode::Shared if try_only => {
                let expected = LockWord::free(generation).encode();
                (Phase::SharedTry { expected }, vec![shared_try_op(expected)])
            }
            LockMode::Shared => (Phase::SharedAdd, vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }]),
        };
        self.request = Some(Request {
            mode,
            try_only,
            fencing,
            abandoned: false,
            generation,
            phase,
            group: Group::default(),
            role: Role::User,
        });
        out.push(Action::Atomic(ops));
        Ok(())
    }

    fn enqueue_op(&self, expected: u64) -> AtomicOp {
        let seen = LockWord::decode(expected);
        let new = LockWord { generation: seen.generation, tail: Some(self.node), shared: 0 }.encode();
        AtomicOp::CompareSwap { word: WordKind::Lock, expected, new }
    }

    fn atomic_done(&mut self, results: &[u64], out: &mut Out) -> Step {
        let Some(request) = self.request.as_ref() else {
            return Err(self.violation("atomic result without a request"));
        };
        let Some(&previous) = results.first() else {
            return Err(self.violation("empty atomic result"));
        };
        match request.phase {
            Phase::Enqueue { expected, first } => {
                let fence = (first && request.fencing).then(|| results.get(1).copied()).flatten();
                self.enqueue_done(expected, previous, fence, out)
            }
            Phase::RegisterDrain { expected, target } => self.register_done(expected, target, previous, out),
            Phase::FetchToken => self.confirm(previous, out),
            Phase::Convert { expected } => self.convert_done(expected, previous, out),
            Phase::SharedAdd => self.shared_add_done(previous, out),
            Phase::SharedTry { expected } => self.shared_try_done(expected, previous, out),
            Phase::ReleaseWord { expected } => self.release_word_done(expected, previous, out),
            Phase::ReleaseDrain { expected } => self.release_drain_done(expected, previous, out),
            Phase::MoveLock { expected, from } => self.move_lock_done(expected, from, previous, out),
            Phase::MoveDrain { expected } => self.move_drain_done(expected, previous, out),
            Phase::MoveFence { expected } => self.move_fence_done(expected, previous, out),
            _ => Err(self.violation("atomic result in a phase that issued none")),
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

    fn enqueue_done(&mut self, expected: u64, previous: u64, fence: Option<u64>, out: &mut Out) -> Step {
        let seen = LockWord::decode(previous);
        self.adopt_generation(&seen);
        let request = self.req()?;
        if previous != expected {
            if request.try_only && !seen.is_free() {
                self.request = None;
                out.push(Action::WouldBlock);
                out.push(Action::Idle);
                return Ok(());
            }
            if request.generation != seen.generation {
                // Anything collected for an older generation is stale.
                request.group = Group::default();
                request.generation = seen.generation;
            }
            request.phase = Phase::Enqueue { expected: previous, first: false };
            out.push(Action::Atomic(vec![self.enqueue_op(previous)]));
            return Ok(());
        }
        let generation = seen.generation;
        match (seen.tail, seen.shared) {
            (None, 0) => self.granted_exclusive(fence, out),
            (None, target) => {
                let expected = DrainWord::idle(generation).encode();
                self.set_phase(Phase::RegisterDrain { expected, target })?;
                out.push(Action::Atomic(vec![self.register_op(expected, target)]));
                Ok(())
            }
            (Some(predecessor), shared) => {
                if predecessor == self.node {
                    return Err(self.violation("enqueued behind itself"));
                }
                self.set_phase(Phase::WaitPredecessor { predecessor })?;
                out.push(Action::Send { to: predecessor, generation, msg: ProtoMsg::Successor { shared } });
                Ok(())
            }
        }
    }

    fn register_op(&self, expected: u64, target: u32) -> AtomicOp {
        let (new, _) = DrainWord::decode(expected).after_register(self.node, target);
        AtomicOp::CompareSwap { word: WordKind::Drain, expected, new: new.encode() }
    }

    fn register_done(&mut self, expected: u64, target: u32, previous: u64, out: &mut Out) -> Step {
        let seen = DrainWord::decode(previous);
        if !self.of_this_generation(seen.generation, out)? {
            return Ok(());
        }
        if previous != expected {
            if seen.waiter.is_some() {
                return Err(self.violation(format!("drain word already has a waiter: {seen:?}")));
            }
            self.set_phase(Phase::RegisterDrain { expected: previous, target })?;
            out.push(Action::Atomic(vec![self.register_op(previous, target)]));
            return Ok(());
        }
        let (_, drained) = DrainWord::decode(expected).after_register(self.node, target);
        if drained {
            self.granted_exclusive(None, out)
        } else {
            self.set_phase(Phase::WaitDrain)
        }
    }

    /// An exclusive request is granted: confirm it with the token
    /// fetch-and-add (already done if `fence` is its result), then hold.
    fn granted_exclusive(&mut self, fence: Option<u64>, out: &mut Out) -> Step {
        let request = self.req()?;
        if !request.fencing || request.abandoned {
            self.hold(None, out);
            return Ok(());
        }
        match fence {
            Some(previous) => self.confirm(previous, out),
            None => {
                request.phase = Phase::FetchToken;
                out.push(Action::Atomic(vec![AtomicOp::FetchAdd {
                    word: WordKind::Fence,
                    delta: crate::word::FENCE_UNIT,
                }]));
                Ok(())
            }
        }
    }

    /// The token fetch-and-add of an exclusive grant returned `previous`:
    /// the grant holds only if the fence still counts for its generation.
    /// A grant whose generation a move overtook (its grant message, or the
    /// second half of its batch, came after the move's fence step) is over.
    fn confirm(&mut self, previous: u64, out: &mut Out) -> Step {
        let fence = FenceWord::decode(previous);
        let generation = self.req()?.generation;
        if fence.generation == generation {
            self.hold(Some(fencing_token(previous)), out);
            return Ok(());
        }
        if generation_newer(fence.generation, generation) {
            self.observe_generation(fence.generation, out);
            return Ok(());
        }
        Err(self.violation(format!("fence of generation {} behind the grant's {generation}", fence.generation)))
    }

    /// Enters the hold (or, for an abandoned request, passes straight through it).
    fn hold(&mut self, token: Option<u64>, out: &mut Out) {
        let Some(request) = self.request.as_mut() else { return };
        let token = if request.fencing { token } else { None };
        request.phase = match self.kind {
            QueueKind::Dqnl => Phase::HoldExclusive,
            QueueKind::CoShed if request.mode == LockMode::Exclusive => Phase::HoldExclusive,
            QueueKind::CoShed => match request.phase {
                held @ Phase::HoldShared { .. } => held,
                _ => Phase::HoldShared { coordinator: None },
            },
        };
        out.push(Action::Granted { mode: request.mode, token, abandoned: request.abandoned });
        if request.abandoned {
            // Nobody waits for this grant: release it at once. A violation
            // here cannot happen (we just entered a hold phase).
            let _ = self.release(out);
        }
    }

    fn release(&mut self, out: &mut Out) -> Step {
        let node = self.node;
        let newest = self.generation;
        let request = self.req()?;
        if request.role != Role::User {
            return Err(self.violation("release of a barrier"));
        }
        if request.phase.is_hold() && generation_newer(newest, request.generation) {
            // A hold a recovery kept: the old generation's queue is gone, so
            // there is nobody to pass it to. Acknowledge the move.
            self.request = None;
            self.flush_owed(out);
            out.push(Action::Idle);
            return Ok(());
        }
        match request.phase {
            Phase::HoldExclusive => self.release_exclusive(node, out),
            Phase::HoldShared { coordinator: Some(coordinator) } => {
                let generation = request.generation;
                self.finish(out);
                out.insert(out.len() - 1, Action::Send { to: coordinator, generation, msg: ProtoMsg::SharedRelease });
                Ok(())
            }
            Phase::HoldShared { coordinator: None } => {
                // Guess that we are the only group-0 holder; a failed guess
                // returns the real word and we retry with it.
                let expected = LockWord { generation: request.generation, tail: None, shared: 1 }.encode();
                request.phase = Phase::ReleaseWord { expected };
                out.push(Action::Atomic(vec![release_word_op(expected)]));
                Ok(())
            }
            _ => Err(self.violation("release without a hold")),
        }
    }

    /// Passes an exclusive hold (a user's, or a barrier) on.
    fn release_exclusive(&mut self, node: NodeId, out: &mut Out) -> Step {
        let request = self.req()?;
        if request.group.successor.is_some() {
            request.phase = Phase::HandoffCoordinated;
            self.grant_waiting(SharedVia::Coordinator, out)?;
            return self.check_coordinated(out);
        }
        let expected =
            LockWord { generation: request.generation, tail: Some(node), shared: request.group.received() }.encode();
        request.phase = Phase::Convert { expected };
        out.push(Action::Atomic(vec![convert_op(expected)]));
        Ok(())
    }

    /// Grants every collected shared request.
    fn grant_waiting(&mut self, via: SharedVia, out: &mut Out) -> Step {
        let request = self.req()?;
        let generation = request.generation;
        for to in request.group.waiting.drain(..) {
            out.push(Action::Send { to, generation, msg: ProtoMsg::GrantShared { via } });
            request.group.granted += 1;
            if via == SharedVia::Coordinator {
                request.group.holding.push(to);
            }
        }
        Ok(())
    }

    /// In coordinated handoff: once every shared request between us and our
    /// successor has been granted and released, grant the successor.
    fn check_coordinated(&mut self, out: &mut Out) -> Step {
        let request = self.req()?;
        let Some((successor, shared)) = request.group.successor else { return Ok(()) };
        if request.group.granted > shared || request.group.released > request.group.granted {
            let what = format!("group accounting: {:?} for {shared} shared requests", request.group);
            return Err(self.violation(what));
        }
        if request.group.granted == shared && request.group.released == shared {
            let generation = request.generation;
            self.finish(out);
            out.insert(out.len() - 1, Action::Send { to: successor, generation, msg: ProtoMsg::GrantExclusive });
        }
        Ok(())
    }

    fn convert_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
        let Some(seen) = self.word_of_this_generation(previous, out)? else { return Ok(()) };
        if previous == expected {
            self.set_phase(Phase::HandoffGroup0 { total: seen.shared })?;
            self.grant_waiting(SharedVia::Group0, out)?;
            return self.check_group0(seen.shared, out);
        }
        if seen.tail == Some(self.node) {
            // More shared requests arrived at the word; hand them over too.
            self.set_phase(Phase::Convert { expected: previous })?;
            out.push(Action::Atomic(vec![convert_op(previous)]));
            return Ok(());
        }
        // Someone enqueued behind us: its Successor message is on the way.
        self.set_phase(Phase::HandoffCoordinated)?;
        self.grant_waiting(SharedVia::Coordinator, out)?;
        self.check_coordinated(out)
    }

    fn check_group0(&mut self, total: u32, out: &mut Out) -> Step {
        let granted = self.req()?.group.granted;
        if granted > total {
            return Err(self.violation(format!("granted {granted} of {total} converted shared requests")));
        }
        if granted == total {
            self.finish(out);
        }
        Ok(())
    }

    fn shared_add_done(&mut self, previous: u64, out: &mut Out) -> Step {
        let seen = LockWord::decode(previous);
        self.adopt_generation(&seen);
        self.req()?.generation = seen.generation;
        match seen.tail {
            None => {
                self.set_phase(Phase::HoldShared { coordinator: None })?;
                self.hold(None, out);
                Ok(())
            }
            Some(coordinator) if coordinator == self.node => Err(self.violation("shared request behind itself")),
            Some(coordinator) => {
                self.set_phase(Phase::WaitShared { coordinator })?;
                out.push(Action::Send { to: coordinator, generation: seen.generation, msg: ProtoMsg::SharedRequest });
                Ok(())
            }
        }
    }

    fn shared_try_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
        let seen = LockWord::decode(previous);
        self.adopt_generation(&seen);
        if previous == expected {
            self.req()?.generation = seen.generation;
            self.set_phase(Phase::HoldShared { coordinator: None })?;
            self.hold(None, out);
            return Ok(());
        }
        if seen.tail.is_some() {
            self.request = None;
            out.push(Action::WouldBlock);
            out.push(Action::Idle);
            return Ok(());
        }
        self.set_phase(Phase::SharedTry { expected: previous })?;
        out.push(Action::Atomic(vec![shared_try_op(previous)]));
        Ok(())
    }

    fn release_word_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
        let Some(seen) = self.word_of_this_generation(previous, out)? else { return Ok(()) };
        if previous == expected {
            self.finish(out);
            return Ok(());
        }
        match seen.tail {
            None if seen.shared == 0 => Err(self.violation("group-0 release with a zero shared count")),
            None => {
                self.set_phase(Phase::ReleaseWord { expected: previous })?;
                out.push(Action::Atomic(vec![release_word_op(previous)]));
                Ok(())
            }
            Some(_) => {
                // An exclusive enqueued over the group-0 holders (counting us):
                // it waits in the drain word.
                let expected = DrainWord::idle(seen.generation).encode();
                self.set_phase(Phase::ReleaseDrain { expected })?;
                out.push(Action::Atomic(vec![release_drain_op(expected)]));
                Ok(())
            }
        }
    }

    fn release_drain_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
        let seen = DrainWord::decode(previous);
        if !self.of_this_generation(seen.generation, out)? {
            return Ok(());
        }
        if previous != expected {
            self.set_phase(Phase::ReleaseDrain { expected: previous })?;
            out.push(Action::Atomic(vec![release_drain_op(previous)]));
            return Ok(());
        }
        let (_, drained) = seen.after_release();
        self.finish(out);
        if drained {
            if let Some(waiter) = seen.waiter {
                out.insert(
                    out.len() - 1,
                    Action::Send { to: waiter, generation: seen.generation, msg: ProtoMsg::Drained },
                );
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ recovery

    /// `node` is dead: stop waiting for its acknowledgement, or move the
    /// lock if the request cannot go on without it (or waits for parties it
    /// cannot name, one of which may be `node`).
    fn peer_lost(&mut self, node: NodeId, out: &mut Out) -> Step {
        if node == self.node {
            return Ok(());
        }
        let Some(request) = self.request.as_mut() else { return Ok(()) };
        if let Role::Mover { pending, .. } = &mut request.role {
            if request.phase == Phase::HoldExclusive {
                pending.retain(|n| *n != node);
                return self.check_barrier(out);
            }
        }
        let waits = self.waits();
        if waits.nodes.contains(&node) || waits.unknown {
            return self.start_move(false, out);
        }
        Ok(())
    }

    /// Moves the lock to the next generation (see the module docs): a
    /// recovery, or with `revoke` an administrator's break.
    fn start_move(&mut self, revoke: bool, out: &mut Out) -> Step {
        let from = self.request.as_ref().map_or(self.generation, |r| r.generation);
        if let Some(previous) = self.request.as_ref() {
            if revoke || !matches!(previous.role, Role::Mover { .. }) {
                let reason = if revoke {
                    AbortReason::Revoked { generation: from.wrapping_add(1) }
                } else {
                    AbortReason::Recovered { generation: from.wrapping_add(1) }
                };
                self.end_request(reason, out);
                // The request just ended: the move is this node's next request.
                if out.last() == Some(&Action::Idle) {
                    out.pop();
                }
            }
        }
        // Guess the free word; a failed guess returns the real one.
        let expected = LockWord::free(from).encode();
        self.request = Some(Request {
            mode: LockMode::Exclusive,
            try_only: false,
            fencing: false,
            abandoned: false,
            generation: from,
            phase: Phase::MoveLock { expected, from },
            group: Group::default(),
            role: Role::Mover { revoke, pending: Vec::new() },
        });
        out.push(Action::Atomic(vec![self.move_lock_op(expected)]));
        Ok(())
    }

    fn move_lock_op(&self, expected: u64) -> AtomicOp {
        let seen = LockWord::decode(expected);
        let new = LockWord { generation: seen.generation.wrapping_add(1), tail: Some(self.node), shared: 0 };
        AtomicOp::CompareSwap { word: WordKind::Lock, expected, new: new.encode() }
    }

    fn is_revoking(&self) -> bool {
        matches!(self.request.as_ref().map(|r| &r.role), Some(Role::Mover { revoke: true, .. }))
    }

    fn move_lock_done(&mut self, expected: u64, from: u16, previous: u64, out: &mut Out) -> Step {
        let seen = LockWord::decode(previous);
        if previous == expected {
            // Ours: the lock is in the next generation, with us as its tail.
            let generation = from.wrapping_add(1);
            if generation_newer(generation, self.generation) {
                self.generation = generation;
            }
            let expected = DrainWord::idle(from).encode();
            let request = self.req()?;
            request.generation = generation;
            request.phase = Phase::MoveDrain { expected };
            out.push(Action::Atomic(vec![move_drain_op(expected, generation)]));
            return Ok(());
        }
        if seen.generation == from || self.is_revoking() {
            // The word changed under us (or, for a break, moved on: break
            // whatever generation it is in now).
            self.req()?.generation = seen.generation;
            self.set_phase(Phase::MoveLock { expected: previous, from: seen.generation })?;
            out.push(Action::Atomic(vec![self.move_lock_op(previous)]));
            return Ok(());
        }
        // Someone else moved the lock past `from`: nothing left to recover.
        self.adopt_generation(&seen);
        self.request = None;
        out.push(Action::Idle);
        Ok(())
    }

    fn move_drain_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
        let seen = DrainWord::decode(previous);
        let generation = self.req()?.generation;
        if previous != expected && generation_newer(generation, seen.generation) {
            self.set_phase(Phase::MoveDrain { expected: previous })?;
            out.push(Action::Atomic(vec![move_drain_op(previous, generation)]));
            return Ok(());
        }
        if generation_newer(seen.generation, generation) {
            // A later move already went past ours.
            self.observe_generation(seen.generation, out);
            return Ok(());
        }
        // Guess the fence's count; a failed guess returns the real word.
        let expected = FenceWord { count: 0, generation: generation.wrapping_sub(1) }.encode();
        self.set_phase(Phase::MoveFence { expected })?;
        out.push(Action::Atomic(vec![move_fence_op(expected, generation)]));
        Ok(())
    }

    fn move_fence_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
        let seen = FenceWord::decode(previous);
        let generation = self.req()?.generation;
        if previous == expected {
            let floor = seen.moved_to(generation).encode();
            return self.notify(floor, out);
        }
        if generation_newer(generation, seen.generation) {
            self.set_phase(Phase::MoveFence { expected: previous })?;
            out.push(Action::Atomic(vec![move_fence_op(previous, generation)]));
            return Ok(());
        }
        if seen.generation == generation {
            return Err(self.violation("the fence moved to our generation by someone else"));
        }
        self.observe_generation(seen.generation, out);
        Ok(())
    }

    /// The move is done: tell every node, and hold the new generation until
    /// each has acknowledged (a break waits for nobody).
    fn notify(&mut self, floor: u64, out: &mut Out) -> Step {
        let me = self.node;
        let nodes = self.nodes.clone();
        let request = self.req()?;
        let generation = request.generation;
        let Role::Mover { revoke, pending } = &mut request.role else {
            return Err(self.violation("notify without a move"));
        };
        let revoke = *revoke;
        if !revoke {
            *pending = nodes.iter().copied().filter(|n| *n != me).collect();
        }
        request.phase = Phase::HoldExclusive;
        out.push(Action::Moved { generation, floor, revoke });
        for &to in nodes.iter().filter(|n| **n != me) {
            out.push(Action::Send { to, generation, msg: ProtoMsg::Notice { revoke } });
        }
        self.check_barrier(out)
    }

    /// Releases the barrier once nobody is left to wait for.
    fn check_barrier(&mut self, out: &mut Out) -> Step {
        let node = self.node;
        let request = self.req()?;
        match &request.role {
            Role::Mover { pending, .. } if pending.is_empty() && request.phase == Phase::HoldExclusive => {
                self.release_exclusive(node, out)
            }
            _ => Ok(()),
        }
    }

    /// A notice from `mover` that the lock moved to `generation`.
    fn notice(&mut self, mover: NodeId, generation: u16, revoke: bool, out: &mut Out) -> Step {
        if generation_newer(generation, self.generation) {
            self.generation = generation;
        }
        let older = self.request.as_ref().is_some_and(|r| generation_newer(generation, r.generation));
        if older {
            let keep = !revoke && self.request.as_ref().is_some_and(Request::is_user_hold);
            if keep {
                // A recovery keeps the hold: acknowledge when it ends.
                self.owed.push((mover, generation));
                return Ok(());
            }
            let reason =
                if revoke { AbortReason::Revoked { generation } } else { AbortReason::Recovered { generation } };
            self.end_request(reason, out);
        }
        if !revoke {
            out.push(Action::Send { to: mover, generation, msg: ProtoMsg::Ack });
        }
        Ok(())
    }

    fn message(&mut self, from: NodeId, generation: u16, msg: ProtoMsg, out: &mut Out) -> Step {
        match msg {
            ProtoMsg::Notice { revoke } => return self.notice(from, generation, revoke, out),
            ProtoMsg::Ack => {
                if let Some(request) = self.request.as_mut() {
                    if let Role::Mover { revoke: false, pending } = &mut request.role {
                        if request.generation == generation {
                            pending.retain(|n| *n != from);
                            return self.check_barrier(out);
                        }
                    }
                }
                return Ok(());
            }
            ProtoMsg::Nack => {
                if self.request.as_ref().is_some_and(|r| r.generation == generation) {
                    return self.peer_lost(from, out);
                }
                return Ok(());
            }
            _ => {}
        }
        self.observe_generation(generation, out);
        if generation != self.generation {
            // From before a move: the request it belonged to is gone.
            return Ok(());
        }
        let Some(request) = self.request.as_mut() else {
            // Nobody here expects it: tell the sender, who may wait for us.
            out.push(Action::Send { to: from, generation, msg: ProtoMsg::Nack });
            return Ok(());
        };
        if request.generation != generation {
            return Ok(());
        }
        match (msg, request.phase) {
            (ProtoMsg::SharedRequest, Phase::HandoffGroup0 { total }) => {
                out.push(Action::Send { to: from, generation, msg: ProtoMsg::GrantShared { via: SharedVia::Group0 } });
                request.group.granted += 1;
                self.check_group0(total, out)
            }
            (ProtoMsg::SharedRequest, Phase::HandoffCoordinated) => {
                out.push(Action::Send {
                    to: from,
                    generation,
                    msg: ProtoMsg::GrantShared { via: SharedVia::Coordinator },
                });
                request.group.granted += 1;
                request.group.holding.push(from);
                self.check_coordinated(out)
            }
            (ProtoMsg::SharedRequest, phase) if is_exclusive_phase(phase) => {
                request.group.waiting.push(from);
                Ok(())
            }
            (ProtoMsg::Successor { shared }, phase) if is_exclusive_phase(phase) => {
                if request.group.successor.is_some() || matches!(phase, Phase::HandoffGroup0 { .. }) {
                    return Err(self.violation(format!("second successor {from}")));
                }
                request.group.successor = Some((from, shared));
                if phase == Phase::HandoffCoordinated {
                    return self.check_coordinated(out);
                }
                Ok(())
            }
            (ProtoMsg::SharedRelease, Phase::HandoffCoordinated) => {
                request.group.released += 1;
                if let Some(at) = request.group.holding.iter().position(|n| *n == from) {
                    request.group.holding.swap_remove(at);
                }
                self.check_coordinated(out)
            }
            (ProtoMsg::GrantExclusive, Phase::WaitPredecessor { predecessor }) if predecessor == from => {
                self.granted_exclusive(None, out)
            }
            (ProtoMsg::Drained, Phase::WaitDrain) => self.granted_exclusive(None, out),
            (ProtoMsg::GrantShared { via }, Phase::WaitShared { coordinator }) if coordinator == from => {
                let coordinator = (via == SharedVia::Coordinator).then_some(coordinator);
                request.phase = Phase::HoldShared { coordinator };
                self.hold(None, out);
                Ok(())
            }
            (msg, _) => Err(self.violation(format!("unexpected {msg:?} from {from}"))),
        }
    }
}

/// Phases of an exclusive request, in which shared requests and a successor
/// may arrive (they can overtake our own enqueue's completion). A mover is
/// the tail of its new generation from its lock-word swap on.
fn is_exclusive_phase(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::Enqueue { .. }
            | Phase::WaitPredecessor { .. }
            | Phase::RegisterDrain { .. }
            | Phase::WaitDrain
            | Phase::FetchToken
            | Phase::HoldExclusive
            | Phase::Convert { .. }
            | Phase::HandoffCoordinated
            | Phase::HandoffGroup0 { .. }
            | Phase::MoveDrain { .. }
            | Phase::MoveFence { .. }
    )
}

/// Released exclusive, no successor: tail → none, keeping the shared count
/// (our shared requesters become group-0 holders).
fn convert_op(expected: u64) -> AtomicOp {
    let seen = LockWord::decode(expected);
    AtomicOp::CompareSwap { word: WordKind::Lock, expected, new: LockWord { tail: None, ..seen }.encode() }
}

fn shared_try_op(expected: u64) -> AtomicOp {
    let seen = LockWord::decode(expected);
    let new = LockWord { shared: seen.shared.wrapping_add(1), ..seen }.encode();
    AtomicOp::CompareSwap { word: WordKind::Lock, expected, new }
}

fn release_word_op(expected: u64) -> AtomicOp {
    let seen = LockWord::decode(expected);
    let new = LockWord { shared: seen.shared.wrapping_sub(1), ..seen }.encode();
    AtomicOp::CompareSwap { word: WordKind::Lock, expected, new }
}

fn release_drain_op(expected: u64) -> AtomicOp {
    let (new, _) = DrainWord::decode(expected).after_release();
    AtomicOp::CompareSwap { word: WordKind::Drain, expected, new: new.encode() }
}

fn move_drain_op(expected: u64, generation: u16) -> AtomicOp {
    AtomicOp::CompareSwap { word: WordKind::Drain, expected, new: DrainWord::idle(generation).encode() }
}

fn move_fence_op(expected: u64, generation: u16) -> AtomicOp {
    let new = FenceWord::decode(expected).moved_to(generation).encode();
    AtomicOp::CompareSwap { word: WordKind::Fence, expected, new }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::word::{DRAIN_BIAS, FENCE_UNIT};

    fn n(i: u32) -> NodeId {
        NodeId(i)
    }

    /// The client of node `i` in a cluster of nodes 0..10.
    fn client(i: u32, kind: QueueKind) -> LockClient {
        LockClient::new(n(i), kind, (0..10).map(NodeId).collect())
    }

    fn step(client: &mut LockClient, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        client.handle(input, &mut out).unwrap();
        out
    }

    fn notice(from: u32, generation: u16, revoke: bool) -> Input {
        Input::Message { from: n(from), generation, msg: ProtoMsg::Notice { revoke } }
    }

    fn done(results: &[u64]) -> Input {
        let mut r = [0; 2];
        r[..results.len()].copy_from_slice(results);
        Input::AtomicDone { results: r, len: results.len() }
    }

    #[test]
    fn uncontended_exclusive_is_one_batch_to_acquire_and_one_atomic_to_release() {
        let mut c = client(1, QueueKind::CoShed);
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let free = LockWord::free(0).encode();
        let mine = LockWord { generation: 0, tail: Some(n(1)), shared: 0 }.encode();
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![
                AtomicOp::CompareSwap { word: WordKind::Lock, expected: free, new: mine },
                AtomicOp::FetchAdd { word: WordKind::Fence, delta: FENCE_UNIT }
            ])]
        );
        let fence = FenceWord { count: 41, generation: 0 }.encode();
        let actions = step(&mut c, done(&[free, fence]));
        let token = FenceWord { count: 42, generation: 0 }.encode();
        assert_eq!(actions, vec![Action::Granted { mode: LockMode::Exclusive, token: Some(token), abandoned: false }]);
        let actions = step(&mut c, Input::Release);
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap { word: WordKind::Lock, expected: mine, new: free }])]
        );
        assert_eq!(step(&mut c, done(&[mine])), vec![Action::Idle]);
        assert!(c.is_idle());
    }

    #[test]
    fn uncontended_shared_is_one_fetch_add() {
        let mut c = client(2, QueueKind::CoShed);
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: true });
        assert_eq!(actions, vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }])]);
        let actions = step(&mut c, done(&[LockWord::free(0).encode()]));
        assert_eq!(actions, vec![Action::Granted { mode: LockMode::Shared, token: None, abandoned: false }]);
    }

    #[test]
    fn shared_request_behind_an_exclusive_messages_the_tail() {
        let mut c = client(2, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        let word = LockWord { generation: 0, tail: Some(n(7)), shared: 3 }.encode();
        let actions = step(&mut c, done(&[word]));
        assert_eq!(actions, vec![Action::Send { to: n(7), generation: 0, msg: ProtoMsg::SharedRequest }]);
        assert_eq!(c.blocked_on(), BlockedOn::Node(n(7)));
        // A grant from someone else is a violation, not a grant.
        let mut out = Vec::new();
        let bad = Input::Message { from: n(8), generation: 0, msg: ProtoMsg::GrantShared { via: SharedVia::Group0 } };
        assert!(c.handle(bad, &mut out).is_err());
    }

    #[test]
    fn a_break_aborts_the_waiting_request() {
        let mut c = client(2, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        let word = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
        step(&mut c, done(&[word]));
        let actions = step(&mut c, notice(9, 1, true));
        assert_eq!(actions, vec![Action::Aborted(AbortReason::Revoked { generation: 1 }), Action::Idle]);
        // A grant of the old generation is dropped.
        assert!(step(&mut c, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive }).is_empty());
    }

    /// What the runtime asks a client between inputs, through a request's life.
    #[test]
    fn accessors_follow_the_request() {
        let mut c = client(4, QueueKind::CoShed);
        assert_eq!(c.node(), n(4));
        assert!(c.is_idle() && !c.is_holding() && !c.is_waiting());
        assert_eq!(c.blocked_on(), BlockedOn::Nothing);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        assert!(!c.is_idle() && c.is_waiting() && !c.is_holding());
        // Enqueued over two group-0 shared holders: waits for them to drain.
        let shared = LockWord { generation: 0, tail: None, shared: 2 }.encode();
        step(&mut c, done(&[shared])); // the free guess failed
        step(&mut c, done(&[shared])); // enqueued
        assert_eq!(c.blocked_on(), BlockedOn::Nothing, "registering in the drain word");
        step(&mut c, done(&[DrainWord::idle(0).encode()]));
        assert_eq!(c.blocked_on(), BlockedOn::SharedHolders);
        assert!(c.is_waiting());
        step(&mut c, Input::Abandon);
        assert!(!c.is_waiting(), "an abandoned request has nobody waiting");
        let actions = step(&mut c, Input::Message { from: n(9), generation: 0, msg: ProtoMsg::Drained });
        assert_eq!(actions[0], Action::Granted { mode: LockMode::Exclusive, token: None, abandoned: true });
        assert!(!c.is_holding(), "released in the same step");
        // A hold, then a release in progress: neither holding nor waiting.
        let mut h = client(5, QueueKind::CoShed);
        step(&mut h, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut h, done(&[LockWord::free(0).encode()]));
        assert!(h.is_holding() && !h.is_waiting());
        step(&mut h, Input::Release);
        assert!(!h.is_holding() && !h.is_waiting() && !h.is_idle());
        h.reset();
        assert!(h.is_idle(), "reset forgets the request");
        // Waiting behind a predecessor names it.
        let mut w = client(6, QueueKind::Dqnl);
        step(&mut w, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        let queued = LockWord { generation: 0, tail: Some(n(2)), shared: 0 }.encode();
        step(&mut w, done(&[queued]));
        assert_eq!(
            step(&mut w, done(&[queued])),
            vec![Action::Send { to: n(2), generation: 0, msg: ProtoMsg::Successor { shared: 0 } }]
        );
        assert_eq!(w.blocked_on(), BlockedOn::Node(n(2)));
        assert!(w.is_waiting());
    }

    #[test]
    fn try_shared_never_enqueues_and_a_coordinated_release_messages_before_idle() {
        let mut c = client(1, QueueKind::CoShed);
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: true, fencing: false });
        let free = LockWord::free(0);
        let one = LockWord { shared: 1, ..free };
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: free.encode(),
                new: one.encode()
            }])],
            "a compare-and-swap that fails, not a fetch-and-add that would enqueue"
        );
        let held = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
        assert_eq!(step(&mut c, done(&[held])), vec![Action::WouldBlock, Action::Idle]);
        // A shared request granted by its coordinator releases to it, and the
        // message goes out before the client reports itself idle.
        step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut c, done(&[held]));
        let grant = ProtoMsg::GrantShared { via: SharedVia::Coordinator };
        step(&mut c, Input::Message { from: n(3), generation: 0, msg: grant });
        assert_eq!(
            step(&mut c, Input::Release),
            vec![Action::Send { to: n(3), generation: 0, msg: ProtoMsg::SharedRelease }, Action::Idle]
        );
    }

    /// Inputs only a peer speaking another protocol (or a bug) produces are
    /// reported as violations, not absorbed.
    #[test]
    fn impossible_inputs_are_violations() {
        let violates = |c: &mut LockClient, input: Input| c.handle(input, &mut Vec::new()).is_err();
        let msg = |from: u32, msg: ProtoMsg| Input::Message { from: n(from), generation: 0, msg };
        // A shared holder is asked for a grant, or told of a successor.
        let mut shared = client(1, QueueKind::CoShed);
        step(&mut shared, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut shared, done(&[LockWord::free(0).encode()]));
        assert!(violates(&mut shared.clone(), msg(2, ProtoMsg::SharedRequest)));
        assert!(violates(&mut shared.clone(), msg(2, ProtoMsg::Successor { shared: 0 })));
        // Its group-0 release finds a zero count.
        step(&mut shared, Input::Release);
        assert!(violates(&mut shared, done(&[LockWord::free(0).encode()])));
        // A shared enqueue that names itself as the tail.
        let mut own = client(1, QueueKind::CoShed);
        step(&mut own, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        assert!(violates(&mut own, done(&[LockWord { generation: 0, tail: Some(n(1)), shared: 0 }.encode()])));
        // An exclusive holder told of a second successor, or of more
        // releases than it granted.
        let mut holder = client(1, QueueKind::CoShed);
        step(&mut holder, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        step(&mut holder, done(&[LockWord::free(0).encode()]));
        step(&mut holder, msg(2, ProtoMsg::Successor { shared: 1 }));
        assert!(violates(&mut holder.clone(), msg(3, ProtoMsg::Successor { shared: 0 })));
        step(&mut holder, msg(4, ProtoMsg::SharedRequest));
        let actions = step(&mut holder, Input::Release);
        assert_eq!(
            actions,
            vec![Action::Send { to: n(4), generation: 0, msg: ProtoMsg::GrantShared { via: SharedVia::Coordinator } }]
        );
        assert_eq!(
            step(&mut holder, msg(4, ProtoMsg::SharedRelease)),
            vec![Action::Send { to: n(2), generation: 0, msg: ProtoMsg::GrantExclusive }, Action::Idle],
            "the successor's grant goes out before the client reports itself idle"
        );
        let mut twice = client(1, QueueKind::CoShed);
        step(&mut twice, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        step(&mut twice, done(&[LockWord::free(0).encode()]));
        step(&mut twice, msg(2, ProtoMsg::Successor { shared: 2 }));
        step(&mut twice, msg(4, ProtoMsg::SharedRequest));
        step(&mut twice, Input::Release);
        step(&mut twice, msg(4, ProtoMsg::SharedRelease));
        assert!(violates(&mut twice, msg(4, ProtoMsg::SharedRelease)), "two releases for one grant");
    }

    /// The last group-0 holder to release wakes the exclusive registered in
    /// the drain word, and says so before reporting itself idle.
    #[test]
    fn the_last_group0_release_wakes_the_drain_waiter() {
        let mut c = client(1, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut c, done(&[LockWord::free(0).encode()]));
        step(&mut c, Input::Release);
        // An exclusive (node 5) enqueued over us: count into the drain word.
        let actions = step(&mut c, done(&[LockWord { generation: 0, tail: Some(n(5)), shared: 0 }.encode()]));
        let idle = DrainWord::idle(0).encode();
        assert!(
            matches!(&actions[..], [Action::Atomic(ops)] if matches!(ops[0], AtomicOp::CompareSwap { word: WordKind::Drain, expected, .. } if expected == idle))
        );
        let registered = DrainWord { generation: 0, waiter: Some(n(5)), balance: DRAIN_BIAS - 1 }.encode();
        step(&mut c, done(&[registered])); // registered meanwhile: retry with its word
        assert_eq!(
            step(&mut c, done(&[registered])),
            vec![Action::Send { to: n(5), generation: 0, msg: ProtoMsg::Drained }, Action::Idle]
        );
    }

    #[test]
    fn mode_names_round_trip() {
        for (mode, name) in [(LockMode::Shared, "shared"), (LockMode::Exclusive, "exclusive")] {
            assert_eq!(mode.name(), name);
            assert_eq!(name.parse::<LockMode>(), Ok(mode));
        }
        assert!("both".parse::<LockMode>().is_err());
    }

    #[test]
    fn violations_name_the_phase_they_happened_in() {
        let mut c = client(2, QueueKind::CoShed);
        let mut out = Vec::new();
        let grant = Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive };
        assert_eq!(c.handle(Input::Release, &mut out).unwrap_err().phase, "Idle");
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        let queued = LockWord { generation: 0, tail: Some(n(7)), shared: 0 }.encode();
        step(&mut c, done(&[queued])); // the guess of a free word failed
        let err = c.handle(Input::Release, &mut out).unwrap_err();
        assert_eq!(err.phase, "Enqueue");
        step(&mut c, done(&[queued])); // the retry enqueued behind node 7
        let err = c.handle(grant, &mut out).unwrap_err();
        assert_eq!((err.node, err.phase), (n(2), "WaitPredecessor"), "a grant from a node that is not our predecessor");
        assert!(err.to_string().contains("WaitPredecessor"));
    }

    /// The release of an exclusive holder that collected shared requests
    /// guesses the word exactly: its tail with their count. One
    /// compare-and-swap, no retry.
    #[test]
    fn a_release_converts_collected_shared_requests_in_one_guess() {
        let mut c = client(1, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        step(&mut c, done(&[LockWord::free(0).encode()]));
        for from in [n(2), n(3)] {
            assert!(step(&mut c, Input::Message { from, generation: 0, msg: ProtoMsg::SharedRequest }).is_empty());
        }
        let held = LockWord { generation: 0, tail: Some(n(1)), shared: 2 };
        let converted = LockWord { tail: None, ..held };
        assert_eq!(
            step(&mut c, Input::Release),
            vec![Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: held.encode(),
                new: converted.encode()
            }])]
        );
        let group0 = ProtoMsg::GrantShared { via: SharedVia::Group0 };
        assert_eq!(
            step(&mut c, done(&[held.encode()])),
            vec![
                Action::Send { to: n(2), generation: 0, msg: group0 },
                Action::Send { to: n(3), generation: 0, msg: group0 },
                Action::Idle
            ]
        );
    }

    #[test]
    fn a_break_notice_is_remembered_and_old_messages_are_dropped() {
        let mut c = client(2, QueueKind::CoShed);
        assert_eq!(c.generation(), 0);
        assert!(step(&mut c, notice(9, 3, true)).is_empty(), "nothing to abort when idle");
        assert_eq!(c.generation(), 3);
        assert!(step(&mut c, notice(9, 2, true)).is_empty());
        assert_eq!(c.generation(), 3, "an older notice does not move the generation back");
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let free = LockWord::free(3).encode();
        let mine = LockWord { generation: 3, tail: Some(n(2)), shared: 0 }.encode();
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![
                AtomicOp::CompareSwap { word: WordKind::Lock, expected: free, new: mine },
                AtomicOp::FetchAdd { word: WordKind::Fence, delta: FENCE_UNIT }
            ])]
        );
        let fence = FenceWord { count: 9, generation: 3 }.encode();
        assert_eq!(
            step(&mut c, done(&[free, fence])),
            vec![Action::Granted { mode: LockMode::Exclusive, token: Some(fencing_token(fence)), abandoned: false }]
        );
    }

    /// A grant whose token fetch-and-add finds the fence in a newer
    /// generation was overtaken by a move: it does not hold, and the waiting
    /// user is told to make its request again.
    #[test]
    fn a_grant_overtaken_by_a_move_is_not_a_hold() {
        let mut c = client(2, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
        step(&mut c, done(&[queued, 0])); // the free guess failed
        step(&mut c, done(&[queued])); // enqueued behind node 3
        let actions = step(&mut c, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive });
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Fence, delta: FENCE_UNIT }])]
        );
        let moved = FenceWord { count: 5, generation: 1 }.encode();
        assert_eq!(
            step(&mut c, done(&[moved])),
            vec![Action::Aborted(AbortReason::Recovered { generation: 1 }), Action::Idle]
        );
        assert_eq!(c.generation(), 1);
        // The same in the first batch of an uncontended acquire.
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let free = LockWord::free(1).encode();
        let later = FenceWord { count: 6, generation: 2 }.encode();
        assert_eq!(
            step(&mut c, done(&[free, later])),
            vec![Action::Aborted(AbortReason::Recovered { generation: 2 }), Action::Idle]
        );
        // A fence behind the request's generation cannot happen.
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let behind = FenceWord { count: 7, generation: 1 }.encode();
        assert!(c.handle(done(&[LockWord::free(2).encode(), behind]), &mut Vec::new()).is_err());
    }

    /// A waiter whose predecessor is lost moves the lock: lock word, drain
    /// word, fence word, each a compare-and-swap retried with the word it
    /// saw; then it tells every node and holds the new generation until each
    /// acknowledges or is lost; then passes it on like any exclusive hold.
    #[test]
    fn a_waiter_behind_a_lost_node_moves_the_lock_and_holds_a_barrier() {
        let nodes: Arc<[NodeId]> = (0..4).map(NodeId).collect();
        let mut c = LockClient::new(n(1), QueueKind::CoShed, nodes);
        step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 2 };
        step(&mut c, done(&[queued.encode()]));
        assert_eq!(c.waits(), Waits { nodes: vec![n(3)], unknown: false });
        assert!(step(&mut c, Input::PeerLost { node: n(2) }).is_empty(), "not a node it waits for");
        let actions = step(&mut c, Input::PeerLost { node: n(3) });
        let barrier = LockWord { generation: 1, tail: Some(n(1)), shared: 0 };
        let guess = LockWord::free(0).encode();
        assert_eq!(
            actions,
            vec![
                Action::Aborted(AbortReason::Recovered { generation: 1 }),
                Action::Atomic(vec![AtomicOp::CompareSwap {
                    word: WordKind::Lock,
                    expected: guess,
                    new: barrier.encode()
                }])
            ]
        );
        assert!(!c.is_waiting(), "the user makes its request again");
        // The guess failed: retry with the word seen.
        let retry = step(&mut c, done(&[queued.encode()]));
        assert_eq!(
            retry,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: queued.encode(),
                new: barrier.encode()
            }])]
        );
        assert_eq!(c.state().0, ClientState::Moving);
        let drain = step(&mut c, done(&[queued.encode()]));
        assert_eq!(
            drain,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Drain,
                expected: DrainWord::idle(0).encode(),
                new: DrainWord::idle(1).encode()
            }])]
        );
        // A request of the new generation may arrive meanwhile: the mover is its tail.
        assert!(step(&mut c, Input::Message { from: n(2), generation: 1, msg: ProtoMsg::SharedRequest }).is_empty());
        let fence_guess = FenceWord { count: 0, generation: 0 }.encode();
        let fence = step(&mut c, done(&[DrainWord::idle(0).encode()]));
        assert_eq!(
            fence,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Fence,
                expected: fence_guess,
                new: FenceWord { count: 1, generation: 1 }.encode()
            }])]
        );
        let seen = FenceWord { count: 40, generation: 0 }.encode();
        step(&mut c, done(&[seen])); // retried with the count seen
        let floor = FenceWord { count: 41, generation: 1 }.encode();
        let notices = step(&mut c, done(&[seen]));
        let notice = |to| Action::Send { to: n(to), generation: 1, msg: ProtoMsg::Notice { revoke: false } };
        assert_eq!(
            notices,
            vec![Action::Moved { generation: 1, floor, revoke: false }, notice(0), notice(2), notice(3)]
        );
        assert_eq!(c.barrier(), Some((1, &[n(0), n(2), n(3)][..])));
        assert_eq!(c.state().0, ClientState::Barrier);
        assert!(!c.is_holding(), "a barrier is not the user's to release");
        assert!(c.handle(Input::Release, &mut Vec::new()).is_err());
        // Node 3 is the lost one; nodes 0 and 2 acknowledge (a stale one is ignored).
        assert!(step(&mut c, Input::PeerLost { node: n(3) }).is_empty());
        assert!(step(&mut c, Input::Message { from: n(0), generation: 0, msg: ProtoMsg::Ack }).is_empty());
        assert!(step(&mut c, Input::Message { from: n(0), generation: 1, msg: ProtoMsg::Ack }).is_empty());
        let released = step(&mut c, Input::Message { from: n(2), generation: 1, msg: ProtoMsg::Ack });
        // Released like an exclusive hold: node 2's shared request becomes group 0.
        let collected = LockWord { generation: 1, tail: Some(n(1)), shared: 1 };
        assert_eq!(
            released,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: collected.encode(),
                new: LockWord { tail: None, ..collected }.encode()
            }])]
        );
        let group0 = ProtoMsg::GrantShared { via: SharedVia::Group0 };
        assert_eq!(
            step(&mut c, done(&[collected.encode()])),
            vec![Action::Send { to: n(2), generation: 1, msg: group0 }, Action::Idle]
        );
    }

    /// A recovery keeps a live hold and waits for it: the holder
    /// acknowledges when its user releases, with no home atomic (the old
    /// generation's queue is gone). An administrator's break revokes it.
    #[test]
    fn a_recovery_keeps_holds_and_a_break_revokes_them() {
        let mut c = client(2, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut c, done(&[LockWord::free(0).encode()]));
        assert!(c.is_holding());
        assert!(step(&mut c, notice(7, 1, false)).is_empty(), "kept; no acknowledgement yet");
        assert!(c.is_holding());
        assert_eq!(c.generation(), 1);
        assert_eq!(
            step(&mut c, Input::Release),
            vec![Action::Send { to: n(7), generation: 1, msg: ProtoMsg::Ack }, Action::Idle]
        );
        // Not holding: acknowledged at once.
        assert_eq!(
            step(&mut c, notice(8, 2, false)),
            vec![Action::Send { to: n(8), generation: 2, msg: ProtoMsg::Ack }]
        );
        // A break revokes a hold; the acknowledgement owed to an earlier recovery goes out.
        step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut c, done(&[LockWord::free(2).encode()]));
        assert!(step(&mut c, notice(7, 3, false)).is_empty());
        assert_eq!(
            step(&mut c, notice(9, 4, true)),
            vec![
                Action::Aborted(AbortReason::Revoked { generation: 4 }),
                Action::Send { to: n(7), generation: 3, msg: ProtoMsg::Ack },
                Action::Idle
            ]
        );
    }

    /// A client that forgot a request (its home atomic's result was lost)
    /// moves the lock past that request's generation before it asks again,
    /// so that late messages meant for the forgotten request are dropped
    /// rather than taken for the new one; unless the lock moved on already.
    #[test]
    fn a_forgotten_request_is_moved_past_before_the_next_one() {
        let mut c = client(2, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        c.reset();
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        let barrier = LockWord { generation: 1, tail: Some(n(2)), shared: 0 }.encode();
        assert_eq!(
            actions,
            vec![
                Action::Aborted(AbortReason::Recovered { generation: 1 }),
                Action::Atomic(vec![AtomicOp::CompareSwap {
                    word: WordKind::Lock,
                    expected: LockWord::free(0).encode(),
                    new: barrier
                }])
            ]
        );
        assert_eq!(c.state().0, ClientState::Moving);
        // Once the lock has moved on, no move is needed.
        let mut d = client(3, QueueKind::CoShed);
        step(&mut d, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        d.reset();
        assert!(step(&mut d, notice(9, 1, false)).contains(&Action::Send {
            to: n(9),
            generation: 1,
            msg: ProtoMsg::Ack
        }));
        let actions = step(&mut d, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        assert_eq!(actions, vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }])]);
    }

    /// A message of the current generation that finds no request is
    /// answered `Nack`; a waiter told so by the node it waits for recovers.
    #[test]
    fn a_message_nobody_expects_is_nacked_and_a_nack_starts_a_recovery() {
        let mut fresh = client(3, QueueKind::CoShed);
        let successor = Input::Message { from: n(2), generation: 4, msg: ProtoMsg::Successor { shared: 0 } };
        assert_eq!(step(&mut fresh, successor), vec![Action::Send { to: n(2), generation: 4, msg: ProtoMsg::Nack }]);
        let mut waiter = client(2, QueueKind::CoShed);
        step(&mut waiter, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
        step(&mut waiter, done(&[queued, 0]));
        step(&mut waiter, done(&[queued]));
        assert!(step(&mut waiter, Input::Message { from: n(3), generation: 7, msg: ProtoMsg::Nack }).is_empty());
        assert!(step(&mut waiter, Input::Message { from: n(4), generation: 0, msg: ProtoMsg::Nack }).is_empty());
        let actions = step(&mut waiter, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::Nack });
        assert_eq!(actions[0], Action::Aborted(AbortReason::Recovered { generation: 1 }));
        assert!(matches!(actions[1], Action::Atomic(_)));
    }

    /// A move that finds the lock already moved past its generation stops;
    /// a break instead breaks whatever generation it finds, and waits for
    /// nobody.
    #[test]
    fn a_late_recovery_stops_and_a_break_moves_on() {
        let mut late = client(1, QueueKind::CoShed);
        step(&mut late, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
        step(&mut late, done(&[queued]));
        step(&mut late, done(&[queued]));
        step(&mut late, Input::PeerLost { node: n(3) });
        let moved = LockWord { generation: 1, tail: Some(n(4)), shared: 0 }.encode();
        assert_eq!(step(&mut late, done(&[moved])), vec![Action::Idle]);
        assert_eq!(late.generation(), 1);
        let mut admin = client(5, QueueKind::CoShed);
        step(&mut admin, Input::Break);
        let retry = step(&mut admin, done(&[moved]));
        let barrier = LockWord { generation: 2, tail: Some(n(5)), shared: 0 }.encode();
        assert_eq!(
            retry,
            vec![Action::Atomic(vec![AtomicOp::CompareSwap { word: WordKind::Lock, expected: moved, new: barrier }])]
        );
        step(&mut admin, done(&[moved]));
        step(&mut admin, done(&[DrainWord::idle(1).encode()]));
        let fence = FenceWord { count: 0, generation: 1 }.encode();
        let actions = step(&mut admin, done(&[fence]));
        assert_eq!(actions.len(), 9 + 2, "nine notices, the move, the release of the barrier");
        assert!(actions.contains(&Action::Moved {
            generation: 2,
            floor: FenceWord { count: 1, generation: 2 }.encode(),
            revoke: true
        }));
        assert_eq!(
            actions.last(),
            Some(&Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: barrier,
                new: LockWord::free(2).encode()
            }]))
        );
    }

    #[test]
    fn try_exclusive_on_a_held_lock_leaves_no_trace() {
        let mut c = client(1, QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: true, fencing: false });
        let held = LockWord { generation: 0, tail: None, shared: 2 }.encode();
        assert_eq!(step(&mut c, done(&[held])), vec![Action::WouldBlock, Action::Idle]);
        assert!(c.is_idle());
    }
}
