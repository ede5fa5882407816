//! Published pages: the page an update hands to the module with
//! UPDATE_DONE, kept in the version table's region so that a proxy whose
//! check failed reads the new page **one-sidedly**, in one batch with the
//! versions that validate it, instead of waiting for the application tier.
//!
//! The area (its place in the region is in the table's header, see
//! [`crate::version_table`]) holds `count` records of `8 + page_bytes`
//! bytes, each a seqlock record ([`tierstack_fabric::seqlock`]): a sequence
//! word, then the payload
//!
//! ```text
//! +0   u32  key slot: the version-table slot whose page this is
//! +4   u16  status (200)
//! +6   u16  reserved, 0
//! +8   u32  meta bytes
//! +12  u32  body bytes
//! +16  meta: "<X-Tierstack-Deps value>\n<path>\n" then "<name>: <value>\n" per field
//! +16+meta  body
//! ```
//!
//! (integers little-endian). **Placement and eviction:** a page is stored in
//! record `key slot mod count`, where the key slot is that of the update's
//! *first* key; a later page whose key maps to the same record replaces it
//! (direct-mapped). Slots are handed out from 0, so a table with at most
//! `count` keys never evicts, and a hot key's page is evicted only by
//! another update of a key `count` slots away. A page longer than
//! `page_bytes` is not published (the update completes; proxies fetch as
//! before).
//!
//! **What makes a page usable** ([`judge`]): read in one batch with the
//! table's incarnation and the slots of the proxy's stale copy, the record
//! is untorn (both sequence reads equal and even, and written at least
//! once), names the key slot the proxy looked for and the request's path,
//! and every dependency of the page is one of the slots read in that same
//! batch, at the version read there. The versions were read after the
//! request began, so the page is exactly as current as a copy that passed
//! its check.

use crate::deps::{DepsHeader, DEPS_HEADER};
use serde::{Deserialize, Serialize};

/// Most records an area may have (`app-module --publish-pages`).
pub const PAGES_MAX: u32 = 1 << 16;
/// Records unless told otherwise.
pub const PAGES_DEFAULT: u32 = 256;
/// Largest payload (page fields and body) a record may hold.
pub const PAGE_BYTES_MAX: u32 = 1 << 20;
/// Payload bytes per record unless told otherwise (`--publish-page-bytes`).
pub const PAGE_BYTES_DEFAULT: u32 = 64 * 1024;
/// Longest path a page may name.
pub const PATH_BYTES_MAX: usize = 2048;
/// Most header fields a page may carry.
pub const FIELDS_MAX: usize = 64;
/// The fixed part of a payload.
pub const PAYLOAD_HEADER_BYTES: usize = 16;

/// Fields the page may not set: hop-by-hop ones, the length (the proxy
/// frames the body itself) and the dependencies (the module writes them).
const FORBIDDEN_FIELDS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    DEPS_HEADER,
];

/// Where the area is in the region, read from the table's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagesLayout {
    /// Byte offset of record 0.
    pub offset: u64,
    pub count: u32,
    /// Payload bytes per record (a multiple of 8).
    pub page_bytes: u32,
}

impl PagesLayout {
    /// The layout the header words describe, if they describe one that
    /// fits in a region of `region_len` bytes; `None`: no pages.
    pub fn from_words(offset: u64, count: u64, page_bytes: u64, region_len: u64) -> Option<PagesLayout> {
        let count = u32::try_from(count).ok().filter(|c| (1..=PAGES_MAX).contains(c))?;
        let page_bytes =
            u32::try_from(page_bytes).ok().filter(|b| (8..=PAGE_BYTES_MAX).contains(b) && b.is_multiple_of(8))?;
        let layout = PagesLayout { offset, count, page_bytes };
        (offset.is_multiple_of(8) && offset.checked_add(layout.bytes())? <= region_len).then_some(layout)
    }

