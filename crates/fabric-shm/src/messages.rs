//! Two-sided messages of the `shm` backend: single-producer single-consumer
//! rings in shared memory, one per sender, receiver and channel.
//!
//! **Files.** A receiver creates its control file (`msg.ctl`, [`layout`]) in
//! its node directory when it opens: its revoked word, a ring generation
//! word, and per channel a doorbell word (a futex). A sender
//! creates a ring file `q.<channel>.<sender>.<incarnation>` in the
//! *receiver's* directory on its first message to that receiver on that
//! channel (written under a staging name, then renamed, so the receiver
//! never maps a half-made file), and increments the receiver's ring
//! generation. The receiver looks for new ring files of a channel when it
//! sees the generation change, so discovery costs one load per poll.
//!
//! **Who may create a ring.** A ring's sender is named by its file (name
//! and header), so what makes the name true is who could have made the
//! file: the receiver maps a ring only if it is a private file of its own
//! user (opened `O_NOFOLLOW`, owner its uid, mode 0600, one link) in its
//! own private directory (0700, owner-checked, see the crate's essay);
//! otherwise it refuses the file once, never reads it, and leaves it.
//! Another user can therefore neither plant a ring nor link one in; a
//! process of the same user can, the documented limit of one host's trust.
//!
//! **Receiving needs no thread.** The thread that receives on an inbox
//! ([`tierstack_fabric::Inbox`], backed by [`RingReceiver`]) takes messages
//! out of the channel's rings itself: it polls them for a while and then
//! sleeps on the channel's doorbell, a futex in the control file that a
//! sender rings after publishing only if someone sleeps (the protocol in
//! [`crate::ring`]). How long it polls adapts per channel ([`next_spin`]),
//! up to the configured most: a conversation keeps its receiver polling, a
//! receiver whose messages come seldom soon sleeps at once. An idle
//! receiver therefore sleeps in the kernel and burns no CPU; a busy one
//! sees a message within a poll.
//!
//! **Order and backpressure.** One ring per sender and channel keeps a
//! channel's messages from one sender in order and lets a full channel hold
//! back only its own rings. A full ring holds its sender (spinning briefly,
//! then sleeping on the ring's space doorbell) until the receiver takes
//! something, or fails the send with `Timeout` after the send timeout.
//! Messages are taken from the rings into the inbox's bounded queue only as
//! far as it has room, so a full inbox leaves its rings full and their
//! senders held; nothing is dropped.
//!
//! **Large messages** are split into fragments of at most
//! [`layout::FRAGMENT_BYTES_MAX`] bytes, consecutive in the ring (the
//! sender holds its ring for the whole message) and streamed: the receiver
//! drains fragments while the sender writes the next, so a message may be
//! far larger than the ring (up to the 16 MiB transfer limit). A send that
//! times out mid-message leaves a message without its last fragment; the
//! next message's first fragment tells the receiver to drop it.
//!
//! **Liveness and incarnations.** A record is visible only once its words
//! are published, so a sender that dies mid-message leaves at most an
//! unfinished message, which is never delivered. A receiver's clean exit
//! (and the reclaiming of a crashed receiver's node id) sets the revoked
//! word of its control file: senders check it on every send, forget their
//! rings to that incarnation and retry once against a new one. A crashed
//! receiver is found through its pid (a pidfd where the kernel has one):
//! checked at least every [`LIVENESS_CHECK_INTERVAL`] of sending and every
//! [`WAIT_SLICE`] of waiting for room, so its senders get `PeerDead`, never
//! a hang. A sender's incarnation is part of its ring's name, so a sender
//! that restarts under the same node id starts a new ring; the receiver
//! drains the old one and deletes it once its sender is gone.

use crate::private;
use crate::ring::{begin_wait, ring_doorbell, Consumer, Producer, RecordHeader, RingCorrupt, RingWords};
use crate::sys::{coarse_now, futex_wait, process_alive, wake_all, ProcessWatch};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tierstack_base::limits::{CHANNELS_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::time::{instant_now, system_now};
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, FabricError, InboxSource, Message, Result, TrySend};

/// The layout of the message files, for tools and tests that inspect them.
pub mod layout {
    use tierstack_base::limits::CHANNELS_MAX;

