//! The `X-Tierstack-Deps` header: which versions a response was generated at.
//!
//! Format (`docs/coherence-protocol.md`):
//! `n=<node>;i=<incarnation, 16 hex>;<key>=<version>@<slot>[,…]`

use crate::version_table::Incarnation;
use std::fmt;
use tierstack_base::NodeId;

/// The header's name (lower case, as HTTP/1.1 libraries normalize it).
pub const DEPS_HEADER: &str = "x-tierstack-deps";
/// Most dependency keys one response may carry.
pub const DEPS_KEYS_MAX: usize = 64;
/// Longest dependency key, in bytes.
pub const KEY_BYTES_MAX: usize = 128;
/// Longest header value accepted.
pub const DEPS_HEADER_BYTES_MAX: usize = 16 * 1024;

/// One dependency of a response.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Dep {
    pub key: String,
    pub version: u64,
    pub slot: u32,
}

/// A parsed dependency header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DepsHeader {
    pub node: NodeId,
    pub incarnation: Incarnation,
    pub deps: Vec<Dep>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DepsError {
    #[error("dependency header is longer than {DEPS_HEADER_BYTES_MAX} bytes")]
    TooLong,
    #[error("dependency header has more than {DEPS_KEYS_MAX} keys")]
    TooManyKeys,
    #[error("dependency header names no keys")]
    NoKeys,
    #[error("malformed dependency header: {0}")]
    Malformed(String),
    #[error("invalid dependency key {key:?}: {reason}")]
    BadKey { key: String, reason: &'static str },
}

/// Checks a dependency key: 1–128 bytes of `[A-Za-z0-9/_.:-]`.
pub fn validate_key(key: &str) -> Result<(), DepsError> {
    let bad = |reason| DepsError::BadKey { key: key.chars().take(KEY_BYTES_MAX).collect(), reason };
    if key.is_empty() {
        return Err(bad("empty"));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(bad("longer than 128 bytes"));
    }
    if !key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'.' | b':' | b'-')) {
        return Err(bad("only letters, digits and / _ . : - are allowed"));
    }
    Ok(())
}

impl DepsHeader {
    pub fn parse(value: &str) -> Result<DepsHeader, DepsError> {
        if value.len() > DEPS_HEADER_BYTES_MAX {
            return Err(DepsError::TooLong);
        }
        let malformed = |what: &str| DepsError::Malformed(what.to_string());
        let mut parts = value.trim().splitn(3, ';');
        let node = parts
            .next()
            .and_then(|p| p.strip_prefix("n="))
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| malformed("expected n=<node> first"))?;
        let incarnation = parts
            .next()
            .and_then(|p| p.strip_prefix("i="))
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| malformed("expected i=<16 hex digits> second"))?;
        let list = parts.next().ok_or(DepsError::NoKeys)?;
        let mut deps = Vec::new();
        for item in list.split(',') {
            if deps.len() == DEPS_KEYS_MAX {
                return Err(DepsError::TooManyKeys);
            }
            let (key, rest) = item.rsplit_once('=').ok_or_else(|| malformed("expected <key>=<version>@<slot>"))?;
            let (version, slot) = rest.split_once('@').ok_or_else(|| malformed("expected <version>@<slot>"))?;
            validate_key(key)?;
            deps.push(Dep {
                key: key.to_string(),
                version: version.parse().map_err(|_| malformed("version is not a number"))?,
                slot: slot.parse().map_err(|_| malformed("slot is not a number"))?,
            });
        }
        if deps.is_empty() {
            return Err(DepsError::NoKeys);
        }
        Ok(DepsHeader { node: NodeId(node), incarnation: Incarnation(incarnation), deps })
    }
}

impl fmt::Display for DepsHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n={};i={:016x};", self.node.0, self.incarnation.0)?;
        for (i, dep) in self.deps.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={}@{}", dep.key, dep.version, dep.slot)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_documented_example() {
        let h = DepsHeader::parse("n=0;i=00c0ffee12345678;doc/7=5@17,stock/IBM=3@2").unwrap();
        assert_eq!(h.node, NodeId(0));
        assert_eq!(h.incarnation, Incarnation(0x00c0_ffee_1234_5678));
        assert_eq!(h.deps[1], Dep { key: "stock/IBM".into(), version: 3, slot: 2 });
        assert_eq!(h.to_string(), "n=0;i=00c0ffee12345678;doc/7=5@17,stock/IBM=3@2");
    }

    #[test]
    fn rejects_malformed_headers() {
        for bad in [
            "",
            "i=00c0ffee12345678;n=0;a=1@1",
            "n=0;i=abc;a=1@1",
            "n=0;i=00c0ffee12345678;",
            "n=0;i=00c0ffee12345678;a=1",
            "n=0;i=00c0ffee12345678;a=x@1",
            "n=0;i=00c0ffee12345678;a=1@-1",
            "n=0;i=00c0ffee12345678;a b=1@1",
            "n=x;i=00c0ffee12345678;a=1@1",
        ] {
            assert!(DepsHeader::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let many: Vec<String> = (0..65).map(|i| format!("k{i}=1@{i}")).collect();
        let header = format!("n=0;i=00c0ffee12345678;{}", many.join(","));
        assert_eq!(DepsHeader::parse(&header), Err(DepsError::TooManyKeys));
        assert_eq!(DepsHeader::parse(&"x".repeat(20_000)), Err(DepsError::TooLong));
    }

    proptest! {
        #[test]
        fn round_trips(node in 0u32..4096, inc in any::<u64>(),
                       deps in proptest::collection::vec(("[a-z0-9/_.:-]{1,20}", any::<u64>(), any::<u32>()), 1..10)) {
            let header = DepsHeader {
                node: NodeId(node),
                incarnation: Incarnation(inc),
                deps: deps.into_iter().map(|(key, version, slot)| Dep { key, version, slot }).collect(),
            };
            prop_assert_eq!(DepsHeader::parse(&header.to_string()).unwrap(), header);
        }

        #[test]
        fn never_panics(text in ".{0,200}") {
            let _ = DepsHeader::parse(&text);
        }
    }
}
