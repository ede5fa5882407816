//! The bootstrap protocol: what two nodes exchange over TCP, on each node's
//! topology address, before UCX can carry anything between them (UCX needs
//! the peer's worker address to make an endpoint, and a packed remote key to
//! reach a region). Specified in `docs/wire-format.md` ("ucx bootstrap").
//!
//! Every frame is a little-endian `u32` length (of what follows, at most
//! [`FRAME_BYTES_MAX`]) and a body whose first byte is its kind:
//!
//! | kind | direction | body after the kind byte |
//! |---|---|---|
//! | `HELLO` 1 | client → server | `node: u32`, the client's worker address (rest) |
//! | `WELCOME` 2 | server → client | the server's worker address (rest) |
//! | `LOOKUP` 3 | client → server | `node: u32` (the client), the region name, UTF-8 (rest) |
//! | `REGION` 4 | server → client | `len: u64`, `base: u64`, `rights: u8` (the client's), packed rkey (rest; empty without rights) |
//! | `NO_REGION` 5 | server → client | nothing |
//! | `BYE` 6 | either way on a hello connection | nothing: the sender is closing its node |
//! | `REFUSED` 7 | server → client | a UTF-8 reason (rest) |
//!
//! A `HELLO` connection stays open for the two nodes' lifetime and is their
//! liveness watch: it carries nothing more until one side sends `BYE` (the
//! other answers `BYE`) or the connection breaks; either way the other node
//! is then dead for this side (see the crate docs). A `LOOKUP` connection
//! carries one request and its answer.
//!
//! **With a cluster key** every bootstrap connection first runs the fabric's
//! mutual handshake (`tierstack_fabric_wire::auth`: `AuthHello`,
//! `AuthChallenge`, `AuthProof`, in the fabric's frame format), and every
//! bootstrap frame after it is sealed with the session's tag ([`Conn`]);
//! the node ids in `HELLO` and `LOOKUP` must then be the one the handshake
//! proved. So a worker address or a remote key is handed out only to a peer
//! that holds the key, and a forged `BYE` cannot mark a live peer dead.

use std::io::{Read, Write};
use tierstack_fabric_wire::auth::{Opener, Sealer, Session, TAG_BYTES};

pub const HELLO: u8 = 1;
pub const WELCOME: u8 = 2;
pub const LOOKUP: u8 = 3;
pub const REGION: u8 = 4;
pub const NO_REGION: u8 = 5;
pub const BYE: u8 = 6;
pub const REFUSED: u8 = 7;

/// Largest frame body: worker addresses and packed keys are a few hundred
/// bytes to a few KiB (more with many transports); 64 KiB bounds a bad peer.
pub const FRAME_BYTES_MAX: usize = 64 * 1024;

/// A decoded bootstrap frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello { node: u32, address: Vec<u8> },
    Welcome { address: Vec<u8> },
    Lookup { node: u32, name: String },
    Region { len: u64, base: u64, rights: u8, rkey: Vec<u8> },
    NoRegion,
    Bye,
    Refused { reason: String },
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum BootstrapError {
    Io(std::io::Error),
    Malformed(String),
}

impl std::error::Error for BootstrapError {}

impl std::fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootstrapError::Io(e) => write!(f, "bootstrap I/O: {e}"),
            BootstrapError::Malformed(reason) => write!(f, "malformed bootstrap frame: {reason}"),
        }
    }
}

impl From<std::io::Error> for BootstrapError {
    fn from(e: std::io::Error) -> Self {
        BootstrapError::Io(e)
    }
}