    /// The receiver's control file, in its node directory.
    pub const CONTROL_FILE: &str = "msg.ctl";
    pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"TSSHMCT1");
    /// Byte offsets of the control file's words.
    pub const CONTROL_MAGIC_OFFSET: usize = 0;
    /// Nonzero once the receiver closed (or its crashed node id was reclaimed).
    pub const CONTROL_REVOKED_OFFSET: usize = 8;
    /// Incremented by a sender after it created a ring file.
    pub const CONTROL_GENERATION_OFFSET: usize = 16;
    /// The receiver's process id.
    pub const CONTROL_PID_OFFSET: usize = 24;
    /// Channel `c`'s doorbell (a futex its receivers sleep on) is the
    /// word at `channel_line(c)`, alone on its cache line.
    pub const fn channel_line(channel_index: usize) -> usize {
        64 * (1 + channel_index)
    }
    pub const CONTROL_BYTES: usize = channel_line(CHANNELS_MAX);

    /// Ring files are named `q.<channel id>.<sender node id>.<sender
    /// incarnation>-<ring number>`.
    pub const RING_PREFIX: &str = "q.";
    pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"TSSHMQ01");
    /// Byte offsets of a ring file's words. The first line is written once,
    /// by the sender, before the file gets its name (but `SENDER_CLOSED`).
    pub const RING_MAGIC_OFFSET: usize = 0;
    /// Data words (a power of two).
    pub const RING_CAPACITY_OFFSET: usize = 8;
    pub const RING_SENDER_OFFSET: usize = 16;
    pub const RING_CHANNEL_OFFSET: usize = 24;
    pub const RING_SENDER_PID_OFFSET: usize = 32;
    /// Nonzero once the sender closed cleanly: nothing more will come.
    pub const RING_SENDER_CLOSED_OFFSET: usize = 40;
    /// Nonzero once the receiver found the ring corrupt and stopped reading
    /// it: the sender starts a new ring.
    pub const RING_REFUSED_OFFSET: usize = 48;
    /// The ring protocol's words, each on its own cache line.
    pub const RING_HEAD_OFFSET: usize = 64;
    pub const RING_TAIL_OFFSET: usize = 128;
    /// The doorbell (a futex) a sender waiting for room sleeps on.
    pub const RING_SPACE_DOORBELL_OFFSET: usize = 192;
    pub const RING_DATA_OFFSET: usize = 256;
    /// Data bytes of every ring a sender creates.
    pub const RING_DATA_BYTES: usize = 64 << 10;
    /// The largest payload of one record; larger messages are split.
    pub const FRAGMENT_BYTES_MAX: usize = RING_DATA_BYTES / 4;
}

/// How long a sender that keeps sending goes without checking that its
/// receiver's process still runs (a crashed receiver revokes nothing), on
/// the kernel's coarse clock (a few ms more).
pub const LIVENESS_CHECK_INTERVAL: Duration = Duration::from_millis(2);
/// The longest a sender sleeps waiting for room before it checks its
/// receiver's liveness again.
pub const WAIT_SLICE: Duration = Duration::from_millis(5);
/// Send timeouts beyond this (a year) count as this, so a deadline always fits the clock.
const SEND_TIMEOUT_MAX: Duration = Duration::from_secs(365 * 24 * 3600);
/// Polls of a full ring before a sender sleeps: a busy receiver frees room
/// within microseconds.
const ROOM_SPINS: u32 = 2_000;
/// Messages taken from one ring before the next ring's turn.
const TAKE_BATCH: usize = 64;

fn ring_file_name(channel: Channel, from: NodeId, incarnation: &str, number: u64) -> String {
    format!("{}{}.{}.{incarnation}-{number}", layout::RING_PREFIX, channel.id(), from.0)
}

/// A shared mapping of a whole file, accessed only through atomic words.
struct SharedFile {
    map: memmap2::MmapRaw,
}

impl SharedFile {
    fn map(file: &fs::File, len: usize) -> std::io::Result<SharedFile> {
        Ok(SharedFile { map: memmap2::MmapOptions::new().len(len).map_raw(file)? })
    }

    /// Opens and maps `path`, a private file of this user (never through
    /// a symbolic link), which must be `len` bytes long, or at least
    /// `min_len` if `len` is `None`. `Ok(None)`: there is no such file.
    fn open(path: &Path, len: Option<usize>, min_len: usize) -> Result<Option<SharedFile>> {
        let Some(file) = private::open_private_file(path, true)? else { return Ok(None) };
        let actual = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
        let wrong = match len {
            Some(len) => actual != len,
            None => actual < min_len,
        };
        if wrong {
            return Err(FabricError::Io(format!("{}: a file of the wrong length ({actual} bytes)", path.display())));
        }
        Ok(Some(SharedFile::map(&file, actual)?))
    }

    /// Creates `dir/name` of `len` zero bytes (new, mode 0600, never
    /// through a link), lets `init` write its first words, then gives it its
    /// name: a reader never sees it half made.
    fn create(dir: &Path, name: &str, len: usize, init: impl FnOnce(&SharedFile)) -> Result<SharedFile> {
        let staging = dir.join(format!(".staging.{name}"));
        let file = private::create_private_file(&staging)?;
        file.set_len(len as u64)?;
        let shared = SharedFile::map(&file, len)?;
        init(&shared);
        fs::rename(&staging, dir.join(name))?;
        Ok(shared)
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// The word at byte `offset`. Offsets come from [`layout`], inside every
    /// file whose length was checked when it was mapped.
    fn word(&self, offset: usize) -> &AtomicU64 {
        self.words(offset, 1).first().unwrap_or(&DETACHED_WORD)
    }

    fn words(&self, offset: usize, count: usize) -> &[AtomicU64] {
        let in_bounds = offset.is_multiple_of(8) && offset.checked_add(count * 8).is_some_and(|end| end <= self.len());
        if !in_bounds {
            debug_assert!(false, "word offset {offset} (+{count}) outside a {}-byte file", self.len());
            return &[];
        }
        // SAFETY: the mapping is page aligned and `len` bytes long; the range
        // is inside it and 8-aligned (checked above); every process accesses
        // these files only through atomics; `self` keeps the mapping alive.
        unsafe { std::slice::from_raw_parts(self.map.as_mut_ptr().add(offset).cast::<AtomicU64>(), count) }
    }

    fn ring(&self) -> std::result::Result<RingWords<'_, AtomicU64>, RingCorrupt> {
        let capacity = usize::try_from(self.word(layout::RING_CAPACITY_OFFSET).load(Ordering::Acquire))
            .map_err(|_| RingCorrupt("capacity out of range"))?;
        if capacity.checked_mul(8).and_then(|bytes| bytes.checked_add(layout::RING_DATA_OFFSET)) != Some(self.len()) {
            return Err(RingCorrupt("capacity does not match the file's length"));
        }
        RingWords::new(
            self.word(layout::RING_HEAD_OFFSET),
            self.word(layout::RING_TAIL_OFFSET),
            self.words(layout::RING_DATA_OFFSET, capacity),
        )
        .ok_or(RingCorrupt("capacity is not a power of two"))
    }
}

