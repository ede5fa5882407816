//! The queue protocol of [`LockClient`]: enqueueing exclusive and shared
//! requests, grants and fencing tokens, the hand-over of shared counts on
//! release (coordinated or by conversion), group-0 releases, and the
//! dispatch of every message (recovery's own go on to `recovery.rs`).

use super::*;
use crate::word::{fencing_token, generation_newer, DrainWord, FenceWord, LockWord};
use tierstack_base::NodeId;

impl LockClient {
    pub(super) fn start(&mut self, mode: LockMode, try_only: bool, fencing: bool, out: &mut Out) -> Step {
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
                return self.start_move(false, None, out);
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

    pub(super) fn atomic_done(&mut self, results: &[u64], out: &mut Out) -> Step {
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

    pub(super) fn release(&mut self, out: &mut Out) -> Step {
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
    pub(super) fn release_exclusive(&mut self, node: NodeId, out: &mut Out) -> Step {
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

    pub(super) fn message(&mut self, from: NodeId, generation: u16, msg: ProtoMsg, out: &mut Out) -> Step {
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