    /// Bytes the area occupies.
    pub fn bytes(&self) -> u64 {
        u64::from(self.count) * self.record_bytes()
    }

    fn record_bytes(&self) -> u64 {
        8 + u64::from(self.page_bytes)
    }

    /// The record a key slot's page lives in.
    pub fn record_of(&self, key_slot: u32) -> u32 {
        key_slot % self.count
    }

    /// Offset of a record's sequence word (its payload follows).
    pub fn record_offset(&self, record: u32) -> u64 {
        self.offset + u64::from(record) * self.record_bytes()
    }
}

/// A page as an application hands it to the module (the JSON of
/// `update_done`'s `page`, `docs/coherence-protocol.md`). The body comes as
/// text (`body`) or as base64 (`body_base64`), exactly one of them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Page {
    /// The page's request target, origin-form (`/doc/7`, a query included).
    pub path: String,
    /// Only 200: a proxy caches a response with dependencies only as a 200.
    #[serde(default = "status_ok")]
    pub status: u16,
    /// End-to-end header fields, `[name, value]` each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

fn status_ok() -> u16 {
    200
}

impl Default for Page {
    fn default() -> Self {
        Page { path: String::new(), status: status_ok(), headers: Vec::new(), body: None, body_base64: None }
    }
}

/// Why a page is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the page needs {bytes} bytes; a published page holds at most {max}")]
    TooLarge { bytes: usize, max: u32 },
    #[error("page path {0:?}: must start with '/', at most {PATH_BYTES_MAX} bytes, no spaces or control characters")]
    BadPath(String),
    #[error("page status {0}: only 200 is published")]
    BadStatus(u16),
    #[error("page header field {0:?}: {1}")]
    BadField(String, &'static str),
    #[error("a page has at most {FIELDS_MAX} header fields")]
    TooManyFields,
    #[error("page body: {0}")]
    BadBody(String),
    #[error("this module publishes no pages (--publish-pages 0)")]
    NoArea,
}

/// A page checked and ready to be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageParts {
    pub path: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

fn valid_path(path: &str) -> bool {
    path.starts_with('/') && path.len() <= PATH_BYTES_MAX && path.bytes().all(|b| b.is_ascii_graphic())
}

