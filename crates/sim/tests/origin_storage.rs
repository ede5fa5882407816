//! The simulator's node storage against `tierstack origin`'s own `Storage`:
//! for any sequence of reads (random documents, sizes, arrival times, cache
//! sizes and object bounds), both decide the same hits and misses and the
//! same ready times, and count the same disk time.

use proptest::prelude::*;
use tierstack_model::DiskModel;
use tierstack_origin::{ReadOutcome, Storage, StorageConfig};
use tierstack_sim::store::NodeStore;
use tierstack_sim::Caching;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn the_simulators_storage_decides_as_the_origins(
        cache_bytes in prop_oneof![Just(0u64), 1u64..20_000],
        max_object in proptest::option::of(1u64..20_000),
        seek_ns in 0u64..5_000,
        reads in proptest::collection::vec((0usize..30, 0u64..3_000), 1..300),
        sizes in proptest::collection::vec(1u64..6_000, 30),
    ) {
        let disk = DiskModel::new(seek_ns, 1_000_000_000).unwrap();
        let mut origin = Storage::new(StorageConfig {
            cache_bytes,
            cache_max_object_bytes: max_object,
            disk: Some(disk),
        });
        let mut sim = NodeStore::new(cache_bytes, max_object, disk);
        let mut now = 0;
        for (doc, gap) in reads {
            now += gap;
            let bytes = sizes[doc];
            let expected = origin.read(now, &doc, bytes);
            let got = sim.read(now, doc, bytes, Caching::Normal);
            let expected_hit = matches!(expected, ReadOutcome::Hit { .. });
            prop_assert_eq!(got.hit, expected_hit, "doc {} at {}", doc, now);
            prop_assert_eq!(got.ready_ns, expected.ready_ns(), "doc {} at {}", doc, now);
        }
        prop_assert_eq!(sim.disk_busy_ns(), origin.counts().disk_busy_ns);
        prop_assert_eq!(sim.cache().bytes(), origin.counts().cache_bytes);
    }
}
