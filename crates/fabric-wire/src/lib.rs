//! The fabric's wire format: length-prefixed binary frames, and nothing else.
//!
//! Every byte stream between two tierstack nodes that is not shared memory —
//! the `tcp` backend's request/response connections and messages — carries
//! a sequence of [`Frame`]s (the `shm` backend's messages travel in
//! shared-memory rings instead, `tierstack_fabric_shm::messages`)
//! encoded here. This crate owns the codec ([`encode`], [`decode`]) and two
//! blocking helpers over `std::io` ([`write_frame`], [`read_frame`]); it opens
//! no sockets and starts no threads. The format is specified field by field
//! in `docs/wire-format.md`.
//!
//! Layout: `len: u32` (the number of bytes that follow it) | `kind: u8` |
//! body. All integers are little-endian; variable-length fields carry their
//! own length in front. A frame is decoded completely or rejected: a decoder
//! never reads past its body, rejects trailing bytes, and never panics on
//! arbitrary input (a property test feeds it random bytes).
//!
//! Transfers that name local registered memory need no frames of their own:
//! an [`Op::WriteFrom`] is encoded as a `Write` whose data is copied straight
//! from its local slice into the frame, and an [`Op::ReadInto`] as a `Read`;
//! a client decodes the answer with [`decode_borrowed`], whose read data
//! still points into the received frame, and copies it straight into the
//! local slice. The owner cannot tell them from plain writes and reads, as
//! an RDMA target cannot tell which local buffer the initiator named.
//!
//! Key choice: **bounded before allocated.** The length prefix is checked
//! against [`FRAME_BYTES_MAX`] before any buffer is allocated, and counts
//! inside a body (ops, results, bytes) only size allocations up to what the
//! remaining body could actually hold, so a hostile peer cannot make a node
//! allocate more than one maximal frame per connection.

pub mod auth;
mod stream;

pub(crate) use stream::read_length_prefix;
pub use stream::{read_frame, read_frame_body, write_frame};

use std::io;
use tierstack_base::limits::{BATCH_OPS_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, FabricError, LocalSlice, Op, OpResult, Rights};

/// Bytes a frame may carry besides transferred data: the kind, request ids,
/// counts, and the per-op headers of a maximal batch (at most 25 bytes each).
pub const FRAME_HEADER_ROOM_BYTES: usize = 64 * 1024;

/// The largest value of a frame's length prefix (the bytes after the prefix).
/// A valid batch moves at most [`TRANSFER_BYTES_MAX`] bytes in total, so every
/// frame a conforming peer sends fits.
pub const FRAME_BYTES_MAX: usize = TRANSFER_BYTES_MAX + FRAME_HEADER_ROOM_BYTES;

/// Bytes of the length prefix in front of every frame.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// `"TSWF"` in little-endian: the first field of a `Hello`, so a connection
/// from something that does not speak this format is refused at once.
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"TSWF");

/// The format version carried in `Hello`. Bump on any incompatible change.
/// Version 3 added the channel byte to `Message` (a version-2 peer would read
/// it as the first byte of the payload's length); version 4 the authenticated
/// handshake (`AuthHello`, `AuthChallenge`, `AuthProof`) and sealed frames.
pub const WIRE_VERSION: u16 = 4;

// Compile-time check: the header room covers a maximal batch of the widest op
// (compare-swap: kind 1 + offset 8 + expected 8 + new 8 = 25 bytes) plus the
// Ops frame's own header (kind 1 + request 8 + region 4 + incarnation 8 + count 4).
const _: () = assert!(FRAME_HEADER_ROOM_BYTES >= 25 + 25 * BATCH_OPS_MAX + auth::TAG_BYTES);
const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);

/// One unit of the wire protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// First frame on every connection of a cluster without a key: who is
    /// connecting (taken on trust: such a cluster is loopback-only).
    Hello { node: NodeId },
    /// First frame on every connection of a cluster with a key: who is
    /// connecting, its process's incarnation and a fresh nonce.
    AuthHello { node: NodeId, incarnation: u64, nonce: [u8; auth::NONCE_BYTES] },
    /// The acceptor's answer to `AuthHello`: who it is, its incarnation and
    /// nonce, and a tag over the whole transcript proving it holds the key.
    AuthChallenge { node: NodeId, incarnation: u64, nonce: [u8; auth::NONCE_BYTES], tag: auth::Tag },
    /// The connector's proof that it holds the key; every frame after it, in
    /// both directions, is sealed ([`auth::Sealer`]).
    AuthProof { tag: auth::Tag },
    /// A two-sided message on `channel`; no reply.
    Message { channel: Channel, payload: Vec<u8> },
    /// Asks for the region registered under `name`.
    Lookup { request: u64, name: String },
    /// Answers a `Lookup`: the region's index at its owner, the incarnation
    /// of the region registered there, and its length.
    LookupOk { request: u64, region: u32, incarnation: u64, len: u64 },
    /// A batch of operations on region `region` (an index from `LookupOk`)
    /// of incarnation `incarnation`; the owner refuses any other incarnation.
    Ops { request: u64, region: u32, incarnation: u64, ops: Vec<Op> },
    /// Answers `Ops`: one result per op, in order.
    OpsOk { request: u64, results: Vec<OpResult> },
    /// Answers a `Lookup` or `Ops` with an error.
    Error { request: u64, error: FabricError },
}

