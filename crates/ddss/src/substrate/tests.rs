//! Recovery from dead holders and claimers, across processes and backends.

use super::*;
use crate::key::{Coherence, Placement};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_fabric_tcp::{TcpConfig, TcpFabric};

fn config() -> DdssConfig {
    // Few lock attempts, so that a lock held by a live process is
    // reported busy quickly; enough for two holder checks.
    DdssConfig { lock_attempts_max: 400, ..DdssConfig::empty().with_slots(64, 4) }.with_members(vec![
        NodeId(0),
        NodeId(1),
        NodeId(2),
    ])
}

/// Ends the writer's fabric, as its process's death would.
type EndWriter = Box<dyn FnOnce()>;

/// Three fabrics (home, writer, survivor) and a way to end the writer's.
fn fabrics(shm: bool, root: &std::path::Path) -> (Vec<Arc<dyn Fabric>>, EndWriter) {
    if shm {
        let open = |id| ShmFabric::open(ShmConfig::new(root, NodeId(id))).unwrap();
        let (home, writer, survivor) = (open(0), open(1), open(2));
        let fabrics: Vec<Arc<dyn Fabric>> = vec![home, writer.clone(), survivor];
        // The last handle of the writer's fabric goes with the closure's
        // caller dropping everything else it holds.
        return (fabrics, Box::new(move || drop(writer)));
    }
    let loopback = "127.0.0.1:0".parse().unwrap();
    let tcp: Vec<Arc<TcpFabric>> =
        (0..3).map(|id| TcpFabric::open(TcpConfig::new(NodeId(id), loopback)).unwrap()).collect();
    for a in &tcp {
        for b in &tcp {
            a.add_peer(b.local_node(), b.local_addr());
        }
    }
    let writer = tcp[1].clone();
    let fabrics = tcp.into_iter().map(|f| f as Arc<dyn Fabric>).collect();
    (fabrics, Box::new(move || writer.shutdown()))
}

/// The writer (node 1) takes the key's lock as a put does and, if
/// `mid_write`, starts the seqlock write (odd sequence, half a value),
/// and goes no further: what a process killed inside its put leaves.
/// Returns its handles (to drop before its fabric ends) and the locked word.
fn stall_inside_a_put(fabrics: &[Arc<dyn Fabric>], key: Key, mid_write: bool) -> (Ddss, Arc<dyn RemoteRegion>, u64) {
    let writer = Ddss::attach(fabrics[1].clone(), config()).unwrap();
    let (_, slot) = writer.slot(&key).unwrap();
    let region = fabrics[1].connect(NodeId(0), REGION_NAME).unwrap();
    let locked_word = writer.lock(&*region, slot, key).unwrap();
    if mid_write {
        region.fetch_add(slot + SLOT_SEQUENCE, 1).unwrap();
        region.write(slot + SLOT_DATA, b"hal").unwrap();
    }
    (writer, region, locked_word)
}

/// The writer stalls inside a put (see [`stall_inside_a_put`]), then its
/// process ends before it unlocks.
fn dead_holder(shm: bool, mid_write: bool) {
    let root = tempfile::tempdir().unwrap();
    let (fabrics, end_writer) = fabrics(shm, root.path());
    let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
    let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
    let key = home.allocate(64, Placement::Local, Coherence::Strict).unwrap();
    assert_eq!(survivor.put(key, b"first").unwrap(), 1);

    let (writer, region, locked_word) = stall_inside_a_put(&fabrics, key, mid_write);
    let busy = survivor.put(key, b"x");
    assert!(matches!(busy, Err(DdssError::LockBusy { .. })), "a live holder's lock is not taken: {busy:?}");
    assert_eq!(survivor.stats().lock_takeovers, 0);

    drop((region, writer));
    let mut fabrics = fabrics;
    fabrics.remove(1);
    end_writer();
    assert_eq!(fabrics[1].peer_state(NodeId(1)), PeerState::Gone);

    let got = survivor.get(key);
    if mid_write {
        assert_eq!(got, Err(DdssError::ValueLost { key }), "a half-written value is never returned");
    } else {
        assert_eq!(got, Ok((1, b"first".to_vec())), "the value the dead holder never touched stays");
    }
    let stats = survivor.stats();
    assert_eq!((stats.lock_takeovers, stats.values_lost), (1, u64::from(mid_write)));
    let version = survivor.put(key, b"third").unwrap();
    assert_eq!(version, if mid_write { 3 } else { 2 }, "the lost put keeps versions consecutive");
    assert_eq!(home.get(key).unwrap(), (version, b"third".to_vec()));
    assert_ne!(locked_word, SlotWord::unlocked(key.generation()));
}

