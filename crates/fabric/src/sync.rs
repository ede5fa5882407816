//! The atomics used by shared-memory protocols, routed through one place so
//! that `--cfg tierstack_loom` swaps in loom's model-checked versions.
//! (A custom cfg name, because `--cfg loom` also changes tokio's build.)

#[cfg(tierstack_loom)]
pub use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(tierstack_loom))]
pub use std::sync::atomic::{fence, AtomicU64, Ordering};
