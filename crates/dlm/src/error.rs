use crate::LockId;
use tierstack_base::NodeId;
use tierstack_fabric::FabricError;

/// Every way a lock operation can fail. Operating errors (a dead peer, a
/// timeout, a full table) are values, never panics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The wait ended before the grant. The request stays queued and passes
    /// the lock on when it is granted, so the queue is never left with a hole.
    #[error("{lock}: no grant within {waited_ms} ms{}", blocked_suffix(*.blocked_on))]
    Timeout { lock: LockId, waited_ms: u64, blocked_on: Option<NodeId> },
    /// A try-acquire found the lock busy; nothing was enqueued.
    #[error("{lock} is busy")]
    WouldBlock { lock: LockId },
    /// Release of a grant that is not (or no longer) held.
    #[error("{lock} is not held by this grant")]
    NotHeld { lock: LockId },
    /// No lock with this id was created at its home.
    #[error("{lock} does not exist at its home {home}")]
    UnknownLock { lock: LockId, home: NodeId },
    /// `u64::MAX` is reserved (the table tags slots with `id + 1`).
    #[error("lock id {lock} is reserved")]
    InvalidLockId { lock: LockId },
    /// The home's table has no free slot for a new lock.
    #[error("the lock table of {home} is full ({slots} slots)")]
    TableFull { home: NodeId, slots: u64 },
    /// A node the operation depends on (the holder we wait for, a home, a
    /// successor) is dead or unreachable.
    #[error("{lock}: {node} is dead or unreachable: {reason}")]
    PeerDead { lock: LockId, node: NodeId, reason: String },
    /// Fewer lock servers than a majority could be read or written, so the
    /// lock's home cannot be known or claimed (re-homing; see
    /// `docs/internals/dlm-rehoming.md`).
    #[error("{lock}: only {reached} of the {needed} lock servers a majority needs answered")]
    NoQuorum { lock: LockId, reached: usize, needed: usize },
    /// `break_lock` revoked this request or hold.
    #[error("{lock} was broken by break_lock; the request or hold was revoked")]
    Broken { lock: LockId },
    /// The lock manager was shut down.
    #[error("the lock manager is shut down")]
    ShutDown,
    #[error("invalid lock manager configuration: {0}")]
    Config(String),
    /// A peer broke the protocol (a bug, or mixed schemes in one cluster).
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("{lock}: fabric error: {source}")]
    Fabric { lock: LockId, source: FabricError },
}

fn blocked_suffix(node: Option<NodeId>) -> String {
    node.map(|n| format!(" (waiting for {n})")).unwrap_or_default()
}

impl LockError {
    /// Classifies a fabric error met while working on `lock` at `node`.
    pub(crate) fn from_fabric(lock: LockId, node: NodeId, source: FabricError) -> Self {
        if source.is_unreachable() {
            LockError::PeerDead { lock, node, reason: source.to_string() }
        } else {
            LockError::Fabric { lock, source }
        }
    }
}
