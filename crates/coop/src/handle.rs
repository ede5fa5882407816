//! The handle a proxy process holds: fetch, store, validate and invalidate
//! a cached HTTP response under the scheme chosen at start.
//!
//! A response is opaque bytes (the proxy serializes status, headers and body
//! as it likes) plus small metadata ([`Meta`]): the cache key it was stored
//! under, its length, and for a response with dependencies the version tuple
//! it was fetched at (the `X-Tierstack-Deps` value, kept as text: the proxy
//! parses it and runs its usual version check before serving a copy).
//!
//! **Envelope.** The entity the service caches is the envelope
//! `magic u32 | key length u32 | key | deps length u32 (u32::MAX: none) |
//! deps | body length u64 | body` (little-endian). The service names
//! entities by a 64-bit fingerprint of the key; a fetched envelope whose key
//! is not the one asked for (a fingerprint collision) or that does not parse
//! is a miss, never another response's bytes.
//!
//! **Never an error.** Every failure (a dead holder or home, a silent peer,
//! a full pool, an entity too large, a malformed envelope) is a miss or an
//! entity left uncached; only [`CoopHandle::start`] can fail.
//!
//! **Async-friendly.** A local hit is copied out under the node's state lock
//! on the caller's task (no message, no wait). Anything that may read a peer
//! or wait for a message (bounded by the service's `ack_timeout`) runs on
//! tokio's blocking pool (`spawn_blocking`), never on a runtime worker.
//!
//! **Versions.** A miss returns a [`Ticket`] with the entity's version at its
//! home read at that moment (one one-sided read); the store that follows
//! records the copy at that version, so a copy loaded before an invalidate
//! that overtook it carries the old version and [`CoopHandle::validate`]
//! refuses it. Under AC and groupcache there are no homes' versions: the
//! ticket holds 0, invalidate drops the copies it can reach (AC: this node's;
//! groupcache: the owner's).

use crate::key::fingerprint;
use crate::service::{CoopConfig, CoopNode, Lookup, ServiceError, ServiceStats};
use crate::{Key, Scheme};
use std::sync::Arc;
use tierstack_fabric::{Fabric, NodeId};

const MAGIC: u32 = 0x5443_4531; // "TCE1"

/// A cached response's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The cache key it was stored under.
    pub key: String,
    /// The body's length in bytes.
    pub length: u64,
    /// For a response with dependencies: the version tuple it was fetched
    /// at (the `X-Tierstack-Deps` header value).
    pub deps: Option<String>,
}

/// Where a hit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Local,
    Remote { holder: NodeId },
}

/// A cached response found by [`CoopHandle::fetch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    pub meta: Meta,
    pub body: Vec<u8>,
    pub source: Source,
    /// The copy's version at its home (see the module docs).
    pub version: u64,
}

/// What a miss hands to the store that follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    key: String,
    /// The home's version when the miss happened; `None` if the home could
    /// not be read (the response is then not stored).
    version: Option<u64>,
}

/// What [`CoopHandle::fetch`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    Hit(Cached),
    Miss(Ticket),
}

/// Encodes a response as the entity the service caches.
pub fn encode(key: &str, deps: Option<&str>, body: &[u8]) -> Vec<u8> {
    let deps_bytes = deps.map(str::as_bytes);
    let mut out = Vec::with_capacity(20 + key.len() + deps_bytes.map_or(0, <[u8]>::len) + body.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    match deps_bytes {
        None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
        Some(d) => {
            out.extend_from_slice(&(d.len() as u32).to_le_bytes());
            out.extend_from_slice(d);
        }
    }
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Decodes an entity; `None` if it is not a well-formed envelope.
pub fn decode(bytes: &[u8]) -> Option<(Meta, Vec<u8>)> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head)
    }
    let mut b = bytes;
    let u32_of = |s: &[u8]| s.try_into().ok().map(u32::from_le_bytes);
    if u32_of(take(&mut b, 4)?)? != MAGIC {
        return None;
    }
    let key_len = u32_of(take(&mut b, 4)?)? as usize;
    let key = std::str::from_utf8(take(&mut b, key_len)?).ok()?.to_string();
    let deps_len = u32_of(take(&mut b, 4)?)?;
    let deps = if deps_len == u32::MAX {
        None
    } else {
        Some(std::str::from_utf8(take(&mut b, deps_len as usize)?).ok()?.to_string())
    };
    let length = u64::from_le_bytes(take(&mut b, 8)?.try_into().ok()?);
    if b.len() as u64 != length {
        return None;
    }
    Some((Meta { key, length, deps }, b.to_vec()))
}

/// The service's name for a cache key.
pub fn entity_key(key: &str) -> Key {
    fingerprint(key.as_bytes())
}

/// A proxy's handle on the cooperative cache (cheap to clone, thread-safe).
#[derive(Clone)]
pub struct CoopHandle {
    node: Arc<CoopNode>,
    scheme: Scheme,
}

