//! The secondary cache key of `Vary` (RFC 9111 §4.1): the fields a stored
//! response varies on, the request's values of them, and which later
//! requests select the same stored response.
//!
//! §4.1 lets a cache compare values "normalizing both header field values
//! in a way that is known to have identical semantics, according to the
//! header field's specification (e.g., reordering field values when order
//! is not significant; case-normalization, where values are defined to be
//! case-insensitive)". Every field is a list (RFC 9110 §5.3): its lines'
//! members are compared in order, whitespace around each trimmed.
//! `Accept-Language` (RFC 9110 §12.5.4) goes further, to the normal form
//! of [`accept_language`]: ranges lowercased (RFC 4647 §2: case-
//! insensitive), weights as numbers (`q=1.0` is `q=1` is no weight), and
//! the order of ranges with equal weights dropped. The last is a choice:
//! RFC 9110 §12.5.4 notes that some servers read list order as priority
//! among equal weights; a site whose origin does and serves several
//! languages to one URL sees a client listing `de, en` served the variant
//! stored for `en, de`.
//!
//! A response that names its one language (`Content-Language: de`) is also
//! selected by a request whose single most preferred range (the highest
//! weight, not shared, above 0) is that language: an origin that
//! negotiates by weight and has that language serves it to that request.

use hyper::header::{HeaderMap, HeaderName, ACCEPT_LANGUAGE, CONTENT_LANGUAGE};

/// The request's values of the fields a stored response varies on (§4.1):
/// the secondary key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Vary {
    /// (field, its normal form; `None` when the request had none).
    fields: Vec<(HeaderName, Option<String>)>,
    /// The stored response's one `Content-Language`, lowercased.
    language: Option<String>,
}

/// Two keys are the same variant when the request values are: the
/// response's language is not part of the key.
impl PartialEq for Vary {
    fn eq(&self, other: &Self) -> bool {
        self.fields == other.fields
    }
}

impl Eq for Vary {}

