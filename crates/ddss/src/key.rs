//! Keys, coherence models and placements, with their text forms.
//!
//! A [`Key`] is self-describing: it names the home node, the slot's offset
//! and size class in the home's region, the allocation's generation, and the
//! coherence model chosen at allocation. Any node that holds a key can get
//! and put without a directory lookup. Its 24-byte encoding, shown as 48 hex
//! digits, is three big-endian 64-bit words:
//!
//! ```text
//! word 0   home node (32) | slot offset in the home's region (32)
//! word 1   generation (32) | size class (8) | model (8) | zero (16)
//! word 2   model parameter: temporal max age in ms, delta versions, else 0
//! ```

use crate::error::{DdssError, Result};
use crate::layout::SIZE_CLASSES;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use tierstack_base::NodeId;

/// The coherence model of one allocation: what a `get` may return.
///
/// Definitions (a put's *version* is the number it returns; version 0 is the
/// empty value of a fresh allocation; "completed before" means the put's
/// response came before the get's invocation):
/// - `Null`: a get returns an untorn value that some put wrote (or the empty
///   initial value). A node may serve a local copy forever.
/// - `Temporal { max_age_ms }`: a get returns a value that was the current
///   (latest completed) value at some instant no more than `max_age_ms`
///   before the get, by the substrate's clock.
/// - `Delta { versions }`: a get returns version `v >= L - versions`, where
///   `L` is the highest version of a put completed before the get.
/// - `Read`: `Delta { versions: 0 }`: every get returns the latest completed
///   put (or a newer one in progress), checked by a one-sided version read.
/// - `Write`: the same guarantee as `Read`, at a higher cost: every get
///   moves the value from the home and no copy is kept. (The paper's write
///   coherence orders puts; every model's puts are ordered here, see below.)
/// - `Strict`: the same guarantee again, and gets exclude puts: a get takes
///   the key's lock word at the home, so it waits for (or, after
///   `lock_attempts_max`, fails with `LockBusy` behind) a put that holds it,
///   where read and write gets return the last completed value.
///
/// **What coincides, honestly.** Puts run the same code under all six
/// models (lock, one batch: see the crate docs), so they cost the same and
/// give every model write-ordered puts (unique consecutive versions in
/// real-time order). `Read`, `Write` and `Strict` give the same value
/// guarantee: the home holds the only copy that changes and every get of
/// theirs reads it, or checks against it, atomically, so their histories
/// are linearizable (`tests/histories.rs` checks read and write histories
/// with the linearizability checker too). They differ in cost (16-byte
/// version read and a local copy / the whole value / lock + value + unlock)
/// and in whether a get waits behind a put. `Delta { versions: 0 }` is
/// `Read`. The four distinct guarantees (null < temporal, delta < latest)
/// are told apart pairwise by scripted histories in `tests/histories.rs`.
///
/// Every model returns untorn values and monotonic versions per reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Coherence {
    Null,
    Temporal { max_age_ms: u64 },
    Delta { versions: u64 },
    Read,
    Write,
    Strict,
}

impl Coherence {
    /// Every model, with example parameters: for benchmarks and tests.
    pub fn examples() -> [Coherence; 6] {
        [
            Coherence::Null,
            Coherence::Temporal { max_age_ms: 10 },
            Coherence::Delta { versions: 2 },
            Coherence::Read,
            Coherence::Write,
            Coherence::Strict,
        ]
    }

    /// The model's name without its parameter.
    pub fn name(&self) -> &'static str {
        match self {
            Coherence::Null => "null",
            Coherence::Temporal { .. } => "temporal",
            Coherence::Delta { .. } => "delta",
            Coherence::Read => "read",
            Coherence::Write => "write",
            Coherence::Strict => "strict",
        }
    }

    fn code(&self) -> (u8, u64) {
        match *self {
            Coherence::Null => (0, 0),
            Coherence::Temporal { max_age_ms } => (1, max_age_ms),
            Coherence::Delta { versions } => (2, versions),
            Coherence::Read => (3, 0),
            Coherence::Write => (4, 0),
            Coherence::Strict => (5, 0),
        }
    }

    fn from_code(model: u8, param: u64) -> Option<Self> {
        let no_param = |c: Coherence| (param == 0).then_some(c);
        match model {
            0 => no_param(Coherence::Null),
            1 => Some(Coherence::Temporal { max_age_ms: param }),
            2 => Some(Coherence::Delta { versions: param }),
            3 => no_param(Coherence::Read),
            4 => no_param(Coherence::Write),
            5 => no_param(Coherence::Strict),
            _ => None,
        }
    }
}

