//! The PRESS message codec: every message round-trips and has the size
//! `encoded_len` says; arbitrary bytes decode to a message or an error, never
//! a panic, and a decoded message re-encodes to the same bytes.

use proptest::prelude::*;
use tierstack_press::proto::{decode, encode, encoded_len, Body, FileStatus, Message};

fn status() -> impl Strategy<Value = FileStatus> {
    prop_oneof![Just(FileStatus::Ok), Just(FileStatus::NotFound), Just(FileStatus::Failed)]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (any::<u64>(), "[a-z/._]{0,40}").prop_map(|(request, path)| Body::Forward { request, path }),
        (any::<u64>(), status(), prop::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(request, status, data)| Body::File { request, status, data }),
        (any::<u64>(), status(), any::<u64>(), any::<u32>())
            .prop_map(|(request, status, offset, len)| Body::FileInfo { request, status, offset, len }),
        (any::<bool>(), "\\PC{0,30}").prop_map(|(start, path)| Body::Caching { start, path }),
        any::<u32>().prop_map(|credits| Body::Flow { credits }),
        (any::<u64>(), any::<u32>()).prop_map(|(offset, len)| Body::BufferMgmt { offset, len }),
    ]
}

proptest! {
    #[test]
    fn round_trip(load in any::<u32>(), body in body()) {
        let m = Message { load, body };
        let bytes = encode(&m).unwrap();
        prop_assert_eq!(bytes.len(), encoded_len(&m));
        prop_assert_eq!(decode(&bytes).unwrap(), m);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(m) = decode(&bytes) {
            prop_assert_eq!(encode(&m).unwrap(), bytes);
        }
    }

    #[test]
    fn mutated_messages_never_panic(load in any::<u32>(), body in body(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = encode(&Message { load, body }).unwrap();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        if let Ok(m) = decode(&bytes) {
            prop_assert_eq!(&encode(&m).unwrap(), &bytes);
        }
        bytes.truncate(i);
        let _ = decode(&bytes);
    }
}
