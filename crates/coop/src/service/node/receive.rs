//! The receiver thread: every message a node handles (home updates,
//! invalidations, announces, STOREs and their acknowledgments).

use super::locks::Staging;
use super::{lock, Loc, Sent, Shared, State};
use crate::placement::{plan_receive, Room};
use crate::pool::pages_for;
use crate::service::wire::{Item, Msg, UNCHECKED};
use crate::Key;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;
use tierstack_fabric::{Channel, FabricError};

impl Shared {
    /// The receiver thread: handles every message but STOREs, which go to
    /// the store worker (placing an item may wait for homes' answers, which
    /// this thread delivers).
    pub(super) fn receive_loop(&self, stores: Sender<(usize, Msg)>) {
        let inbox = self.fabric.inbox(Channel::COOP_CACHE);
        while !self.stop.load(Ordering::SeqCst) {
            match inbox.recv_timeout(Duration::from_millis(20)) {
                Ok(message) => {
                    let from = self.members.iter().position(|&n| n == message.from);
                    match (from, Msg::decode(&message.payload)) {
                        (Some(from), Ok(msg @ Msg::Store { .. })) => {
                            // Counted as handled by the worker, once placed.
                            if stores.send((from, msg)).is_err() {
                                self.handled.fetch_add(1, Ordering::SeqCst);
                            }
                            continue;
                        }
                        (Some(from), Ok(msg)) => self.handle(from, msg),
                        (Some(_), Err(_)) => lock(&self.state).stats.malformed += 1,
                        (None, _) => {}
                    }
                    self.handled.fetch_add(1, Ordering::SeqCst);
                }
                Err(FabricError::RecvTimeout { .. }) => {}
                Err(_) => break,
            }
        }
    }

