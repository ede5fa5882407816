//! What the tasks of a run count and check in common: the live counters
//! ([`LiveStats`]), the state every task shares ([`Shared`], with the
//! online checker's [`CheckState`] under one lock), and each worker's own
//! tally ([`WorkerTally`]), merged at the end.

use crate::deps;
use crate::record::{Deps, DepsState, KeyTable, ResponseRecord, Stamp, UpdateRecord};
use crate::report::ErrorCounts;
use crate::staleness::OnlineChecker;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tierstack_stats::Histogram;

/// Most header/body check failures described in the report (all are counted).
pub(crate) const CHECK_ERROR_EXAMPLES_MAX: usize = 16;

/// Counters readable while a run is in progress (for progress displays).
#[derive(Debug, Default)]
pub struct LiveStats {
    pub requests: AtomicU64,
    pub ok: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub errors: AtomicU64,
    pub updates: AtomicU64,
    pub stale: AtomicU64,
}

/// A copy of [`LiveStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveSnapshot {
    pub requests: u64,
    pub ok: u64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub updates: u64,
    pub stale: u64,
}

impl LiveStats {
    pub fn snapshot(&self) -> LiveSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LiveSnapshot {
            requests: g(&self.requests),
            ok: g(&self.ok),
            hits: g(&self.hits),
            misses: g(&self.misses),
            errors: g(&self.errors),
            updates: g(&self.updates),
            stale: g(&self.stale),
        }
    }
}

/// State every task shares.
pub(crate) struct Shared {
    pub(crate) state: Mutex<CheckState>,
    pub(crate) live: Arc<LiveStats>,
    pub(crate) records_taken: AtomicU64,
    /// Requests taken from `requests_max` by the closed-loop workers.
    pub(crate) budget_used: AtomicU64,
    pub(crate) run_start_ns: u64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, CheckState> {
        // A poisoned lock means a task panicked while checking; the data is
        // still consistent enough to report, so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn second_of(&self, end_ns: u64) -> usize {
        (end_ns.saturating_sub(self.run_start_ns) / 1_000_000_000) as usize
    }
}

#[derive(Default)]
pub(crate) struct CheckState {
    pub(crate) checker: OnlineChecker,
    pub(crate) keys: KeyTable,
    pub(crate) next_response: u64,
    pub(crate) updates: Vec<UpdateRecord>,
    /// Per (node, epoch): checked responses and completed updates.
    pub(crate) incarnations: BTreeMap<(u32, u32), (u64, u64)>,
}

impl CheckState {
    /// Keys are interned per module node; versions are stamped with the
    /// epoch of the header's incarnation (its rank by first sight, assigned
    /// here, under the lock, so it is one order for every task), which makes
    /// them comparable across module restarts (see [`crate::staleness`]).
    fn intern(&mut self, parsed: &deps::ParsedDeps<'_>) -> (u32, Deps) {
        let epoch = self.keys.epoch(parsed.node, parsed.incarnation);
        let pairs: Vec<_> = parsed
            .entries
            .iter()
            .map(|e| (self.keys.intern_at(parsed.node, e.key), Stamp::new(epoch, e.version)))
            .collect();
        (epoch, Deps::from_pairs(&pairs))
    }

    /// Checks a response whose header and body passed (the caller holds the lock).
    pub(crate) fn check_response(&mut self, doc: u32, start_ns: u64, parsed: &deps::ParsedDeps<'_>) -> Deps {
        let (epoch, deps) = self.intern(parsed);
        self.incarnations.entry((parsed.node, epoch)).or_default().0 += 1;
        let id = self.next_response;
        self.next_response += 1;
        self.checker.response(id, doc, start_ns, deps.clone());
        deps
    }

    /// Records an update that completed with `parsed` as its new versions.
    pub(crate) fn update_done(&mut self, parsed: &deps::ParsedDeps<'_>) -> Deps {
        let (epoch, deps) = self.intern(parsed);
        self.incarnations.entry((parsed.node, epoch)).or_default().1 += 1;
        deps
    }
}

/// Per-second counters.
#[derive(Clone, Copy, Default)]
pub(crate) struct SecondTally {
    pub(crate) ok: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) errors: u64,
}

/// What one worker (or the whole open loop) saw.
#[derive(Default)]
pub(crate) struct WorkerTally {
    pub(crate) latency: Histogram,
    pub(crate) issued: u64,
    pub(crate) abandoned: u64,
    pub(crate) requests: u64,
    pub(crate) ok: u64,
    pub(crate) checked_ok: u64,
    pub(crate) bodies_checked: u64,
    pub(crate) bytes: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) errors: ErrorCounts,
    /// Per target: requests that ended, and connections opened.
    pub(crate) target_requests: Vec<u64>,
    pub(crate) target_connections: Vec<u64>,
    pub(crate) max_dispatch_lag_ns: u64,
    pub(crate) check_error_examples: Vec<String>,
    pub(crate) seconds: Vec<SecondTally>,
    pub(crate) records: Vec<ResponseRecord>,
    pub(crate) records_dropped: u64,
}

