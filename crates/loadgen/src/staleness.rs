//! The staleness checker: pure, no I/O.
//!
//! **Rule** (docs/coherence-protocol.md): a response is stale iff, for some
//! key in its header, an update of that key *completed* (its response was
//! received, `end_ns`) strictly before the request *started* (`start_ns`)
//! and produced a higher version than the response carries. An update that
//! completes after the request started is concurrent with it: either version
//! is correct. Keys no update touched never make a response stale.
//!
//! **Offline** ([`find_stale`]): updates are indexed per key, sorted by
//! completion time, with a running maximum of the versions produced; each
//! (response, key) pair is one binary search — `O((R·k + U) log U)`.
//!
//! **Online** ([`OnlineChecker`]): responses are checked as they arrive. The
//! trap is arrival order: an update may *end* before a response *starts* and
//! yet reach the checker after that response does (its PUT response was
//! received, but the updater has not yet recorded it). So the updater
//! registers every update *before* sending it ([`OnlineChecker::update_started`]),
//! and a response that started after some registered, not-yet-recorded
//! update started is deferred until that update is recorded or abandoned.
//! An update registered later cannot matter to a response already seen: it
//! is sent after registering, so it ends after the response started.
//! Deferred responses are bounded by how long one update may take (its
//! request timeout) times the response rate.

use crate::record::{Deps, KeyId, ResponseRecord, UpdateRecord};
use serde::Serialize;

/// Most stale findings an [`OnlineChecker`] keeps as examples (all are counted).
pub const STALE_EXAMPLES_MAX: usize = 32;

/// One stale response, and the update that makes it so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StaleFinding {
    /// Caller's id for the response (its index, for [`find_stale`]).
    pub response: u64,
    pub doc: u32,
    pub response_start_ns: u64,
    pub key: KeyId,
    /// Version the response carried.
    pub served_version: u64,
    /// Highest version an update completed before the response started.
    pub newer_version: u64,
    /// When the update that produced `newer_version` completed.
    pub update_end_ns: u64,
}

/// Updates of one key, sorted by completion time.
#[derive(Debug, Default, Clone)]
struct KeyUpdates {
    end_ns: Vec<u64>,
    version: Vec<u64>,
    /// `best[i]` = index in `0..=i` of the highest version (earliest on ties).
    best: Vec<u32>,
}

impl KeyUpdates {
    fn insert(&mut self, end_ns: u64, version: u64) {
        // Usually an append: updates are recorded in completion order.
        let at = self.end_ns.partition_point(|&e| e <= end_ns);
        self.end_ns.insert(at, end_ns);
        self.version.insert(at, version);
        self.best.truncate(at);
        for i in at..self.end_ns.len() {
            let candidate = i as u32;
            let best = match i.checked_sub(1).map(|p| self.best[p]) {
                Some(prev) if self.version[prev as usize] >= self.version[i] => prev,
                _ => candidate,
            };
            self.best.push(best);
        }
    }

    /// The highest version among updates that ended strictly before
    /// `start_ns`, with that update's end.
    fn newest_before(&self, start_ns: u64) -> Option<(u64, u64)> {
        let n = self.end_ns.partition_point(|&e| e < start_ns);
        let i = *self.best.get(n.checked_sub(1)?)? as usize;
        Some((self.version[i], self.end_ns[i]))
    }
}

/// Completed updates, indexed per key.
#[derive(Debug, Default, Clone)]
pub struct UpdateIndex {
    keys: Vec<KeyUpdates>,
    updates: u64,
}

impl UpdateIndex {
    /// Adds an update that completed at `end_ns` producing `deps`.
    pub fn insert(&mut self, end_ns: u64, deps: &Deps) {
        for (key, version) in deps.iter() {
            let k = key as usize;
            if self.keys.len() <= k {
                self.keys.resize_with(k + 1, KeyUpdates::default);
            }
            self.keys[k].insert(end_ns, version);
        }
        self.updates += 1;
    }

    /// Updates inserted so far.
    pub fn len(&self) -> u64 {
        self.updates
    }

    pub fn is_empty(&self) -> bool {
        self.updates == 0
    }

    /// Checks one response; `None` if it is fresh.
    pub fn check(&self, response: u64, doc: u32, start_ns: u64, deps: &Deps) -> Option<StaleFinding> {
        deps.iter().find_map(|(key, served)| {
            let (newer, update_end_ns) = self.keys.get(key as usize)?.newest_before(start_ns)?;
            (newer > served).then_some(StaleFinding {
                response,
                doc,
                response_start_ns: start_ns,
                key,
                served_version: served,
                newer_version: newer,
                update_end_ns,
            })
        })
    }
}

