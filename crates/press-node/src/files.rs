//! The node's document root: request paths resolved to regular files under
//! it, their validators, reads off the runtime's threads, and the trace
//! mode's synthetic set written to a directory once.
//!
//! A request path is percent-decoded and refused with `..` in any spelling
//! (`tierstack_origin::decode_request_path`), then resolved with symbolic
//! links followed and checked to lie under the canonical root: a path that
//! escapes it, or names a directory or a device, is [`Refusal::Forbidden`].
//! Every look-up is one `canonicalize` and one `stat` on the blocking pool:
//! that is also how a cached file is revalidated (a changed size or mtime
//! makes the cached bytes stale), so a changed file costs no more to notice
//! than an unchanged one.
//!
//! The entity tag is **strong, from size and mtime** (nanoseconds), not
//! from the inode: nodes serving replicas of one root (copied with their
//! mtimes, as `rsync -t` or the trace mode do) agree on it, so a validator
//! a client got from one node is good at every other.

use bytes::Bytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A file's validators as a stat gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMeta {
    pub size: u64,
    /// Modification time, nanoseconds since the epoch (0 if before it).
    pub mtime_ns: u64,
}

/// Bytes of [`FileMeta`] on the wire and in the slab: size, then mtime,
/// little-endian.
pub const META_BYTES: usize = 16;

impl FileMeta {
    /// The strong entity tag (size and mtime, see the module's essay).
    pub fn etag(&self) -> String {
        format!("\"{:x}-{:x}\"", self.size, self.mtime_ns)
    }

    /// Last-Modified: the mtime in whole seconds, never after `now` (an
    /// origin never claims a modification after its own Date).
    pub fn last_modified(&self, now: SystemTime) -> SystemTime {
        (UNIX_EPOCH + Duration::from_secs(self.mtime_ns / 1_000_000_000)).min(now)
    }

    pub fn encode(&self) -> [u8; META_BYTES] {
        let mut out = [0; META_BYTES];
        out[..8].copy_from_slice(&self.size.to_le_bytes());
        out[8..].copy_from_slice(&self.mtime_ns.to_le_bytes());
        out
    }

    /// The metadata at the front of `bytes`, if there is room for it.
    pub fn decode(bytes: &[u8]) -> Option<FileMeta> {
        let size = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let mtime_ns = u64::from_le_bytes(bytes.get(8..META_BYTES)?.try_into().ok()?);
        Some(FileMeta { size, mtime_ns })
    }

    fn of(metadata: &std::fs::Metadata) -> FileMeta {
        let mtime = metadata.modified().unwrap_or(UNIX_EPOCH);
        let mtime_ns = mtime.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        FileMeta { size: metadata.len(), mtime_ns }
    }
}

/// A forwarded file's reply payload: its metadata, then its bytes (what
/// the slab holds per file, so Zero sends it as it lies there).
pub fn reply_payload(meta: &FileMeta, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(META_BYTES + body.len());
    out.extend_from_slice(&meta.encode());
    out.extend_from_slice(body);
    out
}

/// Splits a reply payload; `None` if its length disagrees with its metadata.
pub fn split_reply(payload: Bytes) -> Option<(FileMeta, Bytes)> {
    let meta = FileMeta::decode(&payload)?;
    let body = payload.slice(META_BYTES..);
    (body.len() as u64 == meta.size).then_some((meta, body))
}

/// Why a request path is not served.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    NotFound,
    /// Outside the root, or not a regular file.
    Forbidden,
    Io(String),
}

/// A resolved request: the file and its validators at look-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub file: PathBuf,
    pub meta: FileMeta,
}

/// The served directory.
#[derive(Clone, Debug)]
pub struct Root {
    /// Canonical, so a resolved file can be checked to lie under it.
    dir: PathBuf,
    /// Request paths resolved before (shared by the clones), so that a
    /// request for one pays a stat on its task instead of a canonicalize
    /// on the blocking pool (see [`Root::resolve`]).
    resolved: Arc<Mutex<HashMap<Vec<u8>, Resolved>>>,
}