/// Stands in for a word outside a file (never, by construction; see
/// [`SharedFile::word`]), so that a bug cannot turn into a wild access.
static DETACHED_WORD: AtomicU64 = AtomicU64::new(0);

fn channel_doorbell(control: &SharedFile, channel: Channel) -> &AtomicU64 {
    control.word(layout::channel_line(channel.index()))
}

/// Makes every futex wait on `doorbell` return (its count moves, its
/// sleeping bit stays) and wakes its sleepers.
fn ring_for_everyone(doorbell: &AtomicU64) {
    doorbell.fetch_add(2, Ordering::Release);
    wake_all(doorbell);
}

/// Marks a control file revoked if it is one (the reclaiming of a crashed
/// node's directory).
pub(crate) fn revoke_control_file(path: &Path) {
    if let Ok(Some(control)) = SharedFile::open(path, Some(layout::CONTROL_BYTES), 0) {
        if control.word(layout::CONTROL_MAGIC_OFFSET).load(Ordering::Acquire) == layout::CONTROL_MAGIC {
            control.word(layout::CONTROL_REVOKED_OFFSET).store(1, Ordering::Release);
        }
    }
}

// ---------------------------------------------------------------- receiving

/// A node's receiving side: its control file and, per channel, the rings it
/// has found. The [`InboxSource`] of its inboxes.
pub struct RingReceiver {
    node: NodeId,
    dir: PathBuf,
    nodes: Option<Vec<NodeId>>,
    control: SharedFile,
    channels: [Mutex<ChannelRings>; CHANNELS_MAX],
    /// The most a waiting receiver polls ([`crate::ShmConfig::receive_spin`]).
    spin: Duration,
    /// Per channel, how long its next wait polls ([`next_spin`]), in ns.
    spin_ns: [AtomicU64; CHANNELS_MAX],
    closed: AtomicBool,
}

#[derive(Default)]
struct ChannelRings {
    /// The control file's ring generation when this channel last looked.
    generation: u64,
    rings: Vec<RxRing>,
    /// The ring served first next time, so no sender starves the others.
    next: usize,
    /// A message taken from its ring that the inbox had no room for.
    held: Option<Message>,
    /// Ring files refused once, not to be looked at again.
    refused: HashSet<String>,
}

/// One ring as its receiver holds it.
struct RxRing {
    name: String,
    file: SharedFile,
    from: NodeId,
    sender_pid: u32,
    consumer: Consumer,
    /// The fragments so far of a message whose last has not arrived.
    partial: Option<Vec<u8>>,
    /// Found corrupt: never read again, deleted at the next look.
    broken: bool,
}

