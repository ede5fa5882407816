//! The lock manager on real fabrics (shm and tcp), every scheme: a stress
//! run with an independent mutual-exclusion checker, and every error path.

use crate::common;

use common::{Backend, Cluster};
use rand::Rng;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::{seeded_rng, NodeId};
use tierstack_dlm::{LockError, LockId, LockManager, LockMode, Scheme, Wait};
use tierstack_fabric::Channel;

/// Long enough that a grant that should come always comes on a loaded
/// machine; a test only waits this long when something is wrong.
const PATIENT: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(100);

const EXCLUSIVE_BIT: u64 = 1 << 63;

/// The checker's view of one lock, kept in the test process and updated
/// inside every critical section: an occupancy word (exclusive bit + shared
/// count), the largest fencing token seen, and the largest shared overlap.
#[derive(Default)]
struct Checker {
    occupancy: AtomicU64,
    last_token: Mutex<u64>,
    max_shared: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl Checker {
    fn enter_exclusive(&self, who: usize, token: u64) {
        if let Err(seen) = self.occupancy.compare_exchange(0, EXCLUSIVE_BIT, Ordering::SeqCst, Ordering::SeqCst) {
            self.violation(format!("node {who}: exclusive entry with occupancy {seen:#x}"));
        }
        let mut last = self.last_token.lock().unwrap();
        if token <= *last {
            self.violation(format!("node {who}: fencing token {token} after {}", *last));
        }
        *last = token;
    }

    fn leave_exclusive(&self, who: usize) {
        if let Err(seen) = self.occupancy.compare_exchange(EXCLUSIVE_BIT, 0, Ordering::SeqCst, Ordering::SeqCst) {
            self.violation(format!("node {who}: exclusive exit with occupancy {seen:#x}"));
        }
    }

    fn enter_shared(&self, who: usize) {
        let previous = self.occupancy.fetch_add(1, Ordering::SeqCst);
        if previous & EXCLUSIVE_BIT != 0 {
            self.violation(format!("node {who}: shared entry while an exclusive holds"));
        }
        self.max_shared.fetch_max((previous & !EXCLUSIVE_BIT) + 1, Ordering::SeqCst);
    }

    fn leave_shared(&self) {
        self.occupancy.fetch_sub(1, Ordering::SeqCst);
    }

    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }
}

