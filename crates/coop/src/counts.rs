//! Table 2's accounting: messages per primitive, by the counting rule of
//! seed-notes a.3.
//!
//! A primitive is **charged** with the messages its initiator sends, the
//! one-sided operations it issues, the one-sided operations others issue on
//! its buffers as part of the primitive, and the acknowledgments addressed
//! to it. It is **not** charged with metadata updates that other nodes send
//! as a consequence (a storing peer recording itself as a holder; a swap
//! partner reporting both transfers; a home telling holders to drop an
//! invalidated entity): those are counted apart, as *consequential*. A
//! lookup searches the node's replica of the page tables and costs no
//! message; a metadata update addressed to the sender itself (it is the
//! home) is applied locally and costs none either.
//!
//! The service's default rule for a redundant copy's eviction (seed-notes
//! a.7 #7) adds the home's answer ([`MsgKind::RemoveGrant`]), charged like any
//! acknowledgment: one control message the paper's protocol does not have
//! (e.g. CCWR's fetch into a duplicate's slot with a remote home is 3,1).
//! `Model::with_last_copy_guard` counts it too; without it the model runs the
//! paper's protocol and reproduces Table 2 exactly.

use serde::Serialize;
use std::collections::BTreeMap;

/// The four cache primitives (coop §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Primitive {
    Fetch,
    Store,
    Validate,
    Invalidate,
}

impl Primitive {
    pub const ALL: [Primitive; 4] = [Self::Fetch, Self::Store, Self::Validate, Self::Invalidate];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Store => "store",
            Self::Validate => "validate",
            Self::Invalidate => "invalidate",
        }
    }
}

/// Every message type the schemes exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MsgKind {
    /// Metadata update to a home: this node now holds the entity (send).
    AddHolder,
    /// Metadata update to a home: this node dropped its copy (send).
    RemoveHolder,
    /// Metadata update to a home from a swap partner or a storing peer:
    /// an entity moved or arrived (send; always consequential).
    Transfer,
    /// STORE(k): please take this entity, read it from my buffer (send).
    Store,
    /// The STORE's acknowledgment or notification back (send).
    StoreAck,
    /// Invalidate at the home (send).
    Invalidate,
    /// The home tells a holder to drop an invalidated copy (send).
    DropCopy,
    /// Metadata read of the home's key-table entry (one-sided read).
    HomeRead,
    /// The entity's bytes, read one-sidedly from the holder's pool.
    DataRead,
    /// Groupcache: GET to the owner (send).
    GroupGet,
    /// Groupcache: the owner's reply carrying the bytes (send).
    GroupReply,
    /// The home's answer to a guarded remove-holder (a redundant copy's
    /// eviction, seed-notes a.7 #7): granted or refused (send).
    RemoveGrant,
    /// Groupcache (the service): after the owner missed, the requester that
    /// loaded the entity offers it to the owner (send, carries the bytes).
    GroupPut,
}

impl MsgKind {
    pub const ALL: [MsgKind; 13] = [
        Self::AddHolder,
        Self::RemoveHolder,
        Self::Transfer,
        Self::Store,
        Self::StoreAck,
        Self::Invalidate,
        Self::DropCopy,
        Self::HomeRead,
        Self::DataRead,
        Self::GroupGet,
        Self::GroupReply,
        Self::GroupPut,
        Self::RemoveGrant,
    ];

    /// A data message (carries an entity's bytes) rather than control.
    pub fn is_data(self) -> bool {
        matches!(self, Self::DataRead | Self::GroupReply | Self::GroupPut)
    }

    /// Executed one-sidedly (no CPU of the target runs).
    pub fn is_one_sided(self) -> bool {
        matches!(self, Self::HomeRead | Self::DataRead)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::AddHolder => "add-holder",
            Self::RemoveHolder => "remove-holder",
            Self::Transfer => "transfer",
            Self::Store => "store",
            Self::StoreAck => "store-ack",
            Self::Invalidate => "invalidate",
            Self::DropCopy => "drop-copy",
            Self::HomeRead => "home-read",
            Self::DataRead => "data-read",
            Self::GroupGet => "group-get",
            Self::GroupReply => "group-reply",
            Self::GroupPut => "group-put",
            Self::RemoveGrant => "remove-grant",
        }
    }
}

