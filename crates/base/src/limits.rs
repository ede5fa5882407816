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

/// Messages queued at a receiver before senders see back-pressure errors.
pub const INBOX_MESSAGES_MAX: usize = 65_536;
