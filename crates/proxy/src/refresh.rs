//! Proxy-side refresh, for upstreams that do not push (issue 16): the proxy
//! keeps its hottest cached documents with dependencies ([`HotSet`], top K
//! by recent hits) and, every interval, reads all their versions with **one
//! batched one-sided read** per owner node
//! ([`tierstack_coherent::VersionChecker::are_current`]). A document whose
//! versions changed is refetched at once through the misses' coalescing
//! path: clients that ask meanwhile find its copy stale, join that one
//! fetch and wait on it, and the fresh copy is installed as a miss's is.
//!
//! When the application published the document's new page (issue 31,
//! [`crate::published`]), the refresh installs that page, read one-sidedly,
//! instead of asking the upstream.
//!
//! Coherence is unchanged: a refetched copy is installed only with the
//! versions it was generated at, and validated on every hit like any other.
//! A refresh read that fails refetches nothing (the hit path fails closed).

use crate::cache::Entry;
use crate::coalesce;
use crate::forward::fetch;
use crate::headers::{flight_key, target_of, upstream_fields};
use crate::state::State;
use crate::store::maybe_store;
use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper::Method;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `tierstack proxy --refresh-hot`'s default: off. Measured beside it off
/// (docs/results.md, issue 31: 3 alternated rounds, 15 cells, both module
/// placements), refresh on was better in none of 30 comparisons of p99 and
/// throughput and worse in 10: its refetch waits for the same busy
/// application tier as a client's would, and its reads compete with them.
/// `--versions-at done` with published pages removes the wait instead.
pub const REFRESH_HOT_DEFAULT: usize = 0;
/// `tierstack proxy --refresh-interval-ms`'s default.
pub const REFRESH_INTERVAL_DEFAULT: Duration = Duration::from_millis(5);
/// A hit's weight; halved every [`HALF_LIFE`], so one hit is remembered
/// about ten half-lives.
const HIT_WEIGHT: u64 = 1024;
/// How long a hit takes to count half as much.
pub(crate) const HALF_LIFE: Duration = Duration::from_secs(1);

/// The hot-set policy, pure: documents by recent hits (each hit adds
/// [`HIT_WEIGHT`], [`HotSet::decay`] halves every weight and forgets the
/// ones that reach 0). It tracks at most `4 * k + 16` documents: a new one
/// beyond that replaces the lightest.
#[derive(Debug)]
pub struct HotSet {
    k: usize,
    weights: HashMap<String, Hot>,
}

#[derive(Debug)]
struct Hot {
    weight: u64,
    /// The request fields of the hit that entered the document (its
    /// variant, its credentials' flight): what the refetch sends.
    request: HeaderMap,
}

impl HotSet {
    pub fn new(k: usize) -> Self {
        Self { k, weights: HashMap::new() }
    }

    fn bound(&self) -> usize {
        self.k.saturating_mul(4).saturating_add(16)
    }

    /// Notes a hit of `key` by a request with fields `request`.
    pub fn note(&mut self, key: &str, request: &HeaderMap) {
        if self.k == 0 {
            return;
        }
        if let Some(hot) = self.weights.get_mut(key) {
            hot.weight = hot.weight.saturating_add(HIT_WEIGHT);
            return;
        }
        if self.weights.len() >= self.bound() {
            let lightest = self.weights.iter().min_by_key(|(_, h)| h.weight).map(|(k, _)| k.clone());
            if let Some(lightest) = lightest {
                self.weights.remove(&lightest);
            }
        }
        self.weights.insert(key.to_string(), Hot { weight: HIT_WEIGHT, request: request.clone() });
    }

    /// The (at most) `k` heaviest documents, heaviest first (ties by key,
    /// so the choice is deterministic), with their request fields.
    pub fn top(&self) -> Vec<(String, HeaderMap)> {
        let mut all: Vec<(&String, &Hot)> = self.weights.iter().collect();
        all.sort_by(|a, b| b.1.weight.cmp(&a.1.weight).then_with(|| a.0.cmp(b.0)));
        all.into_iter().take(self.k).map(|(key, hot)| (key.clone(), hot.request.clone())).collect()
    }

    /// Halves every weight; forgets the documents left at 0.
    pub fn decay(&mut self) {
        self.weights.retain(|_, hot| {
            hot.weight /= 2;
            hot.weight > 0
        });
    }

    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }
}

/// The proxy's refresh state (a field of its `State`).
pub(crate) struct Refresh {
    hot: Mutex<HotSet>,
    /// Refreshing at all (`k` > 0 and an interval): off, a hit takes no lock.
    on: bool,
    interval: Duration,
    /// Batched version reads made.
    pub(crate) reads: AtomicU64,
    /// Documents refetched because a read found them changed.
    pub(crate) refetches: AtomicU64,
    /// Refetched copies stored (the others were not storable, or failed).
    pub(crate) installed: AtomicU64,
}

impl Refresh {
    pub(crate) fn new(k: usize, interval: Duration) -> Self {
        Self {
            hot: Mutex::new(HotSet::new(k)),
            on: k > 0 && !interval.is_zero(),
            interval,
            reads: AtomicU64::new(0),
            refetches: AtomicU64::new(0),
            installed: AtomicU64::new(0),
        }
    }

    fn enabled(&self) -> bool {
        self.on
    }

