//! Automatic recovery on real fabrics: dead holders and waiters, a holder
//! that stops renewing its lease, a node that restarts under the same id,
//! and a home that dies and comes back.
//!
//! Where the order of events matters, the tests drive the recovery monitor
//! by hand ([`tierstack_dlm::LockScheme::tick`], with the monitor thread's
//! interval set to an hour) and wait for states they can observe
//! ([`LockManager::waits`], message counters), never for time to pass.

use crate::common;

use common::{Backend, Cluster};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_dlm::proto::Waits;
use tierstack_dlm::{DlmConfig, LockError, LockId, LockManager, Scheme};

/// Long enough that a grant that should come always comes on a loaded
/// machine; a test only waits this long when something is wrong.
const PATIENT: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(100);
/// A monitor that never runs by itself: the test calls `tick`.
const BY_HAND: Duration = Duration::from_secs(3600);

fn fast(config: DlmConfig) -> DlmConfig {
    config.with_probe_interval(Duration::from_millis(5))
}

fn by_hand(config: DlmConfig) -> DlmConfig {
    config.with_probe_interval(BY_HAND)
}

type Managers = Vec<Option<Arc<LockManager>>>;

fn node(m: &Managers, i: usize) -> &LockManager {
    m[i].as_ref().expect("node is alive")
}

fn managers(cluster: &Cluster, scheme: Scheme, tweak: impl Fn(DlmConfig) -> DlmConfig) -> Managers {
    cluster.managers_with(scheme, &[0], tweak).into_iter().map(|m| Some(Arc::new(m))).collect()
}

/// Starts `acquire_exclusive` on node `i` in a thread of its own.
fn wait_on(m: &Managers, i: usize, id: LockId) -> std::thread::JoinHandle<Result<u64, LockError>> {
    let manager = m[i].clone().expect("node is alive");
    std::thread::spawn(move || manager.acquire_exclusive(id, PATIENT).map(|g| g.fencing_token()))
}

/// Polls `condition` (which may drive the monitor) until it holds.
fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tierstack_base::time::instant_now() + PATIENT;
    while !condition() {
        assert!(tierstack_base::time::instant_now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

fn waits_for(m: &LockManager, lock: LockId, nodes: &[u32]) -> bool {
    m.waits(lock) == Some(Waits { nodes: nodes.iter().map(|&n| NodeId(n)).collect(), unknown: false })
}

/// A holder dies while a waiter waits for it: the waiter is granted by
/// itself, with a token above the dead holder's, on every scheme and
/// backend (N-CoShED and DQNL: the waiter moves the lock; SRSL: the server
/// takes the dead holder out).
#[test]
fn a_dead_holder_is_recovered_without_an_operator() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let mut cluster = Cluster::new(backend, 3);
            let mut m = managers(&cluster, scheme, fast);
            let id = LockId(6);
            node(&m, 0).create_lock(id).unwrap();
            let dead_guard = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap();
            let dead_token = dead_guard.fencing_token();
            {
                let waiter = wait_on(&m, 2, id);
                // The waiter is queued (its request reached the holder or the server).
                until("the waiter to queue", || {
                    let handled = node(&m, 1).stats().messages_handled + node(&m, 0).stats().messages_handled;
                    handled >= 1
                });
                let holder = m[1].take();
                std::mem::forget(dead_guard); // the process died holding it
                drop(holder);
                cluster.kill(1);
                let token = waiter.join().unwrap().unwrap_or_else(|e| panic!("{scheme:?} on {backend:?}: {e}"));
                assert!(token > dead_token, "{scheme:?} on {backend:?}: {token} after the dead holder's {dead_token}");
            }
            match scheme {
                Scheme::Srsl => assert!(node(&m, 0).stats().peers_lost >= 1, "{backend:?}: the server took it out"),
                _ => assert_eq!(node(&m, 2).stats().moves, 1, "{scheme:?} on {backend:?}: the waiter moved the lock"),
            }
            // `tierstack_dlm_recoveries_total` counts it where it was led.
            let recoveries = node(&m, 0).stats().recoveries + node(&m, 2).stats().recoveries;
            assert_eq!(recoveries, 1, "{scheme:?} on {backend:?}: one recovery");
            // The lock works on, shared and exclusive.
            node(&m, 0).acquire_shared(id, PATIENT).unwrap().release().unwrap();
            node(&m, 2).acquire_exclusive(id, PATIENT).unwrap().release().unwrap();
        }
    }
}

