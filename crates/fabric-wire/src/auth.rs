//! The authenticated handshake and sealed frames of a cluster with a key.
//!
//! Every node of a cluster holds the cluster key
//! ([`tierstack_secret::ClusterKey`]). A connection proves, both ways, that
//! each end holds it, and binds what each end says of itself (node id,
//! process incarnation) to the proof:
//!
//! ```text
//! connector → acceptor  AuthHello     { node c, incarnation ic, nonce nc }
//! acceptor  → connector AuthChallenge { node a, incarnation ia, nonce na,
//!                                       tag = MAC(kh, "acceptor"  ‖ T) }
//! connector → acceptor  AuthProof     { tag = MAC(kh, "connector" ‖ T) }
//!   T = c ‖ ic ‖ nc ‖ a ‖ ia ‖ na  (the transcript)
//! ```
//!
//! The connector checks that `a` is the node it dialled; each side checks
//! the other's tag. Fresh nonces on both sides make every transcript new, so
//! a recorded handshake cannot be replayed; the role labels keep a tag from
//! being reflected. After the proof, each direction has its own key derived
//! from the transcript, and **every frame is sealed**: a 16-byte tag over
//! the frame's sequence number in that direction and its bytes is appended
//! ([`Sealer`], [`Opener`]). A frame altered, dropped, replayed, reordered
//! or spliced from another connection fails its tag, and the connection is
//! closed.
//!
//! What it does not do: encrypt (frames travel in the clear; a private
//! network or TLS is for that), or tell one key holder from another (the key
//! is the cluster's, so a node that holds it can claim any node id: it
//! authenticates membership, see `docs/security.md`).
//!
//! Pure: nonces come in as arguments, no I/O, so the handshake is tested as
//! a state machine and fuzzed.

use crate::{Frame, WireError, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES};
use tierstack_base::NodeId;
use tierstack_secret::{ClusterKey, Mac};

pub use tierstack_secret::{Tag, TAG_BYTES};

/// Bytes of a handshake nonce.
pub const NONCE_BYTES: usize = 16;

/// A handshake nonce.
pub type Nonce = [u8; NONCE_BYTES];

/// The keys a node derives from the cluster key for the fabric.
#[derive(Clone)]
pub struct FabricKey {
    handshake: Mac,
    frames: Mac,
}

impl FabricKey {
    pub fn new(key: &ClusterKey) -> Self {
        Self {
            handshake: key.derive("tierstack fabric handshake v4"),
            frames: key.derive("tierstack fabric frames v4"),
        }
    }
}

impl std::fmt::Debug for FabricKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FabricKey(..)")
    }
}

/// Why a handshake failed. The connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("expected {expected}, got a {got} frame")]
    UnexpectedFrame { expected: &'static str, got: &'static str },
    #[error("dialled {expected} but {answered} answered")]
    WrongPeer { expected: NodeId, answered: NodeId },
    #[error("the peer's proof does not verify: it does not hold this cluster's key")]
    BadTag,
}

/// One end's identity in a handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct End {
    node: NodeId,
    incarnation: u64,
    nonce: Nonce,
}

const END_BYTES: usize = 4 + 8 + NONCE_BYTES;

fn transcript(connector: &End, acceptor: &End) -> [u8; 2 * END_BYTES] {
    let mut out = [0u8; 2 * END_BYTES];
    for (i, end) in [connector, acceptor].into_iter().enumerate() {
        let at = i * END_BYTES;
        out[at..at + 4].copy_from_slice(&end.node.0.to_le_bytes());
        out[at + 4..at + 12].copy_from_slice(&end.incarnation.to_le_bytes());
        out[at + 12..at + END_BYTES].copy_from_slice(&end.nonce);
    }
    out
}

const ACCEPTOR_LABEL: &[u8] = b"acceptor";
const CONNECTOR_LABEL: &[u8] = b"connector";
const TO_ACCEPTOR: &[u8] = b"connector to acceptor";
const TO_CONNECTOR: &[u8] = b"acceptor to connector";

