//! The seqlock record helper end to end against an in-process region:
//! versions count writes, payloads round-trip padded, bounds are checked, a
//! read that overlaps a write is retried (only the torn records), a write in
//! progress is never accepted, and the async forms agree.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use tierstack_fabric::seqlock::{read_many, read_many_async, SeqRecord, READ_ATTEMPTS_MAX};
use tierstack_fabric::{
    check_batch, execute_on_memory, Completion, FabricError, NodeId, Op, RegionMemory, RemoteRegion,
};

/// Something done to the memory between two ops of a batch: a writer racing
/// the reader. Called with the memory and the batch's index among all posts.
type Interference = Box<dyn Fn(&RegionMemory, usize) + Send + Sync>;

/// A region in this process whose batches execute at once, with an optional
/// interference after the first `split` ops of every batch.
struct Local {
    memory: RegionMemory,
    split: usize,
    interfere: Interference,
    /// The length of every batch posted, in order.
    batches: Mutex<Vec<usize>>,
}

impl Local {
    fn new(bytes: u64) -> Self {
        Self::racing(bytes, 0, Box::new(|_, _| {}))
    }

    fn racing(bytes: u64, split: usize, interfere: Interference) -> Self {
        Local { memory: RegionMemory::heap("records", bytes).unwrap(), split, interfere, batches: Mutex::default() }
    }

    fn batches(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }
}

impl RemoteRegion for Local {
    fn node(&self) -> NodeId {
        NodeId(0)
    }

    fn name(&self) -> &str {
        self.memory.name()
    }

    fn len(&self) -> u64 {
        self.memory.len()
    }