/// A get that takes no lock (read coherence) finds the dead writer's
/// sequence odd for good; it takes the lock over and reports the loss.
#[test]
fn a_lockless_get_of_a_value_whose_writer_died_mid_write_reports_it_lost() {
    for shm in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let (mut fabrics, end_writer) = fabrics(shm, root.path());
        let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
        let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
        let key = home.allocate(64, Placement::Local, Coherence::Read).unwrap();
        assert_eq!(home.put(key, b"first").unwrap(), 1);
        drop(stall_inside_a_put(&fabrics, key, true));
        fabrics.remove(1);
        end_writer();
        assert_eq!(survivor.get(key), Err(DdssError::ValueLost { key }), "shm={shm}");
        assert_eq!(survivor.stats().lock_takeovers, 1);
        assert_eq!(survivor.put(key, b"again").unwrap(), 3);
        assert_eq!(survivor.get(key).unwrap(), (3, b"again".to_vec()));
    }
}

/// The writer holds the key's lock, its process ends, and a new process
/// reopens its node id (and runs the substrate there). The lock word
/// names the dead incarnation, so it is taken over although node 1 runs.
#[test]
fn a_lock_held_by_a_dead_incarnation_of_a_reopened_node_is_taken_over() {
    let root = tempfile::tempdir().unwrap();
    let (mut fabrics, end_writer) = fabrics(true, root.path());
    let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
    let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
    let key = home.allocate(64, Placement::Local, Coherence::Write).unwrap();
    assert_eq!(survivor.put(key, b"first").unwrap(), 1);
    drop(stall_inside_a_put(&fabrics, key, false));
    fabrics.remove(1);
    end_writer();
    let reopened = ShmFabric::open(ShmConfig::new(root.path(), NodeId(1))).unwrap();
    let successor = Ddss::attach(reopened.clone(), config()).unwrap();
    assert_eq!(fabrics[1].peer_state(NodeId(1)), PeerState::Running, "node 1 runs again");
    assert_eq!(successor.put(key, b"second").unwrap(), 2, "the new incarnation takes its predecessor's lock over");
    assert_eq!(successor.stats().lock_takeovers, 1);
    assert_eq!(survivor.get(key).unwrap(), (2, b"second".to_vec()));
    // A live incarnation's lock is still respected, on the same node id.
    let (_, slot) = successor.slot(&key).unwrap();
    let region = reopened.connect(NodeId(0), REGION_NAME).unwrap();
    successor.lock(&*region, slot, key).unwrap();
    assert!(matches!(survivor.put(key, b"x"), Err(DdssError::LockBusy { .. })));
}

