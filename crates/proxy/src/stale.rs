//! Serving a stored response in place of an upstream failure: RFC 5861's
//! `stale-if-error` (the response's or the request's) and the operator's
//! grace, `--serve-stale-on-error SECONDS` (as Varnish's grace and nginx's
//! `proxy_cache_use_stale error timeout http_500 http_502 http_503
//! http_504`). RFC 9111 §4.2.4 lets a cache serve stale when it "cannot
//! contact the origin server" or by "configuration in accordance with an
//! out-of-band contract": the grace is that configuration.
//!
//! **A failure** ([`is_failure`]) is a 500, 502, 503 or 504 (RFC 5861 §4's
//! "error"): from the upstream, or the proxy's own when the upstream gave
//! no usable answer (connection refused, reset or closed before a whole
//! response: 502; no head or body within `--upstream-timeout-ms`: 504;
//! every upstream dead or overloaded: 503). Other statuses, other 5xx (501,
//! 505) included, are answers and reach the client.
//!
//! **Never served stale** ([`may_serve`]): a response with dependencies (a
//! coherent response is served only after its version check, never by
//! time); one with `must-revalidate`, `proxy-revalidate`, `s-maxage` or
//! `no-cache` (RFC 9111 §5.2.2: `Freshness::no_stale`), which gets the
//! failure (a 504 when no upstream answered, as §5.2.2.2 asks); and, for the
//! grace, a request whose own directives refuse it: `min-fresh` (it asks
//! for a response still fresh for a while: a stale one never is) or
//! `max-stale=N` with the response stale by more than N seconds. The
//! grace covers a response stale by at most its seconds.
//!
//! The answer carries its real `Age` (past its freshness lifetime) and no
//! `Warning`: RFC 9111 obsoletes that field (§5.5).

use crate::cache::Entry;
use crate::policy::{Delta, Directives};
use hyper::StatusCode;

/// Is `status` (the upstream's, or the proxy's own for an upstream that
/// gave no usable answer) a failure a stored response may stand in for?
pub(crate) fn is_failure(status: StatusCode) -> bool {
    matches!(status.as_u16(), 500 | 502 | 503 | 504)
}

/// May the stored `entry` answer, at `now`, a request (its directives
/// `request`) whose upstream failed, with the operator's grace of
/// `grace_secs` (0: none)?
pub(crate) fn may_serve(entry: &Entry, request: &Directives, now: u64, grace_secs: u64) -> bool {
    if entry.deps.is_some() || entry.freshness.no_cache {
        return false;
    }
    // Fresh, or within `stale-if-error` (the response's or the request's).
    if entry.freshness.usable_on_error(request, now) {
        return true;
    }
    if grace_secs == 0 || entry.freshness.no_stale {
        return false;
    }
    let stale_for = entry.freshness.age(now).saturating_sub(entry.freshness.lifetime);
    let client_refuses = match request.max_stale {
        _ if request.min_fresh != Delta::Absent => true,
        Delta::Secs(max_stale) => stale_for > max_stale,
        Delta::Invalid => true,
        Delta::Absent => false,
    };
    !client_refuses && stale_for <= grace_secs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{self, Freshness};
    use bytes::Bytes;
    use hyper::header::{HeaderMap, HeaderName, HeaderValue};
    use hyper::Method;

    const T: u64 = 1_700_000_000;

    fn stored(cache_control: &str) -> Entry {
        let mut headers = HeaderMap::new();
        headers.insert(HeaderName::from_static("cache-control"), HeaderValue::from_str(cache_control).unwrap());
        let freshness: Freshness = policy::storable(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            &headers,
            (T, T),
            crate::SetCookie::default(),
        )
        .unwrap_or_else(|why| panic!("{cache_control}: {why:?}"));
        Entry {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(b"x"),
            deps: None,
            pushed: false,
            vary: policy::Vary::default(),
            freshness,
            reply: std::sync::OnceLock::new(),
        }
    }

    fn request(cache_control: &str) -> Directives {
        let mut headers = HeaderMap::new();
        if !cache_control.is_empty() {
            headers.insert(HeaderName::from_static("cache-control"), HeaderValue::from_str(cache_control).unwrap());
        }
        policy::request_directives(&headers)
    }

    #[test]
    fn failures_are_500_502_503_504_only() {
        let failing: Vec<u16> = (100..600).filter(|&s| is_failure(StatusCode::from_u16(s).unwrap())).collect();
        assert_eq!(failing, [500, 502, 503, 504]);
    }

    /// One row per case: the stored response's directives, seconds after it
    /// was received, the request's directives, the grace; may it answer?
    #[test]
    fn the_grace_serves_stale_unless_the_response_or_request_forbids_it() {
        let rows: &[(&str, u64, &str, u64, bool)] = &[
            ("max-age=10", 5, "", 0, true),
            ("max-age=10", 15, "", 0, false),
            ("max-age=10", 15, "", 60, true),
            ("max-age=10", 70, "", 60, true),
            ("max-age=10", 71, "", 60, false),
            ("max-age=10, stale-if-error=100", 90, "", 0, true),
            ("max-age=10", 15, "stale-if-error=100", 0, true),
            ("max-age=10, must-revalidate", 15, "", 60, false),
            ("max-age=10, proxy-revalidate", 15, "", 60, false),
            ("s-maxage=10", 15, "", 60, false),
            ("max-age=10, no-cache", 15, "", 60, false),
            ("max-age=10, no-cache", 5, "", 60, false),
            ("max-age=10, must-revalidate, stale-if-error=100", 15, "", 60, false),
            ("max-age=10", 15, "min-fresh=1", 60, false),
            ("max-age=10", 15, "max-stale=5", 60, true),
            ("max-age=10", 16, "max-stale=5", 60, false),
            ("max-age=10", 50, "max-stale", 60, true),
            ("max-age=10", 15, "max-stale=x", 60, false),
            ("max-age=10", 15, "no-cache", 60, true),
            ("max-age=10", 15, "max-age=0", 60, true),
        ];
        for &(response, after, req, grace, expected) in rows {
            let entry = stored(response);
            assert_eq!(
                may_serve(&entry, &request(req), T + after, grace),
                expected,
                "{response} after {after}s, request {req:?}, grace {grace}"
            );
        }
    }

    #[test]
    fn a_response_with_dependencies_is_never_served_on_error() {
        let mut entry = stored("max-age=10, stale-if-error=100");
        entry.deps = Some(tierstack_coherent::DepsHeader::parse("n=1;i=00000000000000a1;page/1=3@4").unwrap());
        for after in [0, 5, 15] {
            assert!(!may_serve(&entry, &request(""), T + after, 3600), "after {after}s");
        }
    }
}
