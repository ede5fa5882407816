//! SRSL, the send/receive server-lock baseline, as two pure state machines.
//!
//! The home's server thread owns a [`SrslQueue`] per lock: it grants
//! compatible requests at once and queues the rest in FIFO order (a shared
//! request behind a queued exclusive waits, as in N-CoShED). Clients run a
//! [`SrslClient`]: send `Acquire` to the home, wait for `Grant`, send
//! `Release`. Every acquire and release costs the home's CPU, which is what
//! the baseline is for. Messages between one client and the home keep their
//! order (the fabric guarantees it per pair), so SRSL needs no generations.
//!
//! A break crosses in-flight messages, which `tests/model_check_srsl.rs`
//! explores: a revoked holder may have released (its `Release` reaches the
//! server after the break: consumed silently) and even sent its next
//! `Acquire` (the `Broken` notice for its old hold then reaches it while it
//! waits: `Broken { held: true }` says the notice is for a hold, which a
//! waiting client no longer has, so it is ignored).
//!
//! **Recovery** is the server's: it knows every holder and waiter, so a
//! node the runtime judges dead (its process ended, or its lease expired)
//! is simply taken out ([`SrslQueue::peer_lost`]): its hold is revoked (a
//! release that still comes is consumed) and the requests behind it are
//! granted. No generation is needed; the fence word keeps counting.
//!
//! A node may also die and **start again under the same id** before
//! anybody judged it dead: its old hold (or request) is then still queued,
//! and the id runs again. Every `Acquire` names the requester's
//! incarnation, which the server remembers per node
//! ([`SrslQueue::incarnation`]); a request from another incarnation, or the
//! monitor reading that the node runs another one now, drops what the old
//! one left without telling anybody (its process is gone, and its successor
//! never asked for it).

use crate::proto::{LockMode, ProtocolViolation};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use tierstack_base::NodeId;

/// SRSL messages (carried with the lock id by [`crate::msg`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SrslMsg {
    /// Client → home; `incarnation`: the requesting process's (its node
    /// region's random incarnation number).
    Acquire { mode: LockMode, try_only: bool, incarnation: u64 },
    /// Home → client; `token` is the fencing token of an exclusive grant (0 for shared).
    Grant { mode: LockMode, token: u64 },
    /// Home → client: a try-acquire found the lock busy.
    WouldBlock,
    /// Client → home.
    Release,
    /// `break_lock` → home: forget every holder and waiter.
    Break,
    /// Home → every holder and waiter when the lock is broken; `held`: the
    /// node was a holder (else a waiter).
    Broken { held: bool },
    /// New server → every node (re-homing): the lock is served here now;
    /// say what you hold of it ([`SrslMsg::Report`]).
    Rehomed,
    /// Client → new server: what this node holds of the lock (`None`:
    /// nothing; a waiter asks again with `Acquire`). `token` is the
    /// exclusive hold's fencing token (0 for shared).
    Report { held: Option<(LockMode, u64)> },
    /// Server → client: this server does not serve the lock (any more);
    /// locate it again.
    Moved,
}

/// What the home's server does for one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerAction {
    /// Grant `mode` to `to` (the runtime attaches a fencing token to exclusive grants).
    Grant {
        to: NodeId,
        mode: LockMode,
    },
    Refuse {
        to: NodeId,
    },
    Broken {
        to: NodeId,
        held: bool,
    },
}

/// The home's state for one lock: holders and a FIFO of waiters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SrslQueue {
    exclusive: Option<NodeId>,
    shared: Vec<NodeId>,
    waiting: VecDeque<(NodeId, LockMode)>,
    /// Holders a break revoked whose next message has not arrived: a
    /// `Release` from one of them crossed the break and is consumed.
    revoked: Vec<NodeId>,
    /// The incarnation of each node's last request here.
    incarnations: BTreeMap<NodeId, u64>,
    /// Re-homing: the nodes whose report this new server still waits for
    /// before it grants anything (the rebuild's barrier); `None` when
    /// not rebuilding.
    rebuilding: Option<BTreeSet<NodeId>>,
    /// Try-acquires that came during the rebuild, answered when it ends.
    tries: Vec<(NodeId, LockMode)>,
}