/// `nodes` nodes (two of them lock servers) hammer `locks` locks with a
/// random mix of shared and exclusive requests; the checker must see no
/// overlap of an exclusive with anyone, strictly increasing tokens, and
/// every request granted.
fn stress(backend: Backend, scheme: Scheme, nodes: u32, locks: u64, rounds: usize) {
    let cluster = Cluster::new(backend, nodes);
    let managers = Arc::new(cluster.managers(scheme, &[0, 1]));
    for id in 0..locks {
        managers[0].create_lock(LockId(id)).unwrap();
    }
    let checkers: Arc<Vec<Checker>> = Arc::new((0..locks).map(|_| Checker::default()).collect());
    let grants = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..nodes as usize)
        .map(|who| {
            let (managers, checkers, grants) = (managers.clone(), checkers.clone(), grants.clone());
            std::thread::spawn(move || {
                let mut rng = seeded_rng(0xD1 + who as u64);
                let me = &managers[who];
                for _ in 0..rounds {
                    let id = rng.gen_range(0..locks);
                    let checker = &checkers[id as usize];
                    if rng.gen_bool(0.5) {
                        let guard =
                            me.acquire_exclusive(LockId(id), PATIENT).unwrap_or_else(|e| panic!("node {who}: {e}"));
                        checker.enter_exclusive(who, guard.fencing_token());
                        std::thread::yield_now();
                        checker.leave_exclusive(who);
                        guard.release().unwrap();
                    } else {
                        let guard =
                            me.acquire_shared(LockId(id), PATIENT).unwrap_or_else(|e| panic!("node {who}: {e}"));
                        checker.enter_shared(who);
                        std::thread::yield_now();
                        checker.leave_shared();
                        guard.release().unwrap();
                    }
                    grants.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
    assert_eq!(grants.load(Ordering::SeqCst), nodes as usize * rounds, "every request granted");
    for (i, m) in managers.iter().enumerate() {
        assert_eq!(m.stats().message_errors, 0, "{scheme:?} on {backend:?}: node {i} mishandled messages");
    }
    let overlap: Vec<u64> = checkers.iter().map(|c| c.max_shared.load(Ordering::SeqCst)).collect();
    eprintln!("{scheme:?} on {backend:?}: largest shared overlap per lock {overlap:?}");
    for (id, checker) in checkers.iter().enumerate() {
        let violations = checker.violations.lock().unwrap();
        assert!(violations.is_empty(), "{scheme:?} on {backend:?}, lock {id}: {violations:?}");
        assert_eq!(checker.occupancy.load(Ordering::SeqCst), 0);
        assert!(*checker.last_token.lock().unwrap() > 0, "lock {id} never held exclusively");
    }
}

#[test]
fn stress_shm_ncoshed() {
    stress(Backend::Shm, Scheme::CoShed, 5, 2, 300);
}

#[test]
fn stress_shm_srsl() {
    stress(Backend::Shm, Scheme::Srsl, 5, 2, 200);
}

#[test]
fn stress_shm_dqnl() {
    stress(Backend::Shm, Scheme::Dqnl, 5, 2, 200);
}

#[test]
fn stress_tcp_ncoshed() {
    stress(Backend::Tcp, Scheme::CoShed, 4, 2, 150);
}

#[test]
fn stress_tcp_srsl() {
    stress(Backend::Tcp, Scheme::Srsl, 4, 2, 100);
}

#[test]
fn stress_tcp_dqnl() {
    stress(Backend::Tcp, Scheme::Dqnl, 4, 2, 100);
}

#[test]
fn stress_ucx_ncoshed() {
    if common::ucx_or_skip() {
        stress(Backend::Ucx, Scheme::CoShed, 5, 2, 300);
    }
}

#[test]
fn stress_ucx_srsl() {
    if common::ucx_or_skip() {
        stress(Backend::Ucx, Scheme::Srsl, 5, 2, 200);
    }
}

#[test]
fn stress_ucx_dqnl() {
    if common::ucx_or_skip() {
        stress(Backend::Ucx, Scheme::Dqnl, 5, 2, 200);
    }
}

/// Shared holders overlap under N-CoShED and SRSL; DQNL serializes them.
#[test]
fn shared_holders_overlap_except_in_dqnl() {
    for scheme in Scheme::ALL {
        let cluster = Cluster::new(Backend::Shm, 3);
        let m = cluster.managers(scheme, &[0]);
        let id = LockId(7);
        m[0].create_lock(id).unwrap();
        let first = m[1].acquire_shared(id, PATIENT).unwrap();
        let second = m[2].try_acquire_shared(id);
        match scheme {
            Scheme::Dqnl => assert!(matches!(second, Err(LockError::WouldBlock { .. })), "{scheme:?}"),
            _ => assert!(second.is_ok(), "{scheme:?}: {:?}", second.err()),
        }
        // An exclusive request waits while shared holders hold.
        assert!(matches!(m[0].try_acquire_exclusive(id), Err(LockError::WouldBlock { .. })), "{scheme:?}");
        drop(second);
        first.release().unwrap();
        // (An SRSL release is a message: wait for the server to see it.)
        let exclusive = m[0].acquire_exclusive(id, PATIENT).unwrap();
        assert!(matches!(m[1].try_acquire_shared(id), Err(LockError::WouldBlock { .. })), "{scheme:?}");
        exclusive.release().unwrap();
    }
}

/// A shared request behind a queued exclusive waits for it; the shared
/// requests queued behind that exclusive are granted when it releases.
#[test]
fn shared_behind_a_queued_exclusive_waits_for_it() {
    for scheme in [Scheme::CoShed, Scheme::Srsl] {
        let cluster = Cluster::new(Backend::Shm, 5);
        let m = Arc::new(cluster.managers(scheme, &[0]));
        let id = LockId(3);
        m[0].create_lock(id).unwrap();
        let first = m[1].acquire_exclusive(id, PATIENT).unwrap();
        let baseline = settled_messages(&m);
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |who: usize, mode: LockMode| {
            let (m, order) = (m.clone(), order.clone());
            std::thread::spawn(move || {
                let grant = m[who].scheme().acquire(id, mode, Wait::Timeout(PATIENT)).unwrap();
                order.lock().unwrap().push((who, mode));
                m[who].scheme().release(&grant).unwrap();
            })
        };
        // Each request costs one message while it enqueues (N-CoShED: to
        // its predecessor; SRSL: to the server), so counting orders them.
        let writer = spawn(2, LockMode::Exclusive);
        wait_for_messages(&m, baseline + 1);
        let readers = [spawn(3, LockMode::Shared), spawn(4, LockMode::Shared)];
        wait_for_messages(&m, baseline + 3);
        assert!(order.lock().unwrap().is_empty(), "{scheme:?}: nobody may pass the holder");
        first.release().unwrap();
        writer.join().unwrap();
        for r in readers {
            r.join().unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 3);
        assert_eq!(order[0], (2, LockMode::Exclusive), "{scheme:?}: the queued writer goes first: {order:?}");
    }
}

fn total_messages(managers: &[LockManager]) -> u64 {
    managers.iter().map(|m| m.stats().messages_handled).sum()
}

/// Waits until no message is in flight (everything sent was handled, and
/// counted: a message is counted just after its handling, which may already
/// have granted a waiter), then returns the handled total: a baseline that
/// a late count of an earlier message cannot inflate.
fn settled_messages(managers: &[LockManager]) -> u64 {
    let sent = |ms: &[LockManager]| ms.iter().map(|m| m.stats().messages_sent).sum::<u64>();
    let deadline = tierstack_base::time::instant_now() + PATIENT;
    loop {
        let sent_before = sent(managers);
        let handled = total_messages(managers);
        if sent_before == sent(managers) && handled >= sent_before {
            return handled;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "messages in flight never settled");
        std::thread::yield_now();
    }
}

/// Waits until the managers together have handled at least `n` messages.
fn wait_for_messages(managers: &[LockManager], n: u64) {
    let deadline = tierstack_base::time::instant_now() + PATIENT;
    while total_messages(managers) < n {
        assert!(tierstack_base::time::instant_now() < deadline, "messages never arrived");
        std::thread::yield_now();
    }
}

/// An uncontended N-CoShED acquire/release involves no message (hence no
/// CPU) at the home; SRSL costs the home two messages per cycle.
#[test]
fn uncontended_ncoshed_does_not_involve_the_home() {
    for (scheme, per_cycle) in [(Scheme::CoShed, 0), (Scheme::Dqnl, 0), (Scheme::Srsl, 2)] {
        let cluster = Cluster::new(Backend::Shm, 2);
        let m = cluster.managers(scheme, &[0]);
        let id = LockId(11);
        m[1].create_lock(id).unwrap();
        for _ in 0..10 {
            m[1].acquire_exclusive(id, PATIENT).unwrap().release().unwrap();
            m[1].acquire_shared(id, PATIENT).unwrap().release().unwrap();
        }
        let deadline = tierstack_base::time::instant_now() + PATIENT;
        while m[0].stats().messages_handled < 20 * per_cycle {
            assert!(tierstack_base::time::instant_now() < deadline, "{scheme:?}: the home never saw the requests");
            std::thread::yield_now();
        }
        assert_eq!(m[0].stats().messages_handled, 20 * per_cycle, "{scheme:?}");
    }
}

#[test]
fn timeout_names_the_holder_and_the_abandoned_request_passes_the_lock_on() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let cluster = Cluster::new(backend, 3);
            let m = cluster.managers(scheme, &[0]);
            let id = LockId(5);
            m[0].create_lock(id).unwrap();
            let held = m[1].acquire_exclusive(id, PATIENT).unwrap();
            let err = m[2].acquire_exclusive(id, SHORT).err().expect("must time out");
            let expected_blocker = if scheme == Scheme::Srsl { NodeId(0) } else { NodeId(1) };
            match err {
                LockError::Timeout { lock, blocked_on, waited_ms } => {
                    assert_eq!(lock, id);
                    assert_eq!(blocked_on, Some(expected_blocker), "{scheme:?} on {backend:?}");
                    assert!(waited_ms >= 100);
                }
                other => panic!("{scheme:?} on {backend:?}: expected Timeout, got {other}"),
            }
            let token = held.fencing_token();
            held.release().unwrap();
            // The abandoned request was granted and released behind the
            // scenes: everybody can take the lock again.
            let again = m[2].acquire_exclusive(id, PATIENT).unwrap();
            assert!(again.fencing_token() > token);
            drop(again);
            m[0].acquire_shared(id, PATIENT).unwrap();
        }
    }
}

#[test]
fn releasing_a_grant_twice_is_not_held() {
    for scheme in Scheme::ALL {
        let cluster = Cluster::new(Backend::Shm, 2);
        let m = cluster.managers(scheme, &[0]);
        let id = LockId(9);
        m[0].create_lock(id).unwrap();
        let grant = m[1].scheme().acquire(id, LockMode::Exclusive, Wait::Timeout(PATIENT)).unwrap();
        m[1].scheme().release(&grant).unwrap();
        assert_eq!(m[1].scheme().release(&grant), Err(LockError::NotHeld { lock: id }), "{scheme:?}");
        // A grant of another node is not held here either.
        let other = m[0].scheme().acquire(id, LockMode::Shared, Wait::Timeout(PATIENT)).unwrap();
        assert!(matches!(m[1].scheme().release(&other), Err(LockError::NotHeld { .. })));
        m[0].scheme().release(&other).unwrap();
    }
}

#[test]
fn unknown_and_invalid_locks_and_a_full_table() {
    let cluster = Cluster::new(Backend::Shm, 2);
    let m = cluster.managers_with(Scheme::CoShed, &[0], |c| c.with_table_slots(2));
    assert!(matches!(m[1].acquire_exclusive(LockId(1), SHORT), Err(LockError::UnknownLock { home: NodeId(0), .. })));
    assert!(matches!(m[1].try_acquire_shared(LockId(1)), Err(LockError::UnknownLock { .. })));
    assert!(matches!(m[1].break_lock(LockId(1)), Err(LockError::UnknownLock { .. })));
    assert!(matches!(m[1].create_lock(LockId(u64::MAX)), Err(LockError::InvalidLockId { .. })));
    m[1].create_lock(LockId(1)).unwrap();
    m[1].create_lock(LockId(1)).unwrap(); // idempotent
    m[0].create_lock(LockId(2)).unwrap();
    assert_eq!(m[1].create_lock(LockId(3)), Err(LockError::TableFull { home: NodeId(0), slots: 2 }));
    m[1].acquire_shared(LockId(2), SHORT).unwrap();
}

#[test]
fn dead_home_is_a_peer_dead_error() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let mut cluster = Cluster::new(backend, 3);
            let mut m = cluster.managers(scheme, &[0]);
            let id = LockId(4);
            m[1].create_lock(id).unwrap();
            drop(m.remove(0));
            cluster.kill(0);
            // Node 2 never touched the home: it cannot reach the dead home's table.
            let err = m[1].acquire_exclusive(id, SHORT).err().expect("the home is dead");
            assert!(matches!(err, LockError::PeerDead { node: NodeId(0), .. }), "{scheme:?} on {backend:?}: {err}");
            // Node 1 already used it: its connection (tcp) or its mapping
            // (shm: revoked when the home closed) fails too, for every scheme.
            let result = m[0].acquire_exclusive(id, SHORT).map(|g| g.fencing_token());
            assert!(
                matches!(result, Err(LockError::PeerDead { node: NodeId(0), .. })),
                "{scheme:?} on {backend:?}: {result:?}"
            );
            // A failed request does not leave the node's queue entry busy.
            if backend == Backend::Shm && scheme == Scheme::Srsl {
                let again = m[0].acquire_exclusive(id, SHORT).map(|g| g.fencing_token());
                assert!(matches!(again, Err(LockError::PeerDead { .. })), "{again:?}");
            }
        }
    }
}

