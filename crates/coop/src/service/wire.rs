//! The service's messages on `Channel::COOP_CACHE` and their byte format
//! (`docs/wire-format.md`, "Cooperative cache messages"): a tag byte, then
//! fixed little-endian fields; lists carry a u32 count first. Decoding
//! never panics; a malformed message is an error the receiver drops.

use crate::Key;

/// A message of the cooperative cache service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// To a home: the sender now holds `key`.
    AddHolder { key: Key },
    /// To a home: the sender dropped its copy of `key`.
    RemoveHolder { key: Key },
    /// To a home, from a storing peer or a swap partner: `key` moved.
    Transfer { key: Key, remove: Option<u32>, add: Option<u32> },
    /// Take these entities; read each from my pool at its pages. `swap_for`:
    /// the entity I am fetching from you (its copy at you is now redundant).
    Store { id: u64, swap_for: Option<Key>, items: Vec<Item> },
    /// The STORE's acknowledgment: how many items were placed, and how many
    /// one-sided reads of my buffers the receiver made.
    StoreAck { id: u64, placed: u32, reads: u32 },
    /// To a home: drop every copy of `key` and bump its version.
    Invalidate { key: Key },
    /// From a home: drop your copy of `key`.
    DropCopy { key: Key },
    /// The sender's page-table changes (the soft-state broadcast).
    Announce { free_pages: u32, held: Vec<Held>, dropped: Vec<Key> },
    /// Groupcache: GET `key` from its owner.
    GroupGet { id: u64, key: Key },
    /// Groupcache: the owner's answer, with the version and the bytes if it
    /// holds the entity.
    GroupReply { id: u64, found: Option<(u64, Vec<u8>)> },
    /// Groupcache: the requester loaded `key` after the owner missed; the
    /// owner keeps the only copy.
    GroupPut { key: Key, version: u64, body: Vec<u8> },
    /// To a home: I drop my copy of `key` because another copy exists;
    /// remove me as a holder if one does (seed-notes a.7 #7).
    RemoveIfShared { id: u64, key: Key },
    /// The home's answer: removed (`granted`) or refused (I hold the last copy).
    RemoveReply { id: u64, granted: bool },
    /// From a home: your add-holder for `key` was refused (its key-table
    /// window is full); drop your copy, so no copy exists that an
    /// invalidate could miss.
    Refused { key: Key },
    /// To a home: an invalidate that wants its acknowledgment (the sender
    /// learns whether the home applied it, or must fall back).
    Purge { id: u64, key: Key },
    /// The home's acknowledgment of a `Purge`: the version moved and every
    /// listed holder was sent its `DropCopy`.
    PurgeAck { id: u64 },
    /// Broadcast by a node at start, with a number new at each start: a
    /// node that knew another incarnation of the sender drops its copies of
    /// the keys the sender homes (a restarted home starts empty).
    Joined { incarnation: u64 },
}

/// An entity offered by a STORE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: Key,
    pub version: u64,
    pub bytes: u64,
    /// The sequence of the sender's record for the body's first page: the
    /// receiver checks it after reading, so a body evicted meanwhile is
    /// refused. [`UNCHECKED`] for a staging buffer (no record).
    pub seq: u64,
    /// The sender's pages holding the body, in order.
    pub pages: Vec<u32>,
}

/// [`Item::seq`] of a body in a staging buffer.
pub const UNCHECKED: u64 = u64::MAX;

/// One page-table record, as announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub key: Key,
    /// The record's sequence after it was written.
    pub seq: u64,
    pub bytes: u64,
    pub version: u64,
    pub pages: Vec<u32>,
}

