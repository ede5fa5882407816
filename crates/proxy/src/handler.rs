//! The client listener's request handler: classifies each request as a
//! hit, coalesced or a miss, and answers from a stored entry.
//!
//! Whether a stored entry may answer is decided in one place,
//! [`State::usable`], for the proxy's own copy, the cooperative pool's and
//! another request's shared fetch: an entry with dependencies only after
//! its version check (or in `ttl` mode), any other by RFC 9111 freshness.
//! A GET's ranges are served from an entry under that same decision
//! (`range`); a range request the cache does not answer so passes through.

use crate::admin::ADMIN_PATH_PREFIX;
use crate::cache::Entry;
use crate::forward::forward;
use crate::headers::{age_value, cache_key, flight_key, target_of, X_CACHE_COALESCED, X_CACHE_NAME};
use crate::policy::{self, Directives, Usable};
use crate::published;
use crate::range::{self, Asked};
use crate::revalidate::{revalidate, revalidate_in_background};
use crate::stale;
use crate::state::State;
use crate::stats::elapsed_ns;
use crate::stream::ProxyBody;
use crate::{coalesce, CacheMode};
use http_body_util::Full;
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AGE, CACHE_CONTROL, CONTENT_LOCATION, DATE, ETAG, EXPIRES, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, LAST_MODIFIED, RANGE, VARY,
};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tierstack_pushpull::fingerprint;
use tierstack_tier_http::{text, Body};

/// A request not yet classified as a hit, coalesced or a miss; counted as
/// abandoned if its handling is dropped (cancelled) before it is.
struct Unserved<'a> {
    abandoned: &'a AtomicU64,
    pending: bool,
}

impl Drop for Unserved<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One request in the `waiting_on_fetch` gauge, until it is dropped (also
/// when its handling is cancelled mid-wait).
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn start(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The request's `Cache-Control` directives, parsed only when a freshness
/// decision needs them (not on a hit of a response with dependencies).
struct RequestDirectives<'a> {
    headers: &'a HeaderMap,
    parsed: OnceLock<Directives>,
}

impl RequestDirectives<'_> {
    fn get(&self) -> &Directives {
        self.parsed.get_or_init(|| policy::request_directives(self.headers))
    }
}

/// What a stored entry may do for one request ([`State::usable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Usability {
    /// Answer with it: its versions checked current (or `ttl` mode), or fresh.
    Serve,
    /// Answer with it and revalidate it behind (`stale-while-revalidate`).
    ServeStale,
    /// Stale: revalidate it with the upstream before answering (§4.3).
    Revalidate,
    /// Its versions changed: never served; the application may have
    /// published the new page.
    Changed,
    /// Its versions could not be read: never served (fail closed).
    OutOfDate,
}

