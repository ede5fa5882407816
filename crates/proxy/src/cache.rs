//! The proxy's cache: least recently used entries evicted first, bounded by
//! the bytes of the bodies it holds.
//!
//! Requests race: a slow miss can finish after a newer copy was cached (by a
//! later miss or a push), and a version check can fail after its entry was
//! already replaced by a newer one. So an insert never replaces an entry
//! generated at newer versions ([`supersedes`]), and a removal after a failed
//! check removes only the entry that failed ([`Cache::remove_entry`]).

use crate::policy::{Freshness, Vary};
use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::StatusCode;
use lru::LruCache;
use std::sync::{Arc, OnceLock};
use tierstack_coherent::DepsHeader;
use tierstack_pushpull::WasteTracker;

/// Stored variants of one primary key (different `Vary` secondary keys)
/// at most; the oldest goes first.
pub(crate) const VARIANTS_MAX: usize = 8;

/// One cached response.
pub(crate) struct Entry {
    pub status: StatusCode,
    /// Every end-to-end header field as received (hop-by-hop fields and
    /// those named by `Connection` removed), in order.
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The dependency header, parsed: such an entry is served only after a
    /// version check (in `poll` mode), never by its freshness.
    pub deps: Option<DepsHeader>,
    /// Installed by a push from the application tier (not fetched by a miss).
    pub pushed: bool,
    /// The secondary key: the storing request's values of the fields the
    /// response varies on.
    pub vary: Vary,
    /// Freshness and age (RFC 9111 §4.2); only the age matters for an
    /// entry with dependencies.
    pub freshness: Freshness,
    /// The fields of an answer from this entry (the stored ones, then
    /// `Age` and `X-Cache`), built at the first answer: each later one
    /// clones it and sets those two values, so nothing grows or rehashes
    /// per hit.
    pub reply: OnceLock<HeaderMap>,
}

impl Entry {
    /// A pushed document (`deps_raw` is its dependency header).
    pub(crate) fn pushed(
        body: Bytes,
        content_type: Option<HeaderValue>,
        deps_raw: HeaderValue,
        deps: DepsHeader,
    ) -> Entry {
        let mut headers = HeaderMap::new();
        if let Some(content_type) = content_type {
            headers.insert(hyper::header::CONTENT_TYPE, content_type);
        }
        headers.insert(tierstack_coherent::DEPS_HEADER, deps_raw);
        let now = crate::policy::now_secs();
        Entry {
            status: StatusCode::OK,
            headers,
            body,
            deps: Some(deps),
            pushed: true,
            vary: Vary::default(),
            freshness: Freshness {
                lifetime: 0,
                initial_age: 0,
                response_time: now,
                no_cache: true,
                no_stale: true,
                stale_while_revalidate: 0,
                stale_if_error: 0,
                validators: false,
            },
            reply: OnceLock::new(),
        }
    }

    fn bytes(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
        self.body.len() + headers + 64
    }
}

/// What an insert did with the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InsertOutcome {
    Stored,
    /// Not stored: the cached entry was generated at newer versions.
    KeptNewer,
    /// Not stored: larger than an eighth of the cache.
    TooLarge,
}

/// What an insert did.
#[derive(Debug)]
pub(crate) struct Inserted {
    pub outcome: InsertOutcome,
    /// Keys evicted to make room.
    pub evicted: Vec<String>,
}

/// True if `cached` must not be replaced by `inserted`: both come from the
/// same module incarnation and `cached` holds some key they share at a
/// higher version (versions only grow within an incarnation, so `inserted`
/// was generated before an update that `cached` already reflects).
///
/// Across incarnations (the module restarted, or another module node)
/// versions are not comparable, and the inserted entry wins: it was fetched
/// or validated just now, while the cached one may belong to a dead
/// incarnation that can never pass a check again. If instead the inserted
/// one is the old incarnation's (a fetch that began before the restart), its
/// first check fails and costs one miss; coherence never depends on this
/// choice, because every hit is validated in `poll` mode.
pub(crate) fn supersedes(cached: &DepsHeader, inserted: &DepsHeader) -> bool {
    cached.node == inserted.node
        && cached.incarnation == inserted.incarnation
        && cached.deps.iter().any(|c| inserted.deps.iter().any(|i| i.key == c.key && c.version > i.version))
}

fn variants_bytes(variants: &[Arc<Entry>]) -> usize {
    variants.iter().map(|e| e.bytes()).sum()
}