/// With automatic recovery off, a holder dies: waiters see `PeerDead`
/// naming it (N-CoShED, DQNL: the waiter knows its predecessor) or a
/// `Timeout` at the live server (SRSL); `break_lock` then frees the lock,
/// and the fencing floor makes the dead holder's token stale. (With
/// recovery on, `tests/recovery.rs`.)
#[test]
fn dead_holder_is_detected_and_break_lock_fences_it_out() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let mut cluster = Cluster::new(backend, 3);
            let mut m: Vec<Option<LockManager>> =
                cluster.managers_with(scheme, &[0], |c| c.with_recovery(false)).into_iter().map(Some).collect();
            let id = LockId(6);
            node(&m, 0).create_lock(id).unwrap();
            let dead_guard = node(&m, 1).acquire_exclusive(id, PATIENT).unwrap();
            let dead_token = dead_guard.fencing_token();
            drop(m[1].take());
            std::mem::forget(dead_guard); // the process died holding it
            cluster.kill(1);
            let err = node(&m, 2).acquire_exclusive(id, SHORT).err().expect("the holder is dead");
            match (scheme, &err) {
                (Scheme::Srsl, LockError::Timeout { blocked_on: Some(NodeId(0)), .. }) => {}
                (Scheme::CoShed | Scheme::Dqnl, LockError::PeerDead { node: NodeId(1), .. }) => {}
                _ => panic!("{scheme:?} on {backend:?}: {err}"),
            }
            let floor = node(&m, 0).break_lock(id).unwrap();
            assert!(floor > dead_token);
            let guard =
                node(&m, 2).acquire_exclusive(id, PATIENT).unwrap_or_else(|e| panic!("{scheme:?} {backend:?}: {e}"));
            assert!(guard.fencing_token() > floor, "{scheme:?} on {backend:?}");
            // A resource that keeps the largest token it saw rejects the dead holder.
            let resource = FencedResource::default();
            assert!(resource.write(guard.fencing_token()));
            assert!(!resource.write(dead_token));
            guard.release().unwrap();
            node(&m, 0).acquire_shared(id, PATIENT).unwrap();
        }
    }
}

