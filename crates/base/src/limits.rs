//! Named limits. Every queue, region and message in tierstack is bounded by
//! one of these, so that resource exhaustion is a typed error, not an OOM.

/// Largest number of nodes a cluster may describe. Node ids must be below it.
pub const NODES_MAX: u32 = 4096;

/// Largest single registered region. Registration happens once at start-up,
/// as RDMA memory registration requires, so this bounds a node's footprint.
pub const REGION_BYTES_MAX: u64 = 1 << 30;

/// Largest number of regions one node may register.
pub const REGIONS_PER_NODE_MAX: usize = 256;

/// Longest region name, in bytes.
pub const REGION_NAME_BYTES_MAX: usize = 64;

/// Largest payload of one fabric operation (read length or write length) and
/// of one two-sided message. Larger transfers are split by the caller.
pub const TRANSFER_BYTES_MAX: usize = 16 << 20;

/// Largest number of operations in one posted batch.
pub const BATCH_OPS_MAX: usize = 1024;

/// Messages queued at a receiver, per message channel, before its senders
/// are held back (a full channel's inbox stops taking from their
/// connections or rings).
pub const INBOX_MESSAGES_MAX: usize = 65_536;

/// Number of message channels a node has; channel ids are `0..CHANNELS_MAX`.
/// Each channel is one receive queue of [`INBOX_MESSAGES_MAX`] messages, and
/// each ordered pair of nodes may keep one message path per channel (`tcp`: a
/// connection and its receiving thread; `shm`: a ring), so this also bounds
/// those.
pub const CHANNELS_MAX: usize = 8;
