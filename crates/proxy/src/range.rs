//! Byte ranges served from a stored complete response (RFC 9110 §14): the
//! `Range` field parsed against the stored body's length, `If-Range`
//! evaluated (§13.1.5), and the 206 built (one part, or
//! `multipart/byteranges` for several), or the 416.
//!
//! What a range request gets, in order (§13.2.2, §14.2):
//! - the client's `If-None-Match`/`If-Modified-Since` first: a 304 (the
//!   handler's [`client_not_modified`]), the range not looked at;
//! - a stored status other than 200: the stored response, `Range` ignored;
//! - `If-Range` that does not hold: the whole 200;
//! - `Range` ignored, the whole 200: a unit other than `bytes`, a syntax
//!   error, a `last-pos` below its `first-pos`, more than [`RANGES_MAX`]
//!   ranges, overlapping ranges (§14.2 lets a server ignore these: the
//!   classic amplification of many overlapping ranges), an empty body,
//!   more than one `Range` line;
//! - no range overlapping the body: 416 with `Content-Range: bytes */LEN`;
//! - else 206: one part with `Content-Range`, or `multipart/byteranges`
//!   with one part per satisfiable range in the order asked.
//!
//! A 206's body is at most the stored body plus [`RANGES_MAX`] part
//! headers: ranges never overlap, so no byte is sent twice.
//!
//! Only GET: `Range` on any other method, HEAD included, is ignored (§14.2,
//! "GET is the only method for which range handling is defined"); a
//! HEAD's `Range` and `If-Range` are dropped (a HEAD is answered whole, from
//! the cache or upstream). The handler takes a GET's `Range` and `If-Range`
//! off the request before the cache looks at it ([`Asked::take`]) and puts
//! them back only on a request passed through upstream, so a revalidation
//! or a refresh sent on behalf of a range request asks for the whole
//! response.

use crate::cache::Entry;
use crate::handler::client_not_modified;
use crate::headers::{age_value, X_CACHE_NAME};
use crate::policy;
use bytes::{Bytes, BytesMut};
use http_body_util::Full;
use hyper::header::{
    HeaderMap, HeaderValue, AGE, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, DATE, ETAG, IF_RANGE, LAST_MODIFIED,
    RANGE,
};
use hyper::{Response, StatusCode};
use tierstack_tier_http::Body;

/// Most ranges in one `Range` field served; more and the field is
/// ignored (the whole 200), as §14.2 allows for "many small ranges".
pub const RANGES_MAX: usize = 16;

/// Candidate boundaries tried before a multipart answer is given up (the
/// whole 200 instead): each is checked against the parts' bytes.
const BOUNDARY_TRIES: u64 = 8;

/// One satisfiable range: bytes `first..=last` of the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) first: u64,
    pub(crate) last: u64,
}

impl Span {
    fn content_range(self, complete: u64) -> String {
        format!("bytes {}-{}/{complete}", self.first, self.last)
    }
}

/// What a `Range` field asks of a body of a given length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ranges {
    /// Ignored: answer the whole representation (200).
    Ignore,
    /// No range overlaps the body: 416.
    Unsatisfiable,
    /// The satisfiable ranges, in the order asked (never empty, never
    /// overlapping).
    Satisfiable(Vec<Span>),
}

/// A `1*DIGIT`, saturating at `u64::MAX` (a position past any body).
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.bytes().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
}

/// Evaluates a `Range` field value against a body of `len` bytes (§14.1.1,
/// §14.1.2).
pub(crate) fn evaluate(field: &[u8], len: u64) -> Ranges {
    let Ok(field) = std::str::from_utf8(field) else { return Ranges::Ignore };
    let Some((unit, set)) = field.trim().split_once('=') else { return Ranges::Ignore };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return Ranges::Ignore;
    }
    let mut spans = Vec::new();
    let mut asked = 0usize;
    // Empty list elements are allowed and skipped (RFC 9110 §5.6.1).
    for spec in set.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        asked += 1;
        if asked > RANGES_MAX {
            return Ranges::Ignore;
        }
        let Some((first, last)) = spec.split_once('-') else { return Ranges::Ignore };
        let span = if first.is_empty() {
            // suffix-range: the last `n` bytes (all of them if fewer).
            let Some(n) = digits(last) else { return Ranges::Ignore };
            (n > 0 && len > 0).then(|| Span { first: len - n.min(len), last: len - 1 })
        } else {
            let Some(first) = digits(first) else { return Ranges::Ignore };
            let last = if last.is_empty() {
                u64::MAX
            } else {
                match digits(last) {
                    Some(last) if last >= first => last,
                    _ => return Ranges::Ignore,
                }
            };
            (first < len).then(|| Span { first, last: last.min(len - 1) })
        };
        spans.extend(span);
    }
    if asked == 0 || len == 0 {
        return Ranges::Ignore;
    }
    if spans.is_empty() {
        return Ranges::Unsatisfiable;
    }
    let mut sorted = spans.clone();
    sorted.sort_unstable_by_key(|s| s.first);
    if sorted.windows(2).any(|pair| pair[1].first <= pair[0].last) {
        return Ranges::Ignore;
    }
    Ranges::Satisfiable(spans)
}

