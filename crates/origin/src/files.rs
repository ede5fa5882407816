//! What the origin serves: a directory of real files, or a synthetic set of
//! paths and sizes whose bodies are generated per request. Also the request
//! path rules (percent-decoding, traversal refusal) and content types.

use crate::OriginError;
use bytes::Bytes;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Largest object the origin serves: a body is built in memory per request
/// (generated or read whole), so this bounds one request's memory.
pub const OBJECT_BYTES_MAX: u64 = 256 << 20;

/// The origin's content.
#[derive(Clone, Debug)]
pub enum FileSet {
    /// Real files under this directory (no listings, nothing outside it).
    Root(PathBuf),
    /// Generated bodies of given sizes.
    Synthetic(SyntheticSet),
}

/// Paths and sizes; the bodies are [`synthetic_body`]s, generated per request.
#[derive(Clone, Debug, Default)]
pub struct SyntheticSet {
    sizes: HashMap<String, u64>,
}

impl SyntheticSet {
    /// A set of `(path, size)` objects. Paths are normalized to start with
    /// `/`; a path twice, a `..` segment or an object above
    /// [`OBJECT_BYTES_MAX`] is an error.
    pub fn new(objects: impl IntoIterator<Item = (String, u64)>) -> Result<Self, OriginError> {
        let mut sizes = HashMap::new();
        for (index, (path, size)) in objects.into_iter().enumerate() {
            let path = normalize_listed(&path).map_err(|reason| OriginError::BadObject {
                index,
                path: path.clone(),
                reason: reason.to_string(),
            })?;
            check_size(&path, size)?;
            if sizes.insert(path.clone(), size).is_some() {
                return Err(OriginError::BadObject { index, path, reason: "listed twice".into() });
            }
        }
        Ok(Self { sizes })
    }

    /// Parses a file list: one `path size` per line (size in bytes); blank
    /// lines and lines starting with `#` are skipped. Errors name the line.
    pub fn parse_list(text: &str) -> Result<Self, OriginError> {
        let mut sizes = HashMap::new();
        let mut first_line: HashMap<String, usize> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line_no = index + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let bad = |reason: String| OriginError::FileList { line: line_no, text: line.to_string(), reason };
            let mut words = trimmed.split_whitespace();
            let (Some(path), Some(size), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad("expected `path size`".into()));
            };
            let size: u64 = size.parse().map_err(|_| bad(format!("{size:?} is not a size in bytes")))?;
            let path = normalize_listed(path).map_err(|reason| bad(reason.to_string()))?;
            check_size(&path, size).map_err(|e| bad(e.to_string()))?;
            if let Some(first) = first_line.get(&path) {
                return Err(bad(format!("{path} is already listed on line {first}")));
            }
            first_line.insert(path.clone(), line_no);
            sizes.insert(path, size);
        }
        Ok(Self { sizes })
    }

    /// Reads and parses a file list ([`SyntheticSet::parse_list`]).
    pub fn from_list_file(path: &Path) -> Result<Self, OriginError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| OriginError::Read { path: path.to_path_buf(), source })?;
        Self::parse_list(&text).map_err(|e| OriginError::InFile { path: path.to_path_buf(), source: Box::new(e) })
    }

    /// The size of `path`, if listed.
    pub fn size_of(&self, path: &str) -> Option<u64> {
        self.sizes.get(path).copied()
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Total bytes of the set.
    pub fn total_bytes(&self) -> u64 {
        self.sizes.values().fold(0u64, |sum, size| sum.saturating_add(*size))
    }
}

fn check_size(path: &str, size: u64) -> Result<(), OriginError> {
    if size > OBJECT_BYTES_MAX {
        return Err(OriginError::ObjectTooLarge { path: path.to_string(), size, max: OBJECT_BYTES_MAX });
    }
    Ok(())
}

/// A listed path as requests name it: with a leading `/`, and reachable
/// (no `..` segment, which requests are refused for).
fn normalize_listed(path: &str) -> Result<String, &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.split('/').any(|segment| segment == "..") {
        return Err("a `..` segment is never served");
    }
    if path.contains('?') || path.contains('#') || path.contains('%') {
        return Err("a listed path is the decoded path: no `?`, `#` or `%`");
    }
    Ok(if path.starts_with('/') { path.to_string() } else { format!("/{path}") })
}

