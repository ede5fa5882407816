//! Moving the lock to a new generation: a recovery after [`Input::PeerLost`]
//! or an administrator's [`Input::Break`] (see the module docs), the
//! barrier the mover holds until every node has acknowledged, and the
//! notices the other nodes answer.

use super::*;
use crate::word::{generation_newer, DrainWord, FenceWord, LockWord};
use tierstack_base::NodeId;

impl LockClient {
    /// `node` is dead: stop waiting for its acknowledgement, or move the
    /// lock if the request cannot go on without it (or waits for parties it
    /// cannot name, one of which may be `node`).
    pub(super) fn peer_lost(&mut self, node: NodeId, out: &mut Out) -> Step {
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
            return self.start_move(false, None, out);
        }
        Ok(())
    }

    /// Moves the lock to the next generation (see the module docs): a
    /// recovery, or with `revoke` an administrator's break; `guess` is the
    /// lock word the first compare-and-swap expects (else the free word).
    pub(super) fn start_move(&mut self, revoke: bool, guess: Option<u64>, out: &mut Out) -> Step {
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
        let expected = guess.unwrap_or(LockWord::free(from).encode());
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

    pub(super) fn move_lock_done(&mut self, expected: u64, from: u16, previous: u64, out: &mut Out) -> Step {
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

    pub(super) fn move_drain_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
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

    pub(super) fn move_fence_done(&mut self, expected: u64, previous: u64, out: &mut Out) -> Step {
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
    pub(super) fn check_barrier(&mut self, out: &mut Out) -> Step {
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
    pub(super) fn notice(&mut self, mover: NodeId, generation: u16, revoke: bool, out: &mut Out) -> Step {
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
}

fn move_drain_op(expected: u64, generation: u16) -> AtomicOp {
    AtomicOp::CompareSwap { word: WordKind::Drain, expected, new: DrainWord::idle(generation).encode() }
}

fn move_fence_op(expected: u64, generation: u16) -> AtomicOp {
    let new = FenceWord::decode(expected).moved_to(generation).encode();
    AtomicOp::CompareSwap { word: WordKind::Fence, expected, new }
}
