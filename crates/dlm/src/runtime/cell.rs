//! The per-lock cell (a scheme's client machine under a mutex, with the
//! condition variable its waiting callers sleep on) and the algorithms every
//! scheme shares: waiting for the node's previous request, timeouts,
//! giving back a grant across a lease lapse, and release checks.

use crate::error::LockError;
use crate::proto::{ClientState, LockMode};
use crate::status::{write_entry, StatusEntry};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
// A panic while holding a cell would be a bug; the state is still the
// machine's last consistent state, so keep going rather than cascade.
use super::node::{Core, Slot};
use super::{Grant, Wait};
use tierstack_base::sync::lock;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_fabric::FabricError;

/// What the waiting caller of the current request is told.
pub(super) enum Outcome {
    Granted(Option<u64>),
    WouldBlock,
    Broken,
    /// A recovery moved the lock past the request: make it again.
    Requeue,
    Failed(LockError),
}

pub(super) struct CellState<M> {
    pub(super) machine: M,
    /// Serial number of the current (or last) request.
    pub(super) serial: u64,
    /// Mode of the current (or last) request.
    pub(super) mode: LockMode,
    pub(super) outcome: Option<Outcome>,
    /// The serial of the last request that a break revoked.
    pub(super) broken: u64,
    /// Inputs driven so far: the monitor reads it to tell a request that
    /// waits from one that moves.
    pub(super) progress: u64,
    /// The floor of the last move this node made.
    pub(super) moved: Option<u64>,
    /// The status entry last written.
    pub(super) shown: u64,
    /// An atomic reached the home since this was last cleared.
    pub(super) touched: bool,
    /// Acknowledgements owed to re-homing movers (mover, generation, wire
    /// epoch), sent when the hold of the old home ends.
    pub(super) owed_rehome: Vec<(NodeId, u16, u64)>,
    /// SRSL with re-homing: the new server (and its wire epoch) this hold
    /// was reported to; its release goes there.
    pub(super) reported_to: Option<(NodeId, u64)>,
}

/// The monitor's bookkeeping for one cell.
#[derive(Default)]
pub(super) struct Watching {
    /// `progress` at the last look, and since when it has not changed.
    pub(super) progress: Option<(u64, Instant)>,
    /// Last time every node was checked for a request that waits for parties it cannot name.
    pub(super) scanned: Option<Instant>,
    /// Last time a barrier's notice went out again.
    pub(super) resent: Option<Instant>,
}

pub(super) struct Cell<M> {
    pub(super) id: LockId,
    pub(super) slot: Slot,
    pub(super) state: Mutex<CellState<M>>,
    pub(super) changed: Condvar,
    /// Its home's incarnation ended: callers locate the lock afresh.
    pub(super) retired: AtomicBool,
    /// This cell's entry in the node region, if it got one.
    pub(super) entry: Option<u64>,
    /// The slot is fenced: the first request moves it (re-homing).
    pub(super) needs_move: AtomicBool,
    /// This node's lease lapses when the cell was made: with re-homing, a
    /// node that lapsed locates every lock again (its homes may have moved
    /// while it was stopped).
    pub(super) lapses: u64,
    pub(super) watching: Mutex<Watching>,
}

/// The scheme-specific half of a lock manager; the algorithms for waiting,
/// timeouts and release checks are shared (`acquire_in`, `release_in`).
pub(super) trait Engine: Send + Sync {
    type Machine: Send;
    fn core(&self) -> &Core;
    fn cells(&self) -> &Mutex<HashMap<LockId, Arc<Cell<Self::Machine>>>>;
    fn new_machine(&self) -> Self::Machine;
    fn idle(machine: &Self::Machine) -> bool;
    fn holding(machine: &Self::Machine) -> bool;
    fn blocked_on(&self, cell: &Cell<Self::Machine>, machine: &Self::Machine) -> Option<NodeId>;
    /// The state shown in the node region.
    fn shown(&self, cell: &Cell<Self::Machine>, st: &CellState<Self::Machine>) -> (ClientState, u16, Option<NodeId>);
    fn start(
        &self,
        cell: &Cell<Self::Machine>,
        st: &mut CellState<Self::Machine>,
        mode: LockMode,
        try_only: bool,
    ) -> Result<(), LockError>;
    fn abandon(&self, cell: &Cell<Self::Machine>, st: &mut CellState<Self::Machine>);
    fn release(&self, cell: &Cell<Self::Machine>, st: &mut CellState<Self::Machine>) -> Result<(), LockError>;
}

