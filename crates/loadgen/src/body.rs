//! Self-checking bodies (docs/coherence-protocol.md, "Self-checking
//! bodies"): pure, no I/O.
//!
//! ```text
//! doc=<name> version=<v> fnv1a64=<16 lowercase hex digits>\n<content>
//! ```
//!
//! The hash is 64-bit FNV-1a of `<content>` (every byte after the first
//! `\n`). A body is scanned as it streams in ([`BodyScan`]): only the first
//! line is buffered (at most [`BODY_HEAD_BYTES_MAX`] bytes), the rest is
//! hashed on the fly, so checking costs no copy of the body.
//! [`verify`] then checks the body against the request and the response's
//! `X-Tierstack-Deps` header. Bodies assembled from two versions fail the
//! hash or name a version other than the header's.

use crate::deps::ParsedDeps;

/// FNV-1a 64-bit offset basis.
pub const FNV1A64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
pub const FNV1A64_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Longest first line accepted (`doc=`, a 128-byte name, a 20-digit
/// version and the hash fit well inside).
pub const BODY_HEAD_BYTES_MAX: usize = 512;
/// Dependency key of document `<name>`: `doc/<name>`.
pub const DOC_KEY_PREFIX: &str = "doc/";

/// Continues an FNV-1a 64-bit hash over `bytes`.
pub fn fnv1a64_update(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(FNV1A64_PRIME);
    }
    hash
}

/// FNV-1a 64-bit of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_update(FNV1A64_OFFSET, bytes)
}

/// Why a body does not check out (all counted as `body_mismatch`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the body has no complete first line within {BODY_HEAD_BYTES_MAX} bytes")]
    NoFirstLine,
    #[error("the first line is not `doc=<name> version=<v> fnv1a64=<16 hex>`")]
    BadFirstLine,
    #[error("the body names document {body:?}, the request asked for {requested:?}")]
    WrongDocument { body: String, requested: String },
    #[error("the body is at version {body}, the header says {header}")]
    WrongVersion { body: u64, header: u64 },
    #[error("content hash {actual:016x} differs from the declared {declared:016x}")]
    HashMismatch { declared: u64, actual: u64 },
}

/// Why a response fails the body check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyCheckError {
    /// The header does not name the requested document's key (`deps_wrong_key`).
    #[error("X-Tierstack-Deps does not name the requested document's key {0:?}")]
    WrongKey(String),
    /// The body breaks the contract or disagrees with the header (`body_mismatch`).
    #[error(transparent)]
    Body(#[from] BodyError),
}

/// A body's first line, and the hash of what followed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedBody {
    pub name: String,
    pub version: u64,
    pub declared_fnv1a64: u64,
    pub content_fnv1a64: u64,
}

/// A body being received.
#[derive(Debug)]
pub struct BodyScan {
    head: Vec<u8>,
    /// The first `\n` was seen; `hash` covers every byte after it.
    head_done: bool,
    /// The first line outgrew [`BODY_HEAD_BYTES_MAX`].
    overflow: bool,
    hash: u64,
}

impl Default for BodyScan {
    fn default() -> Self {
        Self::new()
    }
}

impl BodyScan {
    pub fn new() -> Self {
        Self { head: Vec::new(), head_done: false, overflow: false, hash: FNV1A64_OFFSET }
    }

    /// Feeds the next chunk of the body.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if !self.head_done {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(at) => {
                    self.push_head(&bytes[..at]);
                    self.head_done = true;
                    bytes = &bytes[at + 1..];
                }
                None => {
                    self.push_head(bytes);
                    return;
                }
            }
        }
        self.hash = fnv1a64_update(self.hash, bytes);
    }

    fn push_head(&mut self, bytes: &[u8]) {
        if self.head.len() + bytes.len() > BODY_HEAD_BYTES_MAX {
            self.overflow = true;
        } else {
            self.head.extend_from_slice(bytes);
        }
    }

    /// The first line, parsed, and the content's hash.
    pub fn finish(self) -> Result<ScannedBody, BodyError> {
        if !self.head_done || self.overflow {
            return Err(BodyError::NoFirstLine);
        }
        let line = std::str::from_utf8(&self.head).map_err(|_| BodyError::BadFirstLine)?;
        let mut fields = line.split(' ');
        let mut field =
            |prefix: &str| fields.next().and_then(|f| f.strip_prefix(prefix)).ok_or(BodyError::BadFirstLine);
        let name = field("doc=")?;
        let version = field("version=")?;
        let hash = field("fnv1a64=")?;
        if fields.next().is_some()
            || name.is_empty()
            || version.is_empty()
            || version.len() > 20
            || !version.bytes().all(|b| b.is_ascii_digit())
            || hash.len() != 16
            || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(BodyError::BadFirstLine);
        }
        Ok(ScannedBody {
            name: name.to_string(),
            version: version.parse().map_err(|_| BodyError::BadFirstLine)?,
            declared_fnv1a64: u64::from_str_radix(hash, 16).map_err(|_| BodyError::BadFirstLine)?,
            content_fnv1a64: self.hash,
        })
    }
}

