//! SRSL re-homing on real fabrics (issue 37; design in
//! `docs/internals/dlm-rehoming.md`, "SRSL"): three lock servers, clients
//! on two more nodes. The lock's SRSL server dies; the next candidate
//! serves it after rebuilding its queue from the clients' reports. The
//! tests observe the new server's queue ([`LockManager::debug_state`])
//! rather than waiting for time to pass.

use crate::common;

use common::{Backend, Cluster};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_dlm::table::candidates;
use tierstack_dlm::{DlmConfig, LockError, LockId, Scheme};

use crate::rehome::{fast, node, until, Managers, NODES, PATIENT, SERVERS};

/// A lock whose first candidate (its server at epoch 0) is node 0, and its next candidate.
fn lock_served_at_0() -> (LockId, usize) {
    let servers: Vec<NodeId> = SERVERS.iter().map(|&s| NodeId(s)).collect();
    let id = (100..).map(LockId).find(|&id| candidates(id, &servers)[0] == NodeId(0)).unwrap();
    (id, candidates(id, &servers)[1].0 as usize)
}

fn start(backend: Backend) -> (Cluster, Managers) {
    start_with(backend, fast)
}

fn start_with(backend: Backend, tweak: impl Fn(DlmConfig) -> DlmConfig) -> (Cluster, Managers) {
    let cluster = Cluster::new(backend, NODES);
    let m = cluster.managers_with(Scheme::Srsl, &SERVERS, tweak).into_iter().map(|m| Some(Arc::new(m))).collect();
    (cluster, m)
}

/// Node 3 holds, node 4 waits, the server dies: the next candidate serves
/// the lock at epoch 1 with node 3's reported hold and node 4 queued behind
/// it; node 4 is granted only after node 3's release, above its token.
fn dead_server(backend: Backend) {
    let (mut cluster, mut m) = start(backend);
    let (id, next) = lock_served_at_0();
    node(&m, 3).create_lock(id).unwrap();
    let held = node(&m, 3).acquire_exclusive(id, PATIENT).unwrap();
    let old_token = held.fencing_token();
    let waiter = {
        let manager = m[4].clone().unwrap();
        std::thread::spawn(move || manager.acquire_exclusive(id, PATIENT).map(|g| g.fencing_token()))
    };
    until("node 4 queued at node 0", || node(&m, 0).debug_state(id).contains("holders [3] waiters [4]"));
    drop(m[0].take());
    cluster.kill(0);
    until("the next candidate serving with node 3's reported hold and node 4 behind it", || {
        node(&m, next).debug_state(id).contains("served at home epoch 1 holders [3] waiters [4] pending []")
    });
    assert!(!waiter.is_finished(), "granted at the new server while the old server's holder still held");
    let placement = node(&m, 3).placement(id).unwrap();
    assert_eq!((placement.home, placement.epoch), (NodeId(next as u32), 1), "the lock's home and epoch");
    held.release().expect("a reported hold is released at the new server");
    let token = waiter.join().unwrap().expect("the waiter is granted at the new server");
    assert!(token > old_token, "the new server's token {token} is above the reported {old_token}");
    let again = node(&m, 3).acquire_exclusive(id, PATIENT).unwrap();
    assert!(again.fencing_token() > token);
    assert!(matches!(node(&m, 4).try_acquire_exclusive(id), Err(LockError::WouldBlock { .. })));
    drop(again);
}

#[test]
fn srsl_a_dead_server_moves_to_the_next_candidate_with_the_reported_hold_shm() {
    dead_server(Backend::Shm);
}

#[test]
fn srsl_a_dead_server_moves_to_the_next_candidate_with_the_reported_hold_tcp() {
    dead_server(Backend::Tcp);
}

/// The holder is stopped (its threads end, its heartbeat stands still, it
/// answers nothing) when the server dies: the new server waits for its
/// report until its lease runs out, then grants the waiter; the stopped
/// holder's release says `Broken`.
#[test]
fn srsl_an_unreported_holder_is_waited_for_until_its_lease_ends() {
    let (mut cluster, mut m) = start_with(Backend::Shm, |c| fast(c).with_lease(Some(Duration::from_secs(1))));
    let (id, next) = lock_served_at_0();
    node(&m, 3).create_lock(id).unwrap();
    let held = node(&m, 3).acquire_exclusive(id, PATIENT).unwrap();
    let old_token = held.fencing_token();
    // "Stopped": the manager's threads end, its scheme lives on for the release.
    let stopped = node(&m, 3).scheme().clone();
    drop(m[3].take());
    let waiter = {
        let manager = m[4].clone().unwrap();
        std::thread::spawn(move || manager.acquire_exclusive(id, PATIENT).map(|g| g.fencing_token()))
    };
    until("node 4 queued at node 0", || node(&m, 0).debug_state(id).contains("waiters [4]"));
    drop(m[0].take());
    cluster.kill(0);
    until("the new server waiting for node 3's report", || node(&m, next).debug_state(id).contains("pending [3]"));
    assert!(!waiter.is_finished(), "granted while the unreported holder's lease ran");
    let token = waiter.join().unwrap().expect("granted once node 3's lease ran out");
    assert!(token > old_token);
    assert!(matches!(held.release(), Err(LockError::Broken { .. })), "the unreported hold lapsed");
    drop(stopped);
}

/// The old server restarts and rejoins as a candidate: it does not serve
/// its lock again (a request of its own goes to the new server, and is
/// refused while another node holds there); tokens continue above.
#[test]
fn srsl_a_restarted_server_does_not_take_its_lock_back() {
    let (mut cluster, mut m) = start(Backend::Shm);
    let (id, next) = lock_served_at_0();
    node(&m, 3).create_lock(id).unwrap();
    drop(node(&m, 3).acquire_exclusive(id, PATIENT).unwrap());
    drop(m[0].take());
    cluster.kill(0);
    let held = node(&m, 4).acquire_exclusive(id, PATIENT).expect("re-homed on first use");
    assert!(node(&m, next).debug_state(id).contains("holders [4]"));
    cluster.restart(0);
    m[0] = Some(Arc::new(cluster.manager(0, Scheme::Srsl, &SERVERS, fast)));
    node(&m, 0).create_lock(id).unwrap();
    assert!(
        matches!(node(&m, 0).try_acquire_exclusive(id), Err(LockError::WouldBlock { .. })),
        "the restarted server granted its old lock while the new server had it held"
    );
    assert!(node(&m, 0).debug_state(id).contains("not served here"), "{}", node(&m, 0).debug_state(id));
    let token = held.fencing_token();
    held.release().unwrap();
    let again = node(&m, 0).acquire_exclusive(id, PATIENT).unwrap();
    assert!(again.fencing_token() > token);
    assert!(node(&m, next).debug_state(id).contains("holders [0]"));
}
