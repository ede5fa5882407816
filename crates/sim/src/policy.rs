//! The policy seam: where a cluster service's pure decisions plug into the
//! simulator.
//!
//! A policy is a state machine: events in, actions out (the sans-I/O style of
//! `dlm::proto`). The engine calls it when a request has been parsed at its
//! initial node ([`Policy::on_request`]), when a [`Action::Serve`] has the
//! document in memory ([`Policy::on_served`]), when a message it sent arrives
//! ([`Policy::on_message`]), and when any other action it asked for completes
//! ([`Policy::on_done`]). Each call gets a read-only [`View`] of the cluster
//! and appends [`Action`]s; the engine turns them into events and charges
//! their costs (CPU, NIC, wire, disk). A policy never sees time except through
//! the view and performs no I/O, so the same decision code can run in a real
//! server.
//!
//! How the planned services map onto it:
//! - **independent** (PRESS's traditional server, coop's AC): serve every
//!   request locally, reply ([`crate::Independent`]).
//! - **PRESS** (seed-notes c.1): `on_request` runs Fig. 1 over the policy's
//!   own `Servers[]` and piggy-backed loads, then `Serve` locally or `Send` a
//!   "forward" message; the service node `Serve`s and `Send`s a "file"
//!   message back (its token says where), and broadcasts "caching" messages
//!   when [`Served::inserted`] shows it started or stopped caching a file;
//!   the initial node `Reply`s on the file's arrival. Every delivery carries
//!   the sender's load ([`Delivery::sender_load`]), which is piggy-backing.
//!   The communication versions are [`Via`] and [`Copies`] choices.
//! - **cooperative caching** (seed-notes a.2): a local hit is a `Serve`; a
//!   remote hit is a [`Action::RemoteRead`] from the holder, then
//!   [`Action::CacheInsert`] (whose evictions come back in [`Outcome`]) and
//!   metadata `Send`s to home nodes, then `Reply`; a miss `Serve`s from the
//!   disk (the back end).

use std::collections::BTreeMap;
use tierstack_model::{ByteLru, Inserted, Storage};

/// A document of the trace, by its index in `Trace::documents()`.
pub type DocId = usize;

/// Names one client request for the whole run (dense, from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// A client request as a policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    /// The node the client sent it to (holds the client's connection).
    pub initial: usize,
    pub doc: DocId,
    /// The document's size.
    pub bytes: u64,
}

/// Whether a [`Action::Serve`] may cache what it reads (the storage's own
/// switch: `Normal` inserts after a miss unless the object is above the
/// node's object bound; `Bypass` never inserts, as PRESS does for files of
/// `max_size` or more).
pub use tierstack_model::Caching;

/// How a [`Action::Send`] travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A two-sided message: the sender's and the receiver's CPUs both run
    /// (the chosen `messages` transport).
    Message,
    /// A one-sided write into the receiver's memory, which the receiver finds
    /// by polling (the `remote_write` transport; the receiver pays `poll_ns`).
    RemoteWrite,
}

/// Copies a policy makes of a payload itself, beyond the transport's own
/// (e.g. PRESS Base copies at both ends; Zero at neither).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copies {
    pub sender: u32,
    pub receiver: u32,
}

/// What a policy asks the engine to do. `T` is the policy's token, handed back
/// with the completion; `M` is its message payload.
#[derive(Clone, Debug, PartialEq)]
pub enum Action<M, T> {
    /// Get the request's document into `node`'s memory the way
    /// `tierstack origin`'s storage does, decided now: lookup (touch); on a
    /// miss, a read queued at the node's FIFO disk and an insert at once
    /// (unless [`Caching::Bypass`] or the object is above the node's object
    /// bound), so a later request for it is a hit that waits for the read in
    /// flight. Completes with [`Policy::on_served`] when the bytes are in
    /// memory.
    Serve { node: usize, request: RequestId, caching: Caching, token: T },
    /// Send the reply (header + body) from `node` to the request's client:
    /// one copy of the body on `node`'s CPU, then its NIC, then the client
    /// network. Ends the request; every request must end exactly once.
    Reply { node: usize, request: RequestId },
    /// A message of `bytes` from `from` to `to`, delivered to
    /// [`Policy::on_message`]. `kind` labels it in the report.
    Send { from: usize, to: usize, kind: &'static str, bytes: u64, via: Via, copies: Copies, payload: M },
    /// A one-sided read of `bytes` of `target`'s memory by `from`; the data
    /// crosses `target`'s NIC, its CPU never runs. Completes at `from`.
    RemoteRead { from: usize, target: usize, kind: &'static str, bytes: u64, token: T },
    /// A one-sided write of `bytes` into `target`'s memory, which `target` is
    /// not told about. Completes at `from` when the bytes have landed.
    RemoteWrite { from: usize, target: usize, kind: &'static str, bytes: u64, token: T },
    /// A read of `bytes` through `node`'s disk, with no cache involved.
    DiskRead { node: usize, bytes: u64, token: T },
    /// `ns` of `node`'s CPU (e.g. a lookup's cost).
    Compute { node: usize, ns: u64, token: T },
    /// Store `doc` in `node`'s cache now, its bytes already in memory;
    /// completes with [`Outcome::Inserted`]. Like a `Serve`'s insert, it
    /// never stores a document above the node's object bound (nor anything
    /// in a cache of 0 bytes): then `stored` is false.
    CacheInsert { node: usize, doc: DocId, token: T },
    /// Look `doc` up in `node`'s cache now (a hit becomes most recent);
    /// completes with [`Outcome::Touched`].
    CacheTouch { node: usize, doc: DocId, token: T },
    /// Drop `doc` from `node`'s cache now (no completion).
    CacheRemove { node: usize, doc: DocId },
}

/// A [`Action::Serve`] has the document in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Served<T> {
    pub node: usize,
    pub request: Request,
    /// Found in the cache (no disk read).
    pub hit: bool,
    /// After a miss with [`Caching::Normal`]: what the insert (made at the
    /// miss) did, e.g. the evictions a PRESS node would broadcast.
    pub inserted: Option<Inserted<DocId>>,
    pub token: T,
}

/// A [`Action::Send`] arrived and its receive costs are paid.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery<M> {
    pub from: usize,
    pub to: usize,
    pub kind: &'static str,
    pub bytes: u64,
    /// The sender's load when it sent (piggy-backed on every message).
    pub sender_load: u32,
    pub payload: M,
}

/// What a completed action produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Inserted(Inserted<DocId>),
    Touched { hit: bool },
}

