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
//!
//! [`StatusReport`] is what `tierstack dlm status` shows: every home's
//! table and every node's region, read here and rendered here (as tables or
//! JSON), so that the binary only parses its flags.

use crate::proto::{ClientState, LockMode};
use crate::table::{alive_region, candidates, read_table, table_region, SlotView};
use crate::LockId;
use serde_json::{json, Value};
use std::fmt::Write as _;
use tierstack_base::NodeId;
use tierstack_fabric::{Fabric, FabricError, PeerState, RegionMemory, RemoteRegion};

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

/// What `tierstack dlm status` read: each part read one-sidedly, each
/// failure kept as its message (one unreadable node does not hide the rest).
#[derive(Debug)]
pub struct StatusReport {
    /// Per lock server: its table, or why it could not be read.
    pub homes: Vec<(NodeId, Result<Vec<SlotView>, String>)>,
    /// Per node: its liveness and node region, or why it could not be read.
    pub nodes: Vec<(NodeId, PeerState, Result<NodeStatus, String>)>,
}

impl StatusReport {
    /// Reads the tables of `homes` and the node regions of `nodes` of the
    /// cluster whose regions are named by `prefix` and `scheme`.
    pub fn read(fabric: &dyn Fabric, homes: &[NodeId], nodes: &[NodeId], prefix: &str, scheme: &str) -> Self {
        let homes = homes
            .iter()
            .map(|&home| {
                let table = fabric
                    .connect(home, &table_region(prefix, scheme))
                    .and_then(|region| read_table(region.as_ref()))
                    .map_err(|e| e.to_string());
                (home, table)
            })
            .collect();
        let nodes = nodes
            .iter()
            .map(|&n| {
                let view = fabric
                    .connect(n, &alive_region(prefix, scheme))
                    .and_then(|region| read_node_status(region.as_ref()))
                    .map_err(|e| e.to_string());
                (n, fabric.peer_state(n), view)
            })
            .collect();
        Self { homes, nodes }
    }

    /// Where each lock lives, from the membership words of every table read
    /// (see `docs/internals/dlm-rehoming.md`): the highest home epoch, the
    /// home it names (the first candidate for epoch 0), whether a majority
    /// of the servers name it, and the candidates in order. The servers are
    /// the homes this report read, in its order.
    pub fn placements(&self) -> Vec<(LockId, crate::runtime::Placement)> {
        let servers: Vec<NodeId> = self.homes.iter().map(|(n, _)| *n).collect();
        let mut words: std::collections::BTreeMap<LockId, Vec<crate::word::HomeWord>> = Default::default();
        for (_, table) in &self.homes {
            for slot in table.iter().flatten() {
                words.entry(slot.lock).or_default().push(slot.home);
            }
        }
        let majority = servers.len() / 2 + 1;
        words
            .into_iter()
            .filter_map(|(lock, words)| {
                let candidates = candidates(lock, &servers);
                let first = *candidates.first()?;
                let epoch = words.iter().map(|w| w.epoch).max()?;
                let named: Vec<NodeId> =
                    words.iter().filter(|w| w.epoch == epoch).map(|w| w.home.unwrap_or(first)).collect();
                let home = named.first().copied().unwrap_or(first);
                // Without re-homing only the first candidate has a slot: settled.
                let settled = servers.len() < crate::REHOMING_SERVERS_MIN
                    || named.iter().filter(|h| **h == home).count() >= majority;
                Some((lock, crate::runtime::Placement { home, epoch, candidates, settled }))
            })
            .collect()
    }

