//! The N-CoShED and DQNL driver: feeds [`crate::proto::LockClient`] its
//! inputs, executes its atomics first-hand on the lock's home, sends its
//! messages, and runs the monitor's look at each waiting cell.

use super::cell::{
    acquire_in, cell_of, home_stands, release_in, retire, retire_idle_cells_of_lost_homes, show, wait_until, Cell,
    CellState, Engine, Outcome, Watching,
};
use super::node::wire_home_epoch;
use super::node::Core;
use super::{DlmStats, Grant, LockScheme, Scheme, Wait};
use crate::error::LockError;
use crate::msg::DlmMessage;
use crate::proto::{
    AbortReason, Action, AtomicOp, BlockedOn, ClientState, Input, LockClient, LockMode, ProtoMsg, QueueKind, WordKind,
};
use crate::word::{generation_newer, LockWord, FENCE_OFFSET};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::sync::lock;
use tierstack_base::NodeId;
use tierstack_fabric::FabricError;

/// How often a barrier sends its notice again to nodes that have not answered.
const NOTICE_RESEND: Duration = Duration::from_millis(500);
/// How long `break_lock` waits for this node's part of the move (the
/// barrier's release) to finish.
const BREAK_SETTLE: Duration = Duration::from_secs(10);

/// N-CoShED and DQNL: the distributed queue of [`crate::proto`].
pub(super) struct QueueScheme {
    pub(super) core: Core,
    pub(super) kind: QueueKind,
    pub(super) cells: Mutex<HashMap<LockId, Arc<Cell<LockClient>>>>,
}

impl QueueScheme {
    /// Feeds `input` and carries out every action, atomics first-hand.
    /// Failed sends are not errors of the request: the monitor notices a
    /// dead receiver, and a slow one gets the message later.
    fn drive(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>, input: Input) -> Result<(), LockError> {
        let result = self.drive_inner(cell, st, input);
        st.progress = st.progress.wrapping_add(1);
        show(self, cell, st);
        cell.changed.notify_all();
        result
    }

    fn drive_inner(
        &self,
        cell: &Cell<LockClient>,
        st: &mut CellState<LockClient>,
        input: Input,
    ) -> Result<(), LockError> {
        let releasing = matches!(input, Input::Release);
        let mut next = Some(input);
        while let Some(input) = next.take() {
            let mut actions = Vec::new();
            if let Err(violation) = st.machine.handle(input, &mut actions) {
                return Err(LockError::Protocol(violation.to_string()));
            }
            for action in actions {
                match action {
                    Action::Atomic(ops) => match cell.slot.home.execute(cell.slot.base, &ops) {
                        Ok(results) if self.core.rehoming() && met_fence(&ops, &results) => {
                            self.home_gone(cell, st, releasing, "its slot there is fenced (the lock moved)");
                            return Ok(());
                        }
                        Ok(results) => {
                            st.touched = true;
                            next = Some(Input::AtomicDone { results, len: ops.len() });
                        }
                        Err(e) if self.core.rehoming() && self.home_is_lost(cell, &e) => {
                            self.home_gone(cell, st, releasing, &e.to_string());
                            return Ok(());
                        }
                        Err(e) => {
                            // We cannot know whether the atomic applied: forget
                            // the request. Whoever queued behind it is told
                            // `Nack` and recovers the lock.
                            let dead_home = matches!(e, FabricError::PeerDead { .. });
                            let error = LockError::from_fabric(cell.id, cell.slot.home_node, e);
                            st.machine.reset();
                            st.outcome = Some(Outcome::Failed(error.clone()));
                            if dead_home {
                                retire(self, cell);
                            }
                            return Err(error);
                        }
                    },
                    Action::Send { to, generation, msg } => {
                        self.send_proto(cell.id, cell.slot.wire_epoch, to, generation, msg)
                    }
                    Action::Granted { token, abandoned, .. } => {
                        if !abandoned {
                            st.outcome = Some(Outcome::Granted(token));
                        }
                    }
                    Action::WouldBlock => st.outcome = Some(Outcome::WouldBlock),
                    Action::Aborted(AbortReason::Revoked { .. }) => {
                        st.broken = st.serial;
                        st.outcome = Some(Outcome::Broken);
                    }
                    Action::Aborted(AbortReason::Recovered { .. }) => st.outcome = Some(Outcome::Requeue),
                    Action::Moved { generation, floor, revoke } => {
                        self.core.moves.fetch_add(1, Ordering::Relaxed);
                        if !revoke {
                            self.core.recoveries.fetch_add(1, Ordering::Relaxed);
                        }
                        st.moved = Some(floor);
                        tracing::warn!(
                            node = %self.core.me, lock = %cell.id, generation, floor, revoke,
                            "lock moved to a new generation"
                        );
                    }
                    Action::Idle => {}
                }
            }
        }
        Ok(())
    }