    /// Notes a hit of a cached document with dependencies.
    /// On the hit path: a hit never waits for the hot set's lock (held by
    /// another hit or by the refresh round); hotness is advisory, and a
    /// document hot enough to matter is noted by its next hits.
    pub(crate) fn note(&self, key: &str, request: &HeaderMap) {
        if !self.on {
            return;
        }
        if let Ok(mut hot) = self.hot.try_lock() {
            hot.note(key, request);
        }
    }
}

/// The refresh task; ends when dropped (the proxy's `run` holds it).
pub(crate) struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the refresh task if refresh is on and the proxy validates
/// versions.
pub(crate) fn spawn(state: &Arc<State>) -> Option<Task> {
    if !state.refresh.enabled() || state.mode != crate::CacheMode::Poll || state.checker.is_none() {
        return None;
    }
    let state = state.clone();
    Some(Task(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(state.refresh.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut decayed = tierstack_base::time::instant_now();
        loop {
            ticks.tick().await;
            if decayed.elapsed() >= HALF_LIFE {
                decayed = tierstack_base::time::instant_now();
                if let Ok(mut hot) = state.refresh.hot.lock() {
                    hot.decay();
                }
            }
            round(&state).await;
        }
    })))
}

/// One refresh round: reads the hot set's versions in one batch and
/// refetches the changed documents.
async fn round(state: &Arc<State>) {
    let Some(checker) = &state.checker else { return };
    let top = match state.refresh.hot.lock() {
        Ok(hot) => hot.top(),
        Err(_) => return,
    };
    let cached: Vec<_> = match state.cache.lock() {
        Ok(mut cache) => top
            .into_iter()
            .filter_map(|(key, request)| {
                let entry = cache.get(&key, &request)?;
                entry.deps.is_some().then_some((key, request, entry))
            })
            .collect(),
        Err(_) => return,
    };
    let headers: Vec<_> = cached.iter().filter_map(|(_, _, entry)| entry.deps.as_ref()).collect();
    if headers.is_empty() {
        return;
    }
    let verdicts = checker.are_current(&headers).await;
    state.refresh.reads.fetch_add(1, Ordering::Relaxed);
    for ((key, request, entry), verdict) in cached.into_iter().zip(verdicts) {
        if verdict == Ok(false) {
            refetch(state, key, request, entry);
        }
    }
}

/// Refetches `key` (out of date: `stale`) as a miss's leader would, unless
/// a fetch of it is already in flight (then that one brings the new copy):
/// from its published page if there is a current one, else upstream.
fn refetch(state: &Arc<State>, key: String, request: HeaderMap, stale: Arc<Entry>) {
    let coalesce::Role::Leader(leader) = state.flights.join(&flight_key(&key, &request)) else { return };
    state.refresh.refetches.fetch_add(1, Ordering::Relaxed);
    let state = state.clone();
    tokio::spawn(async move {
        if let crate::published::Found::Installed(page) =
            crate::published::install(&state, &key, &request, &stale).await
        {
            state.refresh.installed.fetch_add(1, Ordering::Relaxed);
            leader.finish(Some(page));
            return;
        }
        let fields = upstream_fields(&request);
        match fetch(&state, &Method::GET, target_of(&key), fields, Bytes::new()).await {
            Ok(fetched) => {
                let stored = maybe_store(&state, &key, &request, &fetched);
                if stored.is_some() {
                    state.refresh.installed.fetch_add(1, Ordering::Relaxed);
                }
                leader.finish(stored);
            }
            // Dropping the leader ends the flight: waiters fetch themselves.
            Err(_) => drop(leader),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(set: &HotSet) -> Vec<String> {
        set.top().into_iter().map(|(key, _)| key).collect()
    }

    #[test]
    fn the_top_k_are_the_most_hit_recently() {
        let mut set = HotSet::new(2);
        let none = HeaderMap::new();
        for (key, hits) in [("a", 1), ("b", 5), ("c", 3)] {
            for _ in 0..hits {
                set.note(key, &none);
            }
        }
        assert_eq!(keys(&set), ["b", "c"]);
        // b goes cold: after decays, fresh hits of a outweigh it.
        for _ in 0..4 {
            set.decay();
        }
        for _ in 0..2 {
            set.note("a", &none);
        }
        assert_eq!(keys(&set), ["a", "b"], "2 new hits (2048) beat 5 old ones (5120/16) and 3 (3072/16)");
        for _ in 0..20 {
            set.decay();
        }
        assert!(set.is_empty(), "documents nobody hits are forgotten");
    }

    #[test]
    fn off_tracks_nothing_and_the_set_is_bounded() {
        let mut off = HotSet::new(0);
        off.note("a", &HeaderMap::new());
        assert!(off.is_empty() && off.top().is_empty());
        let mut set = HotSet::new(1);
        set.note("hot", &HeaderMap::new());
        set.note("hot", &HeaderMap::new());
        for i in 0..100 {
            set.note(&format!("once-{i}"), &HeaderMap::new());
        }
        assert_eq!(set.len(), 20, "4 * k + 16");
        assert_eq!(keys(&set), ["hot"], "a new document replaces the lightest, never the hottest");
    }

    #[test]
    fn the_refetch_sends_the_noted_request_fields() {
        let mut set = HotSet::new(1);
        let mut request = HeaderMap::new();
        request.insert("accept-language", hyper::header::HeaderValue::from_static("fr"));
        set.note("h/doc/a", &request);
        assert_eq!(set.top(), vec![("h/doc/a".to_string(), request)]);
    }
}
