//! Property tests of the codec: every frame round-trips, and no input panics.

use proptest::prelude::*;
use tierstack_base::limits::CHANNELS_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, FabricError, Op, OpResult};
use tierstack_fabric_wire::{decode, encode, read_frame, write_frame, Frame, LENGTH_PREFIX_BYTES};

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
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        node().prop_map(|node| Frame::Hello { node }),
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
