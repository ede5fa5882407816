//! The substrate's operations and every error path, on both backends, and
//! a model-based test of allocate/free/put/get against a map.

use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use tierstack_base::{ManualClock, NodeId};
use tierstack_cluster::Backend;
use tierstack_ddss::{Coherence, Ddss, DdssConfig, DdssError, Key, Placement};
use tierstack_testkit::ddss::{small_config, start, start_with_clock, BACKENDS};

fn with_generation(key: Key, generation: u32) -> Key {
    let mut bytes = key.to_bytes();
    bytes[8..12].copy_from_slice(&generation.to_be_bytes());
    Key::from_bytes(&bytes).unwrap()
}

fn with_offset(key: Key, offset: u32) -> Key {
    let mut bytes = key.to_bytes();
    bytes[4..8].copy_from_slice(&offset.to_be_bytes());
    Key::from_bytes(&bytes).unwrap()
}

#[test]
fn put_and_get_across_nodes_on_every_backend() {
    for backend in BACKENDS {
        let nodes = start(backend, 2, small_config(2));
        let (a, b) = (&nodes.ddss[0], &nodes.ddss[1]);
        for model in Coherence::examples() {
            let key = a.allocate(40, Placement::Node(NodeId(1)), model).unwrap();
            assert_eq!(key.home(), NodeId(1));
            assert_eq!(key.capacity_bytes(), 64);
            assert_eq!(key.coherence(), model);
            assert_eq!(b.get(key).unwrap(), (0, vec![]), "{backend:?} {model}: a fresh key is empty at version 0");
            assert_eq!(a.put(key, b"first").unwrap(), 1);
            assert_eq!(b.put(key, &[7u8; 64]).unwrap(), 2, "a value may fill its slot");
            assert_eq!(b.get(key).unwrap(), (2, vec![7u8; 64]), "{backend:?} {model}: the writer reads its write");
            // a's copy (from its own put) is version 1: what may a serve now?
            let (version, bytes) = a.get(key).unwrap();
            match model {
                Coherence::Null => assert_eq!(version, 1, "null keeps the copy"),
                Coherence::Temporal { .. } | Coherence::Delta { .. } => assert!(version >= 1),
                _ => assert_eq!(version, 2, "{model} returns the latest completed put"),
            }
            assert_eq!(bytes, if version == 1 { b"first".to_vec() } else { vec![7u8; 64] });
            assert_eq!(a.put(key, b"").unwrap(), 3, "empty values are values");
            assert_eq!(a.get(key).unwrap(), (3, vec![]));
            a.free(key).unwrap();
            assert!(matches!(b.put(key, b"x"), Err(DdssError::KeyFreed { .. })), "{backend:?} {model}");
            assert!(matches!(a.free(key), Err(DdssError::KeyFreed { .. })));
        }
        let stats = a.stats();
        assert_eq!(stats.allocations, 6);
        assert_eq!(stats.frees, 6);
    }
}

#[test]
fn local_and_automatic_placement() {
    let nodes = start(Backend::Shm, 3, small_config(3));
    let local = nodes.ddss[2].allocate(8, Placement::Local, Coherence::Read).unwrap();
    assert_eq!(local.home(), NodeId(2));
    // Automatic placement prefers the members with the most free slots of
    // the class: 16 slots of 8 B on each of 3 nodes = 48 in all.
    let mut per_node = HashMap::new();
    let mut keys = vec![local];
    for _ in 0..47 {
        let key = nodes.ddss[0].allocate(1, Placement::Auto, Coherence::Null).unwrap();
        *per_node.entry(key.home()).or_insert(0) += 1;
        keys.push(key);
    }
    assert_eq!(per_node.len(), 3, "every member received allocations: {per_node:?}");
    assert!(matches!(
        nodes.ddss[0].allocate(1, Placement::Auto, Coherence::Null),
        Err(DdssError::RegionFull { class_bytes: 8, .. })
    ));
    for node in 0..3 {
        let usage = nodes.ddss[1].usage(NodeId(node)).unwrap();
        assert_eq!(usage[0], (8, 16, 16), "node {node}: the used counter matches");
    }
    nodes.ddss[1].free(keys[5]).unwrap();
    let again = nodes.ddss[0].allocate(1, Placement::Auto, Coherence::Null).unwrap();
    assert_eq!((again.home(), again.offset()), (keys[5].home(), keys[5].offset()), "the only free slot is reused");
    assert_ne!(again.generation(), keys[5].generation());
}

