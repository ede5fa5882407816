//! HMAC-SHA-256 over a message given in parts, truncated to 16 bytes on the
//! wire (as RFC 2104 allows; 128 bits leaves forgery at 2^-128 per try).

use hmac::{Hmac, Mac as _};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a tag on the wire.
pub const TAG_BYTES: usize = 16;

/// A truncated tag.
pub type Tag = [u8; TAG_BYTES];

/// A keyed MAC. Keying is done once; each tag clones the keyed state.
#[derive(Clone)]
pub struct Mac {
    keyed: HmacSha256,
}

impl Mac {
    pub fn new(key: &[u8]) -> Self {
        // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
        let keyed = match HmacSha256::new_from_slice(key) {
            Ok(keyed) => keyed,
            Err(_) => unreachable_key_length(),
        };
        Self { keyed }
    }

    /// The full 32-byte tag of the concatenation of `parts`.
    pub fn tag_full(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// The truncated tag of the concatenation of `parts`.
    pub fn tag(&self, parts: &[&[u8]]) -> Tag {
        let full = self.tag_full(parts);
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&full[..TAG_BYTES]);
        tag
    }

    /// Whether `tag` is the tag of `parts`, compared in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        tag.len() == TAG_BYTES && bool::from(self.tag(parts).ct_eq(tag))
    }
}

#[cold]
fn unreachable_key_length() -> HmacSha256 {
    // HMAC hashes a long key and pads a short one: every length is valid.
    // Reaching here would be a bug in `hmac`; fail loudly rather than use a
    // weak key.
    panic!("HMAC-SHA-256 refused a key length, which RFC 2104 allows")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 4231 test case 2 (key "Jefe"), truncated: the MAC is the standard one.
    #[test]
    fn matches_rfc_4231_test_case_2() {
        let mac = Mac::new(b"Jefe");
        let full = mac.tag_full(&[b"what do ya want ", b"for nothing?"]);
        let expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let hex: String = full.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
    }

    proptest! {
        /// Any change to the message, or to the tag, fails verification.
        #[test]
        fn an_altered_message_or_tag_fails(message in proptest::collection::vec(any::<u8>(), 1..256),
                                            index in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let mac = Mac::new(b"a key");
            let tag = mac.tag(&[&message]);
            prop_assert!(mac.verify(&[&message], &tag));
            let mut altered = message.clone();
            altered[index.index(message.len())] ^= flip;
            prop_assert!(!mac.verify(&[&altered], &tag));
            let mut bad_tag = tag;
            bad_tag[index.index(TAG_BYTES)] ^= flip;
            prop_assert!(!mac.verify(&[&message], &bad_tag));
            prop_assert!(!mac.verify(&[&message], &tag[..TAG_BYTES - 1]));
            prop_assert!(!Mac::new(b"another key").verify(&[&message], &tag));
        }
    }
}
