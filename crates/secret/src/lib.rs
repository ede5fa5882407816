//! Secrets, read the one careful way, and the MAC that authenticated links use.
//!
//! tierstack has two kinds of secret: the **cluster key**, shared by every
//! node of a cluster and named by the topology (`[cluster] key_file`), which
//! the fabric backends use to authenticate peers and every frame; and
//! **bearer tokens**, such as the proxy's admin token. Both live in files, and
//! a file that another user can read is no secret, so [`read_secret_file`]
//! refuses one (mode bits for group or others, or an owner other than this
//! user or root) with an error that says how to fix it, the way `ssh` refuses
//! a private key.
//!
//! Crypto comes only from well-kept crates: HMAC-SHA-256 (`hmac`, `sha2`) for
//! tags, `subtle` for constant-time comparison, the OS random source
//! (`rand::rngs::OsRng`) for keys and nonces. Nothing here is hand-rolled.
//!
//! Depends on no other tierstack crate.

mod file;
mod mac;

pub use file::{read_secret_file, write_new_secret_file, SecretError, SECRET_FILE_BYTES_MAX};
pub use mac::{Mac, Tag, TAG_BYTES};

use rand::RngCore;
use std::fmt;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Bytes of secret material, never printed.
#[derive(Clone)]
pub struct Secret {
    bytes: Vec<u8>,
}

impl Secret {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Compares with `other` in time that does not depend on where they
    /// differ (a bearer token checked byte by byte leaks its prefix).
    pub fn ct_eq(&self, other: &[u8]) -> bool {
        self.bytes.ct_eq(other).into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.bytes.len())
    }
}

/// Bytes of a cluster key.
pub const CLUSTER_KEY_BYTES: usize = 32;

/// The key every node of one cluster shares: 32 random bytes, stored as 64
/// hexadecimal digits and a newline. Links never use it directly: each use
/// derives its own key ([`ClusterKey::derive`]), so a tag made for one
/// purpose is never valid for another.
#[derive(Clone)]
pub struct ClusterKey {
    key: [u8; CLUSTER_KEY_BYTES],
}

impl ClusterKey {
    /// A fresh key from the OS random source.
    pub fn generate() -> Self {
        let mut key = [0u8; CLUSTER_KEY_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut key);
        Self { key }
    }

    /// Reads a key file written by [`ClusterKey::write_new`] (`tierstack
    /// cluster key --out FILE`), checking its permissions.
    pub fn read(path: &Path) -> Result<Self, SecretError> {
        let secret = read_secret_file(path)?;
        Self::parse(secret.as_bytes()).map_err(|reason| SecretError::Malformed { path: path.to_path_buf(), reason })
    }

    /// Writes this key to a new file `path` (created 0600, never over an
    /// existing file or through a symlink).
    pub fn write_new(&self, path: &Path) -> Result<(), SecretError> {
        let mut text = hex(&self.key);
        text.push('\n');
        write_new_secret_file(path, text.as_bytes())
    }

    /// Parses 64 hexadecimal digits (surrounding whitespace ignored).
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(text).map_err(|_| "not text".to_string())?.trim();
        if text.len() != CLUSTER_KEY_BYTES * 2 {
            return Err(format!(
                "a cluster key is {} hexadecimal digits, this has {} characters (make one with `tierstack cluster key --out FILE`)",
                CLUSTER_KEY_BYTES * 2,
                text.len()
            ));
        }
        let mut key = [0u8; CLUSTER_KEY_BYTES];
        for (i, byte) in key.iter_mut().enumerate() {
            let pair = text.get(2 * i..2 * i + 2).ok_or_else(|| "not ASCII".to_string())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| format!("{pair:?} is not a hexadecimal byte"))?;
        }
        Ok(Self { key })
    }

    /// A key for one purpose: HMAC-SHA-256 of `label` under the cluster key.
    pub fn derive(&self, label: &str) -> Mac {
        Mac::new(&Mac::new(&self.key).tag_full(&[label.as_bytes()]))
    }

    /// A short fingerprint (the first 8 bytes of a derived tag, in hex) to
    /// tell in logs whether two nodes hold the same key, revealing nothing.
    pub fn fingerprint(&self) -> String {
        hex(&self.derive("tierstack key fingerprint").tag_full(&[])[..8])
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey({})", self.fingerprint())
    }
}

/// Fresh random bytes from the OS, for handshake nonces.
pub fn random_nonce<const N: usize>() -> [u8; N] {
    let mut nonce = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    nonce
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_round_trips_through_its_text_and_keys_differ() {
        let key = ClusterKey::generate();
        let parsed = ClusterKey::parse(format!("  {}\n", hex(&key.key)).as_bytes()).unwrap();
        assert_eq!(parsed.key, key.key);
        assert_ne!(ClusterKey::generate().key, key.key, "two fresh keys are equal: the random source is broken");
        assert_eq!(key.fingerprint(), parsed.fingerprint());
        assert_eq!(key.fingerprint().len(), 16);
        assert_eq!(
            format!("{key:?}"),
            format!("ClusterKey({})", key.fingerprint()),
            "Debug shows the fingerprint only"
        );
    }

    #[test]
    fn a_key_written_is_read_back_from_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let key = ClusterKey::generate();
        key.write_new(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ClusterKey::read(&path).unwrap().key, key.key);
        assert!(ClusterKey::generate().write_new(&path).is_err(), "an existing key was replaced");
        assert_eq!(ClusterKey::read(&path).unwrap().key, key.key);
    }

    #[test]
    fn nonces_are_fresh() {
        let (a, b): ([u8; 16], [u8; 16]) = (random_nonce(), random_nonce());
        assert_ne!(a, b, "two nonces are equal: the random source is broken");
        assert_ne!(a, [0; 16]);
    }

    #[test]
    fn malformed_keys_are_refused_with_the_reason() {
        assert!(ClusterKey::parse(b"abcd").unwrap_err().contains("64 hexadecimal digits"));
        let bad = "zz".repeat(32);
        assert!(ClusterKey::parse(bad.as_bytes()).unwrap_err().contains("not a hexadecimal byte"));
        assert!(ClusterKey::parse(&[0xff; 64]).is_err());
        // 64 bytes but multi-byte characters: never a panic on a char boundary.
        assert!(ClusterKey::parse("é".repeat(32).as_bytes()).is_err());
    }

    #[test]
    fn derived_keys_differ_by_label() {
        let key = ClusterKey::generate();
        let a = key.derive("a").tag(&[b"x"]);
        assert_ne!(a, key.derive("b").tag(&[b"x"]));
        assert_eq!(a, key.derive("a").tag(&[b"x"]));
    }

    #[test]
    fn secrets_compare_in_constant_time_and_never_print() {
        let secret = Secret::new(b"token".to_vec());
        assert_eq!(secret.as_bytes(), b"token");
        assert!(secret.ct_eq(b"token"));
        assert!(!secret.ct_eq(b"tokeN"));
        assert!(!secret.ct_eq(b"toke"));
        assert_eq!(format!("{secret:?}"), "Secret(5 bytes)");
    }
}