/// The result of a handshake: who the peer is, and the keys of this
/// connection's two directions.
pub struct Session {
    pub peer: NodeId,
    pub peer_incarnation: u64,
    pub sealer: Sealer,
    pub opener: Opener,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("peer", &self.peer).field("peer_incarnation", &self.peer_incarnation).finish()
    }
}

fn session(
    key: &FabricKey,
    transcript: &[u8],
    binding: &[u8],
    peer: &End,
    sending: &[u8],
    receiving: &[u8],
) -> Session {
    let direction = |label: &[u8]| Mac::new(&key.frames.tag_full(&[label, transcript, binding]));
    Session {
        peer: peer.node,
        peer_incarnation: peer.incarnation,
        sealer: Sealer { mac: direction(sending), sequence: 0 },
        opener: Opener { mac: direction(receiving), sequence: 0 },
    }
}

/// The connector's side, between its `AuthHello` and the acceptor's answer.
pub struct Connecting {
    key: FabricKey,
    me: End,
    expected_peer: NodeId,
    binding: Vec<u8>,
}

impl Connecting {
    /// Starts a handshake with `expected_peer`: returns the `AuthHello` to send.
    /// `binding` names the channel the handshake runs on (a TLS session's
    /// exporter; empty on a plain connection): both ends must see the same,
    /// so a handshake relayed between two TLS sessions fails.
    pub fn start(
        key: &FabricKey,
        me: NodeId,
        incarnation: u64,
        nonce: Nonce,
        expected_peer: NodeId,
        binding: &[u8],
    ) -> (Self, Frame) {
        let hello = Frame::AuthHello { node: me, incarnation, nonce };
        let me = End { node: me, incarnation, nonce };
        (Self { key: key.clone(), me, expected_peer, binding: binding.to_vec() }, hello)
    }

    /// Checks the acceptor's `AuthChallenge`: returns the `AuthProof` to
    /// send and the session.
    pub fn finish(self, challenge: &Frame) -> Result<(Frame, Session), AuthError> {
        let Frame::AuthChallenge { node, incarnation, nonce, tag } = challenge else {
            return Err(AuthError::UnexpectedFrame { expected: "AuthChallenge", got: frame_kind_name(challenge) });
        };
        if *node != self.expected_peer {
            return Err(AuthError::WrongPeer { expected: self.expected_peer, answered: *node });
        }
        let acceptor = End { node: *node, incarnation: *incarnation, nonce: *nonce };
        let transcript = transcript(&self.me, &acceptor);
        if !self.key.handshake.verify(&[ACCEPTOR_LABEL, &transcript, &self.binding], tag) {
            return Err(AuthError::BadTag);
        }
        let proof = Frame::AuthProof { tag: self.key.handshake.tag(&[CONNECTOR_LABEL, &transcript, &self.binding]) };
        Ok((proof, session(&self.key, &transcript, &self.binding, &acceptor, TO_ACCEPTOR, TO_CONNECTOR)))
    }
}

/// The acceptor's side, between its `AuthChallenge` and the connector's proof.
pub struct Accepting {
    key: FabricKey,
    transcript: [u8; 2 * END_BYTES],
    binding: Vec<u8>,
    connector: End,
}

impl Accepting {
    /// Answers a connector's first frame, which must be an `AuthHello`:
    /// returns the `AuthChallenge` to send. `binding` as in [`Connecting::start`].
    pub fn start(
        key: &FabricKey,
        me: NodeId,
        incarnation: u64,
        nonce: Nonce,
        hello: &Frame,
        binding: &[u8],
    ) -> Result<(Self, Frame), AuthError> {
        let Frame::AuthHello { node, incarnation: peer_incarnation, nonce: peer_nonce } = hello else {
            return Err(AuthError::UnexpectedFrame { expected: "AuthHello", got: frame_kind_name(hello) });
        };
        let connector = End { node: *node, incarnation: *peer_incarnation, nonce: *peer_nonce };
        let acceptor = End { node: me, incarnation, nonce };
        let transcript = transcript(&connector, &acceptor);
        let tag = key.handshake.tag(&[ACCEPTOR_LABEL, &transcript, binding]);
        let challenge = Frame::AuthChallenge { node: me, incarnation, nonce, tag };
        Ok((Self { key: key.clone(), transcript, binding: binding.to_vec(), connector }, challenge))
    }