impl fmt::Display for Coherence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Coherence::Temporal { max_age_ms } => write!(f, "temporal:{max_age_ms}"),
            Coherence::Delta { versions } => write!(f, "delta:{versions}"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Coherence {
    type Err = DdssError;

    /// `null`, `temporal:<ms>`, `delta:<versions>`, `read`, `write`, `strict`.
    fn from_str(text: &str) -> Result<Self> {
        let bad = || DdssError::Parse { what: "coherence model", text: text.to_string() };
        let (name, param) = match text.split_once(':') {
            Some((name, param)) => (name, Some(param.parse::<u64>().map_err(|_| bad())?)),
            None => (text, None),
        };
        match (name, param) {
            ("null", None) => Ok(Coherence::Null),
            ("temporal", Some(max_age_ms)) => Ok(Coherence::Temporal { max_age_ms }),
            ("delta", Some(versions)) => Ok(Coherence::Delta { versions }),
            ("read", None) => Ok(Coherence::Read),
            ("write", None) => Ok(Coherence::Write),
            ("strict", None) => Ok(Coherence::Strict),
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for Coherence {
    type Error = DdssError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<Coherence> for String {
    fn from(c: Coherence) -> String {
        c.to_string()
    }
}

/// Where an allocation's home is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Placement {
    /// The allocating node.
    Local,
    /// A named member node; allocated one-sidedly in its region.
    Node(NodeId),
    /// The member with the most free slots of the size class (by one-sided
    /// reads of each member's used-slot counters), ties broken by the seeded RNG.
    Auto,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Local => f.write_str("local"),
            Placement::Node(node) => write!(f, "node:{}", node.0),
            Placement::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for Placement {
    type Err = DdssError;

    /// `local`, `auto` or `node:<id>`.
    fn from_str(text: &str) -> Result<Self> {
        let bad = || DdssError::Parse { what: "placement", text: text.to_string() };
        match text {
            "local" => Ok(Placement::Local),
            "auto" => Ok(Placement::Auto),
            _ => {
                let id = text.strip_prefix("node:").ok_or_else(bad)?;
                Ok(Placement::Node(NodeId(id.parse().map_err(|_| bad())?)))
            }
        }
    }
}

impl TryFrom<String> for Placement {
    type Error = DdssError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<Placement> for String {
    fn from(p: Placement) -> String {
        p.to_string()
    }
}

/// A handle to one allocation. See the module docs for its encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Key {
    home: NodeId,
    offset: u32,
    generation: u32,
    class: u8,
    coherence: Coherence,
}

/// Bytes of a key's binary form.
pub const KEY_BYTES: usize = 24;

impl Key {
    pub(crate) fn new(home: NodeId, offset: u32, generation: u32, class: u8, coherence: Coherence) -> Self {
        Self { home, offset, generation, class, coherence }
    }

    /// The node whose region holds the value.
    pub fn home(&self) -> NodeId {
        self.home
    }

    /// The slot's byte offset in the home's region.
    pub fn offset(&self) -> u32 {
        self.offset
    }

    /// The allocation's generation: a slot freed and allocated again gets a
    /// new one, so an old key is detected rather than aliasing (no ABA).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The size class (capacity `8 << class` bytes).
    pub fn class(&self) -> u8 {
        self.class
    }

    pub fn capacity_bytes(&self) -> u32 {
        crate::layout::class_capacity(self.class)
    }

    pub fn coherence(&self) -> Coherence {
        self.coherence
    }

    pub fn to_bytes(&self) -> [u8; KEY_BYTES] {
        let (model, param) = self.coherence.code();
        let words = [
            (u64::from(self.home.0) << 32) | u64::from(self.offset),
            (u64::from(self.generation) << 32) | (u64::from(self.class) << 24) | (u64::from(model) << 16),
            param,
        ];
        let mut out = [0u8; KEY_BYTES];
        for (chunk, word) in out.chunks_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        out
    }

    /// Decodes and checks the binary form (a well-formed key may still name
    /// a slot that its home does not have; that is checked at use).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |reason: &str| DdssError::UnknownKey { key: hex(bytes), reason: reason.to_string() };
        if bytes.len() != KEY_BYTES {
            return Err(bad("a key is 24 bytes"));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_be_bytes(w)
        };
        let (w0, w1, param) = (word(0), word(1), word(2));
        let offset = w0 as u32;
        let generation = (w1 >> 32) as u32;
        let class = (w1 >> 24) as u8;
        let model = (w1 >> 16) as u8;
        if w1 & 0xffff != 0 {
            return Err(bad("reserved bits are set"));
        }
        if generation == 0 {
            return Err(bad("generation 0 is never allocated"));
        }
        if class as usize >= SIZE_CLASSES {
            return Err(bad("size class out of range"));
        }
        if !offset.is_multiple_of(8) {
            return Err(bad("slot offset is not 8-aligned"));
        }
        let coherence = Coherence::from_code(model, param).ok_or_else(|| bad("unknown coherence model"))?;
        Ok(Self { home: NodeId((w0 >> 32) as u32), offset, generation, class, coherence })
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.to_bytes()))
    }
}

impl FromStr for Key {
    type Err = DdssError;

    fn from_str(text: &str) -> Result<Self> {
        let bytes = unhex(text).ok_or_else(|| DdssError::UnknownKey {
            key: text.to_string(),
            reason: "a key is 48 hexadecimal digits".into(),
        })?;
        Key::from_bytes(&bytes)
    }
}

impl TryFrom<String> for Key {
    type Error = DdssError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<Key> for String {
    fn from(k: Key) -> String {
        k.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn coherence() -> impl Strategy<Value = Coherence> {
        prop_oneof![
            Just(Coherence::Null),
            any::<u64>().prop_map(|max_age_ms| Coherence::Temporal { max_age_ms }),
            any::<u64>().prop_map(|versions| Coherence::Delta { versions }),
            Just(Coherence::Read),
            Just(Coherence::Write),
            Just(Coherence::Strict),
        ]
    }

    proptest! {
        #[test]
        fn keys_round_trip_through_bytes_text_and_json(
            home in any::<u32>(), offset in any::<u32>(), generation in 1u32.., class in 0u8..SIZE_CLASSES as u8,
            coherence in coherence(),
        ) {
            let key = Key::new(NodeId(home), offset & !7, generation, class, coherence);
            prop_assert_eq!(Key::from_bytes(&key.to_bytes()).unwrap(), key);
            prop_assert_eq!(key.to_string().parse::<Key>().unwrap(), key);
            let json = serde_json::to_string(&key).unwrap();
            prop_assert_eq!(serde_json::from_str::<Key>(&json).unwrap(), key);
            prop_assert_eq!(coherence.to_string().parse::<Coherence>().unwrap(), coherence);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..30)) {
            let _ = Key::from_bytes(&bytes);
        }
    }

    #[test]
    fn malformed_keys_are_typed_errors() {
        let key = Key::new(NodeId(1), 64, 1, 0, Coherence::Null);
        let mut bytes = key.to_bytes();
        bytes[8..12].copy_from_slice(&[0; 4]); // generation 0
        assert!(matches!(Key::from_bytes(&bytes), Err(DdssError::UnknownKey { .. })));
        let mut bytes = key.to_bytes();
        bytes[13] = 0xff; // model 255
        assert!(matches!(Key::from_bytes(&bytes), Err(DdssError::UnknownKey { .. })));
        let mut bytes = key.to_bytes();
        bytes[12] = SIZE_CLASSES as u8; // class out of range
        assert!(matches!(Key::from_bytes(&bytes), Err(DdssError::UnknownKey { .. })));
        let mut bytes = key.to_bytes();
        bytes[15] = 1; // reserved
        assert!(matches!(Key::from_bytes(&bytes), Err(DdssError::UnknownKey { .. })));
        let mut bytes = key.to_bytes();
        bytes[7] = 65; // unaligned offset
        assert!(matches!(Key::from_bytes(&bytes), Err(DdssError::UnknownKey { .. })));
        let mut bytes = key.to_bytes();
        bytes[23] = 1; // a parameter on a parameterless model
        assert!(matches!(Key::from_bytes(&bytes), Err(DdssError::UnknownKey { .. })));
        assert!(matches!("xyz".parse::<Key>(), Err(DdssError::UnknownKey { .. })));
        assert!(matches!("00".parse::<Key>(), Err(DdssError::UnknownKey { .. })));
    }

    #[test]
    fn model_and_placement_text() {
        for (text, want) in [
            ("null", Coherence::Null),
            ("temporal:25", Coherence::Temporal { max_age_ms: 25 }),
            ("delta:3", Coherence::Delta { versions: 3 }),
            ("read", Coherence::Read),
            ("write", Coherence::Write),
            ("strict", Coherence::Strict),
        ] {
            assert_eq!(text.parse::<Coherence>().unwrap(), want);
        }
        for bad in ["", "temporal", "delta:x", "null:1", "strong"] {
            assert!(bad.parse::<Coherence>().is_err(), "{bad}");
        }
        assert_eq!("node:7".parse::<Placement>().unwrap(), Placement::Node(NodeId(7)));
        assert_eq!("auto".parse::<Placement>().unwrap(), Placement::Auto);
        assert_eq!(Placement::Local.to_string().parse::<Placement>().unwrap(), Placement::Local);
        assert!("node:".parse::<Placement>().is_err());
        assert!("remote".parse::<Placement>().is_err());
    }
}
