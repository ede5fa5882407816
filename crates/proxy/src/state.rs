//! [`State`]: what every request of one proxy shares (its cache, upstream
//! connections, counters and the optional balancing, site and pool), and
//! the cache operations that keep the shared cache state's residency flags
//! and the cooperative pool in step with the cache.

use crate::cache::{Cache, Entry, InsertOutcome};
use crate::headers::target_of;
use crate::route::BalancingState;
use crate::stats::{Counters, ProxyStats};
use crate::upstream::Upstreams;
use crate::{access_log, coalesce, coop, refresh, CacheMode, Site};
use hyper::header::HeaderMap;
use hyper::Uri;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tierstack_base::{Clock, SystemClock};
use tierstack_coherent::VersionChecker;
use tierstack_pushpull::{fingerprint, CacheStateWriter};

/// What every request of one proxy shares (one per [`crate::Proxy`]).
pub(crate) struct State {
    pub(crate) upstreams: Vec<Uri>,
    pub(crate) mode: CacheMode,
    pub(crate) cache: Mutex<Cache>,
    /// The cache's largest object (fixed when it is made).
    pub(crate) object_bytes_max: usize,
    pub(crate) checker: Option<VersionChecker>,
    /// Idle connections to each upstream (by index in `upstreams`).
    pub(crate) connections: Upstreams,
    pub(crate) upstream_timeout: Duration,
    pub(crate) counters: Counters,
    pub(crate) cache_state: Option<CacheStateWriter>,
    pub(crate) clock: SystemClock,
    pub(crate) flights: coalesce::Flights,
    pub(crate) balancing: OnceLock<BalancingState>,
    pub(crate) site: OnceLock<Site>,
    pub(crate) routed: Vec<AtomicU64>,
    /// Failed forwards per upstream, and the pauses they cause.
    pub(crate) failures: crate::route::FailureGate,
    /// See [`crate::ProxyOptions::suspect_probe`].
    pub(crate) suspect_probe: Option<Duration>,
    /// See [`crate::ProxyOptions::serve_stale_on_error`] (whole seconds).
    pub(crate) stale_on_error_secs: u64,
    /// See [`crate::ProxyOptions::default_authority`].
    pub(crate) default_authority: String,
    /// Keys being revalidated in the background.
    pub(crate) revalidating: Mutex<HashSet<String>>,
    pub(crate) access_log: Option<access_log::AccessLog>,
    pub(crate) refresh: refresh::Refresh,
    /// `--coop`: the cooperative pool behind the cache (see `coop`).
    pub(crate) coop: OnceLock<Arc<coop::CoopLayer>>,
    /// See [`crate::ProxyOptions::admin_token`].
    pub(crate) admin_token: Option<tierstack_secret::Secret>,
    /// Whether and how responses with `Set-Cookie` are stored.
    pub(crate) set_cookie: crate::policy::SetCookie,
    #[cfg(test)]
    pub(crate) hooks: crate::testkit::Hooks,
}

impl State {
    /// Looks `key` up for `request` (its variant, §4.1), noting the
    /// request for the wasted-update metric.
    pub(crate) fn cache_lookup(&self, key: &str, request: &HeaderMap, fingerprint: u64) -> Option<Arc<Entry>> {
        let mut cache = self.cache.lock().ok()?;
        cache.waste.on_request(fingerprint);
        cache.get(key, request)
    }

    /// Drops `key` with all its variants; true if it was cached.
    pub(crate) fn cache_remove(&self, key: &str) -> bool {
        if let Some(coop) = self.coop.get() {
            coop.invalidate(key);
        }
        let Ok(mut cache) = self.cache.lock() else { return false };
        let removed = cache.remove(key);
        if removed {
            self.set_resident(fingerprint(target_of(key)), false);
        }
        removed
    }

    /// Removes `entry` from under `key` if it is still cached there (a copy
    /// that failed its check; a newer one cached meanwhile stays).
    pub(crate) fn cache_remove_entry(&self, key: &str, entry: &Arc<Entry>) {
        if let Some(coop) = self.coop.get() {
            coop.invalidate(key);
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.remove_entry(key, entry) {
                self.set_resident(fingerprint(target_of(key)), false);
            }
        }
    }