/// A live holder whose lock is broken learns it at release; its waiting
/// peers are told at once.
#[test]
fn a_broken_hold_reports_broken() {
    for scheme in Scheme::ALL {
        let cluster = Cluster::new(Backend::Shm, 3);
        let m = cluster.managers(scheme, &[0]);
        let id = LockId(8);
        m[0].create_lock(id).unwrap();
        let held = m[1].acquire_exclusive(id, PATIENT).unwrap();
        let baseline = settled_messages(&m);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| m[2].acquire_exclusive(id, PATIENT).map(|g| g.fencing_token()));
            wait_for_messages(&m, baseline + 1);
            m[0].break_lock(id).unwrap();
            assert_eq!(waiter.join().unwrap(), Err(LockError::Broken { lock: id }), "{scheme:?}");
        });
        // Node 1 has handled two messages (N-CoShED: node 2's successor
        // notice; SRSL: its grant) plus the break notice.
        let deadline = tierstack_base::time::instant_now() + PATIENT;
        while m[1].stats().messages_handled < 2 {
            assert!(tierstack_base::time::instant_now() < deadline, "{scheme:?}: the break notice never arrived");
            std::thread::yield_now();
        }
        assert_eq!(held.release(), Err(LockError::Broken { lock: id }), "{scheme:?}");
        m[2].acquire_exclusive(id, PATIENT).unwrap();
        broken_holds_show_in_the_metrics(scheme, &m);
    }
}

