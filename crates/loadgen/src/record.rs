//! Compact records of responses and updates, and their JSON Lines log.
//!
//! A response record is 56 bytes plus, only when a response depends on more
//! than one key, a small boxed slice: keys are interned to [`KeyId`]s and
//! documents are indices into the trace's document set.

use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

/// An interned dependency key: one key name of one module (fabric node),
/// across all of that module's incarnations.
pub type KeyId = u32;

/// A version of a key, comparable across module incarnations.
///
/// `epoch` ranks the module's incarnation by when the checker first saw it
/// (in an update or a response; 0 = the first one seen, see
/// [`KeyTable::epoch`]), `version` is the header's version within that
/// incarnation. Stamps order lexicographically (epoch first): a restarted
/// module counts its versions from 1 again, and any version of a later
/// incarnation supersedes every version of an earlier one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Stamp {
    pub epoch: u32,
    pub version: u64,
}

impl Stamp {
    pub fn new(epoch: u32, version: u64) -> Self {
        Self { epoch, version }
    }
}

/// A key and a stamp of it.
pub type DepPair = (KeyId, Stamp);

/// Interns dependency keys per module node, and ranks each node's
/// incarnations by first sight.
#[derive(Debug, Default)]
pub struct KeyTable {
    ids: HashMap<(u32, Box<str>), KeyId>,
    names: Vec<Box<str>>,
    /// Per node: its incarnations, in the order first seen (index = epoch).
    incarnations: HashMap<u32, Vec<u64>>,
}

impl KeyTable {
    /// The id of `key` of module node 0, assigning the next one if it is new.
    pub fn intern(&mut self, key: &str) -> KeyId {
        self.intern_at(0, key)
    }

    /// The id of `key` of module node `node`, assigning the next one if it is
    /// new. Keys of different nodes are different keys; one key of two
    /// incarnations of a node is one key (its stamps tell them apart).
    pub fn intern_at(&mut self, node: u32, key: &str) -> KeyId {
        if let Some(&id) = self.ids.get(&(node, Box::from(key))) {
            return id;
        }
        let id = self.names.len() as KeyId;
        self.names.push(key.into());
        self.ids.insert((node, key.into()), id);
        id
    }

    /// The epoch of `node`'s `incarnation`: how many other incarnations of
    /// that node were seen before it (assigning the next epoch if it is new).
    pub fn epoch(&mut self, node: u32, incarnation: u64) -> u32 {
        let seen = self.incarnations.entry(node).or_default();
        match seen.iter().position(|&i| i == incarnation) {
            Some(epoch) => epoch as u32,
            None => {
                seen.push(incarnation);
                (seen.len() - 1) as u32
            }
        }
    }

    /// The incarnation `node`'s `epoch` stands for, if seen.
    pub fn incarnation(&self, node: u32, epoch: u32) -> Option<u64> {
        self.incarnations.get(&node)?.get(epoch as usize).copied()
    }

    /// The first id `key` was given, on any node, if it was interned.
    pub fn get(&self, key: &str) -> Option<KeyId> {
        self.ids.iter().filter(|((_, k), _)| &**k == key).map(|(_, &id)| id).min()
    }

    /// The name of `id` (`"?"` for an unknown id).
    pub fn name(&self, id: KeyId) -> &str {
        self.names.get(id as usize).map_or("?", |n| n)
    }

    /// Ids assigned, over every node.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// The `key → stamp` pairs a response carried (or an update produced).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Deps {
    #[default]
    None,
    /// One pair, inline (fields flattened so the enum stays 24 bytes).
    One {
        key: KeyId,
        epoch: u32,
        version: u64,
    },
    Many(Box<[DepPair]>),
}

impl Deps {
    /// Builds from pairs; one pair is stored inline.
    pub fn from_pairs(pairs: &[DepPair]) -> Self {
        match pairs {
            [] => Self::None,
            [(key, s)] => Self::One { key: *key, epoch: s.epoch, version: s.version },
            many => Self::Many(many.into()),
        }
    }

    /// One key at `version` of epoch 0 (tests and single-incarnation runs).
    pub fn one(key: KeyId, version: u64) -> Self {
        Self::One { key, epoch: 0, version }
    }

