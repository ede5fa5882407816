//! The conformance suite of transfers that name local registered memory
//! (`Op::WriteFrom`, `Op::ReadInto`), written once against the `Fabric`
//! trait and run by every backend's tests (each backend's
//! `tests/it/transfers.rs`), so all backends are held to the same
//! observable behaviour.
//!
//! Each function takes an `owner` (registers the remote region) and a `peer`
//! (registers its local regions, connects, and operates), and uses region
//! names of its own.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::sync::Arc;
use tierstack_fabric::{
    Fabric, FabricError, LocalRegion, LocalSlice, Op, OpResult, RegionBytes, RegionMemory, RemoteRegion,
};

const REMOTE_BYTES: u64 = 1024;
const LOCAL_BYTES: u64 = 512;
/// Cases of the round-trip property per backend.
const ROUND_TRIP_CASES: u32 = 48;

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

pub fn contents(memory: &RegionMemory) -> Vec<u8> {
    let mut all = vec![0u8; memory.len() as usize];
    memory.read(0, &mut all).unwrap();
    all
}

fn remote_contents(remote: &dyn RemoteRegion) -> Vec<u8> {
    let mut all = vec![0u8; remote.len() as usize];
    remote.read(0, &mut all).unwrap();
    all
}

/// The owner's region `name` of `bytes` bytes, filled with `seed`'s pattern,
/// and the peer's handle to it.
fn remote_region(
    owner: &dyn Fabric,
    peer: &dyn Fabric,
    name: &str,
    bytes: u64,
    seed: u8,
) -> (Arc<LocalRegion>, Arc<dyn RemoteRegion>) {
    let at_owner = owner.register(name, bytes, tierstack_fabric::Access::all()).unwrap();
    at_owner.memory().write(0, &pattern(bytes as usize, seed)).unwrap();
    let remote = peer.connect(owner.local_node(), name).unwrap();
    (at_owner, remote)
}

#[derive(Clone, Debug)]
enum Step {
    WriteFrom { remote: u64, local: u64, len: u32 },
    ReadInto { remote: u64, local: u64, len: u32 },
    Write { remote: u64, data: Vec<u8> },
    Store { local: u64, data: Vec<u8> },
}

fn step() -> impl Strategy<Value = Step> {
    // Local offsets keep the remote offset's phase (the alignment rule);
    // lengths run past either end now and then (a bounds error).
    let transfer = (0u64..REMOTE_BYTES, 0u64..LOCAL_BYTES / 8, prop_oneof![0u32..64, 0u32..600])
        .prop_map(|(remote, local_word, len)| (remote, local_word * 8 + remote % 8, len));
    prop_oneof![
        3 => transfer.clone().prop_map(|(remote, local, len)| Step::WriteFrom { remote, local, len }),
        3 => transfer.prop_map(|(remote, local, len)| Step::ReadInto { remote, local, len }),
        1 => (0u64..REMOTE_BYTES, proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(remote, data)| Step::Write { remote, data }),
        1 => (0u64..LOCAL_BYTES, proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(local, data)| Step::Store { local, data }),
    ]
}

fn fits(offset: u64, len: usize, region: u64) -> bool {
    offset + len as u64 <= region
}

/// The expected error of a transfer that does not fit: the remote range is
/// checked first, as `check_batch` does.
fn misfit(remote: u64, local: u64, len: u32, local_name: &str) -> FabricError {
    if !fits(remote, len as usize, REMOTE_BYTES) {
        FabricError::OutOfBounds {
            region: "xfer.prop".into(),
            offset: remote,
            len: len.into(),
            region_len: REMOTE_BYTES,
        }
    } else {
        FabricError::LocalOutOfBounds {
            region: local_name.into(),
            offset: local,
            len: len.into(),
            region_len: LOCAL_BYTES,
        }
    }
}