/// A message that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed cooperative-cache message: {0}")]
pub struct WireError(pub &'static str);

/// Longest list in a message (pages of an entity, items, announced records).
pub const LIST_MAX: u32 = 1 << 16;

/// Longest body a groupcache message carries (the largest cacheable entity).
pub const BODY_MAX: u32 = crate::pool::ENTITY_PAGES_MAX * crate::pool::PAGE_BYTES as u32;

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn opt(&mut self, v: Option<u32>) {
        self.u32(v.map_or(u32::MAX, |n| n));
    }
    fn pages(&mut self, pages: &[u32]) {
        self.u32(pages.len() as u32);
        for &p in pages {
            self.u32(p);
        }
    }
    fn body(&mut self, body: &[u8]) {
        self.u32(body.len() as u32);
        self.0.extend_from_slice(body);
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        if self.0.len() < N {
            return Err(WireError("truncated"));
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().map_err(|_| WireError("truncated"))
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn opt(&mut self) -> Result<Option<u32>, WireError> {
        let v = self.u32()?;
        Ok((v != u32::MAX).then_some(v))
    }
    fn count(&mut self) -> Result<u32, WireError> {
        let n = self.u32()?;
        if n > LIST_MAX || n as usize > self.0.len() {
            return Err(WireError("list longer than the message"));
        }
        Ok(n)
    }
    fn pages(&mut self) -> Result<Vec<u32>, WireError> {
        let n = self.count()?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn body(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()?;
        if n > BODY_MAX || n as usize > self.0.len() {
            return Err(WireError("body longer than the message or the largest entity"));
        }
        let (head, rest) = self.0.split_at(n as usize);
        self.0 = rest;
        Ok(head.to_vec())
    }
}

impl Msg {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(32));
        match self {
            Msg::AddHolder { key } => {
                w.u8(1);
                w.u64(*key);
            }
            Msg::RemoveHolder { key } => {
                w.u8(2);
                w.u64(*key);
            }
            Msg::Transfer { key, remove, add } => {
                w.u8(3);
                w.u64(*key);
                w.opt(*remove);
                w.opt(*add);
            }
            Msg::Store { id, swap_for, items } => {
                w.u8(4);
                w.u64(*id);
                w.u8(u8::from(swap_for.is_some()));
                w.u64(swap_for.unwrap_or(0));
                w.u32(items.len() as u32);
                for it in items {
                    w.u64(it.key);
                    w.u64(it.version);
                    w.u64(it.bytes);
                    w.u64(it.seq);
                    w.pages(&it.pages);
                }
            }
            Msg::StoreAck { id, placed, reads } => {
                w.u8(5);
                w.u64(*id);
                w.u32(*placed);
                w.u32(*reads);
            }
            Msg::Invalidate { key } => {
                w.u8(6);
                w.u64(*key);
            }
            Msg::DropCopy { key } => {
                w.u8(7);
                w.u64(*key);
            }
            Msg::Announce { free_pages, held, dropped } => {
                w.u8(8);
                w.u32(*free_pages);
                w.u32(held.len() as u32);
                for h in held {
                    w.u64(h.key);
                    w.u64(h.seq);
                    w.u64(h.bytes);
                    w.u64(h.version);
                    w.pages(&h.pages);
                }
                w.u32(dropped.len() as u32);
                for k in dropped {
                    w.u64(*k);
                }
            }
            Msg::GroupGet { id, key } => {
                w.u8(9);
                w.u64(*id);
                w.u64(*key);
            }
            Msg::GroupReply { id, found } => {
                w.u8(10);
                w.u64(*id);
                w.u8(u8::from(found.is_some()));
                if let Some((version, body)) = found {
                    w.u64(*version);
                    w.body(body);
                }
            }
            Msg::GroupPut { key, version, body } => {
                w.u8(11);
                w.u64(*key);
                w.u64(*version);
                w.body(body);
            }
            Msg::RemoveIfShared { id, key } => {
                w.u8(12);
                w.u64(*id);
                w.u64(*key);
            }
            Msg::RemoveReply { id, granted } => {
                w.u8(13);
                w.u64(*id);
                w.u8(u8::from(*granted));
            }
            Msg::Refused { key } => {
                w.u8(14);
                w.u64(*key);
            }
            Msg::Purge { id, key } => {
                w.u8(15);
                w.u64(*id);
                w.u64(*key);
            }
            Msg::PurgeAck { id } => {
                w.u8(16);
                w.u64(*id);
            }
            Msg::Joined { incarnation } => {
                w.u8(17);
                w.u64(*incarnation);
            }
        }
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Msg, WireError> {
        let mut r = R(bytes);
        let msg = match r.u8()? {
            1 => Msg::AddHolder { key: r.u64()? },
            2 => Msg::RemoveHolder { key: r.u64()? },
            3 => Msg::Transfer { key: r.u64()?, remove: r.opt()?, add: r.opt()? },
            4 => {
                let id = r.u64()?;
                let has_swap = r.u8()? != 0;
                let swap = r.u64()?;
                let n = r.count()?;
                let items = (0..n)
                    .map(|_| {
                        Ok(Item { key: r.u64()?, version: r.u64()?, bytes: r.u64()?, seq: r.u64()?, pages: r.pages()? })
                    })
                    .collect::<Result<_, WireError>>()?;
                Msg::Store { id, swap_for: has_swap.then_some(swap), items }
            }
            5 => Msg::StoreAck { id: r.u64()?, placed: r.u32()?, reads: r.u32()? },
            6 => Msg::Invalidate { key: r.u64()? },
            7 => Msg::DropCopy { key: r.u64()? },
            8 => {
                let free_pages = r.u32()?;
                let n = r.count()?;
                let held = (0..n)
                    .map(|_| {
                        Ok(Held { key: r.u64()?, seq: r.u64()?, bytes: r.u64()?, version: r.u64()?, pages: r.pages()? })
                    })
                    .collect::<Result<_, WireError>>()?;
                let n = r.count()?;
                let dropped = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
                Msg::Announce { free_pages, held, dropped }
            }
            9 => Msg::GroupGet { id: r.u64()?, key: r.u64()? },
            10 => {
                let id = r.u64()?;
                let found = match r.u8()? {
                    0 => None,
                    1 => Some((r.u64()?, r.body()?)),
                    _ => return Err(WireError("bad found flag")),
                };
                Msg::GroupReply { id, found }
            }
            11 => Msg::GroupPut { key: r.u64()?, version: r.u64()?, body: r.body()? },
            12 => Msg::RemoveIfShared { id: r.u64()?, key: r.u64()? },
            13 => {
                let id = r.u64()?;
                let granted = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(WireError("bad granted flag")),
                };
                Msg::RemoveReply { id, granted }
            }
            14 => Msg::Refused { key: r.u64()? },
            15 => Msg::Purge { id: r.u64()?, key: r.u64()? },
            16 => Msg::PurgeAck { id: r.u64()? },
            17 => Msg::Joined { incarnation: r.u64()? },
            _ => return Err(WireError("unknown tag")),
        };
        if !r.0.is_empty() {
            return Err(WireError("trailing bytes"));
        }
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let msgs = vec![
            Msg::AddHolder { key: 7 },
            Msg::RemoveHolder { key: u64::MAX },
            Msg::Transfer { key: 1, remove: Some(2), add: None },
            Msg::Store {
                id: 9,
                swap_for: Some(3),
                items: vec![Item { key: 4, version: 1, bytes: 8192, seq: 6, pages: vec![0, 1] }],
            },
            Msg::StoreAck { id: 9, placed: 1, reads: 1 },
            Msg::Invalidate { key: 5 },
            Msg::DropCopy { key: 6 },
            Msg::Announce {
                free_pages: 12,
                held: vec![Held { key: 1, seq: 2, bytes: 3, version: 4, pages: vec![5] }],
                dropped: vec![8, 9],
            },
            Msg::GroupGet { id: 3, key: 4 },
            Msg::GroupReply { id: 3, found: None },
            Msg::GroupReply { id: 3, found: Some((2, vec![1, 2, 3])) },
            Msg::GroupPut { key: 4, version: 1, body: vec![9; 5000] },
            Msg::RemoveIfShared { id: 5, key: 6 },
            Msg::RemoveReply { id: 5, granted: true },
            Msg::RemoveReply { id: 5, granted: false },
            Msg::Refused { key: 3 },
            Msg::Purge { id: 4, key: 5 },
            Msg::PurgeAck { id: 4 },
            Msg::Joined { incarnation: 7 },
        ];
        for m in msgs {
            let bytes = m.encode();
            assert_eq!(Msg::decode(&bytes).unwrap(), m);
            for cut in 0..bytes.len() {
                assert!(Msg::decode(&bytes[..cut]).is_err());
            }
        }
        assert!(Msg::decode(&[0]).is_err());
        assert!(Msg::decode(&[8, 0, 0, 0, 0, 255, 255, 255, 255]).is_err());
        // A body length beyond the message or the largest entity.
        let mut put = Msg::GroupPut { key: 1, version: 0, body: vec![0; 4] }.encode();
        put[17..21].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Msg::decode(&put).is_err());
    }
}