/// Cached responses by primary key (authority and target), each key with
/// its variants, most recently stored first.
pub(crate) struct Cache {
    entries: LruCache<String, Vec<Arc<Entry>>>,
    bytes: usize,
    bytes_max: usize,
    evictions: u64,
    /// Pushed documents not requested since (the wasted-update metric),
    /// kept under the cache's lock so requests pay no second lock.
    pub waste: WasteTracker,
}

impl Cache {
    pub(crate) fn new(bytes_max: usize) -> Self {
        Self { entries: LruCache::unbounded(), bytes: 0, bytes_max, evictions: 0, waste: WasteTracker::default() }
    }

    /// The most recently stored variant of `key` that `request` selects
    /// (RFC 9111 §4.1), making `key` the most recently used.
    pub(crate) fn get(&mut self, key: &str, request: &HeaderMap) -> Option<Arc<Entry>> {
        self.entries.get(key)?.iter().find(|e| e.vary.matches(request)).cloned()
    }

    /// The variant of `key` that varies on nothing, without making it more
    /// recently used (pushes).
    pub(crate) fn peek(&self, key: &str) -> Option<Arc<Entry>> {
        self.entries.peek(key)?.iter().find(|e| e.vary.is_empty()).cloned()
    }

    /// Removes `entry` from `key` only if it is still stored there (the
    /// very entry a failed check looked at, not a newer one cached since);
    /// true if removed.
    pub(crate) fn remove_entry(&mut self, key: &str, entry: &Arc<Entry>) -> bool {
        let Some(variants) = self.entries.peek_mut(key) else { return false };
        let Some(at) = variants.iter().position(|v| Arc::ptr_eq(v, entry)) else { return false };
        let removed = variants.remove(at);
        self.bytes -= removed.bytes();
        if variants.is_empty() {
            self.entries.pop(key);
        }
        true
    }

    /// True if an entry of this size can be cached at all.
    pub(crate) fn admits(&self, entry: &Entry) -> bool {
        entry.bytes() <= self.object_bytes_max()
    }

    /// The largest entry the cache takes: an eighth of it.
    pub(crate) fn object_bytes_max(&self) -> usize {
        self.bytes_max / 8
    }

    /// Removes `key` with all its variants; true if it was cached.
    pub(crate) fn remove(&mut self, key: &str) -> bool {
        match self.entries.pop(key) {
            Some(old) => {
                self.bytes -= variants_bytes(&old);
                true
            }
            None => false,
        }
    }

    /// Inserts, replacing the variant with the same secondary key and
    /// evicting least recently used keys to stay within the bound. An entry
    /// larger than an eighth of the cache is not stored, nor one that would
    /// replace an entry generated at newer versions.
    pub(crate) fn insert(&mut self, key: String, entry: Arc<Entry>) -> Inserted {
        let size = entry.bytes();
        if size > self.object_bytes_max() {
            return Inserted { outcome: InsertOutcome::TooLarge, evicted: Vec::new() };
        }
        let variants = self.entries.get_or_insert_mut(key, Vec::new);
        if let Some(at) = variants.iter().position(|v| v.vary == entry.vary) {
            if let (Some(cached), Some(inserted)) = (&variants[at].deps, &entry.deps) {
                if supersedes(cached, inserted) {
                    return Inserted { outcome: InsertOutcome::KeptNewer, evicted: Vec::new() };
                }
            }
            let old = variants.remove(at);
            self.bytes -= old.bytes();
        }
        variants.insert(0, entry);
        if variants.len() > VARIANTS_MAX {
            if let Some(old) = variants.pop() {
                self.bytes -= old.bytes();
            }
        }
        self.bytes += size;
        let mut evicted = Vec::new();
        while self.bytes > self.bytes_max {
            match self.entries.pop_lru() {
                Some((key, old)) => {
                    self.bytes -= variants_bytes(&old);
                    self.evictions += 1;
                    evicted.push(key);
                }
                None => break,
            }
        }
        Inserted { outcome: InsertOutcome::Stored, evicted }
    }

