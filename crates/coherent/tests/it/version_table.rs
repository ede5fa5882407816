//! The version table's owner side and the proxies' one-batch check, at their
//! boundaries.

use tierstack_base::NodeId;
use tierstack_cluster::{local_cluster, Backend};
use tierstack_coherent::version_table::{
    fingerprint, Incarnation, VersionChecker, VersionTable, VersionTableError, SLOTS_MAX,
};

#[test]
fn fingerprints_are_fnv1a_with_the_low_bit_set() {
    // FNV-1a 64 test vectors; the low bit is forced on so 0 can mark a free slot.
    assert_eq!(fingerprint(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fingerprint("a"), 0xaf63_dc4c_8601_ec8c | 1);
    assert_eq!(fingerprint("foobar"), 0x8594_4171_f739_67e8 | 1);
}

#[test]
fn a_table_assigns_each_key_one_slot_and_counts_its_versions_from_one() {
    let cluster = local_cluster(Backend::Shm, 2).unwrap();
    let table = VersionTable::create(cluster.fabric(1).as_ref(), 3, Incarnation(3)).unwrap();
    assert_eq!(table.node(), NodeId(1));
    assert_eq!(table.incarnation(), Incarnation(3));
    assert_eq!(table.capacity(), 3);
    assert!(table.is_empty());
    assert_eq!((table.slot_of("a").unwrap(), table.slot_of("b").unwrap(), table.slot_of("a").unwrap()), (0, 1, 0));
    assert_eq!(table.len(), 2);
    assert!(!table.is_empty());
    assert_eq!(table.version(1).unwrap(), 1);
    assert_eq!(table.bump(1).unwrap(), 2);
    assert_eq!(table.bump(1).unwrap(), 3);
    assert_eq!((table.version(0).unwrap(), table.version(1).unwrap()), (1, 3), "a bump touches its own slot only");
    assert!(matches!(table.version(2), Err(VersionTableError::UnknownSlot(2))), "slot 2 is not assigned yet");
    assert!(matches!(table.bump(2), Err(VersionTableError::UnknownSlot(2))));
    assert_eq!(table.slot_of("c").unwrap(), 2);
    assert_eq!(table.version(2).unwrap(), 1);
    assert!(matches!(table.slot_of("d"), Err(VersionTableError::Full { capacity: 3 })));
    assert_eq!(table.len(), 3);
}

#[test]
fn an_incarnation_is_never_zero() {
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = VersionTable::create(cluster.fabric(0).as_ref(), 1, Incarnation(0)).unwrap();
    assert_eq!(table.incarnation(), Incarnation(1));
}

#[test]
fn capacity_must_be_between_one_and_the_most_slots() {
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let fabric = cluster.fabric(0);
    let bad = |capacity| VersionTable::create(fabric.as_ref(), capacity, Incarnation(1)).err().map(|e| e.to_string());
    assert!(bad(0).is_some_and(|e| e.contains("capacity 0")));
    assert!(bad(SLOTS_MAX + 1).is_some_and(|e| e.contains("capacity")));
    // The largest table (64 MiB of sparse shared memory) is allowed.
    let largest = VersionTable::create(fabric.as_ref(), SLOTS_MAX, Incarnation(1)).unwrap();
    assert_eq!(largest.capacity(), SLOTS_MAX);
}

#[test]
fn the_last_slot_validates_and_a_slot_past_the_end_never_does() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 2).unwrap();
        let table = VersionTable::create(cluster.fabric(0).as_ref(), 2, Incarnation(5)).unwrap();
        let a = table.slot_of("a").unwrap();
        // Slot 1 ends exactly where the region ends.
        let b = table.slot_of("b").unwrap();
        let header = table.header(&[("a".to_string(), a), ("b".to_string(), b)]).unwrap();
        let checker = VersionChecker::new(cluster.fabric(1).clone());
        assert!(checker.is_current_blocking(&header).unwrap(), "{}", backend.name());
        assert!(runtime.block_on(checker.is_current(&header)).unwrap(), "{}", backend.name());
        let mut past = header.clone();
        past.deps[1].slot = 2;
        assert!(!checker.is_current_blocking(&past).unwrap(), "{}", backend.name());
        assert!(!runtime.block_on(checker.is_current(&past)).unwrap(), "{}", backend.name());
        // Only the second key changes: the whole header stops validating.
        table.bump(b).unwrap();
        assert!(!checker.is_current_blocking(&header).unwrap(), "{}", backend.name());
        assert!(!runtime.block_on(checker.is_current(&header)).unwrap(), "{}", backend.name());
    }
}

/// The version table is read-only to every other node, on every backend: a
/// proxy (or anything posing as one) that writes a version, bumps it or
/// swaps it is `Forbidden`, and the versions stay as the owner set them.
#[test]
fn a_proxy_cannot_write_the_version_table_on_any_backend() {
    use tierstack_fabric::{FabricError, Rights};
    let mut backends = vec![Backend::Shm, Backend::Tcp];
    if tierstack_cluster::ucx_available() {
        backends.push(Backend::Ucx);
    }
    for backend in backends {
        let cluster = local_cluster(backend, 2).unwrap();
        let table = VersionTable::create(cluster.fabric(0).as_ref(), 4, Incarnation(1)).unwrap();
        let slot = table.slot_of("/page").unwrap();
        assert_eq!(table.bump(slot).unwrap(), 2);
        let proxy = cluster.fabric(1).connect(NodeId(0), tierstack_coherent::version_table::REGION_NAME).unwrap();
        let forbidden = |result: Result<u64, FabricError>| {
            assert!(
                matches!(result, Err(FabricError::Forbidden { granted: Rights::READ, .. })),
                "{backend:?}: a proxy modified the version table: {result:?}"
            )
        };
        let len = proxy.len();
        forbidden(proxy.write(0, &[0xff; 8]).map(|()| 0));
        forbidden(proxy.write(len - 8, &[0xff; 8]).map(|()| 0));
        forbidden(proxy.fetch_add(len - 8, 1));
        forbidden(proxy.compare_swap(0, 0, 1));
        assert_eq!(table.version(slot).unwrap(), 2, "{backend:?}");
        let mut word = [0u8; 8];
        proxy.read(0, &mut word).unwrap();
    }
}
