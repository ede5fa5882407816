//! Connection set-up and framing, with or without the cluster key.
//!
//! With a key ([`TcpConfig::key`](crate::TcpConfig)), every connection starts
//! with the mutual handshake of `tierstack_fabric_wire::auth` and every frame
//! after it is sealed; the node id a peer's requests and messages are taken
//! from is the one its handshake proved. Without a key, the connector's
//! `Hello` is taken on trust (allowed on loopback only; see
//! `tierstack_cluster`). A node with a key refuses a peer without one and the
//! other way round: the two modes never mix.
//!
//! Both sides read the handshake under a deadline (the op timeout), so a
//! connection that says nothing holds a handshake slot for at most that
//! long; the listener bounds those slots ([`HANDSHAKES_MAX`]).

use crate::tls::{Blocking, TlsLink, TlsReader, TlsWriter};
use crate::Shared;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use tierstack_base::NodeId;
use tierstack_fabric::{FabricError, Result};
use tierstack_fabric_wire::auth::{self, Opener, Sealer};
use tierstack_fabric_wire::{encode, read_frame_body, Frame, WireError};

/// Connections a node lets handshake at once. A new connection over the
/// bound closes the oldest one still handshaking, so idle sockets cannot
/// lock real peers out: a peer completes its handshake in a round trip,
/// an idler is evicted or times out.
pub const HANDSHAKES_MAX: usize = 64;

/// The sealing state of one direction of a connection: none without a key.
pub(crate) type SealState = Option<Sealer>;

/// Seals (when keyed) and writes one encoded frame.
pub(crate) fn write_frame_bytes(
    stream: &mut impl Write,
    sealer: &mut SealState,
    mut bytes: Vec<u8>,
) -> std::io::Result<()> {
    if let Some(sealer) = sealer {
        sealer.seal(&mut bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    }
    stream.write_all(&bytes)
}

/// Reads frames of one direction, verifying each when keyed.
pub(crate) struct FrameReader<R> {
    reader: BufReader<R>,
    opener: Option<Opener>,
    body: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    pub(crate) fn new(reader: BufReader<R>, opener: Option<Opener>) -> Self {
        Self { reader, opener, body: Vec::new() }
    }

    /// The next frame's verified body (kind byte first, tag removed), or
    /// `None` at a clean end of stream.
    pub(crate) fn next_body(&mut self) -> std::result::Result<Option<&[u8]>, WireError> {
        if self.body.capacity() > crate::client::FRAME_BUFFER_KEEP_BYTES {
            self.body = Vec::new();
        }
        if !read_frame_body(&mut self.reader, &mut self.body)? {
            return Ok(None);
        }
        match &mut self.opener {
            Some(opener) => opener.open(&self.body).map(Some),
            None => Ok(Some(&self.body)),
        }
    }
}

/// The reading half of a set-up connection.
pub(crate) enum WireReader {
    Plain(TcpStream),
    Tls(TlsReader),
}

impl Read for WireReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            WireReader::Plain(stream) => stream.read(buf),
            WireReader::Tls(tls) => tls.read(buf),
        }
    }
}

/// The writing half of a set-up connection.
pub(crate) enum WireWriter {
    Plain(TcpStream),
    Tls(TlsWriter),
}

impl Write for WireWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            WireWriter::Plain(stream) => stream.write(buf),
            WireWriter::Tls(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            WireWriter::Plain(stream) => stream.flush(),
            WireWriter::Tls(tls) => tls.flush(),
        }
    }
}

/// A connection after set-up: the socket (to shut it down), its halves,
/// and the sealing state of each direction (none without a key, and none
/// inside TLS, which already makes frames tamper-evident).
pub(crate) struct Wired {
    pub(crate) control: TcpStream,
    pub(crate) reader: WireReader,
    pub(crate) writer: WireWriter,
    pub(crate) sealer: SealState,
    pub(crate) opener: Option<Opener>,
}

fn plain(stream: &TcpStream, sealer: SealState, opener: Option<Opener>) -> std::io::Result<Wired> {
    Ok(Wired {
        control: stream.try_clone()?,
        reader: WireReader::Plain(stream.try_clone()?),
        writer: WireWriter::Plain(stream.try_clone()?),
        sealer,
        opener,
    })
}

fn over_tls(
    stream: &TcpStream,
    session: rustls::Connection,
    write_timeout: std::time::Duration,
) -> std::io::Result<Wired> {
    let link = TlsLink::new(session, stream.try_clone()?, write_timeout)?;
    Ok(Wired {
        control: stream.try_clone()?,
        reader: WireReader::Tls(TlsReader(std::sync::Arc::clone(&link))),
        writer: WireWriter::Tls(TlsWriter(link)),
        sealer: None,
        opener: None,
    })
}