/// Frame kind bytes (the byte after the length prefix).
pub mod kind {
    pub const HELLO: u8 = 1;
    pub const MESSAGE: u8 = 2;
    pub const LOOKUP: u8 = 3;
    pub const LOOKUP_OK: u8 = 4;
    pub const OPS: u8 = 5;
    pub const OPS_OK: u8 = 6;
    pub const ERROR: u8 = 7;
    pub const AUTH_HELLO: u8 = 8;
    pub const AUTH_CHALLENGE: u8 = 9;
    pub const AUTH_PROOF: u8 = 10;
}

/// Op and result tags inside `Ops` and `OpsOk` bodies.
mod op_tag {
    pub(crate) const READ: u8 = 1;
    pub(crate) const WRITE: u8 = 2;
    pub(crate) const FETCH_ADD: u8 = 3;
    pub(crate) const COMPARE_SWAP: u8 = 4;
}

/// `FabricError` variant codes inside `Error` bodies. Every variant has one,
/// so any error a responder produces crosses the wire unchanged.
mod error_code {
    pub(crate) const OUT_OF_BOUNDS: u8 = 1;
    pub(crate) const MISALIGNED: u8 = 2;
    pub(crate) const UNKNOWN_REGION: u8 = 3;
    pub(crate) const UNKNOWN_NODE: u8 = 4;
    pub(crate) const REGION_EXISTS: u8 = 5;
    pub(crate) const INVALID_NAME: u8 = 6;
    pub(crate) const REGION_SIZE: u8 = 7;
    pub(crate) const TOO_MANY_REGIONS: u8 = 8;
    pub(crate) const TRANSFER_TOO_LARGE: u8 = 9;
    pub(crate) const BATCH_SIZE: u8 = 10;
    pub(crate) const TIMEOUT: u8 = 11;
    pub(crate) const PEER_DEAD: u8 = 12;
    pub(crate) const TORN_READ: u8 = 13;
    pub(crate) const PROTOCOL: u8 = 14;
    pub(crate) const RECV_TIMEOUT: u8 = 15;
    pub(crate) const INBOX_FULL: u8 = 16;
    pub(crate) const CLOSED: u8 = 17;
    pub(crate) const IO: u8 = 18;
    pub(crate) const NODE_IN_USE: u8 = 19;
    pub(crate) const UNKNOWN_CHANNEL: u8 = 20;
    // Client-side errors (a responder never sends them), coded like every variant.
    pub(crate) const LOCAL_OUT_OF_BOUNDS: u8 = 21;
    pub(crate) const LOCAL_MISALIGNED: u8 = 22;
    pub(crate) const FORBIDDEN: u8 = 23;
    pub(crate) const UNAUTHENTICATED: u8 = 24;
    pub(crate) const UNSAFE_PATH: u8 = 25;
}

/// Why a frame could not be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The stream or body ended inside a frame.
    #[error("the frame ends before its last field")]
    Truncated,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The length prefix exceeds [`FRAME_BYTES_MAX`]; nothing was allocated.
    #[error("a frame of {len} bytes exceeds the limit of {FRAME_BYTES_MAX}")]
    TooLarge { len: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A `Message` names a channel id at or above `CHANNELS_MAX`.
    #[error("a message on channel {0}, which does not exist")]
    UnknownChannel(u8),
    /// The frame names something that cannot travel: a `WriteFrom` whose
    /// local slice is outside its region, or a result that exists only at a
    /// client (`WrittenFrom`, `ReadInto`).
    #[error("the frame cannot be encoded: {0}")]
    Unencodable(FabricError),
    /// A sealed frame whose tag does not verify: altered, replayed,
    /// reordered, or sealed with another key.
    #[error("a frame failed authentication (altered in flight, replayed, or from a node without the cluster key)")]
    Unauthenticated,
}

// ---------------------------------------------------------------------------
// Encoding

