//! What an upstream answer does to the cache: storing a response as an
//! entry (with dependencies: a 200 served only after a version check; else
//! by RFC 9111 freshness), and invalidation after an unsafe method (§4.4).

use crate::cache::{Entry, InsertOutcome};
use crate::forward::Fetched;
use crate::headers::{end_to_end, target_of};
use crate::policy::{self, Vary};
use crate::state::State;
use bytes::Bytes;
use hyper::header::{HeaderMap, CONTENT_LOCATION, LOCATION};
use hyper::{Method, StatusCode, Uri};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use tierstack_coherent::{DepsHeader, DEPS_HEADER};

/// After an unsafe method succeeded: drops the target and the same-origin
/// `Location` and `Content-Location` targets (RFC 9111 §4.4).
pub(crate) fn invalidate(state: &State, key: &str, response: &HeaderMap) {
    let authority = &key[..key.len() - target_of(key).len()];
    let mut removed = u64::from(state.cache_remove(key));
    for field in [LOCATION, CONTENT_LOCATION] {
        let Some(Ok(Ok(uri))) = response.get(field).map(|v| v.to_str().map(|v| v.trim().parse::<Uri>())) else {
            continue;
        };
        let same_origin = match uri.authority() {
            None => uri.path().starts_with('/'),
            Some(other) => other.as_str().eq_ignore_ascii_case(authority),
        };
        if same_origin {
            let target = uri.path_and_query().map_or("/", |p| p.as_str());
            removed += u64::from(state.cache_remove(&format!("{authority}{target}")));
        }
    }
    state.counters.invalidations.fetch_add(removed, Ordering::Relaxed);
}

/// Caches a fetched response to `GET key` (the client's `request` fields)
/// if it may be; returns the entry if it is cacheable, for the requests
/// waiting on this fetch (they check and validate it themselves), even
/// when a newer copy already cached was kept instead.
pub(crate) fn maybe_store(state: &State, key: &str, request: &HeaderMap, fetched: &Fetched) -> Option<Arc<Entry>> {
    let response = Stored {
        status: fetched.parts.status,
        headers: end_to_end(&fetched.parts.headers),
        body: fetched.body.clone(),
        request_time: fetched.request_time,
        response_time: fetched.response_time,
    };
    store(state, key, request, response)
}

/// A response to store: its end-to-end fields only.
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) request_time: u64,
    pub(crate) response_time: u64,
}

/// [`maybe_store`] of a response whose fields are end-to-end already.
pub(crate) fn store(state: &State, key: &str, request: &HeaderMap, response: Stored) -> Option<Arc<Entry>> {
    let Stored { status, mut headers, body, request_time, response_time } = response;
    let (freshness, deps) = match headers.get(DEPS_HEADER) {
        // Dependencies: stored only as a 200 nothing forbids storing; served
        // only after a version check, so no freshness applies.
        Some(raw) => {
            let (cc, _) = policy::response_directives(&headers);
            let request_cc = policy::request_directives(request);
            if status != StatusCode::OK
                || policy::refusal(&Method::GET, request, &request_cc, status, &headers, &cc, state.set_cookie)
                    .is_some()
            {
                return None;
            }
            let parsed =
                raw.to_str().map_err(|e| e.to_string()).and_then(|s| DepsHeader::parse(s).map_err(|e| e.to_string()));
            let deps = match parsed {
                Ok(deps) => deps,
                Err(e) => {
                    state.counters.uncacheable_deps.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(key, error = %e, "not caching: malformed dependency header");
                    return None;
                }
            };
            let freshness = policy::Freshness {
                lifetime: 0,
                initial_age: policy::initial_age(&headers, request_time, response_time),
                response_time,
                no_cache: true,
                no_stale: true,
                stale_while_revalidate: 0,
                stale_if_error: 0,
                validators: false,
            };
            (freshness, Some(deps))
        }
        None => {
            let freshness = policy::storable(
                &Method::GET,
                request,
                status,
                &headers,
                (request_time, response_time),
                state.set_cookie,
            )
            .ok()?;
            (freshness, None)
        }
    };
    let vary = Vary::key(&Vary::of(&headers)?, request, &headers);
    // The client that fetched it has its cookies; the stored copy keeps
    // them only if the operator said so (`--set-cookie store`).
    state.set_cookie.strip(&mut headers);
    let entry = Arc::new(Entry { status, headers, body, deps, pushed: false, vary, freshness, reply: OnceLock::new() });
    match state.cache_store(key, entry.clone()) {
        Some(InsertOutcome::Stored | InsertOutcome::KeptNewer) => Some(entry),
        // Too large for the proxy's own cache, but pooled.
        Some(InsertOutcome::TooLarge) if state.coop.get().is_some() => Some(entry),
        Some(InsertOutcome::TooLarge) | None => None,
    }
}