/// `WriteFrom` and `ReadInto` at any offsets and lengths move exactly the
/// bytes that a plain `Read` of the source and `Write` of the destination
/// would, as seen by plain reads of the remote region, by its owner, and in
/// the local region; a transfer that does not fit fails with the exact
/// bounds error and changes nothing.
pub fn round_trips_match_plain_reads_and_writes(owner: &dyn Fabric, peer: &dyn Fabric) {
    let (at_owner, remote) = remote_region(owner, peer, "xfer.prop", REMOTE_BYTES, 0);
    let local = peer.register("xfer.prop.local", LOCAL_BYTES, tierstack_fabric::Access::all()).unwrap();
    let mut runner =
        TestRunner::new(Config { cases: ROUND_TRIP_CASES, failure_persistence: None, ..Config::default() });
    runner
        .run(&proptest::collection::vec(step(), 1..16), |steps| {
            let mut remote_model = pattern(REMOTE_BYTES as usize, 1);
            let mut local_model = pattern(LOCAL_BYTES as usize, 2);
            remote.write(0, &remote_model).unwrap();
            local.memory().write(0, &local_model).unwrap();
            for step in steps {
                match step {
                    Step::WriteFrom { remote: at, local: from, len } => {
                        let source = LocalSlice::new(local.clone(), from, len);
                        let result = remote.post(vec![Op::WriteFrom { offset: at, source }]).wait();
                        if fits(at, len as usize, REMOTE_BYTES) && fits(from, len as usize, LOCAL_BYTES) {
                            prop_assert_eq!(result, Ok(vec![OpResult::WrittenFrom]));
                            let (at, from, len) = (at as usize, from as usize, len as usize);
                            let bytes = local_model[from..from + len].to_vec();
                            remote_model[at..at + len].copy_from_slice(&bytes);
                        } else {
                            prop_assert_eq!(result, Err(misfit(at, from, len, "xfer.prop.local")));
                        }
                    }
                    Step::ReadInto { remote: at, local: into, len } => {
                        let target = LocalSlice::new(local.clone(), into, len);
                        let result = remote.post(vec![Op::ReadInto { offset: at, target }]).wait();
                        if fits(at, len as usize, REMOTE_BYTES) && fits(into, len as usize, LOCAL_BYTES) {
                            prop_assert_eq!(result, Ok(vec![OpResult::ReadInto]));
                            let (at, into, len) = (at as usize, into as usize, len as usize);
                            let bytes = remote_model[at..at + len].to_vec();
                            local_model[into..into + len].copy_from_slice(&bytes);
                        } else {
                            prop_assert_eq!(result, Err(misfit(at, into, len, "xfer.prop.local")));
                        }
                    }
                    Step::Write { remote: at, data } => {
                        if fits(at, data.len(), REMOTE_BYTES) {
                            remote.write(at, &data).unwrap();
                            let at = at as usize;
                            remote_model[at..at + data.len()].copy_from_slice(&data);
                        }
                    }
                    Step::Store { local: at, data } => {
                        if fits(at, data.len(), LOCAL_BYTES) {
                            local.memory().write(at, &data).unwrap();
                            let at = at as usize;
                            local_model[at..at + data.len()].copy_from_slice(&data);
                        }
                    }
                }
                prop_assert_eq!(&remote_contents(remote.as_ref()), &remote_model, "plain reads of the remote");
                prop_assert_eq!(&contents(at_owner.memory()), &remote_model, "the owner's memory");
                prop_assert_eq!(&contents(local.memory()), &local_model, "the local region");
            }
            Ok(())
        })
        .unwrap();
}

/// Transfers larger than a socket read buffer and than a kept frame buffer
/// (`tcp`), in both directions, with the helpers `write_from`/`read_into`.
pub fn large_transfers_round_trip(owner: &dyn Fabric, peer: &dyn Fabric) {
    const BIG: u64 = 3 << 20;
    let (at_owner, remote) = remote_region(owner, peer, "xfer.big", BIG, 0);
    let local = peer.register("xfer.big.local", BIG, tierstack_fabric::Access::all()).unwrap();
    for (len, seed) in [(64u64 << 10, 11u8), (BIG - 8, 12), (100, 13), (BIG, 14)] {
        let bytes = pattern(len as usize, seed);
        local.memory().write(0, &bytes).unwrap();
        let slice = LocalSlice::new(local.clone(), 0, len as u32);
        remote.write_from(0, &slice).unwrap();
        let mut seen = vec![0u8; len as usize];
        at_owner.memory().read(0, &mut seen).unwrap();
        assert_eq!(seen, bytes, "a {len}-byte WriteFrom reached the owner");

        let back = pattern(len as usize, seed.wrapping_add(100));
        at_owner.memory().write(0, &back).unwrap();
        remote.read_into(0, &slice).unwrap();
        local.memory().read(0, &mut seen).unwrap();
        assert_eq!(seen, back, "a {len}-byte ReadInto landed in the local region");
    }
}