    /// The store worker: STOREs one at a time, until the receiver stops.
    pub(super) fn store_loop(&self, stores: Receiver<(usize, Msg)>) {
        while let Ok((from, msg)) = stores.recv() {
            if let Msg::Store { id, swap_for, items } = msg {
                self.receive_store(from, id, swap_for, items);
            }
            self.handled.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn handle(&self, from: usize, msg: Msg) {
        match msg {
            Msg::AddHolder { .. } | Msg::RemoveHolder { .. } | Msg::Transfer { .. } => {
                let mut state = lock(&self.state);
                self.apply_home(&mut state, from, &msg);
            }
            Msg::Invalidate { key } => {
                let mut state = lock(&self.state);
                self.home_invalidate(&mut state, key);
            }
            Msg::Purge { id, key } => {
                {
                    let mut state = lock(&self.state);
                    self.home_invalidate(&mut state, key);
                }
                // Acknowledged after every DropCopy went out.
                if !self.send(from, &Msg::PurgeAck { id }) {
                    lock(&self.state).stats.peer_failures += 1;
                }
            }
            Msg::PurgeAck { id } => {
                if let Some(tx) = lock(&self.acks).remove(&id) {
                    let _ = tx.try_send((1, 0));
                }
            }
            Msg::Refused { key } => {
                let mut state = lock(&self.state);
                self.refused_copy(&mut state, key);
            }
            Msg::Joined { incarnation } => self.joined(from, incarnation),
            Msg::DropCopy { key } => {
                let mut state = lock(&self.state);
                if self.drop_local(&mut state, key) {
                    self.announce(&mut state, Vec::new(), vec![key]);
                }
            }
            Msg::RemoveIfShared { id, key } => {
                let granted = {
                    let mut state = lock(&self.state);
                    let node = u32::try_from(from).unwrap_or(u32::MAX);
                    state.keys.as_mut().is_some_and(|k| k.remove_if_shared(key, node))
                };
                if !self.send(from, &Msg::RemoveReply { id, granted }) {
                    lock(&self.state).stats.peer_failures += 1;
                }
            }
            Msg::RemoveReply { id, granted } => {
                if let Some(tx) = lock(&self.acks).remove(&id) {
                    let _ = tx.try_send((u32::from(granted), 0));
                }
            }
            Msg::StoreAck { id, placed, reads } => {
                if let Some(tx) = lock(&self.acks).remove(&id) {
                    let _ = tx.try_send((placed, reads));
                }
            }
            Msg::Announce { free_pages, held, dropped } => {
                let mut state = lock(&self.state);
                if let Some(f) = state.free.get_mut(from) {
                    *f = free_pages;
                }
                for h in held {
                    let loc = Loc { seq: h.seq, bytes: h.bytes, version: h.version, pages: h.pages };
                    state.replica.entry(h.key).or_default().insert(from, loc);
                }
                for k in dropped {
                    if let Some(h) = state.replica.get_mut(&k) {
                        h.remove(&from);
                        if h.is_empty() {
                            state.replica.remove(&k);
                        }
                    }
                }
            }
            Msg::Store { id, swap_for, items } => self.receive_store(from, id, swap_for, items),
            Msg::GroupGet { id, key } => {
                let found = self.group_serve(key);
                if !self.send(from, &Msg::GroupReply { id, found }) {
                    lock(&self.state).stats.peer_failures += 1;
                }
            }
            Msg::GroupReply { id, found } => {
                if let Some(tx) = lock(&self.replies).remove(&id) {
                    let _ = tx.try_send(found);
                }
            }
            Msg::GroupPut { key, version, body } => {
                if self.config.scheme == crate::Scheme::Groupcache && self.ring.owner(key) == self.me {
                    self.store(key, version, &body);
                }
            }
        }
    }

    /// A STORE: place each item by this node's own priority (never
    /// forwarding), read it from the sender's pool, report to the homes
    /// (consequential), acknowledge.
    fn receive_store(&self, from: usize, id: u64, swap_for: Option<Key>, items: Vec<Item>) {
        let mut state = lock(&self.state);
        let mut sent: Sent = Vec::new();
        let (mut placed, mut reads) = (0u32, 0u32);
        let mut held = Vec::new();
        let mut dropped = Vec::new();
        let from_u32 = u32::try_from(from).ok();
        let me_u32 = u32::try_from(self.me).ok();
        if let Some(k) = swap_for {
            // The sender now holds k: our copy is redundant. (Its announce
            // follows; until then a placeholder that no read can match.) The
            // home learns it first, so that our copy's eviction, asked at
            // the home, is granted.
            state
                .replica
                .entry(k)
                .or_default()
                .insert(from, Loc { seq: u64::MAX, bytes: 0, version: 0, pages: Vec::new() });
            self.tell_home(&mut state, k, Msg::Transfer { key: k, remove: None, add: from_u32 }, &mut sent, false);
        }
        for it in items {
            let (mode, _) = self.config.scheme.mode_for(it.bytes);
            let need = pages_for(it.bytes);
            if state.cache.contains(it.key) || it.pages.len() as u32 != need {
                continue;
            }
            // Read only what there is room for (as planned now)...
            let room = {
                let st: &State = &state;
                plan_receive(mode, &st.cache, need, it.key, &|k| Self::is_redundant(st, k))
            };
            if room.is_none() {
                continue;
            }
            // ...into a staging area, with the state lock released (a
            // sender stopped mid-read stalls this STORE only).
            let Some(area) = self.staging.take(Staging::Fetch) else { continue };
            let first = self.layout.fetch_staging(area.slot);
            let staging: Vec<u32> = (0..need).map(|i| first + i).collect();
            reads += 1;
            let check = it.pages.first().filter(|_| it.seq != UNCHECKED).map(|&slot| (slot, it.seq));
            drop(state);
            let outcome = self.read_remote(from, &it.pages, &staging, it.bytes, check);
            state = lock(&self.state);
            match outcome {
                Ok(true) => {}
                Ok(false) => {
                    // Evicted at the sender while we read: refuse the bytes.
                    state.stats.stale_reads += 1;
                    continue;
                }
                Err(_) => {
                    self.forget(from, &mut state);
                    continue;
                }
            }
            // Then placed by this node's own priority, planned again.
            let mut placed_here = None;
            for _round in 0..super::PLAN_ROUNDS_MAX {
                let room = {
                    let st: &State = &state;
                    plan_receive(mode, &st.cache, need, it.key, &|k| Self::is_redundant(st, k))
                };
                let Some(room) = room else { break };
                let victims = match &room {
                    Room::Free => Vec::new(),
                    Room::Redundant(v) | Room::Evict(v) => v.clone(),
                };
                let (s, cleared) = self.clear_room(state, &victims, &mut sent, false, &mut dropped);
                state = s;
                if cleared {
                    if !state.cache.contains(it.key) {
                        placed_here = state.cache.insert(it.key, it.bytes, it.version).ok().map(|e| e.pages.clone());
                    }
                    break;
                }
            }
            let Some(pages) = placed_here else { continue };
            self.write_body(&pages, &self.read_body(&staging, it.bytes));
            drop(area);
            placed += 1;
            held.extend(self.publish(&mut state, it.key));
            let remove = if swap_for.is_some() { from_u32 } else { None };
            self.tell_home(&mut state, it.key, Msg::Transfer { key: it.key, remove, add: me_u32 }, &mut sent, false);
        }
        self.announce(&mut state, held, dropped);
        drop(state);
        let _ = self.send(from, &Msg::StoreAck { id, placed, reads });
    }
}