    /// The connector the `AuthHello` named (not yet proven).
    pub fn claimed_peer(&self) -> NodeId {
        self.connector.node
    }

    /// Checks the connector's `AuthProof`: returns the session.
    pub fn finish(self, proof: &Frame) -> Result<Session, AuthError> {
        let Frame::AuthProof { tag } = proof else {
            return Err(AuthError::UnexpectedFrame { expected: "AuthProof", got: frame_kind_name(proof) });
        };
        if !self.key.handshake.verify(&[CONNECTOR_LABEL, &self.transcript, &self.binding], tag) {
            return Err(AuthError::BadTag);
        }
        Ok(session(&self.key, &self.transcript, &self.binding, &self.connector, TO_CONNECTOR, TO_ACCEPTOR))
    }
}

/// Seals the frames of one direction of a connection, in the order they
/// are written.
pub struct Sealer {
    mac: Mac,
    sequence: u64,
}

impl Sealer {
    /// Seals `frame`, an encoded frame (length prefix first): appends the
    /// tag of its sequence number and body, and fixes the length prefix.
    /// Frames must then be written in the order they were sealed.
    pub fn seal(&mut self, frame: &mut Vec<u8>) -> Result<(), WireError> {
        let body_len = frame.len().checked_sub(LENGTH_PREFIX_BYTES).ok_or(WireError::Truncated)?;
        let sealed_len = body_len + TAG_BYTES;
        if sealed_len > FRAME_BYTES_MAX {
            return Err(WireError::TooLarge { len: sealed_len });
        }
        let tag = self.mac.tag(&[&self.sequence.to_le_bytes(), &frame[LENGTH_PREFIX_BYTES..]]);
        self.sequence = self.sequence.wrapping_add(1);
        frame.extend_from_slice(&tag);
        let prefix = u32::try_from(sealed_len).map_err(|_| WireError::TooLarge { len: sealed_len })?;
        frame[..LENGTH_PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
        Ok(())
    }
}

/// Opens the sealed frames of one direction of a connection, in order.
pub struct Opener {
    mac: Mac,
    sequence: u64,
}

impl Opener {
    /// Verifies a sealed frame's body (the bytes after its length prefix, as
    /// `read_frame_body` returns them) and returns it without its tag, for
    /// `decode`. `Unauthenticated` when the tag does not verify; the
    /// connection must then be closed (the sequence has moved on).
    pub fn open<'a>(&mut self, sealed: &'a [u8]) -> Result<&'a [u8], WireError> {
        let body_len = sealed.len().checked_sub(TAG_BYTES).filter(|len| *len > 0).ok_or(WireError::Truncated)?;
        let (body, tag) = sealed.split_at(body_len);
        let sequence = self.sequence;
        self.sequence = self.sequence.wrapping_add(1);
        if !self.mac.verify(&[&sequence.to_le_bytes(), body], tag) {
            return Err(WireError::Unauthenticated);
        }
        Ok(body)
    }
}

fn frame_kind_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello { .. } => "Hello",
        Frame::AuthHello { .. } => "AuthHello",
        Frame::AuthChallenge { .. } => "AuthChallenge",
        Frame::AuthProof { .. } => "AuthProof",
        Frame::Message { .. } => "Message",
        Frame::Lookup { .. } => "Lookup",
        Frame::LookupOk { .. } => "LookupOk",
        Frame::Ops { .. } => "Ops",
        Frame::OpsOk { .. } => "OpsOk",
        Frame::Error { .. } => "Error",
    }
}

impl Frame {
    /// The frame's kind, for logs.
    pub fn kind_name(&self) -> &'static str {
        frame_kind_name(self)
    }
}