#[test]
fn allocation_errors() {
    for backend in BACKENDS {
        let nodes = start(backend, 2, small_config(2));
        let d = &nodes.ddss[0];
        for _ in 0..2 {
            d.allocate(64 * 1024, Placement::Local, Coherence::Write).unwrap();
        }
        assert_eq!(
            d.allocate(40_000, Placement::Local, Coherence::Write),
            Err(DdssError::RegionFull { node: NodeId(0), class_bytes: 64 * 1024 })
        );
        // No 2 KiB slots: the next class with slots (64 KiB) serves, until full.
        for _ in 0..2 {
            let key = d.allocate(2048, Placement::Node(NodeId(1)), Coherence::Null).unwrap();
            assert_eq!(key.capacity_bytes(), 64 * 1024);
        }
        assert_eq!(
            d.allocate(2048, Placement::Node(NodeId(1)), Coherence::Null),
            Err(DdssError::RegionFull { node: NodeId(1), class_bytes: 64 * 1024 })
        );
        assert!(matches!(
            d.allocate(1 << 21, Placement::Local, Coherence::Null),
            Err(DdssError::AllocationTooLarge { bytes: 2097152, .. })
        ));
        assert_eq!(
            d.allocate(8, Placement::Node(NodeId(9)), Coherence::Null),
            Err(DdssError::NotMember { node: NodeId(9) })
        );
    }
}

#[test]
fn members_without_a_substrate_and_attached_handles() {
    let cluster = tierstack_cluster::local_cluster(Backend::Shm, 3).unwrap();
    let config = small_config(3);
    let started = Ddss::start(cluster.fabric(0).clone(), config.clone()).unwrap();
    assert!(matches!(
        started.allocate(8, Placement::Node(NodeId(2)), Coherence::Null),
        Err(DdssError::NotStarted { node: NodeId(2) })
    ));
    // Auto placement routes around the member that has no substrate.
    for _ in 0..4 {
        assert_eq!(started.allocate(8, Placement::Auto, Coherence::Null).unwrap().home(), NodeId(0));
    }
    let attached = Ddss::attach(cluster.fabric(1).clone(), config.clone()).unwrap();
    assert!(!attached.has_region());
    assert_eq!(attached.allocate(8, Placement::Local, Coherence::Null), Err(DdssError::NoLocalRegion));
    let key = attached.allocate(8, Placement::Node(NodeId(0)), Coherence::Read).unwrap();
    assert_eq!(attached.put(key, b"from-1").unwrap(), 1);
    assert_eq!(started.get(key).unwrap(), (1, b"from-1".to_vec()));
    assert!(matches!(
        Ddss::start(cluster.fabric(0).clone(), config),
        Err(DdssError::Fabric(tierstack_fabric::FabricError::RegionExists { .. }))
    ));
}

