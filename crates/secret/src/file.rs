//! Reading and writing secret files with their permissions checked.

use crate::Secret;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A secret file larger than this is not one (a mistaken path, say).
pub const SECRET_FILE_BYTES_MAX: u64 = 4096;

/// Why a secret file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secret file {path:?}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("cannot create secret file {path:?}: {error}")]
    Create { path: PathBuf, error: std::io::Error },
    #[error(
        "secret file {path:?} has mode {mode:04o}: group or others may access it, so it is no secret \
         (run `chmod 600 {path:?}`)"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("secret file {path:?} belongs to uid {owner}, not to this user (uid {user}) or root")]
    Owner { path: PathBuf, owner: u32, user: u32 },
    #[error("secret file {path:?} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("secret file {path:?} is empty")]
    Empty { path: PathBuf },
    #[error("secret file {path:?} is larger than {max} bytes")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("secret file {path:?} is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// Reads the secret in `path`: its content with surrounding whitespace
/// trimmed. Refused when group or others have any access to the file, when
/// it belongs to another user than this process's (root's files are
/// accepted: root could read ours anyway), when it is not a regular file,
/// empty, or larger than [`SECRET_FILE_BYTES_MAX`]. The checks are made on
/// the opened file, so a rename between check and read cannot swap it.
pub fn read_secret_file(path: &Path) -> Result<Secret, SecretError> {
    let io = |error| SecretError::Io { path: path.to_path_buf(), error };
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SecretError::NotAFile { path: path.to_path_buf() });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretError::Permissions { path: path.to_path_buf(), mode });
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if meta.uid() != user && meta.uid() != 0 {
        return Err(SecretError::Owner { path: path.to_path_buf(), owner: meta.uid(), user });
    }
    if meta.len() > SECRET_FILE_BYTES_MAX {
        return Err(SecretError::TooLarge { path: path.to_path_buf(), max: SECRET_FILE_BYTES_MAX });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded even if the file grows after the check.
    (&mut file).take(SECRET_FILE_BYTES_MAX + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > SECRET_FILE_BYTES_MAX {
        return Err(SecretError::TooLarge { path: path.to_path_buf(), max: SECRET_FILE_BYTES_MAX });
    }
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |i| i + 1);
    if start >= end {
        return Err(SecretError::Empty { path: path.to_path_buf() });
    }
    Ok(Secret::new(bytes[start..end].to_vec()))
}

/// Writes `content` to a new file `path`, mode 0600, refusing to replace an
/// existing file or to follow a symlink at `path`.
pub fn write_new_secret_file(path: &Path, content: &[u8]) -> Result<(), SecretError> {
    let create = |error| SecretError::Create { path: path.to_path_buf(), error };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        // `create_new` is O_CREAT|O_EXCL, which fails on any existing name,
        // a symbolic link included (dangling or not): nothing is followed.
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(create)?;
    file.write_all(content).map_err(create)?;
    file.sync_all().map_err(create)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, content: &[u8], mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_private_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "token", b"  s3cret-token\n", 0o600);
        assert!(read_secret_file(&path).unwrap().ct_eq(b"s3cret-token"));
        let path = write(dir.path(), "ro", b"x", 0o400);
        assert!(read_secret_file(&path).unwrap().ct_eq(b"x"));
    }

    #[test]
    fn a_file_others_may_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o610] {
            let path = write(dir.path(), &format!("m{mode:o}"), b"secret", mode);
            let err = read_secret_file(&path).unwrap_err();
            assert!(matches!(err, SecretError::Permissions { .. }), "{mode:o}: {err}");
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
    }

    /// The size bound is inclusive, and the whole of a file at the bound is read.
    #[test]
    fn a_file_of_exactly_the_bound_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let content = vec![b'k'; SECRET_FILE_BYTES_MAX as usize];
        let path = write(dir.path(), "max", &content, 0o600);
        assert_eq!(read_secret_file(&path).unwrap().as_bytes(), &content[..]);
    }

    /// A private file of another user is refused (as root: a file handed to
    /// uid 65534); root's own files are accepted.
    #[test]
    fn another_users_file_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can give a file to another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "theirs", b"secret", 0o600);
        assert!(read_secret_file(&path).unwrap().ct_eq(b"secret"), "root's own file");
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        match read_secret_file(&path) {
            Err(SecretError::Owner { owner: 65534, user: 0, .. }) => {}
            other => panic!("another user's file was accepted: {other:?}"),
        }
    }

    #[test]
    fn empty_large_missing_and_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = write(dir.path(), "empty", b" \n\t", 0o600);
        assert!(matches!(read_secret_file(&empty), Err(SecretError::Empty { .. })));
        let large = write(dir.path(), "large", &vec![b'a'; 4097], 0o600);
        assert!(matches!(read_secret_file(&large), Err(SecretError::TooLarge { .. })));
        assert!(matches!(read_secret_file(&dir.path().join("missing")), Err(SecretError::Io { .. })));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(read_secret_file(dir.path()), Err(SecretError::NotAFile { .. })));
    }

    #[test]
    fn a_new_secret_file_is_private_and_never_replaces_or_follows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write_new_secret_file(&path, b"abc\n").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(read_secret_file(&path).unwrap().ct_eq(b"abc"));
        assert!(matches!(write_new_secret_file(&path, b"other"), Err(SecretError::Create { .. })));
        assert!(read_secret_file(&path).unwrap().ct_eq(b"abc"), "an existing secret was replaced");
        let target = dir.path().join("target");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_new_secret_file(&link, b"x").is_err());
        assert!(!target.exists(), "a symlink was followed");
    }
}