/// Why a request path was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathRefusal {
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// Does not start with `/`, or holds a NUL.
    Malformed,
    /// A `..` segment (after decoding).
    Traversal,
}

/// Percent-decodes a request path (RFC 3986 §2.1).
pub fn percent_decode(path: &str) -> Result<Vec<u8>, PathRefusal> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            let high = bytes.get(i + 1).copied().and_then(hex);
            let low = bytes.get(i + 2).copied().and_then(hex);
            let (Some(high), Some(low)) = (high, low) else { return Err(PathRefusal::BadEscape) };
            out.push((high * 16 + low) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// The decoded request path, checked: starts with `/`, no NUL, no `..`
/// segment (an encoded `%2e%2e` or `%2f` is decoded first, so it counts).
pub fn decode_request_path(path: &str) -> Result<Vec<u8>, PathRefusal> {
    if !path.starts_with('/') {
        return Err(PathRefusal::Malformed);
    }
    let decoded = percent_decode(path)?;
    if decoded.contains(&0) {
        return Err(PathRefusal::Malformed);
    }
    if decoded.split(|b| *b == b'/').any(|segment| segment == b"..") {
        return Err(PathRefusal::Traversal);
    }
    Ok(decoded)
}

/// The file a checked request path names under a root: its segments, with
/// empty and `.` segments dropped.
pub(crate) fn relative_file_path(decoded: &[u8]) -> PathBuf {
    decoded
        .split(|b| *b == b'/')
        .filter(|segment| !segment.is_empty() && *segment != b".")
        .map(OsStr::from_bytes)
        .collect()
}

/// The media type for a path, by extension (a small built-in table).
pub fn content_type(path: &[u8]) -> &'static str {
    let name = path.rsplit(|b| *b == b'/').next().unwrap_or_default();
    let extension = match name.iter().rposition(|b| *b == b'.') {
        Some(dot) if dot > 0 => &name[dot + 1..],
        _ => return "application/octet-stream",
    };
    let extension = String::from_utf8_lossy(extension).to_ascii_lowercase();
    match extension.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "txt" => "text/plain; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "xml" => "application/xml",
        "csv" => "text/csv; charset=utf-8",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "wasm" => "application/wasm",
        "mp4" => "video/mp4",
        "gz" => "application/gzip",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

/// The characters of a synthetic body after its first line: printable, so
/// a human can look at one.
const FILLER: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The first line of every synthetic body (cut short if the body is).
pub fn synthetic_prefix(path: &str, size: u64) -> String {
    format!("tierstack-origin {path} {size} bytes\n")
}

/// Bytes of filler generated per body; the rest repeats them (a copy, so
/// large bodies cost little to build).
const FILLER_BLOCK_BYTES: usize = 4096;

/// The synthetic body of `path`: exactly `size` bytes, starting with
/// [`synthetic_prefix`], then a block of printable bytes drawn from a
/// generator seeded by the path (lines of 64 bytes), repeated. The same path
/// and size always give the same body.
pub fn synthetic_body(path: &str, size: u64) -> Bytes {
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let mut body = Vec::with_capacity(size);
    let prefix = synthetic_prefix(path, size as u64);
    body.extend_from_slice(&prefix.as_bytes()[..prefix.len().min(size)]);
    if body.len() == size {
        return Bytes::from(body);
    }
    let mut block = Vec::with_capacity(FILLER_BLOCK_BYTES);
    let mut state = fnv1a64(path.as_bytes());
    while block.len() < FILLER_BLOCK_BYTES {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        for byte in splitmix64(state).to_le_bytes() {
            block.push(if block.len() % 64 == 63 { b'\n' } else { FILLER[usize::from(byte & 63)] });
        }
    }
    while body.len() < size {
        let take = (size - body.len()).min(FILLER_BLOCK_BYTES);
        body.extend_from_slice(&block[..take]);
    }
    Bytes::from(body)
}

pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_paths_are_decoded_and_traversal_is_refused_in_every_spelling() {
        assert_eq!(decode_request_path("/a%20b.txt").unwrap(), b"/a b.txt");
        assert_eq!(decode_request_path("/%E2%82%AC").unwrap(), "/€".as_bytes());
        for path in ["/../x", "/a/../../x", "/%2e%2e/x", "/%2E%2E/x", "/a/..%2f..%2fx", "/.%2e/x", "/a/.."] {
            assert_eq!(decode_request_path(path), Err(PathRefusal::Traversal), "{path}");
        }
        assert_eq!(decode_request_path("/a%2"), Err(PathRefusal::BadEscape));
        assert_eq!(decode_request_path("/a%zz"), Err(PathRefusal::BadEscape));
        assert_eq!(decode_request_path("/a%00b"), Err(PathRefusal::Malformed));
        assert_eq!(decode_request_path("%2fa"), Err(PathRefusal::Malformed), "a decoded slash does not make a path");
        assert_eq!(decode_request_path("/...x/..a").map(|p| p.len()), Ok(9), "only exactly `..` is a parent");
        assert_eq!(relative_file_path(b"//a/./b/"), PathBuf::from("a/b"));
    }

    #[test]
    fn content_types_come_from_the_extension() {
        assert_eq!(content_type(b"/index.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type(b"/a/b.png"), "image/png");
        assert_eq!(content_type(b"/a.d/b"), "application/octet-stream", "a dot in a directory is no extension");
        assert_eq!(content_type(b"/.bashrc"), "application/octet-stream", "a leading dot is no extension");
        assert_eq!(content_type(b"/doc/z3"), "application/octet-stream");
    }

    #[test]
    fn synthetic_bodies_have_the_exact_size_the_named_prefix_and_depend_on_the_path() {
        for size in [0u64, 1, 10, 40, 63, 64, 65, 1000, 4096 + 40, 100_003] {
            let body = synthetic_body("/doc/z1", size);
            assert_eq!(body.len() as u64, size);
            let prefix = synthetic_prefix("/doc/z1", size);
            let shown = prefix.len().min(body.len());
            assert_eq!(&body[..shown], &prefix.as_bytes()[..shown]);
            assert_eq!(body, synthetic_body("/doc/z1", size), "deterministic");
        }
        let (a, b) = (synthetic_body("/doc/a", 4096), synthetic_body("/doc/b", 4096));
        let prefix_len = synthetic_prefix("/doc/a", 4096).len();
        assert_ne!(a[prefix_len..], b[prefix_len..], "the filler depends on the path");
        assert!(a.iter().all(|b| b.is_ascii_graphic() || *b == b' ' || *b == b'\n'));
    }

    #[test]
    fn file_lists_parse_and_every_bad_line_is_named() {
        let set = SyntheticSet::parse_list("# objects\n/a 10\n\nb/c.html 0\n").unwrap();
        assert_eq!(
            (set.size_of("/a"), set.size_of("/b/c.html"), set.len(), set.total_bytes()),
            (Some(10), Some(0), 2, 10)
        );
        for (text, line, needle) in [
            ("/a 10\n/b\n", 2, "expected `path size`"),
            ("/a ten\n", 1, "not a size"),
            ("/a -1\n", 1, "not a size"),
            ("/a 1 2\n", 1, "expected `path size`"),
            ("/a 1\n/x/../a 1\n", 2, "`..`"),
            ("/a 1\n#\n/a 2\n", 3, "already listed on line 1"),
            ("a 1\n/a 2\n", 2, "already listed on line 1"),
            ("/a 300000000\n", 1, "larger than"),
            ("/a%20b 3\n", 1, "decoded path"),
        ] {
            let error = SyntheticSet::parse_list(text).unwrap_err();
            match &error {
                OriginError::FileList { line: got, reason, .. } => {
                    assert_eq!(*got, line, "{text:?}: {error}");
                    assert!(reason.contains(needle), "{text:?}: {error}");
                }
                other => panic!("{text:?}: unexpected {other}"),
            }
        }
        assert!(matches!(
            SyntheticSet::new([("/a".to_string(), 1), ("a".to_string(), 2)]),
            Err(OriginError::BadObject { index: 1, .. })
        ));
    }
}
