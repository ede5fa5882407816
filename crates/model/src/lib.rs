//! Pure models of what a node has: a memory cache bounded in bytes, a disk
//! that serves one request at a time, and the storage that puts the cache in
//! front of the disk.
//!
//! Nothing here performs I/O or reads a clock. Real servers call these models
//! with real time (`tierstack origin`'s [`Storage`]) and the simulator calls
//! them with simulated time (`tierstack sim`'s nodes hold the same
//! [`Storage`]), so a simulated node and a real one make the same decisions
//! for the same inputs, by construction: there is one implementation.

mod cache;
mod disk;
mod storage;

pub use cache::{ByteLru, Inserted};
pub use disk::{DiskModel, DiskQueue, ModelError};
pub use storage::{Caching, ReadOutcome, Storage, StorageConfig, StorageCounts};

/// Coherency paper Trace 2: 20 documents (the Zipf trace's default).
pub const ZIPF_DOCS_DEFAULT: usize = 20;
/// Default Zipf exponent (not published for Trace 2; see `tierstack_workload`'s essay).
pub const ZIPF_ALPHA_DEFAULT: f64 = 0.75;