/// Bounds: a local slice outside its region and a remote range outside the
/// remote region are refused with their own typed errors, and nothing of
/// the batch executes; the handle keeps working.
pub fn bounds_errors_are_typed_and_execute_nothing(owner: &dyn Fabric, peer: &dyn Fabric) {
    let (at_owner, remote) = remote_region(owner, peer, "xfer.bounds", 64, 3);
    let local = peer.register("xfer.bounds.local", 32, tierstack_fabric::Access::all()).unwrap();
    local.memory().write(0, &pattern(32, 4)).unwrap();
    let slice = |offset, len| LocalSlice::new(local.clone(), offset, len);
    let cases = [
        (
            Op::WriteFrom { offset: 0, source: slice(24, 16) },
            FabricError::LocalOutOfBounds { region: "xfer.bounds.local".into(), offset: 24, len: 16, region_len: 32 },
        ),
        (
            Op::ReadInto { offset: 8, target: slice(32, 8) },
            FabricError::LocalOutOfBounds { region: "xfer.bounds.local".into(), offset: 32, len: 8, region_len: 32 },
        ),
        (
            Op::ReadInto { offset: 8, target: slice(u64::MAX - 7, 16) },
            FabricError::LocalOutOfBounds {
                region: "xfer.bounds.local".into(),
                offset: u64::MAX - 7,
                len: 16,
                region_len: 32,
            },
        ),
        (
            Op::WriteFrom { offset: 56, source: slice(0, 16) },
            FabricError::OutOfBounds { region: "xfer.bounds".into(), offset: 56, len: 16, region_len: 64 },
        ),
        (
            Op::ReadInto { offset: 64, target: slice(0, 1) },
            FabricError::OutOfBounds { region: "xfer.bounds".into(), offset: 64, len: 1, region_len: 64 },
        ),
    ];
    for (bad, expected) in cases {
        let batch = vec![
            Op::WriteFrom { offset: 0, source: slice(0, 8) },
            Op::ReadInto { offset: 8, target: slice(8, 8) },
            Op::FetchAdd { offset: 16, delta: 1 },
            bad.clone(),
        ];
        assert_eq!(remote.post(batch).wait(), Err(expected.clone()));
        // The single-op helpers (which a backend may implement without a batch) check the same.
        let single = match &bad {
            Op::WriteFrom { offset, source } => remote.write_from(*offset, source),
            Op::ReadInto { offset, target } => remote.read_into(*offset, target),
            other => unreachable!("{other:?}"),
        };
        assert_eq!(single, Err(expected));
        assert_eq!(contents(at_owner.memory()), pattern(64, 3), "the remote region is untouched");
        assert_eq!(contents(local.memory()), pattern(32, 4), "the local region is untouched");
    }
    remote.read_into(0, &slice(0, 32)).unwrap();
    assert_eq!(contents(local.memory()), pattern(64, 3)[..32], "the handle still works");
}

/// Alignment: the local and remote offsets of a transfer must be equal
/// modulo 8 (`LocalMisaligned`, nothing executes); equal phases work at any
/// offset and length, unaligned edges included.
pub fn alignment_follows_the_same_phase_rule(owner: &dyn Fabric, peer: &dyn Fabric) {
    let (at_owner, remote) = remote_region(owner, peer, "xfer.align", 128, 5);
    let local = peer.register("xfer.align.local", 64, tierstack_fabric::Access::all()).unwrap();
    local.memory().write(0, &pattern(64, 6)).unwrap();
    let slice = |offset, len| LocalSlice::new(local.clone(), offset, len);
    for (remote_offset, local_offset) in [(0, 4), (3, 0), (13, 6), (8, 1)] {
        let expected = FabricError::LocalMisaligned { local_offset, remote_offset };
        let batch = |op| vec![Op::Write { offset: 64, data: vec![0xee; 8] }, op];
        let write = Op::WriteFrom { offset: remote_offset, source: slice(local_offset, 8) };
        assert_eq!(remote.post(batch(write)).wait(), Err(expected.clone()));
        let read = Op::ReadInto { offset: remote_offset, target: slice(local_offset, 8) };
        assert_eq!(remote.post(batch(read)).wait(), Err(expected.clone()));
        assert_eq!(remote.write_from(remote_offset, &slice(local_offset, 8)), Err(expected.clone()));
        assert_eq!(remote.read_into(remote_offset, &slice(local_offset, 8)), Err(expected));
    }
    assert_eq!(contents(at_owner.memory()), pattern(128, 5), "no refused batch executed");
    assert_eq!(contents(local.memory()), pattern(64, 6));

    // Same phase, unaligned start and end: 3 + 8k and 11 + 8k.
    remote.write_from(3, &slice(11, 21)).unwrap();
    let mut seen = vec![0u8; 21];
    at_owner.memory().read(3, &mut seen).unwrap();
    assert_eq!(seen, pattern(64, 6)[11..32]);
    remote.read_into(101, &slice(45, 19)).unwrap();
    local.memory().read(45, &mut seen[..19]).unwrap();
    assert_eq!(seen[..19], pattern(128, 5)[101..120]);
}