/// A waiter dies in the middle of the queue (holder 1, dead waiter 2,
/// waiter 3): waiter 3 moves the lock, but its barrier keeps the live
/// holder's hold, which its user releases normally; only then is waiter 3
/// granted.
#[test]
fn a_dead_waiter_is_spliced_out_and_the_live_holder_keeps_its_hold() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in [Scheme::CoShed, Scheme::Dqnl] {
            let label = format!("{scheme:?} on {backend:?}");
            let mut cluster = Cluster::new(backend, 4);
            let mut m = managers(&cluster, scheme, by_hand);
            let id = LockId(9);
            node(&m, 0).create_lock(id).unwrap();
            let held = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap();
            // Node 2 queues behind the holder and gives up waiting: its
            // request stays queued, as a dead process's would.
            let timed_out = node(&m, 2).acquire_exclusive(id, SHORT).err().unwrap();
            assert!(
                matches!(timed_out, LockError::Timeout { blocked_on: Some(NodeId(1)), .. }),
                "{label}: {timed_out}"
            );
            {
                let waiter = wait_on(&m, 3, id);
                until("waiter 3 behind node 2", || waits_for(node(&m, 3), id, &[2]));
                drop(m[2].take());
                cluster.kill(2);
                // Node 3 finds node 2 lost, moves the lock, and its barrier
                // then waits for the holder alone (node 0 acknowledged).
                until("the barrier to wait for the holder", || {
                    node(&m, 3).scheme().tick();
                    waits_for(node(&m, 3), id, &[1])
                });
                assert!(!waiter.is_finished(), "{label}: granted while the live holder holds");
                let holder_token = held.fencing_token();
                held.release().unwrap_or_else(|e| panic!("{label}: the kept hold's release: {e}"));
                let token = waiter.join().unwrap().unwrap_or_else(|e| panic!("{label}: {e}"));
                assert!(token > holder_token, "{label}");
            }
            assert_eq!(node(&m, 3).stats().moves, 1, "{label}");
            assert_eq!(node(&m, 1).stats().message_errors, 0, "{label}");
        }
    }
}

/// A holder stops renewing its lease (its manager's threads are gone, its
/// process and regions are not: as a stopped process looks to others):
/// after the lease, its waiter moves the lock and is granted, with a token
/// above the stopped holder's, so a fenced resource rejects the holder's
/// late writes. Not before the lease: the holder is not dead.
#[test]
fn a_holder_that_stops_renewing_its_lease_loses_the_lock() {
    const LEASE: Duration = Duration::from_millis(300);
    for scheme in [Scheme::CoShed, Scheme::Srsl] {
        let cluster = Cluster::new(Backend::Shm, 3);
        let mut m = managers(&cluster, scheme, |c| fast(c).with_lease(Some(LEASE)));
        let id = LockId(12);
        node(&m, 0).create_lock(id).unwrap();
        let stale = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap();
        let stale_token = stale.fencing_token();
        let stopped = tierstack_base::time::instant_now();
        let holder = m[1].take();
        std::mem::forget(stale);
        drop(holder); // its fabric lives on: the node is not dead, only silent
        let guard = node(&m, 2).acquire_exclusive(id, PATIENT).unwrap_or_else(|e| panic!("{scheme:?}: {e}"));
        assert!(stopped.elapsed() >= LEASE, "{scheme:?}: granted before the holder's lease ran out");
        assert!(guard.fencing_token() > stale_token, "{scheme:?}");
        guard.release().unwrap();
    }
}

/// The waiter in the middle dies and its node id starts again at once, so
/// the id runs when the node behind it looks: the handle it holds is bound
/// to the dead incarnation, which is enough to move the lock. (The rest of
/// a restart, the new incarnation acknowledging, needs separate processes:
/// inside one process a killed node's accepted message connections live on,
/// so peers' cached links reach the dead incarnation; the chaos test in
/// `tierstack/tests/it/dlm_processes.rs` restarts real processes.)
#[test]
fn a_waiter_that_dies_and_restarts_is_still_found_lost() {
    let mut cluster = Cluster::new(Backend::Shm, 4);
    let mut m = managers(&cluster, Scheme::CoShed, by_hand);
    let id = LockId(14);
    node(&m, 0).create_lock(id).unwrap();
    let _held = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap();
    node(&m, 2).acquire_exclusive(id, SHORT).err().unwrap();
    let _waiter = wait_on(&m, 3, id);
    until("waiter 3 behind node 2", || waits_for(node(&m, 3), id, &[2]));
    drop(m[2].take());
    cluster.kill(2);
    cluster.restart(2);
    m[2] = Some(Arc::new(cluster.manager(2, Scheme::CoShed, &[0], by_hand)));
    until("node 3 to move the lock", || {
        node(&m, 3).scheme().tick();
        node(&m, 3).stats().moves == 1
    });
    let waits = node(&m, 3).waits(id).unwrap();
    assert!(waits.nodes.contains(&NodeId(1)), "the barrier waits for the live holder: {waits:?}");
}