    /// With re-homing: whether an atomic's failure means the lock's home is
    /// gone (dead, or lost by its lease), rather than slow.
    fn home_is_lost(&self, cell: &Cell<LockClient>, error: &FabricError) -> bool {
        matches!(error, FabricError::PeerDead { .. })
            || self.core.home_lost(cell.slot.home_node, cell.slot.epoch).is_some()
            || self.core.lost(cell.slot.home_node).is_some()
    }

    /// With re-homing: the cell's home is dead or fenced. The request is
    /// forgotten: a waiting user requests again (at the new home, once the
    /// lock has one), a releasing one is done (the new home's barrier waits
    /// for this node's acknowledgement, so nothing there overlapped the
    /// hold), and acknowledgements owed go out. The cell is retired.
    fn home_gone(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>, releasing: bool, why: &str) {
        tracing::info!(node = %self.core.me, lock = %cell.id, home = %cell.slot.home_node, why, "the lock's home is gone: locating it again");
        let waiting = st.machine.is_waiting() || (!releasing && !st.machine.is_holding());
        for (to, generation) in st.machine.reset_owing() {
            self.send_proto(cell.id, cell.slot.wire_epoch, to, generation, ProtoMsg::Ack);
        }
        if waiting && st.outcome.is_none() {
            st.outcome = Some(Outcome::Requeue);
        }
        self.flush_rehome_acks(cell.id, st);
        retire(self, cell);
    }

    /// Sends the acknowledgements owed to re-homing movers.
    fn flush_rehome_acks(&self, lock_id: LockId, st: &mut CellState<LockClient>) {
        for (to, generation, epoch) in std::mem::take(&mut st.owed_rehome) {
            self.send_proto(lock_id, epoch, to, generation, ProtoMsg::Ack);
        }
    }

    /// A notice that `lock_id` moved to a newer home (epoch `epoch`) than
    /// this node's cell's: the rebuild. A hold is kept and acknowledged
    /// when it ends; anything else is forgotten (a waiting user requests
    /// again at the new home) and acknowledged now.
    fn rehome_notice(&self, cell: &Cell<LockClient>, from: NodeId, generation: u16, epoch: u64) {
        let mut st = lock(&cell.state);
        if st.machine.is_holding() {
            st.owed_rehome.push((from, generation, epoch));
            return;
        }
        let waiting = st.machine.is_waiting();
        for (to, owed_generation) in st.machine.reset_owing() {
            self.send_proto(cell.id, cell.slot.wire_epoch, to, owed_generation, ProtoMsg::Ack);
        }
        if waiting && st.outcome.is_none() {
            st.outcome = Some(Outcome::Requeue);
        }
        self.flush_rehome_acks(cell.id, &mut st);
        retire(self, cell);
        st.progress = st.progress.wrapping_add(1);
        show(self, cell, &mut st);
        cell.changed.notify_all();
        drop(st);
        self.send_proto(cell.id, epoch, from, generation, ProtoMsg::Ack);
    }

    fn send_proto(&self, lock_id: LockId, epoch: u64, to: NodeId, generation: u16, msg: ProtoMsg) {
        self.core.watch(to);
        let message = DlmMessage::Proto { lock: lock_id, epoch, generation, msg };
        if let Err(e) = self.core.send(lock_id, to, &message) {
            tracing::info!(node = %self.core.me, %to, ?msg, error = %e, "lock message not delivered");
        }
    }

