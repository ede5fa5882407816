//! Re-homing on real fabrics (issue 37; design in
//! `docs/internals/dlm-rehoming.md`): three lock servers, two clients; the
//! home of a lock dies while one client holds it and the other waits.
//!
//! The waiter's monitor finds the home lost, the lock's home role is
//! claimed for the next candidate, and the waiter, moving the new home's
//! slot, holds it as a barrier until the live holder of the old home has
//! released. The tests observe that state ([`LockManager::waits`]) rather
//! than waiting for time to pass.

use crate::common;

use common::{Backend, Cluster};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_dlm::proto::Waits;
use tierstack_dlm::table::candidates;
use tierstack_dlm::{DlmConfig, LockError, LockId, LockManager, Scheme};

pub(crate) const PATIENT: Duration = Duration::from_secs(30);
pub(crate) const SERVERS: [u32; 3] = [0, 1, 2];
pub(crate) const NODES: u32 = 5;

pub(crate) type Managers = Vec<Option<Arc<LockManager>>>;

pub(crate) fn fast(config: DlmConfig) -> DlmConfig {
    config.with_probe_interval(Duration::from_millis(5))
}

pub(crate) fn node(m: &Managers, i: usize) -> &LockManager {
    m[i].as_ref().expect("node is alive")
}

pub(crate) fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tierstack_base::time::instant_now() + PATIENT;
    while !condition() {
        assert!(tierstack_base::time::instant_now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// A lock whose first candidate (its home at epoch 0) is node 0.
fn lock_homed_at_0() -> LockId {
    let servers: Vec<NodeId> = SERVERS.iter().map(|&s| NodeId(s)).collect();
    (100..).map(LockId).find(|&id| candidates(id, &servers)[0] == NodeId(0)).unwrap()
}

fn dead_home(backend: Backend, scheme: Scheme) {
    let mut cluster = Cluster::new(backend, NODES);
    let mut m: Managers =
        cluster.managers_with(scheme, &SERVERS, fast).into_iter().map(|m| Some(Arc::new(m))).collect();
    let id = lock_homed_at_0();
    node(&m, 3).create_lock(id).unwrap();
    let held = node(&m, 3).acquire_exclusive(id, PATIENT).unwrap();
    let old_token = held.fencing_token();
    let waiter = {
        let manager = m[4].clone().unwrap();
        std::thread::spawn(move || manager.acquire_exclusive(id, PATIENT).map(|g| g.fencing_token()))
    };
    let waits = |nodes: &[u32]| Some(Waits { nodes: nodes.iter().map(|&n| NodeId(n)).collect(), unknown: false });
    until("node 4 behind node 3", || node(&m, 4).waits(id) == waits(&[3]));
    drop(m[0].take());
    cluster.kill(0);
    // The waiter re-homes the lock and holds the new home as a barrier
    // that waits for the old home's live holder, node 3, alone.
    until("the new home's barrier waiting for node 3", || {
        node(&m, 4).waits(id) == waits(&[3]) && {
            let state = node(&m, 4).debug_state(id);
            state.contains("Mover")
        }
    });
    assert!(!waiter.is_finished(), "granted at the new home while the old home's holder still held");
    held.release().expect("a hold of a dead home ends at its holder");
    let token = waiter.join().unwrap().expect("the waiter is granted at the new home");
    assert!(token > old_token, "the new home's token {token} is above the old home's {old_token}");
    // Both clients now use the new home: a hold by one blocks the other.
    let again = node(&m, 3).acquire_exclusive(id, PATIENT).unwrap();
    assert!(again.fencing_token() > token);
    assert!(matches!(node(&m, 4).try_acquire_exclusive(id), Err(LockError::WouldBlock { .. })));
    drop(again);
}

#[test]
fn a_dead_home_moves_to_the_next_candidate_after_its_live_holder_ncoshed_shm() {
    dead_home(Backend::Shm, Scheme::CoShed);
}

#[test]
fn a_dead_home_moves_to_the_next_candidate_after_its_live_holder_ncoshed_tcp() {
    dead_home(Backend::Tcp, Scheme::CoShed);
}

#[test]
fn a_dead_home_moves_to_the_next_candidate_after_its_live_holder_dqnl_shm() {
    dead_home(Backend::Shm, Scheme::Dqnl);
}

/// The old home restarts and rejoins as a candidate: it does not take its
/// lock back (its own requests go to the new home, so they exclude the
/// others'), and its tokens continue above the new home's.
#[test]
fn a_restarted_home_does_not_take_its_lock_back() {
    let mut cluster = Cluster::new(Backend::Shm, NODES);
    let mut m: Managers =
        cluster.managers_with(Scheme::CoShed, &SERVERS, fast).into_iter().map(|m| Some(Arc::new(m))).collect();
    let id = lock_homed_at_0();
    node(&m, 3).create_lock(id).unwrap();
    drop(node(&m, 3).acquire_exclusive(id, PATIENT).unwrap());
    drop(m[0].take());
    cluster.kill(0);
    let held = node(&m, 4).acquire_exclusive(id, PATIENT).expect("re-homed on first use");
    cluster.restart(0);
    m[0] = Some(Arc::new(cluster.manager(0, Scheme::CoShed, &SERVERS, fast)));
    node(&m, 0).create_lock(id).unwrap();
    assert!(
        matches!(node(&m, 0).try_acquire_exclusive(id), Err(LockError::WouldBlock { .. })),
        "the restarted home granted its old lock while the new home had it held"
    );
    let token = held.fencing_token();
    held.release().unwrap();
    let next = node(&m, 0).acquire_exclusive(id, PATIENT).unwrap();
    assert!(next.fencing_token() > token);
}
