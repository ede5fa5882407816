//! Parsing the `X-Tierstack-Deps` header (docs/coherence-protocol.md §1).
//!
//! ```text
//! X-Tierstack-Deps: n=<node>;i=<16 hex digits>;<key>=<version>@<slot>[,<key>=<version>@<slot>…]
//! ```
//!
//! Pure and allocation-light: the parsed form borrows the header text. Every
//! deviation from the contract is a typed [`DepsError`]; nothing panics.

/// Header name of the dependency versions.
pub const DEPS_HEADER: &str = "x-tierstack-deps";
/// Header name of the proxy's cache verdict (`HIT` or `MISS`).
pub const CACHE_HEADER: &str = "x-cache";
/// At most this many keys per response (the contract's limit).
pub const DEPS_KEYS_MAX: usize = 64;
/// Longest key.
pub const DEP_KEY_BYTES_MAX: usize = 128;
/// Longest header accepted: 64 keys of 128 bytes with 20-digit versions and
/// 10-digit slots fit well inside.
pub const DEPS_HEADER_BYTES_MAX: usize = 16 << 10;

/// One `key=version@slot` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DepEntry<'a> {
    pub key: &'a str,
    pub version: u64,
    pub slot: u32,
}

/// A parsed header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedDeps<'a> {
    /// Fabric node id of the module owning the version table.
    pub node: u32,
    /// The module's incarnation.
    pub incarnation: u64,
    pub entries: Vec<DepEntry<'a>>,
}

/// Why a header is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DepsError {
    #[error("header longer than {DEPS_HEADER_BYTES_MAX} bytes")]
    TooLong,
    #[error("header is not visible ASCII")]
    NotAscii,
    #[error("missing or malformed n=<node>")]
    BadNode,
    #[error("missing or malformed i=<16 hex digits>")]
    BadIncarnation,
    #[error("no key=version@slot entry")]
    NoKeys,
    #[error("more than {DEPS_KEYS_MAX} keys")]
    TooManyKeys,
    #[error("entry is not key=version@slot")]
    BadEntry,
    #[error("key is empty, too long, or has a character outside [A-Za-z0-9/_.:-]")]
    BadKey,
    #[error("version is not a decimal u64 >= 1")]
    BadVersion,
    #[error("slot is not a decimal u32")]
    BadSlot,
    #[error("a key appears twice")]
    DuplicateKey,
}

/// Parses a header value.
pub fn parse(value: &str) -> Result<ParsedDeps<'_>, DepsError> {
    if value.len() > DEPS_HEADER_BYTES_MAX {
        return Err(DepsError::TooLong);
    }
    if !value.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(DepsError::NotAscii);
    }
    let value = value.trim();
    let mut sections = value.splitn(3, ';');
    let node =
        sections.next().and_then(|s| s.strip_prefix("n=")).and_then(parse_decimal_u32).ok_or(DepsError::BadNode)?;
    let incarnation = sections
        .next()
        .and_then(|s| s.strip_prefix("i="))
        .filter(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or(DepsError::BadIncarnation)?;
    let list = sections.next().ok_or(DepsError::NoKeys)?;
    if list.is_empty() {
        return Err(DepsError::NoKeys);
    }
    let mut entries: Vec<DepEntry<'_>> = Vec::new();
    for item in list.split(',') {
        if entries.len() == DEPS_KEYS_MAX {
            return Err(DepsError::TooManyKeys);
        }
        let (key, rest) = item.split_once('=').ok_or(DepsError::BadEntry)?;
        let (version, slot) = rest.split_once('@').ok_or(DepsError::BadEntry)?;
        if !valid_key(key) {
            return Err(DepsError::BadKey);
        }
        let version = parse_decimal_u64(version).filter(|&v| v >= 1).ok_or(DepsError::BadVersion)?;
        let slot = parse_decimal_u32(slot).ok_or(DepsError::BadSlot)?;
        if entries.iter().any(|e| e.key == key) {
            return Err(DepsError::DuplicateKey);
        }
        entries.push(DepEntry { key, version, slot });
    }
    Ok(ParsedDeps { node, incarnation, entries })
}

