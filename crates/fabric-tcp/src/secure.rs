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

use crate::Shared;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use tierstack_base::NodeId;
use tierstack_fabric::{FabricError, Result};
use tierstack_fabric_wire::auth::{Accepting, Connecting, Opener, Sealer};
use tierstack_fabric_wire::{decode, encode, read_frame_body, Frame, WireError};

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

/// The connector's side of set-up on a fresh `stream` to `peer`: returns
/// the sealer of its writes and the opener of its reads.
pub(crate) fn connect(shared: &Shared, peer: NodeId, stream: &mut TcpStream) -> Result<(SealState, Option<Opener>)> {
    let io = |e: std::io::Error| FabricError::PeerDead { node: peer, reason: format!("during the handshake: {e}") };
    let Some(key) = &shared.key else {
        stream.write_all(&encode(&Frame::Hello { node: shared.node })).map_err(io)?;
        return Ok((None, None));
    };
    let nonce = tierstack_secret::random_nonce();
    let (connecting, hello) = Connecting::start(key, shared.node, shared.incarnation, nonce, peer);
    stream.write_all(&encode(&hello)).map_err(io)?;
    stream.set_read_timeout(Some(shared.op_timeout)).map_err(io)?;
    let challenge = read_handshake_frame(stream).map_err(|reason| refused(peer, reason))?;
    let (proof, session) = connecting.finish(&challenge).map_err(|e| refused(peer, e.to_string()))?;
    stream.write_all(&encode(&proof)).map_err(io)?;
    stream.set_read_timeout(None).map_err(io)?;
    Ok((Some(session.sealer), Some(session.opener)))
}

fn refused(peer: NodeId, reason: String) -> FabricError {
    FabricError::Unauthenticated { node: peer, reason }
}

/// Reads one unsealed handshake frame.
fn read_handshake_frame(stream: &mut TcpStream) -> std::result::Result<Frame, String> {
    match read_small_body(stream) {
        Ok(Some(body)) => decode(&body).map_err(|e| format!("a malformed handshake frame: {e}")),
        Ok(None) => {
            Err("the peer closed the connection during the handshake (does it hold this cluster's key?)".into())
        }
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Err("no answer to the handshake in time".into())
        }
        Err(e) => Err(format!("reading the handshake: {e}")),
    }
}

/// Bytes of the largest handshake frame after its length prefix.
const HANDSHAKE_BODY_BYTES_MAX: usize = 96;

/// Reads one frame's body of at most [`HANDSHAKE_BODY_BYTES_MAX`] bytes,
/// unbuffered, so nothing after the handshake is consumed here and an
/// unauthenticated peer cannot make the node read or allocate more.
/// `None` at a clean end of stream before the first byte.
fn read_small_body(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut prefix = [0u8; tierstack_fabric_wire::LENGTH_PREFIX_BYTES];
    let mut filled = 0;
    while filled < prefix.len() {
        match stream.read(&mut prefix[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len > HANDSHAKE_BODY_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a handshake frame of {len} bytes (at most {HANDSHAKE_BODY_BYTES_MAX})"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

/// What the acceptor learnt at set-up.
pub(crate) struct Accepted {
    pub(crate) peer: NodeId,
    pub(crate) sealer: SealState,
    pub(crate) opener: Option<Opener>,
}

/// The acceptor's side of set-up on `stream`, under a read deadline.
/// `Ok(None)`: the connection closed before saying anything (a liveness
/// probe). An error names why the peer was refused.
pub(crate) fn accept(shared: &Shared, stream: &mut TcpStream) -> std::result::Result<Option<Accepted>, String> {
    let io = |e: std::io::Error| e.to_string();
    stream.set_read_timeout(Some(shared.op_timeout)).map_err(io)?;
    let body = match read_small_body(stream) {
        Ok(Some(body)) => body,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("no valid first frame in time: {e}")),
    };
    let first = decode(&body).map_err(|e| format!("a malformed first frame: {e}"))?;
    let accepted = match (&shared.key, first) {
        (None, Frame::Hello { node }) => Accepted { peer: node, sealer: None, opener: None },
        (None, Frame::AuthHello { node, .. }) => {
            return Err(format!("{node} has a cluster key and this node has none: start every node with the same key"))
        }
        (Some(_), Frame::Hello { node }) => {
            return Err(format!("{node} has no cluster key: this cluster requires one"));
        }
        (Some(key), hello @ Frame::AuthHello { .. }) => {
            let nonce = tierstack_secret::random_nonce();
            let (accepting, challenge) =
                Accepting::start(key, shared.node, shared.incarnation, nonce, &hello).map_err(|e| e.to_string())?;
            let claimed = accepting.claimed_peer();
            stream.write_all(&encode(&challenge)).map_err(io)?;
            let proof = read_handshake_frame(stream).map_err(|reason| format!("{claimed}: {reason}"))?;
            let session = accepting.finish(&proof).map_err(|e| format!("{claimed} (claimed): {e}"))?;
            Accepted { peer: session.peer, sealer: Some(session.sealer), opener: Some(session.opener) }
        }
        (_, other) => return Err(format!("the first frame is {}, not a hello", other.kind_name())),
    };
    stream.set_read_timeout(None).map_err(io)?;
    Ok(Some(accepted))
}