pub(super) fn cell_of<E: Engine>(engine: &E, id: LockId) -> Result<Arc<Cell<E::Machine>>, LockError> {
    let core = engine.core();
    let cached = lock(engine.cells()).get(&id).cloned();
    if let Some(cell) = cached.as_ref().filter(|c| !c.retired.load(Ordering::Acquire)) {
        if !core.rehoming() || cell.lapses == core.lease_mark() || !E::idle(&lock(&cell.state).machine) {
            return Ok(cell.clone());
        }
        cell.retired.store(true, Ordering::Release);
    }
    let lapses = core.lease_mark();
    let (slot, needs_move) = core.locate(id, false)?;
    let mut cells = lock(engine.cells());
    if cells.get(&id).is_some_and(|c| c.retired.load(Ordering::Acquire)) {
        cells.remove(&id);
    }
    let cell = cells.entry(id).or_insert_with(|| {
        Arc::new(Cell {
            id,
            slot,
            state: Mutex::new(CellState {
                machine: engine.new_machine(),
                serial: 0,
                mode: LockMode::Exclusive,
                outcome: None,
                broken: 0,
                progress: 0,
                moved: None,
                shown: u64::MAX,
                touched: false,
                owed_rehome: Vec::new(),
                reported_to: None,
            }),
            changed: Condvar::new(),
            retired: AtomicBool::new(false),
            entry: engine.core().claim_entry(),
            needs_move: AtomicBool::new(needs_move),
            lapses,
            watching: Mutex::new(Watching::default()),
        })
    });
    Ok(cell.clone())
}

/// Takes a cell out of use after its home's incarnation ended: the next
/// acquire locates the lock afresh. It stays in the map until then, so the
/// release of a hold it revoked still says `Broken`.
pub(super) fn retire<E: Engine>(engine: &E, cell: &Cell<E::Machine>) {
    cell.retired.store(true, Ordering::Release);
    engine.core().forget_home(cell.slot.home_node, &cell.slot.home);
}

/// With re-homing: an idle cell whose home (an SRSL lock's server) is lost
/// is retired, so the next request locates the lock again rather than
/// acquiring from a dead home's table (on shm it stays mapped). One look
/// per home.
pub(super) fn retire_idle_cells_of_lost_homes<E: Engine>(engine: &E, cells: &[Arc<Cell<E::Machine>>]) {
    let core = engine.core();
    let mut verdicts: HashMap<(NodeId, u64), bool> = HashMap::new();
    for cell in cells.iter().filter(|c| !c.retired.load(Ordering::Acquire)) {
        let home = (cell.slot.home_node, cell.slot.epoch);
        let lost = *verdicts
            .entry(home)
            .or_insert_with(|| core.home_lost(home.0, home.1).is_some() || core.lost(home.0).is_some());
        if lost && E::idle(&lock(&cell.state).machine) {
            retire(engine, cell);
        }
    }
}

/// Whether the home incarnation a hold was granted at still stands, asked
/// at the release of a hold that did not touch the home (a hand-over by
/// message, an SRSL release): one read of the lock's slot. A home that
/// restarted has created the lock again and may have granted it: a hold of
/// its old incarnation overlapped that, and its release must not say it
/// held. Its next incarnation exists only after the old table was revoked
/// (shm: the node id's reclaim; tcp: the incarnation every request
/// carries), so a read that succeeds proves no new incarnation granted
/// before it. `PeerDead` if the home's incarnation ended; any other
/// failure (a slow home) leaves the answer yes.
pub(super) fn home_stands<E: Engine>(engine: &E, cell: &Cell<E::Machine>) -> Result<(), LockError> {
    match cell.slot.home.read_u64(cell.slot.base + crate::word::TAG_OFFSET) {
        Err(e @ FabricError::PeerDead { .. }) => {
            retire(engine, cell);
            Err(LockError::from_fabric(cell.id, cell.slot.home_node, e))
        }
        _ => Ok(()),
    }
}

/// Writes the cell's state to this node's status entry if it changed.
pub(super) fn show<E: Engine>(engine: &E, cell: &Cell<E::Machine>, st: &mut CellState<E::Machine>) {
    let Some(index) = cell.entry else { return };
    let (state, generation, peer) = engine.shown(cell, st);
    let word = StatusEntry::state_word(state, generation, peer);
    if word == st.shown {
        return;
    }
    st.shown = word;
    let memory = engine.core().node_region.memory();
    // Advisory: a failed write (impossible for an in-bounds entry) only hides a state.
    let _ = write_entry(memory, index, cell.id, word, host_monotonic_ns(), st.serial);
}

