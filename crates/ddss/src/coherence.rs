//! What a get does under each coherence model: pure decisions over the
//! reader's local copy, the clock, and (after a one-sided version read) the
//! home's sequence word. No I/O here; [`crate::Ddss`] executes the plans.
//!
//! | model        | local copy used when                            | otherwise          |
//! |--------------|-------------------------------------------------|--------------------|
//! | null         | always, once there is one                       | fetch              |
//! | temporal(T)  | fetched no more than T ago; or, if older, the   | fetch              |
//! |              | home's version still equals the copy's          |                    |
//! | delta(δ)     | home's latest completed version ≤ copy's + δ    | fetch              |
//! | read         | home's latest completed version = copy's        | fetch              |
//! | write        | never (every get reads the home, untorn)        | fetch              |
//! | strict       | never (lock, read, unlock at the home)          | locked fetch       |
//!
//! Why each is sound (see [`crate::key::Coherence`] for the definitions):
//! - a copy's `fetched_at_ns` is read from the clock *before* the fetch (or
//!   the put) that produced it, and the copied version was current at some
//!   instant after that; so serving it while `now - fetched_at <= T` returns
//!   a value current no more than T ago;
//! - the version read happens after the get's invocation, so the home's
//!   latest completed version `h` is at least the latest put completed before
//!   the get; serving a copy with `copy + δ >= h` meets delta(δ);
//! - the local copy is replaced only by a newer version, and every fetch
//!   reads the home, whose versions only grow: per reader, versions never go
//!   backwards.

use crate::key::{Coherence, Key};
use std::collections::HashMap;
use std::sync::Arc;

/// Most local copies one handle keeps.
pub const LOCAL_COPIES_MAX: usize = 4096;
/// Most bytes of local copies one handle keeps.
pub const LOCAL_COPY_BYTES_MAX: usize = 64 << 20;

/// A reader's copy of a value, as fetched from (or put to) its home.
#[derive(Clone, Debug)]
pub(crate) struct LocalCopy {
    /// Completed writes of the slot's seqlock at the fetch (sequence / 2).
    pub raw_version: u64,
    /// The slot's raw version at allocation; user version = raw - base.
    pub base: u64,
    pub bytes: Arc<[u8]>,
    /// Clock reading taken before the fetch or put that produced the copy.
    pub fetched_at_ns: u64,
}

/// The first step of a get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GetPlan {
    /// Return the local copy without touching the home.
    UseCopy,
    /// Read the home's control and sequence words, then decide with [`copy_is_fresh`].
    CheckVersion,
    /// Read the value untorn from the home (seqlock read).
    Fetch,
    /// Take the key's lock at the home, read, unlock.
    LockedFetch,
}

/// True if the model keeps local copies at all.
pub(crate) fn keeps_copies(model: Coherence) -> bool {
    matches!(model, Coherence::Null | Coherence::Temporal { .. } | Coherence::Delta { .. } | Coherence::Read)
}

pub(crate) fn plan_get(model: Coherence, copy: Option<&LocalCopy>, now_ns: u64) -> GetPlan {
    match (model, copy) {
        (Coherence::Strict, _) => GetPlan::LockedFetch,
        (Coherence::Write, _) | (_, None) => GetPlan::Fetch,
        (Coherence::Null, Some(_)) => GetPlan::UseCopy,
        (Coherence::Temporal { max_age_ms }, Some(copy)) => {
            if now_ns.saturating_sub(copy.fetched_at_ns) <= max_age_ms.saturating_mul(1_000_000) {
                GetPlan::UseCopy
            } else {
                GetPlan::CheckVersion
            }
        }
        (Coherence::Delta { .. } | Coherence::Read, Some(_)) => GetPlan::CheckVersion,
    }
}

/// After a version read: may the copy at `copy_raw_version` be served when
/// the home's sequence word is `home_sequence`? (An odd sequence means a put
/// is in progress; its version has not completed.)
pub(crate) fn copy_is_fresh(model: Coherence, copy_raw_version: u64, home_sequence: u64) -> bool {
    let completed = home_sequence / 2;
    let slack = match model {
        Coherence::Delta { versions } => versions,
        Coherence::Temporal { .. } | Coherence::Read => 0,
        Coherence::Null => u64::MAX,
        Coherence::Write | Coherence::Strict => return false,
    };
    copy_raw_version.saturating_add(slack) >= completed
}

/// A handle's bounded set of local copies.
#[derive(Default)]
pub(crate) struct LocalCopies {
    map: HashMap<Key, LocalCopy>,
    bytes: usize,
}

impl LocalCopies {
    pub(crate) fn get(&self, key: &Key) -> Option<&LocalCopy> {
        self.map.get(key)
    }

