//! Metadata at and towards homes: holder updates (sent, or applied when
//! this node is the home), Cache Validate (a one-sided read of the home's
//! key table) and Cache Invalidate (an acknowledged purge, with its
//! fallback when the home does not answer).

use super::{lock, Sent, Shared, State};
use crate::counts::{MsgKind, Primitive};
use crate::model::CONTROL_BYTES;
use crate::service::home::{floor_offset, version_in_window, Add};
use crate::service::layout::{key_probe_start, KEYS_REGION, KEY_ENTRY_BYTES, PROBE_MAX};
use crate::service::wire::Msg;
use crate::{Key, Scheme};
use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;
use tierstack_fabric::{FabricError, Op, PeerState};

impl Shared {
    /// Sends a metadata update to `key`'s home, or applies it locally.
    pub(super) fn tell_home(&self, state: &mut State, key: Key, msg: Msg, sent: &mut Sent, charged: bool) {
        let home = self.home(key);
        let kind = match msg {
            Msg::AddHolder { .. } => MsgKind::AddHolder,
            Msg::RemoveHolder { .. } => MsgKind::RemoveHolder,
            Msg::Invalidate { .. } => MsgKind::Invalidate,
            _ => MsgKind::Transfer,
        };
        if home == self.me {
            self.apply_home(state, self.me, &msg);
            return;
        }
        if charged {
            sent.push((kind, CONTROL_BYTES, true));
        } else {
            state.stats.tally.record_consequential(kind, CONTROL_BYTES);
        }
        if !self.send(home, &msg) {
            state.stats.peer_failures += 1;
        }
    }

    /// Applies a holder update as `key`'s home. A refused add (full window)
    /// makes the adder drop its copy: at once if it is this node, else by a
    /// `Refused` message.
    pub(super) fn apply_home(&self, state: &mut State, from: usize, msg: &Msg) {
        let node = |n: usize| u32::try_from(n).ok();
        let Some(keys) = state.keys.as_mut() else { return };
        let (key, adder, outcome) = match *msg {
            Msg::AddHolder { key } => (key, Some(from), keys.update(key, None, node(from))),
            Msg::RemoveHolder { key } => (key, None, keys.update(key, node(from), None)),
            Msg::Transfer { key, remove, add } => (key, add.map(|n| n as usize), keys.update(key, remove, add)),
            _ => return,
        };
        state.stats.key_table_full = keys.refused;
        if outcome == Add::Refused {
            match adder {
                Some(n) if n == self.me => self.refused_copy(state, key),
                Some(n) if n < self.members.len() => {
                    state.stats.tally.record_consequential(MsgKind::DropCopy, CONTROL_BYTES);
                    if !self.send(n, &Msg::Refused { key }) {
                        state.stats.peer_failures += 1;
                    }
                }
                _ => {}
            }
        }
    }

    /// This node's copy of `key` was refused by its home: drop it (and
    /// unlist it, in case a later add of it was listed).
    pub(super) fn refused_copy(&self, state: &mut State, key: Key) {
        if self.drop_local(state, key) {
            state.stats.pool_refusals += 1;
            self.announce(state, Vec::new(), vec![key]);
            self.tell_home(state, key, Msg::RemoveHolder { key }, &mut Vec::new(), false);
        }
    }

    pub(super) fn validate(&self, key: Key) -> Option<u64> {
        let home = self.home(key);
        if home == self.me {
            // Our own table: no message.
            let mut state = lock(&self.state);
            state.stats.tally.record(Primitive::Validate, &[]);
            state.stats.validates_home_local += 1;
            return state.keys.as_ref().map(|k| k.version(key));
        }
        let capacity = self.config.key_table_entries;
        let start = key_probe_start(key, capacity);
        let len = PROBE_MAX * KEY_ENTRY_BYTES;
        {
            let mut state = lock(&self.state);
            state.stats.tally.record(Primitive::Validate, &[(MsgKind::HomeRead, len, true)]);
            state.stats.validates_home_remote += 1;
        }
        // The window and the start's floor (a key without an entry), in one
        // batch. `len` is 512 bytes: it fits a u32.
        let read = self.region(home, KEYS_REGION).and_then(|r| {
            r.post(vec![
                Op::Read { offset: start * KEY_ENTRY_BYTES, len: len as u32 },
                Op::Read { offset: floor_offset(capacity, start), len: 8 },
            ])
            .wait()
        });
        let found = read.and_then(|mut r| {
            let floor = r.pop().ok_or(FabricError::Closed)?.into_u64()?;
            let window = r.pop().ok_or(FabricError::Closed)?.into_bytes()?;
            Ok(version_in_window(&window, key).unwrap_or(floor))
        });
        match found {
            Ok(version) => Some(version),
            Err(_) => {
                let mut state = lock(&self.state);
                self.forget(home, &mut state);
                None
            }
        }
    }