/// Messages charged to one primitive call: (control, data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Charge {
    pub control: u32,
    pub data: u32,
}

/// Table 2 of the seed: the maximum (control, data) messages per primitive
/// (fetch, store, validate, invalidate), for the schemes it lists.
pub fn paper_table_2(scheme: &str) -> Option<[Charge; 4]> {
    let c = |control, data| Charge { control, data };
    match scheme {
        "bcc" => Some([c(2, 1), c(2, 1), c(1, 0), c(1, 0)]),
        "ccwr" | "mtacc" | "hybcc" => Some([c(2, 2), c(2, 1), c(1, 0), c(1, 0)]),
        _ => None,
    }
}

/// Per primitive: calls, totals and maxima.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrimitiveTally {
    pub calls: u64,
    pub control_total: u64,
    pub data_total: u64,
    pub control_max: u32,
    pub data_max: u32,
    /// Charged messages by type.
    pub by_kind: BTreeMap<MsgKind, u64>,
}

impl PrimitiveTally {
    /// The worst case seen, as Table 2 states it.
    pub fn max(&self) -> Charge {
        Charge { control: self.control_max, data: self.data_max }
    }

    /// Mean (control, data) per call.
    pub fn mean(&self) -> (f64, f64) {
        if self.calls == 0 {
            return (0.0, 0.0);
        }
        (self.control_total as f64 / self.calls as f64, self.data_total as f64 / self.calls as f64)
    }
}

/// Message counts of a run: per primitive (charged), and every message by
/// type with its bytes (charged or not).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub primitives: BTreeMap<Primitive, PrimitiveTally>,
    /// Every message, charged or consequential, by type.
    pub messages: BTreeMap<MsgKind, u64>,
    pub bytes: BTreeMap<MsgKind, u64>,
    /// Consequential messages (not charged to a primitive), by type.
    pub consequential: BTreeMap<MsgKind, u64>,
}

impl Tally {
    /// Records one primitive call and the messages it caused.
    pub fn record(&mut self, primitive: Primitive, messages: &[(MsgKind, u64, bool)]) -> Charge {
        let mut charge = Charge::default();
        let entry = self.primitives.entry(primitive).or_default();
        entry.calls += 1;
        for &(kind, bytes, charged) in messages {
            *self.messages.entry(kind).or_default() += 1;
            *self.bytes.entry(kind).or_default() += bytes;
            if charged {
                *entry.by_kind.entry(kind).or_default() += 1;
                if kind.is_data() {
                    charge.data += 1;
                } else {
                    charge.control += 1;
                }
            } else {
                *self.consequential.entry(kind).or_default() += 1;
            }
        }
        entry.control_total += u64::from(charge.control);
        entry.data_total += u64::from(charge.data);
        entry.control_max = entry.control_max.max(charge.control);
        entry.data_max = entry.data_max.max(charge.data);
        charge
    }

    /// Records a consequential message (sent by a node that did not initiate
    /// the primitive it belongs to).
    pub fn record_consequential(&mut self, kind: MsgKind, bytes: u64) {
        *self.messages.entry(kind).or_default() += 1;
        *self.bytes.entry(kind).or_default() += bytes;
        *self.consequential.entry(kind).or_default() += 1;
    }

    /// The tally of `primitive` (empty if never called).
    pub fn of(&self, primitive: Primitive) -> PrimitiveTally {
        self.primitives.get(&primitive).cloned().unwrap_or_default()
    }

    /// Adds `other` into this tally.
    pub fn merge(&mut self, other: &Tally) {
        for (p, t) in &other.primitives {
            let e = self.primitives.entry(*p).or_default();
            e.calls += t.calls;
            e.control_total += t.control_total;
            e.data_total += t.data_total;
            e.control_max = e.control_max.max(t.control_max);
            e.data_max = e.data_max.max(t.data_max);
            for (k, n) in &t.by_kind {
                *e.by_kind.entry(*k).or_default() += n;
            }
        }
        for (map, from) in [
            (&mut self.messages, &other.messages),
            (&mut self.bytes, &other.bytes),
            (&mut self.consequential, &other.consequential),
        ] {
            for (k, n) in from {
                *map.entry(*k).or_default() += n;
            }
        }
    }
}
