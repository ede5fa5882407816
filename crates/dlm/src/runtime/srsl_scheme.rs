//! The SRSL driver: the client side ([`crate::srsl::SrslClient`] per lock)
//! and, at homes, the server side ([`crate::srsl::SrslQueue`] per lock,
//! served by the receive thread), with the monitor's looks at both.
//!
//! **Re-homing** (three lock servers or more; `docs/internals/dlm-rehoming.md`,
//! "SRSL"): a client that finds its server lost locates the lock again,
//! which claims the next candidate through the membership words
//! (`rehome.rs`). A server that starts serving a lock it has no queue for
//! (in this incarnation) *adopts* it: it moves the fenced slot if a claim
//! made it the home, then rebuilds the queue from the clients before it
//! grants anything ([`SrslQueue::start_rebuild`]): every node is sent
//! `Rehomed` and answers with `Report` (a hold's mode and token; waiters
//! ask again), and a node that does not answer is waited for until the
//! liveness judges it lost (its lease). A server whose own slot is fenced
//! has been superseded: it drops its queue and tells its requesters `Moved`.

use super::cell::{
    acquire_in, home_stands, release_in, retire, retire_idle_cells_of_lost_homes, show, Cell, CellState, Engine,
    Outcome, Watching,
};
use super::node::Core;
use super::{DlmStats, Grant, LockScheme, Scheme, Wait};
use crate::error::LockError;
use crate::msg::DlmMessage;
use crate::proto::{ClientState, LockMode};
use crate::srsl::{ClientAction, ServerAction, SrslClient, SrslMsg, SrslQueue};
use crate::table::HomeMemory;
use crate::word::{generation_newer, FenceWord, LockWord, FENCE_OFFSET, FENCE_UNIT, LOCK_OFFSET};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tierstack_base::sync::lock;
use tierstack_base::NodeId;

use super::node::{wire_epoch, wire_home_epoch};

/// How often a rebuilding server sends `Rehomed` again to nodes that have not reported.
const REHOMED_RESEND: Duration = Duration::from_millis(500);

/// The part of a wire epoch that names the server's incarnation.
fn incarnation_bits(epoch: u64) -> u64 {
    epoch & ((1 << 48) - 1)
}

/// The server's state for one lock it serves.
pub(super) struct Served {
    queue: SrslQueue,
    /// The lock's slot in our table.
    base: u64,
    /// The lock's home epoch this server serves it at (0 without re-homing).
    home_epoch: u32,
    /// When `Rehomed` last went out (while rebuilding).
    noticed: Option<Instant>,
    /// This node's lease lapses when it adopted the lock: a server that was
    /// stopped past its lease may have been superseded where it could not
    /// be fenced (tcp), so it adopts the lock again (a view, a rebuild).
    lapses: u64,
}

/// SRSL: the home's receive thread serves every request.
pub(super) struct SrslScheme {
    pub(super) core: Core,
    pub(super) cells: Mutex<HashMap<LockId, Arc<Cell<SrslClient>>>>,
    /// Server side (at homes): each lock's queue and its slot in our table.
    pub(super) served: Mutex<HashMap<LockId, Served>>,
}

