//! The staleness checker: pure, no I/O.
//!
//! **Rule** (docs/coherence-protocol.md): a response is stale iff, for some
//! key in its header, an update of that key *completed* (its response was
//! received, `end_ns`) strictly before the request *started* (`start_ns`)
//! and produced a newer [`Stamp`] than the response carries. An update that
//! completes after the request started is concurrent with it: either version
//! is correct. Keys no update touched never make a response stale.
//!
//! **Across module restarts.** A key is named by its module's node and its
//! name, not by the incarnation; each version carries its incarnation's
//! *epoch*, the rank of that incarnation in the order the checker first saw
//! the node's incarnations (in an update's or a response's header). Stamps
//! compare epoch first, then version. So within one incarnation versions
//! compare as numbers; a response carrying an *older* incarnation (lower
//! epoch) is stale if an update of the key completed under a newer one
//! before the request started, whatever the version numbers (the old
//! incarnation was superseded by then); a response of a newer incarnation
//! is never made stale by updates of an older one. Versions of different
//! incarnations are otherwise not compared. Epochs are assigned once, when
//! a header is interned, and stored in the records, so the online checker
//! and the offline recount rank incarnations identically.
//!
//! **Offline** ([`find_stale`]): the rule, by brute force — every (response,
//! key) pair scans the updates of that key — written independently of the
//! online checker's index so that each cross-checks the other.
//!
//! **Online** ([`OnlineChecker`]): responses are checked as they arrive
//! against an index ([`UpdateIndex`]: per key, updates sorted by completion
//! time with a running maximum stamp; one binary search per key). The
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

use crate::record::{Deps, KeyId, ResponseRecord, Stamp, UpdateRecord};
use serde::Serialize;
use std::collections::HashMap;

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
    /// Stamp the response carried.
    pub served: Stamp,
    /// Newest stamp an update completed before the response started.
    pub newer: Stamp,
    /// When the update that produced `newer` completed.
    pub update_end_ns: u64,
}

/// Updates of one key, sorted by completion time.
#[derive(Debug, Default, Clone)]
struct KeyUpdates {
    end_ns: Vec<u64>,
    stamp: Vec<Stamp>,
    /// `best[i]` = index in `0..=i` of the newest stamp (earliest on ties).
    best: Vec<u32>,
}

impl KeyUpdates {
    fn insert(&mut self, end_ns: u64, stamp: Stamp) {
        // Usually an append: updates are recorded in completion order.
        let at = self.end_ns.partition_point(|&e| e <= end_ns);
        self.end_ns.insert(at, end_ns);
        self.stamp.insert(at, stamp);
        self.best.truncate(at);
        for i in at..self.end_ns.len() {
            let candidate = i as u32;
            let best = match i.checked_sub(1).map(|p| self.best[p]) {
                Some(prev) if self.stamp[prev as usize] >= self.stamp[i] => prev,
                _ => candidate,
            };
            self.best.push(best);
        }
    }

    /// The newest stamp among updates that ended strictly before
    /// `start_ns`, with that update's end.
    fn newest_before(&self, start_ns: u64) -> Option<(Stamp, u64)> {
        let n = self.end_ns.partition_point(|&e| e < start_ns);
        let i = *self.best.get(n.checked_sub(1)?)? as usize;
        Some((self.stamp[i], self.end_ns[i]))
    }
}

/// Completed updates, indexed per key (the online checker's index).
#[derive(Debug, Default, Clone)]
pub struct UpdateIndex {
    keys: Vec<KeyUpdates>,
}

impl UpdateIndex {
    /// Adds an update that completed at `end_ns` producing `deps`.
    pub fn insert(&mut self, end_ns: u64, deps: &Deps) {
        for (key, stamp) in deps.iter() {
            let k = key as usize;
            if self.keys.len() <= k {
                self.keys.resize_with(k + 1, KeyUpdates::default);
            }
            self.keys[k].insert(end_ns, stamp);
        }
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
                served,
                newer,
                update_end_ns,
            })
        })
    }
}

