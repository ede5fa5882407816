//! Property tests of the codec: every frame round-trips, and no input panics;
//! transfers naming local memory encode exactly as the plain ops they stand
//! for, and the borrowed decoder agrees with the owned one. The handshake and
//! sealed frames (`auth`): random and mutated input never panics, never
//! allocates beyond its bound, and never passes authentication.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::sync::Arc;
use tierstack_base::limits::CHANNELS_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, FabricError, LocalRegion, LocalSlice, Op, OpResult, RegionMemory};
use tierstack_fabric_wire::{
    decode, decode_borrowed, encode, read_frame, read_frame_body, try_encode, write_frame, BorrowedFrame, Frame,
    ResultRef, WireError, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES,
};

fn node() -> impl Strategy<Value = NodeId> {
    any::<u32>().prop_map(NodeId)
}

fn channel() -> impl Strategy<Value = Channel> {
    (0..CHANNELS_MAX as u8).prop_map(|id| Channel::new(id).unwrap())
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..64)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u64>(), any::<u32>()).prop_map(|(offset, len)| Op::Read { offset, len }),
        (any::<u64>(), bytes()).prop_map(|(offset, data)| Op::Write { offset, data }),
        (any::<u64>(), any::<u64>()).prop_map(|(offset, delta)| Op::FetchAdd { offset, delta }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(offset, expected, new)| Op::CompareSwap {
            offset,
            expected,
            new
        }),
    ]
}

fn op_result() -> impl Strategy<Value = OpResult> {
    prop_oneof![
        bytes().prop_map(OpResult::Read),
        Just(OpResult::Written),
        any::<u64>().prop_map(OpResult::FetchAdd),
        any::<u64>().prop_map(OpResult::CompareSwap),
    ]
}

