//! `RegionMemory` through its public surface: bounds and alignment of every
//! accessor, word access, and reads and writes at any offset against a byte
//! array model.

use proptest::prelude::*;
use std::sync::atomic::Ordering;
use tierstack_fabric::{FabricError, RegionMemory};

#[test]
fn identity_and_length() {
    let memory = RegionMemory::heap("named", 20).unwrap();
    assert_eq!(memory.name(), "named");
    assert_eq!(memory.len(), 24);
    assert!(!memory.is_empty());
    assert_eq!(format!("{memory:?}"), r#"RegionMemory { name: "named", len: 24 }"#);
}

#[test]
fn an_empty_region_is_empty() {
    // Registration never makes one (sizes start at 8), but a backend may wrap one.
    let base = std::ptr::NonNull::<u64>::dangling().cast::<u8>();
    // SAFETY: zero bytes are never accessed; the dangling pointer is 8-aligned.
    let memory = unsafe { RegionMemory::from_raw("empty", base, 0, Box::new(())) }.unwrap();
    assert!(memory.is_empty());
    assert!(matches!(memory.load_u64(0), Err(FabricError::OutOfBounds { .. })));
}

#[test]
fn words_are_the_region_words() {
    let memory = RegionMemory::heap("w", 32).unwrap();
    let words = memory.words(8, 3).unwrap();
    assert_eq!(words.len(), 3);
    words[0].store(11, Ordering::Release);
    words[2].store(33, Ordering::Release);
    assert_eq!(memory.load_u64(8).unwrap(), 11);
    assert_eq!(memory.load_u64(24).unwrap(), 33);
    memory.store_u64(16, 22).unwrap();
    assert_eq!(words[1].load(Ordering::Acquire), 22);
    assert!(memory.words(0, 0).unwrap().is_empty());
    assert_eq!(memory.words(4, 1).err(), Some(FabricError::Misaligned { offset: 4 }));
    assert!(matches!(memory.words(16, 3), Err(FabricError::OutOfBounds { offset: 16, len: 24, region_len: 32, .. })));
}

#[test]
fn word_accessors_check_alignment_and_bounds() {
    let memory = RegionMemory::heap("a", 16).unwrap();
    memory.store_u64(8, 7).unwrap();
    assert_eq!(memory.load_u64(8).unwrap(), 7);
    assert_eq!(memory.fetch_add(8, u64::MAX).unwrap(), 7, "wrapping add of -1");
    assert_eq!(memory.load_u64(8).unwrap(), 6);
    assert_eq!(memory.store_u64(3, 1), Err(FabricError::Misaligned { offset: 3 }));
    assert_eq!(memory.compare_swap(12, 0, 1), Err(FabricError::Misaligned { offset: 12 }));
    assert!(matches!(memory.store_u64(16, 1), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(memory.compare_swap(16, 0, 1), Err(FabricError::OutOfBounds { .. })));
    assert_eq!(memory.load_u64(0).unwrap(), 0, "refused stores changed nothing");
    assert!(memory.read(16, &mut []).is_ok(), "an empty read at the end is in bounds");
    assert!(memory.write(16, &[]).is_ok());
    assert!(matches!(memory.write(10, &[0; 7]), Err(FabricError::OutOfBounds { offset: 10, len: 7, .. })));
}

proptest! {
    /// Reads and writes at any offset and length behave like a byte array.
    #[test]
    fn reads_and_writes_anywhere_behave_like_a_byte_array(
        steps in proptest::collection::vec((0u64..72, proptest::collection::vec(any::<u8>(), 0..40), 0u64..72, 0usize..40), 1..20)
    ) {
        let memory = RegionMemory::heap("model", 64).unwrap();
        let mut model = [0u8; 64];
        for (write_at, data, read_at, read_len) in &steps {
            let fits = |at: u64, len: usize| at as usize + len <= 64;
            prop_assert_eq!(memory.write(*write_at, data).is_ok(), fits(*write_at, data.len()));
            if fits(*write_at, data.len()) {
                model[*write_at as usize..*write_at as usize + data.len()].copy_from_slice(data);
            }
            let mut buf = vec![0xeeu8; *read_len];
            let read = memory.read(*read_at, &mut buf);
            prop_assert_eq!(read.is_ok(), fits(*read_at, *read_len));
            if read.is_ok() {
                prop_assert_eq!(&buf[..], &model[*read_at as usize..*read_at as usize + read_len]);
            }
        }
    }
}