impl Frame {
    /// The frame as bytes on the wire (length prefix included).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        match self {
            Frame::Hello { node, address } => {
                body.push(HELLO);
                body.extend_from_slice(&node.to_le_bytes());
                body.extend_from_slice(address);
            }
            Frame::Welcome { address } => {
                body.push(WELCOME);
                body.extend_from_slice(address);
            }
            Frame::Lookup { node, name } => {
                body.push(LOOKUP);
                body.extend_from_slice(&node.to_le_bytes());
                body.extend_from_slice(name.as_bytes());
            }
            Frame::Region { len, base, rights, rkey } => {
                body.push(REGION);
                body.extend_from_slice(&len.to_le_bytes());
                body.extend_from_slice(&base.to_le_bytes());
                body.push(*rights);
                body.extend_from_slice(rkey);
            }
            Frame::NoRegion => body.push(NO_REGION),
            Frame::Bye => body.push(BYE),
            Frame::Refused { reason } => {
                body.push(REFUSED);
                body.extend_from_slice(reason.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(4 + body.len());
        // Bodies we build are far below u32::MAX (addresses, keys, names).
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes one body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Frame, BootstrapError> {
        let bad = |why: &str| BootstrapError::Malformed(why.to_string());
        let (&kind, rest) = body.split_first().ok_or_else(|| bad("empty frame"))?;
        let u32_at = |b: &[u8]| -> Result<u32, BootstrapError> {
            b.get(..4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes).ok_or_else(|| bad("short frame"))
        };
        let u64_at = |b: &[u8]| -> Result<u64, BootstrapError> {
            b.get(..8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes).ok_or_else(|| bad("short frame"))
        };
        Ok(match kind {
            HELLO => Frame::Hello { node: u32_at(rest)?, address: rest[4..].to_vec() },
            WELCOME => Frame::Welcome { address: rest.to_vec() },
            LOOKUP => {
                let node = u32_at(rest)?;
                let name = String::from_utf8(rest[4..].to_vec()).map_err(|_| bad("region name is not UTF-8"))?;
                Frame::Lookup { node, name }
            }
            REGION => {
                let len = u64_at(rest)?;
                let base = u64_at(rest.get(8..).unwrap_or_default())?;
                let rights = *rest.get(16).ok_or_else(|| bad("short frame"))?;
                Frame::Region { len, base, rights, rkey: rest[17..].to_vec() }
            }
            NO_REGION if rest.is_empty() => Frame::NoRegion,
            BYE if rest.is_empty() => Frame::Bye,
            REFUSED => Frame::Refused { reason: String::from_utf8_lossy(rest).into_owned() },
            other => return Err(BootstrapError::Malformed(format!("unknown kind {other} or trailing bytes"))),
        })
    }
}

/// One bootstrap connection, sealed when the cluster has a key.
pub struct Conn {
    pub stream: std::net::TcpStream,
    sealer: Option<Sealer>,
    opener: Option<Opener>,
}

impl Conn {
    /// A connection of a cluster without a key.
    pub fn plain(stream: std::net::TcpStream) -> Self {
        Self { stream, sealer: None, opener: None }
    }

    /// A connection whose handshake gave `session`.
    pub fn sealed(stream: std::net::TcpStream, session: Session) -> Self {
        Self { stream, sealer: Some(session.sealer), opener: Some(session.opener) }
    }

    /// Writes one frame (sealed when keyed).
    pub fn send(&mut self, frame: &Frame) -> std::io::Result<()> {
        let mut bytes = frame.encode();
        if let Some(sealer) = &mut self.sealer {
            sealer
                .seal(&mut bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        }
        self.stream.write_all(&bytes)?;
        self.stream.flush()
    }

    /// Reads one frame (verifying its seal when keyed); `Ok(None)` on a
    /// clean end of stream before a frame.
    pub fn recv(&mut self) -> Result<Option<Frame>, BootstrapError> {
        let Some(opener) = &mut self.opener else { return read_frame(&mut self.stream) };
        let Some(sealed) = read_body(&mut self.stream, FRAME_BYTES_MAX + TAG_BYTES)? else { return Ok(None) };
        let body = opener.open(&sealed).map_err(|e| BootstrapError::Malformed(e.to_string()))?;
        Frame::decode(body).map(Some)
    }
}

/// Writes one frame.
pub fn write_frame(stream: &mut impl Write, frame: &Frame) -> std::io::Result<()> {
    stream.write_all(&frame.encode())?;
    stream.flush()
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a frame.
pub fn read_frame(stream: &mut impl Read) -> Result<Option<Frame>, BootstrapError> {
    match read_body(stream, FRAME_BYTES_MAX)? {
        Some(body) => Frame::decode(&body).map(Some),
        None => Ok(None),
    }
}

/// Reads one length-prefixed body of at most `max` bytes, checked before allocating.
fn read_body(stream: &mut impl Read, max: usize) -> Result<Option<Vec<u8>>, BootstrapError> {
    let mut prefix = [0u8; 4];
    match stream.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len > max {
        return Err(BootstrapError::Malformed(format!("frame length {len} is not between 1 and {max}")));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame() -> impl Strategy<Value = Frame> {
        let bytes = proptest::collection::vec(any::<u8>(), 0..300);
        prop_oneof![
            (any::<u32>(), bytes.clone()).prop_map(|(node, address)| Frame::Hello { node, address }),
            bytes.clone().prop_map(|address| Frame::Welcome { address }),
            (any::<u32>(), "[a-z0-9._-]{0,64}").prop_map(|(node, name)| Frame::Lookup { node, name }),
            (any::<u64>(), any::<u64>(), any::<u8>(), bytes).prop_map(|(len, base, rights, rkey)| Frame::Region {
                len,
                base,
                rights,
                rkey
            }),
            Just(Frame::NoRegion),
            Just(Frame::Bye),
            "[ -~]{0,40}".prop_map(|reason| Frame::Refused { reason }),
        ]
    }

    proptest! {
        #[test]
        fn frames_round_trip(f in frame()) {
            let bytes = f.encode();
            let back = read_frame(&mut &bytes[..]).unwrap();
            prop_assert_eq!(back, Some(f));
        }

        #[test]
        fn garbage_is_an_error_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_frame(&mut &bytes[..]);
        }
    }

    #[test]
    fn oversized_and_empty_frames_are_refused() {
        let huge = ((FRAME_BYTES_MAX + 1) as u32).to_le_bytes();
        assert!(matches!(read_frame(&mut &huge[..]), Err(BootstrapError::Malformed(_))));
        let empty = 0u32.to_le_bytes();
        assert!(matches!(read_frame(&mut &empty[..]), Err(BootstrapError::Malformed(_))));
        assert!(matches!(read_frame(&mut &[][..]), Ok(None)));
        let short_region = [5u8, 0, 0, 0, REGION, 1, 2, 3, 4];
        assert!(matches!(read_frame(&mut &short_region[..]), Err(BootstrapError::Malformed(_))));
    }
}