/// A batch mixing every kind of op executes in order, each result in its
/// op's position, each transfer seeing the effects of the ops before it.
pub fn a_batch_mixes_old_and_new_ops(owner: &dyn Fabric, peer: &dyn Fabric) {
    let (at_owner, remote) = remote_region(owner, peer, "xfer.mixed", 64, 7);
    let local = peer.register("xfer.mixed.local", 64, tierstack_fabric::Access::all()).unwrap();
    local.memory().write(0, &pattern(64, 8)).unwrap();
    let slice = |offset, len| LocalSlice::new(local.clone(), offset, len);
    let results = remote
        .post(vec![
            Op::Write { offset: 0, data: 5u64.to_ne_bytes().to_vec() },
            Op::WriteFrom { offset: 8, source: slice(40, 16) },
            Op::FetchAdd { offset: 0, delta: 2 },
            Op::ReadInto { offset: 0, target: slice(0, 24) },
            Op::Read { offset: 8, len: 4 },
            Op::CompareSwap { offset: 0, expected: 7, new: 9 },
            Op::ReadInto { offset: 0, target: slice(32, 8) },
        ])
        .wait()
        .unwrap();
    assert_eq!(
        results,
        vec![
            OpResult::Written,
            OpResult::WrittenFrom,
            OpResult::FetchAdd(5),
            OpResult::ReadInto,
            OpResult::Read(pattern(64, 8)[40..44].to_vec()),
            OpResult::CompareSwap(7),
            OpResult::ReadInto,
        ]
    );
    let mut expected_local = pattern(64, 8);
    expected_local[..8].copy_from_slice(&7u64.to_ne_bytes());
    expected_local[8..24].copy_from_slice(&pattern(64, 8)[40..56]);
    expected_local[32..40].copy_from_slice(&9u64.to_ne_bytes());
    assert_eq!(contents(local.memory()), expected_local);
    assert_eq!(at_owner.memory().load_u64(0).unwrap(), 9);
}

/// The view's contract on a backend: bytes that arrived by a `ReadInto`
/// (into the peer's slot) or by a peer's `WriteFrom` (into the owner's
/// region), once their completion was waited on, are what a `RegionBytes`
/// made afterwards shows.
pub fn a_view_sees_the_bytes_that_arrived_before_it(owner: &dyn Fabric, peer: &dyn Fabric) {
    let (at_owner, remote) = remote_region(owner, peer, "xfer.view", 4096, 9);
    let pool = peer.register("xfer.view.pool", 4096, tierstack_fabric::Access::all()).unwrap();
    let slot = LocalSlice::new(pool.clone(), 1024, 3000);
    remote.read_into(96, &slot).unwrap();
    // SAFETY: nothing writes the slot until the view is dropped.
    let view = unsafe { RegionBytes::new(slot) }.unwrap();
    assert_eq!(view.as_slice(), &pattern(4096, 9)[96..3096]);
    drop(view);

    pool.memory().write(0, &pattern(512, 10)).unwrap();
    remote.write_from(2048, &LocalSlice::new(pool, 0, 512)).unwrap();
    // SAFETY: nothing writes the owner's range until the view is dropped.
    let view = unsafe { RegionBytes::new(LocalSlice::new(at_owner, 2048, 512)) }.unwrap();
    assert_eq!(view.as_slice(), &pattern(512, 10)[..]);
}

