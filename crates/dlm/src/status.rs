//! Each lock manager's **node region**: its incarnation, its heartbeat (the
//! lease), and a table of its per-lock states, all readable one-sidedly by
//! peers and by `tierstack dlm status`.
//!
//! ```text
//! word 0   incarnation: a random nonzero number drawn at start-up
//! word 1   heartbeat: advanced every lease / 8 while leases are on
//! word 2   lease in milliseconds (0: this node keeps no lease)
//! word 3   reserved
//! then STATUS_ENTRIES entries of four words:
//!   w0 lock id + 1 (0: unused)
//!   w1 state code (bits 7..0), mode (bit 8: exclusive), generation (bits 31..16),
//!      peer node + 1 (bits 47..32: the node it waits for; 0 none)
//!   w2 CLOCK_MONOTONIC nanoseconds at which this state began
//!   w3 requests made so far
//! ```
//!
//! Waiters read a node's heartbeat word through a handle obtained before
//! they sent that node the message they wait on: a handle is bound to one
//! incarnation of a region (the fabric's rule), so a read that fails with
//! `PeerDead` means the node they queued behind is gone, even if its id has
//! been started again meanwhile. The entries are advisory (written after
//! each change of a lock's state, not atomically with it) and only for
//! diagnosis: no decision reads them.

use crate::proto::{ClientState, LockMode};
use crate::LockId;
use tierstack_base::NodeId;
use tierstack_fabric::{FabricError, RegionMemory, RemoteRegion};

/// Words before the entries.
const HEADER_WORDS: u64 = 4;
/// Offset of the incarnation word.
pub const INCARNATION_OFFSET: u64 = 0;
/// Offset of the heartbeat word.
pub const HEARTBEAT_OFFSET: u64 = 8;
/// Offset of the lease word (milliseconds).
pub const LEASE_OFFSET: u64 = 16;
/// Per-lock entries in a node region: locks used beyond these are not shown.
pub const STATUS_ENTRIES: u64 = 256;
const ENTRY_BYTES: u64 = 32;

/// Bytes of a node region.
pub fn node_region_bytes() -> u64 {
    HEADER_WORDS * 8 + STATUS_ENTRIES * ENTRY_BYTES
}

/// One lock's state at one node, as shown in its node region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusEntry {
    pub lock: LockId,
    pub state: ClientState,
    pub generation: u16,
    /// The node the request waits for, if one.
    pub peer: Option<NodeId>,
    /// `CLOCK_MONOTONIC` nanoseconds at which the state began.
    pub since_ns: u64,
    /// Requests this node made for the lock so far.
    pub requests: u64,
}

fn state_code(state: ClientState) -> (u64, bool) {
    match state {
        ClientState::Idle => (0, false),
        ClientState::Waiting { mode } => (1, mode == LockMode::Exclusive),
        ClientState::Holding { mode } => (2, mode == LockMode::Exclusive),
        ClientState::Releasing => (3, false),
        ClientState::Moving => (4, false),
        ClientState::Barrier => (5, false),
    }
}

fn decode_state(code: u64, exclusive: bool) -> Option<ClientState> {
    let mode = if exclusive { LockMode::Exclusive } else { LockMode::Shared };
    Some(match code {
        0 => ClientState::Idle,
        1 => ClientState::Waiting { mode },
        2 => ClientState::Holding { mode },
        3 => ClientState::Releasing,
        4 => ClientState::Moving,
        5 => ClientState::Barrier,
        _ => return None,
    })
}

impl StatusEntry {
    /// The entry's second word (what changes with the state).
    pub fn state_word(state: ClientState, generation: u16, peer: Option<NodeId>) -> u64 {
        let (code, exclusive) = state_code(state);
        let peer = peer.map_or(0, |p| u64::from(p.0.wrapping_add(1)) & 0xFFFF);
        code | (u64::from(exclusive) << 8) | (u64::from(generation) << 16) | (peer << 32)
    }

    fn decode(words: [u64; 4]) -> Option<Self> {
        if words[0] == 0 {
            return None;
        }
        let state = decode_state(words[1] & 0xFF, words[1] & 0x100 != 0)?;
        let peer = (words[1] >> 32) & 0xFFFF;
        Some(Self {
            lock: LockId(words[0] - 1),
            state,
            generation: (words[1] >> 16) as u16,
            peer: (peer != 0).then(|| NodeId(peer as u32 - 1)),
            since_ns: words[2],
            requests: words[3],
        })
    }
}

/// Writes entry `index` of the node region `memory` (the owner's side).
pub(crate) fn write_entry(
    memory: &RegionMemory,
    index: u64,
    lock: LockId,
    state_word: u64,
    since_ns: u64,
    requests: u64,
) -> Result<(), FabricError> {
    let base = HEADER_WORDS * 8 + index * ENTRY_BYTES;
    memory.store_u64(base + 8, state_word)?;
    memory.store_u64(base + 16, since_ns)?;
    memory.store_u64(base + 24, requests)?;
    memory.store_u64(base, lock.0.wrapping_add(1))
}

/// What a node region shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub node: NodeId,
    pub incarnation: u64,
    pub heartbeat: u64,
    /// The lease the node keeps, in milliseconds (0: none).
    pub lease_ms: u64,
    pub entries: Vec<StatusEntry>,
}

/// Reads a node region one-sidedly (several reads, not one snapshot).
pub fn read_node_status(region: &dyn RemoteRegion) -> Result<NodeStatus, FabricError> {
    let mut header = [0u8; (HEADER_WORDS * 8) as usize];
    region.read(0, &mut header)?;
    let word = |bytes: &[u8], i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    };
    let mut body = vec![0u8; (STATUS_ENTRIES * ENTRY_BYTES) as usize];
    region.read(HEADER_WORDS * 8, &mut body)?;
    let entries = (0..STATUS_ENTRIES as usize)
        .filter_map(|i| StatusEntry::decode([0, 1, 2, 3].map(|w| word(&body, i * 4 + w))))
        .collect();
    Ok(NodeStatus {
        node: region.node(),
        incarnation: word(&header, 0),
        heartbeat: word(&header, 1),
        lease_ms: word(&header, 2),
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_their_words() {
        let cases = [
            (ClientState::Idle, None),
            (ClientState::Waiting { mode: LockMode::Exclusive }, Some(NodeId(7))),
            (ClientState::Waiting { mode: LockMode::Shared }, Some(NodeId(0))),
            (ClientState::Holding { mode: LockMode::Shared }, None),
            (ClientState::Holding { mode: LockMode::Exclusive }, None),
            (ClientState::Releasing, None),
            (ClientState::Moving, None),
            (ClientState::Barrier, None),
        ];
        for (state, peer) in cases {
            let word = StatusEntry::state_word(state, 513, peer);
            let entry = StatusEntry::decode([42, word, 9, 3]).unwrap();
            assert_eq!(entry, StatusEntry { lock: LockId(41), state, generation: 513, peer, since_ns: 9, requests: 3 });
        }
        assert_eq!(StatusEntry::decode([0, 0, 0, 0]), None, "an unused entry");
        assert_eq!(StatusEntry::decode([1, 0xFF, 0, 0]), None, "an unknown state code");
    }
}