impl SrslQueue {
    fn compatible(&self, mode: LockMode) -> bool {
        match mode {
            LockMode::Exclusive => self.exclusive.is_none() && self.shared.is_empty(),
            LockMode::Shared => self.exclusive.is_none(),
        }
    }

    fn holds(&self, node: NodeId) -> bool {
        self.exclusive == Some(node) || self.shared.contains(&node)
    }

    fn take(&mut self, to: NodeId, mode: LockMode, out: &mut Vec<ServerAction>) {
        match mode {
            LockMode::Exclusive => self.exclusive = Some(to),
            LockMode::Shared => self.shared.push(to),
        }
        out.push(ServerAction::Grant { to, mode });
    }

    /// Nodes with a request here (holders and waiters): `break_lock` tells them.
    pub fn participants(&self) -> Vec<NodeId> {
        let queued = self.waiting.iter().chain(&self.tries).map(|(n, _)| *n);
        self.exclusive.iter().chain(&self.shared).copied().chain(queued).collect()
    }

    pub fn is_idle(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty() && self.waiting.is_empty()
    }

    pub fn acquire(
        &mut self,
        from: NodeId,
        mode: LockMode,
        try_only: bool,
        out: &mut Vec<ServerAction>,
    ) -> Result<(), ProtocolViolation> {
        // Its next message after the break: no release of the old hold follows.
        self.revoked.retain(|n| *n != from);
        if self.holds(from) || self.waiting.iter().chain(&self.tries).any(|(n, _)| *n == from) {
            return Err(ProtocolViolation {
                node: from,
                phase: "SrslServer",
                what: "second request from one node".into(),
            });
        }
        if self.waiting.is_empty() && self.rebuilding.is_none() && self.compatible(mode) {
            self.take(from, mode, out);
        } else if try_only && self.rebuilding.is_some() {
            // Busy or not is unknown until the holders have reported.
            self.tries.push((from, mode));
        } else if try_only {
            out.push(ServerAction::Refuse { to: from });
        } else {
            self.waiting.push_back((from, mode));
        }
        Ok(())
    }

    pub fn release(&mut self, from: NodeId, out: &mut Vec<ServerAction>) -> Result<(), ProtocolViolation> {
        if self.exclusive == Some(from) {
            self.exclusive = None;
        } else if let Some(at) = self.shared.iter().position(|n| *n == from) {
            self.shared.swap_remove(at);
        } else if let Some(at) = self.revoked.iter().position(|n| *n == from) {
            self.revoked.swap_remove(at);
            return Ok(());
        } else {
            return Err(ProtocolViolation { node: from, phase: "SrslServer", what: "release by a non-holder".into() });
        }
        self.grant_waiting(out);
        Ok(())
    }

    /// Nodes holding the lock now, for the server's liveness checks.
    pub fn holders(&self) -> Vec<NodeId> {
        self.exclusive.iter().chain(&self.shared).copied().collect()
    }

    /// The nodes queued behind the holders, in order.
    pub fn waiters(&self) -> Vec<NodeId> {
        self.waiting.iter().map(|(n, _)| *n).collect()
    }