/// Registers what `read_into_a_dead_peer_fails_and_writes_nothing` needs
/// before the owner dies: the owner's region, the peer's handle and its
/// local region (filled with a known pattern).
pub fn before_the_owner_dies(owner: &dyn Fabric, peer: &dyn Fabric) -> (Arc<dyn RemoteRegion>, Arc<LocalRegion>) {
    let (_at_owner, remote) = remote_region(owner, peer, "xfer.dead", 64, 11);
    let local = peer.register("xfer.dead.local", 64, tierstack_fabric::Access::all()).unwrap();
    local.memory().write(0, &pattern(64, 12)).unwrap();
    remote.read_into(0, &LocalSlice::new(local.clone(), 0, 8)).unwrap();
    local.memory().write(0, &pattern(64, 12)).unwrap();
    (remote, local)
}

/// After the owner died: `ReadInto` and `WriteFrom` fail with `PeerDead`,
/// and the local region is untouched.
pub fn read_into_a_dead_peer_fails_and_writes_nothing(remote: &dyn RemoteRegion, local: &Arc<LocalRegion>) {
    let owner = remote.node();
    for _ in 0..3 {
        let err = remote.read_into(0, &LocalSlice::new(local.clone(), 0, 64)).unwrap_err();
        assert!(matches!(&err, FabricError::PeerDead { node, .. } if *node == owner), "{err:?}");
        let err = remote.write_from(0, &LocalSlice::new(local.clone(), 0, 64)).unwrap_err();
        assert!(matches!(&err, FabricError::PeerDead { node, .. } if *node == owner), "{err:?}");
    }
    assert_eq!(contents(local.memory()), pattern(64, 12), "nothing landed in the local region");
}

/// `read_words_now`, where a backend offers it (`Some`), reads exactly the
/// words a batch of 8-byte `Read`s would, and fails at the first offset that
/// is not 8-byte aligned (`Misaligned`) or past the end (the batch's
/// `OutOfBounds`); offsets and words of different lengths are a
/// `BatchSize` error. A backend that returns `None` (reads go through
/// batches only) passes trivially.
pub fn words_read_at_once_match_a_batch_of_reads(owner: &dyn Fabric, peer: &dyn Fabric) {
    let (_at_owner, remote) = remote_region(owner, peer, "xfer.words", 256, 11);
    let offsets = proptest::collection::vec(prop_oneof![4 => (0u64..32).prop_map(|w| w * 8), 1 => 0u64..300], 0..12);
    let mut runner = TestRunner::new(Config { cases: 64, ..Config::default() });
    runner
        .run(&offsets, |offsets| {
            let mut words = vec![0u64; offsets.len()];
            let Some(now) = remote.read_words_now(&offsets, &mut words) else { return Ok(()) };
            if offsets.is_empty() {
                // No words: nothing read, nothing wrong (a batch must not be empty).
                prop_assert_eq!(now, Ok(()));
                return Ok(());
            }
            let bad = offsets.iter().find(|&&offset| !offset.is_multiple_of(8) || offset + 8 > remote.len());
            if let Some(&offset) = bad.filter(|&&offset| !offset.is_multiple_of(8)) {
                prop_assert_eq!(now, Err(FabricError::Misaligned { offset }));
                return Ok(());
            }
            let batch = remote.post(offsets.iter().map(|&offset| Op::Read { offset, len: 8 }).collect()).wait();
            prop_assert_eq!(batch.is_err(), bad.is_some());
            match batch {
                Ok(results) => {
                    prop_assert_eq!(now, Ok(()));
                    let expected: Vec<u64> = results.into_iter().map(|r| r.into_u64().unwrap()).collect();
                    prop_assert_eq!(words, expected);
                }
                Err(e) => prop_assert_eq!(now, Err(e)),
            }
            Ok(())
        })
        .unwrap();
    let mut two = [0u64; 2];
    if let Some(mismatched) = remote.read_words_now(&[0, 8, 16], &mut two) {
        assert_eq!(mismatched, Err(FabricError::BatchSize { ops: 3, max: 2 }));
    }
}

/// `read_words_now` on a region whose owner is gone fails (where offered).
pub fn words_read_at_once_from_a_dead_peer_fail(remote: &dyn RemoteRegion) {
    let mut word = [0u64; 1];
    if let Some(read) = remote.read_words_now(&[0], &mut word) {
        assert!(matches!(read, Err(FabricError::PeerDead { .. })), "{read:?}");
    }
}
