//! Re-homing: a lock whose home died moves to the next live candidate for
//! a new **home epoch**, claimed by compare-and-swap on the lock's
//! membership word ([`crate::word::HomeWord`]) at a majority of the lock
//! servers. The design, and what it does not guarantee:
//! `docs/internals/dlm-rehoming.md`.
//!
//! This file holds the fabric-facing half: reading a lock's view, claiming,
//! and preparing a move (fencing the lock's other slots, raising the new
//! home's fence). The move itself is the protocol machine's
//! ([`crate::proto::Input::Rehome`]), and what a node does with a notice of
//! a newer home is the queue scheme's.

use super::node::{Core, Slot};
use crate::error::LockError;
use crate::table::{candidates, HomeMemory};
use crate::word::{fence_seed, FenceWord, HomeWord, LockWord, FENCE_OFFSET, HOME_OFFSET, LOCK_OFFSET};
use crate::LockId;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;

/// How many view-and-claim rounds one locate makes before it gives up (each
/// failed round means another node's claim got in between).
const LOCATE_ROUNDS_MAX: usize = 16;
/// Pause between such rounds, so competing claimers do not spin in step.
const LOCATE_BACKOFF: Duration = Duration::from_millis(2);

/// One lock server's membership word for a lock, read or written.
struct Member {
    memory: Arc<HomeMemory>,
    /// The lock's slot at that server, if it exists.
    base: Option<u64>,
    word: HomeWord,
}

/// A node's view of a lock: the highest home epoch it read, and whether a
/// majority of servers name the same home for it (settled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct View {
    pub(super) epoch: u32,
    pub(super) home: NodeId,
    pub(super) settled: bool,
    /// Every word read at `epoch` names `home` (settled or not).
    pub(super) one_home: bool,
}

impl Core {
    /// Re-homing is on: with recovery, and at least three lock servers (a
    /// claim needs a majority, so with fewer the loss of one would leave
    /// none). Every scheme: SRSL's server is its home (its queue is
    /// rebuilt from the clients' reports, `srsl_scheme.rs`).
    pub(super) fn rehoming(&self) -> bool {
        self.config.recovery && self.config.lock_servers.len() >= REHOMING_SERVERS_MIN
    }

    fn majority(&self) -> usize {
        self.config.lock_servers.len() / 2 + 1
    }

    /// Reads `id`'s membership word at every server that answers (with
    /// `create`, claiming the lock's slot where it is missing).
    fn members(&self, id: LockId, create: bool) -> Vec<Member> {
        let mut members = Vec::new();
        for &server in &self.config.lock_servers {
            let Ok((memory, _)) = self.home(id, server) else { continue };
            let found = if create { memory.claim(id, fence_seed(unix_ms())) } else { memory.lookup(id) };
            let base = match found {
                Ok(base) => base,
                Err(_) => {
                    self.forget_home(server, &memory);
                    continue;
                }
            };
            let word = match base.map(|b| memory.read_u64(b + HOME_OFFSET)) {
                None => HomeWord::default(),
                Some(Ok(bits)) => HomeWord::decode(bits),
                Some(Err(_)) => continue,
            };
            members.push(Member { memory, base, word });
        }
        members
    }

