//! Published pages (issue 31, `tierstack_coherent::pages`): when a stored
//! copy's version check finds it out of date, the proxy reads the page the
//! application published with its update, **one-sidedly**, in one batch
//! with the versions that validate it, and installs it in place of the old
//! copy when it is current and answers this request's target. Otherwise the
//! request goes upstream as before. No application-tier CPU runs for it.
//!
//! The page goes through the same door as a fetched response ([`store`]):
//! the same storability rules (a 200 nothing forbids a shared cache to
//! store), its `Vary` variant taken from this request, so a page that could
//! not have been cached from the origin is not cached from the module
//! either. It is served to this request as a hit, and validated on every
//! later hit like any other copy.

use crate::cache::Entry;
use crate::headers::target_of;
use crate::policy;
use crate::state::State;
use crate::store::{store, Stored};
use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::StatusCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tierstack_coherent::{PageMiss, PublishedPage, DEPS_HEADER};

/// Bytes read beyond the stale copy's body the first time: room for the
/// page's fields, so a page of the same size needs one batch.
const FIELDS_ALLOWANCE: usize = 1024;

/// What looking for a published page came to.
pub(crate) enum Found {
    /// Current, stored in place of the old copy.
    Installed(Arc<Entry>),
    /// The copy's module publishes no pages: nothing was read.
    NoArea,
    /// Read, but not usable for this request.
    Unusable,
}

/// For a request whose stored copy's check failed: the published page,
/// installed and returned if it is current; `None`: fetch upstream. Counted
/// as `pages_installed` (then served as a hit) or `pages_unusable` (a module
/// without pages counts nowhere).
pub(crate) async fn install_for_request(
    state: &State,
    key: &str,
    request: &HeaderMap,
    stale: &Entry,
) -> Option<Arc<Entry>> {
    match install(state, key, request, stale).await {
        Found::Installed(entry) => {
            state.counters.pages_installed.fetch_add(1, Ordering::Relaxed);
            Some(entry)
        }
        Found::Unusable => {
            state.counters.pages_unusable.fetch_add(1, Ordering::Relaxed);
            None
        }
        Found::NoArea => None,
    }
}

/// The published page for the out-of-date `stale` copy of `key`, installed
/// if it is current for a request with fields `request`.
pub(crate) async fn install(state: &State, key: &str, request: &HeaderMap, stale: &Entry) -> Found {
    let (Some(checker), Some(deps)) = (&state.checker, &stale.deps) else { return Found::NoArea };
    let expect = stale.body.len().saturating_add(FIELDS_ALLOWANCE);
    let unusable = |why: &dyn std::fmt::Debug| {
        tracing::trace!(key, why = ?why, "no usable published page");
        Found::Unusable
    };
    let found = match checker.published_page(deps, target_of(key), expect).await {
        Ok(Ok(found)) => found,
        Ok(Err(PageMiss::NoArea)) => return Found::NoArea,
        Ok(Err(miss)) => return unusable(&miss),
        Err(e) => return unusable(&e),
    };
    let Some(response) = stored(found) else { return unusable(&"fields that are not HTTP") };
    match store(state, key, request, response) {
        Some(entry) if entry.vary.matches(request) => Found::Installed(entry),
        _ => unusable(&"not storable for this request"),
    }
}

/// The page as a response to store: its fields, its dependency header, its body.
fn stored(found: PublishedPage) -> Option<Stored> {
    let page = found.page;
    let mut headers = HeaderMap::with_capacity(page.headers.len() + 1);
    for (name, value) in &page.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_str(value).ok()?);
    }
    headers.insert(DEPS_HEADER, HeaderValue::from_str(&page.deps).ok()?);
    let now = policy::now_secs();
    Some(Stored {
        status: StatusCode::from_u16(page.status).ok()?,
        headers,
        body: Bytes::from(page.body),
        request_time: now,
        response_time: now,
    })
}

#[cfg(test)]
mod tests {
    use crate::testkit::Setup;
    use crate::CacheMode;
    use tierstack_coherent::pages::PageParts;

    /// Publishes `body` as the page of `/doc/<name>` at the next version,
    /// with `fields`, then makes that version visible (the module's `done`
    /// mode); returns the new versions' header.
    fn publish(s: &Setup, name: &str, body: &str, fields: &[(&str, &str)]) -> String {
        let key = format!("doc/{name}");
        let slot = s.table.slot_of(&key).unwrap();
        let next = s.table.version(slot).unwrap() + 1;
        let deps = s.table.header_at(&[(key, slot)], &[next]).to_string();
        let headers = fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        let parts = PageParts { path: format!("/doc/{name}"), status: 200, headers, body: body.as_bytes().to_vec() };
        s.table.publish(slot, &deps, &parts).unwrap();
        s.table.advance_to(slot, next).unwrap();
        deps
    }

    #[tokio::test]
    async fn an_out_of_date_copy_is_replaced_by_its_published_page_without_the_origin() {
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        assert_eq!(s.get("a").await.0, "MISS");
        assert_eq!(s.get("a").await.0, "HIT");
        let origin = s.origin_requests();
        publish(&s, "a", "the published page", &[("content-type", "text/html")]);
        assert_eq!(s.get("a").await, ("HIT".to_string(), "the published page".to_string()));
        assert_eq!(s.get("a").await, ("HIT".to_string(), "the published page".to_string()), "stored");
        assert_eq!(s.origin_requests(), origin, "the origin was not asked");
        let stats = s.stats().await;
        assert_eq!((stats.pages_installed, stats.pages_unusable, stats.stale_dropped), (1, 0, 1));
        assert_eq!(stats.accounting_error(), None);
    }

    #[tokio::test]
    async fn a_page_that_is_not_current_or_not_storable_is_not_served() {
        let s = Setup::new(CacheMode::Poll, 1 << 20).await;
        s.get("a").await;
        // Published, then another update that brought no page.
        publish(&s, "a", "superseded", &[]);
        s.bump("a");
        let (cache, body) = s.get("a").await;
        assert_eq!(cache, "MISS");
        assert!(body.starts_with("origin "), "{body}");
        // A page a shared cache may not store (Set-Cookie, not public) goes through no other door.
        publish(&s, "a", "personal", &[("set-cookie", "id=1")]);
        let (cache, body) = s.get("a").await;
        assert_eq!(cache, "MISS");
        assert!(body.starts_with("origin "), "{body}");
        let stats = s.stats().await;
        assert_eq!((stats.pages_installed, stats.pages_unusable), (0, 2));
        assert_eq!(stats.accounting_error(), None);
    }
}