/// The client listener's requests.
pub(crate) async fn handle<B>(state: Arc<State>, mut request: Request<B>) -> Response<ProxyBody>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if request.uri().path().starts_with(ADMIN_PATH_PREFIX) {
        return text(StatusCode::NOT_FOUND, "admin endpoints are served on the proxy's admin listener only\n")
            .map(Into::into);
    }
    state.counters.requests.fetch_add(1, Ordering::Relaxed);
    // Counts the request as abandoned unless it gets classified first.
    let mut unserved = Unserved { abandoned: &state.counters.abandoned, pending: true };
    let method = request.method().clone();
    let key = cache_key(request.uri(), request.headers(), &state.default_authority);
    let readable = method == Method::GET || method == Method::HEAD;
    if !readable || state.mode == CacheMode::NoCache {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        // On the heap (here and below): a miss's state (request and response
        // heads, the tee, the upstream call) held inline made every
        // request's future, hits' too, 2,880 bytes instead of 1,376 (moved a
        // few times between the handler and hyper's dispatcher).
        return Box::pin(forward(&state, request, &key, None)).await;
    }
    // A GET's `Range` and `If-Range`, taken off while the cache answers
    // (its revalidations and refreshes ask for the whole response); put
    // back if it passes through (see `range`). A HEAD's are dropped: only
    // a GET has ranges (RFC 9110 §14.2). Boxed: held across the awaits
    // below, inline it would grow every request's future.
    let asked = match request.headers().keys().any(|name| name == RANGE) {
        true => Some(Asked::take(request.headers_mut())).filter(|_| method == Method::GET).map(Box::new),
        false => None,
    };
    let now = policy::now_secs();
    let request_cc = RequestDirectives { headers: request.headers(), parsed: OnceLock::new() };
    let fingerprint = fingerprint(target_of(&key));
    let mut stale = None;
    if let Some(entry) = state.cache_lookup(&key, request.headers(), fingerprint) {
        if entry.deps.is_some() {
            state.refresh.note(&key, request.headers());
        }
        match state.usable(&entry, &request_cc, now).await {
            Usability::Serve => {
                state.note_access(fingerprint, true);
                unserved.pending = false;
                return state.hit(&entry, request.headers(), &method, now, asked.as_deref()).map(Into::into);
            }
            Usability::ServeStale => {
                state.counters.stale_served.fetch_add(1, Ordering::Relaxed);
                revalidate_in_background(&state, &key, request.headers(), &entry);
                state.note_access(fingerprint, true);
                unserved.pending = false;
                return state.hit(&entry, request.headers(), &method, now, asked.as_deref()).map(Into::into);
            }
            Usability::Revalidate => stale = Some(entry),
            // The new page, if the application published it and it is
            // current: one one-sided read, no application-tier CPU.
            Usability::Changed => {
                match Box::pin(published::install_for_request(&state, &key, request.headers(), &entry)).await {
                    Some(page) => {
                        state.note_access(fingerprint, true);
                        unserved.pending = false;
                        return state.hit(&page, request.headers(), &method, now, asked.as_deref()).map(Into::into);
                    }
                    None => state.cache_remove_entry(&key, &entry),
                }
            }
            // Dropped here (unless a newer copy replaced it meanwhile),
            // fetched below and cached again.
            Usability::OutOfDate => state.cache_remove_entry(&key, &entry),
        }
    }
    // `--coop`: the cooperative pool, under the same rules as our own copy.
    if let (None, Some(coop)) = (&stale, state.coop.get()) {
        if let Some((entry, source)) = coop.fetch(&key).await {
            let usable = entry.vary.matches(request.headers())
                && state.usable(&entry, &request_cc, now).await == Usability::Serve;
            if usable {
                coop.served(source);
                state.note_access(fingerprint, true);
                unserved.pending = false;
                return state.hit(&entry, request.headers(), &method, now, asked.as_deref()).map(Into::into);
            }
            coop.unusable();
            if entry.deps.is_some() {
                // Out of date everywhere: every copy goes.
                coop.invalidate(&key);
            }
        }
    }
    state.note_access(fingerprint, false);
    if request_cc.get().only_if_cached {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        return text(StatusCode::GATEWAY_TIMEOUT, "not cached, and the request asked only-if-cached\n").map(Into::into);
    }
    // A GET's ranges the cache did not answer (no usable copy, or a stale
    // one): passed through as they came, the answer not stored; neither
    // revalidated nor coalesced for. A whole GET fills the cache. If the
    // upstream fails, a stale copy's ranges may stand in (`stale`).
    if let Some(asked) = asked {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        let fallback = stale.map(|entry| Box::new((entry, request.headers().clone(), request_cc.get().clone())));
        drop(request_cc);
        asked.restore(request.headers_mut());
        let response = Box::pin(forward(&state, request, &key, None)).await;
        if let Some((entry, request, request_cc)) = fallback.as_deref() {
            let now = policy::now_secs();
            if stale::is_failure(response.status())
                && stale::may_serve(entry, request_cc, now, state.stale_on_error_secs)
            {
                state.counters.stale_served.fetch_add(1, Ordering::Relaxed);
                state.counters.served_on_error.fetch_add(1, Ordering::Relaxed);
                let partial = range::respond(entry, request, &asked, now, "MISS");
                return partial.unwrap_or_else(|| respond(entry, request, &Method::GET, now, "MISS")).map(Into::into);
            }
        }
        return response;
    }
    if let Some(entry) = stale {
        state.counters.misses.fetch_add(1, Ordering::Relaxed);
        unserved.pending = false;
        let request_cc = request_cc.get().clone();
        return Box::pin(revalidate(&state, request, &key, entry, &request_cc)).await.map(Into::into);
    }
    // Concurrent misses of one document share one upstream fetch; each
    // waiter checks the result is its own variant, and validates it itself
    // before serving it (see `coalesce`).
    if method == Method::GET {
        match state.flights.join(&flight_key(&key, request.headers())) {
            coalesce::Role::Waiter(flight) => {
                let waiting = Waiting::start(&state.counters.waiting_on_fetch);
                let outcome = coalesce::outcome(flight).await;
                drop(waiting);
                if let Some(entry) = outcome.filter(|entry| entry.vary.matches(request.headers())) {
                    let now = policy::now_secs();
                    if state.usable(&entry, &request_cc, now).await == Usability::Serve {
                        state.counters.coalesced.fetch_add(1, Ordering::Relaxed);
                        if entry.deps.is_none() {
                            state.counters.policy_coalesced.fetch_add(1, Ordering::Relaxed);
                        }
                        unserved.pending = false;
                        return state.serve_shared(&entry, request.headers(), now).map(Into::into);
                    }
                }
            }
            coalesce::Role::Leader(leader) => {
                state.counters.misses.fetch_add(1, Ordering::Relaxed);
                unserved.pending = false;
                // The leader finishes the flight once the body is stored.
                return Box::pin(forward(&state, request, &key, Some(leader))).await;
            }
        }
    }
    state.counters.misses.fetch_add(1, Ordering::Relaxed);
    unserved.pending = false;
    Box::pin(forward(&state, request, &key, None)).await
}