    /// Some request waits behind the holders.
    pub fn has_waiters(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// `node` is dead (or its lease expired): its hold is revoked and its
    /// request dropped, each told so in case it still runs, and the requests
    /// it blocked are granted.
    pub fn peer_lost(&mut self, node: NodeId, out: &mut Vec<ServerAction>) {
        let held = self.holds(node);
        if held {
            if self.exclusive == Some(node) {
                self.exclusive = None;
            }
            self.shared.retain(|n| *n != node);
            if !self.revoked.contains(&node) {
                self.revoked.push(node);
            }
            out.push(ServerAction::Broken { to: node, held: true });
        }
        self.tries.retain(|(n, _)| *n != node);
        if self.waiting.iter().any(|(n, _)| *n == node) {
            self.waiting.retain(|(n, _)| *n != node);
            out.push(ServerAction::Broken { to: node, held: false });
        }
        self.settle(node, out);
        self.grant_waiting(out);
    }

    /// The incarnation `node` made its last request here from, if any.
    pub fn incarnation_of(&self, node: NodeId) -> Option<u64> {
        self.incarnations.get(&node).copied()
    }

    /// `node` runs `incarnation` now (its request says so, or the monitor
    /// read it). If an earlier incarnation of it left a hold or a request
    /// here, that process is gone: they are dropped silently (the new
    /// process never asked for them, so it is not told), no release of them
    /// is expected, and the requests they blocked are granted.
    pub fn incarnation(&mut self, node: NodeId, incarnation: u64, out: &mut Vec<ServerAction>) {
        let previous = self.incarnations.insert(node, incarnation);
        if previous.is_none_or(|seen| seen == incarnation) {
            return;
        }
        if self.exclusive == Some(node) {
            self.exclusive = None;
        }
        self.shared.retain(|n| *n != node);
        self.waiting.retain(|(n, _)| *n != node);
        self.revoked.retain(|n| *n != node);
        self.grant_waiting(out);
    }

    /// Re-homing: this server starts serving the lock knowing nothing of
    /// its holders. It grants nothing until every node of `nodes` has
    /// reported ([`SrslQueue::report`]) or is lost ([`SrslQueue::peer_lost`]).
    pub fn start_rebuild(&mut self, nodes: impl IntoIterator<Item = NodeId>) {
        let pending: BTreeSet<NodeId> = nodes.into_iter().collect();
        self.rebuilding = (!pending.is_empty()).then_some(pending);
    }

    /// The nodes the rebuild still waits for (empty when not rebuilding).
    pub fn pending(&self) -> Vec<NodeId> {
        self.rebuilding.iter().flatten().copied().collect()
    }

    /// `from` reports what it holds. During the rebuild a hold is taken in
    /// as it was granted by the old server; after it (the node was judged
    /// lost, or never waited for) a hold could overlap grants made since,
    /// so it is refused: the holder is told its hold is broken.
    pub fn report(&mut self, from: NodeId, held: Option<LockMode>, out: &mut Vec<ServerAction>) {
        let rebuilding = self.rebuilding.as_ref().is_some_and(|p| p.contains(&from));
        if let Some(mode) = held.filter(|_| !self.holds(from)) {
            if rebuilding {
                match mode {
                    LockMode::Exclusive if self.exclusive.is_none() => self.exclusive = Some(from),
                    LockMode::Shared => self.shared.push(from),
                    // Two exclusive holders of the old server: it broke
                    // its own rule; the later report loses its hold.
                    LockMode::Exclusive => out.push(ServerAction::Broken { to: from, held: true }),
                }
            } else {
                self.revoked.retain(|n| *n != from);
                self.revoked.push(from);
                out.push(ServerAction::Broken { to: from, held: true });
            }
        }
        self.settle(from, out);
    }

    /// Takes `node` out of the rebuild's wait; the last one out lets the
    /// queue go on.
    fn settle(&mut self, node: NodeId, out: &mut Vec<ServerAction>) {
        if let Some(pending) = self.rebuilding.as_mut() {
            pending.remove(&node);
            if pending.is_empty() {
                self.rebuilding = None;
                self.grant_waiting(out);
                for (to, mode) in std::mem::take(&mut self.tries) {
                    if self.waiting.is_empty() && self.compatible(mode) {
                        self.take(to, mode, out);
                    } else {
                        out.push(ServerAction::Refuse { to });
                    }
                }
            }
        }
    }

    /// Grants the waiters at the head of the queue while they are compatible.
    fn grant_waiting(&mut self, out: &mut Vec<ServerAction>) {
        if self.rebuilding.is_some() {
            return;
        }
        while let Some(&(to, mode)) = self.waiting.front() {
            if !self.compatible(mode) {
                break;
            }
            self.waiting.pop_front();
            self.take(to, mode, out);
        }
    }

    /// Forgets everybody, telling each participant.
    pub fn break_all(&mut self, out: &mut Vec<ServerAction>) {
        let holders: Vec<NodeId> = self.exclusive.iter().chain(&self.shared).copied().collect();
        out.extend(holders.iter().map(|&to| ServerAction::Broken { to, held: true }));
        out.extend(self.waiting.iter().map(|&(to, _)| ServerAction::Broken { to, held: false }));
        let mut revoked = std::mem::take(&mut self.revoked);
        revoked.extend(holders);
        let incarnations = std::mem::take(&mut self.incarnations);
        *self = Self { revoked, incarnations, ..Self::default() };
    }
}

/// What an SRSL client does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAction {
    /// Send this message to the home.
    Send(SrslMsg),
    Granted {
        mode: LockMode,
        token: Option<u64>,
        abandoned: bool,
    },
    WouldBlock,
    Aborted,
    Idle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ClientState {
    Idle,
    Waiting { abandoned: bool },
    Holding,
}

/// One node's SRSL state for one lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SrslClient {
    node: NodeId,
    /// This process's incarnation, named in every `Acquire`.
    incarnation: u64,
    state: ClientState,
    /// The current hold's mode and fencing token (re-homing reports them).
    held: Option<(LockMode, Option<u64>)>,
}

