//! Targeted cache control (RFC 9213): `CDN-Cache-Control`, the field whose
//! directives this cache obeys instead of `Cache-Control` and `Expires`.
//!
//! Unlike `Cache-Control` (an RFC 9110 list, parsed by hand in
//! `policy`), a targeted field is an RFC 8941 Structured Field
//! Dictionary, parsed here with the `sfv` crate. Each member is a cache
//! directive with the type RFC 9213 §2.1 maps its argument to: Boolean
//! for a directive without one (`no-store`), Integer for delta-seconds
//! (`max-age`), Boolean or String for `no-cache` and `private` (a field
//! list). A field that is not a Dictionary (`max-age=60, &&&`), is empty,
//! or gives a directive this cache knows an argument of another type
//! (`max-age="60"`, `max-age=-1`, `no-store=1`) is a parsing error, and the
//! whole field is ignored (RFC 9213 §2.1: "that field SHOULD be ignored by
//! the cache"): the response's `Cache-Control` then applies, so a broken
//! targeted field never overrides `Cache-Control: no-store`. Parameters on
//! members and unknown directives are ignored.

use crate::policy::{Delta, Directives, DELTA_MAX};
use hyper::header::{HeaderMap, HeaderName};
use sfv::{BareItem, Dictionary, ListEntry, Parser, Version};

/// `CDN-Cache-Control` (RFC 9213 §3).
pub(crate) const CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");

/// The directives of the targeted field `field` in `headers`; `None` when
/// it is absent, empty or invalid (then it is ignored).
pub(crate) fn directives(headers: &HeaderMap, field: &HeaderName) -> Option<Directives> {
    let mut lines = headers.get_all(field).iter().peekable();
    lines.peek()?;
    // A field's lines are one Dictionary, joined with commas (RFC 8941
    // §4.2). Their size is bounded by the listener's header limit.
    let mut joined = Vec::new();
    for (i, line) in lines.enumerate() {
        if i > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    let dictionary: Dictionary = Parser::new(&joined).with_version(Version::Rfc8941).parse().ok()?;
    if dictionary.is_empty() {
        return None;
    }
    let mut d = Directives::default();
    for (key, entry) in &dictionary {
        let item = match entry {
            ListEntry::Item(item) => Some(&item.bare_item),
            ListEntry::InnerList(_) => None,
        };
        match key.as_str() {
            "no-store" => d.no_store = boolean(item)?,
            "public" => d.public = boolean(item)?,
            "must-revalidate" => d.must_revalidate = boolean(item)?,
            "proxy-revalidate" => d.proxy_revalidate = boolean(item)?,
            "must-understand" => d.must_understand = boolean(item)?,
            "no-cache" => d.no_cache = boolean_or_fields(item)?,
            "private" => d.private = boolean_or_fields(item)?,
            "max-age" => d.max_age = delta(item)?,
            "s-maxage" => d.s_maxage = delta(item)?,
            "stale-while-revalidate" => d.stale_while_revalidate = delta(item)?,
            "stale-if-error" => d.stale_if_error = delta(item)?,
            _ => {}
        }
    }
    Some(d)
}

/// A directive without an argument: `no-store` is `true`, `no-store=?0`
/// is absent.
fn boolean(item: Option<&BareItem>) -> Option<bool> {
    item?.as_boolean()
}

/// `no-cache` or `private`: a Boolean, or a String of field names (treated
/// as unqualified, as `policy` does for `Cache-Control`).
fn boolean_or_fields(item: Option<&BareItem>) -> Option<bool> {
    match item? {
        BareItem::Boolean(set) => Some(*set),
        BareItem::String(_) => Some(true),
        _ => None,
    }
}

/// delta-seconds: a non-negative Integer (capped as in `Cache-Control`).
fn delta(item: Option<&BareItem>) -> Option<Delta> {
    let secs = u64::try_from(i64::from(item?.as_integer()?)).ok()?;
    Some(Delta::Secs(secs.min(DELTA_MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn parse(lines: &[&str]) -> Option<Directives> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(CDN_CACHE_CONTROL, HeaderValue::from_str(line).unwrap());
        }
        directives(&headers, &CDN_CACHE_CONTROL)
    }

    #[test]
    fn valid_dictionaries_give_their_directives() {
        let d = parse(&["max-age=60, no-cache, private=\"set-cookie\""]).unwrap();
        assert_eq!((d.max_age, d.no_cache, d.private), (Delta::Secs(60), true, true));
        let d = parse(&["s-maxage=10", "stale-if-error=30;x=1"]).unwrap();
        assert_eq!((d.s_maxage, d.stale_if_error), (Delta::Secs(10), Delta::Secs(30)), "lines joined, params ignored");
        let d = parse(&["no-store, max-age=60;CAPABILITY_TARGET"]);
        assert!(d.is_none(), "an uppercase parameter key is no Structured Field");
        let d = parse(&["no-store=?0, max-age=99999999999, foo=(1 2), bar=\"x\""]).unwrap();
        assert_eq!((d.no_store, d.max_age), (false, Delta::Secs(DELTA_MAX)), "unknown members ignored");
        assert_eq!(parse(&["max-age=1, max-age=2"]).unwrap().max_age, Delta::Secs(2), "the last value of a key");
    }

    #[test]
    fn an_invalid_or_empty_field_is_ignored_as_a_whole() {
        for invalid in [
            "max-age=10000, &&&&&",
            "max-age=\"10000\"",
            "max-age=-1",
            "max-age=10.5",
            "max-age=(10)",
            "no-store=1",
            "private=tok",
            "MaX-aGe=60",
            "max-age =60",
            "max-age= 60",
            "max-age=60,",
            "",
        ] {
            assert_eq!(parse(&[invalid]), None, "{invalid:?}");
        }
        assert_eq!(parse(&["max-age=60", "&"]), None, "one bad line spoils the field");
    }
}