    pub(super) fn invalidate(&self, key: Key) {
        if self.config.scheme == Scheme::Groupcache {
            // No cluster invalidation: the owner drops its copy (the only one).
            let owner = self.ring.owner(key);
            let mut state = lock(&self.state);
            if owner == self.me {
                self.drop_local(&mut state, key);
                state.stats.tally.record(Primitive::Invalidate, &[]);
            } else {
                if !self.send(owner, &Msg::DropCopy { key }) {
                    state.stats.peer_failures += 1;
                }
                state.stats.tally.record(Primitive::Invalidate, &[(MsgKind::DropCopy, CONTROL_BYTES, true)]);
            }
            return;
        }
        let mut sent: Sent = Vec::new();
        // Twice at most: a home found dead while we waited is taken over by
        // its successor, which gets the purge too (it may list copies stored
        // since the takeover).
        for _attempt in 0..2 {
            let home = self.home(key);
            if home == self.me {
                let mut state = lock(&self.state);
                self.home_invalidate(&mut state, key);
                break;
            }
            sent.push((MsgKind::Invalidate, CONTROL_BYTES, true));
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = sync_channel(1);
            lock(&self.acks).insert(id, tx);
            let ok = self.send(home, &Msg::Purge { id, key });
            let ack = self.wait_answer(ok, &rx);
            lock(&self.acks).remove(&id);
            if ack.is_some() {
                break;
            }
            // Unconfirmed: the home may have died with the purge unread, or
            // be stopped. Every member drops its copy (the home's version
            // cannot move; a dead home's keys move to a successor whose
            // versions no earlier copy matches).
            lock(&self.state).stats.purges_unconfirmed += 1;
            self.broadcast_drop(key, &mut sent);
            if self.fabric.peer_state(self.members[home]) != PeerState::Gone {
                break;
            }
            self.declare(home, false);
        }
        lock(&self.state).stats.tally.record(Primitive::Invalidate, &sent);
    }

    /// Every member (this node too) drops its copy of `key`.
    pub(super) fn broadcast_drop(&self, key: Key, sent: &mut Sent) {
        let mut state = lock(&self.state);
        if self.drop_local(&mut state, key) {
            self.announce(&mut state, Vec::new(), vec![key]);
        }
        for n in (0..self.members.len()).filter(|&n| n != self.me) {
            sent.push((MsgKind::DropCopy, CONTROL_BYTES, false));
            if !self.send(n, &Msg::DropCopy { key }) {
                state.stats.peer_failures += 1;
            }
        }
    }

    /// Waits for a peer's answer on `rx` (if the request went out),
    /// bounded by `ack_timeout`; counts the stall.
    pub(super) fn wait_answer(&self, sent: bool, rx: &std::sync::mpsc::Receiver<(u32, u32)>) -> Option<(u32, u32)> {
        if !sent {
            return None;
        }
        let answer = rx.recv_timeout(self.config.ack_timeout).ok();
        let mut state = lock(&self.state);
        state.stats.stalls += 1;
        if answer.is_none() {
            state.stats.stall_timeouts += 1;
        }
        answer
    }

    pub(super) fn home_invalidate(&self, state: &mut State, key: Key) {
        let Some(keys) = state.keys.as_mut() else { return };
        let holders = keys.invalidate(key);
        for n in (0..64usize).filter(|n| holders & (1u64 << n) != 0) {
            if n == self.me {
                if self.drop_local(state, key) {
                    self.announce(state, Vec::new(), vec![key]);
                }
            } else if n < self.members.len() {
                state.stats.tally.record_consequential(MsgKind::DropCopy, CONTROL_BYTES);
                if !self.send(n, &Msg::DropCopy { key }) {
                    state.stats.peer_failures += 1;
                }
            }
        }
    }
}
