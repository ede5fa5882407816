//! Validators and conditional requests (RFC 9110 §8.8 and §13): pure
//! functions of the request's headers and the representation's validators.

use hyper::header::{HeaderMap, IF_MODIFIED_SINCE, IF_NONE_MATCH};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a GET or HEAD's preconditions decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Send the representation (200).
    Proceed,
    /// The client's copy is current: 304 with the validators.
    NotModified,
}

/// The strong entity tag of a real file, from its inode, size and
/// modification time in nanoseconds (Apache's `INode MTime Size`; nginx
/// uses mtime and size only): any rewrite changes the mtime, a replaced
/// file changes the inode.
pub fn file_etag(inode: u64, size: u64, mtime_ns: u128) -> String {
    format!("\"{inode:x}-{size:x}-{mtime_ns:x}\"")
}

/// The strong entity tag of a synthetic object: its body is a function of
/// its path and size ([`crate::synthetic_body`]), so they determine it.
pub fn synthetic_etag(path: &str, size: u64) -> String {
    format!("\"s{:016x}-{size:x}\"", crate::files::fnv1a64(path.as_bytes()))
}

/// `time` cut to whole seconds, as an HTTP-date carries it.
pub(crate) fn whole_seconds(time: SystemTime) -> SystemTime {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs())
}

/// Evaluates If-None-Match and If-Modified-Since for a GET or HEAD of a
/// representation with a strong `etag` and `last_modified` (RFC 9110
/// §13.2.2): If-None-Match, when present, decides alone (weak comparison;
/// `*` matches any existing representation); otherwise If-Modified-Since
/// gives 304 when the representation was not modified after its date. An
/// If-Modified-Since that is not one valid HTTP-date is ignored.
pub fn evaluate(headers: &HeaderMap, etag: &str, last_modified: SystemTime) -> Precondition {
    let mut if_none_match = headers.get_all(IF_NONE_MATCH).iter().peekable();
    if if_none_match.peek().is_some() {
        let matched = if_none_match.any(|value| value.to_str().is_ok_and(|list| list_matches(list, etag)));
        return if matched { Precondition::NotModified } else { Precondition::Proceed };
    }
    let mut dates = headers.get_all(IF_MODIFIED_SINCE).iter();
    let (Some(date), None) = (dates.next(), dates.next()) else { return Precondition::Proceed };
    let Some(since) = date.to_str().ok().and_then(|text| httpdate::parse_http_date(text.trim()).ok()) else {
        return Precondition::Proceed;
    };
    if whole_seconds(last_modified) <= since {
        Precondition::NotModified
    } else {
        Precondition::Proceed
    }
}

/// Whether an If-None-Match field value (`*` or a list of entity tags)
/// matches `etag` by weak comparison: the opaque tags are equal, whatever
/// their `W/` prefixes. Malformed members match nothing.
pub fn list_matches(list: &str, etag: &str) -> bool {
    let ours = opaque(etag);
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        if rest.is_empty() {
            return false;
        }
        if let Some(after) = rest.strip_prefix('*') {
            if after.trim_start_matches([' ', '\t']).is_empty() || after.trim_start().starts_with(',') {
                return true;
            }
        }
        let tag = rest.strip_prefix("W/").unwrap_or(rest);
        if let Some(inner) = tag.strip_prefix('"') {
            if let Some(end) = inner.find('"') {
                if tag[..end + 2] == *ours {
                    return true;
                }
                rest = &inner[end + 1..];
                continue;
            }
            return false;
        }
        // Malformed member: skip to the next comma.
        match rest.find(',') {
            Some(comma) => rest = &rest[comma + 1..],
            None => return false,
        }
    }
}

/// The opaque part of an entity tag (with its quotes, without `W/`).
fn opaque(etag: &str) -> &str {
    etag.strip_prefix("W/").unwrap_or(etag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&hyper::header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    const TAG: &str = "\"abc-1\"";

    fn modified() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_000_000_000_500)
    }

    #[test]
    fn if_none_match_uses_weak_comparison_and_star() {
        for (list, expected) in [
            ("\"abc-1\"", true),
            ("W/\"abc-1\"", true),
            ("\"x\", W/\"abc-1\"", true),
            ("\"x\",\"abc-1\"", true),
            ("*", true),
            (" * ", true),
            ("\"abc-2\"", false),
            ("\"abc-1", false),
            ("abc-1", false),
            ("bogus, \"abc-1\"", true),
            ("\"abc\"-1\"", false),
            ("*x", false),
            ("", false),
        ] {
            assert_eq!(list_matches(list, TAG), expected, "{list:?}");
        }
    }

    #[test]
    fn if_none_match_takes_precedence_over_if_modified_since() {
        let date = httpdate::fmt_http_date(modified());
        let old_date = httpdate::fmt_http_date(UNIX_EPOCH);
        let not_matching = headers(&[(&IF_NONE_MATCH, "\"other\""), (&IF_MODIFIED_SINCE, &date)]);
        assert_eq!(evaluate(&not_matching, TAG, modified()), Precondition::Proceed, "IMS is ignored");
        let matching = headers(&[(&IF_NONE_MATCH, TAG), (&IF_MODIFIED_SINCE, &old_date)]);
        assert_eq!(evaluate(&matching, TAG, modified()), Precondition::NotModified, "the tag wins over the date");
        let second_line = headers(&[(&IF_NONE_MATCH, "\"other\""), (&IF_NONE_MATCH, TAG)]);
        assert_eq!(evaluate(&second_line, TAG, modified()), Precondition::NotModified, "all lines form one list");
    }

    #[test]
    fn if_modified_since_compares_whole_seconds_and_ignores_bad_dates() {
        let at = |secs: u64| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
        let cases = [
            (at(1_000_000_000), Precondition::NotModified),
            (at(1_000_000_001), Precondition::NotModified),
            (at(999_999_999), Precondition::Proceed),
            ("Sunday, 09-Sep-01 01:46:40 GMT".to_string(), Precondition::NotModified),
            ("Sun Sep  9 01:46:40 2001".to_string(), Precondition::NotModified),
            ("yesterday".to_string(), Precondition::Proceed),
        ];
        for (date, expected) in cases {
            assert_eq!(evaluate(&headers(&[(&IF_MODIFIED_SINCE, &date)]), TAG, modified()), expected, "{date}");
        }
        let twice = headers(&[(&IF_MODIFIED_SINCE, &at(1_000_000_001)), (&IF_MODIFIED_SINCE, &at(1_000_000_001))]);
        assert_eq!(evaluate(&twice, TAG, modified()), Precondition::Proceed, "two members: ignored");
        assert_eq!(evaluate(&HeaderMap::new(), TAG, modified()), Precondition::Proceed);
    }

    #[test]
    fn entity_tags_are_strong_quoted_and_change_with_what_they_derive_from() {
        let tag = file_etag(7, 100, 5);
        assert!(tag.starts_with('"') && tag.ends_with('"') && !tag.starts_with("W/"));
        assert_ne!(tag, file_etag(8, 100, 5));
        assert_ne!(tag, file_etag(7, 101, 5));
        assert_ne!(tag, file_etag(7, 100, 6));
        assert_ne!(synthetic_etag("/a", 1), synthetic_etag("/b", 1));
        assert_ne!(synthetic_etag("/a", 1), synthetic_etag("/a", 2));
    }
}
