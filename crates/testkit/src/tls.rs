//! TLS for tests: a certificate authority made at run time that issues
//! server certificates for `localhost`, written as the proxy's
//! `--tls-cert`/`--tls-key` files (the key mode 0600), and a client
//! configuration that trusts only that authority.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The name every issued certificate carries.
pub const SERVER_NAME: &str = "localhost";

/// A throwaway certificate authority.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// One issued certificate: its DER (to compare with what a client saw)
/// and its PEM chain and key.
pub struct Issued {
    pub der: Vec<u8>,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// Writes the pair to `dir/NAME.pem` and `dir/NAME.key` (mode 0600);
    /// returns (certificate path, key path).
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        (cert, key)
    }
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "tierstack test CA");
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert, key }
    }

    /// A new key and a certificate for [`SERVER_NAME`] and 127.0.0.1,
    /// signed by this authority; `serial` tells issues apart.
    pub fn issue(&self, serial: u64) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_string(), "127.0.0.1".to_string()]).unwrap();
        params.serial_number = Some(serial.into());
        params.distinguished_name.push(DnType::CommonName, format!("tierstack test server {serial}"));
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Issued { der: cert.der().to_vec(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// The authority's certificate, PEM (for clients outside the process).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A client that trusts this authority only and offers `alpn` (e.g.
    /// `[b"h2", b"http/1.1"]`).
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A TLS connection to `addr` under `config`, for [`SERVER_NAME`].
    pub async fn connect(
        config: Arc<rustls::ClientConfig>,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        tokio_rustls::TlsConnector::from(config).connect(name, tcp).await
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// The end-entity certificate (DER) a TLS connection's server showed.
pub fn peer_certificate(stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().and_then(|chain| chain.first()).map(|c| c.to_vec()).unwrap_or_default()
}

/// The protocol ALPN chose on a TLS connection, if any.
pub fn alpn(stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Option<Vec<u8>> {
    stream.get_ref().1.alpn_protocol().map(|p| p.to_vec())
}
