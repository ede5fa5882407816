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
//! The protocol itself is described in the crate essay (`lib.rs`); the
//! words in [`crate::word`]. The explorer in `tests/model_check.rs` runs this
//! very code over every interleaving of small configurations.

use crate::word::{fencing_token, generation_newer, DrainWord, LockWord};
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
}

/// Why a request ended without the user releasing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// `break_lock` moved the lock to a newer generation.
    Broken { generation: u16 },
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
    /// `break_lock` announced `generation`.
    Broken { generation: u16 },
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
    /// Granted; fetching the fencing token.
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
        }
    }
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

/// One node's protocol state for one lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockClient {
    node: NodeId,
    kind: QueueKind,
    /// The newest lock word generation this node has seen.
    generation: u16,
    request: Option<Request>,
}

type Out = Vec<Action>;
type Step = Result<(), ProtocolViolation>;

impl LockClient {
    pub fn new(node: NodeId, kind: QueueKind) -> Self {
        Self { node, kind, generation: 0, request: None }
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
        self.request.as_ref().is_some_and(|r| matches!(r.phase, Phase::HoldExclusive | Phase::HoldShared { .. }))
    }

    /// A request is in progress whose user is still waiting for its grant.
    pub fn is_waiting(&self) -> bool {
        self.request.as_ref().is_some_and(|r| {
            !r.abandoned
                && !matches!(
                    r.phase,
                    Phase::HoldExclusive
                        | Phase::HoldShared { .. }
                        | Phase::Convert { .. }
                        | Phase::HandoffGroup0 { .. }
                        | Phase::HandoffCoordinated
                        | Phase::ReleaseWord { .. }
                        | Phase::ReleaseDrain { .. }
                )
        })
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

    /// Forgets the request: the driver lost an atomic's result (the home is
    /// unreachable) and cannot tell whether it applied. The lock may be left
    /// wedged; `break_lock` recovers it.
    pub fn reset(&mut self) {
        self.request = None;
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
            Input::Broken { generation } => {
                self.observe_generation(generation, out);
                Ok(())
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
    /// lock moved to another generation meanwhile (a break, now observed).
    fn word_of_this_generation(&mut self, previous: u64, out: &mut Out) -> Result<Option<LockWord>, ProtocolViolation> {
        let seen = LockWord::decode(previous);
        Ok(self.of_this_generation(seen.generation, out)?.then_some(seen))
    }

    /// True if `generation` (read from a lock or drain word) is the current
    /// request's; otherwise only a break can have changed it, and the break
    /// is observed.
    fn of_this_generation(&mut self, generation: u16, out: &mut Out) -> Result<bool, ProtocolViolation> {
        if generation != self.req()?.generation {
            self.observe_generation(generation, out);
            return Ok(false);
        }
        Ok(true)
    }

    /// Adopts a newer generation: a request of an older one was broken.
    ///
    /// The request is compared with `generation` itself, not with the
    /// newest generation seen: a node can learn the new generation from the
    /// drain word (which `break_lock` resets first) and then still enqueue
    /// in the old lock word before the break swaps it; the break's notice
    /// must abort that request although it brings no news to the node.
    fn observe_generation(&mut self, generation: u16, out: &mut Out) {
        if generation_newer(generation, self.generation) {
            self.generation = generation;
        }
        if self.request.as_ref().is_some_and(|r| generation_newer(generation, r.generation)) {
            self.request = None;
            out.push(Action::Aborted(AbortReason::Broken { generation }));
            out.push(Action::Idle);
        }
    }

    fn start(&mut self, mode: LockMode, try_only: bool, fencing: bool, out: &mut Out) -> Step {
        if self.request.is_some() {
            return Err(self.violation("acquire while a request is in progress"));
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
                    ops.push(AtomicOp::FetchAdd { word: WordKind::Fence, delta: 1 });
                }
                (Phase::Enqueue { expected, first: true }, ops)
            }
            LockMode::Shared if try_only => {
                let expected = LockWord::free(generation).encode();
                (Phase::SharedTry { expected }, vec![shared_try_op(expected)])
            }
            LockMode::Shared => (Phase::SharedAdd, vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }]),
        };
        self.request =
            Some(Request { mode, try_only, fencing, abandoned: false, generation, phase, group: Group::default() });
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
                let generation = LockWord::decode(previous).generation;
                let token =
                    (first && request.fencing).then(|| results.get(1).map(|f| fencing_token(generation, *f))).flatten();
                self.enqueue_done(expected, previous, token, out)
            }
            Phase::RegisterDrain { expected, target } => self.register_done(expected, target, previous, out),
            Phase::FetchToken => {
                let token = fencing_token(request.generation, previous);
                self.hold(Some(token), out);
                Ok(())
            }
            Phase::Convert { expected } => self.convert_done(expected, previous, out),
            Phase::SharedAdd => self.shared_add_done(previous, out),
            Phase::SharedTry { expected } => self.shared_try_done(expected, previous, out),
            Phase::ReleaseWord { expected } => self.release_word_done(expected, previous, out),
            Phase::ReleaseDrain { expected } => self.release_drain_done(expected, previous, out),
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

    fn enqueue_done(&mut self, expected: u64, previous: u64, token: Option<u64>, out: &mut Out) -> Step {
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
            (None, 0) => self.granted_exclusive(token, out),
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

    /// An exclusive request is granted: fetch a token if needed, then hold.
    fn granted_exclusive(&mut self, token: Option<u64>, out: &mut Out) -> Step {
        let request = self.req()?;
        if request.fencing && token.is_none() && !request.abandoned {
            request.phase = Phase::FetchToken;
            out.push(Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Fence, delta: 1 }]));
            return Ok(());
        }
        self.hold(token, out);
        Ok(())
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
        let request = self.req()?;
        match request.phase {
            Phase::HoldExclusive => {
                if request.group.successor.is_some() {
                    request.phase = Phase::HandoffCoordinated;
                    self.grant_waiting(SharedVia::Coordinator, out)?;
                    return self.check_coordinated(out);
                }
                let expected =
                    LockWord { generation: request.generation, tail: Some(node), shared: request.group.received() }
                        .encode();
                request.phase = Phase::Convert { expected };
                out.push(Action::Atomic(vec![convert_op(expected)]));
                Ok(())
            }
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

    /// Grants every collected shared request.
    fn grant_waiting(&mut self, via: SharedVia, out: &mut Out) -> Step {
        let request = self.req()?;
        let generation = request.generation;
        for to in request.group.waiting.drain(..) {
            out.push(Action::Send { to, generation, msg: ProtoMsg::GrantShared { via } });
            request.group.granted += 1;
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

    fn message(&mut self, from: NodeId, generation: u16, msg: ProtoMsg, out: &mut Out) -> Step {
        self.observe_generation(generation, out);
        if generation != self.generation {
            // From before a break: the request it belonged to is gone.
            return Ok(());
        }
        let Some(request) = self.request.as_mut() else {
            return Err(self.violation(format!("{msg:?} from {from} without a request")));
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
/// may arrive (they can overtake our own enqueue's completion).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::word::DRAIN_BIAS;

    fn n(i: u32) -> NodeId {
        NodeId(i)
    }

    fn step(client: &mut LockClient, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        client.handle(input, &mut out).unwrap();
        out
    }

    fn done(results: &[u64]) -> Input {
        let mut r = [0; 2];
        r[..results.len()].copy_from_slice(results);
        Input::AtomicDone { results: r, len: results.len() }
    }

    #[test]
    fn uncontended_exclusive_is_one_batch_to_acquire_and_one_atomic_to_release() {
        let mut c = LockClient::new(n(1), QueueKind::CoShed);
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let free = LockWord::free(0).encode();
        let mine = LockWord { generation: 0, tail: Some(n(1)), shared: 0 }.encode();
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![
                AtomicOp::CompareSwap { word: WordKind::Lock, expected: free, new: mine },
                AtomicOp::FetchAdd { word: WordKind::Fence, delta: 1 }
            ])]
        );
        let actions = step(&mut c, done(&[free, 41]));
        assert_eq!(actions, vec![Action::Granted { mode: LockMode::Exclusive, token: Some(42), abandoned: false }]);
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
        let mut c = LockClient::new(n(2), QueueKind::CoShed);
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: true });
        assert_eq!(actions, vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }])]);
        let actions = step(&mut c, done(&[LockWord::free(0).encode()]));
        assert_eq!(actions, vec![Action::Granted { mode: LockMode::Shared, token: None, abandoned: false }]);
    }

    #[test]
    fn shared_request_behind_an_exclusive_messages_the_tail() {
        let mut c = LockClient::new(n(2), QueueKind::CoShed);
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
        let mut c = LockClient::new(n(2), QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
        let word = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
        step(&mut c, done(&[word]));
        let actions = step(&mut c, Input::Broken { generation: 1 });
        assert_eq!(actions, vec![Action::Aborted(AbortReason::Broken { generation: 1 }), Action::Idle]);
        // A grant of the old generation is dropped.
        assert!(step(&mut c, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive }).is_empty());
    }

    /// What the runtime asks a client between inputs, through a request's life.
    #[test]
    fn accessors_follow_the_request() {
        let mut c = LockClient::new(n(4), QueueKind::CoShed);
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
        let mut h = LockClient::new(n(5), QueueKind::CoShed);
        step(&mut h, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut h, done(&[LockWord::free(0).encode()]));
        assert!(h.is_holding() && !h.is_waiting());
        step(&mut h, Input::Release);
        assert!(!h.is_holding() && !h.is_waiting() && !h.is_idle());
        h.reset();
        assert!(h.is_idle(), "reset forgets the request");
        // Waiting behind a predecessor names it.
        let mut w = LockClient::new(n(6), QueueKind::Dqnl);
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
        let mut c = LockClient::new(n(1), QueueKind::CoShed);
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
        let mut shared = LockClient::new(n(1), QueueKind::CoShed);
        step(&mut shared, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        step(&mut shared, done(&[LockWord::free(0).encode()]));
        assert!(violates(&mut shared.clone(), msg(2, ProtoMsg::SharedRequest)));
        assert!(violates(&mut shared.clone(), msg(2, ProtoMsg::Successor { shared: 0 })));
        // Its group-0 release finds a zero count.
        step(&mut shared, Input::Release);
        assert!(violates(&mut shared, done(&[LockWord::free(0).encode()])));
        // A shared enqueue that names itself as the tail.
        let mut own = LockClient::new(n(1), QueueKind::CoShed);
        step(&mut own, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
        assert!(violates(&mut own, done(&[LockWord { generation: 0, tail: Some(n(1)), shared: 0 }.encode()])));
        // An exclusive holder told of a second successor, or of more
        // releases than it granted.
        let mut holder = LockClient::new(n(1), QueueKind::CoShed);
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
        let mut twice = LockClient::new(n(1), QueueKind::CoShed);
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
        let mut c = LockClient::new(n(1), QueueKind::CoShed);
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
        let mut c = LockClient::new(n(2), QueueKind::CoShed);
        let mut out = Vec::new();
        let grant = Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive };
        assert_eq!(c.handle(grant, &mut out).unwrap_err().phase, "Idle");
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
        let mut c = LockClient::new(n(1), QueueKind::CoShed);
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
        let mut c = LockClient::new(n(2), QueueKind::CoShed);
        assert_eq!(c.generation(), 0);
        assert!(step(&mut c, Input::Broken { generation: 3 }).is_empty(), "nothing to abort when idle");
        assert_eq!(c.generation(), 3);
        assert!(step(&mut c, Input::Broken { generation: 2 }).is_empty());
        assert_eq!(c.generation(), 3, "an older notice does not move the generation back");
        let actions = step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
        let free = LockWord::free(3).encode();
        let mine = LockWord { generation: 3, tail: Some(n(2)), shared: 0 }.encode();
        assert_eq!(
            actions,
            vec![Action::Atomic(vec![
                AtomicOp::CompareSwap { word: WordKind::Lock, expected: free, new: mine },
                AtomicOp::FetchAdd { word: WordKind::Fence, delta: 1 }
            ])]
        );
        let token = crate::word::fencing_token(3, 9);
        assert_eq!(
            step(&mut c, done(&[free, 9])),
            vec![Action::Granted { mode: LockMode::Exclusive, token: Some(token), abandoned: false }]
        );
        assert!(token > 3 << 48, "the generation is in the token's high bits");
    }

    #[test]
    fn try_exclusive_on_a_held_lock_leaves_no_trace() {
        let mut c = LockClient::new(n(1), QueueKind::CoShed);
        step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: true, fencing: false });
        let held = LockWord { generation: 0, tail: None, shared: 2 }.encode();
        assert_eq!(step(&mut c, done(&[held])), vec![Action::WouldBlock, Action::Idle]);
        assert!(c.is_idle());
    }
}