impl Vary {
    /// The field names `response` varies on; `None` for `Vary: *` (never
    /// matches anything).
    pub(crate) fn of(response: &HeaderMap) -> Option<Vec<HeaderName>> {
        let mut names = Vec::new();
        for line in response.get_all(hyper::header::VARY) {
            let Ok(line) = line.to_str() else { return None };
            for name in line.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if name == "*" {
                    return None;
                }
                let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else { return None };
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        Some(names)
    }

    /// The secondary key of `request` for `response`, varying on `names`.
    pub(crate) fn key(names: &[HeaderName], request: &HeaderMap, response: &HeaderMap) -> Vary {
        let language = names.contains(&ACCEPT_LANGUAGE).then(|| content_language(response)).flatten();
        Vary { fields: names.iter().map(|name| (name.clone(), normalized(request, name))).collect(), language }
    }

    /// Does `request` select a response stored with this key?
    pub(crate) fn matches(&self, request: &HeaderMap) -> bool {
        self.fields.iter().all(|(name, value)| {
            if name == ACCEPT_LANGUAGE {
                self.language_matches(request, value.as_deref())
            } else {
                same_members(request, name, value.as_deref())
            }
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// `Accept-Language`: the same normal form, or the stored response's
    /// language is the request's single most preferred range.
    fn language_matches(&self, request: &HeaderMap, stored: Option<&str>) -> bool {
        let ranges = match accept_language(request) {
            Normal::Absent => return stored.is_none(),
            Normal::Raw => return same_members(request, &ACCEPT_LANGUAGE, stored),
            Normal::Ranges(ranges) => ranges,
        };
        if stored.is_some_and(|stored| stored == serialize(&ranges)) {
            return true;
        }
        let Some(language) = &self.language else { return false };
        match ranges.as_slice() {
            [(range, q), rest @ ..] => *q > 0 && range == language && rest.first().is_none_or(|(_, next)| next < q),
            [] => false,
        }
    }
}

/// `normalized(request, name) == stored` for a field without a normal form
/// of its own, without building the string (the hit path).
fn same_members(request: &HeaderMap, name: &HeaderName, stored: Option<&str>) -> bool {
    let mut lines = request.get_all(name).iter().peekable();
    let Some(stored) = stored else { return lines.peek().is_none() };
    if lines.peek().is_none() {
        return false;
    }
    let mut expected = stored.split(", ");
    for line in lines {
        let Ok(line) = line.to_str() else { return false };
        for member in line.split(',') {
            if expected.next() != Some(member.trim()) {
                return false;
            }
        }
    }
    expected.next().is_none()
}

/// The normal form of `request`'s `name` field, the stored key.
fn normalized(request: &HeaderMap, name: &HeaderName) -> Option<String> {
    if name == ACCEPT_LANGUAGE {
        match accept_language(request) {
            Normal::Absent => return None,
            Normal::Ranges(ranges) => return Some(serialize(&ranges)),
            Normal::Raw => {}
        }
    }
    let mut values = request.get_all(name).iter().peekable();
    values.peek()?;
    let mut joined = Vec::new();
    for value in values {
        let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
        joined.extend(text.split(',').map(|m| m.trim().to_string()));
    }
    Some(joined.join(", "))
}

/// A request's `Accept-Language`, normalised.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Normal {
    Absent,
    /// Not of the field's syntax: compared member by member, as any field.
    Raw,
    /// (range lowercased, weight in thousandths), by weight descending,
    /// then range ascending.
    Ranges(Vec<(String, u16)>),
}

/// The normal form of `Accept-Language` (RFC 9110 §12.5.4):
/// `#( language-range [ weight ] )` over all lines, empty members dropped
/// (§5.6.1); each range (`*`, or 1–8 letters then `-` and 1–8 letters or
/// digits, repeated; RFC 4647 §2.1) lowercased; its weight (§12.4.2: `OWS
/// ";" OWS "q=" qvalue`, `q` either case) in thousandths, 1000 when absent;
/// sorted by weight descending, then range. Any other parameter, or a
/// member not of that syntax, makes the whole value [`Normal::Raw`].
pub(crate) fn accept_language(request: &HeaderMap) -> Normal {
    let mut lines = request.get_all(ACCEPT_LANGUAGE).iter().peekable();
    if lines.peek().is_none() {
        return Normal::Absent;
    }
    let mut ranges = Vec::new();
    for line in lines {
        let Ok(line) = line.to_str() else { return Normal::Raw };
        for member in line.split(',').map(|m| m.trim_matches([' ', '\t'])).filter(|m| !m.is_empty()) {
            let mut parts = member.split(';');
            let range = parts.next().unwrap_or_default().trim_end_matches([' ', '\t']);
            if !is_language_range(range) {
                return Normal::Raw;
            }
            let weight = match (parts.next(), parts.next()) {
                (None, _) => 1000,
                (Some(param), None) => match qvalue(param.trim_matches([' ', '\t'])) {
                    Some(q) => q,
                    None => return Normal::Raw,
                },
                (Some(_), Some(_)) => return Normal::Raw,
            };
            ranges.push((range.to_ascii_lowercase(), weight));
        }
    }
    ranges.sort_by(|(a, qa), (b, qb)| qb.cmp(qa).then_with(|| a.cmp(b)));
    Normal::Ranges(ranges)
}

/// `q=` qvalue (RFC 9110 §12.4.2) in thousandths: `0` [ `.` 0–3 digits ]
/// or `1` [ `.` 0–3 zeros ].
fn qvalue(param: &str) -> Option<u16> {
    let value = param.strip_prefix("q=").or_else(|| param.strip_prefix("Q="))?;
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths =
        fraction.bytes().chain(std::iter::repeat(b'0')).take(3).fold(0u16, |n, b| n * 10 + u16::from(b - b'0'));
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// `*`, or `1*8ALPHA *("-" 1*8alphanum)` (RFC 4647 §2.1).
fn is_language_range(range: &str) -> bool {
    if range == "*" {
        return true;
    }
    let mut subtags = range.split('-');
    let first = subtags.next().unwrap_or_default();
    (1..=8).contains(&first.len())
        && first.bytes().all(|b| b.is_ascii_alphabetic())
        && subtags.all(|tag| (1..=8).contains(&tag.len()) && tag.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The normal form as text, itself a valid `Accept-Language` with the same
/// normal form: `de, en, fr;q=0.5`.
fn serialize(ranges: &[(String, u16)]) -> String {
    let mut text = String::new();
    for (i, (range, q)) in ranges.iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(range);
        if *q < 1000 {
            let fraction = format!("{q:03}");
            let fraction = fraction.trim_end_matches('0');
            text.push_str(";q=0");
            if !fraction.is_empty() {
                text.push('.');
                text.push_str(fraction);
            }
        }
    }
    text
}

/// The response's `Content-Language` when it is one language tag.
fn content_language(response: &HeaderMap) -> Option<String> {
    let mut lines = response.get_all(CONTENT_LANGUAGE).iter();
    let tag = lines.next()?.to_str().ok()?.trim();
    (lines.next().is_none() && tag != "*" && is_language_range(tag)).then(|| tag.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::testkit::headers;

    fn languages(lines: &[&str]) -> HeaderMap {
        headers(&lines.iter().map(|l| ("accept-language", *l)).collect::<Vec<_>>())
    }

    fn key(request: &HeaderMap, response: &[(&str, &str)]) -> Vary {
        let response = headers(response);
        Vary::key(&Vary::of(&response).unwrap(), request, &response)
    }

    #[test]
    fn vary_matches_normalized_values_and_star_never() {
        let names = Vary::of(&headers(&[("vary", "Accept-Encoding, cookie"), ("vary", "accept-encoding")])).unwrap();
        assert_eq!(names.len(), 2);
        let none = HeaderMap::new();
        let key = Vary::key(&names, &headers(&[("accept-encoding", "gzip,  br"), ("cookie", "u=1")]), &none);
        assert!(key.matches(&headers(&[("accept-encoding", "gzip"), ("accept-encoding", "br"), ("cookie", "u=1")])));
        assert!(!key.matches(&headers(&[("accept-encoding", "gzip, br"), ("cookie", "u=2")])));
        assert!(!key.matches(&headers(&[("accept-encoding", "gzip, br")])), "absent differs from present");
        assert!(Vary::key(&names, &none, &none).matches(&none), "absent matches absent");
        assert!(Vary::of(&headers(&[("vary", "*")])).is_none());
    }

    #[test]
    fn accept_language_normal_form() {
        let normal = |lines: &[&str]| match accept_language(&languages(lines)) {
            Normal::Ranges(ranges) => Some(serialize(&ranges)),
            _ => None,
        };
        assert_eq!(normal(&["en, de"]).as_deref(), Some("de, en"));
        assert_eq!(normal(&[" eN ,\tDe-AT ", ""]).as_deref(), Some("de-at, en"));
        assert_eq!(
            normal(&["fr;q=0.5, de;q=1.0", "en ; Q=0.500, *;q=0"]).as_deref(),
            Some("de, en;q=0.5, fr;q=0.5, *;q=0")
        );
        assert_eq!(normal(&["da;q=0.005, en-gb;q=0.25"]).as_deref(), Some("en-gb;q=0.25, da;q=0.005"));
        for raw in
            ["en;q=2", "en;q=0.5000", "en;q=1.5", "en;level=1", "en;q=0.5;x=y", "e_n", "toolonglang", "en-", "q=1"]
        {
            assert_eq!(accept_language(&languages(&[raw])), Normal::Raw, "{raw}");
        }
        assert_eq!(accept_language(&HeaderMap::new()), Normal::Absent);
    }

    #[test]
    fn a_stored_language_is_selected_by_requests_preferring_it_most() {
        let variant = key(&languages(&["en, de"]), &[("vary", "accept-language"), ("content-language", "de")]);
        assert!(variant.matches(&languages(&["de, en"])), "order");
        assert!(variant.matches(&languages(&["eN, De"])), "case");
        assert!(variant.matches(&languages(&[" en ,   de"])), "whitespace");
        assert!(variant.matches(&languages(&["fr;q=0.5, de;q=1.0"])), "select: de preferred most");
        assert!(variant.matches(&languages(&["DE"])));
        assert!(!variant.matches(&languages(&["fr;q=0.5, en;q=1.0"])), "en preferred");
        assert!(!variant.matches(&languages(&["de, fr"])), "de not preferred alone");
        assert!(!variant.matches(&languages(&["de;q=0"])), "de not acceptable");
        assert!(!variant.matches(&languages(&["de-at"])), "another tag");
        assert!(!variant.matches(&HeaderMap::new()), "absent");
        let no_language = key(&languages(&["en, de"]), &[("vary", "accept-language")]);
        assert!(!no_language.matches(&languages(&["de"])));
        assert!(no_language.matches(&languages(&["de,en"])));
        let two = key(&languages(&["en"]), &[("vary", "accept-language"), ("content-language", "de, en")]);
        assert!(!two.matches(&languages(&["de"])), "a response in two languages selects by key only");
    }

    /// A member of a generated `Accept-Language`: a range from a small set
    /// (so different headers often share ranges), its case, a weight in one
    /// of its spellings, and whitespace.
    fn member() -> impl Strategy<Value = String> {
        let range = prop::sample::select(vec!["en", "de", "en-gb", "fr", "*", "pt-br"]);
        let weight = prop_oneof![
            Just(String::new()),
            (0u16..=1000).prop_map(|q| {
                if q == 1000 {
                    ";q=1.0".to_string()
                } else {
                    format!(";q=0.{q:03}")
                }
            }),
            prop::sample::select(vec![";q=0.5", ";q=0.50", " ; Q=0.500", ";q=1", ";q=0"]).prop_map(str::to_string),
        ];
        let space = prop::sample::select(vec!["", " ", "\t", "  "]);
        (range, any::<u8>(), weight, space.clone(), space).prop_map(|(range, case, weight, before, after)| {
            let range: String = range
                .chars()
                .enumerate()
                .map(|(i, c)| if case >> (i % 8) & 1 == 1 { c.to_ascii_uppercase() } else { c })
                .collect();
            format!("{before}{range}{weight}{after}")
        })
    }

    /// An `Accept-Language` as lines of members.
    fn lines() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(prop::collection::vec(member(), 1..4).prop_map(|m| m.join(",")), 1..3)
    }

    fn request(lines: &[String]) -> HeaderMap {
        languages(&lines.iter().map(String::as_str).collect::<Vec<_>>())
    }

    proptest! {
        /// Normalising is idempotent: the normal form, sent as the field,
        /// has itself as its normal form.
        #[test]
        fn normalising_is_idempotent(lines in lines()) {
            let once = normalized(&request(&lines), &ACCEPT_LANGUAGE).unwrap();
            let twice = normalized(&languages(&[&once]), &ACCEPT_LANGUAGE).unwrap();
            prop_assert_eq!(once, twice);
        }

        /// Two requests select the same variants exactly when their
        /// normal forms are equal (no `Content-Language`: no selection by
        /// preference), and reordering, recasing or respacing members
        /// never changes the normal form.
        #[test]
        fn the_same_normal_form_selects_the_same_variant(a in lines(), b in lines(), seed in any::<u64>()) {
            let (a, b) = (request(&a), request(&b));
            let variant = key(&a, &[("vary", "Accept-Language")]);
            let same = normalized(&a, &ACCEPT_LANGUAGE) == normalized(&b, &ACCEPT_LANGUAGE);
            prop_assert_eq!(variant.matches(&b), same);
            prop_assert!(variant.matches(&a));
            // A shuffled copy of a's members, recased, on one line.
            let mut members: Vec<String> = a
                .get_all(ACCEPT_LANGUAGE)
                .iter()
                .flat_map(|l| l.to_str().unwrap().split(',').map(str::to_string).collect::<Vec<_>>())
                .collect();
            let n = members.len();
            for i in 0..n {
                members.swap(i, (seed as usize).wrapping_add(i * 7) % n);
            }
            let shuffled = members.join(" ,  ").to_ascii_uppercase();
            prop_assert!(variant.matches(&languages(&[&shuffled])), "{:?} vs {:?}", a, shuffled);
        }
    }
}