    fn post(&self, ops: Vec<Op>) -> Completion {
        let index = {
            let mut batches = self.batches.lock().unwrap();
            batches.push(ops.len());
            batches.len() - 1
        };
        let split = self.split.min(ops.len());
        Completion::ready(check_batch(self.memory.name(), self.memory.len(), &ops).and_then(|()| {
            let mut results = execute_on_memory(&self.memory, &ops[..split])?;
            (self.interfere)(&self.memory, index);
            results.extend(execute_on_memory(&self.memory, &ops[split..])?);
            Ok(results)
        }))
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

#[test]
fn geometry_and_bad_records() {
    let record = SeqRecord::new(16, 12).unwrap();
    assert_eq!((record.offset(), record.payload_bytes()), (16, 12));
    assert_eq!(record.footprint_bytes(), 8 + 16, "sequence word + payload padded to whole words");
    assert_eq!(SeqRecord::new(0, 0).unwrap().footprint_bytes(), 8);
    assert_eq!(SeqRecord::new(0, 16).unwrap().footprint_bytes(), 24);
    assert_eq!(SeqRecord::new(0, 17).unwrap().footprint_bytes(), 32);
    assert_eq!(SeqRecord::new(4, 8), Err(FabricError::Misaligned { offset: 4 }));
}

#[test]
fn versions_count_writes_and_payloads_round_trip_padded() {
    let region = Local::new(64);
    let record = SeqRecord::new(16, 12).unwrap();
    // Sentinels on both sides of the record's footprint (bytes 16..40).
    region.memory.store_u64(8, u64::MAX).unwrap();
    region.memory.store_u64(40, u64::MAX).unwrap();

    assert_eq!(record.read(&region).unwrap(), (0, vec![0; 12]));
    assert_eq!(record.write_local(&region.memory, b"hello world!").unwrap(), 1);
    assert_eq!(record.read(&region).unwrap(), (1, b"hello world!".to_vec()));
    assert_eq!(record.write_remote(&region, b"abc").unwrap(), 2);
    assert_eq!(record.read(&region).unwrap(), (2, b"abc\0\0\0\0\0\0\0\0\0".to_vec()), "a short payload is zero-padded");
    assert_eq!(record.write_local(&region.memory, b"").unwrap(), 3);
    assert_eq!(record.read(&region).unwrap(), (3, vec![0; 12]));
    assert_eq!(region.memory.load_u64(16).unwrap(), 6, "the sequence word is twice the version, even at rest");
    assert_eq!(region.memory.load_u64(8).unwrap(), u64::MAX, "nothing before the record changed");
    assert_eq!(region.memory.load_u64(40).unwrap(), u64::MAX, "nothing after the record changed");

    let too_long = FabricError::OutOfBounds { region: "seqlock record".into(), offset: 24, len: 13, region_len: 12 };
    assert_eq!(record.write_local(&region.memory, &[1; 13]), Err(too_long.clone()));
    assert_eq!(record.write_remote(&region, &[1; 13]), Err(too_long));
    assert_eq!(record.read(&region).unwrap(), (3, vec![0; 12]), "a refused write changed nothing");
    assert_eq!(block_on(record.read_async(&region)).unwrap(), (3, vec![0; 12]));
}

#[test]
fn a_read_that_overlaps_a_write_is_retried() {
    let record = SeqRecord::new(0, 8).unwrap();
    // In the first batch only, a whole write lands between the reader's first
    // sequence read and its payload read: both sequence reads are even but differ.
    let racing = || {
        Local::racing(
            16,
            1,
            Box::new(move |memory, batch| {
                if batch == 0 {
                    record.write_local(memory, b"newvalue").unwrap();
                }
            }),
        )
    };
    let region = racing();
    assert_eq!(record.read(&region).unwrap(), (1, b"newvalue".to_vec()));
    assert_eq!(region.batches(), vec![3, 3], "one torn attempt, one clean");
    let region = racing();
    assert_eq!(block_on(record.read_async(&region)).unwrap(), (1, b"newvalue".to_vec()));
    assert_eq!(region.batches(), vec![3, 3]);
}

#[test]
fn only_the_torn_records_are_read_again() {
    let first = SeqRecord::new(0, 8).unwrap();
    let second = SeqRecord::new(16, 8).unwrap();
    // After the second record's first sequence read (op 3 of 6), in the first batch only.
    let racing = || {
        let region = Local::racing(
            32,
            4,
            Box::new(move |memory, batch| {
                if batch == 0 {
                    second.write_local(memory, b"22222222").unwrap();
                }
            }),
        );
        first.write_local(&region.memory, b"11111111").unwrap();
        region
    };
    let expected = vec![(1, b"11111111".to_vec()), (1, b"22222222".to_vec())];
    let region = racing();
    assert_eq!(read_many(&region, &[first, second]).unwrap(), expected);
    assert_eq!(region.batches(), vec![6, 3], "the clean record is not read again");
    let region = racing();
    assert_eq!(block_on(read_many_async(&region, &[first, second])).unwrap(), expected);
    assert_eq!(region.batches(), vec![6, 3]);
    assert_eq!(read_many(&region, &[]).unwrap(), vec![], "no records, no batch");
    assert_eq!(region.batches(), vec![6, 3]);
}

#[test]
fn a_write_in_progress_is_never_accepted() {
    let record = SeqRecord::new(8, 8).unwrap();
    let region = Local::new(24);
    region.memory.store_u64(8, 1).unwrap(); // odd: a writer stopped mid-write
    region.memory.store_u64(0, 0xdead).unwrap(); // not part of the record
    let torn = FabricError::TornRead { offset: 8, retries: READ_ATTEMPTS_MAX };
    assert_eq!(record.read(&region), Err(torn.clone()));
    assert_eq!(region.batches().len(), READ_ATTEMPTS_MAX as usize, "every attempt was made");
    assert_eq!(block_on(record.read_async(&region)), Err(torn));

    // A write that finishes after three attempts is read on the fourth.
    let finishing = Local::racing(
        24,
        0,
        Box::new(move |memory, batch| {
            if batch == 3 {
                memory.store_u64(8, 2).unwrap();
            }
        }),
    );
    finishing.memory.store_u64(8, 1).unwrap();
    finishing.memory.write(0, b"abcdefgh").unwrap();
    assert_eq!(record.read(&finishing).unwrap(), (1, vec![0; 8]));
    assert_eq!(finishing.batches().len(), 4);
}