    /// Stored responses (all variants).
    pub(crate) fn len(&self) -> usize {
        self.entries.iter().map(|(_, v)| v.len()).sum()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_coherent::{Dep, Incarnation};

    fn entry(size: usize) -> Arc<Entry> {
        Arc::new(Entry::pushed(
            Bytes::from(vec![0u8; size]),
            None,
            HeaderValue::from_static("n=0;i=0000000000000001;a=1@0"),
            DepsHeader { node: tierstack_fabric::NodeId(0), incarnation: Incarnation(1), deps: vec![] },
        ))
    }

    #[test]
    fn evicts_least_recently_used_within_the_byte_bound() {
        let overhead = entry(0).bytes();
        let mut cache = Cache::new(8 * (100 + overhead) * 3);
        for key in ["a", "b", "c"] {
            cache.insert(key.into(), entry(100));
        }
        assert!(cache.get("a", &HeaderMap::new()).is_some(), "touch a so b is the oldest");
        let mut evicted = Vec::new();
        for key in [
            "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x",
            "y",
        ] {
            evicted.extend(cache.insert(key.into(), entry(100)).evicted);
        }
        assert_eq!(evicted.len() as u64, cache.evictions(), "every eviction is reported");
        assert_eq!(evicted, ["b"], "24 entries fit; the 25th evicts the least recently used");
        assert!(cache.bytes() <= 8 * (100 + overhead) * 3);
        assert!(cache.get("b", &HeaderMap::new()).is_none(), "the least recently used entry went first");
        assert!(cache.evictions() > 0);
        assert_eq!(cache.insert("huge".into(), entry(10_000_000)).outcome, InsertOutcome::TooLarge);
        assert!(cache.get("huge", &HeaderMap::new()).is_none(), "oversized entries are not cached");
        let before = cache.bytes();
        assert!(cache.remove("x"));
        assert!(!cache.remove("x"));
        assert_eq!(cache.bytes(), before - entry(100).bytes());
    }

    /// An entry generated at `deps` (key, version) in module incarnation `incarnation`.
    fn at(incarnation: u64, deps: &[(&str, u64)]) -> Arc<Entry> {
        Arc::new(Entry::pushed(
            Bytes::from_static(b"x"),
            None,
            HeaderValue::from_static("n=0;i=0000000000000001;a=1@0"),
            DepsHeader {
                node: tierstack_fabric::NodeId(0),
                incarnation: Incarnation(incarnation),
                deps: deps.iter().map(|(k, v)| Dep { key: k.to_string(), version: *v, slot: 0 }).collect(),
            },
        ))
    }

    #[test]
    fn an_insert_never_replaces_an_entry_generated_at_newer_versions() {
        let mut cache = Cache::new(1 << 20);
        let v2 = at(1, &[("doc/a", 2)]);
        assert_eq!(cache.insert("/doc/a".into(), v2.clone()).outcome, InsertOutcome::Stored);
        // A slow miss generated at version 1 finishes after version 2 was cached.
        assert_eq!(cache.insert("/doc/a".into(), at(1, &[("doc/a", 1)])).outcome, InsertOutcome::KeptNewer);
        assert!(Arc::ptr_eq(&cache.get("/doc/a", &HeaderMap::new()).unwrap(), &v2), "the newer copy stays");
        assert_eq!(
            cache.insert("/doc/a".into(), at(1, &[("doc/a", 1), ("doc/b", 9)])).outcome,
            InsertOutcome::KeptNewer
        );
        // Equal or newer versions replace it, and so does another incarnation.
        for newer in [at(1, &[("doc/a", 2)]), at(1, &[("doc/a", 3)]), at(1, &[("doc/b", 1)]), at(3, &[("doc/a", 1)])] {
            assert_eq!(cache.insert("/doc/a".into(), newer.clone()).outcome, InsertOutcome::Stored);
            assert!(Arc::ptr_eq(&cache.get("/doc/a", &HeaderMap::new()).unwrap(), &newer));
        }
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.bytes(), v2.bytes(), "replacements keep the byte count exact");
    }

    #[test]
    fn a_failed_check_removes_only_the_entry_it_checked() {
        let mut cache = Cache::new(1 << 20);
        let checked = at(1, &[("doc/a", 1)]);
        cache.insert("/doc/a".into(), checked.clone());
        let newer = at(1, &[("doc/a", 2)]);
        cache.insert("/doc/a".into(), newer.clone());
        assert!(!cache.remove_entry("/doc/a", &checked), "the checked entry was already replaced");
        assert!(Arc::ptr_eq(&cache.get("/doc/a", &HeaderMap::new()).unwrap(), &newer));
        assert!(cache.remove_entry("/doc/a", &newer));
        assert_eq!((cache.len(), cache.bytes()), (0, 0));
    }
}