    /// Iterates the pairs.
    pub fn iter(&self) -> impl Iterator<Item = DepPair> + '_ {
        let (one, many): (Option<DepPair>, &[DepPair]) = match self {
            Self::None => (None, &[]),
            Self::One { key, epoch, version } => (Some((*key, Stamp::new(*epoch, *version))), &[]),
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
    /// Valid, but the header did not name the requested document's key or
    /// the self-checking body disagreed with it: not checked.
    Rejected,
    /// Not a 2xx: not examined.
    NotChecked,
}

/// One response the load client received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseRecord {
    /// Just before the request was handed to the connection (the staleness
    /// checkers' "request began").
    pub start_ns: u64,
    /// When the last body byte arrived.
    pub end_ns: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// Index into the trace's documents.
    pub doc: u32,
    /// Index into the run's targets.
    pub target: u16,
    /// The request stream (closed loop: the worker) it came from, and its
    /// 0-based position there (saturating at 2³² − 1): with the seed, these
    /// determine `doc` and `target`, and in the open loop the scheduled
    /// time (see [`crate::arrival`]).
    pub stream: u16,
    pub position: u32,
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
    target: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<CacheStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deps_state: Option<DepsState>,
    deps: std::collections::BTreeMap<&'a str, u64>,
    /// Each key's epoch (its module incarnation's rank), only when some
    /// key's epoch is not 0, i.e. after a module restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    epochs: Option<std::collections::BTreeMap<&'a str, u32>>,
}

impl RecordLog {
    fn path(&self, doc: u32) -> &str {
        self.documents.get(doc as usize).map_or("?", |p| p)
    }

    fn deps_map<'a>(&'a self, deps: &Deps) -> std::collections::BTreeMap<&'a str, u64> {
        deps.iter().map(|(k, s)| (self.keys.name(k), s.version)).collect()
    }

    fn epochs_map<'a>(&'a self, deps: &Deps) -> Option<std::collections::BTreeMap<&'a str, u32>> {
        deps.iter().any(|(_, s)| s.epoch > 0).then(|| deps.iter().map(|(k, s)| (self.keys.name(k), s.epoch)).collect())
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
                target: None,
                stream: None,
                position: None,
                bytes: None,
                cache: None,
                deps_state: None,
                deps: self.deps_map(&u.deps),
                epochs: self.epochs_map(&u.deps),
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
                target: Some(r.target),
                stream: Some(r.stream),
                position: Some(r.position),
                bytes: Some(r.bytes),
                cache: Some(r.cache),
                deps_state: Some(r.deps_state),
                deps: self.deps_map(&r.deps),
                epochs: self.epochs_map(&r.deps),
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
        let s = Stamp::new;
        assert_eq!(Deps::from_pairs(&[(3, s(1, 9))]).iter().collect::<Vec<_>>(), vec![(3, s(1, 9))]);
        assert!(matches!(Deps::from_pairs(&[(3, s(1, 9))]), Deps::One { key: 3, epoch: 1, version: 9 }));
        let many = Deps::from_pairs(&[(1, s(0, 2)), (3, s(2, 4))]);
        assert_eq!(many.iter().collect::<Vec<_>>(), vec![(1, s(0, 2)), (3, s(2, 4))]);
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
    fn one_key_of_two_incarnations_is_one_key_with_ranked_epochs() {
        let mut t = KeyTable::default();
        let a = t.intern_at(0, "doc/a");
        assert_eq!(t.intern_at(0, "doc/a"), a);
        assert_ne!(t.intern_at(1, "doc/a"), a, "another module's key of the same name is another key");
        // Epochs rank incarnations by first sight, whatever their values.
        assert_eq!((t.epoch(0, 0xbbbb), t.epoch(0, 0xaaaa), t.epoch(0, 0xbbbb)), (0, 1, 0));
        assert_eq!(t.epoch(1, 0xaaaa), 0, "epochs are per node");
        assert_eq!((t.incarnation(0, 1), t.incarnation(0, 2)), (Some(0xaaaa), None));
        assert!(Stamp::new(1, 1) > Stamp::new(0, u64::MAX), "a later incarnation supersedes any version");
        assert!(Stamp::new(0, 3) > Stamp::new(0, 2));
    }

    #[test]
    fn jsonl_has_one_object_per_record() {
        let mut log = RecordLog { documents: vec!["/doc/a".into()], ..RecordLog::default() };
        let k = log.keys.intern("doc/a");
        log.updates.push(UpdateRecord { start_ns: 1, end_ns: 2, doc: 0, status: 200, deps: Deps::one(k, 2) });
        log.responses.push(ResponseRecord {
            start_ns: 3,
            end_ns: 4,
            bytes: 10,
            doc: 0,
            target: 1,
            stream: 5,
            position: 7,
            status: 200,
            cache: CacheStatus::Hit,
            deps_state: DepsState::Ok,
            deps: Deps::from_pairs(&[(k, Stamp::new(1, 2))]),
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
            r#"{"type":"response","path":"/doc/a","status":200,"start_ns":3,"end_ns":4,"target":1,"stream":5,"position":7,"bytes":10,"cache":"HIT","deps_state":"ok","deps":{"doc/a":2},"epochs":{"doc/a":1}}"#
        );
    }
}
