//! Private files and directories: the `shm` backend's local trust boundary.
//!
//! Everything a node trusts lives under one root that only this user can
//! enter. Every directory the backend creates is mode 0700 and every file
//! 0600, set explicitly (not left to the umask); files are created with
//! `O_EXCL | O_NOFOLLOW` and opened with `O_NOFOLLOW`, then checked on the
//! open descriptor (`fstat`): a regular file or directory, owned by this
//! user (the effective uid), with no group or other bits, one link. A
//! symbolic link, a foreign owner or an open mode is refused with
//! [`FabricError::UnsafePath`], which says how to fix it. The root's
//! ancestors must be owned by this user or root, and writable by others
//! only with the sticky bit (as `/dev/shm` and `/tmp` are), so no other user
//! can rename the root away and put another in its place.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tierstack_fabric::{FabricError, Result};

/// Mode of every directory the backend creates.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of every file the backend creates.
pub(crate) const FILE_MODE: u32 = 0o600;
/// Bytes of `owner.pid` read at most: a pid and a newline fit.
const PID_FILE_BYTES_MAX: u64 = 32;

/// The effective uid: the owner every trusted file must have.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The default root of cluster `cluster`: per user, so two users' clusters
/// of the same name never meet (`/dev/shm/tierstack-<uid>/<cluster>`, or
/// under the temporary directory where there is no `/dev/shm`).
pub fn default_root(cluster: &str) -> PathBuf {
    let dev_shm = Path::new("/dev/shm");
    let base = if dev_shm.is_dir() { dev_shm.to_path_buf() } else { std::env::temp_dir() };
    base.join(format!("tierstack-{}", euid())).join(cluster)
}

pub(crate) fn unsafe_path(path: &Path, reason: impl Into<String>) -> FabricError {
    FabricError::UnsafePath { path: path.display().to_string(), reason: reason.into() }
}

/// Why `meta` (of `path`, a file if `file`, else a directory) is not
/// private to this user, or `None`.
fn not_private(path: &Path, meta: &fs::Metadata, file: bool) -> Option<FabricError> {
    let shown = path.display();
    if meta.file_type().is_symlink() {
        return Some(unsafe_path(
            path,
            format!("it is a symbolic link, which tierstack never follows: remove it ({shown}) or name the real path"),
        ));
    }
    if file && !meta.is_file() {
        return Some(unsafe_path(path, "it is not a regular file: remove it"));
    }
    if !file && !meta.is_dir() {
        return Some(unsafe_path(path, "it is not a directory: remove it or choose another shm root"));
    }
    let me = euid();
    if meta.uid() != me {
        return Some(unsafe_path(
            path,
            format!(
                "it is owned by uid {}, not by this user (uid {me}): another user may have planted it; remove it \
                 or choose another shm root",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        let fix = if file { "chmod 600" } else { "chmod 700" };
        return Some(unsafe_path(
            path,
            format!("its mode {mode:04o} lets group or others in: {fix} {shown}, or remove it"),
        ));
    }
    if file && meta.nlink() != 1 {
        return Some(unsafe_path(
            path,
            format!("it has {} hard links, a file of ours has one: remove it", meta.nlink()),
        ));
    }
    None
}

/// An open error as the caller sees it: `ELOOP` from `O_NOFOLLOW` is a
/// planted symbolic link.
fn open_error(path: &Path, error: std::io::Error) -> FabricError {
    if error.raw_os_error() == Some(libc::ELOOP) {
        return unsafe_path(path, "it is a symbolic link, which tierstack never follows: remove it");
    }
    FabricError::Io(format!("{}: {error}", path.display()))
}

/// Checks that `path` is a private directory of this user, looking at the
/// entry itself (never through a symbolic link) and at the opened
/// directory. `Ok(false)`: it does not exist.
pub(crate) fn check_private_dir(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(open_error(path, e)),
        Ok(meta) => {
            if let Some(refusal) = not_private(path, &meta, false) {
                return Err(refusal);
            }
        }
    }
    let dir = open_dir(path)?;
    let meta = dir.metadata().map_err(|e| open_error(path, e))?;
    not_private(path, &meta, false).map_or(Ok(true), Err)
}

fn open_dir(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, e))
}

/// Creates the directory `path` (its parent exists and was checked), mode
/// 0700 whatever the umask.
pub(crate) fn create_private_dir(path: &Path) -> Result<()> {
    fs::DirBuilder::new().mode(DIR_MODE).create(path).map_err(|e| open_error(path, e))?;
    let dir = open_dir(path)?;
    dir.set_permissions(fs::Permissions::from_mode(DIR_MODE)).map_err(|e| open_error(path, e))?;
    let meta = dir.metadata().map_err(|e| open_error(path, e))?;
    not_private(path, &meta, false).map_or(Ok(()), Err)
}

