//! `--coop`: the proxy's cached responses shared with its peers through the
//! cooperative cache (`tierstack_coop`, issue 12), under the scheme chosen at
//! start (AC, BCC, CCWR, MTACC, HYBCC, groupcache).
//!
//! The cooperative pool sits behind the proxy's own cache (`--cache-bytes`:
//! a private first level; 0 makes the pool the whole cache, the paper's
//! configuration). A request the proxy's cache cannot answer asks the pool
//! (`CoopHandle::fetch`: this node's pool, a peer's by a one-sided read, or
//! the owner by a message for groupcache); what it gets is served under the
//! same rules as the proxy's own copy:
//! - a response **with dependencies** only after the usual version check
//!   (`State::usable`), so cooperation never weakens coherence; a copy
//!   that fails it is invalidated in the pool (every copy, at its home);
//! - a static response only while fresh (RFC 9111 §4.2; a stale one is a
//!   miss here: the proxy's own revalidation path is for its own copies);
//! - only responses without `Vary` are shared (variants stay private).
//!
//! **Pool keys.** A request that names this proxy itself (its authority is
//! the proxy's own, `--default-authority` or the listener's address) is
//! pooled under the shared authority [`SHARED_AUTHORITY`]: the proxies of a
//! topology front the same upstreams, so `GET /doc/x` sent to any of them
//! is one document. A request naming another authority (a virtual host) is
//! pooled under it.
//!
//! Every response the proxy stores goes into the pool too (encoded below,
//! the envelope's metadata carrying the key, the length and the deps tuple),
//! at the home version read at its miss (the miss's ticket); a purge or an
//! unsafe method's invalidation invalidates it in the pool. Every failure of
//! the pool (dead holder or home, full pool) is a miss, never an error.

use crate::cache::Entry;
use crate::policy::{Freshness, Vary};
use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::StatusCode;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_coherent::{DepsHeader, DEPS_HEADER};
use tierstack_coop::handle::{Fetched, Source, Ticket};
use tierstack_coop::CoopHandle;

/// Misses whose ticket waits for the response's store, at most (a miss
/// whose response is never stored leaves its ticket; past this, the oldest
/// are forgotten and such a store reads a fresh ticket).
const TICKETS_MAX: usize = 4096;

const FORMAT: u8 = 1;

/// The largest body the proxy stores through the pool (its largest entity
/// is 256 KiB, envelope and stored headers included).
pub(crate) const OBJECT_BYTES_MAX: usize = 192 << 10;

/// The authority under which requests naming a proxy itself are pooled.
pub(crate) const SHARED_AUTHORITY: &str = "*";

/// Counters of the proxy's use of the pool.
#[derive(Default)]
pub(crate) struct CoopCounters {
    pub local_hits: AtomicU64,
    pub remote_hits: AtomicU64,
    pub misses: AtomicU64,
    /// Copies found but not served: failed version check, stale, other variant.
    pub unusable: AtomicU64,
    pub stored: AtomicU64,
    pub invalidated: AtomicU64,
}

/// A snapshot of [`CoopCounters`] and the node's service counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CoopStats {
    pub scheme: String,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    pub unusable: u64,
    pub stored: u64,
    pub invalidated: u64,
    pub service: tierstack_coop::service::ServiceStats,
}

pub(crate) struct CoopLayer {
    handle: CoopHandle,
    /// This proxy's own authority (lower case), pooled as [`SHARED_AUTHORITY`].
    own_authority: String,
    tickets: Mutex<HashMap<String, Ticket>>,
    pub counters: CoopCounters,
}

impl CoopLayer {
    pub(crate) fn new(handle: CoopHandle, own_authority: &str) -> Self {
        Self {
            handle,
            own_authority: own_authority.to_ascii_lowercase(),
            tickets: Mutex::new(HashMap::new()),
            counters: CoopCounters::default(),
        }
    }

    /// The service node under the pool (its `/metrics` families).
    pub(crate) fn node(&self) -> &tierstack_coop::service::CoopNode {
        self.handle.node()
    }

    /// The pool's name for the cache key `key` (see the module docs).
    pub(crate) fn pool_key(&self, key: &str) -> String {
        match key.strip_prefix(self.own_authority.as_str()) {
            Some(target) if target.starts_with('/') => format!("{SHARED_AUTHORITY}{target}"),
            _ => key.to_string(),
        }
    }

