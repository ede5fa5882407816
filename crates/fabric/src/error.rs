use tierstack_base::NodeId;

/// Every way a fabric call can fail. Operating errors (a dead peer, a
/// timeout, a full inbox) are values the caller handles, never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    #[error("offset {offset} + length {len} is outside region {region:?} of {region_len} bytes")]
    OutOfBounds { region: String, offset: u64, len: u64, region_len: u64 },
    #[error("offset {offset} is not 8-byte aligned, as a 64-bit atomic requires")]
    Misaligned { offset: u64 },
    /// The local slice of a `WriteFrom`/`ReadInto` lies outside its region.
    #[error("local offset {offset} + length {len} is outside local region {region:?} of {region_len} bytes")]
    LocalOutOfBounds { region: String, offset: u64, len: u64, region_len: u64 },
    /// A `WriteFrom`/`ReadInto` whose local and remote offsets differ modulo 8.
    #[error(
        "local offset {local_offset} and remote offset {remote_offset} differ modulo 8: a transfer between \
         registered regions moves whole aligned words"
    )]
    LocalMisaligned { local_offset: u64, remote_offset: u64 },
    #[error("{node} has no region named {name:?}")]
    UnknownRegion { node: NodeId, name: String },
    #[error("{node} is not a node of this cluster")]
    UnknownNode { node: NodeId },
    #[error("a region named {name:?} is already registered on this node")]
    RegionExists { name: String },
    #[error("invalid region name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("region size {bytes} bytes is not between 1 and {max}")]
    RegionSize { bytes: u64, max: u64 },
    #[error("this node already has the maximum of {max} regions")]
    TooManyRegions { max: usize },
    #[error("a transfer of {len} bytes exceeds the limit of 16 MiB")]
    TransferTooLarge { len: usize },
    #[error("a batch of {ops} operations is empty or exceeds the limit of {max}")]
    BatchSize { ops: usize, max: usize },
    #[error("{node} did not answer within {timeout_ms} ms")]
    Timeout { node: NodeId, timeout_ms: u64 },
    #[error("{node} is dead or unreachable: {reason}")]
    PeerDead { node: NodeId, reason: String },
    #[error("a consistent read of the record at offset {offset} failed after {retries} torn attempts")]
    TornRead { offset: u64, retries: u32 },
    #[error("protocol error talking to {node}: {reason}")]
    Protocol { node: NodeId, reason: String },
    #[error("no message arrived within {timeout_ms} ms")]
    RecvTimeout { timeout_ms: u64 },
    #[error("the inbox of {node} is full")]
    InboxFull { node: NodeId },
    #[error("the fabric endpoint is closed")]
    Closed,
    #[error("{node} is already running as process {pid}")]
    NodeInUse { node: NodeId, pid: u32 },
    #[error("I/O error: {0}")]
    Io(String),
    /// The region's owner does not allow this peer this kind of operation.
    #[error("{node} may not {needed} region {region:?} (it may: {granted})")]
    Forbidden { node: NodeId, region: String, needed: crate::Rights, granted: crate::Rights },
    /// A peer failed authentication (wrong or missing cluster key, a forged
    /// node id, a frame altered in flight); the connection is closed.
    #[error("authentication with {node} failed: {reason}")]
    Unauthenticated { node: NodeId, reason: String },
    /// A local file or directory the backend would trust (the `shm` root, a
    /// node directory, a region, ring or pid file) is not private to this
    /// user: a symbolic link, owned by another user, or open to group or
    /// others. `reason` says which, and how to fix it.
    #[error("refusing {path}: {reason}")]
    UnsafePath { path: String, reason: String },
    #[error("message channel {channel} does not exist (channel ids are below {max})", max = tierstack_base::limits::CHANNELS_MAX)]
    UnknownChannel { channel: u8 },
}

impl FabricError {
    /// True for errors that mean the peer cannot be reached now (and may be
    /// reachable later): callers that must fail closed treat these alike.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, FabricError::Timeout { .. } | FabricError::PeerDead { .. } | FabricError::Closed)
    }
}

impl From<std::io::Error> for FabricError {
    fn from(e: std::io::Error) -> Self {
        FabricError::Io(e.to_string())
    }
}