/// Offline check of a complete run: the stale responses, by index.
pub fn find_stale(responses: &[ResponseRecord], updates: &[UpdateRecord]) -> Vec<StaleFinding> {
    let mut sorted: Vec<&UpdateRecord> = updates.iter().collect();
    sorted.sort_by_key(|u| u.end_ns);
    let mut index = UpdateIndex::default();
    for u in sorted {
        index.insert(u.end_ns, &u.deps);
    }
    responses.iter().enumerate().filter_map(|(i, r)| index.check(i as u64, r.doc, r.start_ns, &r.deps)).collect()
}

/// Names an update registered with [`OnlineChecker::update_started`].
#[derive(Debug, PartialEq, Eq)]
pub struct UpdateTicket(u64);

#[derive(Debug)]
struct Deferred {
    response: u64,
    doc: u32,
    start_ns: u64,
    deps: Deps,
}

/// What an online check concluded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StalenessSummary {
    /// Responses examined (those with a valid header).
    pub checked: u64,
    pub stale: u64,
    /// Updates that completed and were used.
    pub updates: u64,
    /// The first stale findings.
    pub examples: Vec<StaleFinding>,
}

/// Incremental checker (see the module docs for the protocol).
#[derive(Debug, Default)]
pub struct OnlineChecker {
    index: UpdateIndex,
    /// Registered, not yet finished: (ticket, start_ns).
    in_flight: Vec<(u64, u64)>,
    next_ticket: u64,
    deferred: Vec<Deferred>,
    summary: StalenessSummary,
}

