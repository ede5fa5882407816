//! Revalidation of a stored response without dependencies (RFC 9111
//! §4.3): the conditional request, what its answer does to the cache, and
//! `stale-while-revalidate` / `stale-if-error`.

use crate::cache::Entry;
use crate::forward::{fetch, Fetched};
use crate::handler::respond;
use crate::headers::{end_to_end, target_of, upstream_fields, CONDITIONALS};
use crate::policy;
use crate::stale;
use crate::state::State;
use crate::store::maybe_store;
use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue, SET_COOKIE};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use tierstack_tier_http::Body;

/// Revalidates the stored `entry` (§4.3): a conditional GET with its
/// validators (unconditional if it has none); a 304 refreshes it and it
/// answers; a new response replaces it; a failure answers with it if
/// `stale-if-error` or the operator's grace allows (`stale`).
pub(crate) async fn revalidate<B>(
    state: &Arc<State>,
    request: Request<B>,
    key: &str,
    entry: Arc<Entry>,
    request_cc: &policy::Directives,
) -> Response<Body> {
    let (parts, _) = request.into_parts();
    let outcome = refresh(state, key, &parts.headers, &entry).await;
    let now = policy::now_secs();
    match outcome {
        Refreshed::Entry(fresh, cookies) => {
            let mut response = respond(&fresh, &parts.headers, &parts.method, now, "MISS");
            // The 304's cookies are this client's, even when the stored
            // copy may not keep them.
            for cookie in cookies {
                response.headers_mut().append(SET_COOKIE, cookie);
            }
            response
        }
        Refreshed::Response(fetched) if !stale::is_failure(fetched.parts.status) => {
            let mut response = fetched.into_response();
            if parts.method == Method::HEAD {
                *response.body_mut() = Body::default();
            }
            response
        }
        Refreshed::Failed(response) if !stale::is_failure(response.status()) => response,
        Refreshed::Response(_) | Refreshed::Failed(_)
            if stale::may_serve(&entry, request_cc, now, state.stale_on_error_secs) =>
        {
            state.counters.stale_served.fetch_add(1, Ordering::Relaxed);
            state.counters.served_on_error.fetch_add(1, Ordering::Relaxed);
            respond(&entry, &parts.headers, &parts.method, now, "MISS")
        }
        Refreshed::Response(fetched) => fetched.into_response(),
        Refreshed::Failed(response) => response,
    }
}

/// What a revalidation ended with.
enum Refreshed {
    /// The stored entry, its fields updated by a 304, and the 304's
    /// `Set-Cookie` lines the stored copy did not keep.
    Entry(Arc<Entry>, Vec<HeaderValue>),
    /// A full response from the upstream (stored if it may be).
    Response(Fetched),
    /// No answer (the error response for the client).
    Failed(Response<Body>),
}

/// The conditional request of a revalidation and what its answer does to
/// the cache (§4.3.3, §4.3.4). `request` is the client's: its fields go
/// upstream except its own conditions.
async fn refresh(state: &State, key: &str, request: &HeaderMap, entry: &Arc<Entry>) -> Refreshed {
    let mut headers = upstream_fields(request);
    for name in &CONDITIONALS {
        headers.remove(name);
    }
    for (name, value) in policy::validators(&entry.headers) {
        headers.insert(name, value);
    }
    state.counters.revalidations.fetch_add(1, Ordering::Relaxed);
    let fetched = match fetch(state, &Method::GET, target_of(key), headers.clone(), Bytes::new()).await {
        Ok(fetched) => fetched,
        Err(response) => return Refreshed::Failed(response),
    };
    if fetched.parts.status != StatusCode::NOT_MODIFIED {
        if fetched.parts.status.is_server_error() {
            return Refreshed::Response(fetched);
        }
        if maybe_store(state, key, request, &fetched).is_none() {
            state.cache_remove_entry(key, entry);
        }
        return Refreshed::Response(fetched);
    }
    let update = end_to_end(&fetched.parts.headers);
    if !policy::not_modified_selects(&entry.headers, &update) {
        // The 304 names a validator the stored response does not have: it
        // updates nothing (§4.3.4 "MUST NOT use the new response to update
        // any stored responses"). It still answers the condition on the
        // stored validator ("not modified", RFC 9110 §15.4.5), so this
        // request gets the stored response as it is; it stays stale, and
        // the next request revalidates again. Never a second, unconditional
        // request whose answer (whatever it is) would reach the client.
        return Refreshed::Entry(entry.clone(), Vec::new());
    }
    state.counters.revalidated.fetch_add(1, Ordering::Relaxed);
    let mut headers = policy::updated_headers(&entry.headers, &update);
    let times = (fetched.request_time, fetched.response_time);
    let freshness = policy::storable(&Method::GET, request, entry.status, &headers, times, state.set_cookie);
    let cookies = if state.set_cookie == policy::SetCookie::Store {
        Vec::new()
    } else {
        update.get_all(SET_COOKIE).iter().cloned().collect()
    };
    state.set_cookie.strip(&mut headers);
    let refreshed = Arc::new(Entry {
        status: entry.status,
        body: entry.body.clone(),
        deps: None,
        pushed: false,
        vary: entry.vary.clone(),
        freshness: freshness.unwrap_or(entry.freshness),
        headers,
        reply: OnceLock::new(),
    });
    state.cache_remove_entry(key, entry);
    if freshness.is_ok() {
        state.cache_store(key, refreshed.clone());
    }
    Refreshed::Entry(refreshed, cookies)
}

/// Serves stale now and revalidates behind (RFC 5861 `stale-while-
/// revalidate`): one background revalidation per key at a time.
pub(crate) fn revalidate_in_background(state: &Arc<State>, key: &str, request: &HeaderMap, entry: &Arc<Entry>) {
    let Ok(mut revalidating) = state.revalidating.lock() else { return };
    if !revalidating.insert(key.to_string()) {
        return;
    }
    drop(revalidating);
    let (state, key, request, entry) = (state.clone(), key.to_string(), request.clone(), entry.clone());
    tokio::spawn(async move {
        let _ = refresh(&state, &key, &request, &entry).await;
        if let Ok(mut revalidating) = state.revalidating.lock() {
            revalidating.remove(&key);
        }
    });
}