/// Encodes `frame`, length prefix included, ready for one `write_all`.
///
/// Encoding cannot fail; a frame whose body exceeds [`FRAME_BYTES_MAX`] (only
/// possible for a batch or message beyond the fabric's limits) is encoded
/// anyway and rejected by [`write_frame`], [`try_encode`] and every reader.
/// So is a frame that cannot be encoded at all ([`WireError::Unencodable`],
/// which `check_batch` rules out for a client's batches): its length prefix
/// is `u32::MAX`.
pub fn encode(frame: &Frame) -> Vec<u8> {
    encode_checked(frame).unwrap_or_else(|(mut unencodable, _)| {
        unencodable[..LENGTH_PREFIX_BYTES].copy_from_slice(&u32::MAX.to_le_bytes());
        unencodable
    })
}

/// Like [`encode`], but refuses a frame larger than [`FRAME_BYTES_MAX`] or
/// one that cannot be encoded.
pub fn try_encode(frame: &Frame) -> Result<Vec<u8>, WireError> {
    let bytes = encode_checked(frame).map_err(|(_, error)| WireError::Unencodable(error))?;
    let body_len = bytes.len() - LENGTH_PREFIX_BYTES;
    if body_len > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge { len: body_len });
    }
    Ok(bytes)
}

/// The frame, or the partial bytes and why it cannot be encoded.
fn encode_checked(frame: &Frame) -> Result<Vec<u8>, (Vec<u8>, FabricError)> {
    // Room for a seal's tag too, so sealing a large frame never copies it.
    let mut out = Vec::with_capacity(LENGTH_PREFIX_BYTES + body_capacity_hint(frame) + auth::TAG_BYTES);
    out.extend_from_slice(&[0u8; LENGTH_PREFIX_BYTES]);
    if let Err(error) = encode_body(frame, &mut out) {
        return Err((out, error));
    }
    let body_len = out.len() - LENGTH_PREFIX_BYTES;
    let prefix = u32::try_from(body_len).unwrap_or(u32::MAX);
    out[..LENGTH_PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
    Ok(out)
}

fn body_capacity_hint(frame: &Frame) -> usize {
    match frame {
        Frame::Message { payload, .. } => 6 + payload.len(),
        Frame::Lookup { name, .. } => 11 + name.len(),
        Frame::Ops { ops, .. } => {
            25 + ops
                .iter()
                .map(|op| {
                    25 + match op {
                        Op::Write { data, .. } => data.len(),
                        Op::WriteFrom { source, .. } => source.len() as usize,
                        _ => 0,
                    }
                })
                .sum::<usize>()
        }
        Frame::OpsOk { results, .. } => {
            13 + results.iter().map(|r| 9 + if let OpResult::Read(data) = r { data.len() } else { 0 }).sum::<usize>()
        }
        _ => 64,
    }
}

fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// A `u32` count or length; saturates (the frame is then over the limit anyway).
fn put_len(out: &mut Vec<u8>, len: usize) {
    put_u32(out, u32::try_from(len).unwrap_or(u32::MAX));
}
fn put_bytes(out: &mut Vec<u8>, data: &[u8]) {
    put_len(out, data.len());
    out.extend_from_slice(data);
}
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}
fn put_usize(out: &mut Vec<u8>, v: usize) {
    put_u64(out, v as u64);
}

/// Fails only for what cannot travel at all ([`WireError::Unencodable`]).
fn encode_body(frame: &Frame, out: &mut Vec<u8>) -> Result<(), FabricError> {
    match frame {
        Frame::Hello { node } => {
            put_u8(out, kind::HELLO);
            put_u32(out, HELLO_MAGIC);
            put_u16(out, WIRE_VERSION);
            put_u32(out, node.0);
        }
        Frame::AuthHello { node, incarnation, nonce } => {
            put_u8(out, kind::AUTH_HELLO);
            put_u32(out, HELLO_MAGIC);
            put_u16(out, WIRE_VERSION);
            put_u32(out, node.0);
            put_u64(out, *incarnation);
            out.extend_from_slice(nonce);
        }
        Frame::AuthChallenge { node, incarnation, nonce, tag } => {
            put_u8(out, kind::AUTH_CHALLENGE);
            put_u32(out, node.0);
            put_u64(out, *incarnation);
            out.extend_from_slice(nonce);
            out.extend_from_slice(tag);
        }
        Frame::AuthProof { tag } => {
            put_u8(out, kind::AUTH_PROOF);
            out.extend_from_slice(tag);
        }
        Frame::Message { channel, payload } => {
            put_u8(out, kind::MESSAGE);
            put_u8(out, channel.id());
            put_bytes(out, payload);
        }
        Frame::Lookup { request, name } => {
            put_u8(out, kind::LOOKUP);
            put_u64(out, *request);
            // Region names are at most 64 bytes; a longer one is sent truncated
            // to the u16 length field's reach and refused by the owner.
            let name = &name.as_bytes()[..name.len().min(usize::from(u16::MAX))];
            put_u16(out, u16::try_from(name.len()).unwrap_or(u16::MAX));
            out.extend_from_slice(name);
        }
        Frame::LookupOk { request, region, incarnation, len } => {
            put_u8(out, kind::LOOKUP_OK);
            put_u64(out, *request);
            put_u32(out, *region);
            put_u64(out, *incarnation);
            put_u64(out, *len);
        }
        Frame::Ops { request, region, incarnation, ops } => {
            put_u8(out, kind::OPS);
            put_u64(out, *request);
            put_u32(out, *region);
            put_u64(out, *incarnation);
            put_len(out, ops.len());
            for op in ops {
                encode_op(op, out)?;
            }
        }
        Frame::OpsOk { request, results } => {
            put_u8(out, kind::OPS_OK);
            put_u64(out, *request);
            put_len(out, results.len());
            for result in results {
                encode_result(result, out)?;
            }
        }
        Frame::Error { request, error } => {
            put_u8(out, kind::ERROR);
            put_u64(out, *request);
            encode_error(error, out);
        }
    }
    Ok(())
}