    /// `create_lock` with re-homing: the lock's slot at every server that
    /// answers (its membership word there starts at zero: epoch 0, the first
    /// candidate). No majority is needed (servers start one by one); a
    /// server that was down creates its slot when it comes up or when a
    /// claim needs it.
    pub(super) fn create_everywhere(&self, id: LockId) -> Result<(), LockError> {
        let mut last = None;
        let mut created = 0;
        for &server in &self.config.lock_servers {
            let result = self.home(id, server).and_then(|(memory, _)| {
                memory
                    .claim(id, fence_seed(unix_ms()))
                    .map_err(|e| LockError::from_fabric(id, server, e))?
                    .ok_or(LockError::TableFull { home: server, slots: memory.slots() })
            });
            match result {
                Ok(_) => created += 1,
                Err(e @ LockError::TableFull { .. }) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        match (created, last) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// The view from `members`: the highest epoch, its home (the first
    /// candidate for epoch 0), and whether a majority of all servers name it.
    fn view_of(&self, id: LockId, members: &[Member]) -> Option<View> {
        let top = members.iter().map(|m| m.word.epoch).max()?;
        let first = candidates(id, &self.config.lock_servers).first().copied()?;
        let home_of = |w: &HomeWord| w.home.unwrap_or(first);
        let at_top: Vec<NodeId> = members.iter().filter(|m| m.word.epoch == top).map(|m| home_of(&m.word)).collect();
        let home = at_top.first().copied().unwrap_or(first);
        let settled = at_top.iter().filter(|h| **h == home).count() >= self.majority();
        let one_home = at_top.iter().all(|h| *h == home);
        Some(View { epoch: top, home, settled, one_home })
    }

    /// `id`'s current view, from a majority of servers.
    pub(super) fn view(&self, id: LockId) -> Result<View, LockError> {
        let members = self.members(id, false);
        self.view_of(id, &members).filter(|_| members.len() >= self.majority()).ok_or(LockError::NoQuorum {
            lock: id,
            reached: members.len(),
            needed: self.majority(),
        })
    }

    /// Where `id` lives now (see [`super::Placement`]).
    pub(super) fn placement(&self, id: LockId) -> Result<super::Placement, LockError> {
        let candidates = candidates(id, &self.config.lock_servers);
        if !self.rehoming() {
            let home = *candidates.first().ok_or_else(|| LockError::Config("no lock servers".into()))?;
            return Ok(super::Placement { home, epoch: 0, candidates, settled: true });
        }
        let view = self.view(id)?;
        Ok(super::Placement { home: view.home, epoch: view.epoch, candidates, settled: view.settled })
    }

    /// `locate` with re-homing: the slot at the home of the lock's settled
    /// view, claiming the home role for the next live candidate when that
    /// home is lost (or for the view's own home when no home is settled).
    /// A slot whose lock word is fenced comes back with `needs_move`.
    pub(super) fn locate_rehoming(&self, id: LockId, create: bool) -> Result<(Slot, bool), LockError> {
        let mut last = None;
        for round in 0..LOCATE_ROUNDS_MAX {
            if round > 0 {
                std::thread::sleep(LOCATE_BACKOFF); // back-off between competing claims, not a synchronization
            }
            let members = self.members(id, create);
            let Some(view) = self.view_of(id, &members).filter(|_| members.len() >= self.majority()) else {
                return Err(LockError::NoQuorum { lock: id, reached: members.len(), needed: self.majority() });
            };
            if let Some(reason) = self.server_lost(view.home) {
                tracing::warn!(node = %self.me, lock = %id, home = %view.home, epoch = view.epoch, %reason, "the lock's home is lost: claiming the next candidate");
                last = Some(LockError::PeerDead { lock: id, node: view.home, reason });
                let next = self.next_live_candidate(id, view.home);
                match next {
                    Some(next) => self.claim(id, view.epoch, next, &members)?,
                    None => return Err(last.unwrap_or(LockError::NoQuorum { lock: id, reached: 0, needed: 1 })),
                }
                continue;
            }
            if !view.settled && view.epoch > 0 && view.one_home {
                // A claim that has not reached its majority (yet, or it
                // raced a claim read before it): help it there. Claiming the
                // next epoch for the same home instead moves the home's slot
                // again under cells of the epoch it already serves, which do
                // not know (model_check_rehome found a node enqueued twice).
                self.help_claim(id, view.epoch, view.home, &members);
                continue;
            }
            if !view.settled {
                self.claim(id, view.epoch, view.home, &members)?;
                continue;
            }
            let slot = self.slot_at(id, view.home, view.epoch, create || view.epoch > 0)?;
            let word =
                slot.home.read_u64(slot.base + LOCK_OFFSET).map_err(|e| LockError::from_fabric(id, view.home, e))?;
            return Ok((slot, LockWord::is_fenced(word)));
        }
        Err(last.unwrap_or(LockError::NoQuorum { lock: id, reached: 0, needed: self.majority() }))
    }

    /// The first candidate after `home` (round the ring) that is not lost.
    fn next_live_candidate(&self, id: LockId, home: NodeId) -> Option<NodeId> {
        let ring = candidates(id, &self.config.lock_servers);
        let at = ring.iter().position(|n| *n == home).unwrap_or(0);
        (1..ring.len()).map(|k| ring[(at + k) % ring.len()]).find(|&n| self.server_lost(n).is_none())
    }

    /// Whether lock server `node` is lost *now*: [`Core::lost`], except that
    /// a report of an ended incarnation (through a handle of one this node
    /// talked to) is looked at again through a fresh handle, since a server
    /// that restarted is a live candidate again.
    fn server_lost(&self, node: NodeId) -> Option<String> {
        let reason = self.lost(node)?;
        if self.running_incarnation(node).is_some() && self.lost(node).is_none() {
            return None;
        }
        Some(reason)
    }

    /// Claims epoch `seen + 1` for `candidate`: fences the candidate's slot
    /// (nobody is granted there before the move), then compare-and-swaps
    /// the membership word at every server read. Whether it won shows in
    /// the next view; a claim that lost did no harm (its fence is lifted by
    /// whoever moves the winner's slot, or by a later claim for it).
    fn claim(&self, id: LockId, seen: u32, candidate: NodeId, members: &[Member]) -> Result<(), LockError> {
        let (memory, _) = self.home(id, candidate)?;
        let base = memory
            .claim(id, fence_seed(unix_ms()))
            .map_err(|e| LockError::from_fabric(id, candidate, e))?
            .ok_or(LockError::TableFull { home: candidate, slots: memory.slots() })?;
        memory.fence_lock(candidate, base).map_err(|e| LockError::from_fabric(id, candidate, e))?;
        let new = HomeWord { epoch: seen.wrapping_add(1), home: Some(candidate) }.encode();
        let mut agreed = 0;
        for member in members {
            let Some(at) = member.base else { continue };
            if member.word.epoch > seen {
                continue;
            }
            match member.memory.compare_swap(at + HOME_OFFSET, member.word.encode(), new) {
                Ok(previous) if previous == member.word.encode() || previous == new => agreed += 1,
                _ => {}
            }
        }
        tracing::warn!(node = %self.me, lock = %id, %candidate, epoch = seen.wrapping_add(1), agreed, "claimed a lock's home role");
        Ok(())
    }

    /// Helps the claim of `epoch` for `home`, the only home named at that
    /// epoch, to its majority: every word read below `epoch` is swapped to
    /// it. Nothing is fenced: that claim's claimer fenced `home`'s slot
    /// before it swapped a word. Still one home per epoch: a word passes
    /// through `epoch` once, and only the claim itself and its helpers
    /// write it.
    fn help_claim(&self, id: LockId, epoch: u32, home: NodeId, members: &[Member]) {
        let new = HomeWord { epoch, home: Some(home) }.encode();
        let mut helped = 0;
        for member in members.iter().filter(|m| m.word.epoch < epoch) {
            let Some(at) = member.base else { continue };
            let expected = member.word.encode();
            if member.memory.compare_swap(at + HOME_OFFSET, expected, new).is_ok_and(|p| p == expected) {
                helped += 1;
            }
        }
        tracing::info!(node = %self.me, lock = %id, %home, epoch, helped, "helped a lock's home claim to its majority");
    }

    /// Before the move that makes `slot` the lock's home: checks the view
    /// still names it, fences the lock's slot at every other server that
    /// answers (a stale mapping of a dead home then grants nothing), and
    /// raises the slot's fence word above every fence word read there and
    /// above the creation-time seed. Returns the slot's fenced lock word,
    /// which the move starts from; `None` if the view moved on or the slot
    /// was moved already (the caller locates the lock again).
    pub(super) fn prepare_move(&self, id: LockId, slot: &Slot) -> Result<Option<u64>, LockError> {
        let view = self.view(id)?;
        if !view.settled || view.home != slot.home_node || view.epoch != slot.home_epoch {
            return Ok(None);
        }
        let mut count = FenceWord::decode(fence_seed(unix_ms())).count;
        for &server in self.config.lock_servers.iter().filter(|s| **s != slot.home_node) {
            let Ok((memory, _)) = self.home(id, server) else { continue };
            let Ok(Some(base)) = memory.lookup(id) else { continue };
            if memory.fence_lock(server, base).is_err() {
                continue;
            }
            if let Ok(fence) = memory.read_u64(base + FENCE_OFFSET) {
                count = count.max(FenceWord::decode(fence).count.saturating_add(1));
            }
        }
        let fabric_err = |e| LockError::from_fabric(id, slot.home_node, e);
        slot.home.raise_fence(slot.home_node, slot.base, count).map_err(fabric_err)?;
        let word = slot.home.read_u64(slot.base + LOCK_OFFSET).map_err(fabric_err)?;
        Ok(LockWord::is_fenced(word).then_some(word))
    }
}

/// Fewest lock servers with which re-homing is on (a majority survives one loss).
pub const REHOMING_SERVERS_MIN: usize = 3;

fn unix_ms() -> u64 {
    tierstack_base::time::system_now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