/// SRSL: a holder dies and its node id starts again before anybody judged
/// it dead (the server had no reason to look: nobody waited). Its old hold
/// is still queued at the server, and the id runs. The new incarnation's
/// own request is granted (not refused as a second request from the node),
/// and a waiter behind the old hold is granted once the server's monitor
/// sees the id runs another incarnation.
#[test]
fn srsl_a_holder_that_restarts_before_it_is_found_dead_leaves_no_stale_hold() {
    for waiter_first in [false, true] {
        let mut cluster = Cluster::new(Backend::Shm, 4);
        let mut m = managers(&cluster, Scheme::Srsl, by_hand);
        let id = LockId(16);
        node(&m, 0).create_lock(id).unwrap();
        let dead_guard = node(&m, 3).acquire_exclusive(id, PATIENT).unwrap();
        let dead_token = dead_guard.fencing_token();
        std::mem::forget(dead_guard); // the process died holding it
        drop(m[3].take());
        cluster.kill(3);
        cluster.restart(3);
        m[3] = Some(Arc::new(cluster.manager(3, Scheme::Srsl, &[0], by_hand)));
        let token = if waiter_first {
            let waiter = wait_on(&m, 1, id);
            until("the server to grant the waiter", || {
                node(&m, 0).scheme().tick();
                waiter.is_finished()
            });
            waiter.join().unwrap().unwrap_or_else(|e| panic!("the waiter behind a stale hold: {e}"))
        } else {
            let guard = node(&m, 3)
                .acquire_exclusive(id, PATIENT)
                .unwrap_or_else(|e| panic!("the restarted node's own request: {e}"));
            let token = guard.fencing_token();
            guard.release().unwrap();
            token
        };
        assert!(token > dead_token, "{token} after the old incarnation's {dead_token}");
        assert_eq!(node(&m, 0).stats().message_errors, 0, "waiter first: {waiter_first}");
        // The lock works on for everybody.
        node(&m, 2).acquire_exclusive(id, PATIENT).unwrap().release().unwrap();
        node(&m, 3).acquire_shared(id, PATIENT).unwrap().release().unwrap();
    }
}

/// The home dies: a request waiting for the lock fails at once with
/// `PeerDead` naming the home, rather than waiting out its timeout. When
/// the home comes back and creates the lock again, the lock works, and its
/// tokens are above the old incarnation's (the fence is seeded with the
/// creation time).
#[test]
fn a_dead_home_fails_fast_and_its_next_incarnation_serves_with_higher_tokens() {
    let mut cluster = Cluster::new(Backend::Shm, 3);
    let mut m = managers(&cluster, Scheme::CoShed, by_hand);
    let id = LockId(15);
    node(&m, 0).create_lock(id).unwrap();
    let created = unix_ms();
    let held = node(&m, 2).acquire_exclusive(id, PATIENT).unwrap();
    let old_token = held.fencing_token();
    {
        let waiter = wait_on(&m, 1, id);
        until("node 1 behind node 2", || waits_for(node(&m, 1), id, &[2]));
        drop(m[0].take());
        cluster.kill(0);
        let started = tierstack_base::time::instant_now();
        until("the waiter to fail", || {
            node(&m, 1).scheme().tick();
            waiter.is_finished()
        });
        let failed = waiter.join().unwrap();
        assert!(matches!(failed, Err(LockError::PeerDead { node: NodeId(0), .. })), "{failed:?}");
        assert!(started.elapsed() < PATIENT);
    }
    std::mem::forget(held); // its home is gone
                            // The token seed has millisecond resolution: the new incarnation must
                            // be created in a later millisecond than the old one.
    while unix_ms() == created {
        std::thread::yield_now();
    }
    cluster.restart(0);
    m[0] = Some(Arc::new(cluster.manager(0, Scheme::CoShed, &[0], by_hand)));
    node(&m, 0).create_lock(id).unwrap();
    let token = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap().fencing_token();
    assert!(token > old_token, "new incarnation's token {token} after {old_token}");
}

fn unix_ms() -> u128 {
    tierstack_base::time::system_now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// Recovery off: a dead holder wedges its lock until an operator breaks it,
/// and a waiter's timeout names the dead holder.
#[test]
fn with_recovery_off_a_dead_holder_waits_for_break_lock() {
    let mut cluster = Cluster::new(Backend::Shm, 3);
    let mut m = managers(&cluster, Scheme::CoShed, |c| c.with_recovery(false));
    let id = LockId(16);
    node(&m, 0).create_lock(id).unwrap();
    let guard = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap();
    drop(m[1].take());
    std::mem::forget(guard);
    cluster.kill(1);
    let err = node(&m, 2).acquire_exclusive(id, Duration::from_millis(300)).err().unwrap();
    assert!(matches!(err, LockError::PeerDead { node: NodeId(1), .. }), "{err}");
    assert_eq!(node(&m, 2).stats().moves, 0, "nothing moved by itself");
    node(&m, 0).break_lock(id).unwrap();
    node(&m, 2).acquire_exclusive(id, PATIENT).unwrap();
}