impl SrslClient {
    pub fn new(node: NodeId, incarnation: u64) -> Self {
        Self { node, incarnation, state: ClientState::Idle, held: None }
    }

    /// The current hold's mode and fencing token, if holding.
    pub fn held(&self) -> Option<(LockMode, Option<u64>)> {
        self.held.filter(|_| self.is_holding())
    }

    pub fn is_idle(&self) -> bool {
        self.state == ClientState::Idle
    }

    pub fn is_holding(&self) -> bool {
        self.state == ClientState::Holding
    }

    fn violation(&self, what: &str) -> ProtocolViolation {
        ProtocolViolation { node: self.node, phase: "SrslClient", what: what.into() }
    }

    pub fn acquire(
        &mut self,
        mode: LockMode,
        try_only: bool,
        out: &mut Vec<ClientAction>,
    ) -> Result<(), ProtocolViolation> {
        if self.state != ClientState::Idle {
            return Err(self.violation("acquire while a request is in progress"));
        }
        self.state = ClientState::Waiting { abandoned: false };
        out.push(ClientAction::Send(SrslMsg::Acquire { mode, try_only, incarnation: self.incarnation }));
        Ok(())
    }

    pub fn abandon(&mut self) {
        if let ClientState::Waiting { .. } = self.state {
            self.state = ClientState::Waiting { abandoned: true };
        }
    }

    pub fn release(&mut self, out: &mut Vec<ClientAction>) -> Result<(), ProtocolViolation> {
        if self.state != ClientState::Holding {
            return Err(self.violation("release without a hold"));
        }
        self.state = ClientState::Idle;
        out.push(ClientAction::Send(SrslMsg::Release));
        out.push(ClientAction::Idle);
        Ok(())
    }