impl OnlineChecker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an update about to be sent; `start_ns` is read before this
    /// call and the update is sent after it.
    pub fn update_started(&mut self, start_ns: u64) -> UpdateTicket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.in_flight.push((ticket, start_ns));
        UpdateTicket(ticket)
    }

    /// Finishes a registered update: `Some((end_ns, new versions))` if it
    /// completed with known versions, `None` if it failed or its outcome is
    /// unknown (it is then ignored).
    pub fn update_finished(&mut self, ticket: UpdateTicket, outcome: Option<(u64, &Deps)>) {
        self.in_flight.retain(|&(t, _)| t != ticket.0);
        if let Some((end_ns, deps)) = outcome {
            self.index.insert(end_ns, deps);
            self.summary.updates += 1;
        }
        self.release_deferred();
    }

    /// Checks a response (or defers it, see the module docs). Returns the
    /// finding if it was checked at once and is stale.
    pub fn response(&mut self, response: u64, doc: u32, start_ns: u64, deps: Deps) -> Option<StaleFinding> {
        if self.in_flight.iter().any(|&(_, s)| s < start_ns) {
            self.deferred.push(Deferred { response, doc, start_ns, deps });
            return None;
        }
        self.check_now(response, doc, start_ns, &deps)
    }

    /// Responses waiting for an in-flight update.
    pub fn deferred(&self) -> usize {
        self.deferred.len()
    }

    /// The running summary (deferred responses not yet counted).
    pub fn summary(&self) -> &StalenessSummary {
        &self.summary
    }

    /// Abandons every in-flight update, checks what was deferred, and returns
    /// the final summary.
    pub fn finish(mut self) -> StalenessSummary {
        self.in_flight.clear();
        self.release_deferred();
        self.summary
    }

    fn check_now(&mut self, response: u64, doc: u32, start_ns: u64, deps: &Deps) -> Option<StaleFinding> {
        self.summary.checked += 1;
        let finding = self.index.check(response, doc, start_ns, deps)?;
        self.summary.stale += 1;
        if self.summary.examples.len() < STALE_EXAMPLES_MAX {
            self.summary.examples.push(finding);
        }
        Some(finding)
    }

    fn release_deferred(&mut self) {
        let horizon = self.in_flight.iter().map(|&(_, s)| s).min();
        let ready: Vec<Deferred> = match horizon {
            None => std::mem::take(&mut self.deferred),
            Some(h) => {
                let (ready, waiting) = std::mem::take(&mut self.deferred).into_iter().partition(|d| d.start_ns <= h);
                self.deferred = waiting;
                ready
            }
        };
        for d in ready {
            self.check_now(d.response, d.doc, d.start_ns, &d.deps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{CacheStatus, DepPair, DepsState};
    use proptest::prelude::*;

    fn resp(start_ns: u64, deps: &[(KeyId, u64)]) -> ResponseRecord {
        ResponseRecord {
            start_ns,
            end_ns: start_ns + 1,
            bytes: 0,
            doc: 0,
            status: 200,
            cache: CacheStatus::Unknown,
            deps_state: DepsState::Ok,
            deps: Deps::from_pairs(deps),
        }
    }

    fn upd(end_ns: u64, deps: &[(KeyId, u64)]) -> UpdateRecord {
        UpdateRecord { start_ns: end_ns.saturating_sub(5), end_ns, doc: 0, status: 200, deps: Deps::from_pairs(deps) }
    }

    /// The brute-force definition, straight from the rule.
    fn brute_force(responses: &[ResponseRecord], updates: &[UpdateRecord]) -> Vec<usize> {
        responses
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.deps.iter().any(|(key, served)| {
                    updates.iter().any(|u| u.end_ns < r.start_ns && u.deps.iter().any(|(k, v)| k == key && v > served))
                })
            })
            .map(|(i, _)| i)
            .collect()
    }

    const A: KeyId = 0;
    const B: KeyId = 1;
    const C: KeyId = 2;

    /// Hand-written cases: (name, updates, response start, response deps, stale?).
    #[test]
    fn table_of_cases() {
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, &[(u64, &[(KeyId, u64)])], u64, &[(KeyId, u64)], bool)] = &[
            ("no updates at all", &[], 100, &[(A, 1)], false),
            ("fresh: carries the version the update produced", &[(50, &[(A, 2)])], 100, &[(A, 2)], false),
            ("fresh: carries a newer version than any completed update", &[(50, &[(A, 2)])], 100, &[(A, 3)], false),
            ("stale: update completed before the request started", &[(50, &[(A, 2)])], 100, &[(A, 1)], true),
            ("concurrent: update completed after the request started", &[(150, &[(A, 2)])], 100, &[(A, 1)], false),
            ("boundary: completed at the very instant the request started", &[(100, &[(A, 2)])], 100, &[(A, 1)], false),
            ("stale on the second of two keys", &[(50, &[(B, 7)])], 100, &[(A, 1), (B, 6)], true),
            ("multi-key update, response carries both new", &[(50, &[(A, 2), (B, 3)])], 100, &[(A, 2), (B, 3)], false),
            ("multi-key update, one key old", &[(50, &[(A, 2), (B, 3)])], 100, &[(A, 2), (B, 2)], true),
            ("unknown key: no update ever touched it", &[(50, &[(A, 9)])], 100, &[(C, 1)], false),
            ("update of another key does not matter", &[(50, &[(B, 9)])], 100, &[(A, 1)], false),
            ("no deps: nothing to check", &[(50, &[(A, 9)])], 100, &[], false),
            (
                "only the newest completed update counts",
                &[(10, &[(A, 2)]), (20, &[(A, 3)]), (200, &[(A, 9)])],
                100,
                &[(A, 3)],
                false,
            ),
            (
                "an older completed update, newer concurrent one",
                &[(10, &[(A, 2)]), (200, &[(A, 3)])],
                100,
                &[(A, 1)],
                true,
            ),
            ("updates recorded out of order", &[(90, &[(A, 5)]), (10, &[(A, 2)])], 100, &[(A, 4)], true),
        ];
        for (name, updates, start, deps, stale) in cases {
            let updates: Vec<_> = updates.iter().map(|(end, d)| upd(*end, d)).collect();
            let responses = vec![resp(*start, deps)];
            let found = find_stale(&responses, &updates);
            assert_eq!(!found.is_empty(), *stale, "case: {name}");
            assert_eq!(brute_force(&responses, &updates).is_empty(), !*stale, "brute force, case: {name}");
            // Online, every update recorded before the response arrives.
            let mut online = OnlineChecker::new();
            for u in &updates {
                let t = online.update_started(u.start_ns);
                online.update_finished(t, Some((u.end_ns, &u.deps)));
            }
            online.response(0, 0, *start, Deps::from_pairs(deps));
            let s = online.finish();
            assert_eq!(s.stale, u64::from(*stale), "online, case: {name}");
            assert_eq!(s.checked, 1);
        }
    }

    #[test]
    fn a_finding_names_the_key_versions_and_update() {
        let found = find_stale(&[resp(100, &[(A, 2), (B, 1)])], &[upd(40, &[(B, 2)]), upd(60, &[(B, 4)])]);
        assert_eq!(
            found,
            vec![StaleFinding {
                response: 0,
                doc: 0,
                response_start_ns: 100,
                key: B,
                served_version: 1,
                newer_version: 4,
                update_end_ns: 60
            }]
        );
    }

    /// The trap the online protocol exists for: the update ended at 50, a
    /// response started at 60 and arrived at 70, and the updater recorded
    /// the update only at 80. Checked at arrival against what was recorded,
    /// the response would pass; deferred, it is caught.
    #[test]
    fn online_defers_responses_behind_an_unrecorded_update() {
        let mut online = OnlineChecker::new();
        let ticket = online.update_started(40);
        // A response that started before the update did is checked at once.
        assert_eq!(online.response(1, 0, 30, Deps::One(A, 1)), None);
        assert_eq!(online.summary().checked, 1);
        // One that started after: deferred.
        assert_eq!(online.response(2, 0, 60, Deps::One(A, 1)), None);
        assert_eq!(online.deferred(), 1);
        online.update_finished(ticket, Some((50, &Deps::One(A, 2))));
        assert_eq!(online.deferred(), 0);
        let s = online.finish();
        assert_eq!((s.checked, s.stale, s.updates), (2, 1, 1));
        assert_eq!(s.examples[0].response, 2);
    }

    #[test]
    fn a_failed_update_releases_deferred_responses_unchanged() {
        let mut online = OnlineChecker::new();
        let ticket = online.update_started(40);
        online.response(1, 0, 60, Deps::One(A, 1));
        online.update_finished(ticket, None);
        let s = online.finish();
        assert_eq!((s.checked, s.stale, s.updates), (1, 0, 0));
    }

    /// An update: (start, end, recorded, new versions).
    type SimUpdate = (u64, u64, u64, Vec<DepPair>);
    /// A response: (start, arrival, versions).
    type SimResponse = (u64, u64, Vec<DepPair>);

    /// One observed run: updates with start < end and a record time after
    /// the end; responses with an arrival time at or after their start.
    #[derive(Debug, Clone)]
    struct Run {
        updates: Vec<SimUpdate>,
        responses: Vec<SimResponse>,
    }

    fn deps_strategy() -> impl Strategy<Value = Vec<(KeyId, u64)>> {
        proptest::collection::btree_map(0u32..4, 1u64..6, 0..3).prop_map(|m| m.into_iter().collect())
    }

    fn run_strategy() -> impl Strategy<Value = Run> {
        let update = (0u64..60, 1u64..10, 0u64..10, deps_strategy())
            .prop_map(|(start, len, lag, deps)| (start, start + len, start + len + lag, deps));
        let response = (0u64..80, 0u64..10, deps_strategy()).prop_map(|(start, lag, deps)| (start, start + lag, deps));
        (proptest::collection::vec(update, 0..8), proptest::collection::vec(response, 0..24))
            .prop_map(|(updates, responses)| Run { updates, responses })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The fast offline checker agrees with the definition.
        #[test]
        fn offline_matches_brute_force(run in run_strategy()) {
            let updates: Vec<_> = run.updates.iter().map(|(s, e, _, d)| UpdateRecord {
                start_ns: *s, end_ns: *e, doc: 0, status: 200, deps: Deps::from_pairs(d),
            }).collect();
            let responses: Vec<_> = run.responses.iter().map(|(s, _, d)| resp(*s, d)).collect();
            let fast: Vec<usize> = find_stale(&responses, &updates).iter().map(|f| f.response as usize).collect();
            prop_assert_eq!(fast, brute_force(&responses, &updates));
        }

        /// The online checker, fed in arrival order with updates registered
        /// at their start and recorded late, agrees with the offline one.
        #[test]
        fn online_matches_offline(run in run_strategy()) {
            #[derive(Debug)]
            enum Ev { Start(usize), Record(usize), Arrive(usize) }
            let mut events: Vec<(u64, u8, Ev)> = Vec::new();
            for (i, (s, _, rec, _)) in run.updates.iter().enumerate() {
                events.push((*s, 0, Ev::Start(i)));
                events.push((*rec, 1, Ev::Record(i)));
            }
            for (i, (_, arrive, _)) in run.responses.iter().enumerate() {
                events.push((*arrive, 2, Ev::Arrive(i)));
            }
            events.sort_by_key(|(t, order, _)| (*t, *order));
            let mut online = OnlineChecker::new();
            let mut tickets: Vec<Option<UpdateTicket>> = (0..run.updates.len()).map(|_| None).collect();
            for (_, _, ev) in events {
                match ev {
                    Ev::Start(i) => tickets[i] = Some(online.update_started(run.updates[i].0)),
                    Ev::Record(i) => {
                        let (_, end, _, deps) = &run.updates[i];
                        let t = tickets[i].take().expect("started before recorded");
                        online.update_finished(t, Some((*end, &Deps::from_pairs(deps))));
                    }
                    Ev::Arrive(i) => {
                        let (start, _, deps) = &run.responses[i];
                        online.response(i as u64, 0, *start, Deps::from_pairs(deps));
                    }
                }
            }
            let summary = online.finish();
            let updates: Vec<_> = run.updates.iter().map(|(s, e, _, d)| UpdateRecord {
                start_ns: *s, end_ns: *e, doc: 0, status: 200, deps: Deps::from_pairs(d),
            }).collect();
            let responses: Vec<_> = run.responses.iter().map(|(s, _, d)| resp(*s, d)).collect();
            let offline = brute_force(&responses, &updates);
            prop_assert_eq!(summary.checked, responses.len() as u64);
            prop_assert_eq!(summary.stale, offline.len() as u64);
            let mut online_ids: Vec<usize> = summary.examples.iter().map(|f| f.response as usize).collect();
            online_ids.sort_unstable();
            prop_assert_eq!(online_ids, offline);
        }
    }
}