pub(super) fn wait_until<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>, deadline: Instant) -> MutexGuard<'a, T> {
    let left = deadline.saturating_duration_since(tierstack_base::time::instant_now());
    match cv.wait_timeout(guard, left) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

/// What one attempt at a request came to.
pub(super) enum Attempt {
    Granted(Grant),
    /// A recovery moved the lock past the request, or this node lapsed
    /// while it waited: make it again.
    Again,
}

pub(super) fn acquire_in<E: Engine>(engine: &E, id: LockId, mode: LockMode, wait: Wait) -> Result<Grant, LockError> {
    let started = tierstack_base::time::instant_now();
    let (try_only, budget) = match wait {
        Wait::Try => (true, engine.core().config.try_reply_timeout),
        Wait::Timeout(budget) => (false, budget),
    };
    let deadline = started.checked_add(budget).unwrap_or_else(|| started + Duration::from_secs(86_400 * 365));
    loop {
        match attempt(engine, id, mode, try_only, started, deadline)? {
            Attempt::Granted(grant) => return Ok(grant),
            Attempt::Again if try_only => return Err(LockError::WouldBlock { lock: id }),
            Attempt::Again if tierstack_base::time::instant_now() >= deadline => {
                return Err(engine.core().timeout_error(id, started.elapsed(), None));
            }
            Attempt::Again => {}
        }
    }
}

pub(super) fn attempt<E: Engine>(
    engine: &E,
    id: LockId,
    mode: LockMode,
    try_only: bool,
    started: Instant,
    deadline: Instant,
) -> Result<Attempt, LockError> {
    let cell = cell_of(engine, id)?;
    let lapses = engine.core().lease_mark();
    let mut st = lock(&cell.state);
    // One queue entry per node: wait for our previous request to finish.
    while !E::idle(&st.machine) {
        if try_only {
            return Err(LockError::WouldBlock { lock: id });
        }
        if tierstack_base::time::instant_now() >= deadline {
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Err(LockError::Timeout { lock: id, waited_ms, blocked_on: Some(engine.core().me) });
        }
        st = wait_until(&cell.changed, st, deadline);
    }
    if cell.retired.load(Ordering::Acquire) {
        return Ok(Attempt::Again);
    }
    st.serial += 1;
    st.outcome = None;
    st.mode = mode;
    let serial = st.serial;
    if let Err(e) = engine.start(&cell, &mut st, mode, try_only) {
        if !E::idle(&st.machine) {
            engine.abandon(&cell, &mut st);
        }
        return Err(e);
    }
    loop {
        if let Some(outcome) = st.outcome.take() {
            return match outcome {
                Outcome::Granted(token) => {
                    if engine.core().lapsed_since(lapses) {
                        // This node was stopped for most of a lease while it
                        // waited: a recovery may have gone past the request.
                        // Give the grant back and ask again.
                        if let Err(e) = engine.release(&cell, &mut st) {
                            tracing::debug!(lock = %id, error = %e, "giving back a grant across a lapse");
                        }
                        return Ok(Attempt::Again);
                    }
                    Ok(Attempt::Granted(Grant { lock: id, mode, token, serial, lapses, waited: started.elapsed() }))
                }
                Outcome::WouldBlock => Err(LockError::WouldBlock { lock: id }),
                Outcome::Broken => Err(LockError::Broken { lock: id }),
                Outcome::Requeue => Ok(Attempt::Again),
                Outcome::Failed(e) => Err(e),
            };
        }
        if tierstack_base::time::instant_now() >= deadline {
            let blocked_on = engine.blocked_on(&cell, &st.machine);
            engine.abandon(&cell, &mut st);
            drop(st);
            return Err(engine.core().timeout_error(id, started.elapsed(), blocked_on));
        }
        st = wait_until(&cell.changed, st, deadline);
    }
}

pub(super) fn release_in<E: Engine>(engine: &E, grant: &Grant) -> Result<(), LockError> {
    let not_held = LockError::NotHeld { lock: grant.lock };
    let cell = lock(engine.cells()).get(&grant.lock).cloned().ok_or(not_held.clone())?;
    let mut st = lock(&cell.state);
    if st.serial != grant.serial || !E::holding(&st.machine) {
        return Err(if st.broken == grant.serial { LockError::Broken { lock: grant.lock } } else { not_held });
    }
    engine.release(&cell, &mut st)?;
    drop(st);
    if engine.core().lapsed_since(grant.lapses) {
        // Stopped for most of a lease during the hold: others may have
        // judged the lease expired and moved on. Fencing rejects what this
        // holder wrote after that.
        return Err(LockError::Broken { lock: grant.lock });
    }
    Ok(())
}