/// Makes `root` a private directory of this user, creating what is missing
/// (mode 0700), and returns its canonical path, which the node uses from
/// then on (a symbolic link among the ancestors cannot be moved later).
pub(crate) fn prepare_root(root: &Path) -> Result<PathBuf> {
    let root = std::path::absolute(root).map_err(|e| open_error(root, e))?;
    // The deepest part of the path that exists; the rest is created.
    let mut missing = Vec::new();
    let mut existing = root.as_path();
    loop {
        match fs::symlink_metadata(existing) {
            Ok(_) => break,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                missing.push(existing.to_path_buf());
                existing = existing.parent().ok_or_else(|| unsafe_path(&root, "no part of it exists"))?;
            }
            Err(e) => return Err(open_error(existing, e)),
        }
    }
    if missing.is_empty() {
        make_root_private(&root)?;
        let canonical = fs::canonicalize(&root).map_err(|e| open_error(&root, e))?;
        if let Some(parent) = canonical.parent() {
            check_ancestors(parent, &root)?;
        }
        return Ok(canonical);
    }
    let canonical_base = fs::canonicalize(existing).map_err(|e| open_error(existing, e))?;
    check_ancestors(&canonical_base, &root)?;
    let mut path = canonical_base;
    for part in missing.iter().rev() {
        let name = part.file_name().ok_or_else(|| unsafe_path(&root, "it ends in '..'"))?;
        path.push(name);
        match create_private_dir(&path) {
            Ok(()) => {}
            // Another node of the cluster made it first: fine if private.
            Err(_) if check_private_dir(&path)? => {}
            Err(e) => return Err(e),
        }
    }
    Ok(path)
}

/// Checks the existing root: never a link, owned by this user, writable by
/// no one else. A root others may only read or enter (a directory made
/// with the usual umask, as `tempfile` makes them) is made 0700: it is
/// ours, and the fix is the one the error would ask for.
fn make_root_private(root: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(root).map_err(|e| open_error(root, e))?;
    let mode = meta.mode() & 0o7777;
    let open_to_others = meta.is_dir() && !meta.file_type().is_symlink() && meta.uid() == euid() && mode & 0o077 != 0;
    if open_to_others && mode & 0o022 == 0 {
        let dir = open_dir(root)?;
        dir.set_permissions(fs::Permissions::from_mode(DIR_MODE)).map_err(|e| open_error(root, e))?;
        tracing::info!(root = %root.display(), from = format!("{mode:04o}"), "made the shm root private (0700)");
    }
    check_private_dir(root).map(|_| ())
}

/// Checks the canonical directory `dir` and every ancestor: owned by this
/// user or root, and writable by others only with the sticky bit.
fn check_ancestors(dir: &Path, root: &Path) -> Result<()> {
    let me = euid();
    for ancestor in dir.ancestors() {
        let meta = fs::symlink_metadata(ancestor).map_err(|e| open_error(ancestor, e))?;
        let shown = ancestor.display();
        if meta.uid() != me && meta.uid() != 0 {
            return Err(unsafe_path(
                root,
                format!(
                    "its ancestor {shown} is owned by uid {}, neither this user (uid {me}) nor root, who could \
                     replace the shm root: choose a root under a directory of yours or /dev/shm",
                    meta.uid()
                ),
            ));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(unsafe_path(
                root,
                format!(
                    "its ancestor {shown} (mode {mode:04o}) is writable by others without the sticky bit, so \
                     another user could replace the shm root: chmod go-w {shown}, or choose another root"
                ),
            ));
        }
    }
    Ok(())
}

/// Creates the file `path`: it must not exist (not even as a symbolic
/// link), and it is made mode 0600 whatever the umask.
pub(crate) fn create_private_file(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists => unsafe_path(path, "something already exists there: remove it"),
            _ => open_error(path, e),
        })?;
    file.set_permissions(fs::Permissions::from_mode(FILE_MODE)).map_err(|e| open_error(path, e))?;
    Ok(file)
}

/// Opens the existing file `path` without following a symbolic link, read
/// only unless `writable`, and checks it is a private file of this user.
/// `Ok(None)`: there is no such file.
pub(crate) fn open_private_file(path: &Path, writable: bool) -> Result<Option<File>> {
    let file =
        match OpenOptions::new().read(true).write(writable).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(open_error(path, e)),
        };
    let meta = file.metadata().map_err(|e| open_error(path, e))?;
    match not_private(path, &meta, true) {
        Some(refusal) => Err(refusal),
        None => Ok(Some(file)),
    }
}

/// Writes this process's id to the new file `dir/owner.pid`.
pub(crate) fn write_owner_pid(dir: &Path) -> Result<()> {
    let path = dir.join(OWNER_PID_FILE);
    let mut file = create_private_file(&path)?;
    file.write_all(std::process::id().to_string().as_bytes()).map_err(|e| open_error(&path, e))
}

/// The process id in `dir/owner.pid`; `Ok(None)` if there is none (or it
/// is not a number); an error if the file is not a private file of ours.
pub(crate) fn read_owner_pid(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(OWNER_PID_FILE);
    let Some(file) = open_private_file(&path, false)? else { return Ok(None) };
    let mut text = String::new();
    file.take(PID_FILE_BYTES_MAX).read_to_string(&mut text).map_err(|e| open_error(&path, e))?;
    Ok(text.trim().parse().ok())
}

/// The liveness file of a node directory.
pub(crate) const OWNER_PID_FILE: &str = "owner.pid";