/// Checks a received body of `GET /doc/<requested>` against the request and
/// the response's parsed header: the header names `doc/<requested>`, the
/// body names `<requested>` at the header's version of that key, and its
/// content hashes to what the first line declares.
pub fn verify(
    scanned: Result<ScannedBody, BodyError>,
    requested: &str,
    deps: &ParsedDeps<'_>,
) -> Result<(), BodyCheckError> {
    let key = format!("{DOC_KEY_PREFIX}{requested}");
    let entry = deps.entries.iter().find(|e| e.key == key).ok_or(BodyCheckError::WrongKey(key))?;
    let body = scanned?;
    if body.name != requested {
        return Err(BodyError::WrongDocument { body: body.name, requested: requested.to_string() }.into());
    }
    if body.version != entry.version {
        return Err(BodyError::WrongVersion { body: body.version, header: entry.version }.into());
    }
    if body.declared_fnv1a64 != body.content_fnv1a64 {
        return Err(BodyError::HashMismatch { declared: body.declared_fnv1a64, actual: body.content_fnv1a64 }.into());
    }
    Ok(())
}

/// A body per the contract: `doc=<name> version=<v> fnv1a64=<hash>\n` and
/// then `<name>@<v>\n` repeated up to `size` bytes in all (no content if the
/// first line alone is longer). The reference for tests of the checker; the
/// application server has its own.
pub fn contract_body(name: &str, version: u64, size: usize) -> Vec<u8> {
    let unit = format!("{name}@{version}\n");
    let head_len = format!("doc={name} version={version} fnv1a64=0000000000000000\n").len();
    let content: Vec<u8> = unit.bytes().cycle().take(size.saturating_sub(head_len)).collect();
    let mut body = format!("doc={name} version={version} fnv1a64={:016x}\n", fnv1a64(&content)).into_bytes();
    body.extend_from_slice(&content);
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deps::parse;

    fn scan_in_chunks(body: &[u8], chunk: usize) -> Result<ScannedBody, BodyError> {
        let mut scan = BodyScan::new();
        body.chunks(chunk.max(1)).for_each(|c| scan.feed(c));
        scan.finish()
    }

    const HEADER: &str = "n=0;i=00000000000000aa;doc/a=5@0";

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_contract_body_checks_out_however_it_is_chunked() {
        let deps = parse(HEADER).unwrap();
        for size in [0, 10, 40, 41, 100, 4096] {
            let body = contract_body("a", 5, size);
            for chunk in [1, 3, 7, 64, 1 << 20] {
                assert_eq!(verify(scan_in_chunks(&body, chunk), "a", &deps), Ok(()), "size {size}, chunk {chunk}");
            }
        }
        assert_eq!(contract_body("a", 5, 4096).len(), 4096);
        assert!(contract_body("a", 5, 10).ends_with(b"\n"), "a short body is its whole first line");
    }

    #[test]
    fn every_disagreement_is_caught() {
        let deps = parse(HEADER).unwrap();
        let good = contract_body("a", 5, 200);
        let check = |body: &[u8], requested: &str, header: &str| {
            verify(scan_in_chunks(body, 16), requested, &parse(header).unwrap())
        };
        // The header names another document's key.
        assert_eq!(
            check(&good, "a", "n=0;i=00000000000000aa;doc/b=5@0"),
            Err(BodyCheckError::WrongKey("doc/a".into()))
        );
        // The body of another document, or of another version.
        let b = contract_body("b", 5, 200);
        assert!(matches!(
            check(&b, "a", "n=0;i=00000000000000aa;doc/a=5@0,doc/b=5@1"),
            Err(BodyCheckError::Body(BodyError::WrongDocument { .. }))
        ));
        assert_eq!(
            verify(scan_in_chunks(&contract_body("a", 4, 200), 16), "a", &deps),
            Err(BodyCheckError::Body(BodyError::WrongVersion { body: 4, header: 5 }))
        );
        // A body spliced from two versions: version 5's first line, version 4's tail.
        let mut spliced = good[..100].to_vec();
        spliced.extend_from_slice(&contract_body("a", 4, 200)[100..]);
        assert!(matches!(check(&spliced, "a", HEADER), Err(BodyCheckError::Body(BodyError::HashMismatch { .. }))));
        // One flipped byte, a truncated body.
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(check(&flipped, "a", HEADER), Err(BodyCheckError::Body(BodyError::HashMismatch { .. }))));
        assert!(matches!(check(&good[..150], "a", HEADER), Err(BodyCheckError::Body(BodyError::HashMismatch { .. }))));
        // Malformed first lines.
        let head_err = |body: &[u8]| check(body, "a", HEADER);
        assert_eq!(head_err(b""), Err(BodyError::NoFirstLine.into()));
        assert_eq!(head_err(b"doc=a version=5 fnv1a64=cbf29ce484222325"), Err(BodyError::NoFirstLine.into()));
        assert_eq!(head_err(&[b'x'; 600]), Err(BodyError::NoFirstLine.into()));
        for bad in [
            &b"xxxxxxxxxxxxxxxxxxxx\n"[..],
            b"doc=a version=5\n",
            b"doc=a version=5 fnv1a64=CBF29CE484222325\n",
            b"doc=a version=5 fnv1a64=cbf29ce48422232\n",
            b"doc=a version=x fnv1a64=cbf29ce484222325\n",
            b"doc=a version=99999999999999999999 fnv1a64=cbf29ce484222325\n",
            b"doc= version=5 fnv1a64=cbf29ce484222325\n",
            b"doc=a version=5 fnv1a64=cbf29ce484222325 extra\n",
            b"doc=a  version=5 fnv1a64=cbf29ce484222325\n",
            b"doc=\xff version=5 fnv1a64=cbf29ce484222325\n",
        ] {
            assert_eq!(head_err(bad), Err(BodyError::BadFirstLine.into()), "{:?}", String::from_utf8_lossy(bad));
        }
        // The empty-content body at the right version passes.
        assert_eq!(head_err(b"doc=a version=5 fnv1a64=cbf29ce484222325\n"), Ok(()));
    }

    #[test]
    fn a_first_line_fits_up_to_the_bound_and_not_a_byte_beyond() {
        // A valid first line of exactly BODY_HEAD_BYTES_MAX bytes (without
        // its newline), then one a byte longer; each fed whole and bytewise.
        let line_of = |len: usize| {
            let fixed = "doc= version=1 fnv1a64=cbf29ce484222325".len();
            format!("doc={} version=1 fnv1a64=cbf29ce484222325\n", "n".repeat(len - fixed))
        };
        let at_bound = line_of(BODY_HEAD_BYTES_MAX);
        assert_eq!(at_bound.len(), BODY_HEAD_BYTES_MAX + 1);
        for chunk in [1, at_bound.len()] {
            let scanned = scan_in_chunks(at_bound.as_bytes(), chunk).unwrap();
            assert_eq!(scanned.version, 1);
            assert_eq!(scanned.declared_fnv1a64, scanned.content_fnv1a64, "empty content hashes to the basis");
            let beyond = line_of(BODY_HEAD_BYTES_MAX + 1);
            assert_eq!(scan_in_chunks(beyond.as_bytes(), chunk), Err(BodyError::NoFirstLine), "chunk {chunk}");
        }
    }

    #[test]
    fn first_lines_with_extra_or_empty_fields_signs_or_padding_are_malformed() {
        let extra = b"doc=a version=1 fnv1a64=cbf29ce484222325 more\n";
        assert_eq!(scan_in_chunks(extra, 64), Err(BodyError::BadFirstLine));
        let no_name = b"doc= version=1 fnv1a64=cbf29ce484222325\n";
        assert_eq!(scan_in_chunks(no_name, 64), Err(BodyError::BadFirstLine));
        let no_version = b"doc=a version= fnv1a64=cbf29ce484222325\n";
        assert_eq!(scan_in_chunks(no_version, 64), Err(BodyError::BadFirstLine));
        // u64's parser alone would take these: a sign, and leading zeros
        // past a u64's 20 digits.
        let signed = b"doc=a version=+1 fnv1a64=cbf29ce484222325\n";
        assert_eq!(scan_in_chunks(signed, 64), Err(BodyError::BadFirstLine));
        let padded = b"doc=a version=000000000000000000001 fnv1a64=cbf29ce484222325\n";
        assert_eq!(scan_in_chunks(padded, 64), Err(BodyError::BadFirstLine));
        let good = b"doc=a version=1 fnv1a64=cbf29ce484222325\n";
        assert!(scan_in_chunks(good, 64).is_ok());
        let largest = b"doc=a version=18446744073709551615 fnv1a64=cbf29ce484222325\n";
        assert_eq!(scan_in_chunks(largest, 64).map(|b| b.version), Ok(u64::MAX), "20 digits fit");
    }
}