    /// Caches `entry` under `key`, keeping the cache state's residency
    /// flags in step (under the cache's lock, so they follow its order).
    /// `None` if the cache is unusable (a poisoned lock).
    pub(crate) fn cache_store(&self, key: &str, entry: Arc<Entry>) -> Option<InsertOutcome> {
        if let Some(coop) = self.coop.get() {
            coop.store(key, &entry);
        }
        let Ok(mut cache) = self.cache.lock() else { return None };
        let inserted = cache.insert(key.to_string(), entry);
        for evicted in &inserted.evicted {
            self.set_resident(fingerprint(target_of(evicted)), false);
        }
        if inserted.outcome == InsertOutcome::Stored {
            self.set_resident(fingerprint(target_of(key)), true);
        }
        Some(inserted.outcome)
    }

    fn set_resident(&self, fingerprint: u64, resident: bool) {
        if let Some(writer) = &self.cache_state {
            writer.set_resident(fingerprint, resident);
        }
    }

    /// Records a request in the shared cache state.
    #[inline]
    pub(crate) fn note_access(&self, fingerprint: u64, resident: bool) {
        if let Some(writer) = &self.cache_state {
            writer.record_access(fingerprint, resident, self.clock.now_ns());
        }
    }

    /// The counters as served at `/_tierstack/stats`.
    pub(crate) fn stats(&self) -> ProxyStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        let (cached_entries, cached_bytes, evictions, wasted_updates) = self
            .cache
            .lock()
            .map(|cache| (cache.len() as u64, cache.bytes() as u64, cache.evictions(), cache.waste.wasted()))
            .unwrap_or_default();
        ProxyStats {
            mode: Some(self.mode),
            requests: load(&c.requests),
            hits: load(&c.hits),
            misses: load(&c.misses),
            checks: load(&c.checks),
            checks_ok: load(&c.checks_ok),
            check_ns: load(&c.check_ns),
            stale_dropped: load(&c.stale_dropped),
            check_errors: load(&c.check_errors),
            upstream_ns: load(&c.upstream_ns),
            upstream_errors: load(&c.upstream_errors),
            upstream_retries: load(&c.upstream_retries),
            upstream_abandoned: load(&c.upstream_abandoned),
            upstream_timeouts: load(&c.upstream_timeouts),
            upstream_pauses: load(&c.upstream_pauses),
            uncacheable_deps: load(&c.uncacheable_deps),
            coalesced: load(&c.coalesced),
            waiting_on_fetch: load(&c.waiting_on_fetch),
            abandoned: load(&c.abandoned),
            cached_entries,
            cached_bytes,
            evictions,
            pushes_received: load(&c.pushes_received),
            pushes_installed: load(&c.pushes_installed),
            push_bytes: load(&c.push_bytes),
            pushes_redundant: load(&c.pushes_redundant),
            pushes_stale: load(&c.pushes_stale),
            pushes_refused: load(&c.pushes_refused),
            push_hits: load(&c.push_hits),
            wasted_updates,
            cache_state_slots: self.cache_state.as_ref().map_or(0, |w| u64::from(w.slots())),
            cache_state_dropped: self.cache_state.as_ref().map_or(0, |w| w.dropped()),
            balance: self.balancing.get().and_then(|b| b.balancer.lock().ok().map(|b| b.config().policy)),
            monitor: self.balancing.get().and_then(|b| b.source.as_ref().map(|s| s.scheme())),
            routed: self.routed.iter().map(load).collect(),
            refused_overloaded: load(&c.refused_overloaded),
            refused_no_backend: load(&c.refused_no_backend),
            monitor_reads: load(&c.monitor_reads),
            monitor_read_ns: load(&c.monitor_read_ns),
            site: self.site.get().map(|s| s.site),
            fenced: load(&c.fenced),
            not_modified: load(&c.not_modified),
            stale_served: load(&c.stale_served),
            served_on_error: load(&c.served_on_error),
            ranges_served: load(&c.ranges_served),
            revalidations: load(&c.revalidations),
            revalidated: load(&c.revalidated),
            invalidations: load(&c.invalidations),
            purges: load(&c.purges),
            upstream_bytes: load(&c.upstream_bytes),
            policy_hits: load(&c.policy_hits),
            policy_coalesced: load(&c.policy_coalesced),
            refresh_reads: load(&self.refresh.reads),
            refresh_refetches: load(&self.refresh.refetches),
            refresh_installed: load(&self.refresh.installed),
            pages_installed: load(&c.pages_installed),
            pages_unusable: load(&c.pages_unusable),
        }
    }
}