/// Does the stored response satisfy the client's `If-None-Match` or
/// `If-Modified-Since` (RFC 9110 §13.1.2, §13.1.3; weak comparison)?
pub(crate) fn client_not_modified(entry: &Entry, request: &HeaderMap) -> bool {
    // One pass over the request's names first: most requests carry no
    // condition, and comparing names is cheaper than two hashed lookups.
    if entry.status != StatusCode::OK || !request.keys().any(|name| name == IF_NONE_MATCH || name == IF_MODIFIED_SINCE)
    {
        return false;
    }
    let mut inm = request.get_all(IF_NONE_MATCH).iter().peekable();
    if inm.peek().is_some() {
        let Some(etag) = entry.headers.get(ETAG) else { return false };
        let opaque = |tag: &[u8]| -> Vec<u8> { tag.strip_prefix(b"W/").unwrap_or(tag).to_vec() };
        let stored = opaque(etag.as_bytes());
        return inm.filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|candidate| {
            let candidate = candidate.trim();
            candidate == "*" || opaque(candidate.as_bytes()) == stored
        });
    }
    let Some(since) = policy::date_field(request, IF_MODIFIED_SINCE) else { return false };
    // RFC 9111 §4.3.2: without Last-Modified, the stored Date, else when
    // the response was received.
    let modified = policy::date_field(&entry.headers, LAST_MODIFIED)
        .or_else(|| policy::date_field(&entry.headers, DATE))
        .unwrap_or(entry.freshness.response_time);
    modified <= since
}

/// The fields a 304 repeats from the 200 it stands for (RFC 9110 §15.4.5).
const NOT_MODIFIED_FIELDS: [HeaderName; 6] = [CACHE_CONTROL, CONTENT_LOCATION, DATE, ETAG, EXPIRES, VARY];