#[test]
fn value_and_key_errors() {
    for backend in BACKENDS {
        let nodes = start(backend, 2, small_config(2));
        let (a, b) = (&nodes.ddss[0], &nodes.ddss[1]);
        let key = a.allocate(8, Placement::Node(NodeId(1)), Coherence::Strict).unwrap();
        assert_eq!(a.put(key, &[0; 9]), Err(DdssError::ValueTooLarge { len: 9, capacity: 8 }));
        let misplaced = with_offset(key, key.offset() + 8);
        assert!(matches!(a.get(misplaced), Err(DdssError::UnknownKey { .. })));
        assert!(matches!(a.put(misplaced, b"x"), Err(DdssError::UnknownKey { .. })));
        assert!(matches!(a.free(misplaced), Err(DdssError::UnknownKey { .. })));
        let future = with_generation(key, key.generation() + 5);
        assert!(matches!(b.get(future), Err(DdssError::UnknownKey { .. })), "{backend:?}");
        assert!(matches!(b.put(future, b"x"), Err(DdssError::UnknownKey { .. })));
        let on_missing_node = Key::from_bytes(&{
            let mut bytes = key.to_bytes();
            bytes[0..4].copy_from_slice(&7u32.to_be_bytes());
            bytes
        })
        .unwrap();
        assert!(a.get(on_missing_node).is_err(), "a key whose home is not running fails");
        a.free(key).unwrap();
        assert!(matches!(b.get(key), Err(DdssError::KeyFreed { .. })));
    }
}

/// No ABA: a slot freed and allocated again never lets the old key reach the new value.
#[test]
fn reused_slots_get_new_generations() {
    for backend in BACKENDS {
        let config = DdssConfig::empty().with_slots(8, 1).with_members(vec![NodeId(0), NodeId(1)]);
        let nodes = start(backend, 2, config);
        let (a, b) = (&nodes.ddss[0], &nodes.ddss[1]);
        for model in [Coherence::Read, Coherence::Delta { versions: 5 }, Coherence::Write, Coherence::Strict] {
            let old = a.allocate(8, Placement::Node(NodeId(1)), model).unwrap();
            a.put(old, b"old").unwrap();
            assert_eq!(b.get(old).unwrap(), (1, b"old".to_vec()));
            a.free(old).unwrap();
            let new = b.allocate(8, Placement::Local, model).unwrap();
            assert_eq!(new.offset(), old.offset(), "the one slot is reused");
            assert_eq!(new.generation(), old.generation() + 1);
            assert_eq!(b.get(new).unwrap(), (0, vec![]), "the new allocation starts empty at version 0");
            b.put(new, b"new").unwrap();
            assert!(matches!(b.get(old), Err(DdssError::KeyFreed { .. })), "{backend:?} {model}: stale get");
            assert!(matches!(a.put(old, b"evil"), Err(DdssError::KeyFreed { .. })), "stale put");
            assert!(matches!(a.free(old), Err(DdssError::KeyFreed { .. })), "stale free");
            assert_eq!(a.get(new).unwrap(), (1, b"new".to_vec()));
            b.free(new).unwrap();
        }
    }
}

/// Under null coherence a node may serve its local copy of a key freed
/// elsewhere (documented); under temporal(T) it notices once T has passed.
#[test]
fn local_copies_and_remote_frees() {
    let clock = Arc::new(ManualClock::new(1_000));
    let nodes = start_with_clock(Backend::Shm, 2, small_config(2), clock.clone());
    let (a, b) = (&nodes.ddss[0], &nodes.ddss[1]);
    let null = a.allocate(8, Placement::Node(NodeId(0)), Coherence::Null).unwrap();
    let temporal = a.allocate(8, Placement::Node(NodeId(0)), Coherence::Temporal { max_age_ms: 5 }).unwrap();
    for key in [null, temporal] {
        a.put(key, b"v1").unwrap();
        assert_eq!(b.get(key).unwrap(), (1, b"v1".to_vec()));
        a.free(key).unwrap();
        assert_eq!(b.get(key).unwrap(), (1, b"v1".to_vec()), "{}: served from the copy", key.coherence());
    }
    clock.advance_ns(5_000_001);
    assert_eq!(b.get(null).unwrap(), (1, b"v1".to_vec()), "null: forever");
    assert!(matches!(b.get(temporal), Err(DdssError::KeyFreed { .. })), "temporal: detected after T");
    assert!(matches!(a.get(null), Err(DdssError::KeyFreed { .. })), "the freeing node dropped its copy");
}

