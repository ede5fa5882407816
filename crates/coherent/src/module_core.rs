//! The application module's bookkeeping above Table 1. Pure: events in,
//! grants out.
//!
//! Table 1 governs one document (here: one dependency key, named by its
//! version-table slot). A request may cover several keys; it acquires them
//! one at a time in ascending slot order, each through that key's Table 1
//! machine, and is granted when it holds all of them. Ascending order makes
//! the waits-for relation acyclic, so multi-key requests cannot deadlock.
//!
//! Table 1 declares a second UPDATE_REQUEST while an update is queued an
//! erroneous state (the paper has one update thread). Several updaters are
//! normal for us, so an update that finds another one queued on a key waits
//! in that key's admission queue and is submitted when the earlier update is
//! done (after the readers that queued behind it were granted, so neither
//! side starves).
//!
//! A request whose client went away before its grant is *abandoned*: it
//! stays queued and is released the moment it is granted, so nothing behind
//! it waits forever.
//!
//! A granted request may hold its keys for at most the *grant lifetime*
//! (`set_grant_lifetime`); [`ModuleCore::revoke_expired`] takes it back from
//! a holder that outlived it (an application server stopped with SIGSTOP, or
//! hung, keeps its connection open, so closing cannot release it), as if it
//! had sent its DONE, and the requests behind it proceed. A revoked request
//! is forgotten, so its late DONE is refused as unknown. Time is passed in
//! (`observe_time`, `revoke_expired`), never read: the core stays pure.
//!
//! A **test-only** switch ([`ModuleCore::set_test_only_admit_reads_during_updates`])
//! breaks Table 1 on purpose: reads are granted at once, bypassing every
//! key's queues, even while an update holds the key. It exists so the
//! end-to-end checkers can show they catch a module that lets reads overlap
//! updates; nothing but tests and the hidden `app-module` flag sets it.

use crate::table1::{DocumentQueues, Ipc, Proceed, RequestId, Table1Error};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// What a request wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Update,
}

/// A request now holds every key it asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub id: RequestId,
    pub kind: Kind,
    /// The request's keys, ascending.
    pub slots: Vec<u32>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error("request {0} already exists")]
    DuplicateRequest(RequestId),
    #[error("request {0} names no keys")]
    NoKeys(RequestId),
    #[error("request {0} is not known")]
    UnknownRequest(RequestId),
    #[error("request {0} has not been granted yet")]
    NotGranted(RequestId),
    #[error("protocol violation: {0}")]
    Table1(#[from] Table1Error),
}

#[derive(Default)]
struct KeyState {
    queues: DocumentQueues,
    waiting_updates: VecDeque<RequestId>,
}

impl KeyState {
    fn is_idle(&self) -> bool {
        self.queues.is_idle() && self.waiting_updates.is_empty()
    }
}

struct Pending {
    kind: Kind,
    slots: Vec<u32>,
    acquired: usize,
    granted: bool,
    abandoned: bool,
    /// Granted without entering any key's queues (the test-only switch), so
    /// releasing it touches none.
    bypassed: bool,
    /// When it was granted (the core's time then).
    granted_at: Option<Duration>,
}

/// What [`ModuleCore::revoke_expired`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revocation {
    /// Grants taken back from holders that outlived the grant lifetime.
    pub revoked: Vec<Grant>,
    /// Grants that followed (requests that were waiting behind them).
    pub grants: Vec<Grant>,
}

/// The depths of the module's queues now, summed over its keys: Table 1's
/// Read Queue and Update Queue, and the admission queue of updates waiting
/// for an earlier one (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepths {
    pub read: usize,
    pub update: usize,
    pub admission: usize,
}

/// All keys' queues and all requests of one module.
#[derive(Default)]
pub struct ModuleCore {
    keys: HashMap<u32, KeyState>,
    requests: HashMap<RequestId, Pending>,
    admit_reads_during_updates: bool,
    /// The latest time passed in; grants are stamped with it.
    now: Duration,
    /// `None`: grants are held until DONE, however long.
    grant_lifetime: Option<Duration>,
}

impl ModuleCore {
    pub fn new() -> Self {
        Self::default()
    }

    /// TEST ONLY: when on, reads are granted at once, ignoring updates in
    /// progress, which violates Table 1 (a read may see a half-written
    /// document). Exists to prove the end-to-end checkers catch that.
    pub fn set_test_only_admit_reads_during_updates(&mut self, on: bool) {
        self.admit_reads_during_updates = on;
    }