/// Does `If-Range` hold for the stored response `stored` (§13.1.5)? An
/// entity-tag: strong comparison with the stored `ETag` (a weak tag on
/// either side never matches). An HTTP-date: equal to the stored
/// `Last-Modified`, which must be strong: the stored `Date` at least one
/// second later (§8.8.2.2). Anything else, or more than one line: no.
pub(crate) fn if_range_holds(lines: &[HeaderValue], stored: &HeaderMap) -> bool {
    let [value] = lines else { return false };
    let Ok(value) = value.to_str().map(str::trim) else { return false };
    if value.starts_with('"') || value.starts_with("W/") {
        let Some(etag) = stored.get(ETAG).and_then(|v| v.to_str().ok()).map(str::trim) else { return false };
        return value.starts_with('"') && value.len() >= 2 && value.ends_with('"') && etag == value;
    }
    let Some(asked) = httpdate::parse_http_date(value).ok() else { return false };
    let Some(asked) = asked.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs()) else { return false };
    let (Some(modified), Some(date)) = (policy::date_field(stored, LAST_MODIFIED), policy::date_field(stored, DATE))
    else {
        return false;
    };
    date > modified && asked == modified
}

/// A range request's own fields, taken off it while the cache answers.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    range: Vec<HeaderValue>,
    if_range: Vec<HeaderValue>,
}

impl Asked {
    /// Removes `Range` and `If-Range` from `headers`, kept here.
    pub(crate) fn take(headers: &mut HeaderMap) -> Asked {
        let range = headers.get_all(RANGE).iter().cloned().collect();
        let if_range = headers.get_all(IF_RANGE).iter().cloned().collect();
        headers.remove(RANGE);
        headers.remove(IF_RANGE);
        Asked { range, if_range }
    }

    /// Puts them back (a request passed through upstream as it came).
    pub(crate) fn restore(&self, headers: &mut HeaderMap) {
        for value in &self.range {
            headers.append(RANGE, value.clone());
        }
        for value in &self.if_range {
            headers.append(IF_RANGE, value.clone());
        }
    }
}

/// The answer to a GET with `asked` from the stored `entry` (the request's
/// other fields `request`): a 206 or a 416, or `None` when the range is
/// not served (a 304 for the client's conditions, another status, a failed
/// `If-Range`, an ignored `Range`): then the answer is as without it.
pub(crate) fn respond(
    entry: &Entry,
    request: &HeaderMap,
    asked: &Asked,
    now: u64,
    label: &'static str,
) -> Option<Response<Body>> {
    if entry.status != StatusCode::OK || client_not_modified(entry, request) {
        return None;
    }
    let [range] = asked.range.as_slice() else { return None };
    if !asked.if_range.is_empty() && !if_range_holds(&asked.if_range, &entry.headers) {
        return None;
    }
    let len = entry.body.len() as u64;
    let spans = match evaluate(range.as_bytes(), len) {
        Ranges::Ignore => return None,
        Ranges::Unsatisfiable => {
            let mut response = Response::new(Body::default());
            *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            let headers = response.headers_mut();
            headers.insert(CONTENT_RANGE, HeaderValue::from_str(&format!("bytes */{len}")).ok()?);
            headers.insert(X_CACHE_NAME, HeaderValue::from_static(label));
            return Some(response);
        }
        Ranges::Satisfiable(spans) => spans,
    };
    let mut headers = HeaderMap::with_capacity(entry.headers.len() + 2);
    headers.insert(AGE, age_value(entry.freshness.age(now)));
    headers.insert(X_CACHE_NAME, HeaderValue::from_static(label));
    let multipart = spans.len() > 1;
    for (name, value) in &entry.headers {
        // The framing is the 206's own; a multipart answer's type too.
        let skip = name == AGE || name == X_CACHE_NAME || name == CONTENT_LENGTH || (multipart && name == CONTENT_TYPE);
        if !skip {
            headers.append(name, value.clone());
        }
    }
    let body = match spans.as_slice() {
        [span] => {
            headers.insert(CONTENT_RANGE, HeaderValue::from_str(&span.content_range(len)).ok()?);
            slice(&entry.body, *span)
        }
        _ => {
            let (boundary, body) = multipart_body(&entry.body, &spans, entry.headers.get(CONTENT_TYPE))?;
            let value = format!("multipart/byteranges; boundary={boundary}");
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(&value).ok()?);
            body
        }
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::PARTIAL_CONTENT;
    *response.headers_mut() = headers;
    Some(response)
}