/// The metrics of [`a_broken_hold_reports_broken`]'s run: each refusal is
/// counted as fenced on the node it refused, the break is no recovery,
/// and every hold ended.
fn broken_holds_show_in_the_metrics(scheme: Scheme, m: &[LockManager]) {
    let fenced = |i: usize| {
        let mut out = tierstack_stats::exposition::Exposition::new();
        m[i].metrics().write(&mut out);
        let checked = tierstack_testkit::metrics::check(&out.finish()).unwrap();
        checked.get("tierstack_dlm_fenced_total")
    };
    let (holder, waiter) = (m[1].metrics(), m[2].metrics());
    assert_eq!(holder.acquires(), (0, 1), "{scheme:?}");
    assert_eq!(fenced(1), 1.0, "{scheme:?}: the holder's release said Broken");
    assert_eq!(waiter.acquires(), (0, 1), "{scheme:?}: the waiter's one grant came after the break");
    assert_eq!(fenced(2), 1.0, "{scheme:?}: the waiter's request said Broken");
    assert_eq!((holder.held(), waiter.held()), (0, 0), "{scheme:?}: every hold ended");
    assert_eq!(fenced(0), 0.0, "{scheme:?}");
    assert_eq!(m[0].stats().recoveries, 0, "{scheme:?}: a break is no recovery");
}

