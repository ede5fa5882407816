//! Access rights on registered memory, as RDMA memory registration has them
//! (`IBV_ACCESS_REMOTE_READ`, `_WRITE`, `_ATOMIC`): what a remote peer may do
//! to a region. The owner always has every right through its
//! [`LocalRegion`](crate::LocalRegion); rights bound only the operations
//! other nodes post.
//!
//! A region states its rights when it is registered ([`Access`]): one set
//! for every peer, optionally another for named nodes (a version table that
//! every proxy may read but one application node may update, say). Backends
//! enforce them where the operation is executed or mapped: `tcp` in the
//! owner's responder, against the node id its connection authenticated;
//! `ucx` through the memory mapping's protection flags; `shm` by mapping the
//! file read-only for a peer without write or atomic rights.

use crate::{FabricError, NodeId, Op, Result};
use std::fmt;

/// A set of remote rights.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rights(u8);

impl Rights {
    pub const NONE: Rights = Rights(0);
    /// `Read` and `ReadInto`.
    pub const READ: Rights = Rights(1);
    /// `Write` and `WriteFrom`.
    pub const WRITE: Rights = Rights(2);
    /// `FetchAdd` and `CompareSwap`.
    pub const ATOMIC: Rights = Rights(4);
    pub const READ_WRITE: Rights = Rights(1 | 2);
    pub const READ_ATOMIC: Rights = Rights(1 | 4);
    pub const ALL: Rights = Rights(1 | 2 | 4);

    pub const fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }

    pub const fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether these rights modify memory (a write or an atomic): on `shm`,
    /// what needs a writable mapping.
    pub const fn modifies(self) -> bool {
        self.0 & (Rights::WRITE.0 | Rights::ATOMIC.0) != 0
    }

    /// The bits, for the wire and for shared-memory headers.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Rights from their bits; unknown bits are dropped (never granted).
    pub const fn from_bits(bits: u8) -> Rights {
        Rights(bits & Rights::ALL.0)
    }
}

