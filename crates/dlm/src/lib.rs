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
//! node side of the Fig. 5 measurements in [`harness`]. `tests/model_check.rs` and
//! `tests/model_check_srsl.rs` explore every interleaving of the protocol
//! machines for small configurations (what they cover: "Model check" below).
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
//! # Model check
//!
//! `tests/model_check.rs` runs the real [`proto::LockClient`] of 2–4 nodes
//! (up to three requests each) against a model home and a network that
//! delivers messages in any order, exploring every interleaving of:
//! atomics at the home; message deliveries; releases; abandons (a budget
//! per run); **a node's death** at any point (holding exclusive or shared,
//! queued, coordinating shared holders, moving the lock, holding a
//! barrier; its in-flight messages may still arrive or be lost) and the
//! monitor's report of it to each live node, so several waiters may race
//! to move the lock; **`break_lock`**, whose steps (lock-word swap, drain
//! reset, fence move, notices) interleave with everything else (one break
//! or one death per run, or one of each in a small configuration); and, in
//! the `split` configurations, **the parts of a batch** executed as
//! separate steps (as `shm` executes a batch op by op) with other nodes'
//! atomics and the move between them. It checks mutual exclusion among
//! live unrevoked holds of every generation (what the barrier is for),
//! shared overlap, FIFO among exclusives, shared requests never overtaking
//! or overtaken by exclusives, fencing tokens strictly increasing across
//! generations with each move's floor between the earlier and the later
//! ones, one move per generation, and that every terminal state has every
//! live node's request granted, refused or (after a break) revoked (a
//! death never costs a live node its request: no deadlock, no lost
//! wake-up; the state graph has no cycles). It found, and the code now
//! fixes, a node that learned the new generation from the drain word and
//! then enqueued in the old lock word, never to be aborted; and
//! old-generation grants whose tokens were above the floor.
//!
//! `tests/model_check_srsl.rs` runs the real [`srsl::SrslQueue`] and
//! [`srsl::SrslClient`]s over per-pair FIFO channels with a break, or a
//! client's death and the server's recovery, at any point, checking the same properties among unrevoked holders. It found,
//! and the code now fixes, a release that crossed a break (a protocol
//! violation at the server) and a hold's break notice that aborted the
//! holder's next request (leaving the server with a grant nobody held).
//!
//! `tests/model_check_rehome.rs` covers **a home's death and the
//! re-homing**: the real [`proto::LockClient`]s of 2 nodes (1–2 requests
//! each, a try-acquire) inside a model of the runtime around them (cells
//! per home epoch, views from a majority of membership words, claims whose
//! fence and per-server compare-and-swaps interleave and race, the move's
//! preparation and [`proto::Input::Rehome`], notices carrying the home
//! epoch and the rebuild: holds kept and acknowledged at release, waiters
//! requesting again, the monitor retiring cells of a dead home), with 3
//! servers of which one dies at any point (5 servers and two deaths behind
//! `TIERSTACK_MODEL_LARGE=1`), on tcp (a dead server's memory
//! is gone) and shm (its table stays mapped and serves atomics). It checks
//! mutual exclusion among holds of every home and epoch, tokens strictly
//! increasing over every grant with each move's floor above the earlier
//! ones, one home per epoch, and every request granted in every terminal
//! state. It found, and the runtime now fixes, an unsettled view claimed
//! again for its own (live) home: the home's slot moved again under cells
//! of the epoch it already served, one of which enqueued in the new epoch
//! and was then made to forget it (a node enqueued behind itself); an
//! unsettled view naming one home is now helped to its majority. It also
//! shows that the barrier alone keeps holds apart in what it explores: the
//! fence of the other slots matters for nodes the barrier stops waiting for
//! (lost by their lease), which it does not explore. Runs whose claims race
//! past epoch 2 (3 with two deaths) are cut: claiming forever is a livelock
//! the back-off between locate rounds breaks, not a safety question.
//!
//! **Not explored**: more than one break or death per run in
//! `model_check.rs`; in the re-homing model, three nodes (over a million
//! states), a client's death, a server's
//! restart or stop past its lease (the lease is not modelled: a dead server
//! is judged lost at once), breaks, abandons, split batches (a drive's
//! batches run as one step), views read server by server (read at once),
//! and the clock (the fence seed is taken to be above every count fetched);
//! leases (a lost report is
//! the same input whatever its cause); more than 4 nodes or
//! three requests per node; DQNL with a break beyond 2 nodes; the
//! runtime's own code around the machines (timeouts, the cell's queue of
//! local callers, fabric errors and `reset`), which the runtime tests
//! and the recovery tests cover. **Known window (SRSL)**: a
//! grant the server makes after the breaker's fence bump and before it
//! handles `Break` is revoked with a token above the floor (a test pins
//! it); closing it needs the floor to come from the server, a round trip.

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
//! before the caller sees the guard. Its token is
//! [`word::fencing_token`]`(generation, count)`: the lock-word generation
//! of the request in the high 16 bits, the count below. Holds of one
//! generation are disjoint, so tokens strictly increase in grant order; a
//! batch whose compare-and-swap failed wastes its fetch-and-add, leaving
//! only a gap. SRSL's server adds to its own fence word when it grants. A
//! resource that remembers the largest token it has seen rejects a stale
//! holder — the standard answer to the Redlock critique.