/// The connector's side of set-up on a fresh `stream` to `peer`.
pub(crate) fn connect(shared: &Shared, peer: NodeId, stream: &mut TcpStream) -> Result<Wired> {
    let io = |e: std::io::Error| FabricError::PeerDead { node: peer, reason: format!("during the handshake: {e}") };
    let refused = |reason: String| FabricError::Unauthenticated { node: peer, reason };
    let Some(key) = &shared.key else {
        stream.write_all(&encode(&Frame::Hello { node: shared.node })).map_err(io)?;
        return plain(stream, None, None).map_err(io);
    };
    stream.set_read_timeout(Some(shared.op_timeout)).map_err(io)?;
    let wired = match &shared.tls {
        None => {
            let session = auth::connect_over(stream, key, shared.node, shared.incarnation, peer, b"")
                .map_err(|e| refused(e.to_string()))?;
            plain(stream, Some(session.sealer), Some(session.opener)).map_err(io)?
        }
        Some(tls) => {
            let (mut session, binding) = tls.connect(stream).map_err(|e| refused(format!("TLS: {e}")))?;
            let mut inside = Blocking { session: &mut session, stream };
            auth::connect_over(&mut inside, key, shared.node, shared.incarnation, peer, &binding)
                .map_err(|e| refused(e.to_string()))?;
            stream.set_read_timeout(None).map_err(io)?;
            return over_tls(stream, session, shared.op_timeout).map_err(io);
        }
    };
    stream.set_read_timeout(None).map_err(io)?;
    Ok(wired)
}

/// What the acceptor learnt at set-up.
pub(crate) struct Accepted {
    pub(crate) peer: NodeId,
    pub(crate) wired: Wired,
}

/// The acceptor's side of set-up on `stream`, under a read deadline.
/// `Ok(None)`: the connection closed before saying anything (a liveness
/// probe). An error names why the peer was refused.
pub(crate) fn accept(shared: &Shared, stream: &mut TcpStream) -> std::result::Result<Option<Accepted>, String> {
    let io = |e: std::io::Error| e.to_string();
    stream.set_read_timeout(Some(shared.op_timeout)).map_err(io)?;
    if let (Some(tls), Some(key)) = (&shared.tls, &shared.key) {
        let (mut session, binding) = match tls.accept(stream) {
            Ok(done) => done,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(format!("TLS: {e}")),
        };
        let mut inside = Blocking { session: &mut session, stream };
        let hello = match auth::read_handshake_frame(&mut inside) {
            Ok(Some(hello @ Frame::AuthHello { .. })) => hello,
            Ok(Some(other)) => return Err(format!("the first frame is {}, not an AuthHello", other.kind_name())),
            Ok(None) => return Ok(None),
            Err(e) => return Err(format!("no valid first frame: {e}")),
        };
        let peer = auth::accept_over(&mut inside, key, shared.node, shared.incarnation, &hello, &binding)
            .map_err(|e| format!("{} (claimed): {e}", claimed(&hello)))?
            .peer;
        stream.set_read_timeout(None).map_err(io)?;
        return Ok(Some(Accepted { peer, wired: over_tls(stream, session, shared.op_timeout).map_err(io)? }));
    }
    let first = match auth::read_handshake_frame(stream) {
        Ok(Some(first)) => first,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("no valid first frame: {e}")),
    };
    let accepted = match (&shared.key, first) {
        (None, Frame::Hello { node }) => Accepted { peer: node, wired: plain(stream, None, None).map_err(io)? },
        (None, Frame::AuthHello { node, .. }) => {
            return Err(format!("{node} has a cluster key and this node has none: start every node with the same key"))
        }
        (Some(_), Frame::Hello { node }) => {
            return Err(format!("{node} has no cluster key: this cluster requires one"));
        }
        (Some(key), hello @ Frame::AuthHello { .. }) => {
            let session = auth::accept_over(stream, key, shared.node, shared.incarnation, &hello, b"")
                .map_err(|e| format!("{} (claimed): {e}", claimed(&hello)))?;
            let peer = session.peer;
            Accepted { peer, wired: plain(stream, Some(session.sealer), Some(session.opener)).map_err(io)? }
        }
        (_, other) => return Err(format!("the first frame is {}, not a hello", other.kind_name())),
    };
    stream.set_read_timeout(None).map_err(io)?;
    Ok(Some(accepted))
}

fn claimed(hello: &Frame) -> String {
    match hello {
        Frame::AuthHello { node, .. } => node.to_string(),
        _ => "?".to_string(),
    }
}