impl fmt::Debug for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("none");
        }
        let names = [(Rights::READ, "read"), (Rights::WRITE, "write"), (Rights::ATOMIC, "atomic")];
        let mut first = true;
        for (right, name) in names {
            if self.contains(right) {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

/// The remote rights of one region: a default for every peer, and
/// overrides for named nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    default: Rights,
    nodes: Vec<(NodeId, Rights)>,
}

impl Access {
    /// Every peer may do `rights`.
    pub const fn new(rights: Rights) -> Self {
        Self { default: rights, nodes: Vec::new() }
    }

    /// Every peer may read, write and use atomics.
    pub const fn all() -> Self {
        Self::new(Rights::ALL)
    }

    /// Peers may only read.
    pub const fn read_only() -> Self {
        Self::new(Rights::READ)
    }

    /// `node` may do `rights` (instead of the default).
    pub fn grant(mut self, node: NodeId, rights: Rights) -> Self {
        self.nodes.retain(|(n, _)| *n != node);
        self.nodes.push((node, rights));
        self
    }

    /// What `node` may do.
    pub fn rights_of(&self, node: NodeId) -> Rights {
        self.nodes.iter().find(|(n, _)| *n == node).map_or(self.default, |(_, r)| *r)
    }

    /// The rights of peers not named.
    pub fn default_rights(&self) -> Rights {
        self.default
    }

    /// The nodes named with rights of their own, in grant order: what a
    /// backend that publishes the rights (`shm`'s region header) encodes.
    pub fn grants(&self) -> &[(NodeId, Rights)] {
        &self.nodes
    }

    /// The union of every peer's rights: what a mapping shared by all
    /// peers must allow (UCX's one remote key per region).
    pub fn widest(&self) -> Rights {
        self.nodes.iter().fold(self.default, |acc, (_, r)| acc.union(*r))
    }

    /// Fails with [`FabricError::Forbidden`] unless `node` may post every op
    /// of `ops` to `region`.
    pub fn check(&self, region: &str, node: NodeId, ops: &[Op]) -> Result<()> {
        let rights = self.rights_of(node);
        for op in ops {
            let needed = op.needs();
            if !rights.contains(needed) {
                return Err(FabricError::Forbidden { node, region: region.to_string(), needed, granted: rights });
            }
        }
        Ok(())
    }
}

impl Op {
    /// The right this op needs.
    pub fn needs(&self) -> Rights {
        match self {
            Op::Read { .. } | Op::ReadInto { .. } => Rights::READ,
            Op::Write { .. } | Op::WriteFrom { .. } => Rights::WRITE,
            Op::FetchAdd { .. } | Op::CompareSwap { .. } => Rights::ATOMIC,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_combine_and_print() {
        assert!(Rights::ALL.contains(Rights::READ_WRITE));
        assert!(!Rights::READ.contains(Rights::WRITE));
        assert!(Rights::NONE.contains(Rights::NONE));
        assert_eq!(Rights::READ.union(Rights::ATOMIC), Rights::READ_ATOMIC);
        assert_eq!(Rights::READ_ATOMIC.to_string(), "read+atomic");
        assert_eq!(Rights::NONE.to_string(), "none");
        assert!(!Rights::READ.modifies());
        assert!(Rights::ATOMIC.modifies());
        assert_eq!(Rights::from_bits(0xff), Rights::ALL);
    }

    #[test]
    fn the_named_sets_are_their_parts_and_survive_their_bits() {
        assert_eq!(Rights::READ_WRITE, Rights::READ.union(Rights::WRITE));
        assert_eq!(Rights::READ_ATOMIC, Rights::READ.union(Rights::ATOMIC));
        assert_eq!(Rights::ALL, Rights::READ_WRITE.union(Rights::ATOMIC));
        for right in [Rights::READ, Rights::WRITE, Rights::ATOMIC] {
            assert!(Rights::ALL.contains(right) && !Rights::NONE.contains(right));
        }
        for bits in 0..8 {
            let rights = Rights::from_bits(bits);
            assert_eq!(Rights::from_bits(rights.bits()), rights);
            assert_eq!(rights.bits(), bits);
        }
        assert_eq!(format!("{:?}", Rights::READ_WRITE), "read+write");
        let access = Access::new(Rights::READ_ATOMIC).grant(NodeId(3), Rights::NONE);
        assert_eq!(access.default_rights(), Rights::READ_ATOMIC);
        assert_eq!(access.grants(), &[(NodeId(3), Rights::NONE)]);
    }

    #[test]
    fn a_node_override_replaces_the_default_and_the_check_names_the_op() {
        let access = Access::read_only().grant(NodeId(1), Rights::ALL);
        assert_eq!(access.rights_of(NodeId(1)), Rights::ALL);
        assert_eq!(access.rights_of(NodeId(2)), Rights::READ);
        assert_eq!(access.widest(), Rights::ALL);
        let write = [Op::Write { offset: 0, data: vec![1] }];
        assert!(access.check("vt", NodeId(1), &write).is_ok());
        let err = access.check("vt", NodeId(2), &write).unwrap_err();
        assert_eq!(
            err,
            FabricError::Forbidden {
                node: NodeId(2),
                region: "vt".into(),
                needed: Rights::WRITE,
                granted: Rights::READ
            }
        );
        let cas = [Op::Read { offset: 0, len: 8 }, Op::CompareSwap { offset: 0, expected: 0, new: 1 }];
        assert!(access.check("vt", NodeId(2), &cas).is_err(), "a forbidden op later in a batch passed");
        let lock_words = Access::new(Rights::ATOMIC);
        assert!(lock_words.check("locks", NodeId(3), &cas).is_err());
        assert!(lock_words.check("locks", NodeId(3), &cas[1..]).is_ok());
        // A later grant for the same node replaces the earlier one.
        assert_eq!(
            Access::all().grant(NodeId(4), Rights::READ).grant(NodeId(4), Rights::NONE).rights_of(NodeId(4)),
            Rights::NONE
        );
    }
}
