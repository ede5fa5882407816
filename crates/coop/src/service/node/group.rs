//! Groupcache's two-sided path: a non-owner asks the owner by message and
//! sends it the bodies it loads; the owner answers from its own pool.

use super::{lock, Lookup, Sent, Shared};
use crate::counts::{MsgKind, Primitive};
use crate::model::CONTROL_BYTES;
use crate::pool::cacheable;
use crate::service::wire::Msg;
use crate::Key;
use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;
use tierstack_fabric::PeerState;

impl Shared {
    /// Groupcache at a non-owner: a two-sided GET to the owner, answered by
    /// its receiver thread from its pool; a silent owner is a miss.
    pub(super) fn group_get(&self, key: Key, owner: usize) -> Lookup {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.replies).insert(id, tx);
        let ok = self.send(owner, &Msg::GroupGet { id, key });
        let reply = if ok { rx.recv_timeout(self.config.ack_timeout).ok() } else { None };
        lock(&self.replies).remove(&id);
        let mut state = lock(&self.state);
        if ok {
            state.stats.stalls += 1;
            state.stats.stall_timeouts += u64::from(reply.is_none());
        }
        let mut sent: Sent = vec![(MsgKind::GroupGet, CONTROL_BYTES, true)];
        let lookup = match reply {
            None => {
                state.stats.peer_failures += 1;
                if self.fabric.peer_state(self.members[owner]) == PeerState::Gone {
                    lock(&self.regions).retain(|(n, _), _| *n != owner);
                }
                state.stats.misses += 1;
                Lookup::Miss
            }
            Some(None) => {
                sent.push((MsgKind::GroupReply, 0, true));
                state.stats.misses += 1;
                Lookup::Miss
            }
            Some(Some((version, body))) => {
                sent.push((MsgKind::GroupReply, body.len() as u64, true));
                state.stats.remote_hits += 1;
                Lookup::Remote { body, version, holder: self.members[owner] }
            }
        };
        state.stats.tally.record(Primitive::Fetch, &sent);
        lookup
    }

    /// Groupcache at a non-owner after a miss: the body goes to the owner
    /// (one message, not waited for); nothing is kept here.
    pub(super) fn group_put(&self, key: Key, owner: usize, version: u64, body: &[u8]) {
        if !cacheable(body.len() as u64) {
            return;
        }
        let ok = self.send(owner, &Msg::GroupPut { key, version, body: body.to_vec() });
        let mut state = lock(&self.state);
        if !ok {
            state.stats.peer_failures += 1;
        }
        state.stats.tally.record(Primitive::Store, &[(MsgKind::GroupPut, body.len() as u64, true)]);
    }

    /// Groupcache's owner side: `key`'s version and bytes if held here.
    pub(super) fn group_serve(&self, key: Key) -> Option<(u64, Vec<u8>)> {
        let mut state = lock(&self.state);
        if state.pending.contains(&key) || !state.cache.touch(key) {
            return None;
        }
        let e = state.cache.get(key)?;
        Some((e.version, self.read_body(&e.pages, e.bytes)))
    }
}