fn fabric_error() -> impl Strategy<Value = FabricError> {
    let s = || ".{0,20}";
    prop_oneof![
        (s(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(region, offset, len, region_len)| {
            FabricError::OutOfBounds { region, offset, len, region_len }
        }),
        any::<u64>().prop_map(|offset| FabricError::Misaligned { offset }),
        (s(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(region, offset, len, region_len)| {
            FabricError::LocalOutOfBounds { region, offset, len, region_len }
        }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(local_offset, remote_offset)| FabricError::LocalMisaligned { local_offset, remote_offset }),
        (node(), s()).prop_map(|(node, name)| FabricError::UnknownRegion { node, name }),
        node().prop_map(|node| FabricError::UnknownNode { node }),
        s().prop_map(|name| FabricError::RegionExists { name }),
        (s(), s()).prop_map(|(name, reason)| FabricError::InvalidName { name, reason }),
        (any::<u64>(), any::<u64>()).prop_map(|(bytes, max)| FabricError::RegionSize { bytes, max }),
        any::<u32>().prop_map(|max| FabricError::TooManyRegions { max: max as usize }),
        any::<u32>().prop_map(|len| FabricError::TransferTooLarge { len: len as usize }),
        (any::<u32>(), any::<u32>())
            .prop_map(|(ops, max)| FabricError::BatchSize { ops: ops as usize, max: max as usize }),
        (node(), any::<u64>()).prop_map(|(node, timeout_ms)| FabricError::Timeout { node, timeout_ms }),
        (node(), s()).prop_map(|(node, reason)| FabricError::PeerDead { node, reason }),
        (any::<u64>(), any::<u32>()).prop_map(|(offset, retries)| FabricError::TornRead { offset, retries }),
        (node(), s()).prop_map(|(node, reason)| FabricError::Protocol { node, reason }),
        any::<u64>().prop_map(|timeout_ms| FabricError::RecvTimeout { timeout_ms }),
        node().prop_map(|node| FabricError::InboxFull { node }),
        Just(FabricError::Closed),
        (node(), any::<u32>()).prop_map(|(node, pid)| FabricError::NodeInUse { node, pid }),
        s().prop_map(FabricError::Io),
        any::<u8>().prop_map(|channel| FabricError::UnknownChannel { channel }),
        (node(), s(), 0u8..8, 0u8..8).prop_map(|(node, region, needed, granted)| FabricError::Forbidden {
            node,
            region,
            needed: tierstack_fabric::Rights::from_bits(needed),
            granted: tierstack_fabric::Rights::from_bits(granted),
        }),
        (node(), s()).prop_map(|(node, reason)| FabricError::Unauthenticated { node, reason }),
        (s(), s()).prop_map(|(path, reason)| FabricError::UnsafePath { path, reason }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        node().prop_map(|node| Frame::Hello { node }),
        (node(), any::<u64>(), any::<[u8; 16]>()).prop_map(|(node, incarnation, nonce)| Frame::AuthHello {
            node,
            incarnation,
            nonce
        }),
        (node(), any::<u64>(), any::<[u8; 16]>(), any::<[u8; 16]>())
            .prop_map(|(node, incarnation, nonce, tag)| Frame::AuthChallenge { node, incarnation, nonce, tag }),
        any::<[u8; 16]>().prop_map(|tag| Frame::AuthProof { tag }),
        (channel(), bytes()).prop_map(|(channel, payload)| Frame::Message { channel, payload }),
        (any::<u64>(), "[A-Za-z0-9._-]{0,64}").prop_map(|(request, name)| Frame::Lookup { request, name }),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>())
            .prop_map(|(request, region, incarnation, len)| { Frame::LookupOk { request, region, incarnation, len } }),
        (any::<u64>(), any::<u32>(), any::<u64>(), proptest::collection::vec(op(), 0..16))
            .prop_map(|(request, region, incarnation, ops)| Frame::Ops { request, region, incarnation, ops }),
        (any::<u64>(), proptest::collection::vec(op_result(), 0..16))
            .prop_map(|(request, results)| Frame::OpsOk { request, results }),
        (any::<u64>(), fabric_error()).prop_map(|(request, error)| Frame::Error { request, error }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// encode → decode is the identity, and the prefix counts the body exactly.
    #[test]
    fn round_trip(frame in frame()) {
        let bytes = encode(&frame);
        let prefix = u32::from_le_bytes(bytes[..LENGTH_PREFIX_BYTES].try_into().unwrap()) as usize;
        prop_assert_eq!(prefix, bytes.len() - LENGTH_PREFIX_BYTES);
        prop_assert_eq!(decode(&bytes[LENGTH_PREFIX_BYTES..]).unwrap(), frame);
    }

    /// Frames written back to back on a stream are read back in order, then a clean EOF.
    #[test]
    fn stream_round_trip(frames in proptest::collection::vec(frame(), 0..8)) {
        let mut stream = Vec::new();
        for frame in &frames {
            write_frame(&mut stream, frame).unwrap();
        }
        let mut reader: &[u8] = &stream;
        for frame in &frames {
            let read = read_frame(&mut reader).unwrap();
            prop_assert_eq!(read.as_ref(), Some(frame));
        }
        prop_assert!(read_frame(&mut reader).unwrap().is_none());
    }

    /// Decoding arbitrary bytes returns Ok or Err and never panics.
    #[test]
    fn decode_random_bytes_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&body);
        let mut reader: &[u8] = &body;
        let _ = read_frame(&mut reader);
    }

    /// Corrupting one byte of a valid frame never panics the decoder, and
    /// truncating it is always an error.
    #[test]
    fn mutated_frames_never_panic(frame in frame(), index in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let bytes = encode(&frame);
        let body = &bytes[LENGTH_PREFIX_BYTES..];
        let mut mutated = body.to_vec();
        let i = index.index(mutated.len());
        mutated[i] = byte;
        let _ = decode(&mutated);
        let cut = index.index(body.len());
        prop_assert!(decode(&body[..cut]).is_err());
    }
}

const LOCAL_BYTES: u64 = 256;

/// A local region holding `pattern` bytes (a different value at each offset).
fn local_region() -> Arc<LocalRegion> {
    let region = Arc::new(LocalRegion::new("local", RegionMemory::heap("local", LOCAL_BYTES).unwrap()));
    let bytes: Vec<u8> = (0..LOCAL_BYTES).map(|i| (i as u8).wrapping_mul(7).wrapping_add(3)).collect();
    region.memory().write(0, &bytes).unwrap();
    region
}

fn body(frame_bytes: &[u8]) -> &[u8] {
    &frame_bytes[LENGTH_PREFIX_BYTES..]
}

proptest! {
    /// A `WriteFrom` is encoded exactly as the `Write` of its slice's bytes
    /// and a `ReadInto` exactly as the `Read` of its length: the owner sees
    /// plain writes and reads, and no new op tags exist.
    #[test]
    fn local_transfers_encode_as_the_plain_ops(
        request in any::<u64>(),
        remote in any::<u64>(),
        local_offset in 0..LOCAL_BYTES,
        len in 0..LOCAL_BYTES,
    ) {
        let len = len.min(LOCAL_BYTES - local_offset);
        let region = local_region();
        let slice = LocalSlice::new(region.clone(), local_offset, len as u32);
        let mut data = vec![0u8; len as usize];
        region.memory().read(local_offset, &mut data).unwrap();
        let frame = |ops| Frame::Ops { request, region: 3, incarnation: 9, ops };
        prop_assert_eq!(
            encode(&frame(vec![Op::WriteFrom { offset: remote, source: slice.clone() }])),
            encode(&frame(vec![Op::Write { offset: remote, data: data.clone() }]))
        );
        prop_assert_eq!(
            try_encode(&frame(vec![Op::ReadInto { offset: remote, target: slice.clone() }])).unwrap(),
            encode(&frame(vec![Op::Read { offset: remote, len: len as u32 }]))
        );
        // What the owner decodes.
        let sent = encode(&frame(vec![Op::WriteFrom { offset: remote, source: slice.clone() }, Op::ReadInto { offset: remote, target: slice }]));
        prop_assert_eq!(
            decode(body(&sent)).unwrap(),
            frame(vec![Op::Write { offset: remote, data }, Op::Read { offset: remote, len: len as u32 }])
        );
    }

    /// The borrowed decoder accepts and rejects exactly what `decode` does,
    /// and yields the same frame.
    #[test]
    fn decode_borrowed_agrees_with_decode(frame in frame()) {
        let bytes = encode(&frame);
        match decode_borrowed(body(&bytes)).unwrap() {
            BorrowedFrame::OpsOk { request, results } => {
                let owned = Frame::OpsOk { request, results: results.into_iter().map(ResultRef::into_owned).collect() };
                prop_assert_eq!(owned, frame);
            }
            BorrowedFrame::Owned(owned) => {
                prop_assert!(!matches!(owned, Frame::OpsOk { .. }), "an OpsOk is always borrowed");
                prop_assert_eq!(owned, frame);
            }
        }
    }

    #[test]
    fn decode_borrowed_fails_exactly_when_decode_does(frame in frame(), index in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let bytes = encode(&frame);
        let mut mutated = body(&bytes).to_vec();
        let i = index.index(mutated.len());
        mutated[i] = byte;
        let cut = index.index(mutated.len());
        for candidate in [&mutated[..], &mutated[..cut]] {
            prop_assert_eq!(decode(candidate).is_ok(), decode_borrowed(candidate).is_ok());
        }
    }

    /// Frames read one after another into one reused body buffer.
    #[test]
    fn frame_bodies_reuse_one_buffer(frames in proptest::collection::vec(frame(), 0..8)) {
        let mut stream = Vec::new();
        for frame in &frames {
            write_frame(&mut stream, frame).unwrap();
        }
        let mut reader: &[u8] = &stream;
        let mut buffer = Vec::new();
        for frame in &frames {
            prop_assert!(read_frame_body(&mut reader, &mut buffer).unwrap());
            prop_assert_eq!(&decode(&buffer).unwrap(), frame);
        }
        prop_assert!(!read_frame_body(&mut reader, &mut buffer).unwrap(), "a clean end of stream");
    }
}

#[test]
fn an_ops_ok_read_is_borrowed_from_the_frame() {
    let bytes = encode(&Frame::OpsOk { request: 4, results: vec![OpResult::Written, OpResult::Read(vec![5, 6, 7])] });
    let body = body(&bytes);
    let BorrowedFrame::OpsOk { request: 4, results } = decode_borrowed(body).unwrap() else { panic!("not an OpsOk") };
    let ResultRef::Read(data) = results[1] else { panic!("not a read") };
    assert_eq!(data, [5, 6, 7]);
    let inside = body.as_ptr_range();
    assert!(inside.contains(&data.as_ptr()), "the data points into the frame's body, not a copy");
    assert_eq!(results[0], ResultRef::Written);
}

#[test]
fn what_cannot_travel_is_refused_and_poisoned() {
    let region = local_region();
    let outside = LocalSlice::new(region, LOCAL_BYTES - 4, 8);
    let frame =
        Frame::Ops { request: 1, region: 0, incarnation: 0, ops: vec![Op::WriteFrom { offset: 0, source: outside }] };
    let expected = FabricError::LocalOutOfBounds {
        region: "local".into(),
        offset: LOCAL_BYTES - 4,
        len: 8,
        region_len: LOCAL_BYTES,
    };
    assert!(matches!(try_encode(&frame), Err(WireError::Unencodable(error)) if error == expected));
    // `encode` cannot fail: its frame is one no writer sends and no reader accepts.
    let poisoned = encode(&frame);
    assert_eq!(poisoned[..LENGTH_PREFIX_BYTES], u32::MAX.to_le_bytes());
    assert!(matches!(read_frame(&mut &poisoned[..]), Err(WireError::TooLarge { len }) if len > FRAME_BYTES_MAX));
    let mut sink = Vec::new();
    assert!(write_frame(&mut sink, &frame).is_err());
    assert!(sink.is_empty());

    for client_only in [OpResult::WrittenFrom, OpResult::ReadInto] {
        let frame = Frame::OpsOk { request: 2, results: vec![OpResult::Written, client_only] };
        assert!(matches!(try_encode(&frame), Err(WireError::Unencodable(_))), "{frame:?}");
        assert_eq!(encode(&frame)[..LENGTH_PREFIX_BYTES], u32::MAX.to_le_bytes());
    }
}

/// Handshake and sealing, fuzzed: what an attacker without the key can send.
mod auth {
    use super::*;
    use tierstack_fabric_wire::auth::{
        read_handshake_frame, Accepting, Connecting, FabricKey, HandshakeError, Session, HANDSHAKE_BODY_BYTES_MAX,
        NONCE_BYTES,
    };
    use tierstack_secret::ClusterKey;

    fn key() -> FabricKey {
        FabricKey::new(&ClusterKey::parse(&[b'a'; 64]).unwrap())
    }

    fn sessions(nonces: ([u8; NONCE_BYTES], [u8; NONCE_BYTES])) -> (Session, Session) {
        let (connecting, hello) = Connecting::start(&key(), NodeId(1), 1, nonces.0, NodeId(2), b"");
        let (accepting, challenge) = Accepting::start(&key(), NodeId(2), 2, nonces.1, &hello, b"").unwrap();
        let (proof, connector) = connecting.finish(&challenge).unwrap();
        (connector, accepting.finish(&proof).unwrap())
    }

    /// A byte flipped, bytes cut or bytes added.
    #[derive(Debug, Clone)]
    enum Mutation {
        Flip { at: prop::sample::Index, bits: u8 },
        Truncate { keep: prop::sample::Index },
        Extend { extra: Vec<u8> },
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
            any::<prop::sample::Index>().prop_map(|keep| Mutation::Truncate { keep }),
            proptest::collection::vec(any::<u8>(), 1..32).prop_map(|extra| Mutation::Extend { extra }),
        ]
    }

    fn mutate(mut bytes: Vec<u8>, mutation: &Mutation) -> Vec<u8> {
        match mutation {
            Mutation::Flip { at, bits } => {
                let i = at.index(bytes.len());
                bytes[i] ^= bits;
            }
            Mutation::Truncate { keep } => bytes.truncate(keep.index(bytes.len())),
            Mutation::Extend { extra } => bytes.extend_from_slice(extra),
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// A sealed frame changed in any way fails to open; the untouched one opens.
        #[test]
        fn a_mutated_sealed_frame_never_opens(frame in frame(), mutation in mutation(),
                                               nonces in any::<([u8; 16], [u8; 16])>()) {
            let (mut connector, mut acceptor) = sessions(nonces);
            let mut bytes = encode(&frame);
            connector.sealer.seal(&mut bytes).unwrap();
            let body = bytes[LENGTH_PREFIX_BYTES..].to_vec();
            let mutated = mutate(body.clone(), &mutation);
            prop_assume!(mutated != body);
            prop_assert!(acceptor.opener.open(&mutated).is_err());
            // The failed attempt consumed its sequence number: a connection
            // is closed on the first failure, so a later frame never opens either.
            let (mut connector, mut acceptor) = sessions(nonces);
            let mut bytes = encode(&frame);
            connector.sealer.seal(&mut bytes).unwrap();
            let opened = acceptor.opener.open(&bytes[LENGTH_PREFIX_BYTES..]).unwrap();
            prop_assert_eq!(decode(opened).unwrap(), frame);
        }

        /// Random bytes never pass as a sealed frame.
        #[test]
        fn random_bytes_never_authenticate(body in proptest::collection::vec(any::<u8>(), 0..300),
                                           nonces in any::<([u8; 16], [u8; 16])>()) {
            let (_, mut acceptor) = sessions(nonces);
            prop_assert!(acceptor.opener.open(&body).is_err());
        }

        /// An acceptor never accepts a proof it did not see made with the
        /// key: random proofs and any frame but a proof fail.
        #[test]
        fn a_random_proof_never_passes(hello in frame(), proof in frame(), nonce in any::<[u8; 16]>()) {
            match Accepting::start(&key(), NodeId(2), 2, nonce, &hello, b"") {
                Ok((accepting, _challenge)) => prop_assert!(accepting.finish(&proof).is_err()),
                Err(_) => {
                    let was_a_hello = matches!(hello, Frame::AuthHello { .. });
                    prop_assert!(!was_a_hello, "a well-formed AuthHello was refused");
                }
            }
        }

        /// A connector never accepts a challenge changed in any way.
        #[test]
        fn a_mutated_challenge_never_passes(mutation in mutation(), nonces in any::<([u8; 16], [u8; 16])>()) {
            let (connecting, hello) = Connecting::start(&key(), NodeId(1), 1, nonces.0, NodeId(2), b"");
            let (_, challenge) = Accepting::start(&key(), NodeId(2), 2, nonces.1, &hello, b"").unwrap();
            let body = encode(&challenge)[LENGTH_PREFIX_BYTES..].to_vec();
            let mutated = mutate(body.clone(), &mutation);
            prop_assume!(mutated != body);
            if let Ok(frame) = decode(&mutated) {
                prop_assert!(connecting.finish(&frame).is_err());
            }
        }

        /// The handshake reader takes arbitrary bytes without panicking, and
        /// never reads a frame longer than its bound (nothing larger is allocated).
        #[test]
        fn the_handshake_reader_is_bounded(stream in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut reader: &[u8] = &stream;
            match read_handshake_frame(&mut reader) {
                Ok(Some(_)) => {
                    let len = u32::from_le_bytes(stream[..4].try_into().unwrap()) as usize;
                    prop_assert!(len <= HANDSHAKE_BODY_BYTES_MAX);
                    prop_assert_eq!(reader.len(), stream.len() - 4 - len, "it read past its frame");
                }
                Ok(None) => prop_assert!(stream.is_empty()),
                Err(HandshakeError::Malformed(_) | HandshakeError::Closed) => {}
                Err(other) => prop_assert!(false, "unexpected {other}"),
            }
        }
    }

    #[test]
    fn an_oversized_handshake_prefix_is_refused_before_reading_on() {
        let mut stream = ((HANDSHAKE_BODY_BYTES_MAX + 1) as u32).to_le_bytes().to_vec();
        stream.extend_from_slice(&[0; 200]);
        let mut reader: &[u8] = &stream;
        assert!(matches!(read_handshake_frame(&mut reader), Err(HandshakeError::Malformed(_))));
        assert_eq!(reader.len(), 200, "the body of a refused frame was read");
    }
}
