//! Compact records of responses and updates, and their JSON Lines log.
//!
//! A response record is 56 bytes plus, only when a response depends on more
//! than one key, a small boxed slice: keys are interned to [`KeyId`]s and
//! documents are indices into the trace's document set.

use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

/// An interned dependency key.
pub type KeyId = u32;

/// A key and a version of it.
pub type DepPair = (KeyId, u64);

/// The version space a key's versions belong to: the module's fabric node
/// and incarnation from the header. A restarted module counts its versions
/// from 1 again, so versions are compared only within one space.
pub type VersionSpace = (u32, u64);

/// Interns dependency keys, per [`VersionSpace`].
#[derive(Debug, Default)]
pub struct KeyTable {
    ids: HashMap<VersionSpace, HashMap<Box<str>, KeyId>>,
    names: Vec<Box<str>>,
}

impl KeyTable {
    /// The id of `key` in the default space `(0, 0)`, assigning the next one if it is new.
    pub fn intern(&mut self, key: &str) -> KeyId {
        self.intern_in((0, 0), key)
    }

    /// The id of `key` in `space`, assigning the next one if it is new: one
    /// key of two module incarnations gets two ids.
    pub fn intern_in(&mut self, space: VersionSpace, key: &str) -> KeyId {
        let ids = self.ids.entry(space).or_default();
        if let Some(&id) = ids.get(key) {
            return id;
        }
        let id = self.names.len() as KeyId;
        self.names.push(key.into());
        ids.insert(key.into(), id);
        id
    }

    /// The first id `key` was given, in any space, if it was interned.
    pub fn get(&self, key: &str) -> Option<KeyId> {
        self.ids.values().filter_map(|ids| ids.get(key)).copied().min()
    }

    /// The name of `id` (`"?"` for an unknown id).
    pub fn name(&self, id: KeyId) -> &str {
        self.names.get(id as usize).map_or("?", |n| n)
    }

    /// Ids assigned, over every space.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// The `key → version` pairs a response carried (or an update produced).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Deps {
    #[default]
    None,
    One(KeyId, u64),
    Many(Box<[(KeyId, u64)]>),
}

impl Deps {
    /// Builds from pairs; one pair is stored inline.
    pub fn from_pairs(pairs: &[(KeyId, u64)]) -> Self {
        match pairs {
            [] => Self::None,
            [(k, v)] => Self::One(*k, *v),
            many => Self::Many(many.into()),
        }
    }

    /// Iterates the pairs.
    pub fn iter(&self) -> impl Iterator<Item = (KeyId, u64)> + '_ {
        let (one, many): (Option<DepPair>, &[DepPair]) = match self {
            Self::None => (None, &[]),
            Self::One(k, v) => (Some((*k, *v)), &[]),
            Self::Many(pairs) => (None, pairs),
        };
        one.into_iter().chain(many.iter().copied())
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }
}

/// The proxy's verdict, from `X-Cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CacheStatus {
    Hit,
    Miss,
    /// No `X-Cache` header, or an unrecognized value.
    Unknown,
}

impl CacheStatus {
    pub fn from_header(value: Option<&[u8]>) -> Self {
        match value {
            Some(v) if v.eq_ignore_ascii_case(b"HIT") => Self::Hit,
            Some(v) if v.eq_ignore_ascii_case(b"MISS") => Self::Miss,
            _ => Self::Unknown,
        }
    }
}

/// What became of a response's dependency header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DepsState {
    /// Parsed; checked for staleness.
    Ok,
    /// A 2xx without the header.
    Missing,
    /// Present but not per the contract.
    Malformed,
    /// Not a 2xx: not examined.
    NotChecked,
}

/// One response the load client received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseRecord {
    /// Just before the request was handed to the connection.
    pub start_ns: u64,
    /// When the last body byte arrived.
    pub end_ns: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// Index into the trace's documents.
    pub doc: u32,
    pub status: u16,
    pub cache: CacheStatus,
    pub deps_state: DepsState,
    pub deps: Deps,
}

/// One update the updater completed (a 2xx with a valid header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateRecord {
    pub start_ns: u64,
    /// When its response was received: from here on, no response may carry
    /// an older version of its keys.
    pub end_ns: u64,
    pub doc: u32,
    pub status: u16,
    /// The new versions.
    pub deps: Deps,
}

/// Everything one run recorded, when records are kept.
#[derive(Debug, Default)]
pub struct RecordLog {
    /// Document paths, indexed by `doc`.
    pub documents: Vec<String>,
    pub keys: KeyTable,
    pub responses: Vec<ResponseRecord>,
    pub updates: Vec<UpdateRecord>,
    /// Responses not kept because the log was full (they were still checked).
    pub responses_dropped: u64,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    path: &'a str,
    status: u16,
    start_ns: u64,
    end_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<CacheStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deps_state: Option<DepsState>,
    deps: std::collections::BTreeMap<&'a str, u64>,
}

