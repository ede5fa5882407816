//! The distributed lock manager: N-CoShED, with SRSL and DQNL baselines.
//!
//! This crate owns cluster-wide locks named by [`LockId`], each kept at a
//! **home** node (chosen by hash among the configured lock servers) as a
//! 32-byte slot of four 64-bit words in the home's registered lock table
//! ([`word`], [`table`]). It knows nothing about what the locks protect.
//!
//! Main types: [`LockManager`] (one per node, over an `Arc<dyn Fabric>`),
//! its guards [`SharedGuard`] and [`ExclusiveGuard`] (with a fencing token),
//! [`LockError`]; the [`LockScheme`] trait behind which the three
//! [`Scheme`]s run; the pure protocol machines [`proto::LockClient`]
//! (N-CoShED and DQNL) and [`srsl`]; the wire format [`msg`]; the
//! measurements of Fig. 5 in [`mod@bench`]. `tests/model_check.rs` explores
//! every interleaving of the protocol machine for small configurations.
//!
//! # N-CoShED, precisely
//!
//! The paper gives the lock word (upper half: tail of the queue of exclusive
//! requesters; lower half: shared requests since the last exclusive
//! enqueue), compare-and-swap for exclusive and fetch-and-add for shared
//! requests, and grants passed from predecessor to successor. What it leaves
//! open is made precise here; the word is documented bit by bit in
//! [`word::LockWord`] (its upper half also carries a generation, for
//! `break_lock`).
//!
//! **Exclusive acquire by R.** Compare-and-swap the free word to
//! `(tail R, count 0)`, posted in one batch with a fetch-and-add on the
//! fence word: if the lock was free, R holds it with its fencing token after
//! one round trip that never involves the home's CPU. Otherwise R retries the
//! compare-and-swap with the word it saw until it becomes the tail. The word
//! it replaced, `(t, s)`, tells R where it stands — **this is how a
//! successor learns its predecessor**:
//! - `t` empty, `s = 0`: free; R holds the lock.
//! - `t = P`: P is R's predecessor, and exactly `s` shared requests enqueued
//!   between P and R (each saw tail P). R sends P `Successor { shared: s }`
//!   (so **the predecessor learns its successor, and the shared count is
//!   handed over in that message**) and waits for `GrantExclusive` from P.
//! - `t` empty, `s > 0`: `s` *group-0* shared holders stand ahead (holders
//!   granted directly, nobody queued behind them, so nobody will message R).
//!   R registers in the lock's drain word ([`word::DrainWord`]) with target
//!   `s`; the group-0 holder whose release completes the target resets that
//!   word and sends R `Drained`.
//!
//! **Shared acquire by M.** Fetch-and-add 1. If the old word had no tail, M
//! holds the lock (group 0): one remote atomic. Otherwise M sends
//! `SharedRequest` to the tail Q it saw and waits for Q's `GrantShared`.
//! A shared request behind a queued exclusive therefore waits for it.
//!
//! **Exclusive release by Q — the hand-over of shared counts.**
//! - If Q has its successor's `Successor { shared: s }`: *coordinated
//!   handoff*. Q grants each of the `s` shared requests between them (as
//!   their messages arrive; some may still be in flight) with "release to
//!   me"; they overlap, and each sends `SharedRelease` back. After `s` grants
//!   and `s` releases, Q sends the successor `GrantExclusive`.
//! - Otherwise Q compare-and-swaps `(Q, k) → (empty, k)`, retrying with the
//!   count it sees: *conversion*. Its `k` shared requesters become group-0
//!   holders, counted in the word; Q grants each (arrived or in flight) with
//!   "group 0" and is done after `k` grants. If the swap fails because the
//!   tail moved on, a successor enqueued meanwhile: coordinated handoff.
//!   Uncontended, this is the one compare-and-swap `(Q, 0) → free`.
//!
//! **Shared release.** Coordinated holders message their coordinator.
//! Group-0 holders compare-and-swap the count down by one while the tail is
//! empty; if an exclusive R enqueued meanwhile (its swap took the count,
//! this holder included), they count themselves into the drain word instead.
//!
//! Every shared request is thereby accounted exactly once: in the count a
//! successor carries to its predecessor, in the count a conversion leaves in
//! the word, or in the group-0 count that an exclusive takes into the drain
//! word. Exclusives are granted in the order of their successful
//! compare-and-swaps (FIFO), each only by its predecessor after that
//! predecessor released and its shared group drained.
//!
//! **One request per node per lock.** The tail names a node, so a node has
//! at most one request per lock in the protocol; further local callers wait
//! in the node's cell. A released exclusive's handoff work is part of its
//! request; the node's next request for the lock starts after it (it would
//! queue behind the successor anyway).
//!
//! The model check explores all interleavings of atomics, message deliveries
//! (in any order), releases and abandons for 2–4 nodes and up to three
//! requests each, checking mutual exclusion, shared overlap, FIFO among
//! exclusives, shared requests never overtaking or overtaken by exclusives,
//! strictly increasing tokens, and that every terminal state has every
//! request granted and the home words back to zero (no deadlock, no lost
//! wake-up; the state graph has no cycles).
//!
//! # Costs
//!
//! | | N-CoShED | DQNL | SRSL |
//! |---|---|---|---|
//! | uncontended shared acquire | 1 fetch-and-add | as exclusive | 2 messages via the home's CPU |
//! | uncontended exclusive acquire | 1 round trip: batch of compare-and-swap + token fetch-and-add | same | 2 messages |
//! | uncontended release | 1 compare-and-swap | same | 1 message |
//! | handoff to the next exclusive | 1 message + 1 token fetch-and-add | same | 2 messages via the home |
//! | handoff to N queued shared | N messages sent at once by the releaser | N sequential handoffs | release + N grants via the home |
//!
//! # Fencing tokens
//!
//! The fence word (one per lock, at the home) counts exclusive grants. Each
//! exclusive grantee fetch-and-adds it *inside its hold*: in the same batch
//! as the uncontended compare-and-swap, or right after a queued grant,
//! before the caller sees the guard. Holds are disjoint, so tokens strictly
//! increase in grant order; a batch whose compare-and-swap failed wastes its
//! fetch-and-add, leaving only a gap. SRSL's server adds to its own fence
//! word when it grants. A resource that remembers the largest token it has
//! seen rejects a stale holder — the standard answer to the Redlock critique.
//!
//! # Timeouts, dead peers and `break_lock`
//!
//! A timed-out request cannot leave the middle of a distributed queue, so it
//! stays queued, marked abandoned, and is released the moment it is granted:
//! a timeout never leaves a hole. The error names the node the request waits
//! for (predecessor or coordinator; the home for SRSL); the waiter probes
//! that node's liveness word, and reports [`LockError::PeerDead`] if it is
//! dead.
//!
//! A holder that dies wedges its lock: its successors' grants never come.
//! Recovery is explicit — an administrator or supervisor that has decided
//! the node is dead calls [`LockManager::break_lock`]. It bumps the fence
//! word (returning the *floor*: every earlier token is below it, every later
//! one above it), moves the drain word and then the lock word to a new
//! generation, free, and tells every node. Old-generation participants fail:
//! waiters get [`LockError::Broken`], a holder's release returns `Broken`,
//! and any compare-and-swap they still attempt fails on the generation.
//! Breaking is not automatic on purpose: a holder that is merely paused
//! cannot be stopped by taking its lock away, only by fencing, so the
//! decision that a node is dead belongs to whoever can make it; an automatic
//! policy (break when the holder is probed dead) can be layered on top. One
//! window remains on `shm`: the two atomics of the uncontended batch are two
//! instructions of the acquirer's thread, so a process stopped exactly
//! between them and broken meanwhile can later fetch a token above the
//! floor. An RDMA adapter executes the batch without the process.
//!
//! A home that dies takes its lock table with it: requests fail with
//! `PeerDead` on every backend (on `shm` the fabric revokes a closed or
//! reclaimed owner's regions, as RDMA invalidates a dead owner's keys, so
//! peers that mapped the table before cannot go on using orphaned memory).
//!
//! # Limits and the runtime
//!
//! Each home's table has a fixed number of slots (`DlmConfig::table_slots`,
//! at most [`table::TABLE_SLOTS_MAX`]); a full table is
//! [`LockError::TableFull`]. Node ids must fit 16 bits. Locks must be created
//! before use ([`LockError::UnknownLock`]). Atomics are executed
//! synchronously by whichever thread drives a node's cell for the lock, so
//! the machine sees each atomic's result before any other input. Messages
//! are 24 bytes and start with the service tag [`msg::SERVICE_TAG`] (`0x01`);
//! by default each manager runs a thread that owns its fabric's inbox, and a
//! node that runs several services switches that off and feeds
//! [`LockManager::handle_message`] from a demultiplexer.

pub mod bench;
mod error;
pub mod msg;
pub mod proto;
mod runtime;
pub mod srsl;
pub mod table;
pub mod word;

pub use error::LockError;
pub use proto::{LockMode, QueueKind};
pub use runtime::{
    DlmConfig, DlmStats, ExclusiveGuard, Grant, LockManager, LockScheme, Scheme, SharedGuard, Wait, RECEIVE_POLL_MS,
    TRY_REPLY_TIMEOUT_MS_DEFAULT,
};

use std::fmt;

/// Names a lock cluster-wide. `u64::MAX` is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockId(pub u64);

impl fmt::Display for LockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock {}", self.0)
    }
}