    /// The report as one JSON object `{homes, nodes, placements}`.
    pub fn to_json(&self) -> Value {
        let homes: Vec<Value> = self
            .homes
            .iter()
            .map(|(home, table)| match table {
                Ok(slots) => json!({ "home": home.0, "locks": slots.iter().map(slot_json).collect::<Vec<_>>() }),
                Err(e) => json!({ "home": home.0, "error": e }),
            })
            .collect();
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|(n, state, view)| match view {
                Ok(v) => json!({
                    "node": n.0, "process": format!("{state:?}"), "incarnation": v.incarnation,
                    "heartbeat": v.heartbeat, "lease_ms": v.lease_ms,
                    "locks": v.entries.iter().map(|e| json!({
                        "lock": e.lock.0, "state": format!("{:?}", e.state), "generation": e.generation,
                        "waits_for": e.peer.map(|p| p.0), "since_ns": e.since_ns, "requests": e.requests,
                    })).collect::<Vec<_>>(),
                }),
                Err(e) => json!({ "node": n.0, "process": format!("{state:?}"), "error": e }),
            })
            .collect();
        let placements: Vec<Value> = self
            .placements()
            .into_iter()
            .map(|(lock, p)| {
                json!({
                    "lock": lock.0, "home": p.home.0, "epoch": p.epoch, "settled": p.settled,
                    "candidates": p.candidates.iter().map(|c| c.0).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({ "homes": homes, "nodes": nodes, "placements": placements })
    }

    /// The report as tables; `now_ns` (`CLOCK_MONOTONIC`) dates the states' ages.
    pub fn render(&self, now_ns: u64) -> String {
        // Writing to a String cannot fail.
        let mut out = String::new();
        let _ = writeln!(out, "locks (home words, read one-sidedly):");
        let _ = writeln!(
            out,
            "  {:>8} {:>6} {:>4} {:>8} {:>7} {:>14} {:>20}",
            "lock", "home", "gen", "tail", "shared", "drain waiter", "fence count/gen"
        );
        for (home, table) in &self.homes {
            match table {
                Ok(slots) => {
                    for slot in slots {
                        let tail = if slot.fenced {
                            "fenced".to_string()
                        } else {
                            slot.word.tail.map_or("-".to_string(), |t| t.to_string())
                        };
                        let drain = slot.drain.waiter.map_or("-".to_string(), |w| w.to_string());
                        let _ = writeln!(
                            out,
                            "  {:>8} {:>6} {:>4} {:>8} {:>7} {:>14} {:>20}",
                            slot.lock.0,
                            home.to_string(),
                            slot.word.generation,
                            tail,
                            slot.word.shared,
                            drain,
                            format!("{}/{}", slot.fence.count, slot.fence.generation)
                        );
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "  {home}: table unreadable: {e}");
                }
            }
        }
        let _ = writeln!(out, "placement (membership words; the home serves, the others are fenced or unused):");
        let _ = writeln!(out, "  {:>8} {:>6} {:>6} {:>8}  candidates", "lock", "home", "epoch", "settled");
        for (lock, p) in self.placements() {
            let candidates: Vec<String> = p.candidates.iter().map(|c| c.to_string()).collect();
            let _ = writeln!(
                out,
                "  {:>8} {:>6} {:>6} {:>8}  {}",
                lock.0,
                p.home.to_string(),
                p.epoch,
                if p.settled { "yes" } else { "claiming" },
                candidates.join(" ")
            );
        }
        let _ = writeln!(out, "nodes (each node's own view, read one-sidedly):");
        for (n, state, view) in &self.nodes {
            match view {
                Ok(v) => {
                    let lease =
                        if v.lease_ms == 0 { "no lease".to_string() } else { format!("lease {} ms", v.lease_ms) };
                    let _ = writeln!(
                        out,
                        "  {n}: process {state:?}, incarnation {:#x}, heartbeat {}, {lease}",
                        v.incarnation, v.heartbeat
                    );
                    for e in &v.entries {
                        let peer = e.peer.map(|p| format!(" for {p}")).unwrap_or_default();
                        let age = now_ns.saturating_sub(e.since_ns) / 1_000_000;
                        let _ = writeln!(
                            out,
                            "    lock {:>8}: {:?}{peer} in generation {} for {age} ms ({} requests)",
                            e.lock.0, e.state, e.generation, e.requests
                        );
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "  {n}: process {state:?}, no lock manager readable: {e}");
                }
            }
        }
        out
    }
}

fn slot_json(slot: &SlotView) -> Value {
    json!({
        "lock": slot.lock.0, "generation": slot.word.generation, "tail": slot.word.tail.map(|t| t.0),
        "shared": slot.word.shared, "drain_waiter": slot.drain.waiter.map(|w| w.0),
        "drain_balance": slot.drain.balance, "fence_count": slot.fence.count,
        "fence_generation": slot.fence.generation, "fenced": slot.fenced,
        "home_epoch": slot.home.epoch, "home_named": slot.home.home.map(|h| h.0),
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

    fn sample_report() -> StatusReport {
        use crate::word::{DrainWord, FenceWord, LockWord};
        let slot = SlotView {
            lock: LockId(5),
            word: LockWord { generation: 2, tail: Some(NodeId(3)), shared: 1 },
            drain: DrainWord { generation: 2, waiter: None, balance: 0 },
            fence: FenceWord { count: 7, generation: 2 },
            home: crate::word::HomeWord::default(),
            fenced: false,
        };
        let entry = StatusEntry {
            lock: LockId(5),
            state: ClientState::Waiting { mode: LockMode::Exclusive },
            generation: 2,
            peer: Some(NodeId(3)),
            since_ns: 1_000_000,
            requests: 4,
        };
        let view = NodeStatus { node: NodeId(1), incarnation: 0xab, heartbeat: 9, lease_ms: 0, entries: vec![entry] };
        StatusReport {
            homes: vec![(NodeId(0), Ok(vec![slot])), (NodeId(2), Err("gone".into()))],
            nodes: vec![
                (NodeId(1), PeerState::Running, Ok(view)),
                (NodeId(3), PeerState::Gone, Err("no region".into())),
            ],
        }
    }

    #[test]
    fn the_report_renders_every_home_and_node_with_ages() {
        let text = sample_report().render(6_000_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "locks (home words, read one-sidedly):");
        let slot: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(slot, ["5", "node0", "2", "node3", "1", "-", "7/2"]);
        assert_eq!(lines[3], "  node2: table unreadable: gone");
        assert!(lines[4].starts_with("placement"), "{text}");
        let placement: Vec<&str> = lines[6].split_whitespace().collect();
        let candidates = candidates(LockId(5), &[NodeId(0), NodeId(2)]);
        let first = candidates[0].to_string();
        let second = candidates[1].to_string();
        assert_eq!(placement, ["5", first.as_str(), "0", "yes", first.as_str(), second.as_str()]);
        assert_eq!(lines[7], "nodes (each node's own view, read one-sidedly):");
        assert_eq!(lines[8], "  node1: process Running, incarnation 0xab, heartbeat 9, no lease");
        assert!(lines[9].ends_with(": Waiting { mode: Exclusive } for node3 in generation 2 for 5 ms (4 requests)"));
        assert_eq!(lines[10], "  node3: process Gone, no lock manager readable: no region");
        assert_eq!(lines.len(), 11);
    }

    /// Three servers whose membership words moved lock 5 to node 1 at epoch
    /// 2 (a majority: nodes 1 and 2; node 0 restarted and forgot): the
    /// placement names node 1, settled; with only node 1's word at epoch 2
    /// it is a claim under way.
    #[test]
    fn the_placement_is_the_highest_epoch_a_majority_names() {
        use crate::word::HomeWord;
        let mut report = sample_report();
        let Ok(slots) = &report.homes[0].1 else { panic!("sample home 0 has a table") };
        let slot = slots[0];
        let moved = HomeWord { epoch: 2, home: Some(NodeId(1)) };
        report.homes = vec![
            (NodeId(0), Ok(vec![slot])),
            (NodeId(1), Ok(vec![SlotView { home: moved, ..slot }])),
            (NodeId(2), Ok(vec![SlotView { home: moved, fenced: true, ..slot }])),
        ];
        let placements = report.placements();
        assert_eq!(placements.len(), 1);
        let (lock, p) = &placements[0];
        assert_eq!((*lock, p.home, p.epoch, p.settled), (LockId(5), NodeId(1), 2, true));
        assert_eq!(p.candidates, candidates(LockId(5), &[NodeId(0), NodeId(1), NodeId(2)]));
        let text = report.render(0);
        assert!(text.contains("fenced"), "{text}");
        assert_eq!(report.to_json()["placements"][0]["epoch"], 2);
        report.homes[2] = (NodeId(2), Ok(vec![slot]));
        assert!(!report.placements()[0].1.settled, "one word of three at epoch 2: a claim under way");
    }

    #[test]
    fn the_report_as_json_names_every_field() {
        let value = sample_report().to_json();
        assert_eq!(value["homes"][0]["locks"][0]["tail"], 3);
        assert_eq!(value["homes"][0]["locks"][0]["fence_count"], 7);
        assert_eq!(value["homes"][1]["error"], "gone");
        assert_eq!(value["nodes"][0]["locks"][0]["waits_for"], 3);
        assert_eq!(value["nodes"][0]["process"], "Running");
        assert_eq!(value["nodes"][1]["error"], "no region");
    }
}