/// A resolved request path and the identity (device, inode) of the file it
/// named then.
#[derive(Clone, Debug)]
struct Resolved {
    file: PathBuf,
    identity: (u64, u64),
}

/// Resolved paths kept; when full the map starts over (bounded memory
/// against clients asking for ever new paths).
const RESOLVED_MAX: usize = 16_384;

impl Root {
    /// Opens `dir`: it must exist, be a directory and be readable.
    pub fn open(dir: &Path) -> std::io::Result<Root> {
        let dir = std::fs::canonicalize(dir)?;
        if !dir.is_dir() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a directory"));
        }
        std::fs::read_dir(&dir)?;
        Ok(Root { dir, resolved: Arc::default() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Resolves a decoded, checked request path (blocking: call it on the
    /// blocking pool).
    pub fn resolve_blocking(&self, decoded: &[u8]) -> Result<Target, Refusal> {
        self.resolve_identified(decoded).map(|(target, _)| target)
    }

    /// The request path `decoded` under the root, as asked (not resolved).
    fn joined(&self, decoded: &[u8]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let relative: PathBuf = decoded
            .split(|b| *b == b'/')
            .filter(|segment| !segment.is_empty() && *segment != b".")
            .map(std::ffi::OsStr::from_bytes)
            .collect();
        self.dir.join(relative)
    }

    /// [`Root::resolve_blocking`], with the file's identity.
    fn resolve_identified(&self, decoded: &[u8]) -> Result<(Target, (u64, u64)), Refusal> {
        use std::os::unix::fs::MetadataExt;
        let file = match std::fs::canonicalize(self.joined(decoded)) {
            Ok(file) => file,
            // A name longer than the file system allows names no file.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound
                        | std::io::ErrorKind::NotADirectory
                        | std::io::ErrorKind::InvalidFilename
                ) =>
            {
                return Err(Refusal::NotFound)
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(Refusal::Forbidden),
            Err(e) => return Err(Refusal::Io(e.to_string())),
        };
        if !file.starts_with(&self.dir) {
            return Err(Refusal::Forbidden);
        }
        let metadata = std::fs::metadata(&file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Refusal::NotFound,
            _ => Refusal::Io(e.to_string()),
        })?;
        if !metadata.is_file() {
            return Err(Refusal::Forbidden);
        }
        let identity = (metadata.dev(), metadata.ino());
        Ok((Target { file, meta: FileMeta::of(&metadata) }, identity))
    }

    /// Resolves `decoded` as [`Root::resolve_blocking`] does. A path
    /// resolved before costs one stat of the path as asked, on the calling
    /// task (a stat of cached directory entries is cheaper than the hop to
    /// the blocking pool that a canonicalize needs): if it still reaches
    /// the same file (device and inode), that file is the one it resolved
    /// to under the root, and the stat gives its current size and mtime
    /// (so a changed file still gets a new ETag). Anything else (another
    /// file, a link retargeted, gone, an error) resolves afresh on the
    /// blocking pool.
    pub async fn resolve(&self, decoded: Vec<u8>) -> Result<Target, Refusal> {
        if let Some(target) = self.resolved_again(&decoded) {
            return Ok(target);
        }
        let root = self.clone();
        tokio::task::spawn_blocking(move || {
            let (target, identity) = root.resolve_identified(&decoded)?;
            let mut resolved = root.resolved.lock().unwrap_or_else(PoisonError::into_inner);
            if resolved.len() >= RESOLVED_MAX {
                resolved.clear();
            }
            resolved.insert(decoded, Resolved { file: target.file.clone(), identity });
            Ok(target)
        })
        .await
        .unwrap_or_else(|e| Err(Refusal::Io(e.to_string())))
    }

    fn resolved_again(&self, decoded: &[u8]) -> Option<Target> {
        use std::os::unix::fs::MetadataExt;
        let known = self.resolved.lock().unwrap_or_else(PoisonError::into_inner).get(decoded).cloned()?;
        match std::fs::metadata(self.joined(decoded)) {
            Ok(metadata) if metadata.is_file() && (metadata.dev(), metadata.ino()) == known.identity => {
                Some(Target { file: known.file, meta: FileMeta::of(&metadata) })
            }
            _ => {
                self.resolved.lock().unwrap_or_else(PoisonError::into_inner).remove(decoded);
                None
            }
        }
    }
}

/// Times a read is tried again when the file changed while it was read.
const READ_ATTEMPTS: usize = 3;

/// Reads `file` whole (on the blocking pool) with the validators of the
/// bytes read: those of the open file, the same before and after the read
/// (else it is read again, up to [`READ_ATTEMPTS`] times), so the answer's
/// ETag always describes its body even while the file is being replaced.
pub async fn read_whole(file: &Path) -> std::io::Result<(FileMeta, Bytes)> {
    use std::io::Read;
    let file = file.to_path_buf();
    tokio::task::spawn_blocking(move || {
        for _ in 0..READ_ATTEMPTS {
            let mut open = std::fs::File::open(&file)?;
            let before = FileMeta::of(&open.metadata()?);
            let mut bytes = Vec::with_capacity(usize::try_from(before.size).unwrap_or(0));
            open.read_to_end(&mut bytes)?;
            if FileMeta::of(&open.metadata()?) == before && bytes.len() as u64 == before.size {
                return Ok((before, Bytes::from(bytes)));
            }
        }
        Err(std::io::Error::other("the file kept changing while it was read"))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Opens `file` for streaming, with the validators of the open file.
pub async fn open_stream(file: &Path) -> std::io::Result<(FileMeta, tokio::fs::File)> {
    let file = tokio::fs::File::open(file).await?;
    let meta = FileMeta::of(&file.metadata().await?);
    Ok((meta, file))
}

/// The trace mode's files: written under `dir` once (each as a temporary
/// file renamed into place, so nodes sharing `dir` may start together),
/// with the fixed `mtime` so every node's copy has the same validators; a
/// file already there with that size and mtime is kept. `body` gives each
/// path's bytes. Returns how many files were written.
pub fn write_set(
    dir: &Path,
    objects: impl IntoIterator<Item = (String, u64)>,
    mtime: SystemTime,
    body: impl Fn(&str, u64) -> Bytes,
) -> std::io::Result<usize> {
    let mut written = 0;
    for (path, size) in objects {
        let relative = path.trim_start_matches('/');
        if relative.split('/').any(|segment| segment == ".." || segment.is_empty()) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("bad set path {path:?}")));
        }
        let file = dir.join(relative);
        if let Ok(metadata) = std::fs::metadata(&file) {
            if metadata.is_file() && metadata.len() == size && metadata.modified().ok() == Some(mtime) {
                continue;
            }
        }
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let temporary = file.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&temporary, body(&path, size))?;
        std::fs::File::options().write(true).open(&temporary)?.set_modified(mtime)?;
        std::fs::rename(&temporary, &file)?;
        written += 1;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_under_the_root_only_to_regular_files() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        let root = Root::open(dir.path()).unwrap();
        let target = root.resolve_blocking(b"/sub/./a.txt").unwrap();
        assert_eq!(target.meta.size, 5);
        assert_eq!(root.resolve_blocking(b"/sub"), Err(Refusal::Forbidden), "a directory");
        assert_eq!(root.resolve_blocking(b"/link"), Err(Refusal::Forbidden), "a link out of the root");
        assert_eq!(root.resolve_blocking(b"/none"), Err(Refusal::NotFound));
        assert_eq!(root.resolve_blocking(b"/sub/a.txt/x"), Err(Refusal::NotFound));
        let long = format!("/{}", "a".repeat(20_000));
        assert_eq!(
            root.resolve_blocking(long.as_bytes()),
            Err(Refusal::NotFound),
            "a name too long for the file system"
        );
    }

    /// A path resolved before is answered from the map with its file's
    /// current validators; a file replaced (another inode), a link
    /// retargeted out of the root or a file removed resolves afresh.
    #[tokio::test]
    async fn a_resolved_path_is_reused_only_while_it_names_the_same_file() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("v1")).unwrap();
        std::fs::write(dir.path().join("v1/f"), b"hello").unwrap();
        std::os::unix::fs::symlink("v1/f", dir.path().join("current")).unwrap();
        let root = Root::open(dir.path()).unwrap();
        let first = root.resolve(b"/current".to_vec()).await.unwrap();
        assert!(first.file.ends_with("v1/f"));
        assert!(root.resolved_again(b"/current").is_some(), "kept");
        // Rewritten in place (same inode): reused, with the new validators.
        std::fs::write(dir.path().join("v1/f"), b"hello, world").unwrap();
        assert_eq!(root.resolved_again(b"/current").unwrap().meta.size, 12);
        assert_eq!(root.resolve(b"/current".to_vec()).await.unwrap().meta.size, 12);
        // The link retargeted out of the root: not reused, refused.
        std::fs::remove_file(dir.path().join("current")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("current")).unwrap();
        assert!(root.resolved_again(b"/current").is_none());
        assert_eq!(root.resolve(b"/current".to_vec()).await, Err(Refusal::Forbidden));
        // Replaced by another file (rename: a new inode), then removed.
        std::fs::write(dir.path().join("v1/g"), b"new").unwrap();
        root.resolve(b"/v1/f".to_vec()).await.unwrap();
        std::fs::rename(dir.path().join("v1/g"), dir.path().join("v1/f")).unwrap();
        assert!(root.resolved_again(b"/v1/f").is_none(), "another inode");
        assert_eq!(root.resolve(b"/v1/f".to_vec()).await.unwrap().meta.size, 3);
        std::fs::remove_file(dir.path().join("v1/f")).unwrap();
        assert_eq!(root.resolve(b"/v1/f".to_vec()).await, Err(Refusal::NotFound));
    }

    #[test]
    fn metadata_round_trips_and_the_etag_follows_size_and_mtime() {
        let meta = FileMeta { size: 10, mtime_ns: 5 };
        let payload = reply_payload(&meta, &[7; 10]);
        assert_eq!(split_reply(Bytes::from(payload.clone())), Some((meta, Bytes::from(vec![7; 10]))));
        assert_eq!(split_reply(Bytes::from(payload[..20].to_vec())), None, "short body");
        assert_ne!(meta.etag(), FileMeta { size: 11, ..meta }.etag());
        assert_ne!(meta.etag(), FileMeta { mtime_ns: 6, ..meta }.etag());
    }

    #[tokio::test]
    async fn a_read_brings_the_validators_of_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
        let target = Root::open(dir.path()).unwrap().resolve_blocking(b"/f").unwrap();
        let (meta, bytes) = read_whole(&target.file).await.unwrap();
        assert_eq!((meta, &bytes[..]), (target.meta, &b"0123456789"[..]));
        let (meta, _) = open_stream(&target.file).await.unwrap();
        assert_eq!(meta, target.meta);
        assert!(read_whole(&dir.path().join("none")).await.is_err());
    }

    #[test]
    fn a_set_is_written_once_with_its_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let mtime = UNIX_EPOCH + Duration::from_secs(946_684_800);
        let objects = || [("/doc/a".to_string(), 3u64), ("/b".to_string(), 0)];
        let body = |_: &str, size: u64| Bytes::from(vec![b'x'; size as usize]);
        assert_eq!(write_set(dir.path(), objects(), mtime, body).unwrap(), 2);
        assert_eq!(write_set(dir.path(), objects(), mtime, body).unwrap(), 0, "already there");
        assert_eq!(std::fs::metadata(dir.path().join("doc/a")).unwrap().modified().unwrap(), mtime);
        let bad = write_set(dir.path(), [("/../x".to_string(), 1)], mtime, body);
        assert!(bad.is_err());
    }
}