    fn on_input(&self, lock_id: LockId, from: NodeId, epoch: u64, input: Input) -> Result<(), LockError> {
        let any = lock(&self.cells).get(&lock_id).cloned();
        let cell = any.clone().filter(|cell| cell.slot.wire_epoch == epoch);
        if let (None, Some(old), Input::Message { generation, msg: ProtoMsg::Notice { revoke: false }, .. }) =
            (&cell, &any, &input)
        {
            if self.core.rehoming() && generation_newer(wire_home_epoch(epoch), wire_home_epoch(old.slot.wire_epoch)) {
                self.rehome_notice(old, from, *generation, epoch);
                return Ok(());
            }
        }
        let Some(cell) = cell else {
            // A lock this node never used (or not in this incarnation of its
            // home): it holds nothing of it, so it acknowledges a recovery,
            // and a sender that expects a request here learns there is none.
            if let Input::Message { generation, msg, .. } = input {
                match msg {
                    ProtoMsg::Notice { revoke: false } => {
                        self.send_proto(lock_id, epoch, from, generation, ProtoMsg::Ack)
                    }
                    ProtoMsg::Notice { revoke: true } | ProtoMsg::Ack | ProtoMsg::Nack => {}
                    _ => self.send_proto(lock_id, epoch, from, generation, ProtoMsg::Nack),
                }
            }
            return Ok(());
        };
        let mut st = lock(&cell.state);
        self.drive(&cell, &mut st, input)
    }

    /// One monitor look at one cell.
    fn watch_cell(&self, cell: &Arc<Cell<LockClient>>) {
        let (waits, barrier, progress) = {
            let st = lock(&cell.state);
            (st.machine.waits(), st.machine.barrier().map(|(g, p)| (g, p.to_vec())), st.progress)
        };
        let now = tierstack_base::time::instant_now();
        let mut watching = lock(&cell.watching);
        if waits.nodes.is_empty() && !waits.unknown {
            *watching = Watching::default();
            return;
        }
        let stuck_since = match watching.progress {
            Some((seen, since)) if seen == progress => since,
            _ => {
                // It moved since the last look: not stuck (yet).
                watching.progress = Some((progress, now));
                return;
            }
        };
        let mut lost = Vec::new();
        // The home's process, not its lease: one-sided operations need no
        // thread of the home's, so a stopped home still serves N-CoShED.
        let home_lost = self.core.home_lost(cell.slot.home_node, cell.slot.epoch).or_else(|| {
            // With re-homing a home is also lost by its lease (on tcp a
            // stopped home serves nothing; on shm its role ends all the same).
            self.core.rehoming().then(|| self.core.lost(cell.slot.home_node)).flatten()
        });
        if let Some(reason) = home_lost {
            drop(watching);
            let mut st = lock(&cell.state);
            if self.core.rehoming() {
                if st.progress == progress && !st.machine.is_idle() && !st.machine.is_holding() {
                    self.home_gone(cell, &mut st, false, &reason);
                    st.progress = st.progress.wrapping_add(1);
                    show(self, cell, &mut st);
                    cell.changed.notify_all();
                }
                return;
            }
            if st.progress == progress && !st.machine.is_idle() {
                tracing::warn!(node = %self.core.me, lock = %cell.id, home = %cell.slot.home_node, %reason, "the lock's home is lost");
                st.machine.reset();
                let error = LockError::PeerDead { lock: cell.id, node: cell.slot.home_node, reason };
                st.outcome = Some(Outcome::Failed(error));
                st.progress = st.progress.wrapping_add(1);
                show(self, cell, &mut st);
                cell.changed.notify_all();
                drop(st);
                retire(self, cell);
            }
            return;
        }
        for &node in &waits.nodes {
            if let Some(reason) = self.core.lost(node) {
                tracing::info!(node = %self.core.me, lock = %cell.id, lost = %node, %reason, "a node the lock waits for is lost");
                lost.push(node);
            }
        }
        let suspect = self.core.config.suspect_after;
        if waits.unknown
            && now.duration_since(stuck_since) >= suspect
            && watching.scanned.is_none_or(|at| now.duration_since(at) >= suspect)
        {
            watching.scanned = Some(now);
            for &node in self.core.nodes.iter() {
                if let Some(reason) = self.core.lost(node) {
                    tracing::info!(node = %self.core.me, lock = %cell.id, lost = %node, %reason, "a lost node may be what the lock waits for");
                    lost.push(node);
                    break;
                }
            }
        }
        let resend = barrier.filter(|_| watching.resent.is_none_or(|at| now.duration_since(at) >= NOTICE_RESEND));
        if resend.is_some() {
            watching.resent = Some(now);
        }
        drop(watching);
        if let Some((generation, pending)) = resend {
            for to in pending.into_iter().filter(|n| !lost.contains(n)) {
                self.send_proto(cell.id, cell.slot.wire_epoch, to, generation, ProtoMsg::Notice { revoke: false });
            }
        }
        if lost.is_empty() {
            return;
        }
        let mut st = lock(&cell.state);
        for &node in &lost {
            self.core.peers_lost.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.drive(cell, &mut st, Input::PeerLost { node }) {
                tracing::warn!(node = %self.core.me, lock = %cell.id, error = %e, "recovery step failed");
            }
        }
        // A move just made (its atomics run inside `drive`) waits for every
        // node's acknowledgement, the lost ones' included: they are still
        // lost, so tell the barrier now rather than a look or two later.
        // Looked at again first: a loss seen through a handle of an older
        // incarnation than the one that runs now is not confirmed (the
        // failed read dropped that handle, this one reads the live node), and
        // the barrier must wait for a live node.
        let pending_lost: Vec<NodeId> = st
            .machine
            .barrier()
            .map(|(_, pending)| pending.iter().copied().filter(|n| lost.contains(n)).collect())
            .unwrap_or_default();
        let pending_lost: Vec<NodeId> = pending_lost.into_iter().filter(|&n| self.core.lost(n).is_some()).collect();
        for node in pending_lost {
            if let Err(e) = self.drive(cell, &mut st, Input::PeerLost { node }) {
                tracing::warn!(node = %self.core.me, lock = %cell.id, error = %e, "recovery step failed");
            }
        }
    }
}