/// Adds `n` to `counts[i]`, growing the vector as needed.
pub(crate) fn add_at(counts: &mut Vec<u64>, i: usize, n: u64) {
    if counts.len() <= i {
        counts.resize(i + 1, 0);
    }
    counts[i] += n;
}

/// Element-wise `a += b`.
fn add_all(a: &mut Vec<u64>, b: &[u64]) {
    for (i, &n) in b.iter().enumerate() {
        add_at(a, i, n);
    }
}

impl WorkerTally {
    pub(crate) fn second(&mut self, s: usize) -> &mut SecondTally {
        if self.seconds.len() <= s {
            self.seconds.resize(s + 1, SecondTally::default());
        }
        &mut self.seconds[s]
    }

    /// One request to `target` ended (a response or an error).
    pub(crate) fn ended(&mut self, target: usize) {
        self.requests += 1;
        add_at(&mut self.target_requests, target, 1);
    }

    pub(crate) fn merge(&mut self, o: WorkerTally) {
        self.latency.merge(&o.latency);
        self.issued += o.issued;
        self.abandoned += o.abandoned;
        self.requests += o.requests;
        self.ok += o.ok;
        self.checked_ok += o.checked_ok;
        self.bodies_checked += o.bodies_checked;
        add_all(&mut self.target_requests, &o.target_requests);
        add_all(&mut self.target_connections, &o.target_connections);
        self.max_dispatch_lag_ns = self.max_dispatch_lag_ns.max(o.max_dispatch_lag_ns);
        let room = CHECK_ERROR_EXAMPLES_MAX.saturating_sub(self.check_error_examples.len());
        self.check_error_examples.extend(o.check_error_examples.into_iter().take(room));
        self.bytes += o.bytes;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors.merge(&o.errors);
        if self.seconds.len() < o.seconds.len() {
            self.seconds.resize(o.seconds.len(), SecondTally::default());
        }
        for (a, b) in self.seconds.iter_mut().zip(&o.seconds) {
            a.ok += b.ok;
            a.hits += b.hits;
            a.misses += b.misses;
            a.errors += b.errors;
        }
        self.records.extend(o.records);
        self.records_dropped += o.records_dropped;
    }
}

/// Parses the dependency header of a 2xx.
pub(crate) fn classify_deps(raw: Option<&[u8]>) -> (DepsState, Option<deps::ParsedDeps<'_>>) {
    match raw {
        None => (DepsState::Missing, None),
        Some(bytes) => match std::str::from_utf8(bytes).ok().map(deps::parse) {
            Some(Ok(parsed)) => (DepsState::Ok, Some(parsed)),
            _ => (DepsState::Malformed, None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(state: &mut CheckState, header: &str, start_ns: u64, end_ns: u64) {
        let parsed = deps::parse(header).unwrap();
        let deps = state.update_done(&parsed);
        let ticket = state.checker.update_started(start_ns);
        state.checker.update_finished(ticket, Some((end_ns, &deps)));
    }

    fn stale(state: &mut CheckState, header: &str, start_ns: u64) -> bool {
        let before = state.checker.summary().stale;
        state.check_response(0, start_ns, &deps::parse(header).unwrap());
        state.checker.summary().stale > before
    }

    /// Across a module restart (incarnation aa, then bb): the new
    /// incarnation's version 1 is not stale next to the old one's version
    /// 5; an old-incarnation copy is stale once an update completed under
    /// the new incarnation before its request started, whatever its
    /// version; and within one incarnation versions compare as before.
    #[test]
    fn versions_compare_across_module_incarnations_by_first_sight() {
        let mut st = CheckState::default();
        update(&mut st, "n=0;i=00000000000000aa;doc/a=5@0", 10, 20);
        assert!(!stale(&mut st, "n=0;i=00000000000000bb;doc/a=1@0", 30), "the new incarnation supersedes");
        assert!(stale(&mut st, "n=0;i=00000000000000aa;doc/a=4@0", 30), "an older version of one incarnation");
        assert!(!stale(&mut st, "n=0;i=00000000000000aa;doc/a=5@0", 30), "the old incarnation, not yet superseded");

        update(&mut st, "n=0;i=00000000000000bb;doc/a=2@0", 40, 50);
        assert!(!stale(&mut st, "n=0;i=00000000000000aa;doc/a=9@0", 45), "concurrent with the new update");
        assert!(stale(&mut st, "n=0;i=00000000000000aa;doc/a=9@0", 60), "superseded by the new incarnation");
        assert!(stale(&mut st, "n=0;i=00000000000000bb;doc/a=1@0", 60), "older within the new incarnation");
        assert!(!stale(&mut st, "n=0;i=00000000000000bb;doc/a=2@0", 60));
        assert!(!stale(&mut st, "n=7;i=00000000000000aa;doc/a=1@0", 60), "another module's key is another key");

        let seen: Vec<_> = st.incarnations.iter().map(|(&k, &v)| (k, v)).collect();
        assert_eq!(seen, vec![((0, 0), (4, 1)), ((0, 1), (3, 1)), ((7, 0), (1, 0))]);
        assert_eq!((st.keys.incarnation(0, 0), st.keys.incarnation(0, 1)), (Some(0xaa), Some(0xbb)));
    }
}
