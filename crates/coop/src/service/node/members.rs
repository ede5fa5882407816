//! Membership: which homes are alive, and what changes when one dies or
//! comes back.
//!
//! Every `liveness_interval` the `coop-members` thread asks the fabric for
//! each member's peer state (shm: the peer's process; tcp: a connect probe,
//! bounded). A member seen `Gone` is declared dead; one declared dead and
//! seen running again, or one that says `Joined` (a restarted node says so
//! at start), is alive again with an empty key table. Homes are the ring
//! successors among the live members (`Homes::home_among`), so a change
//! moves only the keys of the node that changed.
//!
//! **What a change does.** A copy whose home changed is dropped, not
//! re-announced to the new home: the new home does not know the versions
//! the old one handed out nor the purges it applied or lost, so a copy
//! re-listed there could be one a purge had meant to reach. Dropped, the
//! key misses everywhere until a node stores it again, and that store is
//! listed at the new home under the new home's versions. A home frees the
//! entries of keys that are no longer its own (their holders drop them).
//! While nodes learn of a change at different moments, a request is a miss
//! or a copy its (old or new) home validates, never an error.
//!
//! A peer whose inbox stayed full is also tracked here: announces to it
//! are paused for a back-off after a failed send (`pause_announces`).

use super::{lock, Shared};
use crate::service::wire::Msg;
use crate::Key;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_fabric::PeerState;

impl Shared {
    /// The `coop-members` thread: polls every member's peer state.
    pub(super) fn membership_loop(&self) {
        let step = std::time::Duration::from_millis(10).min(self.config.liveness_interval);
        let mut next = tierstack_base::time::instant_now();
        while !self.stop.load(Ordering::SeqCst) {
            let now = tierstack_base::time::instant_now();
            if now < next {
                // Short steps, so a dropped node's thread ends promptly.
                std::thread::sleep(step.min(next - now));
                continue;
            }
            next = now + self.config.liveness_interval;
            for node in (0..self.members.len().min(64)).filter(|&n| n != self.me) {
                let dead = self.is_dead(node);
                match self.fabric.peer_state(self.members[node]) {
                    // Only a member once seen running can die: one that has
                    // not started yet is not taken over.
                    PeerState::Gone if !dead && self.seen(node) => self.declare(node, false),
                    PeerState::Running => {
                        self.seen_alive.fetch_or(1u64 << node, Ordering::SeqCst);
                        if dead {
                            self.declare(node, true);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn seen(&self, node: usize) -> bool {
        self.seen_alive.load(Ordering::SeqCst) & (1u64 << node) != 0
    }

    pub(super) fn is_dead(&self, node: usize) -> bool {
        node < 64 && self.dead.load(Ordering::SeqCst) & (1u64 << node) != 0
    }

    /// Tells every member that this node starts with an empty key table.
    pub(super) fn announce_joined(&self) {
        for n in (0..self.members.len()).filter(|&n| n != self.me) {
            let _ = self.send(n, &Msg::Joined { incarnation: self.incarnation });
        }
    }

    /// `node` started as `incarnation`. Alive; and if an earlier
    /// incarnation was known, the copies of the keys it homes are dropped
    /// (their listing died with its old table).
    pub(super) fn joined(&self, node: usize, incarnation: u64) {
        if node < 64 {
            self.seen_alive.fetch_or(1u64 << node, Ordering::SeqCst);
        }
        if self.is_dead(node) {
            self.declare(node, true);
        }
        let previous = lock(&self.incarnations).insert(node, incarnation);
        if previous.is_none_or(|p| p == incarnation) {
            return;
        }
        let mut state = lock(&self.state);
        state.stats.takeovers += 1;
        let live = !self.dead.load(Ordering::SeqCst);
        let stale: Vec<Key> =
            state.cache.keys().filter(|&k| self.homes.home_among(k, live) == node && node != self.me).collect();
        self.drop_for_takeover(&mut state, stale);
    }

    /// Declares `node` dead (`alive` false) or alive again, and applies the
    /// change: copies whose home moved are dropped, entries this node no
    /// longer homes are freed, a dead node's records leave the replica.
    pub(super) fn declare(&self, node: usize, alive: bool) {
        if node >= 64 || node == self.me {
            return;
        }
        let mut state = lock(&self.state);
        let before = !self.dead.load(Ordering::SeqCst);
        if (before & (1u64 << node) != 0) == alive {
            return; // Another thread declared it first.
        }
        let after = if alive { before | (1u64 << node) } else { before & !(1u64 << node) };
        // Under the state lock: the request path reads homes under it too.
        self.dead.store(!after, Ordering::SeqCst);
        state.stats.takeovers += 1;
        tracing::info!(node, alive, "cooperative cache: membership changed; homes moved to ring successors");
        let moved: Vec<Key> = state
            .cache
            .keys()
            .filter(|&k| self.homes.home_among(k, before) != self.homes.home_among(k, after))
            .collect();
        self.drop_for_takeover(&mut state, moved);
        let me = self.me;
        if let Some(keys) = state.keys.as_mut() {
            keys.forget_where(|k| self.homes.home_among(k, after) != me);
        }
        if !alive {
            for holders in state.replica.values_mut() {
                holders.remove(&node);
            }
            state.replica.retain(|_, h| !h.is_empty());
            if let Some(f) = state.free.get_mut(node) {
                *f = 0;
            }
            lock(&self.regions).retain(|(n, _), _| *n != node);
        }
    }

    fn drop_for_takeover(&self, state: &mut super::State, keys: Vec<Key>) {
        let mut dropped = Vec::new();
        for k in keys {
            if self.drop_local(state, k) {
                state.stats.takeover_drops += 1;
                dropped.push(k);
            }
        }
        self.announce(state, Vec::new(), dropped);
    }

    pub(super) fn announces_paused(&self, node: usize) -> bool {
        lock(&self.paused).get(&node).is_some_and(|&(until, _)| instant_now() < until)
    }

    /// Skips `node`'s announces for a while: 1 s after the first failed
    /// send, doubling while they keep failing, at most 30 s.
    pub(super) fn pause_announces(&self, node: usize) {
        let mut paused = lock(&self.paused);
        let backoff = paused.get(&node).map_or(Duration::from_secs(1), |&(_, b)| (b * 2).min(Duration::from_secs(30)));
        paused.insert(node, (instant_now() + backoff, backoff));
    }
}