/// An allocator that dies after claiming a slot and before publishing
/// it: with the bitmap bit still clear (the next allocation takes the
/// claim over) or already set (the class looks full; the sweep frees it).
#[test]
fn a_slot_claimed_by_a_dead_allocator_is_reclaimed() {
    for (shm, bit_set) in [(true, false), (true, true), (false, true)] {
        let root = tempfile::tempdir().unwrap();
        let (mut fabrics, end_writer) = fabrics(shm, root.path());
        let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
        let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
        let keys: Vec<Key> = (0..3).map(|_| home.allocate(64, Placement::Local, Coherence::Null).unwrap()).collect();
        let writer = Ddss::attach(fabrics[1].clone(), config()).unwrap();
        let whome = writer.home(NodeId(0)).unwrap();
        let class = keys[0].class();
        let (slot, _) = if bit_set {
            writer.claim_on(&whome, NodeId(0), class).unwrap()
        } else {
            // Claimed in the control word; died before setting the bit.
            let index = (0..4)
                .find(|i| writer.claim_slot(&*whome.region, whome.layout.slot_offset(class, *i)).unwrap().is_some())
                .unwrap();
            (whome.layout.slot_offset(class, index), 0)
        };
        let full = survivor.allocate(64, Placement::Node(NodeId(0)), Coherence::Null);
        assert!(matches!(full, Err(DdssError::RegionFull { .. })), "a live claim is respected: {full:?}");
        drop((whome, writer));
        fabrics.remove(1);
        end_writer();
        let key = survivor.allocate(64, Placement::Node(NodeId(0)), Coherence::Null).unwrap();
        assert_eq!(u64::from(key.offset()), slot, "shm={shm} bit_set={bit_set}: the dead claim's slot");
        assert_eq!(survivor.stats().claims_taken_over, 1, "by the allocation or its sweep");
        assert_eq!(survivor.put(key, b"mine").unwrap(), 1);
        assert_eq!(home.get(key).unwrap(), (1, b"mine".to_vec()));
        assert!(matches!(home.allocate(64, Placement::Local, Coherence::Null), Err(DdssError::RegionFull { .. })));
        for k in keys.into_iter().chain([key]) {
            home.free(k).unwrap();
        }
        assert_eq!(home.usage(NodeId(0)).unwrap()[class as usize].2, 0, "used counter back to zero");
    }
}

/// A free that dies after marking the slot dead and before clearing its
/// bit: the slot is reclaimed by the sweep of a full class.
#[test]
fn a_slot_whose_free_died_midway_is_reclaimed() {
    let root = tempfile::tempdir().unwrap();
    let (mut fabrics, end_writer) = fabrics(true, root.path());
    let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
    let keys: Vec<Key> = (0..4).map(|_| home.allocate(64, Placement::Local, Coherence::Null).unwrap()).collect();
    let writer = Ddss::attach(fabrics[1].clone(), config()).unwrap();
    let (whome, slot) = writer.slot(&keys[0]).unwrap();
    let locked_word = writer.lock(&*whome.region, slot, keys[0]).unwrap();
    let claimed = SlotWord { generation: keys[0].generation(), live: false, low: writer.token }.pack();
    let dead = SlotWord { generation: keys[0].generation(), live: false, low: 0 }.pack();
    // The first batch of `free`, and no further.
    let ops = vec![
        Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
        Op::Write { offset: slot + SLOT_HEADER, data: dead.to_ne_bytes().to_vec() },
        Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
        Op::CompareSwap { offset: slot + SLOT_CONTROL, expected: locked_word, new: claimed },
        Op::FetchAdd { offset: Layout::used_counter_offset(keys[0].class()), delta: 1u64.wrapping_neg() },
    ];
    assert_eq!(nth_u64(whome.region.post(ops).wait().unwrap(), 3).unwrap(), locked_word);
    drop((whome, writer));
    fabrics.remove(1);
    end_writer();
    assert_eq!(home.get(keys[0]), Err(DdssError::KeyFreed { key: keys[0] }));
    let key = home.allocate(64, Placement::Local, Coherence::Null).unwrap();
    assert_eq!(u64::from(key.offset()), slot);
    assert_eq!(key.generation(), keys[0].generation() + 1);
    assert_eq!(home.sweep(NodeId(0)).unwrap(), 0, "nothing left to sweep");
}

#[test]
fn a_lock_whose_holder_died_before_writing_is_taken_over_with_the_value_intact() {
    dead_holder(true, false);
    dead_holder(false, false);
}

#[test]
fn a_lock_whose_holder_died_mid_write_is_taken_over_and_the_value_reported_lost() {
    dead_holder(true, true);
    dead_holder(false, true);
}
