//! The dependency header's limits, at their boundaries.

use tierstack_coherent::deps::{validate_key, DEPS_HEADER_BYTES_MAX, DEPS_KEYS_MAX, KEY_BYTES_MAX};
use tierstack_coherent::{DepsError, DepsHeader};

const PREFIX: &str = "n=0;i=00c0ffee12345678;";

#[test]
fn a_key_of_the_longest_length_is_valid_and_one_byte_more_is_not() {
    assert_eq!(validate_key(&"k".repeat(KEY_BYTES_MAX)), Ok(()));
    assert!(matches!(validate_key(&"k".repeat(KEY_BYTES_MAX + 1)), Err(DepsError::BadKey { .. })));
    assert!(matches!(validate_key(""), Err(DepsError::BadKey { .. })));
}

#[test]
fn the_most_keys_of_the_longest_length_fit_in_a_header() {
    let deps: Vec<String> =
        (0..DEPS_KEYS_MAX).map(|i| format!("{:0>width$}=7@{i}", i, width = KEY_BYTES_MAX)).collect();
    let value = format!("{PREFIX}{}", deps.join(","));
    assert!(value.len() <= DEPS_HEADER_BYTES_MAX, "the limits are consistent: {} bytes", value.len());
    let header = DepsHeader::parse(&value).unwrap();
    assert_eq!(header.deps.len(), DEPS_KEYS_MAX);
    assert_eq!(header.deps[DEPS_KEYS_MAX - 1].slot, DEPS_KEYS_MAX as u32 - 1);
    assert_eq!(header.to_string(), value);
}

#[test]
fn a_header_of_the_longest_length_parses_and_one_byte_more_is_too_long() {
    let value = format!("{PREFIX}doc/1=3@0");
    // Trailing blanks count toward the limit and are then ignored.
    let longest = format!("{value}{}", " ".repeat(DEPS_HEADER_BYTES_MAX - value.len()));
    assert_eq!(longest.len(), DEPS_HEADER_BYTES_MAX);
    assert_eq!(DepsHeader::parse(&longest).unwrap().to_string(), value);
    assert_eq!(DepsHeader::parse(&format!("{longest} ")), Err(DepsError::TooLong));
}