    /// The pool's copy of `key`, decoded, and where it came from; a miss
    /// keeps its ticket for the store that follows.
    pub(crate) async fn fetch(&self, key: &str) -> Option<(Arc<Entry>, Source)> {
        let key = self.pool_key(key);
        match self.handle.fetch(&key).await {
            Fetched::Hit(hit) => match decode(&hit.body) {
                Some(entry) => Some((Arc::new(entry), hit.source)),
                None => {
                    self.counters.unusable.fetch_add(1, Ordering::Relaxed);
                    None
                }
            },
            Fetched::Miss(ticket) => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut tickets) = self.tickets.lock() {
                    if tickets.len() >= TICKETS_MAX {
                        tickets.clear();
                    }
                    tickets.insert(key, ticket);
                }
                None
            }
        }
    }

    pub(crate) fn served(&self, source: Source) {
        let counter = match source {
            Source::Local => &self.counters.local_hits,
            Source::Remote { .. } => &self.counters.remote_hits,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn unusable(&self) {
        self.counters.unusable.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores `entry` under `key` in the pool (in the background). Only
    /// responses without `Vary` are shared; a store without a ticket from
    /// its miss (a push, a revalidation) reads one now.
    pub(crate) fn store(self: &Arc<Self>, key: &str, entry: &Entry) {
        if !entry.vary.is_empty() {
            return;
        }
        let Some(bytes) = encode(entry) else { return };
        let deps = entry.headers.get(DEPS_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
        let key = self.pool_key(key);
        let ticket = self.tickets.lock().ok().and_then(|mut t| t.remove(&key));
        let layer = self.clone();
        tokio::spawn(async move {
            let ticket = match ticket {
                Some(t) => t,
                None => layer.handle.ticket(&key).await,
            };
            layer.handle.store(ticket, deps, bytes).await;
            layer.counters.stored.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// Drops every copy of `key` in the pool (in the background).
    pub(crate) fn invalidate(self: &Arc<Self>, key: &str) {
        let key = self.pool_key(key);
        if let Ok(mut tickets) = self.tickets.lock() {
            tickets.remove(&key);
        }
        let layer = self.clone();
        tokio::spawn(async move {
            layer.handle.invalidate(&key).await;
            layer.counters.invalidated.fetch_add(1, Ordering::Relaxed);
        });
    }

    pub(crate) fn stats(&self) -> CoopStats {
        let c = &self.counters;
        CoopStats {
            scheme: self.handle.scheme().name().to_string(),
            local_hits: c.local_hits.load(Ordering::Relaxed),
            remote_hits: c.remote_hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            unusable: c.unusable.load(Ordering::Relaxed),
            stored: c.stored.load(Ordering::Relaxed),
            invalidated: c.invalidated.load(Ordering::Relaxed),
            service: self.handle.stats(),
        }
    }
}

/// A stored response as the pool keeps it: `format u8 | status u16 |
/// lifetime, initial age, response time, stale-while-revalidate,
/// stale-if-error u64 | flags u8 (no-cache, no-stale, validators, pushed) |
/// header count u32 | (name length u16, name, value length u32, value)* |
/// body` (little-endian). `None` for an entry with a secondary key.
pub(crate) fn encode(entry: &Entry) -> Option<Vec<u8>> {
    if !entry.vary.is_empty() {
        return None;
    }
    let f = &entry.freshness;
    let mut out = Vec::with_capacity(64 + entry.body.len());
    out.push(FORMAT);
    out.extend_from_slice(&entry.status.as_u16().to_le_bytes());
    for v in [f.lifetime, f.initial_age, f.response_time, f.stale_while_revalidate, f.stale_if_error] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let flags =
        u8::from(f.no_cache) | u8::from(f.no_stale) << 1 | u8::from(f.validators) << 2 | u8::from(entry.pushed) << 3;
    out.push(flags);
    out.extend_from_slice(&(entry.headers.len() as u32).to_le_bytes());
    for (name, value) in &entry.headers {
        out.extend_from_slice(&(name.as_str().len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(&entry.body);
    Some(out)
}

/// Decodes [`encode`]'s bytes; `None` if they are not a well-formed entry
/// (or its dependency header does not parse).
pub(crate) fn decode(bytes: &[u8]) -> Option<Entry> {
    struct R<'a>(&'a [u8]);
    impl<'a> R<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.0.len() < n {
                return None;
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(head)
        }
        fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }
        fn u32(&mut self) -> Option<u32> {
            Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
        }
        fn u16(&mut self) -> Option<u16> {
            Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
        }
    }
    let mut r = R(bytes);
    if r.take(1)? != [FORMAT] {
        return None;
    }
    let status = StatusCode::from_u16(r.u16()?).ok()?;
    let (lifetime, initial_age, response_time, swr, sie) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let flags = r.take(1)?[0];
    let count = r.u32()? as usize;
    if count > r.0.len() {
        return None;
    }
    let mut headers = HeaderMap::with_capacity(count);
    for _ in 0..count {
        let n = r.u16()? as usize;
        let name = HeaderName::from_bytes(r.take(n)?).ok()?;
        let n = r.u32()? as usize;
        let value = HeaderValue::from_bytes(r.take(n)?).ok()?;
        headers.append(name, value);
    }
    let deps = match headers.get(DEPS_HEADER) {
        None => None,
        Some(v) => Some(DepsHeader::parse(v.to_str().ok()?).ok()?),
    };
    Some(Entry {
        status,
        headers,
        body: Bytes::copy_from_slice(r.0),
        deps,
        pushed: flags & 8 != 0,
        vary: Vary::default(),
        freshness: Freshness {
            lifetime,
            initial_age,
            response_time,
            no_cache: flags & 1 != 0,
            no_stale: flags & 2 != 0,
            stale_while_revalidate: swr,
            stale_if_error: sie,
            validators: flags & 4 != 0,
        },
        reply: std::sync::OnceLock::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(deps: Option<&str>) -> Entry {
        let mut headers = HeaderMap::new();
        headers.insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.append(hyper::header::SET_COOKIE, HeaderValue::from_static("a=1"));
        headers.append(hyper::header::SET_COOKIE, HeaderValue::from_static("b=2"));
        if let Some(d) = deps {
            headers.insert(DEPS_HEADER, HeaderValue::from_str(d).unwrap());
        }
        Entry {
            status: StatusCode::NON_AUTHORITATIVE_INFORMATION,
            headers,
            body: Bytes::from_static(b"hello, pool"),
            deps: deps.map(|d| DepsHeader::parse(d).unwrap()),
            pushed: deps.is_some(),
            vary: Vary::default(),
            freshness: Freshness {
                lifetime: 60,
                initial_age: 3,
                response_time: 1_700_000_000,
                no_cache: false,
                no_stale: true,
                stale_while_revalidate: 5,
                stale_if_error: 7,
                validators: true,
            },
            reply: std::sync::OnceLock::new(),
        }
    }

    #[test]
    fn requests_naming_the_proxy_itself_share_one_pool_key() {
        use tierstack_fabric_shm::{ShmConfig, ShmFabric};
        let dir = tempfile::tempdir().unwrap();
        let node = tierstack_fabric::NodeId(0);
        let fabric = ShmFabric::open(ShmConfig::new(dir.path(), node).with_nodes(vec![node])).unwrap();
        let config = tierstack_coop::service::CoopConfig::new(
            tierstack_coop::Scheme::Ac,
            vec![tierstack_fabric::NodeId(0)],
            Vec::new(),
            1 << 16,
        );
        let handle = CoopHandle::start(fabric, config).unwrap();
        let layer = CoopLayer::new(handle, "127.0.0.1:8080");
        assert_eq!(layer.pool_key("127.0.0.1:8080/doc/a?x=1"), "*/doc/a?x=1");
        assert_eq!(layer.pool_key("www.example.org/doc/a"), "www.example.org/doc/a");
        assert_eq!(layer.pool_key("127.0.0.1:80801/doc/a"), "127.0.0.1:80801/doc/a");
    }

    #[test]
    fn entries_round_trip_through_the_pool_format_and_garbage_is_refused() {
        for deps in [None, Some("n=1;i=00000000000000a1;page/1=3@4")] {
            let e = entry(deps);
            let bytes = encode(&e).unwrap();
            let d = decode(&bytes).unwrap();
            assert_eq!((d.status, &d.headers, &d.body, &d.deps), (e.status, &e.headers, &e.body, &e.deps));
            assert_eq!((d.freshness, d.pushed, d.vary.is_empty()), (e.freshness, e.pushed, true));
            // Cut anywhere in the head: refused (a cut body is the caller's
            // envelope's business: it carries the length).
            let head = bytes.len() - e.body.len();
            for cut in 0..head {
                assert!(decode(&bytes[..cut]).is_none(), "cut at {cut}");
            }
        }
        let mut bad = encode(&entry(Some("n=1;i=00000000000000a1;page/1=3@4"))).unwrap();
        bad[0] = 9;
        assert!(decode(&bad).is_none(), "unknown format");
    }
}