fn field_name_ok(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn field_value_ok(value: &str) -> bool {
    value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
}

impl Page {
    /// Checks the page and decodes its body.
    pub fn into_parts(self) -> Result<PageParts, PageError> {
        use base64::Engine;
        if !valid_path(&self.path) {
            return Err(PageError::BadPath(self.path.chars().take(64).collect()));
        }
        if self.status != 200 {
            return Err(PageError::BadStatus(self.status));
        }
        if self.headers.len() > FIELDS_MAX {
            return Err(PageError::TooManyFields);
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in self.headers {
            let lower = name.to_ascii_lowercase();
            if !field_name_ok(&lower) {
                return Err(PageError::BadField(name, "not a field name"));
            }
            if FORBIDDEN_FIELDS.contains(&lower.as_str()) {
                return Err(PageError::BadField(name, "set by the proxy or the module, not the page"));
            }
            if !field_value_ok(&value) {
                return Err(PageError::BadField(name, "control characters in the value"));
            }
            headers.push((lower, value));
        }
        let body = match (self.body, self.body_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|e| PageError::BadBody(format!("body_base64: {e}")))?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return Err(PageError::BadBody("give body or body_base64, not both".into())),
        };
        Ok(PageParts { path: self.path, status: self.status, headers, body })
    }

    /// A page of `body` (sent as base64, so any bytes travel).
    pub fn with_body(path: impl Into<String>, headers: Vec<(String, String)>, body: &[u8]) -> Page {
        use base64::Engine;
        Page {
            path: path.into(),
            status: 200,
            headers,
            body: None,
            body_base64: Some(base64::engine::general_purpose::STANDARD.encode(body)),
        }
    }
}

fn meta_of(deps: &str, parts: &PageParts) -> String {
    let mut meta = format!("{deps}\n{}\n", parts.path);
    for (name, value) in &parts.headers {
        meta.push_str(name);
        meta.push_str(": ");
        meta.push_str(value);
        meta.push('\n');
    }
    meta
}

/// The payload of a record holding `parts` for `key_slot`, generated at
/// `deps`; refused if longer than `page_bytes`.
pub fn encode(key_slot: u32, deps: &str, parts: &PageParts, page_bytes: u32) -> Result<Vec<u8>, PageError> {
    let meta = meta_of(deps, parts);
    let bytes = PAYLOAD_HEADER_BYTES + meta.len() + parts.body.len();
    let too_large = PageError::TooLarge { bytes, max: page_bytes };
    if bytes > page_bytes as usize {
        return Err(too_large);
    }
    let meta_len = u32::try_from(meta.len()).map_err(|_| too_large.clone())?;
    let body_len = u32::try_from(parts.body.len()).map_err(|_| too_large)?;
    let mut payload = Vec::with_capacity(bytes);
    payload.extend_from_slice(&key_slot.to_le_bytes());
    payload.extend_from_slice(&parts.status.to_le_bytes());
    payload.extend_from_slice(&0u16.to_le_bytes());
    payload.extend_from_slice(&meta_len.to_le_bytes());
    payload.extend_from_slice(&body_len.to_le_bytes());
    payload.extend_from_slice(meta.as_bytes());
    payload.extend_from_slice(&parts.body);
    Ok(payload)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The payload length a record's first [`PAYLOAD_HEADER_BYTES`] declare.
pub fn declared_len(payload: &[u8]) -> Option<usize> {
    let meta = u32_at(payload, 8)? as usize;
    let body = u32_at(payload, 12)? as usize;
    PAYLOAD_HEADER_BYTES.checked_add(meta)?.checked_add(body)
}

/// A page read back from a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPage {
    pub key_slot: u32,
    pub status: u16,
    /// The `X-Tierstack-Deps` value of the versions it was generated at.
    pub deps: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Decodes a whole payload; `None` if it is not one [`encode`] wrote (a
/// record never written, or bytes that do not parse). Never panics.
pub fn decode(payload: &[u8]) -> Option<StoredPage> {
    let key_slot = u32_at(payload, 0)?;
    let status = u16::from_le_bytes(payload.get(4..6)?.try_into().ok()?);
    let meta_len = u32_at(payload, 8)? as usize;
    let body_len = u32_at(payload, 12)? as usize;
    let meta_end = PAYLOAD_HEADER_BYTES.checked_add(meta_len)?;
    let meta = std::str::from_utf8(payload.get(PAYLOAD_HEADER_BYTES..meta_end)?).ok()?;
    let body = payload.get(meta_end..meta_end.checked_add(body_len)?)?.to_vec();
    let mut lines = meta.strip_suffix('\n')?.split('\n');
    let deps = lines.next()?.to_string();
    let path = lines.next()?.to_string();
    let headers = lines
        .map(|line| line.split_once(": ").map(|(n, v)| (n.to_string(), v.to_string())))
        .collect::<Option<Vec<_>>>()?;
    Some(StoredPage { key_slot, status, deps, path, headers, body })
}

/// What a page read came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageVerdict {
    /// Install it: current, and the page the request asked for.
    Current(Box<(StoredPage, DepsHeader)>),
    /// The record holds more than was read: read this many payload bytes.
    ReadMore(usize),
    /// Not usable; go to the application tier as before.
    Unusable(PageMiss),
}

/// Why a published page could not serve a request (counted by proxies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageMiss {
    /// The module has no published-pages area.
    NoArea,
    /// The table belongs to another run of the module.
    OtherIncarnation,
    /// A write was in progress during the read.
    Torn,
    /// The record was never written, or holds another key's page, or
    /// another path's.
    Absent,
    /// The page is not at the versions read in the same batch.
    Changed,
    /// The page depends on a key whose slot the batch did not read.
    Unverifiable,
    /// The record's bytes do not decode.
    Malformed,
}

/// One slot of the version table as the batch read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRead {
    pub slot: u32,
    pub fingerprint: u64,
    pub version: u64,
}