impl SrslScheme {
    fn drive(
        &self,
        cell: &Cell<SrslClient>,
        st: &mut CellState<SrslClient>,
        actions: Vec<ClientAction>,
    ) -> Result<(), LockError> {
        let mut first_error = None;
        let (server, epoch) = st.reported_to.unwrap_or((cell.slot.home_node, cell.slot.wire_epoch));
        for action in actions {
            match action {
                ClientAction::Send(msg) => {
                    let message = DlmMessage::Srsl { lock: cell.id, epoch, msg };
                    if let Err(e) = self.core.send(cell.id, server, &message) {
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
        st.progress = st.progress.wrapping_add(1);
        show(self, cell, st);
        cell.changed.notify_all();
        first_error.map_or(Ok(()), Err)
    }

    fn protocol(violation: crate::proto::ProtocolViolation) -> LockError {
        LockError::Protocol(violation.to_string())
    }

    /// Server side: runs `op` on the lock's queue and sends what it decides.
    /// `from` is the request's sender and wire epoch, if `op` answers a
    /// request: with re-homing, a request for a lock this server does not
    /// serve (at that home epoch) is answered `Moved`. `token_floor`: a
    /// reported token that every token granted from now on must exceed.
    fn serve(
        &self,
        lock_id: LockId,
        from: Option<(NodeId, u64)>,
        token_floor: Option<u64>,
        op: impl FnOnce(&mut SrslQueue, &mut Vec<ServerAction>) -> Result<(), crate::proto::ProtocolViolation>,
    ) -> Result<(), LockError> {
        let table = self.core.table.as_ref().ok_or_else(|| {
            LockError::Protocol(format!("{lock_id}: SRSL request to {}, which serves no locks", self.core.me))
        })?;
        let memory = HomeMemory::Local(table.clone());
        let mut served = lock(&self.served);
        let mut actions = Vec::new();
        if self.core.rehoming() {
            let superseded = served.get(&lock_id).is_some_and(|s| {
                self.core.lapsed_since(s.lapses) || memory.read_u64(s.base + LOCK_OFFSET).is_ok_and(LockWord::is_fenced)
            });
            if superseded {
                // Another server serves the lock now (or may: this one was
                // stopped past its lease): nothing here may grant.
                if let Some(old) = served.remove(&lock_id) {
                    tracing::warn!(node = %self.core.me, lock = %lock_id, "SRSL: superseded (or stopped past the lease) as the lock's server");
                    self.tell_moved(lock_id, &old, old.queue.participants());
                }
            }
            if let std::collections::hash_map::Entry::Vacant(vacant) = served.entry(lock_id) {
                // Not ours, or no view now (a server unreachable for the
                // moment): the requester locates the lock again.
                let adopted = self.adopt(lock_id, &memory);
                if let Ok(Some(adopted)) = adopted {
                    vacant.insert(adopted);
                } else {
                    if let Some((to, epoch)) = from {
                        self.send_to(lock_id, to, epoch, SrslMsg::Moved);
                    }
                    return adopted.map(|_| ());
                }
            }
        }
        let entry = match served.entry(lock_id) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let base = memory
                    .lookup(lock_id)
                    .map_err(|e| LockError::Fabric { lock: lock_id, source: e })?
                    .ok_or(LockError::UnknownLock { lock: lock_id, home: self.core.me })?;
                entry.insert(Served { queue: SrslQueue::default(), base, home_epoch: 0, noticed: None, lapses: 0 })
            }
        };
        let epoch = wire_epoch(self.core.incarnation, entry.home_epoch);
        if let Some((to, their)) = from.filter(|(_, their)| *their != epoch) {
            // Sent for another home epoch of the lock than the one served here.
            self.send_to(lock_id, to, their, SrslMsg::Moved);
            return Ok(());
        }
        let base = entry.base;
        if let Some(token) = token_floor {
            memory
                .raise_fence(self.core.me, base, FenceWord::decode(token).count)
                .map_err(|e| LockError::Fabric { lock: lock_id, source: e })?;
        }
        op(&mut entry.queue, &mut actions).map_err(Self::protocol)?;
        let mut first_error = None;
        for action in actions {
            let (to, msg) = match action {
                ServerAction::Grant { to, mode } => {
                    let token = if mode == LockMode::Exclusive {
                        let fence = table.memory().fetch_add(base + FENCE_OFFSET, FENCE_UNIT);
                        crate::word::fencing_token(fence.map_err(|e| LockError::Fabric { lock: lock_id, source: e })?)
                    } else {
                        0
                    };
                    (to, SrslMsg::Grant { mode, token })
                }
                ServerAction::Refuse { to } => (to, SrslMsg::WouldBlock),
                ServerAction::Broken { to, held } => (to, SrslMsg::Broken { held }),
            };
            let message = DlmMessage::Srsl { lock: lock_id, epoch, msg };
            if let Err(e) = self.core.send(lock_id, to, &message) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sends one SRSL message; a failure is only logged (the receiver is
    /// dead or slow, which the monitor handles).
    fn send_to(&self, lock_id: LockId, to: NodeId, epoch: u64, msg: SrslMsg) {
        let message = DlmMessage::Srsl { lock: lock_id, epoch, msg };
        if let Err(e) = self.core.send(lock_id, to, &message) {
            tracing::debug!(node = %self.core.me, %to, ?msg, error = %e, "SRSL message not delivered");
        }
    }

    fn tell_moved(&self, lock_id: LockId, served: &Served, to: Vec<NodeId>) {
        let epoch = wire_epoch(self.core.incarnation, served.home_epoch);
        for node in to {
            self.send_to(lock_id, node, epoch, SrslMsg::Moved);
        }
    }

    /// Re-homing: starts serving `lock_id`, which this server has no queue
    /// for, if the lock's settled view names it. A fenced slot (a claim
    /// made this server the home) is moved first: every other server's
    /// slot fenced, ours raised above their fence words and the seed
    /// ([`Core::prepare_move`]), our fence lifted. Either way the queue
    /// starts with a rebuild: this server cannot know who holds the lock
    /// (its predecessor died, or this process restarted). `None`: not ours.
    fn adopt(&self, lock_id: LockId, memory: &HomeMemory) -> Result<Option<Served>, LockError> {
        let view = self.core.view(lock_id)?;
        if !view.settled || view.home != self.core.me {
            return Ok(None);
        }
        let slot = self.core.slot_at(lock_id, self.core.me, view.epoch, false)?;
        let fabric_err = |e| LockError::Fabric { lock: lock_id, source: e };
        let word = memory.read_u64(slot.base + LOCK_OFFSET).map_err(fabric_err)?;
        if LockWord::is_fenced(word) {
            let Some(fenced) = self.core.prepare_move(lock_id, &slot)? else { return Ok(None) };
            let lifted = LockWord::free(0).encode();
            let previous = memory.compare_swap(slot.base + LOCK_OFFSET, fenced, lifted).map_err(fabric_err)?;
            if previous != fenced && LockWord::is_fenced(previous) {
                return Ok(None);
            }
            self.core.rehomes.fetch_add(1, Ordering::Relaxed);
            self.core.moves.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(node = %self.core.me, lock = %lock_id, epoch = view.epoch, "SRSL: serving a re-homed lock");
        }
        let lapses = self.core.lease_mark();
        let mut queue = SrslQueue::default();
        queue.start_rebuild(self.core.nodes.iter().copied());
        let served = Served {
            queue,
            base: slot.base,
            home_epoch: view.epoch,
            noticed: Some(tierstack_base::time::instant_now()),
            lapses,
        };
        let epoch = wire_epoch(self.core.incarnation, view.epoch);
        for &node in self.core.nodes.iter() {
            self.core.watch(node);
            self.send_to(lock_id, node, epoch, SrslMsg::Rehomed);
        }
        Ok(Some(served))
    }

    /// Server side of the monitor: takes lost holders out of locks that
    /// have waiters (a lost holder of a lock nobody waits for harms nobody
    /// yet; a lost waiter harms nobody until it is granted, and then it is
    /// a holder).
    fn watch_served(&self) {
        self.watch_rebuilds();
        let blocked: Vec<(LockId, Vec<NodeId>)> = lock(&self.served)
            .iter()
            .filter(|(_, served)| served.queue.has_waiters())
            .map(|(lock_id, served)| (*lock_id, served.queue.holders()))
            .collect();
        for (lock_id, holders) in blocked {
            for holder in holders {
                // Died and started again under the same id before anybody
                // judged it dead: the hold is its old incarnation's.
                let recorded = lock(&self.served).get(&lock_id).and_then(|served| served.queue.incarnation_of(holder));
                if let (Some(recorded), Some(running)) = (recorded, self.core.running_incarnation(holder)) {
                    if running != recorded {
                        tracing::warn!(node = %self.core.me, lock = %lock_id, restarted = %holder, "SRSL: a holder restarted");
                        self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
                        self.core.recoveries.fetch_add(1, Ordering::Relaxed);
                        let served = self.serve(lock_id, None, None, |queue, out| {
                            queue.incarnation(holder, running, out);
                            Ok(())
                        });
                        if let Err(e) = served {
                            tracing::debug!(lock = %lock_id, error = %e, "SRSL: recovery messages");
                        }
                        continue;
                    }
                }
                let Some(reason) = self.core.lost(holder) else { continue };
                tracing::warn!(node = %self.core.me, lock = %lock_id, lost = %holder, %reason, "SRSL: a holder is lost");
                self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
                self.core.recoveries.fetch_add(1, Ordering::Relaxed);
                let served = self.serve(lock_id, None, None, |queue, out| {
                    queue.peer_lost(holder, out);
                    Ok(())
                });
                if let Err(e) = served {
                    // The lost holder is told too; that send fails.
                    tracing::debug!(lock = %lock_id, error = %e, "SRSL: recovery messages");
                }
            }
        }
    }

    /// Server side of the monitor, re-homing: a rebuild stops waiting for
    /// nodes judged lost (dead, or their lease ran out: an unreported
    /// holder's hold has lapsed by then, and its release says `Broken`),
    /// and asks the others again now and then.
    fn watch_rebuilds(&self) {
        let now = tierstack_base::time::instant_now();
        let rebuilding: Vec<(LockId, Vec<NodeId>, Option<u64>)> = lock(&self.served)
            .iter_mut()
            .filter(|(_, served)| !served.queue.pending().is_empty())
            .map(|(lock_id, served)| {
                let resend = served.noticed.is_none_or(|at| now.duration_since(at) >= REHOMED_RESEND);
                if resend {
                    served.noticed = Some(now);
                }
                let epoch = wire_epoch(self.core.incarnation, served.home_epoch);
                (*lock_id, served.queue.pending(), resend.then_some(epoch))
            })
            .collect();
        for (lock_id, pending, resend) in rebuilding {
            for node in pending {
                if let Some(reason) = self.core.lost(node) {
                    tracing::warn!(node = %self.core.me, lock = %lock_id, lost = %node, %reason, "SRSL: the rebuild stops waiting for a lost node");
                    let served = self.serve(lock_id, None, None, |queue, out| {
                        queue.peer_lost(node, out);
                        Ok(())
                    });
                    if let Err(e) = served {
                        tracing::debug!(lock = %lock_id, error = %e, "SRSL: rebuild messages");
                    }
                } else if let Some(epoch) = resend {
                    self.send_to(lock_id, node, epoch, SrslMsg::Rehomed);
                }
            }
        }
    }

    /// Client side of re-homing: `server` serves the lock now (wire epoch
    /// `epoch`) and asks what this node holds. A hold of an older server is
    /// reported (its release goes to the new one); a request waiting at an
    /// older server is forgotten and made again; the answer is `Report`.
    fn rehomed(&self, lock_id: LockId, server: NodeId, epoch: u64) {
        let cell = lock(&self.cells).get(&lock_id).cloned();
        let held = cell.and_then(|cell| {
            let mut st = lock(&cell.state);
            let (at, at_epoch) = st.reported_to.unwrap_or((cell.slot.home_node, cell.slot.wire_epoch));
            if at == server && at_epoch == epoch {
                // Already there: a waiter's request is queued, a hold reported.
                return st.machine.held();
            }
            if !generation_newer(wire_home_epoch(epoch), wire_home_epoch(at_epoch)) {
                return None; // a notice older than what this cell knows
            }
            if let Some(held) = st.machine.held() {
                tracing::info!(node = %self.core.me, lock = %lock_id, %server, "SRSL: reporting a hold to the lock's new server");
                st.reported_to = Some((server, epoch));
                return Some(held);
            }
            if !st.machine.is_idle() {
                st.machine = SrslClient::new(self.core.me, self.core.incarnation);
                if st.outcome.is_none() {
                    st.outcome = Some(Outcome::Requeue);
                }
                st.progress = st.progress.wrapping_add(1);
                show(self, &cell, &mut st);
                cell.changed.notify_all();
            }
            drop(st);
            retire(self, &cell);
            None
        });
        let held = held.map(|(mode, token)| (mode, token.unwrap_or(0)));
        self.send_to(lock_id, server, epoch, SrslMsg::Report { held });
    }

    /// Client side: the server does not serve the lock (any more). A
    /// request waiting there is made again (located afresh).
    fn moved(&self, cell: &Arc<Cell<SrslClient>>) {
        let mut st = lock(&cell.state);
        if !st.machine.is_idle() && !st.machine.is_holding() {
            st.machine = SrslClient::new(self.core.me, self.core.incarnation);
            if st.outcome.is_none() {
                st.outcome = Some(Outcome::Requeue);
            }
            st.progress = st.progress.wrapping_add(1);
            show(self, cell, &mut st);
            cell.changed.notify_all();
        }
        if !st.machine.is_holding() {
            drop(st);
            retire(self, cell);
        }
    }

    /// Client side of the monitor: a request that waits for a server whose
    /// process ended (or whose lease expired) fails at once; a hold at a
    /// server whose incarnation ended is revoked (its release says
    /// `Broken`), since the server's next incarnation knows nothing of it.
    fn watch_cell(&self, cell: &Arc<Cell<SrslClient>>) {
        let (waiting, holding, progress) = {
            let st = lock(&cell.state);
            (!st.machine.is_idle() && !st.machine.is_holding(), st.machine.is_holding(), st.progress)
        };
        let home = cell.slot.home_node;
        if holding && self.core.rehoming() {
            // The hold is kept: it is reported to whichever server takes
            // the lock over, and its release ends it locally if none does.
            return;
        }
        if holding {
            let Some(reason) = self.core.home_lost(home, cell.slot.epoch) else { return };
            let mut st = lock(&cell.state);
            if st.progress == progress && st.machine.is_holding() {
                tracing::warn!(node = %self.core.me, lock = %cell.id, %home, %reason, "SRSL: a hold's server is lost");
                st.machine = SrslClient::new(self.core.me, self.core.incarnation);
                st.broken = st.serial;
                st.progress = st.progress.wrapping_add(1);
                show(self, cell, &mut st);
                cell.changed.notify_all();
                drop(st);
                retire(self, cell);
            }
            return;
        }
        let mut watching = lock(&cell.watching);
        if !waiting {
            *watching = Watching::default();
            return;
        }
        if watching.progress.is_none_or(|(seen, _)| seen != progress) {
            watching.progress = Some((progress, tierstack_base::time::instant_now()));
            return;
        }
        drop(watching);
        // The server's thread serves every request: a stopped server is as
        // good as dead once its lease runs out.
        let Some(reason) = self.core.home_lost(home, cell.slot.epoch).or_else(|| self.core.lost(home)) else {
            return;
        };
        let mut st = lock(&cell.state);
        if st.progress == progress && !st.machine.is_idle() && !st.machine.is_holding() {
            tracing::warn!(node = %self.core.me, lock = %cell.id, %home, %reason, "SRSL: the server is lost");
            st.machine = SrslClient::new(self.core.me, self.core.incarnation);
            st.outcome = Some(if self.core.rehoming() {
                // Located again: the next candidate takes the lock over.
                Outcome::Requeue
            } else {
                Outcome::Failed(LockError::PeerDead { lock: cell.id, node: home, reason })
            });
            st.progress = st.progress.wrapping_add(1);
            show(self, cell, &mut st);
            cell.changed.notify_all();
            drop(st);
            retire(self, cell);
        }
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
        SrslClient::new(self.core.me, self.core.incarnation)
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

    fn shown(&self, cell: &Cell<SrslClient>, st: &CellState<SrslClient>) -> (ClientState, u16, Option<NodeId>) {
        if st.machine.is_idle() {
            (ClientState::Idle, 0, None)
        } else if st.machine.is_holding() {
            (ClientState::Holding { mode: st.mode }, 0, None)
        } else {
            (ClientState::Waiting { mode: st.mode }, 0, Some(cell.slot.home_node))
        }
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
            st.machine = SrslClient::new(self.core.me, self.core.incarnation);
            if self.core.rehoming() {
                // Its server is gone: locate the lock again (claiming the
                // next candidate once the liveness judges it lost).
                retire(self, cell);
                st.outcome = Some(Outcome::Requeue);
                return Ok(());
            }
        }
        sent
    }

    fn abandon(&self, _cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) {
        st.machine.abandon();
    }

    fn release(&self, cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) -> Result<(), LockError> {
        let mut actions = Vec::new();
        st.machine.release(&mut actions).map_err(Self::protocol)?;
        let sent = self.drive(cell, st, actions);
        if self.core.rehoming() {
            // A release that reaches no server ends the hold here: a new
            // server waits for this node's report (or its lease) before it
            // grants, and a restarted one never serves at the old epoch.
            if sent.is_err() || st.reported_to.take().is_some() {
                retire(self, cell);
            }
            return Ok(());
        }
        sent?;
        home_stands(self, cell)
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
        if self.core.rehoming() {
            return self.core.create_everywhere(lock_id);
        }
        self.core.locate(lock_id, true).map(|_| ())
    }

    fn acquire(&self, lock_id: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
        acquire_in(self, lock_id, mode, wait)
    }

    fn release(&self, grant: &Grant) -> Result<(), LockError> {
        release_in(self, grant)
    }

    fn break_lock(&self, lock_id: LockId) -> Result<u64, LockError> {
        let (slot, _) = self.core.locate(lock_id, false)?;
        let floor = crate::word::fencing_token(
            slot.home
                .fetch_add(slot.base + FENCE_OFFSET, FENCE_UNIT)
                .map_err(|e| LockError::from_fabric(lock_id, slot.home_node, e))?,
        );
        tracing::warn!(lock = %lock_id, floor, "lock broken");
        self.core.moves.fetch_add(1, Ordering::Relaxed);
        let message = DlmMessage::Srsl { lock: lock_id, epoch: slot.wire_epoch, msg: SrslMsg::Break };
        self.core.send(lock_id, slot.home_node, &message)?;
        Ok(floor)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let result = self.handle_srsl(from, payload);
        self.core.counted(result)
    }

    fn placement(&self, lock_id: LockId) -> Result<super::Placement, LockError> {
        self.core.placement(lock_id)
    }

    fn stats(&self) -> DlmStats {
        self.core.stats()
    }

    /// The server's queue of the lock (if this node serves it) and this
    /// node's client state: `served at home epoch E holders [..] waiters
    /// [..] pending [..]` (node numbers; pending: the rebuild's wait).
    fn debug_state(&self, lock_id: LockId) -> String {
        let ids = |nodes: Vec<NodeId>| nodes.iter().map(|n| n.0).collect::<Vec<_>>();
        let server = lock(&self.served).get(&lock_id).map_or_else(
            || "not served here".to_string(),
            |s| {
                format!(
                    "served at home epoch {} holders {:?} waiters {:?} pending {:?}",
                    s.home_epoch,
                    ids(s.queue.holders()),
                    ids(s.queue.waiters()),
                    ids(s.queue.pending())
                )
            },
        );
        let client = lock(&self.cells).get(&lock_id).cloned().map_or_else(
            || "never used".to_string(),
            |cell| {
                let st = lock(&cell.state);
                format!("client of {} {:?} reported to {:?}", cell.slot.home_node, st.machine, st.reported_to)
            },
        );
        format!("{}: {server}; {client}", self.core.me)
    }

    fn tick(&self) {
        if self.core.table.is_some() {
            self.watch_served();
        }
        let cells: Vec<_> = lock(&self.cells).values().cloned().collect();
        if self.core.rehoming() {
            retire_idle_cells_of_lost_homes(self, &cells);
        }
        for cell in cells {
            self.watch_cell(&cell);
        }
    }
}

impl SrslScheme {
    fn handle_srsl(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let (lock_id, epoch, msg) = match DlmMessage::decode(payload).map_err(|e| LockError::Protocol(e.to_string()))? {
            DlmMessage::Srsl { lock, epoch, msg } => (lock, epoch, msg),
            other => return Err(LockError::Protocol(format!("{other:?} from {from} to an SRSL node"))),
        };
        let to_server =
            matches!(msg, SrslMsg::Acquire { .. } | SrslMsg::Release | SrslMsg::Break | SrslMsg::Report { .. });
        if to_server && incarnation_bits(epoch) != incarnation_bits(self.core.incarnation) {
            // For an earlier incarnation of this server: nothing of it is left here.
            tracing::debug!(lock = %lock_id, %from, ?msg, "SRSL: a message for an earlier incarnation of this server");
            if matches!(msg, SrslMsg::Acquire { .. }) && self.core.rehoming() {
                self.send_to(lock_id, from, epoch, SrslMsg::Moved);
            }
            return Ok(());
        }
        let request = Some((from, epoch));
        match msg {
            SrslMsg::Acquire { mode, try_only, incarnation } => {
                // The requester's incarnation runs now; a handle to an older
                // one would later make the monitor revoke this live hold.
                self.core.forget_watch(from);
                self.serve(lock_id, request, None, |q, out| {
                    // What an earlier incarnation of it left here goes first.
                    q.incarnation(from, incarnation, out);
                    q.acquire(from, mode, try_only, out)
                })
            }
            SrslMsg::Release => self.serve(lock_id, None, None, |q, out| q.release(from, out)),
            SrslMsg::Break => self.serve(lock_id, None, None, |q, out| {
                q.break_all(out);
                Ok(())
            }),
            SrslMsg::Report { held } => {
                let floor = held.and_then(|(mode, token)| (mode == LockMode::Exclusive).then_some(token));
                self.serve(lock_id, None, floor, |q, out| {
                    q.report(from, held.map(|(mode, _)| mode), out);
                    Ok(())
                })
            }
            SrslMsg::Rehomed => {
                self.rehomed(lock_id, from, epoch);
                Ok(())
            }
            SrslMsg::Grant { .. } | SrslMsg::WouldBlock | SrslMsg::Broken { .. } | SrslMsg::Moved => {
                let cell = lock(&self.cells).get(&lock_id).cloned().ok_or_else(|| {
                    LockError::Protocol(format!("{lock_id}: {msg:?} for a lock this node never used"))
                })?;
                let mut st = lock(&cell.state);
                let at = st.reported_to.map_or(cell.slot.wire_epoch, |(_, reported)| reported);
                if at != epoch || (cell.retired.load(Ordering::Acquire) && st.machine.is_idle()) {
                    // From another incarnation (or home epoch) of the server
                    // than this cell's, or for a request forgotten since.
                    return Ok(());
                }
                if msg == SrslMsg::Moved {
                    drop(st);
                    self.moved(&cell);
                    return Ok(());
                }
                let mut actions = Vec::new();
                st.machine.message(msg, &mut actions).map_err(Self::protocol)?;
                self.drive(&cell, &mut st, actions)
            }
        }
    }
}