#[test]
fn lock_contention_and_corruption_are_typed_errors() {
    for backend in BACKENDS {
        let mut config = small_config(2);
        config.lock_attempts_max = 50;
        let nodes = start(backend, 2, config.clone());
        let (a, b) = (&nodes.ddss[0], &nodes.ddss[1]);
        let key = a.allocate(8, Placement::Node(NodeId(1)), Coherence::Strict).unwrap();
        // Another party holds the key's lock word (a stranded holder).
        let raw = nodes.cluster.fabric(0).connect(NodeId(1), "ddss").unwrap();
        let control = u64::from(key.offset());
        let unlocked = raw.read_u64(control).unwrap();
        assert_eq!(raw.compare_swap(control, unlocked, unlocked | 0x1234).unwrap(), unlocked);
        assert!(matches!(a.put(key, b"x"), Err(DdssError::LockBusy { attempts: 50, .. })), "{backend:?}");
        assert!(matches!(b.get(key), Err(DdssError::LockBusy { .. })), "strict gets take the lock too");
        assert!(matches!(a.free(key), Err(DdssError::LockBusy { .. })));
        assert!(a.stats().lock_retries >= 100);
        raw.compare_swap(control, unlocked | 0x1234, unlocked).unwrap();
        assert_eq!(a.put(key, b"x").unwrap(), 1, "works again once released");

        // Allocation that loses every race reports contention.
        let impatient =
            Ddss::attach(nodes.cluster.fabric(0).clone(), DdssConfig { alloc_attempts_max: 0, ..config.clone() })
                .unwrap();
        assert!(matches!(
            impatient.allocate(8, Placement::Node(NodeId(1)), Coherence::Null),
            Err(DdssError::Contended { node: NodeId(1), attempts: 0 })
        ));

        // A bitmap that disagrees with a live slot is not trusted: the slot's
        // control word is the claim, so the live slot is never handed out again.
        let layout = a.layout(NodeId(1)).unwrap();
        assert_eq!(layout.slots(0), 16);
        let bitmap_offset = tierstack_ddss::layout::HEADER_BYTES;
        raw.write(bitmap_offset, &0u64.to_ne_bytes()).unwrap();
        let mut full = 0;
        for _ in 0..16 {
            match a.allocate(8, Placement::Node(NodeId(1)), Coherence::Null) {
                Err(DdssError::RegionFull { node: NodeId(1), .. }) => full += 1,
                Ok(other) => assert_ne!(other.offset(), key.offset(), "{backend:?}: the live slot was handed out"),
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert_eq!(full, 1, "exactly the live slot is refused");
    }
}

/// A home that goes away makes operations fail with a fabric error within
/// the operation timeout; nothing hangs.
#[test]
fn a_dead_home_is_an_error_not_a_hang() {
    use std::time::Duration;
    use tierstack_fabric_tcp::{TcpConfig, TcpFabric};
    let loopback = "127.0.0.1:0".parse().unwrap();
    let open =
        |id| TcpFabric::open(TcpConfig::new(NodeId(id), loopback).with_op_timeout(Duration::from_millis(300))).unwrap();
    let (f0, f1) = (open(0), open(1));
    f0.add_peer(NodeId(1), f1.local_addr());
    f1.add_peer(NodeId(0), f0.local_addr());
    let config = small_config(2);
    let a = Ddss::start(f0.clone(), config.clone()).unwrap();
    let b = Ddss::start(f1.clone(), config).unwrap();
    let key = a.allocate(8, Placement::Node(NodeId(1)), Coherence::Write).unwrap();
    a.put(key, b"x").unwrap();
    f1.shutdown();
    drop(b);
    for result in [a.get(key).map(|_| ()), a.put(key, b"y").map(|_| ()), a.free(key)] {
        match result {
            Err(DdssError::Fabric(e)) => assert!(e.is_unreachable(), "{e}"),
            other => panic!("expected an unreachable home, got {other:?}"),
        }
    }
    let fresh = Ddss::attach(f0.clone(), small_config(2)).unwrap();
    assert!(matches!(fresh.get(key), Err(DdssError::Fabric(_))));
}

#[derive(Clone, Debug)]
enum Step {
    Allocate { size: u16, model: usize },
    Free { pick: usize },
    Put { pick: usize, len: u16, fill: u8 },
    Get { pick: usize },
    Stale { pick: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u16..1100, 0usize..6).prop_map(|(size, model)| Step::Allocate { size, model }),
        2 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        4 => (any::<usize>(), 0u16..1100, any::<u8>()).prop_map(|(pick, len, fill)| Step::Put { pick, len, fill }),
        4 => any::<usize>().prop_map(|pick| Step::Get { pick }),
        1 => any::<usize>().prop_map(|pick| Step::Stale { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// One handle against a map model, checked after every step: allocation
    /// succeeds iff the class has room, keys are never reused, versions
    /// count puts, values are returned exactly, freed keys are refused.
    #[test]
    fn substrate_matches_a_map_model(steps in proptest::collection::vec(step(), 1..80)) {
        let nodes = start(Backend::Shm, 1, small_config(1));
        let d = &nodes.ddss[0];
        let capacity: HashMap<u32, usize> = [(8, 16), (64, 8), (1024, 4), (65536, 2)].into_iter().collect();
        let mut live: Vec<(Key, u64, Vec<u8>)> = Vec::new();
        let mut freed: Vec<Key> = Vec::new();
        for step in steps {
            match step {
                Step::Allocate { size, model } => {
                    let class_bytes = [8u32, 64, 1024, 65536].into_iter().find(|c| u32::from(size) <= *c);
                    let result = d.allocate(u64::from(size), Placement::Local, Coherence::examples()[model]);
                    match class_bytes {
                        None => unreachable!("sizes stay below 64 KiB"),
                        Some(c) => {
                            let used = live.iter().filter(|(k, _, _)| k.capacity_bytes() == c).count();
                            if used < capacity[&c] {
                                let key = result.unwrap();
                                prop_assert_eq!(key.capacity_bytes(), c);
                                prop_assert!(!live.iter().any(|(k, _, _)| *k == key) && !freed.contains(&key), "key reused");
                                live.push((key, 0, vec![]));
                            } else {
                                prop_assert_eq!(result, Err(DdssError::RegionFull { node: NodeId(0), class_bytes: c }));
                            }
                        }
                    }
                }
                Step::Free { pick } if !live.is_empty() => {
                    let (key, _, _) = live.remove(pick % live.len());
                    d.free(key).unwrap();
                    freed.push(key);
                }
                Step::Put { pick, len, fill } if !live.is_empty() => {
                    let i = pick % live.len();
                    let value = vec![fill; usize::from(len)];
                    let result = d.put(live[i].0, &value);
                    if value.len() > live[i].0.capacity_bytes() as usize {
                        prop_assert!(matches!(result, Err(DdssError::ValueTooLarge { .. })), "value too large");
                    } else {
                        live[i].1 += 1;
                        prop_assert_eq!(result.unwrap(), live[i].1);
                        live[i].2 = value;
                    }
                }
                Step::Get { pick } if !live.is_empty() => {
                    let (key, version, value) = &live[pick % live.len()];
                    prop_assert_eq!(d.get(*key).unwrap(), (*version, value.clone()));
                }
                Step::Stale { pick } if !freed.is_empty() => {
                    let key = freed[pick % freed.len()];
                    prop_assert!(matches!(d.get(key), Err(DdssError::KeyFreed { .. })), "stale get");
                    prop_assert!(matches!(d.put(key, b""), Err(DdssError::KeyFreed { .. })), "stale put");
                    prop_assert!(matches!(d.free(key), Err(DdssError::KeyFreed { .. })), "stale free");
                }
                _ => {}
            }
        }
        let usage = d.usage(NodeId(0)).unwrap();
        for (class_bytes, _, used) in usage {
            let model_used = live.iter().filter(|(k, _, _)| k.capacity_bytes() == class_bytes).count() as u64;
            prop_assert_eq!(used, model_used, "used counter of class {}", class_bytes);
        }
    }
}
