//! Who may reach the application module: its socket file's mode and owner,
//! the peer credentials of every connection, and one module per path.
//!
//! The module's socket is a local trust boundary: whoever connects can take
//! update grants (bumping versions, so every cached copy stops validating)
//! and hold them. So:
//! - **The socket file is 0600** (0660 with a configured group) **from the
//!   moment it has its name.** It is bound inside a fresh private directory
//!   (0700, so nobody else can reach it there), its mode and group set by
//!   path, then hard-linked to its name, which fails rather than replaces if
//!   something is there, and the private name removed. Neither the umask
//!   (process-wide, so racy with other threads) nor `fchmod` (on Linux it
//!   changes the socket's own inode, not the file's mode) could do this.
//! - **Every accepted connection's peer credentials** (`SO_PEERCRED`, set by
//!   the kernel at `connect`) are checked against [`SocketAccess`]: by
//!   default the module's own user and root. A refused peer is closed at
//!   once, logged and counted; it never reaches the protocol.
//! - **A live module is never taken over.** A socket file at the path is
//!   probed first: if anything accepts (or its backlog is full), start-up
//!   fails with `a module already serves <path>`; only a socket nobody
//!   listens on (connection refused) is removed, and only if it is still the
//!   same file when removed. Anything else at the path (a regular file, a
//!   directory, a symlink) is refused, never removed.
//!
//! What it does not do: the peer check trusts the kernel's credentials of
//! the *connecting* process; a process of an allowed user is fully trusted
//! (it may hold grants until the grant lifetime, bump versions by updating).

use crate::module::ModuleError;
use std::ffi::CString;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};

/// How long a probe of an existing socket file waits for an answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Who may connect to the module's socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketAccess {
    /// The socket file's group: mode 0660 with it, 0600 without. A peer
    /// whose effective group is this one is allowed too.
    pub group: Option<u32>,
    /// Users allowed besides the module's own user and root.
    pub allowed_uids: Vec<u32>,
}

impl Default for SocketAccess {
    /// Mode 0600; the module's own user and root only.
    fn default() -> Self {
        SocketAccess { group: None, allowed_uids: Vec::new() }
    }
}

impl SocketAccess {
    /// The socket file's permission bits.
    pub fn mode(&self) -> u32 {
        if self.group.is_some() {
            0o660
        } else {
            0o600
        }
    }

    /// Whether a peer with these kernel-reported credentials may talk to the module.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        uid == 0 || uid == effective_uid() || self.allowed_uids.contains(&uid) || self.group == Some(gid)
    }
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A group given as a name or a number (`--socket-group NAME|GID`).
pub fn resolve_group(spec: &str) -> Result<u32, ModuleError> {
    if let Ok(gid) = spec.parse::<u32>() {
        return Ok(gid);
    }
    let unknown = || ModuleError::Socket(format!("no group named {spec:?}"));
    let name = CString::new(spec).map_err(|_| unknown())?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `group` is plain data that getgrnam_r fills in.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: `name` is NUL-terminated,
    // `buffer` is writable for the length passed, `group` and `found` are
    // live locals; the result refers only into `buffer` and `group`.
    let status = unsafe { libc::getgrnam_r(name.as_ptr(), &mut group, buffer.as_mut_ptr(), buffer.len(), &mut found) };
    if status != 0 {
        return Err(ModuleError::Socket(format!(
            "looking up group {spec:?}: {}",
            std::io::Error::from_raw_os_error(status)
        )));
    }
    if found.is_null() {
        return Err(unknown());
    }
    Ok(group.gr_gid)
}

/// Binds the module's socket at `path`, mode and group from `access`; see
/// the module docs for why in this order.
pub async fn bind(path: &Path, access: &SocketAccess) -> Result<UnixListener, ModuleError> {
    clear_stale(path).await?;
    let private = PrivateDir::create(path)?;
    let staged = private.path.join("s");
    let listener = UnixListener::bind(&staged).map_err(|e| {
        ModuleError::Socket(format!("binding {} (staged for {}): {e}", staged.display(), path.display()))
    })?;
    if let Some(gid) = access.group {
        std::os::unix::fs::chown(&staged, None, Some(gid))
            .map_err(|e| ModuleError::Socket(format!("giving {} to group {gid}: {e}", path.display())))?;
    }
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(access.mode()))?;
    // A hard link never replaces: a module that took the path since the probe keeps it.
    match std::fs::hard_link(&staged, path) {
        Ok(()) => Ok(listener),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(ModuleError::AlreadyServed(path.to_path_buf())),
        Err(e) => Err(ModuleError::Socket(format!("naming the socket {}: {e}", path.display()))),
    }
}

/// Removes a stale socket file at `path`; refuses a live one and anything
/// that is not a socket.
async fn clear_stale(path: &Path) -> Result<(), ModuleError> {
    let found = match std::fs::symlink_metadata(path) {
        Ok(found) => found,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ModuleError::Socket(format!("{}: {e}", path.display()))),
    };
    if !found.file_type().is_socket() {
        return Err(ModuleError::Socket(format!(
            "{} exists and is not a socket; not removing it (move it away, or choose another --socket)",
            path.display()
        )));
    }
    match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
        // Accepted, backlog full, or too slow to refuse: something listens.
        Ok(Ok(_)) | Err(_) => return Err(ModuleError::AlreadyServed(path.to_path_buf())),
        Ok(Err(e)) if e.kind() == ErrorKind::WouldBlock => return Err(ModuleError::AlreadyServed(path.to_path_buf())),
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => {}
        Ok(Err(e)) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Ok(Err(e)) => {
            return Err(ModuleError::Socket(format!(
                "cannot tell whether a module serves {}: {e}; not removing it",
                path.display()
            )))
        }
    }
    // Only the file found refusing: another module may have replaced it since.
    let still = std::fs::symlink_metadata(path)?;
    if (still.dev(), still.ino()) != (found.dev(), found.ino()) {
        return Err(ModuleError::AlreadyServed(path.to_path_buf()));
    }
    tracing::info!(path = %path.display(), "removing a stale module socket (nobody listens on it)");
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// A fresh 0700 directory beside the socket's path, removed with what is in it on drop.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn create(socket: &Path) -> Result<PrivateDir, ModuleError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let parent = match socket.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        // Short: a socket's path must fit in 108 bytes, and this adds to the parent's.
        let name = format!(".m{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = parent.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| ModuleError::Socket(format!("creating {}: {e}", path.display())))?;
        let dir = PrivateDir { path };
        // The umask can only take bits away; make sure the owner has them all.
        std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o700))?;
        Ok(dir)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the module's staging directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allows_this_user_and_root_only() {
        let access = SocketAccess::default();
        assert_eq!(access.mode(), 0o600);
        assert!(access.allows(effective_uid(), 12345));
        assert!(access.allows(0, 0));
        let stranger = if effective_uid() == 65534 { 65533 } else { 65534 };
        assert!(!access.allows(stranger, 65534));
        let widened = SocketAccess { group: Some(4242), allowed_uids: vec![stranger] };
        assert_eq!(widened.mode(), 0o660);
        assert!(widened.allows(stranger, 1));
        assert!(widened.allows(stranger + 1, 4242), "a peer of the socket's group");
        assert!(!widened.allows(stranger + 1, 4243));
    }

    #[test]
    fn groups_resolve_by_number_and_by_name() {
        assert_eq!(resolve_group("4242").unwrap(), 4242);
        assert_eq!(resolve_group("root").unwrap(), 0);
        assert!(resolve_group("no-such-group-tierstack").is_err());
        assert!(resolve_group("nul\0inside").is_err());
    }
}