/// Offline recount of a complete run, by brute force from the rule: the
/// stale responses, by index. Independent of [`UpdateIndex`] on purpose.
pub fn find_stale(responses: &[ResponseRecord], updates: &[UpdateRecord]) -> Vec<StaleFinding> {
    // Only grouping by key, so a run's cost is responses × updates *per key*.
    let mut by_key: HashMap<KeyId, Vec<(u64, Stamp)>> = HashMap::new();
    for u in updates {
        for (key, stamp) in u.deps.iter() {
            by_key.entry(key).or_default().push((u.end_ns, stamp));
        }
    }
    let mut found = Vec::new();
    for (i, r) in responses.iter().enumerate() {
        let finding = r.deps.iter().find_map(|(key, served)| {
            let mut newest: Option<(Stamp, u64)> = None;
            for &(end_ns, stamp) in by_key.get(&key).map_or(&[][..], Vec::as_slice) {
                let superseded = end_ns < r.start_ns && stamp > served;
                if superseded && newest.is_none_or(|(s, e)| stamp > s || (stamp == s && end_ns < e)) {
                    newest = Some((stamp, end_ns));
                }
            }
            newest.map(|(newer, update_end_ns)| StaleFinding {
                response: i as u64,
                doc: r.doc,
                response_start_ns: r.start_ns,
                key,
                served,
                newer,
                update_end_ns,
            })
        });
        found.extend(finding);
    }
    found
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

    /// Epoch 0, version `v`: one incarnation.
    fn v(version: u64) -> Stamp {
        Stamp::new(0, version)
    }

    fn resp(start_ns: u64, deps: &[DepPair]) -> ResponseRecord {
        ResponseRecord {
            start_ns,
            end_ns: start_ns + 1,
            bytes: 0,
            doc: 0,
            target: 0,
            stream: 0,
            position: 0,
            status: 200,
            cache: CacheStatus::Unknown,
            deps_state: DepsState::Ok,
            deps: Deps::from_pairs(deps),
        }
    }

    fn upd(end_ns: u64, deps: &[DepPair]) -> UpdateRecord {
        UpdateRecord { start_ns: end_ns.saturating_sub(5), end_ns, doc: 0, status: 200, deps: Deps::from_pairs(deps) }
    }

    /// The online index's verdicts, response by response.
    fn by_index(responses: &[ResponseRecord], updates: &[UpdateRecord]) -> Vec<StaleFinding> {
        let mut sorted: Vec<&UpdateRecord> = updates.iter().collect();
        sorted.sort_by_key(|u| u.end_ns);
        let mut index = UpdateIndex::default();
        for u in sorted {
            index.insert(u.end_ns, &u.deps);
        }
        responses.iter().enumerate().filter_map(|(i, r)| index.check(i as u64, r.doc, r.start_ns, &r.deps)).collect()
    }

    fn ids(findings: &[StaleFinding]) -> Vec<usize> {
        findings.iter().map(|f| f.response as usize).collect()
    }

    const A: KeyId = 0;
    const B: KeyId = 1;
    const C: KeyId = 2;

    /// Hand-written cases: (name, updates, response start, response deps, stale?).
    #[test]
    fn table_of_cases() {
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, &[(u64, &[DepPair])], u64, &[DepPair], bool)] = &[
            ("no updates at all", &[], 100, &[(A, v(1))], false),
            ("fresh: carries the version the update produced", &[(50, &[(A, v(2))])], 100, &[(A, v(2))], false),
            (
                "fresh: carries a newer version than any completed update",
                &[(50, &[(A, v(2))])],
                100,
                &[(A, v(3))],
                false,
            ),
            ("stale: update completed before the request started", &[(50, &[(A, v(2))])], 100, &[(A, v(1))], true),
            (
                "concurrent: update completed after the request started",
                &[(150, &[(A, v(2))])],
                100,
                &[(A, v(1))],
                false,
            ),
            ("update completed exactly at the request start", &[(100, &[(A, v(2))])], 100, &[(A, v(1))], false),
            ("another key's update does not matter", &[(50, &[(B, v(9))])], 100, &[(A, v(1))], false),
            (
                "multi-key: one stale key is enough",
                &[(50, &[(C, v(3))])],
                100,
                &[(A, v(1)), (B, v(1)), (C, v(2))],
                true,
            ),
            (
                "the newest of several completed updates counts",
                &[(10, &[(A, v(2))]), (20, &[(A, v(3))])],
                100,
                &[(A, v(2))],
                true,
            ),
            (
                "a later update within the request does not excuse an earlier one",
                &[(10, &[(A, v(2))]), (200, &[(A, v(3))])],
                100,
                &[(A, v(1))],
                true,
            ),
            ("updates recorded out of order", &[(90, &[(A, v(5))]), (10, &[(A, v(2))])], 100, &[(A, v(4))], true),
            // Module restarts: epoch 1 is an incarnation first seen after epoch 0.
            (
                "restart: an old incarnation's copy after a new incarnation's update is stale",
                &[(10, &[(A, v(7))]), (50, &[(A, Stamp::new(1, 1))])],
                100,
                &[(A, v(9))],
                true,
            ),
            (
                "restart: an old incarnation's copy concurrent with the new incarnation's update is not",
                &[(10, &[(A, v(7))]), (150, &[(A, Stamp::new(1, 1))])],
                100,
                &[(A, v(7))],
                false,
            ),
            (
                "restart: a new incarnation's version 1 is not stale next to the old version 9",
                &[(10, &[(A, v(9))])],
                100,
                &[(A, Stamp::new(1, 1))],
                false,
            ),
            (
                "restart: within the new incarnation versions still compare",
                &[(10, &[(A, v(9))]), (50, &[(A, Stamp::new(1, 3))])],
                100,
                &[(A, Stamp::new(1, 2))],
                true,
            ),
        ];
        for (name, updates, start, deps, stale) in cases {
            let updates: Vec<_> = updates.iter().map(|(end, d)| upd(*end, d)).collect();
            let responses = vec![resp(*start, deps)];
            let found = find_stale(&responses, &updates);
            assert_eq!(!found.is_empty(), *stale, "brute force, case: {name}");
            assert_eq!(by_index(&responses, &updates).is_empty(), !*stale, "index, case: {name}");
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
    fn a_finding_names_the_key_stamps_and_update() {
        let expected = StaleFinding {
            response: 0,
            doc: 0,
            response_start_ns: 100,
            key: B,
            served: v(1),
            newer: v(4),
            update_end_ns: 60,
        };
        let responses = [resp(100, &[(A, v(2)), (B, v(1))])];
        let updates = [upd(40, &[(B, v(2))]), upd(60, &[(B, v(4))])];
        assert_eq!(find_stale(&responses, &updates), vec![expected]);
        let mut index = UpdateIndex::default();
        updates.iter().for_each(|u| index.insert(u.end_ns, &u.deps));
        assert_eq!(index.check(0, 0, 100, &responses[0].deps), Some(expected));
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
        assert_eq!(online.response(1, 0, 30, Deps::one(A, 1)), None);
        assert_eq!(online.summary().checked, 1);
        // One that started after: deferred.
        assert_eq!(online.response(2, 0, 60, Deps::one(A, 1)), None);
        assert_eq!(online.deferred(), 1);
        online.update_finished(ticket, Some((50, &Deps::one(A, 2))));
        assert_eq!(online.deferred(), 0);
        let s = online.finish();
        assert_eq!((s.checked, s.stale, s.updates), (2, 1, 1));
        assert_eq!(s.examples[0].response, 2);
    }

    #[test]
    fn every_stale_response_is_counted_and_the_first_ones_kept_as_examples() {
        let mut online = OnlineChecker::new();
        let ticket = online.update_started(10);
        online.update_finished(ticket, Some((20, &Deps::one(A, 2))));
        let responses = STALE_EXAMPLES_MAX as u64 + 5;
        for r in 0..responses {
            assert!(online.response(r, 0, 30 + r, Deps::one(A, 1)).is_some(), "response {r} is stale");
        }
        let s = online.finish();
        assert_eq!((s.checked, s.stale), (responses, responses));
        assert_eq!(s.examples.len(), STALE_EXAMPLES_MAX);
        assert_eq!(s.examples[0].response, 0, "the first ones are kept");
    }

    #[test]
    fn a_failed_update_releases_deferred_responses_unchanged() {
        let mut online = OnlineChecker::new();
        let ticket = online.update_started(40);
        online.response(1, 0, 60, Deps::one(A, 1));
        online.update_finished(ticket, None);
        let s = online.finish();
        assert_eq!((s.checked, s.stale, s.updates), (1, 0, 0));
    }

    /// An update: (start, end, recorded, new stamps).
    type SimUpdate = (u64, u64, u64, Vec<DepPair>);
    /// A response: (start, arrival, stamps).
    type SimResponse = (u64, u64, Vec<DepPair>);

    /// One observed run: updates with start < end and a record time after
    /// the end; responses with an arrival time at or after their start.
    #[derive(Debug, Clone)]
    struct Run {
        updates: Vec<SimUpdate>,
        responses: Vec<SimResponse>,
    }

    /// Up to 3 keys of 4, each at a version 1..6 of one of 3 incarnations.
    fn deps_strategy() -> impl Strategy<Value = Vec<DepPair>> {
        proptest::collection::btree_map(0u32..4, (0u32..3, 1u64..6), 0..3)
            .prop_map(|m| m.into_iter().map(|(k, (e, v))| (k, Stamp::new(e, v))).collect())
    }

    fn run_strategy() -> impl Strategy<Value = Run> {
        let update = (0u64..60, 1u64..10, 0u64..10, deps_strategy())
            .prop_map(|(start, len, lag, deps)| (start, start + len, start + len + lag, deps));
        let response = (0u64..80, 0u64..10, deps_strategy()).prop_map(|(start, lag, deps)| (start, start + lag, deps));
        (proptest::collection::vec(update, 0..8), proptest::collection::vec(response, 0..24))
            .prop_map(|(updates, responses)| Run { updates, responses })
    }

    fn records(run: &Run) -> (Vec<ResponseRecord>, Vec<UpdateRecord>) {
        let updates = run
            .updates
            .iter()
            .map(|(s, e, _, d)| UpdateRecord {
                start_ns: *s,
                end_ns: *e,
                doc: 0,
                status: 200,
                deps: Deps::from_pairs(d),
            })
            .collect();
        (run.responses.iter().map(|(s, _, d)| resp(*s, d)).collect(), updates)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The online checker's index agrees with the brute-force recount,
        /// over histories spanning several module incarnations.
        #[test]
        fn index_matches_brute_force(run in run_strategy()) {
            let (responses, updates) = records(&run);
            // Whole findings: the same key, and the same superseding update
            // (the highest stamp, the earliest to complete on ties).
            prop_assert_eq!(by_index(&responses, &updates), find_stale(&responses, &updates));
        }

        /// The online checker, fed in arrival order with updates registered
        /// at their start and recorded late, agrees with the brute-force
        /// offline recount.
        #[test]
        fn online_matches_brute_force(run in run_strategy()) {
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
            let (responses, updates) = records(&run);
            let offline = ids(&find_stale(&responses, &updates));
            prop_assert_eq!(summary.checked, responses.len() as u64);
            prop_assert_eq!(summary.stale, offline.len() as u64);
            let mut online_ids: Vec<usize> = summary.examples.iter().map(|f| f.response as usize).collect();
            online_ids.sort_unstable();
            prop_assert_eq!(online_ids, offline);
        }
    }
}