impl Engine for QueueScheme {
    type Machine = LockClient;

    fn core(&self) -> &Core {
        &self.core
    }

    fn cells(&self) -> &Mutex<HashMap<LockId, Arc<Cell<LockClient>>>> {
        &self.cells
    }

    fn new_machine(&self) -> LockClient {
        LockClient::new(self.core.me, self.kind, self.core.nodes.clone())
    }

    fn idle(machine: &LockClient) -> bool {
        machine.is_idle()
    }

    fn holding(machine: &LockClient) -> bool {
        machine.is_holding()
    }

    fn blocked_on(&self, cell: &Cell<LockClient>, machine: &LockClient) -> Option<NodeId> {
        match machine.blocked_on() {
            BlockedOn::Node(node) => Some(node),
            BlockedOn::SharedHolders => None,
            BlockedOn::Nothing => Some(cell.slot.home_node),
        }
    }

    fn shown(&self, _cell: &Cell<LockClient>, st: &CellState<LockClient>) -> (ClientState, u16, Option<NodeId>) {
        st.machine.state()
    }

    fn start(
        &self,
        cell: &Cell<LockClient>,
        st: &mut CellState<LockClient>,
        mode: LockMode,
        try_only: bool,
    ) -> Result<(), LockError> {
        if cell.needs_move.swap(false, Ordering::AcqRel) {
            // The first use of a fenced new home: move it (the barrier),
            // then the caller's request queues behind the move.
            match self.core.prepare_move(cell.id, &cell.slot)? {
                Some(word) => {
                    st.moved = None;
                    self.drive(cell, st, Input::Rehome { word })?;
                    if st.moved.is_some() {
                        self.core.rehomes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => retire(self, cell),
            }
            st.outcome = Some(Outcome::Requeue);
            return Ok(());
        }
        self.drive(cell, st, Input::Acquire { mode, try_only, fencing: true })
    }

    fn abandon(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>) {
        // Abandon produces no actions; an error here is impossible.
        let _ = self.drive(cell, st, Input::Abandon);
    }

    fn release(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>) -> Result<(), LockError> {
        let result = self.release_at_home(cell, st);
        if !st.owed_rehome.is_empty() {
            // The hold of the old home is over: the lock's new home may go on.
            self.flush_rehome_acks(cell.id, st);
            retire(self, cell);
        }
        result
    }
}

impl QueueScheme {
    fn release_at_home(&self, cell: &Cell<LockClient>, st: &mut CellState<LockClient>) -> Result<(), LockError> {
        st.touched = false;
        self.drive(cell, st, Input::Release)?;
        // The release itself may be what discovers a revoking break (its
        // atomic sees a newer generation).
        if st.broken == st.serial {
            return Err(LockError::Broken { lock: cell.id });
        }
        if !st.touched && !self.core.rehoming() {
            // Passed on by messages alone: make sure the home the hold was
            // granted at still stands (see `home_stands`). With re-homing a
            // restarted home never takes a lock back while another holds
            // its home role, so there is nothing to check.
            home_stands(self, cell)?;
        }
        Ok(())
    }
}

/// Whether a batch met a fenced lock word (see [`LockWord::fenced`]) it did
/// not expect: only a re-homing move expects one (its compare-and-swap
/// lifts the fence).
fn met_fence(ops: &[AtomicOp], results: &[u64; 2]) -> bool {
    ops.iter().zip(results).any(|(op, previous)| match *op {
        AtomicOp::CompareSwap { word: WordKind::Lock, expected, .. } => {
            LockWord::is_fenced(*previous) && !LockWord::is_fenced(expected)
        }
        AtomicOp::FetchAdd { word: WordKind::Lock, .. } => LockWord::is_fenced(*previous),
        _ => false,
    })
}

impl LockScheme for QueueScheme {
    fn scheme(&self) -> Scheme {
        match self.kind {
            QueueKind::CoShed => Scheme::CoShed,
            QueueKind::Dqnl => Scheme::Dqnl,
        }
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

    /// Moves the lock to a new generation from this node, revoking every
    /// hold and request of older ones (this node's own included), then
    /// waits (bounded) until this node has passed the new generation on.
    fn break_lock(&self, lock_id: LockId) -> Result<u64, LockError> {
        let cell = cell_of(self, lock_id)?;
        let mut st = lock(&cell.state);
        st.moved = None;
        self.drive(&cell, &mut st, Input::Break)?;
        let floor = st.moved.ok_or_else(|| {
            LockError::Protocol(format!("{lock_id}: a concurrent recovery overtook the break; break it again"))
        })?;
        let settle = tierstack_base::time::instant_now() + BREAK_SETTLE;
        while !st.machine.is_idle() && tierstack_base::time::instant_now() < settle {
            st = wait_until(&cell.changed, st, settle);
        }
        Ok(floor)
    }

    fn handle_message(&self, from: NodeId, payload: &[u8]) -> Result<(), LockError> {
        let result = match DlmMessage::decode(payload).map_err(|e| LockError::Protocol(e.to_string())) {
            Ok(DlmMessage::Proto { lock, epoch, generation, msg }) => {
                self.on_input(lock, from, epoch, Input::Message { from, generation, msg })
            }
            Ok(DlmMessage::Srsl { lock, .. }) => {
                Err(LockError::Protocol(format!("{lock}: SRSL message from {from} to a {} node", self.scheme().name())))
            }
            Err(e) => Err(e),
        };
        self.core.counted(result)
    }

    fn placement(&self, lock_id: LockId) -> Result<super::Placement, LockError> {
        self.core.placement(lock_id)
    }

    fn stats(&self) -> DlmStats {
        self.core.stats()
    }

    fn tick(&self) {
        let cells: Vec<_> = lock(&self.cells).values().cloned().collect();
        if self.core.rehoming() {
            retire_idle_cells_of_lost_homes(self, &cells);
        }
        for cell in cells {
            self.watch_cell(&cell);
        }
    }

    fn waits(&self, lock_id: LockId) -> Option<crate::proto::Waits> {
        let cell = lock(&self.cells).get(&lock_id).cloned()?;
        let waits = lock(&cell.state).machine.waits();
        Some(waits)
    }

    fn debug_state(&self, lock_id: LockId) -> String {
        let Some(cell) = lock(&self.cells).get(&lock_id).cloned() else {
            return format!("{}: {lock_id} never used", self.core.me);
        };
        let st = lock(&cell.state);
        let read = |offset: u64| cell.slot.home.read_u64(cell.slot.base + offset);
        let words = match (read(crate::word::LOCK_OFFSET), read(crate::word::DRAIN_OFFSET), read(FENCE_OFFSET)) {
            (Ok(word), Ok(drain), Ok(fence)) => format!(
                "{:?} {:?} {:?}",
                crate::word::LockWord::decode(word),
                crate::word::DrainWord::decode(drain),
                crate::word::FenceWord::decode(fence)
            ),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => format!("home words unreadable: {e}"),
        };
        format!("{}: serial {} {:?}; {words}", self.core.me, st.serial, st.machine)
    }
}