/// Answers a request from `entry`: a 304 if the client's conditions hold,
/// else the stored status, every stored field and the body (none for
/// HEAD), with `Age` and `X-Cache: <label>`.
pub(crate) fn respond(
    entry: &Entry,
    request: &HeaderMap,
    method: &Method,
    now: u64,
    label: &'static str,
) -> Response<Body> {
    let mut response = if client_not_modified(entry, request) {
        let mut response = Response::new(Body::default());
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        let headers = response.headers_mut();
        for name in NOT_MODIFIED_FIELDS.iter().chain([&LAST_MODIFIED]) {
            for value in entry.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        response
    } else {
        let body = if *method == Method::HEAD { Body::default() } else { Full::new(entry.body.clone()) };
        let mut response = Response::new(body);
        *response.status_mut() = entry.status;
        let reply = entry.reply.get_or_init(|| {
            // `Age` and `X-Cache` first (an origin's own replaced), so a
            // hit finds them by walking two fields, not by two lookups.
            let mut fields = HeaderMap::with_capacity(entry.headers.len() + 2);
            fields.insert(AGE, HeaderValue::from_static("0"));
            fields.insert(X_CACHE_NAME, HeaderValue::from_static("HIT"));
            for (name, value) in &entry.headers {
                if name != AGE && name != X_CACHE_NAME {
                    fields.append(name, value.clone());
                }
            }
            fields
        });
        let mut headers = reply.clone();
        let (mut age, mut cache) = (false, false);
        for (name, value) in headers.iter_mut() {
            if name == AGE {
                *value = age_value(entry.freshness.age(now));
                age = true;
            } else if name == X_CACHE_NAME {
                *value = HeaderValue::from_static(label);
                cache = true;
            }
            if age && cache {
                break;
            }
        }
        debug_assert!(age && cache, "the reply map holds Age and X-Cache");
        *response.headers_mut() = headers;
        return response;
    };
    let headers = response.headers_mut();
    headers.insert(AGE, age_value(entry.freshness.age(now)));
    headers.insert(X_CACHE_NAME, HeaderValue::from_static(label));
    response
}

impl State {
    /// Serves the proxy's own cached copy (counted by the caller's check):
    /// the GET's `ranges` of it, if asked and served (`range`), else whole.
    fn hit(
        &self,
        entry: &Entry,
        request: &HeaderMap,
        method: &Method,
        now: u64,
        ranges: Option<&Asked>,
    ) -> Response<Body> {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        if entry.deps.is_none() {
            self.counters.policy_hits.fetch_add(1, Ordering::Relaxed);
        }
        if entry.pushed {
            self.counters.push_hits.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(partial) = ranges.and_then(|asked| range::respond(entry, request, asked, now, "HIT")) {
            self.counters.ranges_served.fetch_add(1, Ordering::Relaxed);
            return partial;
        }
        let response = respond(entry, request, method, now, "HIT");
        if response.status() == StatusCode::NOT_MODIFIED {
            self.counters.not_modified.fetch_add(1, Ordering::Relaxed);
        }
        response
    }

    /// Serves another request's fetch, validated: a miss for this client
    /// (nothing was cached for it), marked as coalesced.
    fn serve_shared(&self, entry: &Entry, request: &HeaderMap, now: u64) -> Response<Body> {
        let mut response = respond(entry, request, &Method::GET, now, "MISS");
        response.headers_mut().insert(X_CACHE_COALESCED, HeaderValue::from_static("1"));
        response
    }

    /// The one decision whether a stored `entry` may answer a request:
    /// with dependencies, only if its versions are current (or in `ttl`
    /// mode); without, by RFC 9111 freshness under the request's
    /// directives. The version check is counted and timed here. (The check
    /// is written inline, not awaited as a helper of its own: each awaited
    /// helper's arguments would add to every request's future.)
    async fn usable(&self, entry: &Entry, request_cc: &RequestDirectives<'_>, now: u64) -> Usability {
        let Some(deps) = &entry.deps else {
            return match entry.freshness.usable(request_cc.get(), now) {
                Usable::Fresh => Usability::Serve,
                Usable::StaleWhileRevalidate => Usability::ServeStale,
                Usable::Revalidate => Usability::Revalidate,
            };
        };
        if self.mode == CacheMode::Ttl {
            return Usability::Serve;
        }
        let Some(checker) = &self.checker else { return Usability::OutOfDate };
        let started = tierstack_base::time::instant_now();
        let verdict = checker.is_current(deps).await;
        #[cfg(test)]
        self.hooks.after_check().await;
        let ns = elapsed_ns(started);
        self.counters.checks.fetch_add(1, Ordering::Relaxed);
        self.counters.check_ns.fetch_add(ns, Ordering::Relaxed);
        self.counters.check_latency.0.record_ns(ns);
        match verdict {
            Ok(true) => {
                self.counters.checks_ok.fetch_add(1, Ordering::Relaxed);
                Usability::Serve
            }
            Ok(false) => {
                self.counters.stale_dropped.fetch_add(1, Ordering::Relaxed);
                Usability::Changed
            }
            Err(e) => {
                // Fail closed: a copy we cannot validate is never served.
                self.counters.check_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "version check failed; forwarding");
                Usability::OutOfDate
            }
        }
    }
}