fn encode_op(op: &Op, out: &mut Vec<u8>) -> Result<(), FabricError> {
    match op {
        Op::Read { offset, len } => {
            put_u8(out, op_tag::READ);
            put_u64(out, *offset);
            put_u32(out, *len);
        }
        Op::Write { offset, data } => {
            put_u8(out, op_tag::WRITE);
            put_u64(out, *offset);
            put_bytes(out, data);
        }
        // A write whose data is copied from the local region into the frame.
        Op::WriteFrom { offset, source } => {
            put_u8(out, op_tag::WRITE);
            put_u64(out, *offset);
            put_local_slice(out, source)?;
        }
        // Only the client knows where the answer's bytes go.
        Op::ReadInto { offset, target } => {
            put_u8(out, op_tag::READ);
            put_u64(out, *offset);
            put_u32(out, target.len());
        }
        Op::FetchAdd { offset, delta } => {
            put_u8(out, op_tag::FETCH_ADD);
            put_u64(out, *offset);
            put_u64(out, *delta);
        }
        Op::CompareSwap { offset, expected, new } => {
            put_u8(out, op_tag::COMPARE_SWAP);
            put_u64(out, *offset);
            put_u64(out, *expected);
            put_u64(out, *new);
        }
    }
    Ok(())
}

/// A `bytes` field filled straight from `slice`'s region: the one copy of a
/// `WriteFrom`'s data on the client.
fn put_local_slice(out: &mut Vec<u8>, slice: &LocalSlice) -> Result<(), FabricError> {
    slice.check_bounds()?;
    put_u32(out, slice.len());
    let start = out.len();
    out.resize(start + slice.len() as usize, 0);
    slice.region().memory().read(slice.offset(), &mut out[start..])
}

fn encode_result(result: &OpResult, out: &mut Vec<u8>) -> Result<(), FabricError> {
    match result {
        OpResult::Read(data) => {
            put_u8(out, op_tag::READ);
            put_bytes(out, data);
        }
        OpResult::Written => put_u8(out, op_tag::WRITE),
        OpResult::FetchAdd(previous) => {
            put_u8(out, op_tag::FETCH_ADD);
            put_u64(out, *previous);
        }
        OpResult::CompareSwap(previous) => {
            put_u8(out, op_tag::COMPARE_SWAP);
            put_u64(out, *previous);
        }
        OpResult::WrittenFrom | OpResult::ReadInto => {
            return Err(FabricError::Io(format!(
                "{result:?} is a client-side result; an owner answers Written or Read"
            )))
        }
    }
    Ok(())
}

