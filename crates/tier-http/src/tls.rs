//! TLS termination for a listener ([`Front::tls`](crate::Front)): a
//! certificate chain and its key read from PEM files, reloadable while the
//! listener serves.
//!
//! - The key file is a secret: read with
//!   [`read_secret_file`](tierstack_secret::read_secret_file), so a key
//!   that group or others may read, or that another user owns, is refused
//!   with an error that says how to fix it (as `ssh` refuses such a key).
//!   The chain is public; it is only bounded in size.
//! - TLS 1.2 and 1.3 (rustls, the `ring` provider); ALPN offers `h2` (when
//!   HTTP/2 is on) and `http/1.1`, in that order: a client that offers
//!   both gets HTTP/2, one that offers neither gets HTTP/1.1.
//! - [`TlsServer::reload`] reads the pair again and, only if it loads and
//!   the key matches the certificate, makes it the one new handshakes use;
//!   connections already open keep their session. A bad new pair leaves
//!   the old one in place. [`TlsServer::reload_on_sighup`] does it on
//!   SIGHUP, logging the outcome either way.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tierstack_secret::{read_secret_file, SecretError};

/// A certificate chain file larger than this is not one.
pub const CERT_FILE_BYTES_MAX: u64 = 1 << 20;

/// The ALPN name of HTTP/2 over TLS (RFC 9113 §3.2).
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN name of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Where a listener's certificate chain and key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the end-entity certificate first, then its intermediates.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1), mode 0600.
    pub key: PathBuf,
}

/// Why a certificate and key were refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificate file {path:?}: {error}")]
    CertIo { path: PathBuf, error: std::io::Error },
    #[error("certificate file {path:?} is larger than {max} bytes")]
    CertTooLarge { path: PathBuf, max: u64 },
    #[error("certificate file {path:?} holds no PEM certificate ({reason})")]
    NoCert { path: PathBuf, reason: String },
    #[error("TLS key: {0}")]
    Key(#[from] SecretError),
    #[error("key file {path:?} holds no PEM private key ({reason})")]
    NoKey { path: PathBuf, reason: String },
    #[error("certificate {cert:?} and key {key:?} do not make a TLS configuration: {reason}")]
    Config { cert: PathBuf, key: PathBuf, reason: String },
}

/// A listener's TLS configuration, swapped whole on reload.
pub struct TlsServer {
    files: TlsFiles,
    http2: bool,
    current: RwLock<Arc<ServerConfig>>,
    reloads: AtomicU64,
    refused: AtomicU64,
}

impl TlsServer {
    /// Loads `files`; `http2` offers `h2` by ALPN.
    pub fn load(files: TlsFiles, http2: bool) -> Result<Arc<TlsServer>, TlsError> {
        let config = server_config(&files, http2)?;
        Ok(Arc::new(TlsServer {
            files,
            http2,
            current: RwLock::new(config),
            reloads: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }))
    }

    /// Reads the pair again; new handshakes use it if it loads, else the
    /// old pair stays and the error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        match server_config(&self.files, self.http2) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = config;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// The files it reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reloads taken, and refused, so far.
    pub fn reload_counts(&self) -> (u64, u64) {
        (self.reloads.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed))
    }

    /// The configuration for the next handshake.
    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Reloads on every SIGHUP until the runtime ends, logging the outcome
    /// (a refused pair at `error`, naming why and that the old one stays).
    /// Call inside a runtime.
    pub fn reload_on_sighup(self: &Arc<Self>) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        let server = self.clone();
        Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match server.reload() {
                    Ok(()) => tracing::info!(cert = ?server.files.cert, "SIGHUP: TLS certificate and key reloaded"),
                    Err(e) => tracing::error!(
                        error = %e,
                        "SIGHUP: TLS certificate and key refused; the previous pair stays in use"
                    ),
                }
            }
        }))
    }
}

fn server_config(files: &TlsFiles, http2: bool) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = read_chain(&files.cert)?;
    let key_file = read_secret_file(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(key_file.as_bytes())
        .map_err(|e| TlsError::NoKey { path: files.key.clone(), reason: e.to_string() })?;
    let bad =
        |e: rustls::Error| TlsError::Config { cert: files.cert.clone(), key: files.key.clone(), reason: e.to_string() };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // `with_single_cert` refuses a key that does not match the certificate.
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(bad)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(bad)?;
    config.alpn_protocols = if http2 { vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()] } else { vec![ALPN_HTTP1.to_vec()] };
    Ok(Arc::new(config))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let io = |error| TlsError::CertIo { path: path.to_path_buf(), error };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut pem = Vec::new();
    file.take(CERT_FILE_BYTES_MAX + 1).read_to_end(&mut pem).map_err(io)?;
    if pem.len() as u64 > CERT_FILE_BYTES_MAX {
        return Err(TlsError::CertTooLarge { path: path.to_path_buf(), max: CERT_FILE_BYTES_MAX });
    }
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NoCert { path: path.to_path_buf(), reason: e.to_string() })?;
    if chain.is_empty() {
        return Err(TlsError::NoCert { path: path.to_path_buf(), reason: "no CERTIFICATE block".into() });
    }
    Ok(chain)
}