fn node(m: &[Option<LockManager>], i: usize) -> &LockManager {
    m[i].as_ref().expect("node is alive")
}

#[derive(Default)]
struct FencedResource {
    largest: Mutex<u64>,
}

impl FencedResource {
    fn write(&self, token: u64) -> bool {
        let mut largest = self.largest.lock().unwrap();
        if token < *largest {
            return false;
        }
        *largest = token;
        true
    }
}

/// The lock manager shares its nodes with another service: while every node
/// takes turns on a contended lock, a "cache" service on each node sends
/// messages to the others on `Channel::COOP_CACHE`, including payloads that
/// look like lock messages. The locks work; no lock manager ever handles a
/// cache message (none fails to decode, and messages handled equal messages
/// sent once settled); and each cache inbox holds exactly the messages sent
/// to it, in order.
#[test]
fn the_lock_manager_shares_its_node_with_another_service() {
    const CACHE_MESSAGES: u32 = 300;
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in [Scheme::CoShed, Scheme::Srsl] {
            let cluster = Cluster::new(backend, 3);
            let m = Arc::new(cluster.managers(scheme, &[0]));
            let id = LockId(21);
            m[0].create_lock(id).unwrap();
            // A cache payload: the lock manager's tag and length, so that a
            // lock manager reading this channel would try to handle it.
            let cache_payload = |from: usize, seq: u32| {
                let mut payload = vec![tierstack_dlm::msg::SERVICE_TAG; tierstack_dlm::msg::MESSAGE_BYTES];
                payload[1] = from as u8;
                payload[2..6].copy_from_slice(&seq.to_le_bytes());
                payload
            };
            std::thread::scope(|s| {
                for who in 0..3usize {
                    let fabric = cluster.fabric(who);
                    s.spawn(move || {
                        for seq in 0..CACHE_MESSAGES {
                            let to = NodeId(((who + 1 + seq as usize % 2) % 3) as u32);
                            fabric.send(to, Channel::COOP_CACHE, &cache_payload(who, seq)).unwrap();
                        }
                    });
                    let m = m.clone();
                    s.spawn(move || {
                        for _ in 0..20 {
                            m[who].acquire_exclusive(id, PATIENT).unwrap().release().unwrap();
                        }
                    });
                }
            });
            settled_messages(&m);
            for (who, manager) in m.iter().enumerate() {
                let stats = manager.stats();
                assert_eq!(stats.message_errors, 0, "{backend:?} {scheme:?} node {who}: only lock messages handled");
            }
            assert_eq!(
                m.iter().map(|x| x.stats().messages_handled).sum::<u64>(),
                m.iter().map(|x| x.stats().messages_sent).sum::<u64>(),
                "{backend:?} {scheme:?}"
            );
            // Sender `from` sends its even seqs to `from + 1` and its odd ones to `from + 2` (mod 3).
            for to in 0..3usize {
                let fabric = cluster.fabric(to);
                let inbox = fabric.inbox(Channel::COOP_CACHE);
                let mut received = [0u32; 3];
                for _ in 0..CACHE_MESSAGES {
                    let message = inbox.recv_timeout(PATIENT).unwrap();
                    let from = message.from.0 as usize;
                    let parity = if (from + 1) % 3 == to { 0 } else { 1 };
                    let seq = 2 * received[from] + parity;
                    assert_eq!(message.payload, cache_payload(from, seq), "{backend:?} {scheme:?}: in order");
                    received[from] += 1;
                }
                assert!(inbox.is_empty(), "{backend:?} {scheme:?}: nothing more");
                assert_eq!(received[to], 0);
                assert_eq!(received.iter().sum::<u32>(), CACHE_MESSAGES);
            }
        }
    }
}
