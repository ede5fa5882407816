//! The fabric interface: what every tierstack service is written against.
//!
//! A node **registers** named regions of memory once, at start-up. Any node
//! then **connects** to a region by `(node, name)` and operates on it with
//! one-sided operations ([`Op`]): `read`, `write`, 64-bit `fetch_add` and
//! `compare_swap` on 8-byte-aligned offsets, singly or as a posted batch that
//! completes as a whole. Nodes also exchange two-sided [`Message`]s for
//! control traffic, each on a [`Channel`] (one per service: locks, cache
//! metadata, PRESS, monitoring), received in one [`Inbox`] per channel and
//! ordered per sender and channel.
//!
//! This crate holds the interface and the rules every backend shares, and no
//! backend: the `shm` backend maps regions into every process on a host and
//! executes operations as plain loads, stores and atomics (the owner's threads
//! never run); the `tcp` backend sends each operation to a responder thread of
//! the owner (the honest two-sided baseline). Nothing here names either one.
//!
//! Key choices:
//! - **Post, then wait.** [`RemoteRegion::post`] returns a [`Completion`]
//!   that can be waited on from a thread ([`Completion::wait`]) or from async
//!   code ([`Completion::wait_async`]) without blocking a runtime thread. A
//!   backend guarantees every completion ends: with results, or with a typed
//!   error such as [`FabricError::Timeout`].
//! - **Multi-word reads are not atomic**, as with RDMA. Small records that
//!   must be read consistently use the [`seqlock`] helper. Every backend does
//!   guarantee that each *aligned 8-byte word* inside a read or write is
//!   transferred atomically (never torn), so a record whose other words never
//!   change (such as a key fingerprint beside a version) needs no seqlock.
//! - **Memory is accessed only through atomics** ([`memory::RegionMemory`]),
//!   because other processes read and write it concurrently. The one audited
//!   exception is [`RegionBytes`], a plain-bytes view for socket writes,
//!   sound under its slot's ownership rule.
//! - **Transfers can name local registered memory** ([`Op::WriteFrom`],
//!   [`Op::ReadInto`] with a [`LocalSlice`]), as RDMA work requests do, so
//!   bytes move region to region without a `Vec` of the caller's.

mod access;
mod completion;
mod error;
pub mod listen;
pub mod memory;
mod message;
mod op;
pub mod seqlock;
pub mod sync;
pub mod threads;

pub use access::{Access, Rights};
pub use completion::{Completion, CompletionSender};
pub use error::FabricError;
pub use memory::{RegionBytes, RegionMemory};
pub use message::{Channel, Inbox, InboxSource, Inboxes, Message};
pub use op::{check_batch, LocalSlice, Op, OpResult};
pub use tierstack_base::NodeId;

use std::sync::Arc;

/// Result of a fabric call.
pub type Result<T, E = FabricError> = std::result::Result<T, E>;

/// A node's attachment to the fabric: its registered regions, its handles to
/// other nodes' regions, and its message endpoint.
pub trait Fabric: Send + Sync {
    /// This node's id.
    fn local_node(&self) -> NodeId;

    /// The backend's short name (`"shm"`, `"tcp"`), for reports.
    fn backend_name(&self) -> &'static str;

    /// Registers a region of `bytes` bytes (rounded up to a multiple of 8),
    /// zero-filled, under `name`, that remote peers may operate on as
    /// `access` allows (the owner always may everything through the returned
    /// region). Memory is allocated once, here.
    fn register(&self, name: &str, bytes: u64, access: Access) -> Result<Arc<LocalRegion>>;

    /// Obtains a handle to the region `name` registered by `node`.
    fn connect(&self, node: NodeId, name: &str) -> Result<Arc<dyn RemoteRegion>>;

    /// Sends a two-sided message to `to` on `channel`; it arrives in `to`'s
    /// inbox of that channel and no other. Messages of one channel from one
    /// sender arrive in the order they were sent; there is no order across
    /// channels. While the receiver's inbox of `channel` is full the send
    /// waits (up to the backend's bound, then `Timeout`); sends on other
    /// channels are not held back by it (see [`Inbox`]).
    fn send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<()>;