fn encode_error(error: &FabricError, out: &mut Vec<u8>) {
    use error_code as c;
    match error {
        FabricError::OutOfBounds { region, offset, len, region_len } => {
            put_u8(out, c::OUT_OF_BOUNDS);
            put_str(out, region);
            put_u64(out, *offset);
            put_u64(out, *len);
            put_u64(out, *region_len);
        }
        FabricError::Misaligned { offset } => {
            put_u8(out, c::MISALIGNED);
            put_u64(out, *offset);
        }
        FabricError::LocalOutOfBounds { region, offset, len, region_len } => {
            put_u8(out, c::LOCAL_OUT_OF_BOUNDS);
            put_str(out, region);
            put_u64(out, *offset);
            put_u64(out, *len);
            put_u64(out, *region_len);
        }
        FabricError::LocalMisaligned { local_offset, remote_offset } => {
            put_u8(out, c::LOCAL_MISALIGNED);
            put_u64(out, *local_offset);
            put_u64(out, *remote_offset);
        }
        FabricError::UnknownRegion { node, name } => {
            put_u8(out, c::UNKNOWN_REGION);
            put_u32(out, node.0);
            put_str(out, name);
        }
        FabricError::UnknownNode { node } => {
            put_u8(out, c::UNKNOWN_NODE);
            put_u32(out, node.0);
        }
        FabricError::RegionExists { name } => {
            put_u8(out, c::REGION_EXISTS);
            put_str(out, name);
        }
        FabricError::InvalidName { name, reason } => {
            put_u8(out, c::INVALID_NAME);
            put_str(out, name);
            put_str(out, reason);
        }
        FabricError::RegionSize { bytes, max } => {
            put_u8(out, c::REGION_SIZE);
            put_u64(out, *bytes);
            put_u64(out, *max);
        }
        FabricError::TooManyRegions { max } => {
            put_u8(out, c::TOO_MANY_REGIONS);
            put_usize(out, *max);
        }
        FabricError::TransferTooLarge { len } => {
            put_u8(out, c::TRANSFER_TOO_LARGE);
            put_usize(out, *len);
        }
        FabricError::BatchSize { ops, max } => {
            put_u8(out, c::BATCH_SIZE);
            put_usize(out, *ops);
            put_usize(out, *max);
        }
        FabricError::Timeout { node, timeout_ms } => {
            put_u8(out, c::TIMEOUT);
            put_u32(out, node.0);
            put_u64(out, *timeout_ms);
        }
        FabricError::PeerDead { node, reason } => {
            put_u8(out, c::PEER_DEAD);
            put_u32(out, node.0);
            put_str(out, reason);
        }
        FabricError::TornRead { offset, retries } => {
            put_u8(out, c::TORN_READ);
            put_u64(out, *offset);
            put_u32(out, *retries);
        }
        FabricError::Protocol { node, reason } => {
            put_u8(out, c::PROTOCOL);
            put_u32(out, node.0);
            put_str(out, reason);
        }
        FabricError::RecvTimeout { timeout_ms } => {
            put_u8(out, c::RECV_TIMEOUT);
            put_u64(out, *timeout_ms);
        }
        FabricError::InboxFull { node } => {
            put_u8(out, c::INBOX_FULL);
            put_u32(out, node.0);
        }
        FabricError::Closed => put_u8(out, c::CLOSED),
        FabricError::NodeInUse { node, pid } => {
            put_u8(out, c::NODE_IN_USE);
            put_u32(out, node.0);
            put_u32(out, *pid);
        }
        FabricError::Io(message) => {
            put_u8(out, c::IO);
            put_str(out, message);
        }
        FabricError::UnknownChannel { channel } => {
            put_u8(out, c::UNKNOWN_CHANNEL);
            put_u8(out, *channel);
        }
        FabricError::Forbidden { node, region, needed, granted } => {
            put_u8(out, c::FORBIDDEN);
            put_u32(out, node.0);
            put_str(out, region);
            put_u8(out, needed.bits());
            put_u8(out, granted.bits());
        }
        FabricError::Unauthenticated { node, reason } => {
            put_u8(out, c::UNAUTHENTICATED);
            put_u32(out, node.0);
            put_str(out, reason);
        }
        FabricError::UnsafePath { path, reason } => {
            put_u8(out, c::UNSAFE_PATH);
            put_str(out, path);
            put_str(out, reason);
        }
    }
}

// ---------------------------------------------------------------------------
// Decoding

/// Decodes one frame from `body`: the bytes after the length prefix (kind
/// byte first). The whole body must be consumed.
fn check_magic_and_version(cur: &mut Cursor<'_>) -> Result<(), WireError> {
    let magic = cur.u32()?;
    if magic != HELLO_MAGIC {
        return Err(WireError::Malformed(format!("hello magic {magic:#010x}, expected {HELLO_MAGIC:#010x}")));
    }
    let version = cur.u16()?;
    if version != WIRE_VERSION {
        return Err(WireError::Malformed(format!("wire version {version}, expected {WIRE_VERSION}")));
    }
    Ok(())
}