    /// Stores `copy` unless a copy at least as new is there; returns the copy
    /// that is now the newest (which a monotonic reader must not undercut).
    pub(crate) fn offer(&mut self, key: Key, copy: LocalCopy) -> LocalCopy {
        if let Some(existing) = self.map.get(&key) {
            if existing.raw_version > copy.raw_version {
                return existing.clone();
            }
            if existing.raw_version == copy.raw_version && existing.fetched_at_ns >= copy.fetched_at_ns {
                return existing.clone();
            }
        }
        self.remove(&key);
        while !self.map.is_empty()
            && (self.map.len() >= LOCAL_COPIES_MAX || self.bytes + copy.bytes.len() > LOCAL_COPY_BYTES_MAX)
        {
            // Evict an arbitrary copy: the next get of that key fetches from
            // the home, whose version is at least the evicted one's.
            let Some(victim) = self.map.keys().next().copied() else { break };
            self.remove(&victim);
        }
        if copy.bytes.len() <= LOCAL_COPY_BYTES_MAX {
            self.bytes += copy.bytes.len();
            self.map.insert(key, copy.clone());
        }
        copy
    }

    /// Marks the copy as validated current at `checked_at_ns`.
    pub(crate) fn refresh(&mut self, key: &Key, raw_version: u64, checked_at_ns: u64) {
        if let Some(copy) = self.map.get_mut(key) {
            if copy.raw_version == raw_version {
                copy.fetched_at_ns = copy.fetched_at_ns.max(checked_at_ns);
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &Key) {
        if let Some(old) = self.map.remove(key) {
            self.bytes -= old.bytes.len();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_base::NodeId;

    fn copy(raw_version: u64, fetched_at_ns: u64) -> LocalCopy {
        LocalCopy { raw_version, base: 0, bytes: Arc::from(vec![1u8; 4]), fetched_at_ns }
    }

    const MS: u64 = 1_000_000;

    /// One row per (model, copy, now): the plan the table in the module docs promises.
    #[test]
    fn plans_follow_the_table() {
        let c = copy(5, 100 * MS);
        let rows: Vec<(Coherence, Option<&LocalCopy>, u64, GetPlan)> = vec![
            (Coherence::Null, None, 0, GetPlan::Fetch),
            (Coherence::Null, Some(&c), u64::MAX, GetPlan::UseCopy),
            (Coherence::Temporal { max_age_ms: 10 }, None, 0, GetPlan::Fetch),
            (Coherence::Temporal { max_age_ms: 10 }, Some(&c), 110 * MS, GetPlan::UseCopy),
            (Coherence::Temporal { max_age_ms: 10 }, Some(&c), 110 * MS + 1, GetPlan::CheckVersion),
            (Coherence::Temporal { max_age_ms: u64::MAX }, Some(&c), u64::MAX, GetPlan::UseCopy),
            (Coherence::Delta { versions: 3 }, Some(&c), 0, GetPlan::CheckVersion),
            (Coherence::Delta { versions: 3 }, None, 0, GetPlan::Fetch),
            (Coherence::Read, Some(&c), 0, GetPlan::CheckVersion),
            (Coherence::Write, Some(&c), 0, GetPlan::Fetch),
            (Coherence::Strict, Some(&c), 0, GetPlan::LockedFetch),
            (Coherence::Strict, None, 0, GetPlan::LockedFetch),
        ];
        for (model, copy, now, want) in rows {
            assert_eq!(plan_get(model, copy, now), want, "{model} copy={} now={now}", copy.is_some());
        }
    }

    #[test]
    fn freshness_after_a_version_read() {
        // Copy at raw version 5; home sequence 2*v (+1 while a put runs).
        assert!(copy_is_fresh(Coherence::Read, 5, 10));
        assert!(copy_is_fresh(Coherence::Read, 5, 11), "an in-progress put has not completed");
        assert!(!copy_is_fresh(Coherence::Read, 5, 12));
        assert!(copy_is_fresh(Coherence::Delta { versions: 2 }, 5, 14));
        assert!(copy_is_fresh(Coherence::Delta { versions: 2 }, 5, 15));
        assert!(!copy_is_fresh(Coherence::Delta { versions: 2 }, 5, 16));
        assert!(copy_is_fresh(Coherence::Delta { versions: u64::MAX }, 5, u64::MAX));
        assert!(!copy_is_fresh(Coherence::Temporal { max_age_ms: 1 }, 5, 12));
        assert!(!copy_is_fresh(Coherence::Write, 5, 10));
        assert!(!copy_is_fresh(Coherence::Strict, 5, 10));
    }

    #[test]
    fn copies_only_move_forward_and_stay_bounded() {
        let key = |i: u32| Key::new(NodeId(0), 64 * i, 1, 0, Coherence::Null);
        let mut copies = LocalCopies::default();
        assert_eq!(copies.offer(key(0), copy(5, 0)).raw_version, 5);
        assert_eq!(copies.offer(key(0), copy(4, 9)).raw_version, 5, "an older fetch never replaces a newer copy");
        assert_eq!(copies.offer(key(0), copy(6, 0)).raw_version, 6);
        copies.refresh(&key(0), 5, 99);
        assert_eq!(copies.get(&key(0)).unwrap().fetched_at_ns, 0, "refresh of another version is ignored");
        copies.refresh(&key(0), 6, 99);
        assert_eq!(copies.get(&key(0)).unwrap().fetched_at_ns, 99);
        for i in 0..(LOCAL_COPIES_MAX as u32 + 10) {
            copies.offer(key(i), copy(1, 0));
        }
        assert!(copies.len() <= LOCAL_COPIES_MAX);
        copies.remove(&key(3));
        assert!(copies.get(&key(3)).is_none());
    }
}