impl CoopHandle {
    /// Starts this node's part of the service on `fabric` (it must be one of
    /// `config.active`: a passive node runs [`CoopNode`] alone).
    pub fn start(fabric: Arc<dyn Fabric>, config: CoopConfig) -> Result<Self, ServiceError> {
        if !config.active.contains(&fabric.local_node()) {
            return Err(ServiceError::Passive);
        }
        let scheme = config.scheme;
        Ok(Self { node: Arc::new(CoopNode::start(fabric, config)?), scheme })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Looks `key` up: a local hit at once, else (on the blocking pool) a
    /// remote hit or a miss with its ticket.
    pub async fn fetch(&self, key: &str) -> Fetched {
        let k = entity_key(key);
        if let Some((entity, version)) = self.node.get_local(k) {
            if let Some(hit) = Self::hit(key, &entity, Source::Local, version) {
                return Fetched::Hit(hit);
            }
        }
        let node = self.node.clone();
        let owned = key.to_string();
        let scheme = self.scheme;
        let found = tokio::task::spawn_blocking(move || {
            let lookup = node.get(k).unwrap_or(Lookup::Miss);
            let hit = match lookup {
                Lookup::Local { body, version } => Self::hit(&owned, &body, Source::Local, version),
                Lookup::Remote { body, version, holder } => {
                    Self::hit(&owned, &body, Source::Remote { holder }, version)
                }
                Lookup::Miss => None,
            };
            match hit {
                Some(hit) => Fetched::Hit(hit),
                None => {
                    let version =
                        if matches!(scheme, Scheme::Ac | Scheme::Groupcache) { Some(0) } else { node.validate(k) };
                    Fetched::Miss(Ticket { key: owned, version })
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| Fetched::Miss(Ticket { key: key.to_string(), version: None }))
    }

    /// A ticket for storing `key` without a miss before (a pushed or
    /// revalidated response): the home's version read now.
    pub async fn ticket(&self, key: &str) -> Ticket {
        let owned = key.to_string();
        if matches!(self.scheme, Scheme::Ac | Scheme::Groupcache) {
            return Ticket { key: owned, version: Some(0) };
        }
        let node = self.node.clone();
        let k = entity_key(key);
        let version = tokio::task::spawn_blocking(move || node.validate(k)).await.ok().flatten();
        Ticket { key: owned, version }
    }

    fn hit(key: &str, entity: &[u8], source: Source, version: u64) -> Option<Cached> {
        let (meta, body) = decode(entity)?;
        (meta.key == key).then_some(Cached { meta, body, source, version })
    }

    /// Cache Store of a response after the miss that gave `ticket` (it
    /// replaces this node's own copy, if any). Not
    /// stored (silently) when the home could not be read at the miss, when
    /// it is too large for the pool, or when no room can be made.
    pub async fn store(&self, ticket: Ticket, deps: Option<String>, body: Vec<u8>) {
        let Some(version) = ticket.version else { return };
        let entity = encode(&ticket.key, deps.as_deref(), &body);
        if !crate::pool::cacheable(entity.len() as u64) {
            return;
        }
        let node = self.node.clone();
        let k = entity_key(&ticket.key);
        let _ = tokio::task::spawn_blocking(move || {
            // A newer response replaces this node's copy.
            node.drop_local(k);
            node.put(k, version, &entity)
        })
        .await;
    }

    /// Cache Validate: whether `cached`'s copy is at its home's current
    /// version (one one-sided read; `false` if the home cannot be read).
    pub async fn validate(&self, cached: &Cached) -> bool {
        if matches!(self.scheme, Scheme::Ac | Scheme::Groupcache) {
            return true;
        }
        let node = self.node.clone();
        let k = entity_key(&cached.meta.key);
        let version = cached.version;
        tokio::task::spawn_blocking(move || node.validate(k) == Some(version)).await.unwrap_or(false)
    }

    /// Cache Invalidate of `key`: the home drops every copy and bumps the
    /// version (AC: this node's copy; groupcache: the owner's).
    pub async fn invalidate(&self, key: &str) {
        let node = self.node.clone();
        let k = entity_key(key);
        let scheme = self.scheme;
        let _ = tokio::task::spawn_blocking(move || {
            if scheme == Scheme::Ac {
                node.drop_local(k);
            } else {
                node.invalidate(k);
            }
        })
        .await;
    }

    pub fn stats(&self) -> ServiceStats {
        self.node.stats()
    }

    /// The service node under the handle (its counters, what it holds).
    pub fn node(&self) -> &CoopNode {
        &self.node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_anything_else_is_refused() {
        for deps in [None, Some("n=1;i=0000000000000002;a=3@4"), Some("")] {
            let e = encode("example.org/x?y", deps, b"hello");
            let (meta, body) = decode(&e).unwrap();
            assert_eq!(meta, Meta { key: "example.org/x?y".into(), length: 5, deps: deps.map(String::from) });
            assert_eq!(body, b"hello");
            for cut in 0..e.len() {
                assert!(decode(&e[..cut]).is_none(), "cut at {cut}");
            }
            let mut longer = e.clone();
            longer.push(0);
            assert!(decode(&longer).is_none());
        }
        assert!(decode(&[0; 64]).is_none());
        let mut bad_len = encode("k", None, b"x");
        bad_len[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&bad_len).is_none());
    }
}