    /// How long a grant may be held before [`revoke_expired`] takes it back;
    /// `None`: for ever.
    ///
    /// [`revoke_expired`]: ModuleCore::revoke_expired
    pub fn set_grant_lifetime(&mut self, lifetime: Option<Duration>) {
        self.grant_lifetime = lifetime;
    }

    pub fn grant_lifetime(&self) -> Option<Duration> {
        self.grant_lifetime
    }

    /// Moves the core's time to `now` (time since any fixed origin; a time
    /// earlier than one already seen is ignored, so the clock never runs
    /// back). Grants made from now on are stamped with it.
    pub fn observe_time(&mut self, now: Duration) {
        self.now = self.now.max(now);
    }

    /// Revokes every grant held longer than the grant lifetime at `now`, as
    /// if its holder had sent DONE, and returns them with the grants that
    /// follow. Revoked requests are forgotten: a late DONE is refused.
    pub fn revoke_expired(&mut self, now: Duration) -> Result<Revocation, CoreError> {
        self.observe_time(now);
        let mut revocation = Revocation::default();
        let Some(lifetime) = self.grant_lifetime else { return Ok(revocation) };
        let mut expired: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, p)| p.granted_at.is_some_and(|at| self.now.saturating_sub(at) >= lifetime))
            .map(|(id, _)| *id)
            .collect();
        // In id order: a replay revokes in the same order (the map's is random).
        expired.sort_unstable();
        for id in expired {
            let Some(p) = self.requests.get(&id) else { continue };
            revocation.revoked.push(Grant { id, kind: p.kind, slots: p.slots.clone() });
            let mut grants = self.release(id)?;
            revocation.grants.append(&mut grants);
        }
        Ok(revocation)
    }

    /// Whether the test-only switch is on.
    pub fn admits_reads_during_updates(&self) -> bool {
        self.admit_reads_during_updates
    }

    /// Requests known (queued or holding).
    pub fn requests(&self) -> usize {
        self.requests.len()
    }

    /// Keys with queued or holding requests.
    pub fn busy_keys(&self) -> usize {
        self.keys.len()
    }

    /// The queues' depths now (a walk over the busy keys).
    pub fn queue_depths(&self) -> QueueDepths {
        self.keys.values().fold(QueueDepths::default(), |depths, key| QueueDepths {
            read: depths.read + key.queues.readers(),
            update: depths.update + key.queues.update_queue_len(),
            admission: depths.admission + key.waiting_updates.len(),
        })
    }

    /// READ_REQUEST or UPDATE_REQUEST for `slots`. Returns the grants that
    /// follow (this request's, if it could proceed at once).
    pub fn request(&mut self, id: RequestId, kind: Kind, slots: &[u32]) -> Result<Vec<Grant>, CoreError> {
        if self.requests.contains_key(&id) {
            return Err(CoreError::DuplicateRequest(id));
        }
        let mut slots = slots.to_vec();
        slots.sort_unstable();
        slots.dedup();
        if slots.is_empty() {
            return Err(CoreError::NoKeys(id));
        }
        let bypassed = kind == Kind::Read && self.admit_reads_during_updates;
        // A bypassing read holds all its keys from the start, so `advance` grants it at once.
        let acquired = if bypassed { slots.len() } else { 0 };
        self.requests.insert(
            id,
            Pending { kind, slots, acquired, granted: false, abandoned: false, bypassed, granted_at: None },
        );
        let mut grants = Vec::new();
        self.advance(id, &mut grants)?;
        Ok(grants)
    }

    /// Acquires `id`'s keys from where it stopped until one must wait.
    fn advance(&mut self, id: RequestId, grants: &mut Vec<Grant>) -> Result<(), CoreError> {
        loop {
            let pending = self.requests.get(&id).ok_or(CoreError::UnknownRequest(id))?;
            if pending.acquired == pending.slots.len() {
                let abandoned = pending.abandoned;
                let grant = Grant { id, kind: pending.kind, slots: pending.slots.clone() };
                let now = self.now;
                if let Some(p) = self.requests.get_mut(&id) {
                    p.granted = true;
                    p.granted_at = Some(now);
                }
                if abandoned {
                    // Nobody will use it: release at once.
                    let mut released = self.release(id)?;
                    grants.append(&mut released);
                } else {
                    grants.push(grant);
                }
                return Ok(());
            }
            let (kind, slot) = (pending.kind, pending.slots[pending.acquired]);
            let key = self.keys.entry(slot).or_default();
            let proceeded = match kind {
                Kind::Read => key.queues.handle(Ipc::ReadRequest(id))?.contains(&Proceed::Read(id)),
                Kind::Update if key.queues.update_pending() => {
                    key.waiting_updates.push_back(id);
                    false
                }
                Kind::Update => key.queues.handle(Ipc::UpdateRequest(id))?.contains(&Proceed::Update(id)),
            };
            if !proceeded {
                return Ok(());
            }
            if let Some(p) = self.requests.get_mut(&id) {
                p.acquired += 1;
            }
        }
    }

    /// A key granted a waiting request: count it and continue that request.
    fn on_proceed(&mut self, proceed: Proceed, grants: &mut Vec<Grant>) -> Result<(), CoreError> {
        let (Proceed::Read(id) | Proceed::Update(id)) = proceed;
        if let Some(p) = self.requests.get_mut(&id) {
            p.acquired += 1;
        }
        self.advance(id, grants)
    }

    /// READ_DONE or UPDATE_DONE for a granted request. Returns the grants
    /// that follow.
    pub fn done(&mut self, id: RequestId) -> Result<Vec<Grant>, CoreError> {
        match self.requests.get(&id) {
            None => Err(CoreError::UnknownRequest(id)),
            Some(p) if !p.granted => Err(CoreError::NotGranted(id)),
            Some(_) => self.release(id),
        }
    }

    fn release(&mut self, id: RequestId) -> Result<Vec<Grant>, CoreError> {
        let pending = self.requests.remove(&id).ok_or(CoreError::UnknownRequest(id))?;
        let mut grants = Vec::new();
        if pending.bypassed {
            return Ok(grants);
        }
        for slot in pending.slots {
            let key = self.keys.entry(slot).or_default();
            let proceeds = match pending.kind {
                Kind::Read => key.queues.handle(Ipc::ReadDone(id))?,
                Kind::Update => {
                    let mut proceeds = key.queues.handle(Ipc::UpdateDone(id))?;
                    // Admit the next waiting update behind the readers just granted.
                    if let Some(next) = key.waiting_updates.pop_front() {
                        proceeds.extend(key.queues.handle(Ipc::UpdateRequest(next))?);
                    }
                    proceeds
                }
            };
            for proceed in proceeds {
                self.on_proceed(proceed, &mut grants)?;
            }
            if self.keys.get(&slot).is_some_and(KeyState::is_idle) {
                self.keys.remove(&slot);
            }
        }
        Ok(grants)
    }

    /// The client of `id` went away: release it if granted, else release it
    /// as soon as it is granted. Returns the grants that follow.
    pub fn abandon(&mut self, id: RequestId) -> Result<Vec<Grant>, CoreError> {
        match self.requests.get_mut(&id) {
            None => Err(CoreError::UnknownRequest(id)),
            Some(p) if p.granted => self.release(id),
            Some(p) => {
                p.abandoned = true;
                Ok(Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(grants: &[Grant]) -> Vec<RequestId> {
        grants.iter().map(|g| g.id).collect()
    }

    #[test]
    fn a_read_waits_for_an_update_in_progress() {
        let mut core = ModuleCore::new();
        assert!(!core.admits_reads_during_updates());
        assert_eq!(ids(&core.request(1, Kind::Update, &[7]).unwrap()), vec![1]);
        assert!(core.request(2, Kind::Read, &[7]).unwrap().is_empty(), "Table 1: no read while the update holds");
        assert_eq!(ids(&core.done(1).unwrap()), vec![2], "granted when the update is done");
        // And an update waits for the reader.
        assert!(core.request(3, Kind::Update, &[7]).unwrap().is_empty());
        assert_eq!(ids(&core.done(2).unwrap()), vec![3]);
        assert!(core.done(3).unwrap().is_empty());
        assert_eq!((core.requests(), core.busy_keys()), (0, 0));
    }

    #[test]
    fn the_test_only_switch_admits_reads_during_updates() {
        let mut core = ModuleCore::new();
        core.set_test_only_admit_reads_during_updates(true);
        assert_eq!(ids(&core.request(1, Kind::Update, &[7]).unwrap()), vec![1]);
        let read = core.request(2, Kind::Read, &[7, 8]).unwrap();
        assert_eq!(read, vec![Grant { id: 2, kind: Kind::Read, slots: vec![7, 8] }], "admitted during the update");
        // Updates still exclude each other, and the bypassing read holds nothing.
        assert!(core.request(3, Kind::Update, &[7]).unwrap().is_empty());
        assert!(core.done(2).unwrap().is_empty());
        assert_eq!(ids(&core.done(1).unwrap()), vec![3]);
        assert!(core.done(3).unwrap().is_empty());
        // An abandoned bypassing read is released without disturbing the queues.
        assert_eq!(ids(&core.request(4, Kind::Read, &[7]).unwrap()), vec![4]);
        assert!(core.abandon(4).unwrap().is_empty());
        assert_eq!((core.requests(), core.busy_keys()), (0, 0));
    }

    /// The depths `/metrics` reports: the reader holding, the update and
    /// the read queued behind it in the Update Queue, the second update in
    /// the admission queue; nothing once every request is done.
    #[test]
    fn queue_depths_count_every_queue_of_every_key() {
        let mut core = ModuleCore::new();
        assert_eq!(ids(&core.request(1, Kind::Read, &[7]).unwrap()), vec![1]);
        assert!(core.request(2, Kind::Update, &[7]).unwrap().is_empty());
        assert!(core.request(3, Kind::Read, &[7]).unwrap().is_empty());
        assert!(core.request(4, Kind::Update, &[7]).unwrap().is_empty());
        assert_eq!(ids(&core.request(5, Kind::Read, &[8]).unwrap()), vec![5]);
        assert_eq!(core.queue_depths(), QueueDepths { read: 2, update: 2, admission: 1 });
        assert_eq!(ids(&core.done(1).unwrap()), vec![2]);
        assert_eq!(ids(&core.done(2).unwrap()), vec![3]);
        assert_eq!(core.queue_depths(), QueueDepths { read: 2, update: 1, admission: 0 });
        for id in [3, 4, 5] {
            core.done(id).unwrap();
        }
        assert_eq!(core.queue_depths(), QueueDepths::default());
    }

    #[test]
    fn a_grant_held_past_its_lifetime_is_revoked_and_the_next_request_proceeds() {
        let second = Duration::from_secs(1);
        let mut core = ModuleCore::new();
        core.set_grant_lifetime(Some(10 * second));
        core.observe_time(100 * second);
        assert_eq!(ids(&core.request(1, Kind::Update, &[7]).unwrap()), vec![1]);
        assert!(core.request(2, Kind::Update, &[7]).unwrap().is_empty());
        assert!(core.request(3, Kind::Read, &[7]).unwrap().is_empty());
        // One moment short of the lifetime nothing happens.
        assert_eq!(core.revoke_expired(110 * second - Duration::from_nanos(1)).unwrap(), Revocation::default());
        let revocation = core.revoke_expired(110 * second).unwrap();
        assert_eq!(ids(&revocation.revoked), vec![1]);
        assert_eq!(ids(&revocation.grants), vec![3], "the reader queued behind the revoked update goes first");
        assert_eq!(core.done(1), Err(CoreError::UnknownRequest(1)), "a revoked grant's late DONE is refused");
        // The read was granted at 110 s: it lives until 120 s, then the update waiting behind it proceeds.
        assert_eq!(core.revoke_expired(115 * second).unwrap(), Revocation::default());
        let revocation = core.revoke_expired(120 * second).unwrap();
        assert_eq!((ids(&revocation.revoked), ids(&revocation.grants)), (vec![3], vec![2]));
        // Time does not run back: an earlier `now` cannot make a grant look younger.
        assert!(core.revoke_expired(Duration::ZERO).unwrap().revoked.is_empty());
        assert_eq!(ids(&core.revoke_expired(130 * second).unwrap().revoked), vec![2]);
        assert_eq!((core.requests(), core.busy_keys()), (0, 0));
        // Without a lifetime, grants are held for ever.
        core.set_grant_lifetime(None);
        assert_eq!(ids(&core.request(4, Kind::Update, &[7]).unwrap()), vec![4]);
        assert!(core.revoke_expired(Duration::MAX).unwrap().revoked.is_empty());
    }
}