impl RecordLog {
    fn path(&self, doc: u32) -> &str {
        self.documents.get(doc as usize).map_or("?", |p| p)
    }

    fn deps_map<'a>(&'a self, deps: &Deps) -> std::collections::BTreeMap<&'a str, u64> {
        deps.iter().map(|(k, v)| (self.keys.name(k), v)).collect()
    }

    /// Writes one JSON object per line: first the updates
    /// (`{"type":"update",…}`), then the responses (`{"type":"response",…}`),
    /// each in the order recorded.
    pub fn write_jsonl<W: Write>(&self, mut w: W) -> std::io::Result<()> {
        for u in &self.updates {
            let line = JsonLine {
                kind: "update",
                path: self.path(u.doc),
                status: u.status,
                start_ns: u.start_ns,
                end_ns: u.end_ns,
                bytes: None,
                cache: None,
                deps_state: None,
                deps: self.deps_map(&u.deps),
            };
            serde_json::to_writer(&mut w, &line)?;
            w.write_all(b"\n")?;
        }
        for r in &self.responses {
            let line = JsonLine {
                kind: "response",
                path: self.path(r.doc),
                status: r.status,
                start_ns: r.start_ns,
                end_ns: r.end_ns,
                bytes: Some(r.bytes),
                cache: Some(r.cache),
                deps_state: Some(r.deps_state),
                deps: self.deps_map(&r.deps),
            };
            serde_json::to_writer(&mut w, &line)?;
            w.write_all(b"\n")?;
        }
        w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_stay_compact() {
        assert!(std::mem::size_of::<ResponseRecord>() <= 64, "{}", std::mem::size_of::<ResponseRecord>());
        assert!(std::mem::size_of::<Deps>() <= 24);
    }

    #[test]
    fn deps_iterate_in_every_shape() {
        assert_eq!(Deps::from_pairs(&[]).iter().count(), 0);
        assert_eq!(Deps::from_pairs(&[(3, 9)]).iter().collect::<Vec<_>>(), vec![(3, 9)]);
        assert!(matches!(Deps::from_pairs(&[(3, 9)]), Deps::One(3, 9)));
        let many = Deps::from_pairs(&[(1, 2), (3, 4)]);
        assert_eq!(many.iter().collect::<Vec<_>>(), vec![(1, 2), (3, 4)]);
    }

    #[test]
    fn keys_intern_once() {
        let mut t = KeyTable::default();
        let a = t.intern("doc/a");
        assert_eq!(t.intern("doc/b"), a + 1);
        assert_eq!(t.intern("doc/a"), a);
        assert_eq!((t.name(a), t.get("doc/b"), t.get("nope"), t.name(99)), ("doc/a", Some(a + 1), None, "?"));
    }

    #[test]
    fn one_key_of_two_module_incarnations_gets_two_ids() {
        let mut t = KeyTable::default();
        let before = t.intern_in((0, 0xaaaa), "doc/a");
        let after = t.intern_in((0, 0xbbbb), "doc/a");
        assert_ne!(before, after);
        assert_eq!(t.intern_in((0, 0xaaaa), "doc/a"), before);
        assert_eq!((t.name(before), t.name(after), t.len()), ("doc/a", "doc/a", 2));
        assert_eq!(t.get("doc/a"), Some(before));
    }

    #[test]
    fn jsonl_has_one_object_per_record() {
        let mut log = RecordLog { documents: vec!["/doc/a".into()], ..RecordLog::default() };
        let k = log.keys.intern("doc/a");
        log.updates.push(UpdateRecord { start_ns: 1, end_ns: 2, doc: 0, status: 200, deps: Deps::One(k, 2) });
        log.responses.push(ResponseRecord {
            start_ns: 3,
            end_ns: 4,
            bytes: 10,
            doc: 0,
            status: 200,
            cache: CacheStatus::Hit,
            deps_state: DepsState::Ok,
            deps: Deps::One(k, 2),
        });
        let mut out = Vec::new();
        log.write_jsonl(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            r#"{"type":"update","path":"/doc/a","status":200,"start_ns":1,"end_ns":2,"deps":{"doc/a":2}}"#
        );
        assert_eq!(
            lines[1],
            r#"{"type":"response","path":"/doc/a","status":200,"start_ns":3,"end_ns":4,"bytes":10,"cache":"HIT","deps_state":"ok","deps":{"doc/a":2}}"#
        );
    }
}
