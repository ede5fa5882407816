//! Transfers that name local registered memory, backend-neutral: the rules
//! `check_batch` applies to `WriteFrom`/`ReadInto`, their semantics in
//! `execute_on_memory` against plain `Read`/`Write`, `RegionMemory::copy_from`
//! word by word, and the `RegionBytes` view's contract.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tierstack_base::limits::TRANSFER_BYTES_MAX;
use tierstack_fabric::{
    check_batch, execute_on_memory, FabricError, LocalRegion, LocalSlice, Op, OpResult, RegionBytes, RegionMemory,
};

fn region(name: &str, bytes: u64) -> Arc<LocalRegion> {
    Arc::new(LocalRegion::new(name, RegionMemory::heap(name, bytes).unwrap()))
}

fn contents(memory: &RegionMemory) -> Vec<u8> {
    let mut all = vec![0u8; memory.len() as usize];
    memory.read(0, &mut all).unwrap();
    all
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn local_slices_are_equal_by_region_identity() {
    let a = region("same", 64);
    let b = region("same", 64);
    assert_eq!(LocalSlice::new(a.clone(), 8, 16), LocalSlice::new(a.clone(), 8, 16));
    assert_ne!(
        LocalSlice::new(a.clone(), 8, 16),
        LocalSlice::new(b.clone(), 8, 16),
        "same name and bytes, other region"
    );
    assert_ne!(LocalSlice::new(a.clone(), 8, 16), LocalSlice::new(a.clone(), 16, 16));
    assert_ne!(LocalSlice::new(a.clone(), 8, 16), LocalSlice::new(a.clone(), 8, 8));
    let op = Op::ReadInto { offset: 0, target: LocalSlice::new(a.clone(), 0, 8) };
    assert_eq!(op.clone(), op);
    assert_ne!(op, Op::ReadInto { offset: 0, target: LocalSlice::new(b, 0, 8) });
    assert_ne!(op, Op::WriteFrom { offset: 0, source: LocalSlice::new(a.clone(), 0, 8) });
    assert_eq!(format!("{:?}", LocalSlice::new(a, 8, 16)), r#"LocalSlice { region: "same", offset: 8, len: 16 }"#);
}

#[test]
fn check_batch_refuses_local_slices_outside_their_region() {
    let local = region("pool", 32);
    let remote_len = 1024;
    let out = |offset, len| LocalSlice::new(local.clone(), offset, len);
    for (op, expected) in [
        (
            Op::WriteFrom { offset: 0, source: out(24, 16) },
            FabricError::LocalOutOfBounds { region: "pool".into(), offset: 24, len: 16, region_len: 32 },
        ),
        (
            Op::ReadInto { offset: 0, target: out(32, 1) },
            FabricError::LocalOutOfBounds { region: "pool".into(), offset: 32, len: 1, region_len: 32 },
        ),
        (
            // Offset overflow is out of bounds, not a wrap.
            Op::ReadInto { offset: 7, target: out(u64::MAX, 2) },
            FabricError::LocalOutOfBounds { region: "pool".into(), offset: u64::MAX, len: 2, region_len: 32 },
        ),
    ] {
        assert_eq!(check_batch("remote", remote_len, &[Op::Read { offset: 0, len: 8 }, op]), Err(expected));
    }
    // The remote side is checked as for any op, and reported as remote.
    assert_eq!(
        check_batch("remote", 64, &[Op::WriteFrom { offset: 56, source: out(0, 16) }]),
        Err(FabricError::OutOfBounds { region: "remote".into(), offset: 56, len: 16, region_len: 64 })
    );
    // Exactly filling both regions is fine.
    assert_eq!(check_batch("remote", 32, &[Op::ReadInto { offset: 0, target: out(0, 32) }]), Ok(()));
}

#[test]
fn check_batch_wants_local_and_remote_offsets_equal_modulo_8() {
    let local = region("pool", 64);
    let slice = |offset, len| LocalSlice::new(local.clone(), offset, len);
    for (remote, local_offset) in [(0, 0), (3, 11), (13, 5), (16, 0), (7, 7)] {
        for op in [
            Op::WriteFrom { offset: remote, source: slice(local_offset, 20) },
            Op::ReadInto { offset: remote, target: slice(local_offset, 20) },
        ] {
            assert_eq!(check_batch("r", 128, &[op]), Ok(()), "{remote} and {local_offset} share a phase");
        }
    }
    for (remote, local_offset) in [(0, 1), (8, 4), (3, 0), (13, 6)] {
        let expected = FabricError::LocalMisaligned { local_offset, remote_offset: remote };
        assert_eq!(
            check_batch("r", 128, &[Op::WriteFrom { offset: remote, source: slice(local_offset, 8) }]),
            Err(expected.clone())
        );
        assert_eq!(
            check_batch("r", 128, &[Op::ReadInto { offset: remote, target: slice(local_offset, 8) }]),
            Err(expected)
        );
    }
}

#[test]
fn local_transfers_count_towards_the_transfer_limits() {
    // The slice is checked for size before bounds: no 16 MiB region needed.
    let local = region("small", 64);
    let too_big = (TRANSFER_BYTES_MAX + 1) as u32;
    assert_eq!(
        check_batch("r", u64::MAX, &[Op::ReadInto { offset: 0, target: LocalSlice::new(local.clone(), 0, too_big) }]),
        Err(FabricError::TransferTooLarge { len: TRANSFER_BYTES_MAX + 1 })
    );
    let big = region("big", TRANSFER_BYTES_MAX as u64);
    let half = (TRANSFER_BYTES_MAX / 2) as u32;
    let ops = [
        Op::WriteFrom { offset: 0, source: LocalSlice::new(big.clone(), 0, half) },
        Op::ReadInto { offset: 0, target: LocalSlice::new(big.clone(), 0, half) },
        Op::Read { offset: 0, len: 1 },
    ];
    assert_eq!(check_batch("r", u64::MAX, &ops), Err(FabricError::TransferTooLarge { len: TRANSFER_BYTES_MAX + 1 }));
    assert_eq!(check_batch("r", u64::MAX, &ops[..2]), Ok(()));
}

#[test]
fn copy_from_checks_both_ranges_and_the_phase() {
    let to = RegionMemory::heap("to", 32).unwrap();
    let from = RegionMemory::heap("from", 16).unwrap();
    assert_eq!(
        to.copy_from(24, &from, 0, 16),
        Err(FabricError::OutOfBounds { region: "to".into(), offset: 24, len: 16, region_len: 32 })
    );
    assert_eq!(
        to.copy_from(0, &from, 8, 16),
        Err(FabricError::OutOfBounds { region: "from".into(), offset: 8, len: 16, region_len: 16 })
    );
    assert_eq!(to.copy_from(1, &from, 2, 4), Err(FabricError::Misaligned { offset: 1 }));
    assert_eq!(contents(&to), vec![0; 32], "a refused copy writes nothing");
}

/// A copy moves each aligned word with one load and one store: the
/// destination never holds a word that mixes two of the source's values,
/// however the source changes during the copy. (Copied byte by byte, the
/// destination tears within a few thousand flips.)
#[test]
fn copy_from_never_tears_an_aligned_word() {
    const WORDS: u64 = 64;
    /// Copies go on until the source has changed this often under them.
    const FLIPS_MIN: u64 = 200_000;
    let (a, b) = (0x1111_1111_1111_1111u64, 0x2222_2222_2222_2222u64);
    let source = Arc::new(RegionMemory::heap("source", WORDS * 8).unwrap());
    let destination = RegionMemory::heap("destination", WORDS * 8 + 8).unwrap();
    for word in 0..WORDS {
        source.store_u64(word * 8, a).unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let flipper = {
        let (source, done, flips) = (source.clone(), done.clone(), flips.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let value = if flips.load(Ordering::Relaxed).is_multiple_of(2) { b } else { a };
                for word in 0..WORDS {
                    source.store_u64(word * 8, value).unwrap();
                }
                flips.fetch_add(1, Ordering::Release);
            }
        })
    };
    let (mut copies, mut torn) = (0u64, 0u64);
    while flips.load(Ordering::Acquire) < FLIPS_MIN {
        // Offset 8: the copy lands one word in, still in phase.
        destination.copy_from(8, &source, 0, WORDS * 8).unwrap();
        copies += 1;
        torn += (0..WORDS).filter(|word| ![a, b].contains(&destination.load_u64(8 + word * 8).unwrap())).count() as u64;
    }
    done.store(true, Ordering::Release);
    flipper.join().unwrap();
    assert!(copies > 0);
    assert_eq!(torn, 0, "torn words after {copies} copies");
}

#[derive(Clone, Debug)]
enum Step {
    WriteFrom { remote: u64, local: u64, len: u32 },
    ReadInto { remote: u64, local: u64, len: u32 },
    Write { remote: u64, data: Vec<u8> },
    Store { local: u64, data: Vec<u8> },
}

const REMOTE_BYTES: u64 = 96;
const LOCAL_BYTES: u64 = 64;

fn step() -> impl Strategy<Value = Step> {
    // Same phase by construction: the local offset keeps the remote's.
    let transfer = (0u64..REMOTE_BYTES, 0u64..LOCAL_BYTES / 8, 0u32..48).prop_map(|(remote, local_word, len)| {
        let local = local_word * 8 + remote % 8;
        (remote, local, len)
    });
    prop_oneof![
        transfer.clone().prop_map(|(remote, local, len)| Step::WriteFrom { remote, local, len }),
        transfer.prop_map(|(remote, local, len)| Step::ReadInto { remote, local, len }),
        (0u64..REMOTE_BYTES, proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(remote, data)| Step::Write { remote, data }),
        (0u64..LOCAL_BYTES, proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(local, data)| Step::Store { local, data }),
    ]
}

fn fits(offset: u64, len: usize, region: u64) -> bool {
    offset + len as u64 <= region
}

proptest! {
    /// `WriteFrom`/`ReadInto` executed on memory move exactly the bytes that
    /// a `Read` of the source followed by a `Write` of the destination moves,
    /// at any offsets and lengths; a refused one changes nothing.
    #[test]
    fn transfers_match_plain_reads_and_writes(steps in proptest::collection::vec(step(), 1..24)) {
        let remote = RegionMemory::heap("remote", REMOTE_BYTES).unwrap();
        let local = region("local", LOCAL_BYTES);
        let (mut remote_model, mut local_model) = (vec![0u8; REMOTE_BYTES as usize], vec![0u8; LOCAL_BYTES as usize]);
        for step in steps {
            match step {
                Step::WriteFrom { remote: at, local: from, len } => {
                    let op = Op::WriteFrom { offset: at, source: LocalSlice::new(local.clone(), from, len) };
                    let ok = fits(at, len as usize, REMOTE_BYTES) && fits(from, len as usize, LOCAL_BYTES);
                    let result = check_batch("remote", remote.len(), std::slice::from_ref(&op))
                        .and_then(|()| execute_on_memory(&remote, &[op]));
                    prop_assert_eq!(result.is_ok(), ok, "{:?}", result);
                    if ok {
                        prop_assert_eq!(result.unwrap(), vec![OpResult::WrittenFrom]);
                        let (at, from, len) = (at as usize, from as usize, len as usize);
                        let bytes = local_model[from..from + len].to_vec();
                        remote_model[at..at + len].copy_from_slice(&bytes);
                    }
                }
                Step::ReadInto { remote: at, local: into, len } => {
                    let op = Op::ReadInto { offset: at, target: LocalSlice::new(local.clone(), into, len) };
                    let ok = fits(at, len as usize, REMOTE_BYTES) && fits(into, len as usize, LOCAL_BYTES);
                    let result = check_batch("remote", remote.len(), std::slice::from_ref(&op))
                        .and_then(|()| execute_on_memory(&remote, &[op]));
                    prop_assert_eq!(result.is_ok(), ok, "{:?}", result);
                    if ok {
                        prop_assert_eq!(result.unwrap(), vec![OpResult::ReadInto]);
                        let (at, into, len) = (at as usize, into as usize, len as usize);
                        let bytes = remote_model[at..at + len].to_vec();
                        local_model[into..into + len].copy_from_slice(&bytes);
                    }
                }
                Step::Write { remote: at, data } => {
                    if fits(at, data.len(), REMOTE_BYTES) {
                        let at = at as usize;
                        remote_model[at..at + data.len()].copy_from_slice(&data);
                        execute_on_memory(&remote, &[Op::Write { offset: at as u64, data }]).unwrap();
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
            prop_assert_eq!(&contents(&remote), &remote_model);
            prop_assert_eq!(&contents(local.memory()), &local_model);
        }
    }
}

#[test]
fn a_refused_batch_leaves_both_regions_untouched() {
    let remote = RegionMemory::heap("remote", 64).unwrap();
    let local = region("local", 64);
    local.memory().write(0, &pattern(64, 1)).unwrap();
    remote.write(0, &pattern(64, 2)).unwrap();
    let ops = vec![
        Op::WriteFrom { offset: 0, source: LocalSlice::new(local.clone(), 0, 16) },
        Op::ReadInto { offset: 16, target: LocalSlice::new(local.clone(), 16, 16) },
        Op::Write { offset: 40, data: vec![9; 8] },
        Op::ReadInto { offset: 0, target: LocalSlice::new(local.clone(), 1, 8) },
    ];
    assert_eq!(
        check_batch("remote", remote.len(), &ops),
        Err(FabricError::LocalMisaligned { local_offset: 1, remote_offset: 0 })
    );
    assert_eq!(contents(local.memory()), pattern(64, 1));
    assert_eq!(contents(&remote), pattern(64, 2));
}

#[test]
fn a_region_bytes_view_sees_what_was_written_before_it_was_made() {
    let slot = region("slot", 64);
    slot.memory().write(5, b"cached file body").unwrap();
    // SAFETY: nothing writes the slot while the view lives (this test is
    // the slot's only user).
    let view = unsafe { RegionBytes::new(LocalSlice::new(slot.clone(), 5, 16)) }.unwrap();
    assert_eq!(view.as_slice(), b"cached file body");
    assert_eq!(&*view, b"cached file body");
    assert_eq!((view.len(), view.is_empty()), (16, false));
    assert!(Arc::ptr_eq(view.region(), &slot));

    // Filled by a ReadInto, as a cache fetch fills a pool slot.
    let remote = RegionMemory::heap("remote", 64).unwrap();
    remote.write(8, &pattern(40, 3)).unwrap();
    let target = LocalSlice::new(slot.clone(), 16, 40);
    execute_on_memory(&remote, &[Op::ReadInto { offset: 8, target: target.clone() }]).unwrap();
    // SAFETY: as above.
    let view = unsafe { RegionBytes::new(target) }.unwrap();
    assert_eq!(view.as_slice(), &pattern(40, 3)[..]);

    // A view owns its region: it outlives every other handle, and can back
    // a `Bytes` for a socket write without a copy.
    drop(slot);
    let bytes = bytes::Bytes::from_owner(view);
    assert_eq!(&bytes[..], &pattern(40, 3)[..]);
}

#[test]
fn a_region_bytes_view_outside_its_region_is_refused() {
    let slot = region("slot", 16);
    // SAFETY: the view is never made.
    let refused = unsafe { RegionBytes::new(LocalSlice::new(slot, 8, 9)) };
    assert_eq!(
        refused.err(),
        Some(FabricError::LocalOutOfBounds { region: "slot".into(), offset: 8, len: 9, region_len: 16 })
    );
}