pub fn decode(body: &[u8]) -> Result<Frame, WireError> {
    if body.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge { len: body.len() });
    }
    let mut cur = Cursor { buf: body };
    let frame = match cur.u8()? {
        kind::HELLO => {
            check_magic_and_version(&mut cur)?;
            Frame::Hello { node: NodeId(cur.u32()?) }
        }
        kind::AUTH_HELLO => {
            check_magic_and_version(&mut cur)?;
            Frame::AuthHello { node: NodeId(cur.u32()?), incarnation: cur.u64()?, nonce: cur.array()? }
        }
        kind::AUTH_CHALLENGE => Frame::AuthChallenge {
            node: NodeId(cur.u32()?),
            incarnation: cur.u64()?,
            nonce: cur.array()?,
            tag: cur.array()?,
        },
        kind::AUTH_PROOF => Frame::AuthProof { tag: cur.array()? },
        kind::MESSAGE => {
            let id = cur.u8()?;
            let channel = Channel::new(id).map_err(|_| WireError::UnknownChannel(id))?;
            Frame::Message { channel, payload: cur.bytes()? }
        }
        kind::LOOKUP => {
            let request = cur.u64()?;
            let len = usize::from(cur.u16()?);
            let name = cur.take(len)?;
            let name = std::str::from_utf8(name)
                .map_err(|_| WireError::Malformed("region name is not UTF-8".to_string()))?
                .to_string();
            Frame::Lookup { request, name }
        }
        kind::LOOKUP_OK => {
            Frame::LookupOk { request: cur.u64()?, region: cur.u32()?, incarnation: cur.u64()?, len: cur.u64()? }
        }
        kind::OPS => {
            let request = cur.u64()?;
            let region = cur.u32()?;
            let incarnation = cur.u64()?;
            let count = cur.count(MIN_OP_BYTES)?;
            let mut ops = Vec::with_capacity(count);
            for _ in 0..count {
                ops.push(decode_op(&mut cur)?);
            }
            Frame::Ops { request, region, incarnation, ops }
        }
        kind::OPS_OK => {
            let (request, results) = decode_ops_ok(&mut cur)?;
            Frame::OpsOk { request, results: results.into_iter().map(ResultRef::into_owned).collect() }
        }
        kind::ERROR => Frame::Error { request: cur.u64()?, error: decode_error(&mut cur)? },
        other => return Err(WireError::UnknownKind(other)),
    };
    if !cur.buf.is_empty() {
        return Err(WireError::Malformed(format!("{} trailing bytes after the frame", cur.buf.len())));
    }
    Ok(frame)
}

/// The smallest encoded op (a read: tag 1 + offset 8 + len 4).
const MIN_OP_BYTES: usize = 13;
/// The smallest encoded result (`Written`: the tag alone).
const MIN_RESULT_BYTES: usize = 1;

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn usize(&mut self) -> Result<usize, WireError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| WireError::Malformed(format!("{v} does not fit this platform's usize")))
    }
    fn node(&mut self) -> Result<NodeId, WireError> {
        Ok(NodeId(self.u32()?))
    }

    /// A `u32` element count; each element needs at least `min_bytes`, so a
    /// count the remaining body cannot hold is `Truncated`, not an allocation.
    fn count(&mut self, min_bytes: usize) -> Result<usize, WireError> {
        let count = self.u32()? as usize;
        if count.saturating_mul(min_bytes) > self.buf.len() {
            return Err(WireError::Truncated);
        }
        Ok(count)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?).map_err(|_| WireError::Malformed("string is not UTF-8".to_string()))
    }
}

fn decode_op(cur: &mut Cursor<'_>) -> Result<Op, WireError> {
    Ok(match cur.u8()? {
        op_tag::READ => Op::Read { offset: cur.u64()?, len: cur.u32()? },
        op_tag::WRITE => Op::Write { offset: cur.u64()?, data: cur.bytes()? },
        op_tag::FETCH_ADD => Op::FetchAdd { offset: cur.u64()?, delta: cur.u64()? },
        op_tag::COMPARE_SWAP => Op::CompareSwap { offset: cur.u64()?, expected: cur.u64()?, new: cur.u64()? },
        other => return Err(WireError::Malformed(format!("unknown op tag {other}"))),
    })
}

/// The body of an `OpsOk` after its kind byte, read data borrowed.
fn decode_ops_ok<'a>(cur: &mut Cursor<'a>) -> Result<(u64, Vec<ResultRef<'a>>), WireError> {
    let request = cur.u64()?;
    let count = cur.count(MIN_RESULT_BYTES)?;
    let mut results = Vec::with_capacity(count);
    for _ in 0..count {
        results.push(decode_result(cur)?);
    }
    Ok((request, results))
}

fn decode_result<'a>(cur: &mut Cursor<'a>) -> Result<ResultRef<'a>, WireError> {
    Ok(match cur.u8()? {
        op_tag::READ => {
            let len = cur.u32()? as usize;
            ResultRef::Read(cur.take(len)?)
        }
        op_tag::WRITE => ResultRef::Written,
        op_tag::FETCH_ADD => ResultRef::FetchAdd(cur.u64()?),
        op_tag::COMPARE_SWAP => ResultRef::CompareSwap(cur.u64()?),
        other => return Err(WireError::Malformed(format!("unknown result tag {other}"))),
    })
}

/// One result of an `OpsOk`, as it lies in the received frame: a read's
/// data is borrowed from the frame's body, so a client can copy it straight
/// to where it belongs (a `ReadInto`'s local slice) with no `Vec` between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultRef<'a> {
    Read(&'a [u8]),
    Written,
    FetchAdd(u64),
    CompareSwap(u64),
}

impl ResultRef<'_> {
    /// The owned result (a read's data copied into a `Vec`).
    pub fn into_owned(self) -> OpResult {
        match self {
            ResultRef::Read(data) => OpResult::Read(data.to_vec()),
            ResultRef::Written => OpResult::Written,
            ResultRef::FetchAdd(previous) => OpResult::FetchAdd(previous),
            ResultRef::CompareSwap(previous) => OpResult::CompareSwap(previous),
        }
    }
}