/// Why a handshake over a stream failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("the peer closed the connection during the handshake (does it hold this cluster's key?)")]
    Closed,
    #[error("no handshake frame in time")]
    TimedOut,
    #[error("a malformed handshake frame: {0}")]
    Malformed(String),
    #[error("handshake I/O: {0}")]
    Io(std::io::Error),
    #[error(transparent)]
    Auth(#[from] AuthError),
}

impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => HandshakeError::TimedOut,
            std::io::ErrorKind::UnexpectedEof => HandshakeError::Closed,
            _ => HandshakeError::Io(e),
        }
    }
}

/// Bytes of the largest handshake frame after its length prefix.
pub const HANDSHAKE_BODY_BYTES_MAX: usize = 96;

/// Reads one handshake frame: at most [`HANDSHAKE_BODY_BYTES_MAX`] bytes,
/// unbuffered, so nothing after the handshake is consumed and a peer that
/// has proven nothing cannot make the node read or allocate more. `None`
/// at a clean end of stream before the first byte. Set a read timeout on
/// the stream first: this blocks as long as the stream does.
pub fn read_handshake_frame(r: &mut impl std::io::Read) -> Result<Option<Frame>, HandshakeError> {
    let Some(len) = crate::read_length_prefix(r)? else { return Ok(None) };
    if len == 0 || len > HANDSHAKE_BODY_BYTES_MAX {
        return Err(HandshakeError::Malformed(format!(
            "a handshake frame of {len} bytes (at most {HANDSHAKE_BODY_BYTES_MAX})"
        )));
    }
    let mut body = [0u8; HANDSHAKE_BODY_BYTES_MAX];
    r.read_exact(&mut body[..len])?;
    crate::decode(&body[..len]).map(Some).map_err(|e| HandshakeError::Malformed(e.to_string()))
}

/// The connector's whole handshake on a blocking stream (with a read
/// timeout set): hello, challenge, proof.
pub fn connect_over<S: std::io::Read + std::io::Write>(
    stream: &mut S,
    key: &FabricKey,
    me: NodeId,
    incarnation: u64,
    peer: NodeId,
    binding: &[u8],
) -> Result<Session, HandshakeError> {
    let (connecting, hello) = Connecting::start(key, me, incarnation, tierstack_secret::random_nonce(), peer, binding);
    stream.write_all(&crate::encode(&hello))?;
    let challenge = read_handshake_frame(stream)?.ok_or(HandshakeError::Closed)?;
    let (proof, session) = connecting.finish(&challenge)?;
    stream.write_all(&crate::encode(&proof))?;
    Ok(session)
}