    /// Sends as [`send`](Fabric::send) does, but only if that needs no wait:
    /// [`TrySend::WouldBlock`] (nothing sent) where `send` would wait for
    /// room at the receiver, for an answer, or for another sender of the
    /// same channel. Lets an async task send inline and hand only the rare
    /// send that would wait to a thread that may block. Errors are `send`'s.
    fn try_send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<TrySend>;

    /// This node's receive queue of `channel`. Each service drains its own
    /// channel and never sees another's messages.
    fn inbox(&self, channel: Channel) -> &Inbox;

    /// Whether `node`'s process runs, as far as the backend can tell now.
    /// Only [`PeerState::Gone`] is definite; callers that would act on a
    /// peer's death (take over what it held) act on nothing else.
    fn peer_state(&self, node: NodeId) -> PeerState;
}

/// What [`Fabric::try_send`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum TrySend {
    /// The message is on its way, as after a successful [`Fabric::send`].
    Sent,
    /// Sending it now would wait; nothing was sent (call `send` from a
    /// thread that may block, or try again later).
    WouldBlock,
}

/// What a fabric can tell about a peer's process ([`Fabric::peer_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// It runs (it may still be stopped or slow).
    Running,
    /// It is gone for certain: whatever it holds, it will never give back.
    Gone,
    /// The backend cannot tell (a timeout, an error other than a refusal).
    Unknown,
}

/// A region registered by this node: the owner's direct access to it.
pub struct LocalRegion {
    name: String,
    memory: RegionMemory,
    access: Access,
}

impl LocalRegion {
    /// A region every peer may read, write and use atomics on.
    pub fn new(name: impl Into<String>, memory: RegionMemory) -> Self {
        Self::with_access(name, memory, Access::all())
    }

    /// A region remote peers may operate on as `access` allows.
    pub fn with_access(name: impl Into<String>, memory: RegionMemory, access: Access) -> Self {
        Self { name: name.into(), memory, access }
    }

    /// What remote peers may do to this region.
    pub fn access(&self) -> &Access {
        &self.access
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The region's memory, for the owner's own loads, stores and atomics.
    pub fn memory(&self) -> &RegionMemory {
        &self.memory
    }

    pub fn len(&self) -> u64 {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }
}

impl std::fmt::Debug for LocalRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRegion").field("name", &self.name).field("len", &self.len()).finish()
    }
}

/// A handle to a region of another (or this) node. Operations on it are
/// one-sided in intent; whether the owner's CPU takes part is the backend's
/// property (`shm`: never; `tcp`: always).
pub trait RemoteRegion: Send + Sync {
    /// The owning node.
    fn node(&self) -> NodeId;

    /// The region's name at its owner.
    fn name(&self) -> &str;

    /// The region's length in bytes.
    fn len(&self) -> u64;

