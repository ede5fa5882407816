//! Optional TLS on every connection (`TcpConfig::tls`, `[cluster] tls =
//! true`), for cluster networks that are not private: frames are then
//! encrypted as well as authenticated.
//!
//! TLS 1.3 (rustls, the `ring` provider) carries the connection; who the
//! peer is, is still proven by the cluster key's handshake
//! (`tierstack_fabric_wire::auth`), run inside the TLS session and bound to
//! it by the session's exporter: a man in the middle terminating two TLS
//! sessions sees two exporters, and the key's tags fail. So certificates
//! prove nothing here: each node makes a fresh self-signed one at start and
//! a connector accepts any certificate whose handshake signature verifies.
//! Inside TLS the frames are not sealed again (TLS already makes them
//! tamper-evident).
//!
//! The backend reads a connection on one thread and writes it on another;
//! a rustls session does not split, so both halves share it behind a mutex
//! and never wait while holding it: the socket is non-blocking, and a half
//! that must wait for the socket (`poll`) releases the session first.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_fabric::{FabricError, Result};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, Connection, DigitallySignedStruct, ServerConfig, ServerConnection};

/// The exporter label binding the key's handshake to the TLS session.
const EXPORTER_LABEL: &[u8] = b"EXPORTER-tierstack-fabric-v4";
/// Bytes of exporter output the handshake is bound to.
pub(crate) const BINDING_BYTES: usize = 32;
/// The name every node's certificate carries (and every connector asks for).
const SERVER_NAME: &str = "tierstack-node";

/// A node's TLS configurations, made once at open.
pub(crate) struct TlsContext {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl TlsContext {
    pub(crate) fn new() -> Result<Self> {
        let bad = |what: &str, e: &dyn std::fmt::Display| FabricError::Io(format!("TLS set-up, {what}: {e}"));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|e| bad("making the node's certificate", &e))?;
        let cert = CertificateDer::from(certified.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
        let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad("server versions", &e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| bad("server certificate", &e))?;
        // No resumption: connections live long, and a ticket nobody reads
        // would sit in the session until the next write.
        server.send_tls13_tickets = 0;
        let verifier = Arc::new(AnyCertificate { algorithms: provider.signature_verification_algorithms });
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad("client versions", &e))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Self { client: Arc::new(client), server: Arc::new(server) })
    }

    /// Runs the connector's TLS handshake on blocking `stream` (with its
    /// timeouts set); returns the session and its channel binding.
    pub(crate) fn connect(&self, stream: &mut TcpStream) -> std::io::Result<(Connection, [u8; BINDING_BYTES])> {
        let name = ServerName::try_from(SERVER_NAME).map_err(std::io::Error::other)?;
        let conn = ClientConnection::new(Arc::clone(&self.client), name).map_err(std::io::Error::other)?;
        finish_handshake(Connection::Client(conn), stream)
    }

    /// Runs the acceptor's TLS handshake on blocking `stream`.
    pub(crate) fn accept(&self, stream: &mut TcpStream) -> std::io::Result<(Connection, [u8; BINDING_BYTES])> {
        let conn = ServerConnection::new(Arc::clone(&self.server)).map_err(std::io::Error::other)?;
        finish_handshake(Connection::Server(conn), stream)
    }
}

fn finish_handshake(
    mut conn: Connection,
    stream: &mut TcpStream,
) -> std::io::Result<(Connection, [u8; BINDING_BYTES])> {
    while conn.is_handshaking() {
        conn.complete_io(stream)?;
    }
    let mut binding = [0u8; BINDING_BYTES];
    conn.export_keying_material(&mut binding, EXPORTER_LABEL, None).map_err(std::io::Error::other)?;
    Ok((conn, binding))
}

/// A session and its blocking socket as one stream, for the key's
/// handshake right after the TLS one (the socket's read timeout bounds it).
pub(crate) struct Blocking<'a> {
    pub(crate) session: &'a mut Connection,
    pub(crate) stream: &'a mut TcpStream,
}

impl Read for Blocking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.session.reader().read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                done => return done,
            }
            if self.session.read_tls(self.stream)? == 0 {
                return Ok(0);
            }
            self.session.process_new_packets().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl Write for Blocking<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.session.writer().write(buf)?;
        self.flush()?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        while self.session.wants_write() {
            self.session.write_tls(self.stream)?;
        }
        Ok(())
    }
}

/// Accepts any certificate (the key's handshake, bound to this session,
/// proves the peer), but checks the TLS handshake's signature with it, so
/// the session's keys are the certificate holder's.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered.
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A TLS session shared by a connection's reading and writing halves.
pub(crate) struct TlsLink {
    session: Mutex<Connection>,
    stream: TcpStream,
    write_timeout: Duration,
}

impl TlsLink {
    /// Takes over `stream` (made non-blocking) and its established session.
    pub(crate) fn new(session: Connection, stream: TcpStream, write_timeout: Duration) -> std::io::Result<Arc<Self>> {
        stream.set_nonblocking(true)?;
        Ok(Arc::new(Self { session: Mutex::new(session), stream, write_timeout }))
    }

    /// Sends what the session holds, waiting (unlocked) for room.
    fn drain<'a>(&'a self, mut session: std::sync::MutexGuard<'a, Connection>) -> std::io::Result<()> {
        while session.wants_write() {
            match session.write_tls(&mut &self.stream) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    drop(session);
                    wait_for(&self.stream, libc::POLLOUT, Some(self.write_timeout))?;
                    session = tierstack_base::sync::lock(&self.session);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The reading half of a TLS connection.
pub(crate) struct TlsReader(pub(crate) Arc<TlsLink>);

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let link = &self.0;
        loop {
            {
                let mut session = tierstack_base::sync::lock(&link.session);
                match session.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                match session.read_tls(&mut &link.stream) {
                    Ok(0) => return Ok(0),
                    Ok(_) => {
                        session
                            .process_new_packets()
                            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                        // Anything the session must answer (an alert) goes out now, best effort.
                        while session.wants_write() {
                            match session.write_tls(&mut &link.stream) {
                                Ok(_) => {}
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                                Err(e) => return Err(e),
                            }
                        }
                        continue;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            wait_for(&link.stream, libc::POLLIN, None)?;
        }
    }
}

/// The writing half of a TLS connection: each write is sent before it returns.
pub(crate) struct TlsWriter(pub(crate) Arc<TlsLink>);

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let link = &self.0;
        let mut session = tierstack_base::sync::lock(&link.session);
        let n = session.writer().write(buf)?;
        link.drain(session)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let link = &self.0;
        link.drain(tierstack_base::sync::lock(&link.session))
    }
}

/// Waits until `stream` is ready for `events`, at most `timeout`.
fn wait_for(stream: &TcpStream, events: libc::c_short, timeout: Option<Duration>) -> std::io::Result<()> {
    if tierstack_fabric::listen::wait_ready(stream, events, timeout)? {
        Ok(())
    } else {
        Err(std::io::ErrorKind::TimedOut.into())
    }
}
