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

/// The connector's side of set-up on a fresh `stream` to `peer`: returns
/// the sealer of its writes and the opener of its reads.
pub(crate) fn connect(shared: &Shared, peer: NodeId, stream: &mut TcpStream) -> Result<(SealState, Option<Opener>)> {
    let io = |e: std::io::Error| FabricError::PeerDead { node: peer, reason: format!("during the handshake: {e}") };
    let Some(key) = &shared.key else {
        stream.write_all(&encode(&Frame::Hello { node: shared.node })).map_err(io)?;
        return Ok((None, None));
    };
    stream.set_read_timeout(Some(shared.op_timeout)).map_err(io)?;
    let session = auth::connect_over(stream, key, shared.node, shared.incarnation, peer)
        .map_err(|e| FabricError::Unauthenticated { node: peer, reason: e.to_string() })?;
    stream.set_read_timeout(None).map_err(io)?;
    Ok((Some(session.sealer), Some(session.opener)))
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
    let first = match auth::read_handshake_frame(stream) {
        Ok(Some(first)) => first,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("no valid first frame: {e}")),
    };
    let accepted = match (&shared.key, first) {
        (None, Frame::Hello { node }) => Accepted { peer: node, sealer: None, opener: None },
        (None, Frame::AuthHello { node, .. }) => {
            return Err(format!("{node} has a cluster key and this node has none: start every node with the same key"))
        }
        (Some(_), Frame::Hello { node }) => {
            return Err(format!("{node} has no cluster key: this cluster requires one"));
        }
        (Some(key), hello @ Frame::AuthHello { node: claimed, .. }) => {
            let session = auth::accept_over(stream, key, shared.node, shared.incarnation, &hello)
                .map_err(|e| format!("{claimed} (claimed): {e}"))?;
            Accepted { peer: session.peer, sealer: Some(session.sealer), opener: Some(session.opener) }
        }
        (_, other) => return Err(format!("the first frame is {}, not a hello", other.kind_name())),
    };
    stream.set_read_timeout(None).map_err(io)?;
    Ok(Some(accepted))
}