    /// Posts `ops` as one batch. The completion yields one result per op, in
    /// order. Ops execute in order; the batch as a whole is not atomic.
    /// Invalid ops (bounds, alignment, size) fail the whole batch before any
    /// executes.
    fn post(&self, ops: Vec<Op>) -> Completion;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads `buf.len()` bytes at `offset` (not atomic across words).
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = u32::try_from(buf.len()).map_err(|_| FabricError::TransferTooLarge { len: buf.len() })?;
        let data = self.post(vec![Op::Read { offset, len }]).wait()?.remove(0).into_bytes()?;
        buf.copy_from_slice(&data);
        Ok(())
    }

    /// Reads the 64-bit words at `offsets` (each 8-byte aligned, each read
    /// atomically, the set not atomic as a whole) into `words`, one per
    /// offset, at once, if this backend can without waiting for anyone: `None`
    /// if it cannot (then post the reads as a batch). On `shm`, loads from
    /// the mapping without a batch's allocations: the version check's hot
    /// path. `words` and `offsets` of different lengths are a
    /// [`FabricError::BatchSize`] error.
    fn read_words_now(&self, offsets: &[u64], words: &mut [u64]) -> Option<Result<()>> {
        let _ = (offsets, words);
        None
    }

    /// Reads the 64-bit word at `offset` (8-byte aligned) atomically.
    fn read_u64(&self, offset: u64) -> Result<u64> {
        if !offset.is_multiple_of(8) {
            return Err(FabricError::Misaligned { offset });
        }
        let mut word = [0u8; 8];
        self.read(offset, &mut word)?;
        Ok(u64::from_ne_bytes(word))
    }

    /// Writes `data` at `offset` (not atomic across words).
    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.post(vec![Op::Write { offset, data: data.to_vec() }]).wait()?;
        Ok(())
    }

    /// Writes the bytes of `source`, a slice of a region of this node, at
    /// `offset` (not atomic across words; see [`Op::WriteFrom`]).
    fn write_from(&self, offset: u64, source: &LocalSlice) -> Result<()> {
        self.post(vec![Op::WriteFrom { offset, source: source.clone() }]).wait()?;
        Ok(())
    }

    /// Reads `target.len()` bytes at `offset` straight into `target`, a slice
    /// of a region of this node (not atomic across words; see [`Op::ReadInto`]).
    fn read_into(&self, offset: u64, target: &LocalSlice) -> Result<()> {
        self.post(vec![Op::ReadInto { offset, target: target.clone() }]).wait()?;
        Ok(())
    }

    /// Adds `delta` (wrapping) to the word at `offset`; returns the previous value.
    fn fetch_add(&self, offset: u64, delta: u64) -> Result<u64> {
        self.post(vec![Op::FetchAdd { offset, delta }]).wait()?.remove(0).into_u64()
    }

    /// Replaces the word at `offset` with `new` if it equals `expected`;
    /// returns the previous value (the swap happened iff it equals `expected`).
    fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.post(vec![Op::CompareSwap { offset, expected, new }]).wait()?.remove(0).into_u64()
    }
}

/// Executes a validated batch directly on `memory`: the shared semantics of
/// every backend whose operations end up at the memory (`shm` in the caller's
/// process, `tcp` in the owner's responder).
pub fn execute_on_memory(memory: &RegionMemory, ops: &[Op]) -> Result<Vec<OpResult>> {
    ops.iter()
        .map(|op| match op {
            Op::Read { offset, len } => {
                let mut data = vec![0u8; *len as usize];
                memory.read(*offset, &mut data)?;
                Ok(OpResult::Read(data))
            }
            Op::Write { offset, data } => {
                memory.write(*offset, data)?;
                Ok(OpResult::Written)
            }
            // One copy, memory to memory (on `shm`, mapping to mapping).
            Op::WriteFrom { offset, source } => {
                memory.copy_from(*offset, source.region().memory(), source.offset(), u64::from(source.len()))?;
                Ok(OpResult::WrittenFrom)
            }
            Op::ReadInto { offset, target } => {
                target.region().memory().copy_from(target.offset(), memory, *offset, u64::from(target.len()))?;
                Ok(OpResult::ReadInto)
            }
            Op::FetchAdd { offset, delta } => Ok(OpResult::FetchAdd(memory.fetch_add(*offset, *delta)?)),
            Op::CompareSwap { offset, expected, new } => {
                Ok(OpResult::CompareSwap(memory.compare_swap(*offset, *expected, *new)?))
            }
        })
        .collect()
}

/// Checks a region name: 1 to 64 bytes of `[A-Za-z0-9._-]`, not starting
/// with a dot (names become file names in the `shm` backend).
pub fn validate_region_name(name: &str) -> Result<()> {
    let bad = |reason: &str| FabricError::InvalidName { name: name.to_string(), reason: reason.to_string() };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > tierstack_base::limits::REGION_NAME_BYTES_MAX {
        return Err(bad("longer than 64 bytes"));
    }
    if name.starts_with('.') {
        return Err(bad("starts with a dot"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return Err(bad("only letters, digits, '.', '_' and '-' are allowed"));
    }
    Ok(())
}

/// Checks a requested region size and returns it rounded up to 8 bytes.
pub fn validate_region_bytes(bytes: u64) -> Result<u64> {
    if bytes == 0 || bytes > tierstack_base::limits::REGION_BYTES_MAX {
        return Err(FabricError::RegionSize { bytes, max: tierstack_base::limits::REGION_BYTES_MAX });
    }
    Ok(bytes.div_ceil(8) * 8)
}