/// A frame decoded by [`decode_borrowed`]: an `OpsOk` with its results still
/// in the frame's body, or any other frame, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BorrowedFrame<'a> {
    OpsOk { request: u64, results: Vec<ResultRef<'a>> },
    Owned(Frame),
}

/// Decodes one frame from `body` as [`decode`] does (same checks, same
/// errors), except that an `OpsOk`'s read data stays borrowed from `body`.
pub fn decode_borrowed(body: &[u8]) -> Result<BorrowedFrame<'_>, WireError> {
    if body.first() != Some(&kind::OPS_OK) {
        return decode(body).map(BorrowedFrame::Owned);
    }
    if body.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge { len: body.len() });
    }
    let mut cur = Cursor { buf: &body[1..] };
    let (request, results) = decode_ops_ok(&mut cur)?;
    if !cur.buf.is_empty() {
        return Err(WireError::Malformed(format!("{} trailing bytes after the frame", cur.buf.len())));
    }
    Ok(BorrowedFrame::OpsOk { request, results })
}

fn decode_error(cur: &mut Cursor<'_>) -> Result<FabricError, WireError> {
    use error_code as c;
    Ok(match cur.u8()? {
        c::OUT_OF_BOUNDS => FabricError::OutOfBounds {
            region: cur.string()?,
            offset: cur.u64()?,
            len: cur.u64()?,
            region_len: cur.u64()?,
        },
        c::MISALIGNED => FabricError::Misaligned { offset: cur.u64()? },
        c::LOCAL_OUT_OF_BOUNDS => FabricError::LocalOutOfBounds {
            region: cur.string()?,
            offset: cur.u64()?,
            len: cur.u64()?,
            region_len: cur.u64()?,
        },
        c::LOCAL_MISALIGNED => FabricError::LocalMisaligned { local_offset: cur.u64()?, remote_offset: cur.u64()? },
        c::UNKNOWN_REGION => FabricError::UnknownRegion { node: cur.node()?, name: cur.string()? },
        c::UNKNOWN_NODE => FabricError::UnknownNode { node: cur.node()? },
        c::REGION_EXISTS => FabricError::RegionExists { name: cur.string()? },
        c::INVALID_NAME => FabricError::InvalidName { name: cur.string()?, reason: cur.string()? },
        c::REGION_SIZE => FabricError::RegionSize { bytes: cur.u64()?, max: cur.u64()? },
        c::TOO_MANY_REGIONS => FabricError::TooManyRegions { max: cur.usize()? },
        c::TRANSFER_TOO_LARGE => FabricError::TransferTooLarge { len: cur.usize()? },
        c::BATCH_SIZE => FabricError::BatchSize { ops: cur.usize()?, max: cur.usize()? },
        c::TIMEOUT => FabricError::Timeout { node: cur.node()?, timeout_ms: cur.u64()? },
        c::PEER_DEAD => FabricError::PeerDead { node: cur.node()?, reason: cur.string()? },
        c::TORN_READ => FabricError::TornRead { offset: cur.u64()?, retries: cur.u32()? },
        c::PROTOCOL => FabricError::Protocol { node: cur.node()?, reason: cur.string()? },
        c::RECV_TIMEOUT => FabricError::RecvTimeout { timeout_ms: cur.u64()? },
        c::INBOX_FULL => FabricError::InboxFull { node: cur.node()? },
        c::CLOSED => FabricError::Closed,
        c::IO => FabricError::Io(cur.string()?),
        c::NODE_IN_USE => FabricError::NodeInUse { node: cur.node()?, pid: cur.u32()? },
        c::UNKNOWN_CHANNEL => FabricError::UnknownChannel { channel: cur.u8()? },
        c::FORBIDDEN => FabricError::Forbidden {
            node: cur.node()?,
            region: cur.string()?,
            needed: Rights::from_bits(cur.u8()?),
            granted: Rights::from_bits(cur.u8()?),
        },
        c::UNAUTHENTICATED => FabricError::Unauthenticated { node: cur.node()?, reason: cur.string()? },
        c::UNSAFE_PATH => FabricError::UnsafePath { path: cur.string()?, reason: cur.string()? },
        other => return Err(WireError::Malformed(format!("unknown error code {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_layout_is_as_documented() {
        let bytes = encode(&Frame::Hello { node: NodeId(0x0102_0304) });
        assert_eq!(
            bytes,
            vec![11, 0, 0, 0, kind::HELLO, b'T', b'S', b'W', b'F', 4, 0, 4, 3, 2, 1],
            "len | kind | magic | version | node, all little-endian"
        );
    }

    #[test]
    fn fetch_add_ops_layout_is_as_documented() {
        let frame = Frame::Ops {
            request: 7,
            region: 2,
            incarnation: 0x0102_0304_0506_0708,
            ops: vec![Op::FetchAdd { offset: 8, delta: 1 }],
        };
        let bytes = encode(&frame);
        let mut expected = vec![];
        expected.extend_from_slice(&(1u32 + 8 + 4 + 8 + 4 + 1 + 8 + 8).to_le_bytes());
        expected.push(kind::OPS);
        expected.extend_from_slice(&7u64.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        expected.extend_from_slice(&1u32.to_le_bytes());
        expected.push(op_tag::FETCH_ADD);
        expected.extend_from_slice(&8u64.to_le_bytes());
        expected.extend_from_slice(&1u64.to_le_bytes());
        assert_eq!(bytes, expected);
    }

    #[test]
    fn message_layout_is_as_documented() {
        let bytes = encode(&Frame::Message { channel: Channel::MONITOR, payload: vec![0xaa, 0xbb] });
        assert_eq!(
            bytes,
            vec![8, 0, 0, 0, kind::MESSAGE, Channel::MONITOR.id(), 2, 0, 0, 0, 0xaa, 0xbb],
            "len | kind | channel | payload length | payload"
        );
    }

    #[test]
    fn a_message_on_a_channel_out_of_range_is_refused() {
        let mut body = encode(&Frame::Message { channel: Channel::TEST, payload: b"x".to_vec() });
        for id in [tierstack_base::limits::CHANNELS_MAX as u8, 200, u8::MAX] {
            body[LENGTH_PREFIX_BYTES + 1] = id;
            assert!(matches!(decode(&body[LENGTH_PREFIX_BYTES..]), Err(WireError::UnknownChannel(i)) if i == id));
            let mut stream: &[u8] = &body;
            assert!(matches!(read_frame(&mut stream), Err(WireError::UnknownChannel(i)) if i == id));
        }
        let last = Channel::new(tierstack_base::limits::CHANNELS_MAX as u8 - 1).unwrap();
        body[LENGTH_PREFIX_BYTES + 1] = last.id();
        assert_eq!(
            decode(&body[LENGTH_PREFIX_BYTES..]).unwrap(),
            Frame::Message { channel: last, payload: b"x".to_vec() }
        );
    }

    #[test]
    fn oversized_prefix_is_rejected_before_reading_the_body() {
        let len = (FRAME_BYTES_MAX + 1) as u32;
        let mut stream: &[u8] = &len.to_le_bytes();
        assert!(matches!(read_frame(&mut stream), Err(WireError::TooLarge { len: l }) if l == FRAME_BYTES_MAX + 1));
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        // An Ops frame that claims u32::MAX ops in a 28-byte body.
        let mut body = vec![kind::OPS];
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&body), Err(WireError::Truncated)));
    }

    #[test]
    fn eof_handling() {
        let mut empty: &[u8] = &[];
        assert!(matches!(read_frame(&mut empty), Ok(None)), "clean EOF before a frame");
        let mut half_prefix: &[u8] = &[3, 0];
        assert!(matches!(read_frame(&mut half_prefix), Err(WireError::Truncated)));
        let full = encode(&Frame::Message { channel: Channel::TEST, payload: vec![1, 2, 3] });
        let mut cut: &[u8] = &full[..full.len() - 1];
        assert!(matches!(read_frame(&mut cut), Err(WireError::Truncated)));
        let mut zero: &[u8] = &[0, 0, 0, 0];
        assert!(matches!(read_frame(&mut zero), Err(WireError::Malformed(_))));
    }

    #[test]
    fn trailing_bytes_and_unknown_tags_are_rejected() {
        let mut bytes = encode(&Frame::LookupOk { request: 1, region: 2, incarnation: 4, len: 3 });
        bytes.push(0);
        assert!(matches!(decode(&bytes[LENGTH_PREFIX_BYTES..]), Err(WireError::Malformed(_))));
        assert!(matches!(decode(&[99]), Err(WireError::UnknownKind(99))));
        assert!(matches!(decode(&[]), Err(WireError::Truncated)));
        let mut bad_hello = encode(&Frame::Hello { node: NodeId(1) });
        bad_hello[LENGTH_PREFIX_BYTES + 1] ^= 0xff;
        assert!(matches!(decode(&bad_hello[LENGTH_PREFIX_BYTES..]), Err(WireError::Malformed(_))));
    }

    #[test]
    fn write_frame_refuses_oversized_frames() {
        let frame = Frame::Message { channel: Channel::TEST, payload: vec![0u8; FRAME_BYTES_MAX] };
        let mut sink = Vec::new();
        let err = write_frame(&mut sink, &frame).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(sink.is_empty(), "nothing is written");
    }
}