/// The seqlock's acceptance rule for one record read: both sequence words
/// equal, even, and the record written at least once.
pub fn untorn(before: u64, after: u64) -> bool {
    before == after && before.is_multiple_of(2) && before != 0
}

/// Is a page generated at `page` current, given the incarnation and slots
/// read in the same batch as it? Every dependency must be one of `slots`
/// (by slot, with the key's fingerprint) at exactly the page's version.
pub fn page_is_current(page: &DepsHeader, incarnation: u64, slots: &[SlotRead]) -> Result<(), PageMiss> {
    if page.incarnation.0 != incarnation {
        return Err(PageMiss::OtherIncarnation);
    }
    for dep in &page.deps {
        let read = slots.iter().find(|s| s.slot == dep.slot).ok_or(PageMiss::Unverifiable)?;
        if read.fingerprint != crate::version_table::fingerprint(&dep.key) || read.version != dep.version {
            return Err(PageMiss::Changed);
        }
    }
    Ok(())
}

/// The whole decision on one batch's results: the stale copy's
/// `header` (whose first key's record was read) and the request's `path`;
/// `incarnation` and `slots` as read, the record's two sequence words and
/// the payload bytes read between them.
pub fn judge(
    header: &DepsHeader,
    path: &str,
    incarnation: u64,
    slots: &[SlotRead],
    sequence: (u64, u64),
    payload: &[u8],
) -> PageVerdict {
    if incarnation != header.incarnation.0 {
        return PageVerdict::Unusable(PageMiss::OtherIncarnation);
    }
    if sequence.0 == 0 && sequence.1 == 0 {
        return PageVerdict::Unusable(PageMiss::Absent);
    }
    if !untorn(sequence.0, sequence.1) {
        return PageVerdict::Unusable(PageMiss::Torn);
    }
    let Some(first) = header.deps.first() else { return PageVerdict::Unusable(PageMiss::Absent) };
    if u32_at(payload, 0) != Some(first.slot) {
        return PageVerdict::Unusable(PageMiss::Absent);
    }
    match declared_len(payload) {
        Some(len) if len > payload.len() => return PageVerdict::ReadMore(len),
        Some(_) => {}
        None => return PageVerdict::Unusable(PageMiss::Malformed),
    }
    let Some(page) = decode(payload) else { return PageVerdict::Unusable(PageMiss::Malformed) };
    if page.path != path {
        return PageVerdict::Unusable(PageMiss::Absent);
    }
    let Ok(deps) = DepsHeader::parse(&page.deps) else { return PageVerdict::Unusable(PageMiss::Malformed) };
    if deps.node != header.node {
        return PageVerdict::Unusable(PageMiss::Malformed);
    }
    match page_is_current(&deps, incarnation, slots) {
        Ok(()) => PageVerdict::Current(Box::new((page, deps))),
        Err(miss) => PageVerdict::Unusable(miss),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deps::Dep;
    use crate::version_table::{fingerprint, Incarnation};
    use tierstack_base::NodeId;

    fn header(version: u64) -> DepsHeader {
        DepsHeader {
            node: NodeId(0),
            incarnation: Incarnation(0x77),
            deps: vec![Dep { key: "doc/a".into(), version, slot: 3 }],
        }
    }

    fn parts() -> PageParts {
        Page {
            path: "/doc/a".into(),
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: Some("hello".into()),
            ..Page::default()
        }
        .into_parts()
        .unwrap()
    }

    fn slot(version: u64) -> SlotRead {
        SlotRead { slot: 3, fingerprint: fingerprint("doc/a"), version }
    }

    #[test]
    fn a_page_round_trips_through_its_record() {
        let payload = encode(3, &header(5).to_string(), &parts(), 4096).unwrap();
        assert_eq!(declared_len(&payload), Some(payload.len()));
        let page = decode(&payload).unwrap();
        assert_eq!((page.key_slot, page.status, page.path.as_str()), (3, 200, "/doc/a"));
        assert_eq!(page.headers, vec![("content-type".to_string(), "text/plain".to_string())]);
        assert_eq!((page.body.as_slice(), page.deps), (&b"hello"[..], header(5).to_string()));
        let binary = Page::with_body("/x", vec![], &[0, 255, 10, 13]).into_parts().unwrap();
        assert_eq!(decode(&encode(0, "d", &binary, 4096).unwrap()).unwrap().body, vec![0, 255, 10, 13]);
    }

    #[test]
    fn pages_that_break_the_rules_are_refused() {
        let page = |f: fn(&mut Page)| {
            let mut page = Page { path: "/doc/a".into(), body: Some("x".into()), ..Page::default() };
            f(&mut page);
            page.into_parts()
        };
        assert!(matches!(page(|p| p.path = "doc/a".into()), Err(PageError::BadPath(_))));
        assert!(matches!(page(|p| p.path = "/a b".into()), Err(PageError::BadPath(_))));
        assert_eq!(page(|p| p.status = 404), Err(PageError::BadStatus(404)));
        assert!(matches!(
            page(|p| p.headers = vec![("Content-Length".into(), "1".into())]),
            Err(PageError::BadField(..))
        ));
        assert!(matches!(page(|p| p.headers = vec![(DEPS_HEADER.into(), "n=0".into())]), Err(PageError::BadField(..))));
        assert!(matches!(page(|p| p.headers = vec![("a b".into(), "1".into())]), Err(PageError::BadField(..))));
        assert!(matches!(
            page(|p| p.headers = vec![("x".into(), "1\r\nevil: 1".into())]),
            Err(PageError::BadField(..))
        ));
        assert!(matches!(page(|p| p.body_base64 = Some("AA==".into())), Err(PageError::BadBody(_))));
        assert!(matches!(
            page(|p| {
                p.body = None;
                p.body_base64 = Some("%%%".into())
            }),
            Err(PageError::BadBody(_))
        ));
        assert_eq!(page(|p| p.headers = vec![("x".into(), "1".into()); FIELDS_MAX + 1]), Err(PageError::TooManyFields));
        let big = PageParts { body: vec![0; 100], ..parts() };
        assert!(matches!(encode(3, "d", &big, 64), Err(PageError::TooLarge { max: 64, .. })));
        assert!(page(|p| p.headers = vec![("x".into(), "1".into()); FIELDS_MAX]).is_ok(), "the most fields allowed");
    }

    #[test]
    fn a_page_fits_a_record_to_the_byte() {
        let deps = header(5).to_string();
        let fixed = encode(3, &deps, &PageParts { body: vec![], ..parts() }, 4096).unwrap().len();
        let exact = PageParts { body: vec![1; 4096 - fixed], ..parts() };
        assert_eq!(encode(3, &deps, &exact, 4096).unwrap().len(), 4096, "a page exactly a record long");
        let over = PageParts { body: vec![1; 4097 - fixed], ..parts() };
        assert_eq!(encode(3, &deps, &over, 4096), Err(PageError::TooLarge { bytes: 4097, max: 4096 }));
        // The default record holds a 60 KiB page.
        let page = PageParts { body: vec![1; 60 * 1024], ..parts() };
        assert!(encode(3, &deps, &page, PAGE_BYTES_DEFAULT).is_ok());
        assert_eq!(PAGE_BYTES_DEFAULT, 65_536);
    }

    #[test]
    fn a_page_serves_only_at_the_versions_read_with_it() {
        let payload = encode(3, &header(6).to_string(), &parts(), 4096).unwrap();
        let judge_at =
            |version: u64, seq: (u64, u64), path: &str| judge(&header(5), path, 0x77, &[slot(version)], seq, &payload);
        assert!(matches!(judge_at(6, (2, 2), "/doc/a"), PageVerdict::Current(_)));
        assert_eq!(judge_at(7, (2, 2), "/doc/a"), PageVerdict::Unusable(PageMiss::Changed), "a newer update");
        assert_eq!(judge_at(5, (2, 2), "/doc/a"), PageVerdict::Unusable(PageMiss::Changed), "not yet visible");
        assert_eq!(judge_at(6, (3, 3), "/doc/a"), PageVerdict::Unusable(PageMiss::Torn));
        assert_eq!(judge_at(6, (2, 4), "/doc/a"), PageVerdict::Unusable(PageMiss::Torn));
        assert_eq!(judge_at(6, (0, 0), "/doc/a"), PageVerdict::Unusable(PageMiss::Absent));
        // A first write began during the read: torn (read again), not absent.
        assert_eq!(judge_at(6, (0, 2), "/doc/a"), PageVerdict::Unusable(PageMiss::Torn));
        assert_eq!(judge_at(6, (2, 0), "/doc/a"), PageVerdict::Unusable(PageMiss::Torn));
        assert_eq!(judge_at(6, (2, 2), "/doc/b"), PageVerdict::Unusable(PageMiss::Absent), "another path");
        let other_key = SlotRead { fingerprint: fingerprint("doc/b"), ..slot(6) };
        assert_eq!(
            judge(&header(5), "/doc/a", 0x77, &[other_key], (2, 2), &payload),
            PageVerdict::Unusable(PageMiss::Changed)
        );
        assert_eq!(
            judge(&header(5), "/doc/a", 0x78, &[slot(6)], (2, 2), &payload),
            PageVerdict::Unusable(PageMiss::OtherIncarnation)
        );
        assert_eq!(
            judge(&header(5), "/doc/a", 0x77, &[], (2, 2), &payload),
            PageVerdict::Unusable(PageMiss::Unverifiable)
        );
        // Another key's page in the record (direct-mapped eviction).
        let evicted = encode(3 + 256, &header(6).to_string(), &parts(), 4096).unwrap();
        assert_eq!(
            judge(&header(5), "/doc/a", 0x77, &[slot(6)], (2, 2), &evicted),
            PageVerdict::Unusable(PageMiss::Absent)
        );
        // A prefix asks for the rest.
        assert_eq!(
            judge(&header(5), "/doc/a", 0x77, &[slot(6)], (2, 2), &payload[..20]),
            PageVerdict::ReadMore(payload.len())
        );
    }

    #[test]
    fn layouts_outside_the_region_or_malformed_are_none() {
        let layout = PagesLayout::from_words(128, 4, 64, 128 + 4 * 72).unwrap();
        assert_eq!((layout.record_of(10), layout.record_of(3), layout.record_offset(1)), (2, 3, 200));
        assert_eq!(PagesLayout::from_words(128, 4, 64, 128 + 4 * 72 - 1), None);
        assert_eq!(PagesLayout::from_words(128, 0, 64, 1 << 20), None);
        assert_eq!(PagesLayout::from_words(128, 4, 60, 1 << 20), None);
        assert_eq!(PagesLayout::from_words(129, 4, 64, 1 << 20), None);
        assert_eq!(PagesLayout::from_words(u64::MAX - 8, 4, 64, u64::MAX), None);
    }

    proptest::proptest! {
        /// Decoding and judging arbitrary bytes never panics.
        #[test]
        fn arbitrary_records_never_panic(payload in proptest::collection::vec(proptest::num::u8::ANY, 0..256), seq in 0u64..6) {
            let _ = decode(&payload);
            let _ = declared_len(&payload);
            let _ = judge(&header(5), "/doc/a", 0x77, &[slot(6)], (seq, seq), &payload);
        }
    }
}
