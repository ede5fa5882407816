//! Header helpers of the request path, pure: hop-by-hop filtering (RFC 9110
//! §7.6.1), the cache key and its target, the coalescing key, and the
//! `Age` values a hit answers with.

use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONNECTION, HOST, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    IF_RANGE, IF_UNMODIFIED_SINCE,
};
use hyper::{Method, Uri};
use std::sync::OnceLock;

/// The response header telling clients whether the cache answered.
pub const X_CACHE: &str = "x-cache";
/// [`X_CACHE`] as a field name, parsed once.
pub(crate) const X_CACHE_NAME: HeaderName = HeaderName::from_static(X_CACHE);

/// Present (`1`) on a response served from another request's concurrent
/// fetch after validating it; such a response is labelled `X-Cache: MISS`.
pub const X_CACHE_COALESCED: &str = "x-cache-coalesced";

/// Hop-by-hop fields (RFC 9110 §7.6.1): never forwarded, never stored.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The fields `headers`' `Connection` field names (hop-by-hop too).
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// Copies every end-to-end field of `from` (not hop-by-hop, not named by
/// `Connection`) into `to`, in order.
pub(crate) fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    let named = connection_named(from);
    for (name, value) in from {
        if !is_hop_by_hop(name) && !named.contains(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// `headers`' end-to-end fields.
pub(crate) fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut copy = HeaderMap::with_capacity(headers.len());
    copy_end_to_end(headers, &mut copy);
    copy
}

/// The fields of the client's request sent upstream: the end-to-end ones,
/// `Host` included (so an upstream serving several sites knows which).
#[inline]
pub(crate) fn upstream_fields(request: &HeaderMap) -> HeaderMap {
    end_to_end(request)
}

/// The request's conditional fields: a revalidation sends the cache's own
/// validators instead, and answers the client's conditions itself.
pub(crate) const CONDITIONALS: [HeaderName; 5] =
    [IF_NONE_MATCH, IF_MODIFIED_SINCE, IF_MATCH, IF_UNMODIFIED_SINCE, IF_RANGE];

/// The primary cache key: the authority the client asked for (the request
/// target's, else `Host`, else `default`), lowercased, then the target
/// (path and query) as sent.
pub(crate) fn cache_key(uri: &Uri, headers: &HeaderMap, default: &str) -> String {
    let authority = uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()))
        .unwrap_or(default);
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut key = String::with_capacity(authority.len() + target.len());
    key.push_str(authority);
    key.make_ascii_lowercase();
    key.push_str(target);
    key
}

/// The target part of a cache key (authorities hold no `/`).
#[inline]
pub(crate) fn target_of(key: &str) -> &str {
    key.bytes().position(|b| b == b'/').map_or(key, |at| &key[at..])
}

/// The key a coalesced fetch is shared under: the cache key and the
/// request's credentials, so a fetch is never shared across them.
pub(crate) fn flight_key(key: &str, headers: &HeaderMap) -> String {
    match headers.get(AUTHORIZATION) {
        Some(credentials) => format!("{key}\n{}", String::from_utf8_lossy(credentials.as_bytes())),
        None => key.to_string(),
    }
}

/// An unsafe method (RFC 9110 §9.2.1): its success invalidates (§4.4).
#[inline]
pub(crate) fn is_unsafe(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

/// The `Age` field's value for `age` seconds; the first ages are built
/// once, so a hit's answer does not allocate one.
#[inline]
pub(crate) fn age_value(age: u64) -> HeaderValue {
    const BUILT: usize = 1024;
    static AGES: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let ages = AGES.get_or_init(|| {
        // One string holding every built age, kept for the process's life:
        // values from it are static, so cloning one touches no counter.
        let digits: &'static str = Box::leak((0..BUILT).map(|a| a.to_string()).collect::<String>().into_boxed_str());
        let mut at = 0;
        (0..BUILT)
            .map(|a| {
                let len = a.to_string().len();
                let value = HeaderValue::from_static(&digits[at..at + len]);
                at += len;
                value
            })
            .collect()
    });
    match usize::try_from(age).ok().and_then(|a| ages.get(a)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(age),
    }
}