    /// A message from the home.
    pub fn message(&mut self, msg: SrslMsg, out: &mut Vec<ClientAction>) -> Result<(), ProtocolViolation> {
        match (msg, self.state) {
            (SrslMsg::Grant { mode, token }, ClientState::Waiting { abandoned }) => {
                let token = (mode == LockMode::Exclusive).then_some(token);
                out.push(ClientAction::Granted { mode, token, abandoned });
                self.state = ClientState::Holding;
                self.held = Some((mode, token));
                if abandoned {
                    self.release(out)?;
                }
                Ok(())
            }
            (SrslMsg::WouldBlock, ClientState::Waiting { .. }) => {
                self.state = ClientState::Idle;
                out.push(ClientAction::WouldBlock);
                out.push(ClientAction::Idle);
                Ok(())
            }
            // A hold's notice reaching a waiter is for a hold it released
            // before the break (its new request is the server's news).
            (SrslMsg::Broken { held: true }, ClientState::Waiting { .. }) => Ok(()),
            (SrslMsg::Broken { held: false }, ClientState::Waiting { .. })
            | (SrslMsg::Broken { held: true }, ClientState::Holding) => {
                self.state = ClientState::Idle;
                out.push(ClientAction::Aborted);
                out.push(ClientAction::Idle);
                Ok(())
            }
            // A break notice that crossed our release: nothing left to abort.
            (SrslMsg::Broken { .. }, ClientState::Idle) => Ok(()),
            _ => Err(self.violation("unexpected message")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_requests_behind_a_queued_exclusive_wait_for_it() {
        let mut q = SrslQueue::default();
        let mut out = Vec::new();
        q.acquire(NodeId(1), LockMode::Shared, false, &mut out).unwrap();
        q.acquire(NodeId(2), LockMode::Exclusive, false, &mut out).unwrap();
        q.acquire(NodeId(3), LockMode::Shared, false, &mut out).unwrap();
        q.acquire(NodeId(4), LockMode::Shared, false, &mut out).unwrap();
        assert_eq!(out, vec![ServerAction::Grant { to: NodeId(1), mode: LockMode::Shared }]);
        out.clear();
        q.acquire(NodeId(5), LockMode::Exclusive, true, &mut out).unwrap();
        assert_eq!(out, vec![ServerAction::Refuse { to: NodeId(5) }]);
        out.clear();
        q.release(NodeId(1), &mut out).unwrap();
        assert_eq!(out, vec![ServerAction::Grant { to: NodeId(2), mode: LockMode::Exclusive }]);
        out.clear();
        q.release(NodeId(2), &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                ServerAction::Grant { to: NodeId(3), mode: LockMode::Shared },
                ServerAction::Grant { to: NodeId(4), mode: LockMode::Shared }
            ]
        );
        assert!(q.release(NodeId(2), &mut out).is_err(), "a non-holder cannot release");
    }

    /// A holder released while the break was on its way: its release is
    /// consumed, and the hold's notice does not abort its next request.
    #[test]
    fn a_release_and_a_new_request_that_cross_a_break() {
        let (mut q, mut c) = (SrslQueue::default(), SrslClient::new(NodeId(1), 7));
        let mut out = Vec::new();
        q.acquire(NodeId(1), LockMode::Exclusive, false, &mut out).unwrap();
        q.acquire(NodeId(2), LockMode::Shared, false, &mut out).unwrap();
        out.clear();
        q.break_all(&mut out);
        assert_eq!(
            out,
            vec![
                ServerAction::Broken { to: NodeId(1), held: true },
                ServerAction::Broken { to: NodeId(2), held: false }
            ]
        );
        assert!(q.is_idle());
        out.clear();
        q.release(NodeId(1), &mut out).unwrap();
        assert!(out.is_empty(), "the crossing release is consumed");
        assert!(q.release(NodeId(1), &mut out).is_err(), "once");
        let mut actions = Vec::new();
        c.acquire(LockMode::Exclusive, false, &mut actions).unwrap();
        c.message(SrslMsg::Broken { held: true }, &mut actions).unwrap();
        assert!(!c.is_idle(), "a hold's notice does not abort a request");
        c.message(SrslMsg::Broken { held: false }, &mut actions).unwrap();
        assert!(c.is_idle(), "a waiter's notice does");
        assert_eq!(actions.last(), Some(&ClientAction::Idle));
        // A revoked holder that saw the notice first sends no release; its
        // next message is an acquire, after which a release is an error again.
        q.acquire(NodeId(1), LockMode::Exclusive, false, &mut out).unwrap();
        q.break_all(&mut out);
        q.acquire(NodeId(1), LockMode::Shared, false, &mut out).unwrap();
        q.release(NodeId(1), &mut out).unwrap();
        assert!(q.release(NodeId(1), &mut out).is_err());
    }

    /// A lost holder is revoked and its waiters granted; a lost waiter is
    /// dropped; a release the lost holder still sends is consumed.
    #[test]
    fn a_lost_holder_or_waiter_is_taken_out() {
        let mut q = SrslQueue::default();
        let mut out = Vec::new();
        q.acquire(NodeId(1), LockMode::Exclusive, false, &mut out).unwrap();
        q.acquire(NodeId(2), LockMode::Exclusive, false, &mut out).unwrap();
        q.acquire(NodeId(3), LockMode::Shared, false, &mut out).unwrap();
        assert_eq!(q.holders(), vec![NodeId(1)]);
        assert!(q.has_waiters());
        out.clear();
        q.peer_lost(NodeId(2), &mut out);
        assert_eq!(
            out,
            vec![ServerAction::Broken { to: NodeId(2), held: false }],
            "a waiter: dropped, nothing granted"
        );
        out.clear();
        q.peer_lost(NodeId(1), &mut out);
        assert_eq!(
            out,
            vec![
                ServerAction::Broken { to: NodeId(1), held: true },
                ServerAction::Grant { to: NodeId(3), mode: LockMode::Shared }
            ]
        );
        out.clear();
        q.release(NodeId(1), &mut out).unwrap();
        assert!(out.is_empty(), "the lost holder's late release is consumed");
        q.peer_lost(NodeId(7), &mut out);
        assert!(out.is_empty(), "a node with no request here: nothing to do");
        assert!(!q.has_waiters());
    }

    /// A node that died and started again under the same id: what its old
    /// incarnation left (a hold, a request) goes silently when its new one
    /// asks or is seen, and the requests it blocked are granted; the same
    /// incarnation asking again is not a restart.
    #[test]
    fn a_restarted_node_replaces_what_its_old_incarnation_left() {
        let mut q = SrslQueue::default();
        let mut out = Vec::new();
        q.incarnation(NodeId(3), 30, &mut out);
        q.acquire(NodeId(3), LockMode::Exclusive, false, &mut out).unwrap();
        q.incarnation(NodeId(1), 10, &mut out);
        q.acquire(NodeId(1), LockMode::Exclusive, false, &mut out).unwrap();
        out.clear();
        q.incarnation(NodeId(3), 30, &mut out);
        assert!(out.is_empty() && q.holders() == vec![NodeId(3)], "the same incarnation: nothing changes");
        assert_eq!(q.incarnation_of(NodeId(3)), Some(30));

        // Node 3's hold is its old incarnation's: dropped, node 1 granted,
        // and node 3 is not told (its new process never held).
        q.incarnation(NodeId(3), 31, &mut out);
        assert_eq!(out, vec![ServerAction::Grant { to: NodeId(1), mode: LockMode::Exclusive }]);
        assert_eq!(q.incarnation_of(NodeId(3)), Some(31));
        // Its new request is a first request, not a second one.
        out.clear();
        q.acquire(NodeId(3), LockMode::Exclusive, false, &mut out).unwrap();
        assert!(out.is_empty() && q.has_waiters(), "queued behind node 1");
        // A waiter's old incarnation goes the same way; a release of the
        // old hold is not expected (the process is gone).
        q.incarnation(NodeId(3), 32, &mut out);
        assert!(out.is_empty() && !q.has_waiters(), "{out:?}");
        q.release(NodeId(1), &mut out).unwrap();
        assert!(q.is_idle());
        assert!(q.release(NodeId(3), &mut out).is_err(), "no hold of node 3 is left");
    }

    /// A new server's rebuild: nothing is granted (not even a try) until
    /// every node reported or was lost; reported holds are kept and the
    /// waiters queue behind them; a hold reported after the rebuild (its
    /// node was judged lost) is refused as broken.
    #[test]
    fn a_rebuild_grants_nothing_until_every_node_reported_or_was_lost() {
        let (a, b, c, d) = (NodeId(1), NodeId(2), NodeId(3), NodeId(4));
        let mut q = SrslQueue::default();
        let mut out = Vec::new();
        q.start_rebuild([a, b, c, d]);
        q.acquire(b, LockMode::Exclusive, false, &mut out).unwrap();
        q.acquire(d, LockMode::Shared, true, &mut out).unwrap();
        q.report(b, None, &mut out);
        q.report(a, Some(LockMode::Exclusive), &mut out);
        assert!(out.is_empty(), "granted during the rebuild: {out:?}");
        assert_eq!((q.holders(), q.waiters(), q.pending()), (vec![a], vec![b], vec![c, d]));
        q.report(d, None, &mut out);
        // Node 3 (unreported: stopped) is judged lost: the rebuild ends.
        q.peer_lost(c, &mut out);
        assert_eq!(out, vec![ServerAction::Refuse { to: d }], "the try is answered, the waiter waits for node 1");
        out.clear();
        q.report(c, Some(LockMode::Exclusive), &mut out);
        assert_eq!(out, vec![ServerAction::Broken { to: c, held: true }], "a late report's hold is not honoured");
        out.clear();
        q.release(c, &mut out).unwrap();
        assert!(out.is_empty(), "its release is consumed");
        q.release(a, &mut out).unwrap();
        assert_eq!(out, vec![ServerAction::Grant { to: b, mode: LockMode::Exclusive }]);
    }

    #[test]
    fn an_abandoned_client_releases_its_late_grant() {
        let mut c = SrslClient::new(NodeId(1), 7);
        let mut out = Vec::new();
        c.acquire(LockMode::Exclusive, false, &mut out).unwrap();
        c.abandon();
        out.clear();
        c.message(SrslMsg::Grant { mode: LockMode::Exclusive, token: 9 }, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                ClientAction::Granted { mode: LockMode::Exclusive, token: Some(9), abandoned: true },
                ClientAction::Send(SrslMsg::Release),
                ClientAction::Idle
            ]
        );
        assert!(c.is_idle());
    }
}