/// A key is 1–128 characters of `[A-Za-z0-9/_.:-]`.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= DEP_KEY_BYTES_MAX
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'.' | b':' | b'-'))
}

fn parse_decimal_u64(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_decimal_u32(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let d = parse("n=0;i=00c0ffee12345678;doc/7=5@17,stock/IBM=3@2").unwrap();
        assert_eq!(d.node, 0);
        assert_eq!(d.incarnation, 0x00c0_ffee_1234_5678);
        assert_eq!(
            d.entries,
            vec![DepEntry { key: "doc/7", version: 5, slot: 17 }, DepEntry { key: "stock/IBM", version: 3, slot: 2 }]
        );
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let long_key = format!("n=0;i=0000000000000001;{}=1@0", "k".repeat(129));
        let many =
            format!("n=0;i=0000000000000001;{}", (0..65).map(|i| format!("k{i}=1@{i}")).collect::<Vec<_>>().join(","));
        let huge = format!("n=0;i=0000000000000001;{}", "a".repeat(DEPS_HEADER_BYTES_MAX));
        let cases: Vec<(&str, DepsError)> = vec![
            ("", DepsError::BadNode),
            ("doc/a=1@0", DepsError::BadNode),
            ("n=x;i=0000000000000001;doc/a=1@0", DepsError::BadNode),
            ("n=0;doc/a=1@0", DepsError::BadIncarnation),
            ("n=0;i=01;doc/a=1@0", DepsError::BadIncarnation),
            ("n=0;i=000000000000000g;doc/a=1@0", DepsError::BadIncarnation),
            ("n=0;i=0000000000000001", DepsError::NoKeys),
            ("n=0;i=0000000000000001;", DepsError::NoKeys),
            ("n=0;i=0000000000000001;doc/a", DepsError::BadEntry),
            ("n=0;i=0000000000000001;doc/a=1", DepsError::BadEntry),
            ("n=0;i=0000000000000001;doc/a=1@0,", DepsError::BadEntry),
            ("n=0;i=0000000000000001;=1@0", DepsError::BadKey),
            ("n=0;i=0000000000000001;doc a=1@0", DepsError::BadKey),
            ("n=0;i=0000000000000001;doc;a=1@0", DepsError::BadKey),
            (&long_key, DepsError::BadKey),
            ("n=0;i=0000000000000001;doc/a=0@0", DepsError::BadVersion),
            ("n=0;i=0000000000000001;doc/a=-1@0", DepsError::BadVersion),
            ("n=0;i=0000000000000001;doc/a=99999999999999999999@0", DepsError::BadVersion),
            ("n=0;i=0000000000000001;doc/a=1@x", DepsError::BadSlot),
            ("n=0;i=0000000000000001;doc/a=1@4294967296", DepsError::BadSlot),
            ("n=0;i=0000000000000001;doc/a=1@0,doc/a=2@0", DepsError::DuplicateKey),
            (&many, DepsError::TooManyKeys),
            (&huge, DepsError::TooLong),
            ("n=0;i=0000000000000001;doc/\u{e9}=1@0", DepsError::NotAscii),
        ];
        for (value, err) in cases {
            assert_eq!(parse(value), Err(err), "header {value:?}");
        }
    }

    #[test]
    fn sixty_four_keys_are_accepted() {
        let v = format!(
            "n=3;i=ffffffffffffffff;{}",
            (0..64).map(|i| format!("k{i}={}@{i}", i + 1)).collect::<Vec<_>>().join(",")
        );
        let d = parse(&v).unwrap();
        assert_eq!((d.node, d.incarnation, d.entries.len()), (3, u64::MAX, 64));
        assert_eq!(d.entries[63], DepEntry { key: "k63", version: 64, slot: 63 });
    }
}