/// Any action other than `Serve`, `Reply`, `Send` and `CacheRemove` completed.
#[derive(Clone, Debug, PartialEq)]
pub struct Done<T> {
    /// The node that asked (the initiator).
    pub node: usize,
    pub outcome: Outcome,
    pub token: T,
}

/// The actions a policy call appends to.
pub type Actions<P> = Vec<Action<<P as Policy>::Message, <P as Policy>::Token>>;

/// A cluster policy: the decisions of a service, as a pure state machine.
pub trait Policy {
    /// What its messages carry.
    type Message;
    /// What it gets back with a completion (its continuation).
    type Token;

    /// The name reported.
    fn name(&self) -> &'static str;

    /// `request` has arrived at `node` (its initial node) and been parsed.
    fn on_request(&mut self, view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>);

    /// A [`Action::Serve`] completed.
    fn on_served(&mut self, view: &View<'_>, served: Served<Self::Token>, out: &mut Actions<Self>);

    /// A message arrived.
    fn on_message(&mut self, view: &View<'_>, delivery: Delivery<Self::Message>, out: &mut Actions<Self>) {
        let _ = (view, delivery, out);
    }

    /// Another action completed.
    fn on_done(&mut self, view: &View<'_>, done: Done<Self::Token>, out: &mut Actions<Self>) {
        let _ = (view, done, out);
    }

    /// Counts only the policy knows (e.g. remote hits), added to the report.
    fn counters(&self) -> BTreeMap<String, u64> {
        BTreeMap::new()
    }
}

/// What a policy may look at: the time, every node's cache and exact load.
///
/// A realistic policy reads only its own node's cache and load exactly, and
/// learns about others from messages (as PRESS does from broadcasts and
/// piggy-backed loads); the view offers all of it so that oracle policies can
/// be written as baselines too.
pub struct View<'a> {
    pub(crate) now_ns: u64,
    pub(crate) stores: &'a [Storage<DocId>],
    pub(crate) loads: &'a [u32],
    pub(crate) document_bytes: &'a [u64],
}

impl View<'_> {
    /// Simulated time in nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    pub fn node_count(&self) -> usize {
        self.stores.len()
    }

    /// `node`'s memory cache.
    pub fn cache(&self, node: usize) -> Option<&ByteLru<DocId>> {
        self.stores.get(node).map(Storage::cache)
    }

    /// Requests `node` holds now: client connections it accepted and has not
    /// yet answered, plus serves it runs for other nodes (PRESS's "open
    /// connections", seed-notes c.7 #3).
    pub fn load(&self, node: usize) -> u32 {
        self.loads.get(node).copied().unwrap_or(0)
    }

    /// The size of `doc`.
    pub fn document_bytes(&self, doc: DocId) -> u64 {
        self.document_bytes.get(doc).copied().unwrap_or(0)
    }
}

/// Independent nodes: PRESS's traditional (locality-oblivious) server, coop's
/// AC. Every node serves its own requests from its own cache or disk.
#[derive(Clone, Copy, Debug, Default)]
pub struct Independent;

impl Policy for Independent {
    type Message = std::convert::Infallible;
    type Token = ();

    fn name(&self) -> &'static str {
        "independent"
    }

    fn on_request(&mut self, _view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        out.push(Action::Serve { node, request: request.id, caching: Caching::Normal, token: () });
    }

    fn on_served(&mut self, _view: &View<'_>, served: Served<()>, out: &mut Actions<Self>) {
        out.push(Action::Reply { node: served.node, request: served.request.id });
    }
}
