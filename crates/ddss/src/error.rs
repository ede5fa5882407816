use crate::key::Key;
use tierstack_base::NodeId;
use tierstack_fabric::FabricError;

/// Result of a DDSS call.
pub type Result<T, E = DdssError> = std::result::Result<T, E>;

/// Every way a DDSS call can fail. Operating errors (a full region, a freed
/// key, a busy lock, an unreachable home) are values, never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DdssError {
    #[error("no free slot of {class_bytes} bytes on {node}")]
    RegionFull { node: NodeId, class_bytes: u32 },
    #[error("key {key} was freed (its slot is free or holds a newer allocation)")]
    KeyFreed { key: Key },
    #[error("key {key} names no slot: {reason}")]
    UnknownKey { key: String, reason: String },
    #[error("a value of {len} bytes does not fit the key's {capacity}-byte slot")]
    ValueTooLarge { len: usize, capacity: u32 },
    #[error("an allocation of {bytes} bytes exceeds the largest size class ({max} bytes)")]
    AllocationTooLarge { bytes: u64, max: u32 },
    #[error("the lock of key {key} stayed busy for {attempts} attempts")]
    LockBusy { key: Key, attempts: u32 },
    #[error("the value of key {key} was lost: its writer died in the middle of a put; the next put restores the key")]
    ValueLost { key: Key },
    #[error("allocation on {node} lost {attempts} races for a bitmap word; try again")]
    Contended { node: NodeId, attempts: u32 },
    #[error("{node} is not a member of this substrate")]
    NotMember { node: NodeId },
    #[error("{node} has not started the substrate (no initialized DDSS region)")]
    NotStarted { node: NodeId },
    #[error("the DDSS region of {node} is corrupt: {reason}")]
    Corrupt { node: NodeId, reason: String },
    #[error("this handle has no region of its own (attached only), so it cannot allocate locally")]
    NoLocalRegion,
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid {what}: {text:?}")]
    Parse { what: &'static str, text: String },
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    #[error("daemon connection: {0}")]
    Ipc(String),
    #[error("the daemon refused the request ({kind}): {message}")]
    Daemon { kind: String, message: String },
}

impl DdssError {
    /// A short stable name of the error's kind, used on the daemon's wire.
    pub fn kind(&self) -> &'static str {
        match self {
            DdssError::RegionFull { .. } => "region_full",
            DdssError::KeyFreed { .. } => "key_freed",
            DdssError::UnknownKey { .. } => "unknown_key",
            DdssError::ValueTooLarge { .. } => "value_too_large",
            DdssError::AllocationTooLarge { .. } => "allocation_too_large",
            DdssError::LockBusy { .. } => "lock_busy",
            DdssError::ValueLost { .. } => "value_lost",
            DdssError::Contended { .. } => "contended",
            DdssError::NotMember { .. } => "not_member",
            DdssError::NotStarted { .. } => "not_started",
            DdssError::Corrupt { .. } => "corrupt",
            DdssError::NoLocalRegion => "no_local_region",
            DdssError::Config(_) => "config",
            DdssError::Parse { .. } => "parse",
            DdssError::Fabric(_) => "fabric",
            DdssError::Ipc(_) => "ipc",
            DdssError::Daemon { .. } => "daemon",
        }
    }
}