impl RingReceiver {
    /// Creates the control file in `dir`, the receiver's new node directory.
    pub(crate) fn create(dir: &Path, node: NodeId, nodes: Option<Vec<NodeId>>, spin: Duration) -> Result<RingReceiver> {
        let control = SharedFile::create(dir, layout::CONTROL_FILE, layout::CONTROL_BYTES, |control| {
            control.word(layout::CONTROL_PID_OFFSET).store(u64::from(std::process::id()), Ordering::Relaxed);
            control.word(layout::CONTROL_MAGIC_OFFSET).store(layout::CONTROL_MAGIC, Ordering::Release);
        })?;
        Ok(RingReceiver {
            node,
            dir: dir.to_path_buf(),
            nodes,
            control,
            channels: std::array::from_fn(|_| Mutex::new(ChannelRings::default())),
            spin,
            spin_ns: std::array::from_fn(|_| AtomicU64::new(u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX))),
            closed: AtomicBool::new(false),
        })
    }

    fn lock(&self, channel: Channel) -> std::sync::MutexGuard<'_, ChannelRings> {
        // A `Channel` is always below CHANNELS_MAX. A poisoned lock means a
        // receiving thread panicked while taking; the rings are still sound.
        self.channels[channel.index()].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks this incarnation revoked and wakes everyone waiting on it:
    /// receivers in this process, senders waiting for room in our rings.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.control.word(layout::CONTROL_REVOKED_OFFSET).store(1, Ordering::Release);
        for channel in Channel::all() {
            ring_for_everyone(channel_doorbell(&self.control, channel));
            for ring in &self.lock(channel).rings {
                ring_for_everyone(ring.file.word(layout::RING_SPACE_DOORBELL_OFFSET));
            }
        }
    }

    /// Looks for new ring files of `channel` if a sender made one since the
    /// last look, and deletes rings that are drained and whose sender is
    /// gone (or that are corrupt).
    fn refresh(&self, channel: Channel, rings: &mut ChannelRings) {
        let generation = self.control.word(layout::CONTROL_GENERATION_OFFSET).load(Ordering::Acquire);
        if generation == rings.generation {
            return;
        }
        rings.generation = generation;
        let prefix = format!("{}{}.", layout::RING_PREFIX, channel.id());
        match fs::read_dir(&self.dir) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    let Ok(name) = entry.file_name().into_string() else { continue };
                    if !name.starts_with(&prefix)
                        || rings.refused.contains(&name)
                        || rings.rings.iter().any(|ring| ring.name == name)
                    {
                        continue;
                    }
                    match self.open_ring(channel, &name) {
                        Ok(ring) => rings.rings.push(ring),
                        Err(reason) => {
                            tracing::warn!(node = %self.node, file = %name, %reason, "refusing a message ring file");
                            rings.refused.insert(name);
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(node = %self.node, error = %e, "cannot list the node directory for rings"),
        }
        rings.rings.retain_mut(|ring| {
            let done = ring.broken || ring.sender_gone_and_drained();
            if done {
                if let Err(e) = fs::remove_file(self.dir.join(&ring.name)) {
                    tracing::debug!(file = %ring.name, error = %e, "cannot delete a finished ring");
                }
            }
            !done
        });
        rings.next = 0;
    }

    fn open_ring(&self, channel: Channel, name: &str) -> std::result::Result<RxRing, String> {
        let from = name
            .split('.')
            .nth(2)
            .and_then(|id| id.parse().ok())
            .map(NodeId)
            .ok_or_else(|| "no sender id in its name".to_string())?;
        if self.nodes.as_ref().is_some_and(|nodes| !nodes.contains(&from)) {
            return Err(format!("{from} is not a node of this cluster"));
        }
        // A ring is a private file of this user in our private directory:
        // no other user can have made it (see the module's essay).
        let file = SharedFile::open(&self.dir.join(name), None, layout::RING_DATA_OFFSET + 8)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "it was deleted".to_string())?;
        let word = |offset| file.word(offset).load(Ordering::Acquire);
        if word(layout::RING_MAGIC_OFFSET) != layout::RING_MAGIC {
            return Err("not a ring file".into());
        }
        if word(layout::RING_SENDER_OFFSET) != u64::from(from.0)
            || word(layout::RING_CHANNEL_OFFSET) != u64::from(channel.id())
        {
            return Err("its header names another sender or channel than its name".into());
        }
        let sender_pid = u32::try_from(word(layout::RING_SENDER_PID_OFFSET)).unwrap_or(0);
        let consumer = Consumer::attach(&file.ring().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        Ok(RxRing { name: name.to_string(), file, from, sender_pid, consumer, partial: None, broken: false })
    }

    /// True if something waits for `channel`'s receiver: a held message, a
    /// new ring, a published record.
    fn has_pending(&self, channel: Channel) -> bool {
        let mut rings = self.lock(channel);
        if rings.held.is_some()
            || self.control.word(layout::CONTROL_GENERATION_OFFSET).load(Ordering::Acquire) != rings.generation
        {
            return true;
        }
        rings.rings.iter_mut().any(RxRing::has_records)
    }
}

impl RxRing {
    fn has_records(&mut self) -> bool {
        if self.broken {
            return false;
        }
        // On corruption: true, and the next take finds and reports it.
        self.file.ring().and_then(|ring| self.consumer.has_records(&ring)).unwrap_or(true)
    }

    fn sender_gone_and_drained(&mut self) -> bool {
        // The sender's flag first: records it published before setting it
        // are then visible to the check for records.
        let closed = self.file.word(layout::RING_SENDER_CLOSED_OFFSET).load(Ordering::Acquire) != 0;
        (closed || !process_alive(self.sender_pid)) && !self.has_records()
    }

    /// Takes up to `batch` messages into `sink`. `Err` hands back a message
    /// the sink refused: the caller holds it and offers it first next time.
    fn drain(
        &mut self,
        channel: Channel,
        batch: usize,
        sink: &mut dyn FnMut(Message) -> std::result::Result<(), Message>,
    ) -> std::result::Result<usize, Message> {
        if self.broken {
            return Ok(0);
        }
        let ring = match self.file.ring() {
            Ok(ring) => ring,
            Err(e) => {
                self.break_off(&e);
                return Ok(0);
            }
        };
        let mut delivered = 0;
        let mut refused = None;
        let mut corrupt = None;
        while delivered < batch {
            let header = match self.consumer.peek(&ring) {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(e) => {
                    corrupt = Some(e);
                    break;
                }
            };
            if header.first {
                if self.partial.is_some() {
                    tracing::debug!(from = %self.from, %channel, "dropping a message its sender did not finish");
                }
                self.partial = Some(Vec::with_capacity(header.len as usize));
            }
            let Some(partial) = self.partial.as_mut() else {
                tracing::warn!(from = %self.from, %channel, "a fragment without its first; skipped");
                self.consumer.take(&ring, header, None);
                continue;
            };
            if partial.len() + header.len as usize > TRANSFER_BYTES_MAX {
                corrupt = Some(RingCorrupt("a message larger than the transfer limit"));
                break;
            }
            self.consumer.take(&ring, header, Some(partial));
            if header.last {
                let payload = self.partial.take().unwrap_or_default();
                if let Err(message) = sink(Message { from: self.from, channel, payload }) {
                    refused = Some(message);
                    break;
                }
                delivered += 1;
            }
        }
        if self.consumer.has_unreleased() {
            self.consumer.release(&ring);
            let doorbell = self.file.word(layout::RING_SPACE_DOORBELL_OFFSET);
            if ring_doorbell(doorbell) {
                wake_all(doorbell);
            }
        }
        if let Some(error) = corrupt {
            self.break_off(&error);
        }
        match refused {
            Some(message) => Err(message),
            None => Ok(delivered),
        }
    }