/// The bytes of `span` (which lies within `body`).
fn slice(body: &Bytes, span: Span) -> Bytes {
    let (first, last) = (span.first as usize, span.last as usize);
    body.slice(first..=last)
}

/// Does `haystack` hold `needle`? (One byte compared per position but
/// where the first byte matches.)
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&head, _)) = needle.split_first() else { return true };
    haystack.len() >= needle.len()
        && (0..=haystack.len() - needle.len())
            .any(|at| haystack[at] == head && &haystack[at..at + needle.len()] == needle)
}

/// A boundary found in none of `parts` (RFC 2046 §5.1.1), chosen among
/// [`BOUNDARY_TRIES`] fixed candidates; `None` if each occurs in them
/// (the range is then ignored).
fn boundary(parts: &[Bytes]) -> Option<String> {
    (0..BOUNDARY_TRIES)
        .map(|attempt| {
            // splitmix64 of the attempt: distinct, fixed candidates.
            let mut z = attempt.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            format!("tierstack-{:016x}", z ^ (z >> 31))
        })
        .find(|candidate| !parts.iter().any(|part| contains(part, candidate.as_bytes())))
}

/// A `multipart/byteranges` body (RFC 9110 §14.6) of `spans` of `body`,
/// each part with the stored `Content-Type` (if any) and its
/// `Content-Range`; and its boundary.
fn multipart_body(body: &Bytes, spans: &[Span], content_type: Option<&HeaderValue>) -> Option<(String, Bytes)> {
    let parts: Vec<Bytes> = spans.iter().map(|span| slice(body, *span)).collect();
    let boundary = boundary(&parts)?;
    let len = body.len() as u64;
    let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum::<usize>() + spans.len() * 128);
    for (index, (span, part)) in spans.iter().zip(&parts).enumerate() {
        if index > 0 {
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--");
        out.extend_from_slice(boundary.as_bytes());
        out.extend_from_slice(b"\r\n");
        if let Some(content_type) = content_type {
            out.extend_from_slice(b"Content-Type: ");
            out.extend_from_slice(content_type.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Content-Range: ");
        out.extend_from_slice(span.content_range(len).as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"\r\n--");
    out.extend_from_slice(boundary.as_bytes());
    out.extend_from_slice(b"--\r\n");
    Some((boundary, out.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spans(list: &[(u64, u64)]) -> Ranges {
        Ranges::Satisfiable(list.iter().map(|&(first, last)| Span { first, last }).collect())
    }

    /// One row per case: the field, the body's length, what it asks.
    #[test]
    fn range_fields_evaluate_as_rfc_9110_section_14_says() {
        let rows: &[(&str, u64, Ranges)] = &[
            ("bytes=0-4", 10, spans(&[(0, 4)])),
            ("bytes=5-", 10, spans(&[(5, 9)])),
            ("bytes=-3", 10, spans(&[(7, 9)])),
            ("bytes=-30", 10, spans(&[(0, 9)])),
            ("bytes=0-99", 10, spans(&[(0, 9)])),
            ("bytes=9-9", 10, spans(&[(9, 9)])),
            ("BYTES = 0-0 , , 2-3", 10, spans(&[(0, 0), (2, 3)])),
            ("bytes=6-7,0-1", 10, spans(&[(6, 7), (0, 1)])),
            ("bytes=0-1,2-3", 10, spans(&[(0, 1), (2, 3)])),
            ("bytes=10-,20-30", 10, spans(&[]).unsat()),
            ("bytes=-0", 10, spans(&[]).unsat()),
            ("bytes=10-20,2-3", 10, spans(&[(2, 3)])),
            ("bytes=99999999999999999999999-", 10, spans(&[]).unsat()),
            ("bytes=0-99999999999999999999999", 10, spans(&[(0, 9)])),
            ("bytes=0-0", 0, Ranges::Ignore),
            ("bytes=5-4", 10, Ranges::Ignore),
            ("bytes=0-4,3-6", 10, Ranges::Ignore),
            ("bytes=0-4,-6", 10, Ranges::Ignore),
            ("bytes=a-4", 10, Ranges::Ignore),
            ("bytes=0-4x", 10, Ranges::Ignore),
            ("bytes=+1-2", 10, Ranges::Ignore),
            ("bytes=--1", 10, Ranges::Ignore),
            ("bytes=4", 10, Ranges::Ignore),
            ("bytes=", 10, Ranges::Ignore),
            ("bytes=,", 10, Ranges::Ignore),
            ("items=0-4", 10, Ranges::Ignore),
            ("0-4", 10, Ranges::Ignore),
            ("bytes 0-4", 10, Ranges::Ignore),
        ];
        for (field, len, expected) in rows {
            assert_eq!(&evaluate(field.as_bytes(), *len), expected, "{field} of {len}");
        }
        let many =
            format!("bytes={}", (0..RANGES_MAX as u64).map(|i| format!("{i}-{i}")).collect::<Vec<_>>().join(","));
        assert!(matches!(evaluate(many.as_bytes(), 100), Ranges::Satisfiable(s) if s.len() == RANGES_MAX));
        let too_many = format!("{many},{0}-{0}", RANGES_MAX);
        assert_eq!(evaluate(too_many.as_bytes(), 100), Ranges::Ignore);
        assert_eq!(evaluate(b"bytes=\xff0-1", 10), Ranges::Ignore);
    }

    impl Ranges {
        fn unsat(self) -> Ranges {
            Ranges::Unsatisfiable
        }
    }

    fn fields(list: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in list {
            map.append(hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn if_range_holds_for_the_same_strong_validator_only() {
        let at = |s: u64| httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let (modified, date) = (at(1_700_000_000), at(1_700_000_100));
        let stored = fields(&[("etag", "\"v1\""), ("last-modified", &modified), ("date", &date)]);
        let holds = |value: &str, stored: &HeaderMap| if_range_holds(&[value.parse().unwrap()], stored);
        assert!(holds("\"v1\"", &stored));
        assert!(!holds("\"v2\"", &stored));
        assert!(!holds("W/\"v1\"", &stored), "a weak tag never matches");
        assert!(!holds("\"v1\"", &fields(&[("etag", "W/\"v1\"")])), "nor a weak stored tag");
        assert!(!holds("\"v1\"", &fields(&[])), "no stored tag");
        assert!(holds(&modified, &stored));
        assert!(!holds(&at(1_700_000_001), &stored), "another date");
        let same_second = fields(&[("last-modified", &modified), ("date", &modified)]);
        assert!(!holds(&modified, &same_second), "Last-Modified not strong: Date not a second later");
        assert!(!holds(&modified, &fields(&[("last-modified", &modified)])), "no Date: not strong");
        assert!(!holds("yesterday", &stored));
        let two = [HeaderValue::from_static("\"v1\""), HeaderValue::from_static("\"v1\"")];
        assert!(!if_range_holds(&two, &stored), "one validator only");
    }

    #[test]
    fn asked_fields_are_taken_and_restored() {
        let mut headers = fields(&[("range", "bytes=0-1"), ("if-range", "\"a\""), ("accept", "*/*")]);
        let asked = Asked::take(&mut headers);
        assert_eq!(headers.len(), 1);
        asked.restore(&mut headers);
        assert_eq!(headers, fields(&[("accept", "*/*"), ("range", "bytes=0-1"), ("if-range", "\"a\"")]));
    }

    /// Splits a multipart body back into (Content-Range, bytes) parts.
    fn parse_multipart(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
        let delimiter = format!("--{boundary}");
        let close = format!("\r\n--{boundary}--\r\n");
        assert!(body.ends_with(close.as_bytes()), "closed by its delimiter");
        let body = &body[..body.len() - close.len()];
        let separator = format!("\r\n{delimiter}\r\n");
        let text = body.strip_prefix(format!("{delimiter}\r\n").as_bytes()).expect("opens with the delimiter");
        let mut parts = Vec::new();
        let mut rest = text;
        loop {
            let end = (0..=rest.len().saturating_sub(separator.len()))
                .find(|&at| rest[at..].starts_with(separator.as_bytes()))
                .filter(|_| rest.len() >= separator.len())
                .unwrap_or(rest.len());
            let part = &rest[..end];
            let head_end = (0..part.len()).find(|&at| part[at..].starts_with(b"\r\n\r\n")).expect("part head");
            let head = std::str::from_utf8(&part[..head_end]).unwrap();
            let range =
                head.lines().find_map(|l| l.strip_prefix("Content-Range: ")).expect("Content-Range").to_string();
            parts.push((range, part[head_end + 4..].to_vec()));
            if end == rest.len() {
                return parts;
            }
            rest = &rest[end + separator.len()..];
        }
    }

    fn entry_of(body: &[u8], stored: &[(&str, &str)]) -> Entry {
        Entry {
            status: StatusCode::OK,
            headers: fields(stored),
            body: Bytes::copy_from_slice(body),
            deps: None,
            pushed: false,
            vary: policy::Vary::default(),
            freshness: policy::Freshness {
                lifetime: 60,
                initial_age: 0,
                response_time: 0,
                no_cache: false,
                no_stale: false,
                stale_while_revalidate: 0,
                stale_if_error: 0,
                validators: false,
            },
            reply: std::sync::OnceLock::new(),
        }
    }

    fn asked(range: &str) -> Asked {
        Asked { range: vec![range.parse().unwrap()], if_range: Vec::new() }
    }

    #[test]
    fn a_206_416_or_nothing_from_a_stored_200() {
        let entry = entry_of(b"0123456789", &[("content-type", "text/plain"), ("content-length", "10")]);
        let none = HeaderMap::new();
        let single = respond(&entry, &none, &asked("bytes=2-4"), 0, "HIT").unwrap();
        assert_eq!(single.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(single.headers()["content-range"], "bytes 2-4/10");
        assert_eq!(single.headers()["content-type"], "text/plain");
        assert!(single.headers().get("content-length").is_none(), "the stored length is not the 206's");
        assert_eq!(single.headers()["x-cache"], "HIT");
        let unsat = respond(&entry, &none, &asked("bytes=10-"), 0, "HIT").unwrap();
        assert_eq!(unsat.status(), StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(unsat.headers()["content-range"], "bytes */10");
        assert!(respond(&entry, &none, &asked("bytes=0-4,3-6"), 0, "HIT").is_none(), "overlap: ignored");
        let two = Asked { range: vec!["bytes=0-1".parse().unwrap(); 2], if_range: Vec::new() };
        assert!(respond(&entry, &none, &two, 0, "HIT").is_none(), "two Range lines: ignored");
        let failed = Asked { range: vec!["bytes=0-1".parse().unwrap()], if_range: vec!["\"other\"".parse().unwrap()] };
        assert!(respond(&entry, &none, &failed, 0, "HIT").is_none(), "If-Range fails: the whole");
        let mut not_ok = entry_of(b"0123456789", &[]);
        not_ok.status = StatusCode::NOT_FOUND;
        assert!(respond(&not_ok, &none, &asked("bytes=0-1"), 0, "HIT").is_none());
        let tagged = entry_of(b"0123456789", &[("etag", "\"t\"")]);
        let conditional = fields(&[("if-none-match", "\"t\"")]);
        assert!(respond(&tagged, &conditional, &asked("bytes=0-1"), 0, "HIT").is_none(), "a 304 comes first");
    }

    #[test]
    fn a_boundary_never_occurs_in_the_parts() {
        // A body holding each candidate found so far: the next differs,
        // until every candidate is in it and the answer is the whole 200.
        let mut taken: Vec<String> = Vec::new();
        while let Some(next) = boundary(&[Bytes::from(taken.join("|"))]) {
            assert!(!taken.contains(&next));
            taken.push(next);
        }
        assert_eq!(taken.len() as u64, BOUNDARY_TRIES);
        // The second part holds every candidate.
        let hostile = format!("x{}", taken.join("|"));
        let entry = entry_of(hostile.as_bytes(), &[]);
        assert!(respond(&entry, &HeaderMap::new(), &asked("bytes=0-0,1-"), 0, "HIT").is_none());
        let plain = entry_of(b"0123456789", &[]);
        assert!(respond(&plain, &HeaderMap::new(), &asked("bytes=0-0,1-"), 0, "HIT").is_some());
        assert!(contains(b"xxabc", b"abc") && !contains(b"ab", b"abc") && !contains(b"abd", b"abc"));
    }

    proptest! {
        /// Every satisfiable single range's bytes are the body's slice, and
        /// its Content-Range names them.
        #[test]
        fn a_single_range_is_the_slice(body in proptest::collection::vec(any::<u8>(), 1..200), a in 0u64..250, b in 0u64..250) {
            let (first, last) = (a.min(b), a.max(b));
            let entry = entry_of(&body, &[]);
            let response = respond(&entry, &HeaderMap::new(), &asked(&format!("bytes={first}-{last}")), 0, "HIT").unwrap();
            let len = body.len() as u64;
            if first >= len {
                prop_assert_eq!(response.status(), StatusCode::RANGE_NOT_SATISFIABLE);
            } else {
                let end = last.min(len - 1);
                prop_assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
                let expected = format!("bytes {first}-{end}/{len}");
                prop_assert_eq!(response.headers()["content-range"].to_str().unwrap(), expected.as_str());
                let got = futures_body(response);
                prop_assert_eq!(&got[..], &body[first as usize..=end as usize]);
            }
        }

        /// A multipart answer parses back into the asked slices, in order.
        #[test]
        fn a_multipart_body_parses_back_into_the_slices(
            body in proptest::collection::vec(any::<u8>(), 1..300),
            cuts in proptest::collection::btree_set(0u64..300, 2..12),
            reverse in any::<bool>(),
        ) {
            let len = body.len() as u64;
            // Disjoint ranges from sorted cut points: [c0, c1-1], [c2, c3-1], ...
            let cuts: Vec<u64> = cuts.into_iter().filter(|&c| c <= len).collect();
            let mut list: Vec<(u64, u64)> =
                cuts.chunks(2).filter(|p| p.len() == 2 && p[0] < p[1]).map(|p| (p[0], p[1] - 1)).collect();
            prop_assume!(list.len() >= 2);
            if reverse {
                list.reverse();
            }
            let field = format!("bytes={}", list.iter().map(|(f, l)| format!("{f}-{l}")).collect::<Vec<_>>().join(", "));
            let entry = entry_of(&body, &[("content-type", "application/octet-stream")]);
            let response = respond(&entry, &HeaderMap::new(), &asked(&field), 0, "HIT").unwrap();
            prop_assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
            let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
            let boundary = content_type.strip_prefix("multipart/byteranges; boundary=").unwrap().to_string();
            let got = futures_body(response);
            let parts = parse_multipart(&got, &boundary);
            prop_assert_eq!(parts.len(), list.len());
            for ((range, bytes), (first, last)) in parts.iter().zip(&list) {
                prop_assert_eq!(range, &format!("bytes {first}-{last}/{len}"));
                prop_assert_eq!(&bytes[..], &body[*first as usize..=*last as usize]);
            }
        }

        /// No field, however malformed, panics or yields ranges outside
        /// the body or overlapping.
        #[test]
        fn any_field_evaluates_to_disjoint_spans_within_the_body(field in "[ -~]{0,60}", len in 0u64..100) {
            if let Ranges::Satisfiable(spans) = evaluate(field.as_bytes(), len) {
                prop_assert!(!spans.is_empty() && spans.len() <= RANGES_MAX);
                let mut sorted = spans.clone();
                sorted.sort_by_key(|s| s.first);
                for s in &sorted {
                    prop_assert!(s.first <= s.last && s.last < len);
                }
                prop_assert!(sorted.windows(2).all(|p| p[0].last < p[1].first));
                prop_assert!(sorted.iter().map(|s| s.last - s.first + 1).sum::<u64>() <= len);
            }
        }
    }

    /// The whole body of a built response.
    fn futures_body(response: Response<Body>) -> Vec<u8> {
        use http_body_util::BodyExt;
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(response.into_body().collect()).unwrap().to_bytes().to_vec()
    }
}