//! # Timeouts, dead peers, automatic recovery and `break_lock`
//!
//! A timed-out request cannot leave the middle of a distributed queue, so it
//! stays queued, marked abandoned, and is released the moment it is granted:
//! a timeout never leaves a hole. The error names the node the request waits
//! for (predecessor or coordinator; the home for SRSL); the waiter probes
//! that node's liveness word, and reports [`LockError::PeerDead`] if it is
//! dead.
//!
//! **Who detects.** A node that holds a lock or stands in its queue and
//! dies would wedge the lock: its successors' grants never come. With
//! recovery on ([`DlmConfig::recovery`], the default) each manager runs a
//! *monitor* that looks every `probe_interval` (50 ms) at its own requests
//! that are still waiting, and asks whether a node they wait for is
//! **lost**: its process ended ([`tierstack_fabric::Fabric::peer_state`]
//! says `Gone`, or a read through a handle bound to the incarnation the
//! request talked to fails with `PeerDead`, even if the id runs again), or,
//! with leases, its heartbeat word has not advanced for a whole lease. A
//! request that waits for parties it cannot name (group-0 shared holders it
//! drains, say) checks every node after `suspect_after` (1 s). Only the
//! waiters look; nobody watches a lock nobody waits for, and a dead holder
//! of an idle lock is found by the next request that queues behind it.
//!
//! **Who acts: exactly one mover.** The detecting waiter feeds
//! [`proto::Input::PeerLost`] to its machine, which *moves the lock*: it
//! compare-and-swaps the lock word from the generation `g` it saw to
//! `(g + 1, tail = itself)`. Several waiters may detect the same death;
//! the swap picks one, and the others see a newer generation and stand
//! down. The mover then moves the drain word and the fence word (one count
//! more, the new generation: the **floor**, above every earlier token and
//! below every later one), sends every node a `Notice`, and holds the new
//! generation as a **barrier** until every other node has acknowledged or
//! is itself lost; then it releases the barrier like any exclusive hold.
//! SRSL has no queue in remote memory: the home's server thread is the one
//! recoverer; its monitor takes a lost holder out (revoked) and a lost
//! waiter's request off the queue, and grants the next.
//!
//! **What the survivors see.** A live node acknowledges a notice once it
//! holds nothing of an older generation: a request still waiting is
//! aborted internally and made again in the new generation, invisibly to
//! its caller (a dead waiter in the middle of the queue is thereby spliced
//! out: the live requests behind it, and their shared counts, are simply
//! queued again, in their order of arrival at the new word); a live hold is
//! **kept** until its user releases it, and only then acknowledged, so no
//! grant of the new generation overlaps it. A recovery never revokes a live
//! hold. The dead node's hold ends with its process; its token is below
//! the floor, so a fenced resource rejects anything it still had in flight.
//! The model check explores every interleaving of these steps with a death
//! at any point (`tests/model_check.rs`, `tests/model_check_srsl.rs`).
//!
//! **Leases, for what `peer_state` cannot tell.** A holder that is stopped
//! (SIGSTOP, a long pause) or partitioned is not dead to the fabric. With a
//! lease ([`DlmConfig::lease`], default [`LEASE_MS_DEFAULT`] = 10 s; `None`
//! turns leases off), each manager's heartbeat thread advances a word in its
//! own node region every lease / 8, and waiters read it one-sidedly; a
//! heartbeat that stood still for a whole lease makes the node lost, and
//! the lock moves past it. The stopped holder cannot be stopped by taking
//! its lock away: when it runs again its heartbeat thread sees its own
//! lapse (a gap of three quarters of a lease, so it always notices before
//! others could have judged it), and its release returns
//! [`LockError::Broken`]; a grant arriving across such a gap is given back
//! and requested again. What protects the resource is the **fencing
//! token**: the new holder's token is above the floor, the stopped
//! holder's below it. A lease alone is never safe (a process can pause
//! right after checking it, the Redlock critique); lease plus fencing is.
//! The trade-off of the default: a lock whose holder is stopped or
//! partitioned is unavailable for up to one lease, and a holder paused for
//! longer than a lease (a swap storm, a debugger) loses the lock; a kill is
//! found by `peer_state` at once, whatever the lease.
//!
//! **`break_lock`** ([`LockManager::break_lock`], `tierstack dlm break`)
//! is the administrator's move: the same steps, but every hold of an older
//! generation is revoked (waiters get [`LockError::Broken`], a holder's
//! release returns `Broken`, and any compare-and-swap they still attempt
//! fails on the generation) and the mover waits for nobody. It is the tool
//! for a lock whose holder is alive but wrong; with recovery off
//! (`--no-recovery`) it is the only way out of a dead holder. A request of
//! the broken generation can still be granted after the break (its
//! predecessor's grant message overtakes the notice, or on `shm` the second
//! atomic of its batch runs after the break): its fetch-and-add then
//! returns the new generation, so it is not a hold, and no token handed to
//! a user was fetched after the move.
//!
//! **A dead home, with three lock servers or more, is re-homed**
//! (issue 37; the design and what it does not guarantee:
//! `docs/internals/dlm-rehoming.md`; the code: `runtime/rehome.rs` and
//! [`proto::Input::Rehome`]). A lock has one slot at every lock server and
//! an ordered list of candidate homes ([`table::candidates`]: a ring from
//! its hash position). Each slot's fifth word is the lock's membership word
//! at that server ([`word::HomeWord`]: home epoch and home). A node that
//! finds the home of its view lost (process gone, or heartbeat still for a
//! lease) fences the next live candidate's slot and claims the home role
//! for epoch `e + 1` by compare-and-swap of the membership words, winning
//! with a majority (at most one home per epoch). Whoever then finds the
//! view's home alive and its slot fenced moves it like a recovery: it
//! fences the lock's slot at every other server (a **fenced** lock word
//! has tail field `0xFFFF`; every atomic returns the previous word, so a
//! request that meets a fence, on a stale mapping of a dead home say,
//! locates the lock again: the epoch check costs nothing on the fast
//! path), raises the new fence word above every old one, and holds the new
//! home as a **barrier** whose notices carry the new home epoch. A node
//! with a cell of an older home forgets an idle or waiting request at once
//! (a waiter requests again at the new home) and acknowledges; **a holder
//! keeps its hold and acknowledges only when it releases** (at the old
//! home the release meets a dead peer or a fence and ends locally). An
//! unreported holder (stopped) is waited for until it is lost, one lease:
//! its later release says `Broken`, and a node that lapsed locates every
//! lock again. A restarted old home rejoins as a candidate: views name the
//! epoch a majority holds, so it does not take its locks back.
//!
//! **SRSL's server is its home** and is re-homed the same way (the same
//! claim and membership words); only its state lives in the server's
//! process, so the new server rebuilds it from the clients: a server that
//! starts serving a lock it has no queue for moves the fenced slot (if a
//! claim made it the home), sends every node `Rehomed`, and grants nothing
//! until each has answered `Report` (a hold with its mode and token: kept,
//! the fence word raised above the token; a waiter asks again) or is lost
//! (its lease). A server whose slot is fenced, or that was stopped past its
//! lease, adopts its locks again (requesters are told `Moved`).
//!
//! **With one or two lock servers** (no majority survives a loss), a dead
//! home is not re-homed: waiting and
//! new requests for its locks fail at once with `PeerDead` naming the
//! home, on every backend (on `shm` the fabric revokes a closed or
//! reclaimed owner's regions, as RDMA invalidates a dead owner's keys).
//! **The operator (or a supervisor) restarts the home under the same id**,
//! which creates its locks again; every message carries the home's
//! incarnation, so nothing of the old one is taken for the new, and the
//! new fence word is seeded with the creation time ([`word::fence_seed`]),
//! so its tokens are above the old incarnation's. Holders of the old
//! incarnation see their release fail (`PeerDead`), and a fenced resource
//! rejects their tokens once a new holder has written. The chaos tests
//! kill, stop and restart homes with two servers (restart) and three
//! (re-homing).
//!
//! # Limits and the runtime
//!
//! Each home's table has a fixed number of slots (`DlmConfig::table_slots`,
//! at most [`table::TABLE_SLOTS_MAX`]); a full table is
//! [`LockError::TableFull`]. Node ids must fit 16 bits. Locks must be created
//! before use ([`LockError::UnknownLock`]). Atomics are executed
//! synchronously by whichever thread drives a node's cell for the lock, so
//! the machine sees each atomic's result before any other input. Messages
//! are 24 bytes on the fabric's [`tierstack_fabric::Channel::LOCKS`] channel,
//! so the lock manager shares a node with other services, each reading its
//! own channel; by default each manager runs a thread that drains that
//! channel's inbox (a caller that reads it itself switches that off and
//! feeds [`LockManager::handle_message`]). Payloads start with the tag
//! [`msg::SERVICE_TAG`] (`0x01`), checked on decode.

mod error;
pub mod harness;
pub mod msg;
pub mod proto;
mod runtime;
pub mod srsl;
pub mod status;
pub mod table;
pub mod word;

pub use error::LockError;
pub use proto::{LockMode, QueueKind};
pub use runtime::{
    DlmConfig, DlmMetrics, DlmStats, ExclusiveGuard, Grant, LockManager, LockScheme, Placement, Scheme, SharedGuard,
    Wait, LEASE_MS_DEFAULT, PROBE_INTERVAL_MS_DEFAULT, RECEIVE_POLL_MS, REHOMING_SERVERS_MIN, SUSPECT_AFTER_MS_DEFAULT,
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