    fn break_off(&mut self, error: &RingCorrupt) {
        tracing::warn!(from = %self.from, file = %self.name, %error, "closing a corrupt message ring");
        self.broken = true;
        self.partial = None;
        self.file.word(layout::RING_REFUSED_OFFSET).store(1, Ordering::Release);
    }
}

impl InboxSource for RingReceiver {
    fn take(&self, channel: Channel, sink: &mut dyn FnMut(Message) -> std::result::Result<(), Message>) {
        let mut guard = self.lock(channel);
        let rings = &mut *guard;
        if let Some(message) = rings.held.take() {
            if let Err(message) = sink(message) {
                rings.held = Some(message);
                return;
            }
        }
        self.refresh(channel, rings);
        let count = rings.rings.len();
        if count == 0 {
            return;
        }
        let start = rings.next % count;
        rings.next = (start + 1) % count;
        loop {
            let mut progressed = false;
            for i in 0..count {
                match rings.rings[(start + i) % count].drain(channel, TAKE_BATCH, sink) {
                    Ok(delivered) => progressed |= delivered > 0,
                    Err(message) => {
                        rings.held = Some(message);
                        return;
                    }
                }
            }
            if !progressed {
                return;
            }
        }
    }

    fn wait(&self, channel: Channel, timeout: Duration, spin: bool, ready: &dyn Fn() -> bool) {
        let start = instant_now();
        let pending = || ready() || self.has_pending(channel) || self.is_closed();
        let spin_ns = &self.spin_ns[channel.index()];
        let spin_for =
            if spin { Duration::from_nanos(spin_ns.load(Ordering::Relaxed)).min(timeout) } else { Duration::ZERO };
        if !spin_for.is_zero() {
            'spin: loop {
                // The clock every few polls: a poll costs less than a read of it.
                for _ in 0..8 {
                    if pending() {
                        self.adapt_spin(spin_ns, WaitEnd::DuringSpin);
                        return;
                    }
                    std::hint::spin_loop();
                }
                if start.elapsed() >= spin_for {
                    break 'spin;
                }
            }
        }
        let doorbell = channel_doorbell(&self.control, channel);
        let expected = begin_wait(doorbell);
        if !pending() {
            let left = timeout.saturating_sub(start.elapsed());
            if !left.is_zero() {
                futex_wait(doorbell, expected, left);
            }
        }
        if spin {
            let end = if pending() { WaitEnd::AfterSleep { waited: start.elapsed() } } else { WaitEnd::Nothing };
            self.adapt_spin(spin_ns, end);
        }
    }

    fn notify(&self, channel: Channel) {
        let doorbell = channel_doorbell(&self.control, channel);
        if ring_doorbell(doorbell) {
            wake_all(doorbell);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// How a receiver's wait ended, for [`next_spin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    /// Something arrived while it polled.
    DuringSpin,
    /// Something arrived after it went to sleep, `waited` after the wait began.
    AfterSleep { waited: Duration },
    /// Nothing arrived (the wait timed out or woke for nothing).
    Nothing,
}

/// The shortest spin that adapting up starts from.
pub const SPIN_FLOOR: Duration = Duration::from_micros(2);

/// How long a channel's next wait polls, given the current spin, the
/// configured most and how the last wait ended: adaptive, as adaptive
/// mutexes spin. Polling that pays (a message arrived while polling, or so
/// soon after sleeping that polling longer would have caught it) keeps or
/// doubles the spin, up to `max`; polling that did not halves it, so a
/// receiver whose messages come seldom (a lock waiter between rounds, an
/// idle server) soon stops polling, and on a host with more runnable
/// threads than CPUs does not take CPU from the threads it waits for.
pub fn next_spin(current: Duration, max: Duration, end: WaitEnd) -> Duration {
    match end {
        WaitEnd::DuringSpin => current.saturating_mul(2).min(max),
        WaitEnd::AfterSleep { waited } if waited <= max => current.saturating_mul(2).max(SPIN_FLOOR).min(max),
        WaitEnd::AfterSleep { .. } | WaitEnd::Nothing => current / 2,
    }
}

impl RingReceiver {
    fn adapt_spin(&self, spin_ns: &AtomicU64, end: WaitEnd) {
        let current = Duration::from_nanos(spin_ns.load(Ordering::Relaxed));
        let next = next_spin(current, self.spin, end);
        spin_ns.store(u64::try_from(next.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

// ------------------------------------------------------------------ sending

/// A node's sending side: per receiver, its control file and the rings this
/// node created there, one per channel.
pub(crate) struct RingSenders {
    node: NodeId,
    /// Names this node's rings apart from an earlier process's under the
    /// same node id.
    incarnation: String,
    /// Rings this node has created, to name each apart.
    rings_created: AtomicU64,
    send_timeout: Duration,
    peers: Mutex<HashMap<NodeId, Arc<PeerLink>, BuildHasherDefault<NodeIdHasher>>>,
}

/// Hashes a node id with one multiplication: the sender looks its link up
/// on every send, and SipHash would be a noticeable part of one.
#[derive(Default)]
struct NodeIdHasher(u64);

impl Hasher for NodeIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u32(u32::from(*byte));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0.rotate_left(32) ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// One receiver incarnation as a sender holds it.
struct PeerLink {
    to: NodeId,
    dir: PathBuf,
    control: SharedFile,
    watch: ProcessWatch,
    /// This sender's ring per channel, created on first use; its lock is held
    /// for a whole message, so fragments stay together and messages in order.
    channels: [Mutex<Option<TxRing>>; CHANNELS_MAX],
}

struct TxRing {
    file: SharedFile,
    producer: Producer,
    /// On the coarse clock ([`coarse_now`]).
    next_liveness_check: Duration,
}

/// Why a send on a link failed.
enum LinkFailure {
    /// The receiver incarnation this link reaches is gone: forget the link
    /// and try once more with a fresh one.
    Revoked,
    Error(FabricError),
}

impl From<FabricError> for LinkFailure {
    fn from(e: FabricError) -> Self {
        LinkFailure::Error(e)
    }
}

impl RingSenders {
    pub(crate) fn new(node: NodeId, send_timeout: Duration) -> RingSenders {
        static OPENED: AtomicU64 = AtomicU64::new(0);
        let nanos = system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let incarnation = format!("{}-{}-{nanos}", std::process::id(), OPENED.fetch_add(1, Ordering::Relaxed));
        RingSenders {
            node,
            incarnation,
            rings_created: AtomicU64::new(0),
            send_timeout,
            peers: Mutex::new(HashMap::default()),
        }
    }

    fn timeout(&self, to: NodeId) -> FabricError {
        FabricError::Timeout { node: to, timeout_ms: u64::try_from(self.send_timeout.as_millis()).unwrap_or(u64::MAX) }
    }

    /// Sends `payload` to `to` on `channel`; `dir` names `to`'s node
    /// directory (asked only to reach a receiver for the first time).
    pub(crate) fn send(&self, to: NodeId, dir: &dyn Fn() -> PathBuf, channel: Channel, payload: &[u8]) -> Result<()> {
        // Set when the send first waits for room (the clock is not read on
        // the fast path); the bound covers all of the send's waits.
        let mut deadline = None;
        self.send_or_try(to, dir, channel, payload, Some(&mut deadline)).map(|_| ())
    }

    /// Sends `payload` if the ring has room for all of it now and no other
    /// thread is sending on it: [`TrySend::WouldBlock`] otherwise (a message
    /// larger than the ring never fits at once: `send` streams it).
    pub(crate) fn try_send(
        &self,
        to: NodeId,
        dir: &dyn Fn() -> PathBuf,
        channel: Channel,
        payload: &[u8],
    ) -> Result<TrySend> {
        self.send_or_try(to, dir, channel, payload, None)
    }

    /// `deadline` is `None` for a send that must not wait.
    fn send_or_try(
        &self,
        to: NodeId,
        dir: &dyn Fn() -> PathBuf,
        channel: Channel,
        payload: &[u8],
        mut deadline: Option<&mut Option<Instant>>,
    ) -> Result<TrySend> {
        if payload.len() > TRANSFER_BYTES_MAX {
            return Err(FabricError::TransferTooLarge { len: payload.len() });
        }
        for _ in 0..2 {
            let link = self.link(to, dir)?;
            match link.send(self, channel, payload, deadline.as_deref_mut()) {
                Ok(outcome) => return Ok(outcome),
                Err(LinkFailure::Revoked) => self.forget(&link),
                Err(LinkFailure::Error(e)) => {
                    if matches!(e, FabricError::PeerDead { .. }) {
                        self.forget(&link);
                    }
                    return Err(e);
                }
            }
        }
        Err(FabricError::PeerDead { node: to, reason: "its message endpoint was closed".into() })
    }

    fn link(&self, to: NodeId, dir: &dyn Fn() -> PathBuf) -> Result<Arc<PeerLink>> {
        let mut peers = self.peers.lock().map_err(|_| FabricError::Closed)?;
        if let Some(link) = peers.get(&to) {
            return Ok(link.clone());
        }
        let dir = dir();
        let dead = |reason: String| FabricError::PeerDead { node: to, reason };
        if !private::check_private_dir(&dir)? {
            return Err(dead("not running (no node directory)".into()));
        }
        let pid = private::read_owner_pid(&dir)?.ok_or_else(|| dead("not running (no node directory)".into()))?;
        let watch = ProcessWatch::new(pid);
        if !watch.alive() {
            return Err(dead(format!("its process {pid} has exited")));
        }
        let control = match SharedFile::open(&dir.join(layout::CONTROL_FILE), Some(layout::CONTROL_BYTES), 0) {
            Ok(Some(control)) => control,
            Ok(None) => return Err(dead("no message endpoint".into())),
            Err(e @ FabricError::UnsafePath { .. }) => return Err(e),
            Err(e) => return Err(dead(format!("no message endpoint: {e}"))),
        };
        if control.word(layout::CONTROL_MAGIC_OFFSET).load(Ordering::Acquire) != layout::CONTROL_MAGIC {
            return Err(FabricError::Protocol { node: to, reason: "its message control file is not one".into() });
        }
        if control.word(layout::CONTROL_REVOKED_OFFSET).load(Ordering::Acquire) != 0 {
            return Err(dead("its message endpoint was closed".into()));
        }
        let link = Arc::new(PeerLink { to, dir, control, watch, channels: std::array::from_fn(|_| Mutex::new(None)) });
        peers.insert(to, link.clone());
        Ok(link)
    }

    fn forget(&self, link: &Arc<PeerLink>) {
        if let Ok(mut peers) = self.peers.lock() {
            if peers.get(&link.to).is_some_and(|known| Arc::ptr_eq(known, link)) {
                peers.remove(&link.to);
            }
        }
    }

    /// Tells every receiver that this sender is done: its rings are marked
    /// closed, and each receiver looks at its rings again (and deletes ours
    /// once it has drained them).
    pub(crate) fn close(&self) {
        let links: Vec<Arc<PeerLink>> = match self.peers.lock() {
            Ok(mut peers) => peers.drain().map(|(_, link)| link).collect(),
            Err(_) => return,
        };
        for link in links {
            let mut any = false;
            for slot in &link.channels {
                if let Some(ring) = slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
                    ring.file.word(layout::RING_SENDER_CLOSED_OFFSET).store(1, Ordering::Release);
                    any = true;
                }
            }
            if any {
                link.control.word(layout::CONTROL_GENERATION_OFFSET).fetch_add(1, Ordering::Release);
            }
        }
    }
}

impl PeerLink {
    fn revoked(&self) -> bool {
        self.control.word(layout::CONTROL_REVOKED_OFFSET).load(Ordering::Acquire) != 0
    }

    fn dead(&self) -> FabricError {
        FabricError::PeerDead { node: self.to, reason: format!("its process {} has exited", self.watch.pid()) }
    }

    fn send(
        &self,
        senders: &RingSenders,
        channel: Channel,
        payload: &[u8],
        mut deadline: Option<&mut Option<Instant>>,
    ) -> std::result::Result<TrySend, LinkFailure> {
        let lock = &self.channels[channel.index()];
        let mut slot = match deadline {
            Some(_) => lock.lock().map_err(|_| FabricError::Closed)?,
            None => match lock.try_lock() {
                Ok(slot) => slot,
                // Another thread sends on this ring (it may be waiting for room).
                Err(std::sync::TryLockError::WouldBlock) => return Ok(TrySend::WouldBlock),
                Err(std::sync::TryLockError::Poisoned(_)) => return Err(FabricError::Closed.into()),
            },
        };
        if self.revoked() {
            return Err(LinkFailure::Revoked);
        }
        // A ring its receiver refused (found corrupt) is never written again.
        if slot.as_ref().is_some_and(|ring| ring.file.word(layout::RING_REFUSED_OFFSET).load(Ordering::Acquire) != 0) {
            tracing::warn!(to = %self.to, %channel, "the receiver refused our ring; starting a new one");
            *slot = None;
        }
        let ring = match slot.as_mut() {
            Some(ring) => ring,
            None => slot.insert(self.create_ring(senders, channel)?),
        };
        let now = coarse_now();
        if now >= ring.next_liveness_check {
            if !self.watch.alive() {
                return Err(self.dead().into());
            }
            ring.next_liveness_check = now + LIVENESS_CHECK_INTERVAL;
        }
        let TxRing { file, producer, .. } = ring;
        let words = file.ring().map_err(|e| self.corrupt(e))?;
        // An empty message is one empty record; a large one, fragments.
        let fragments = payload.len().div_ceil(layout::FRAGMENT_BYTES_MAX).max(1);
        let fragment = |index: usize| {
            let start = index * layout::FRAGMENT_BYTES_MAX;
            let bytes = &payload[start..payload.len().min(start + layout::FRAGMENT_BYTES_MAX)];
            (RecordHeader { len: bytes.len() as u32, first: index == 0, last: index + 1 == fragments }, bytes)
        };
        if deadline.is_none() {
            // All or nothing: only this thread produces (it holds the
            // ring's lock), so room seen now stays until it is used.
            let need: u64 = (0..fragments).map(|index| fragment(index).0.record_words()).sum();
            if producer.free_words(&words, need).map_err(|e| self.corrupt(e))? < need {
                return Ok(TrySend::WouldBlock);
            }
        }
        for index in 0..fragments {
            let (header, bytes) = fragment(index);
            while !producer.push(&words, header, bytes).map_err(|e| self.corrupt(e))? {
                let Some(deadline) = deadline.as_deref_mut() else {
                    return Err(
                        FabricError::Protocol { node: self.to, reason: "room seen in a ring vanished".into() }.into()
                    );
                };
                self.wait_for_room(senders, producer, file, &words, header.record_words(), deadline)?;
            }
            let doorbell = channel_doorbell(&self.control, channel);
            if ring_doorbell(doorbell) {
                wake_all(doorbell);
            }
        }
        Ok(TrySend::Sent)
    }

    fn corrupt(&self, error: RingCorrupt) -> LinkFailure {
        LinkFailure::Error(FabricError::Protocol { node: self.to, reason: error.to_string() })
    }

    /// Creates this sender's ring for `channel` in the receiver's directory.
    fn create_ring(&self, senders: &RingSenders, channel: Channel) -> std::result::Result<TxRing, LinkFailure> {
        let number = senders.rings_created.fetch_add(1, Ordering::Relaxed);
        let name = ring_file_name(channel, senders.node, &senders.incarnation, number);
        let capacity_words = (layout::RING_DATA_BYTES / 8) as u64;
        let file = SharedFile::create(&self.dir, &name, layout::RING_DATA_OFFSET + layout::RING_DATA_BYTES, |file| {
            file.word(layout::RING_CAPACITY_OFFSET).store(capacity_words, Ordering::Relaxed);
            file.word(layout::RING_SENDER_OFFSET).store(u64::from(senders.node.0), Ordering::Relaxed);
            file.word(layout::RING_CHANNEL_OFFSET).store(u64::from(channel.id()), Ordering::Relaxed);
            file.word(layout::RING_SENDER_PID_OFFSET).store(u64::from(std::process::id()), Ordering::Relaxed);
            file.word(layout::RING_MAGIC_OFFSET).store(layout::RING_MAGIC, Ordering::Release);
        })
        .map_err(|e| {
            if self.revoked() {
                LinkFailure::Revoked
            } else {
                LinkFailure::Error(FabricError::PeerDead {
                    node: self.to,
                    reason: format!("cannot create a ring: {e}"),
                })
            }
        })?;
        let producer = Producer::attach(&file.ring().map_err(|e| self.corrupt(e))?).map_err(|e| self.corrupt(e))?;
        // Tell the receiver to look for it (it does before its next take).
        self.control.word(layout::CONTROL_GENERATION_OFFSET).fetch_add(1, Ordering::Release);
        Ok(TxRing { file, producer, next_liveness_check: coarse_now() + LIVENESS_CHECK_INTERVAL })
    }

    /// Waits until the ring has `need` free words: polls a little, then
    /// sleeps on the ring's space doorbell in slices, checking that the
    /// receiver still runs, until the deadline.
    fn wait_for_room(
        &self,
        senders: &RingSenders,
        producer: &mut Producer,
        file: &SharedFile,
        words: &RingWords<'_, AtomicU64>,
        need: u64,
        deadline: &mut Option<Instant>,
    ) -> std::result::Result<(), LinkFailure> {
        for _ in 0..ROOM_SPINS {
            if producer.free_words(words, need).map_err(|e| self.corrupt(e))? >= need {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let doorbell = file.word(layout::RING_SPACE_DOORBELL_OFFSET);
        loop {
            if self.revoked() {
                return Err(LinkFailure::Revoked);
            }
            if !self.watch.alive() {
                return Err(self.dead().into());
            }
            let now = instant_now();
            let deadline = *deadline.get_or_insert_with(|| now + senders.send_timeout.min(SEND_TIMEOUT_MAX));
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Err(senders.timeout(self.to).into());
            }
            let expected = begin_wait(doorbell);
            let room = producer.free_words(words, need).map_err(|e| self.corrupt(e));
            if !matches!(room, Ok(free) if free >= need) && !self.revoked() {
                futex_wait(doorbell, expected, left.min(WAIT_SLICE));
            }
            if producer.free_words(words, need).map_err(|e| self.corrupt(e))? >= need {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(50);

    #[test]
    fn polling_that_pays_keeps_its_spin_and_polling_that_does_not_fades() {
        assert_eq!(next_spin(MAX, MAX, WaitEnd::DuringSpin), MAX, "capped at the most");
        assert_eq!(next_spin(Duration::from_micros(4), MAX, WaitEnd::DuringSpin), Duration::from_micros(8));
        // Slept, but the message came soon enough for a longer poll to catch it.
        let soon = WaitEnd::AfterSleep { waited: Duration::from_micros(30) };
        assert_eq!(next_spin(Duration::ZERO, MAX, soon), SPIN_FLOOR, "from nothing, back to polling");
        assert_eq!(next_spin(Duration::from_micros(20), MAX, soon), Duration::from_micros(40));
        // Slept long, or nothing came: halve.
        let late = WaitEnd::AfterSleep { waited: Duration::from_millis(3) };
        assert_eq!(next_spin(MAX, MAX, late), MAX / 2);
        assert_eq!(next_spin(MAX, MAX, WaitEnd::Nothing), MAX / 2);
        let mut spin = MAX;
        for _ in 0..20 {
            spin = next_spin(spin, MAX, late);
        }
        assert!(spin < Duration::from_nanos(100), "a receiver of seldom messages stops polling: {spin:?}");
        // Zero configured: never polls, whatever happens.
        for end in [WaitEnd::DuringSpin, soon, late, WaitEnd::Nothing] {
            assert_eq!(next_spin(Duration::ZERO, Duration::ZERO, end), Duration::ZERO);
        }
    }
}