/// The acceptor's handshake after it has read the connector's `hello`, on
/// a blocking stream (with a read timeout set): challenge, proof.
pub fn accept_over<S: std::io::Read + std::io::Write>(
    stream: &mut S,
    key: &FabricKey,
    me: NodeId,
    incarnation: u64,
    hello: &Frame,
    binding: &[u8],
) -> Result<Session, HandshakeError> {
    let (accepting, challenge) =
        Accepting::start(key, me, incarnation, tierstack_secret::random_nonce(), hello, binding)?;
    stream.write_all(&crate::encode(&challenge))?;
    let proof = read_handshake_frame(stream)?.ok_or(HandshakeError::Closed)?;
    Ok(accepting.finish(&proof)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    fn key() -> FabricKey {
        FabricKey::new(&ClusterKey::parse(&[b'7'; 64]).unwrap())
    }

    fn handshake(connector_key: &FabricKey, acceptor_key: &FabricKey) -> Result<(Session, Session), AuthError> {
        let (connecting, hello) = Connecting::start(connector_key, NodeId(1), 11, [1; NONCE_BYTES], NodeId(2), b"");
        let hello = decode(&encode(&hello)[LENGTH_PREFIX_BYTES..]).unwrap();
        let (accepting, challenge) = Accepting::start(acceptor_key, NodeId(2), 22, [2; NONCE_BYTES], &hello, b"")?;
        assert_eq!(accepting.claimed_peer(), NodeId(1));
        let (proof, connector) = connecting.finish(&challenge)?;
        let acceptor = accepting.finish(&proof)?;
        Ok((connector, acceptor))
    }

    #[test]
    fn keys_and_sessions_print_no_secret_and_frames_name_their_kind() {
        assert_eq!(format!("{:?}", key()), "FabricKey(..)");
        let (connector, _) = handshake(&key(), &key()).unwrap();
        assert_eq!(format!("{connector:?}"), "Session { peer: NodeId(2), peer_incarnation: 22 }");
        assert_eq!(Frame::AuthProof { tag: [0; TAG_BYTES] }.kind_name(), "AuthProof");
        assert_eq!(Frame::Hello { node: NodeId(1) }.kind_name(), "Hello");
        assert_eq!(Frame::Lookup { request: 1, name: "x".into() }.kind_name(), "Lookup");
    }

    /// The largest frame that may be sealed is one whose tag still fits the
    /// frame bound; one byte more is refused and leaves the sequence alone.
    #[test]
    fn sealing_respects_the_frame_bound() {
        let (mut connector, mut acceptor) = handshake(&key(), &key()).unwrap();
        let mut largest = vec![0u8; LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX - TAG_BYTES];
        largest[LENGTH_PREFIX_BYTES] = crate::kind::MESSAGE;
        let mut too_large = vec![0u8; largest.len() + 1];
        assert!(matches!(connector.sealer.seal(&mut too_large), Err(WireError::TooLarge { .. })));
        connector.sealer.seal(&mut largest).unwrap();
        assert_eq!(largest.len(), LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
        let prefix = u32::from_le_bytes(largest[..LENGTH_PREFIX_BYTES].try_into().unwrap()) as usize;
        assert_eq!(prefix, FRAME_BYTES_MAX);
        assert!(
            acceptor.opener.open(&largest[LENGTH_PREFIX_BYTES..]).is_ok(),
            "the refused frame took a sequence number"
        );
    }

    /// An encoded frame has room for its tag: sealing it moves no bytes.
    #[test]
    fn sealing_an_encoded_frame_does_not_reallocate() {
        let (mut connector, _) = handshake(&key(), &key()).unwrap();
        let ops = vec![tierstack_fabric::Op::Write { offset: 0, data: vec![1; 1 << 20] }];
        let mut bytes = encode(&Frame::Ops { request: 1, region: 0, incarnation: 1, ops });
        let capacity = bytes.capacity();
        assert!(capacity - bytes.len() >= TAG_BYTES, "no room for the tag: sealing would copy the frame");
        connector.sealer.seal(&mut bytes).unwrap();
        assert_eq!(bytes.capacity(), capacity, "sealing grew the frame's buffer");
    }

    #[test]
    fn io_errors_map_to_what_the_handshake_saw() {
        let kind = |kind| HandshakeError::from(std::io::Error::from(kind));
        assert!(matches!(kind(std::io::ErrorKind::TimedOut), HandshakeError::TimedOut));
        assert!(matches!(kind(std::io::ErrorKind::WouldBlock), HandshakeError::TimedOut));
        assert!(matches!(kind(std::io::ErrorKind::UnexpectedEof), HandshakeError::Closed));
        assert!(matches!(kind(std::io::ErrorKind::ConnectionReset), HandshakeError::Io(_)));
    }

    /// A reader that is interrupted before each byte it gives.
    struct Interrupting<'a>(&'a [u8], bool);

    impl std::io::Read for Interrupting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 = !self.1;
            if self.1 {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(self.0.len()).min(1);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn the_handshake_reader_handles_ends_bounds_and_interruptions() {
        assert!(matches!(read_handshake_frame(&mut &[][..]), Ok(None)), "a clean end before a frame");
        assert!(
            matches!(read_handshake_frame(&mut &[1u8, 0][..]), Err(HandshakeError::Closed)),
            "an end inside the prefix"
        );
        assert!(matches!(read_handshake_frame(&mut &[0u8; 4][..]), Err(HandshakeError::Malformed(_))), "a zero length");
        // A frame of exactly the bound is read whole (then fails to decode); one over is refused unread.
        let mut at_bound = (HANDSHAKE_BODY_BYTES_MAX as u32).to_le_bytes().to_vec();
        at_bound.extend_from_slice(&[0xee; HANDSHAKE_BODY_BYTES_MAX]);
        let mut reader: &[u8] = &at_bound;
        assert!(matches!(read_handshake_frame(&mut reader), Err(HandshakeError::Malformed(_))));
        assert!(reader.is_empty(), "a frame at the bound was not read");
        // Interrupted reads are retried, not taken for errors.
        let proof = encode(&Frame::AuthProof { tag: [7; TAG_BYTES] });
        let read = read_handshake_frame(&mut Interrupting(&proof, false)).unwrap();
        assert_eq!(read, Some(Frame::AuthProof { tag: [7; TAG_BYTES] }));
        // Any other error ends the read.
        struct Resetting;
        impl std::io::Read for Resetting {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::ConnectionReset.into())
            }
        }
        assert!(matches!(read_handshake_frame(&mut Resetting), Err(HandshakeError::Io(_))));
    }

    #[test]
    fn both_ends_with_the_key_agree_and_frames_pass_both_ways() {
        let (mut connector, mut acceptor) = handshake(&key(), &key()).unwrap();
        assert_eq!((connector.peer, connector.peer_incarnation), (NodeId(2), 22));
        assert_eq!((acceptor.peer, acceptor.peer_incarnation), (NodeId(1), 11));
        for round in 0..3u64 {
            let frame = Frame::Lookup { request: round, name: "vt".into() };
            let mut bytes = encode(&frame);
            connector.sealer.seal(&mut bytes).unwrap();
            let body = acceptor.opener.open(&bytes[LENGTH_PREFIX_BYTES..]).unwrap();
            assert_eq!(decode(body).unwrap(), frame);
            let mut back = encode(&frame);
            acceptor.sealer.seal(&mut back).unwrap();
            assert_eq!(decode(connector.opener.open(&back[LENGTH_PREFIX_BYTES..]).unwrap()).unwrap(), frame);
        }
    }

    #[test]
    fn a_wrong_key_fails_on_both_sides() {
        let other = FabricKey::new(&ClusterKey::parse(&[b'8'; 64]).unwrap());
        // The connector detects an acceptor without the key...
        assert_eq!(handshake(&other, &key()).unwrap_err(), AuthError::BadTag);
        // ...and the acceptor a connector that forges the proof.
        let (connecting, hello) = Connecting::start(&other, NodeId(1), 11, [1; NONCE_BYTES], NodeId(2), b"");
        let (accepting, challenge) = Accepting::start(&key(), NodeId(2), 22, [2; NONCE_BYTES], &hello, b"").unwrap();
        assert!(connecting.finish(&challenge).is_err());
        let forged = Frame::AuthProof { tag: [0; TAG_BYTES] };
        assert_eq!(accepting.finish(&forged).unwrap_err(), AuthError::BadTag);
    }

    #[test]
    fn a_forged_node_id_or_an_impostor_acceptor_is_refused() {
        let (connecting, hello) = Connecting::start(&key(), NodeId(1), 11, [1; NONCE_BYTES], NodeId(2), b"");
        let (_, challenge) = Accepting::start(&key(), NodeId(3), 33, [3; NONCE_BYTES], &hello, b"").unwrap();
        assert_eq!(
            connecting.finish(&challenge).unwrap_err(),
            AuthError::WrongPeer { expected: NodeId(2), answered: NodeId(3) }
        );
        // A man in the middle rewriting the connector's claimed id breaks the transcript.
        let (connecting, hello) = Connecting::start(&key(), NodeId(1), 11, [1; NONCE_BYTES], NodeId(2), b"");
        let Frame::AuthHello { incarnation, nonce, .. } = hello else { unreachable!() };
        let rewritten = Frame::AuthHello { node: NodeId(0), incarnation, nonce };
        let (_, challenge) = Accepting::start(&key(), NodeId(2), 22, [2; NONCE_BYTES], &rewritten, b"").unwrap();
        assert_eq!(connecting.finish(&challenge).unwrap_err(), AuthError::BadTag);
    }

    /// A handshake relayed between two TLS sessions (a man in the middle
    /// terminating both) sees two exporters, and fails.
    #[test]
    fn a_handshake_relayed_between_two_channels_fails() {
        let (connecting, hello) = Connecting::start(&key(), NodeId(1), 11, [1; NONCE_BYTES], NodeId(2), b"session A");
        let (accepting, challenge) =
            Accepting::start(&key(), NodeId(2), 22, [2; NONCE_BYTES], &hello, b"session B").unwrap();
        assert_eq!(connecting.finish(&challenge).unwrap_err(), AuthError::BadTag);
        let (connecting, hello) = Connecting::start(&key(), NodeId(1), 11, [1; NONCE_BYTES], NodeId(2), b"session A");
        let (accepting_a, challenge) =
            Accepting::start(&key(), NodeId(2), 22, [2; NONCE_BYTES], &hello, b"session A").unwrap();
        let (proof, _) = connecting.finish(&challenge).unwrap();
        assert!(accepting_a.finish(&proof).is_ok());
        drop(accepting);
    }

    #[test]
    fn altered_replayed_reordered_and_reflected_frames_fail() {
        let (mut connector, mut acceptor) = handshake(&key(), &key()).unwrap();
        let seal = |sealer: &mut Sealer, request| {
            let mut bytes = encode(&Frame::Lookup { request, name: "x".into() });
            sealer.seal(&mut bytes).unwrap();
            bytes[LENGTH_PREFIX_BYTES..].to_vec()
        };
        let first = seal(&mut connector.sealer, 1);
        let mut altered = first.clone();
        altered[3] ^= 1;
        assert!(matches!(acceptor.opener.open(&altered), Err(WireError::Unauthenticated)), "altered");
        // The failed open consumed sequence 0: the original now fails too (the connection must close).
        let (mut connector, mut acceptor) = handshake(&key(), &key()).unwrap();
        let _first = seal(&mut connector.sealer, 1);
        let second_fresh = seal(&mut connector.sealer, 2);
        assert!(matches!(acceptor.opener.open(&second_fresh), Err(WireError::Unauthenticated)), "reordered");
        let (mut connector, mut acceptor) = handshake(&key(), &key()).unwrap();
        let once = seal(&mut connector.sealer, 1);
        acceptor.opener.open(&once).unwrap();
        assert!(matches!(acceptor.opener.open(&once), Err(WireError::Unauthenticated)), "replayed");
        // A frame sealed for one direction is not valid in the other.
        let (mut connector, _) = handshake(&key(), &key()).unwrap();
        let mine = seal(&mut connector.sealer, 1);
        assert!(matches!(connector.opener.open(&mine), Err(WireError::Unauthenticated)), "reflected");
        // A frame from another connection (another transcript) fails.
        let (_, mut other) = handshake(&key(), &key()).unwrap();
        let (mut a, _) = {
            let (c, hello) = Connecting::start(&key(), NodeId(1), 11, [9; NONCE_BYTES], NodeId(2), b"");
            let (acc, ch) = Accepting::start(&key(), NodeId(2), 22, [2; NONCE_BYTES], &hello, b"").unwrap();
            let (proof, c) = c.finish(&ch).unwrap();
            (c, acc.finish(&proof).unwrap())
        };
        let spliced = seal(&mut a.sealer, 1);
        assert!(matches!(other.opener.open(&spliced), Err(WireError::Unauthenticated)), "spliced");
        assert!(matches!(other.opener.open(&[1; TAG_BYTES]), Err(WireError::Truncated)));
    }
}
