//! The SRSL driver: the client side ([`crate::srsl::SrslClient`] per lock)
//! and, at homes, the server side ([`crate::srsl::SrslQueue`] per lock,
//! served by the receive thread), with the monitor's looks at both.

use super::cell::{acquire_in, home_stands, release_in, retire, show, Cell, CellState, Engine, Outcome, Watching};
use super::node::Core;
use super::{DlmStats, Grant, LockScheme, Scheme, Wait};
use crate::error::LockError;
use crate::msg::DlmMessage;
use crate::proto::{ClientState, LockMode};
use crate::srsl::{ClientAction, ServerAction, SrslClient, SrslMsg, SrslQueue};
use crate::table::HomeMemory;
use crate::word::{FENCE_OFFSET, FENCE_UNIT};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tierstack_base::sync::lock;
use tierstack_base::NodeId;

/// SRSL: the home's receive thread serves every request.
pub(super) struct SrslScheme {
    pub(super) core: Core,
    pub(super) cells: Mutex<HashMap<LockId, Arc<Cell<SrslClient>>>>,
    /// Server side (at homes): each lock's queue and its slot in our table.
    pub(super) served: Mutex<HashMap<LockId, (SrslQueue, u64)>>,
}

impl SrslScheme {
    fn drive(
        &self,
        cell: &Cell<SrslClient>,
        st: &mut CellState<SrslClient>,
        actions: Vec<ClientAction>,
    ) -> Result<(), LockError> {
        let mut first_error = None;
        for action in actions {
            match action {
                ClientAction::Send(msg) => {
                    let message = DlmMessage::Srsl { lock: cell.id, epoch: cell.slot.epoch, msg };
                    if let Err(e) = self.core.send(cell.id, cell.slot.home_node, &message) {
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
    fn serve(
        &self,
        lock_id: LockId,
        op: impl FnOnce(&mut SrslQueue, &mut Vec<ServerAction>) -> Result<(), crate::proto::ProtocolViolation>,
    ) -> Result<(), LockError> {
        let table = self.core.table.as_ref().ok_or_else(|| {
            LockError::Protocol(format!("{lock_id}: SRSL request to {}, which serves no locks", self.core.me))
        })?;
        let mut served = lock(&self.served);
        let (queue, base) = match served.entry(lock_id) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let base = HomeMemory::Local(table.clone())
                    .lookup(lock_id)
                    .map_err(|e| LockError::Fabric { lock: lock_id, source: e })?
                    .ok_or(LockError::UnknownLock { lock: lock_id, home: self.core.me })?;
                entry.insert((SrslQueue::default(), base))
            }
        };
        let mut actions = Vec::new();
        op(queue, &mut actions).map_err(Self::protocol)?;
        let mut first_error = None;
        for action in actions {
            let (to, msg) = match action {
                ServerAction::Grant { to, mode } => {
                    let token = if mode == LockMode::Exclusive {
                        let fence = table.memory().fetch_add(*base + FENCE_OFFSET, FENCE_UNIT);
                        crate::word::fencing_token(fence.map_err(|e| LockError::Fabric { lock: lock_id, source: e })?)
                    } else {
                        0
                    };
                    (to, SrslMsg::Grant { mode, token })
                }
                ServerAction::Refuse { to } => (to, SrslMsg::WouldBlock),
                ServerAction::Broken { to, held } => (to, SrslMsg::Broken { held }),
            };
            let message = DlmMessage::Srsl { lock: lock_id, epoch: self.core.incarnation, msg };
            if let Err(e) = self.core.send(lock_id, to, &message) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Server side of the monitor: takes lost holders out of locks that
    /// have waiters (a lost holder of a lock nobody waits for harms nobody
    /// yet; a lost waiter harms nobody until it is granted, and then it is
    /// a holder).
    fn watch_served(&self) {
        let blocked: Vec<(LockId, Vec<NodeId>)> = lock(&self.served)
            .iter()
            .filter(|(_, (queue, _))| queue.has_waiters())
            .map(|(lock_id, (queue, _))| (*lock_id, queue.holders()))
            .collect();
        for (lock_id, holders) in blocked {
            for holder in holders {
                // Died and started again under the same id before anybody
                // judged it dead: the hold is its old incarnation's.
                let recorded = lock(&self.served).get(&lock_id).and_then(|(queue, _)| queue.incarnation_of(holder));
                if let (Some(recorded), Some(running)) = (recorded, self.core.running_incarnation(holder)) {
                    if running != recorded {
                        tracing::warn!(node = %self.core.me, lock = %lock_id, restarted = %holder, "SRSL: a holder restarted");
                        self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
                        self.core.recoveries.fetch_add(1, Ordering::Relaxed);
                        let served = self.serve(lock_id, |queue, out| {
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
                let served = self.serve(lock_id, |queue, out| {
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
            st.outcome = Some(Outcome::Failed(LockError::PeerDead { lock: cell.id, node: home, reason }));
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
        }
        sent
    }

    fn abandon(&self, _cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) {
        st.machine.abandon();
    }

    fn release(&self, cell: &Cell<SrslClient>, st: &mut CellState<SrslClient>) -> Result<(), LockError> {
        let mut actions = Vec::new();
        st.machine.release(&mut actions).map_err(Self::protocol)?;
        self.drive(cell, st, actions)?;
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
        let message = DlmMessage::Srsl { lock: lock_id, epoch: slot.epoch, msg: SrslMsg::Break };
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

    fn tick(&self) {
        if self.core.table.is_some() {
            self.watch_served();
        }
        let cells: Vec<_> = lock(&self.cells).values().cloned().collect();
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
        let to_server = matches!(msg, SrslMsg::Acquire { .. } | SrslMsg::Release | SrslMsg::Break);
        if to_server && epoch != self.core.incarnation {
            // For an earlier incarnation of this server: nothing of it is left here.
            tracing::debug!(lock = %lock_id, %from, ?msg, "SRSL: a message for an earlier incarnation of this server");
            return Ok(());
        }
        match msg {
            SrslMsg::Acquire { mode, try_only, incarnation } => {
                // The requester's incarnation runs now; a handle to an older
                // one would later make the monitor revoke this live hold.
                self.core.forget_watch(from);
                self.serve(lock_id, |q, out| {
                    // What an earlier incarnation of it left here goes first.
                    q.incarnation(from, incarnation, out);
                    q.acquire(from, mode, try_only, out)
                })
            }
            SrslMsg::Release => self.serve(lock_id, |q, out| q.release(from, out)),
            SrslMsg::Break => self.serve(lock_id, |q, out| {
                q.break_all(out);
                Ok(())
            }),
            SrslMsg::Grant { .. } | SrslMsg::WouldBlock | SrslMsg::Broken { .. } => {
                let cell = lock(&self.cells).get(&lock_id).cloned().ok_or_else(|| {
                    LockError::Protocol(format!("{lock_id}: {msg:?} for a lock this node never used"))
                })?;
                if cell.slot.epoch != epoch {
                    // From another incarnation of the server than this cell's.
                    return Ok(());
                }
                let mut st = lock(&cell.state);
                let mut actions = Vec::new();
                st.machine.message(msg, &mut actions).map_err(Self::protocol)?;
                self.drive(&cell, &mut st, actions)
            }
        }
    }
}
