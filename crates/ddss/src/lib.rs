//! The distributed data sharing substrate (DDSS): shared state for the
//! cluster's services, with a coherence model chosen per allocation, built
//! on one-sided operations (seed: `datacenter-services-and-primitives.txt`
//! §4.1, Fig. 2–3).
//!
//! # What it owns
//! Four operations on a [`Ddss`] handle: [`Ddss::allocate`]`(bytes,
//! placement, coherence) -> Key`, [`Ddss::free`], [`Ddss::put`]`(key, bytes)
//! -> version` and [`Ddss::get`]`(key) -> (version, bytes)`; the memory
//! management inside each node's registered region; the coherence models;
//! versions; and the node daemon that shares the substrate with the other
//! processes of a node ([`ipc`], the paper's "IPC management"). Fig. 2's
//! modules map onto this crate as: memory management = [`alloc`] +
//! [`layout`]; data placement = [`Placement`]; locking services = the slot's
//! lock word; coherency and consistency = [`Coherence`] + [`coherence`] +
//! versions; IPC management = [`ipc`].
//!
//! # Memory: one region per node, carved once
//! [`Ddss::start`] registers one region (named [`REGION_NAME`]) at start-up
//! and never resizes it, as RDMA registration requires. Its header records
//! the slot count of each of 18 power-of-two size classes (8 B .. 1 MiB);
//! the rest is a bitmap per class and the slots ([`layout`] draws it). A
//! remote node learns a member's whole layout from one read of its header.
//!
//! # Keys carry their own metadata
//! A [`Key`] encodes the home node, the slot's offset and size class, the
//! allocation's generation and the coherence model (24 bytes, 48 hex digits).
//! So a get or put needs no directory lookup: the key says where to go and
//! how to behave. The generation makes keys ABA-safe: a slot freed and
//! allocated again has a new generation, and an old key gets
//! [`DdssError::KeyFreed`] instead of someone else's data.
//!
//! # Allocation is one-sided
//! A value of `bytes` gets a slot of the smallest class that fits and that
//! the home has slots of (a full class is `RegionFull`; it does not spill
//! into larger ones). Allocating on any member (local, a named node, or
//! [`Placement::Auto`] = most free slots of the class by one-sided reads of
//! each member's used counters, routing around full or unreachable members)
//! needs no cooperation from the home's CPU: the allocator reads the class
//! bitmap, picks a clear bit and claims that slot with one `compare_swap`
//! on its control word, from free to "claimed by (node, incarnation)"
//! ([`alloc`]); owning the slot alone, it sets the bit, bumps the
//! generation and publishes the slot (live, unlocked). Free takes the
//! slot's lock, marks it dead and claimed in one batch, clears the bit,
//! then drops the claim. A process that dies anywhere in between leaves a
//! claim naming an incarnation that is gone: the next allocator that picks
//! the slot (bit clear) takes the claim over, and a class that looks full
//! is swept once ([`Ddss::sweep`]) for such claims (bit set), so no slot
//! leaks. The used counters are a placement hint, changed in the same
//! batch as the live/dead transition.
//!
//! # A slot: a lock word and a seqlock record
//! ```text
//! slot+0   control word   generation:32 | live:1 | holder:31 (live: lock holder,
//!                         0 = unlocked; not live: allocating/freeing claimer, 0 = free)
//! slot+8   sequence       seqlock (tierstack_fabric::seqlock): odd while written;
//!                         sequence/2 = completed writes ("raw version")
//! slot+16  header         generation:32 | live:1 | value length:31
//! slot+24  base           raw version at allocation; version = raw - base
//! slot+32  data           capacity bytes
//! ```
//! Every put takes the control word's lock with one `compare_swap` (the
//! expected value `generation | live | unlocked` comes from the key, so an
//! uncontended lock costs one operation and also proves the key is live),
//! then posts one batch: sequence+1, header, data, sequence+1, read base,
//! unlock. A get reads the record untorn with the fabric's `SeqRecord`
//! (sequence, payload, sequence in one batch; retried if a write overlapped)
//! and checks the header's generation. So **a get never returns a torn
//! value**, under any model, and **every put creates a new version**:
//! versions of a key are 0 (fresh, empty), 1, 2, ... in put order.
//!
//! Why every model's puts take the lock: the seqlock needs its writers
//! serialized, or two overlapping writers could leave an even sequence over
//! a mix of both values. So write coherence (puts totally ordered, never
//! interleaved, unique consecutive versions) holds for every model here; the
//! models differ in what a get may return and how it gets it:
//!
//! | model       | get                                                      | guarantee |
//! |-------------|----------------------------------------------------------|-----------|
//! | null        | local copy forever once fetched                          | untorn, some put's value |
//! | temporal(T) | local copy while fetched ≤ T ago (clock seam); then a    | value was current ≤ T before the get |
//! |             | version read (refresh if unchanged) or a fetch           | |
//! | delta(δ)    | version read (control+sequence words, 16 bytes); copy if | version ≥ latest completed put − δ |
//! |             | ≤ δ behind, else fetch                                   | |
//! | read        | delta(0)                                                 | latest completed put (linearizable) |
//! | write       | fetch from the home every time, no copy                  | same as read; costs a value transfer per get |
//! | strict      | lock, read, unlock at the home                           | same as read; gets also wait for puts |
//!
//! Puts are the same code under every model, so their cost does not depend
//! on the model (Fig. 3a's per-model put latencies coincide by design, as
//! the paper's ~55 µs for all models suggests), and read, write and strict
//! coincide in guarantee; see [`Coherence`] for what tells them apart.
//!
//! Definitions in full are on [`Coherence`]; [`check`] holds the checkers the
//! tests run against randomized multi-node histories. For all models, a
//! handle's versions of a key never go backwards: a local copy is only ever
//! replaced by a newer one, and the home's versions only grow.
//!
//! The strict lock is this crate's own lock word (exclusive, one
//! `compare_swap` to take, released in the same batch as the operation); it
//! does not use the distributed lock manager. It has no queue: waiters retry
//! with backoff up to [`LOCK_ATTEMPTS_MAX`] times, so it is not fair under
//! heavy contention. The word names its holder's **incarnation**: node id
//! (16 bits) and a per-handle incarnation number (15 bits), which the
//! handle marks as running by registering an 8-byte region named
//! `<region>.i<incarnation>` for its lifetime. A waiter that has backed off
//! past spinning takes the lock over with one `compare_swap` only when the
//! holder is gone for certain: its node's process is gone
//! ([`tierstack_fabric::Fabric::peer_state`]: shm reads the pid file, tcp
//! finds the listener refusing), or the node runs but has no region of that
//! incarnation (a new process reopened the node id). Node ids above
//! [`layout::HOLDER_NODE_MAX`] are refused at start. A new process draws
//! its incarnations from its pid and the clock, so it reuses the dead
//! one's number with chance 1/32767; the dead one's locks then stay busy
//! (fail closed). The dead holder may have stopped anywhere in its put:
//! an even sequence means the value is whole and stays; an odd one means it
//! may be half-written, so the header is marked lost, the sequence made even,
//! and gets fail with [`DdssError::ValueLost`] until the next put. A holder
//! that is merely stopped or slow is never taken over (the key reports
//! [`DdssError::LockBusy`] instead). Gets that take no lock find such a slot's sequence odd for
//! good; when a read stays torn they take the lock once (taking it over
//! from a dead holder, or waiting out a live writer) and read again. A put
//! whose batch fails midway on a live process leaves the lock held, failing
//! closed with `LockBusy`.
//!
//! Costs, in round trips to the home (`tcp` pays one message exchange per
//! round trip; `shm` none): put 2 (lock; write+unlock); get from a local
//! copy 0; version-checked get 1 (+1 to fetch a changed value); write get 1;
//! strict get 2; allocate 4 (+1 per member read by auto placement); free 4.
//!
//! # Processes on one node: the daemon
//! [`ipc::DdssDaemon`] serves a node's substrate over a Unix socket with a
//! JSON-lines control path (allocate, free; also get/put as a proxied
//! fallback). A client process's data path is the shared memory itself: it
//! attaches its own fabric endpoint ([`Ddss::attach`]) and gets and puts
//! one-sidedly on the mapped regions. The wire is documented in [`ipc`].
//! [`history`] is the randomized client history `tierstack ddss-client`
//! runs through either path, for the checkers of [`check`].
//!
//! # Benchmark
//! The `bench` crate measures Fig. 3a (put latency per model at 1 byte, get
//! latency, value sizes 1 B .. 64 KiB) through this crate's public API, and
//! the same sizes against a local `redis-server`.

pub mod alloc;
pub mod check;
pub mod coherence;
mod error;
pub mod history;
pub mod ipc;
mod key;
pub mod layout;
pub mod metrics;
mod substrate;

pub use error::{DdssError, Result};
pub use key::{Coherence, Key, Placement, KEY_BYTES};
pub use substrate::{Ddss, DdssConfig, DdssStats, ALLOC_ATTEMPTS_MAX, LOCK_ATTEMPTS_MAX, REGION_NAME};
