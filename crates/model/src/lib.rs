//! Pure models of what a node has: a memory cache bounded in bytes and a disk
//! that serves one request at a time.
//!
//! Nothing here performs I/O or reads a clock. Real servers call these models
//! with real time (`tierstack origin`'s emulated disk, its file cache) and the
//! simulator calls them with simulated time, so a simulated node and a real
//! one make the same decisions for the same inputs.

mod cache;
mod disk;

pub use cache::{ByteLru, Inserted};
pub use disk::{DiskModel, DiskQueue, ModelError};
