//! The remote-write versions' transport (RDMA-1c): PRESS messages as
//! one-sided writes into per-pair rings in the receiver's registered memory
//! (layout and arithmetic: `tierstack_press::ring`).
//!
//! Sending to `r`: file data goes into `r`'s data ring for this node, then
//! the message (a `FileInfo` naming the data, or a forward or caching
//! message) into the next control slot, **payload first and the sequence
//! word last, in one posted batch** (the fabric executes a batch's writes in
//! order, each opening with a release fence). No thread of `r` runs.
//!
//! Receiving: a poll thread (the paper polls "at the end of the main server
//! loop") reads, for every sender, the sequence word of the next slot; when
//! it is `last + 1` the entry is complete.
//!
//! **Waking (the same for every version).** A receiver that finds nothing
//! waits the way Base's receiver does, in the fabric's own inbox wait
//! (`Inbox::recv_timeout`: on `shm` an adaptive spin of at most
//! `receive_spin`, 50 µs by default, then a futex sleep), so no version
//! gets a shorter or longer bound than another. Before it waits, the poll
//! thread publishes a new **asleep generation** with one one-sided write
//! into each sender's region (`RingLayout::asleep_offset`), then looks at
//! its rings once more. A sender, after posting an entry, reads that word
//! in its own region (after a SeqCst fence, as the receiver has one between
//! its publication and its last look: one of the two sees the other) and,
//! when it holds a generation it has not rung yet, rings the receiver's
//! doorbell: an empty two-sided message on [`wake_channel`], which ends
//! that wait exactly as a Base message ends Base's. So a busy receiver
//! costs its senders a fence and a load per entry, an idle one a doorbell
//! per sender per idle period (counted: `LinkStats::doorbells`), as a Base
//! receiver asleep on its futex costs its senders a wake-up call. The
//! one-sided writes themselves still need no thread of the receiver. A file's data is copied out of
//! the ring at once (the one receiver copy of RDMA-1c), and the receiver
//! overwrites its two credit words in the sender's region (entries consumed,
//! data released) with one one-sided write: the flow-control and
//! buffer-management messages, which "can be overwritten". A sender whose
//! rings are full polls its own credit words, bounded by its timeout.
//!
//! RDMA (`serve_from_ring`) skips that copy: the file reaches the initial
//! node's client straight from the ring (a `Bytes` owning a `RegionBytes`
//! view), and the data is released, in ring order, when the response body
//! is dropped.
//!
//! A peer that restarts (SIGKILLed, started again with the same id)
//! resynchronises by its **epoch**: every entry carries its sender's epoch
//! (a nonzero word chosen when the ring region is registered) in the entry
//! header's spare word. A restarted sender starts again at sequence 1; when
//! the slot this node expects from it holds nothing new, the poll loop also
//! reads sequence 1's slot, and an entry there with another epoch than the
//! last one consumed from that sender means a new incarnation: both
//! directions towards it start over (this node's inbound state from it, its
//! outbound ring to it, the handle to its region and the credit words it
//! had written here), and the entry is consumed as the new lap's first. A
//! killed peer is detected by the failed write and leaves the view; it
//! comes back with its first message.
//!
//! Not handled: a file of the old incarnation still being sent to a client
//! from the ring (RDMA) when the new one writes its first files may see its
//! bytes overwritten (the sender died mid-stream either way).

use crate::transport::{node_id, LinkCounters, LinkError};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tierstack_base::time::{instant_now, system_now};
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion, LocalSlice, Op, RegionBytes, RemoteRegion, TrySend};
use tierstack_press::proto::{decode, encode, Body, FileStatus, Message, MsgType};
use tierstack_press::ring::{Full, ReceiverRing, RingLayout, SenderRing, ENTRY_HEADER_BYTES, ENTRY_PAYLOAD_MAX};
use tierstack_press::{Counters, Member};

/// The ring region's name.
pub const REGION: &str = "press.rings";
/// Data ring bytes per sender: four of the largest forwarded files.
pub const DATA_BYTES: u64 = 1 << 20;

/// The spare fabric channel id that carries the ring versions' doorbells
/// (empty messages; `Channel::PRESS` is the two-sided versions').
pub const WAKE_CHANNEL_ID: u8 = 6;

/// How long the poll thread waits for a doorbell before it looks at its
/// rings and the stop flag again (Base's receive loop waits as long).
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// The channel of the ring versions' doorbells.
pub fn wake_channel() -> Result<Channel, FabricError> {
    Channel::new(WAKE_CHANNEL_ID)
}

/// A node's rings, both directions.
pub struct Rings {
    fabric: Arc<dyn Fabric>,
    me: Member,
    layout: RingLayout,
    local: Arc<LocalRegion>,
    /// Per receiver: where the next entry and data go.
    out: Vec<Mutex<SenderRing>>,
    /// Per peer: the handle to its region (for messages and credits).
    handles: Mutex<Vec<Option<Arc<dyn RemoteRegion>>>>,
    /// Per sender: what this node consumed and released of its rings.
    inbound: Mutex<Vec<Inbound>>,
    /// RDMA: serve files straight from the ring; RDMA-1c: copy them out.
    serve_from_ring: bool,
    timeout: Duration,
    /// This incarnation's epoch, in every entry header.
    epoch: u32,
    /// Senders found restarted (new epoch), for the node's counters.
    restarts: std::sync::atomic::AtomicU64,
    /// Per receiver: the last asleep generation this node rang.
    rung: Vec<AtomicU64>,
    /// This node's sleeps so far (the low half of its asleep generations).
    sleeps: AtomicU64,
    wake: Channel,
    link: Arc<LinkCounters>,
}

/// A nonzero epoch that differs between incarnations of a node: the clock's
/// nanoseconds mixed with the process id.
fn new_epoch() -> u32 {
    let nanos = system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 32) ^ (nanos >> 64) as u64;
    let folded = (mixed ^ (mixed >> 32)) as u32;
    folded.max(1)
}

impl Rings {
    /// Registers this node's ring region.
    /// Registers this node's ring region: `entries` control slots per
    /// sender (the window: messages in flight per ordered pair).
    pub fn register(
        fabric: Arc<dyn Fabric>,
        me: Member,
        nodes: usize,
        entries: u32,
        serve_from_ring: bool,
        timeout: Duration,
        link: Arc<LinkCounters>,
    ) -> Result<Rings, LinkError> {
        let wake = wake_channel()?;
        let layout = RingLayout { nodes: nodes as u64, entries: u64::from(entries.max(2)), data_bytes: DATA_BYTES };
        let local = fabric.register(
            REGION,
            layout.region_bytes(),
            tierstack_fabric::Access::new(tierstack_fabric::Rights::WRITE),
        )?;
        Ok(Rings {
            fabric,
            me,
            layout,
            local,
            out: (0..nodes).map(|_| Mutex::new(SenderRing::new())).collect(),
            handles: Mutex::new(vec![None; nodes]),
            inbound: Mutex::new((0..nodes).map(|_| Inbound::default()).collect()),
            serve_from_ring,
            timeout,
            epoch: new_epoch(),
            restarts: std::sync::atomic::AtomicU64::new(0),
            rung: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            sleeps: AtomicU64::new(0),
            wake,
            link,
        })
    }

    /// The epoch in the header of `sender`'s entry `seq` in this node's region.
    fn entry_epoch(&self, sender: u64, seq: u64) -> Option<u32> {
        let mut header = [0u8; 8];
        self.local.memory().read(self.layout.entry_offset(sender, seq), &mut header).ok()?;
        Some(u32::from_le_bytes([header[4], header[5], header[6], header[7]]))
    }

    /// Senders found restarted so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// `peer` started again: forget everything about its old incarnation
    /// in both directions. Called with its inbound state locked (`state`).
    fn restart_peer(&self, peer: Member, state: &mut Inbound) {
        // Views of the old incarnation's files release nothing of the new one's.
        let mut retired = std::mem::take(&mut state.retired);
        retired.extend(state.epoch);
        *state = Inbound { generation: state.generation + 1, retired, ..Inbound::default() };
        if let Some(out) = self.out.get(peer.index()) {
            *out.lock().unwrap_or_else(PoisonError::into_inner) = SenderRing::new();
        }
        self.forget(peer);
        let off = self.layout.credit_offset(u64::from(peer.0));
        let memory = self.local.memory();
        let _ = memory.store_u64(off, 0);
        let _ = memory.store_u64(off + 8, 0);
        let _ = memory.store_u64(self.layout.asleep_offset(u64::from(peer.0)), 0);
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%peer, "ring peer restarted: both directions start over");
    }

    fn handle(&self, peer: Member) -> Result<Arc<dyn RemoteRegion>, LinkError> {
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = handles
            .get_mut(peer.index())
            .ok_or(LinkError::Fabric(tierstack_fabric::FabricError::UnknownNode { node: node_id(peer) }))?;
        if let Some(h) = slot {
            return Ok(h.clone());
        }
        let h = self.fabric.connect(node_id(peer), REGION)?;
        *slot = Some(h.clone());
        Ok(h)
    }

    fn forget(&self, peer: Member) {
        if let Some(slot) = self.handles.lock().unwrap_or_else(PoisonError::into_inner).get_mut(peer.index()) {
            *slot = None;
        }
    }

    /// The credit words `peer` wrote into this node's region.
    fn credits(&self, peer: Member) -> (u64, u64) {
        let off = self.layout.credit_offset(u64::from(peer.0));
        let memory = self.local.memory();
        (memory.load_u64(off).unwrap_or(0), memory.load_u64(off + 8).unwrap_or(0))
    }

    /// Writes `message` into `to`'s rings.
    pub fn send(&self, to: Member, message: &Message, counters: &Counters) -> Result<(), LinkError> {
        self.send_inner(to, message, None, counters, true).map(|_| ())
    }

    /// Writes `message` (with `source` as its data, Zero) into `to`'s rings
    /// only if nothing has to wait: a free slot and data room now, no
    /// other thread sending to `to`, and a fabric whose posts complete in
    /// the caller (`shm`; elsewhere a post waits for the network, so the
    /// answer there is always `WouldBlock`).
    pub fn try_send(
        &self,
        to: Member,
        message: &Message,
        source: Option<&LocalSlice>,
        counters: &Counters,
    ) -> Result<TrySend, LinkError> {
        if self.fabric.backend_name() != "shm" {
            return Ok(TrySend::WouldBlock);
        }
        self.send_inner(to, message, source, counters, false)
    }

    /// Zero: writes a `File` message whose data is `source`, a slice of this
    /// node's registered cache, straight into `to`'s data ring (no sender
    /// copy). `message` is the `File` with empty data.
    pub fn send_from(
        &self,
        to: Member,
        message: &Message,
        source: &LocalSlice,
        counters: &Counters,
    ) -> Result<(), LinkError> {
        self.send_inner(to, message, Some(source), counters, true).map(|_| ())
    }

    fn send_inner(
        &self,
        to: Member,
        message: &Message,
        source: Option<&LocalSlice>,
        counters: &Counters,
        wait: bool,
    ) -> Result<TrySend, LinkError> {
        let Some(out) = self.out.get(to.index()) else {
            return Err(LinkError::Fabric(tierstack_fabric::FabricError::UnknownNode { node: node_id(to) }));
        };
        let remote = self.handle(to)?;
        let me = u64::from(self.me.0);
        let mut ring = if wait {
            out.lock().unwrap_or_else(PoisonError::into_inner)
        } else {
            match out.try_lock() {
                Ok(ring) => ring,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return Ok(TrySend::WouldBlock),
            }
        };
        let data = match &message.body {
            Body::File { data, .. } => Some(data.as_slice()),
            _ => None,
        };
        // The data's length: the registered source's, else the inline bytes'.
        let data_len: Option<u64> = match (source, data) {
            (Some(slice), Some(_)) => Some(u64::from(slice.len())),
            (None, Some(d)) => Some(d.len() as u64),
            _ => None,
        };
        let start = instant_now();
        // Wait (bounded) for a slot and, for a file, contiguous data room.
        let (seq, data_start) = loop {
            let (consumed, released) = self.credits(to);
            if ring.has_entry(&self.layout, consumed) {
                // Reservations are whole words, so every data start is
                // 8-aligned, as a `WriteFrom` from an 8-aligned slab slot needs.
                let reserved = match data_len {
                    Some(len) => ring.reserve_data(&self.layout, len.div_ceil(8) * 8, released).map(Some),
                    None => Ok(None),
                };
                match reserved {
                    Ok(data_start) => {
                        break (ring.take_entry(&self.layout, consumed).map_err(|_| no_credit(to, start))?, data_start)
                    }
                    Err(Full::TooLarge) => return Err(LinkError::TooLarge { bytes: data_len.unwrap_or(0) }),
                    Err(_) => {}
                }
            }
            if !wait {
                return Ok(TrySend::WouldBlock);
            }
            if start.elapsed() >= self.timeout {
                return Err(no_credit(to, start));
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        let entry_message = match (&message.body, data_start) {
            (Body::File { request, status, .. }, Some(offset)) => Message {
                load: message.load,
                body: Body::FileInfo { request: *request, status: *status, offset, len: data_len.unwrap_or(0) as u32 },
            },
            _ => message.clone(),
        };
        let payload = encode(&entry_message)?;
        if payload.len() as u64 > ENTRY_PAYLOAD_MAX {
            return Err(LinkError::TooLarge { bytes: payload.len() as u64 });
        }
        let mut entry = Vec::with_capacity(ENTRY_HEADER_BYTES as usize + payload.len());
        entry.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        entry.extend_from_slice(&self.epoch.to_le_bytes());
        entry.extend_from_slice(&payload);
        let mut ops = Vec::with_capacity(3);
        let mut moved = 0u64;
        match (source, data, data_start) {
            (Some(slice), _, Some(offset)) => {
                ops.push(Op::WriteFrom { offset: self.layout.data_offset(me, offset), source: slice.clone() });
                moved += u64::from(slice.len());
            }
            (None, Some(d), Some(offset)) => {
                ops.push(Op::Write { offset: self.layout.data_offset(me, offset), data: d.to_vec() });
                moved += d.len() as u64;
            }
            _ => {}
        }
        moved += entry.len() as u64 + 8;
        ops.push(Op::Write { offset: self.layout.entry_offset(me, seq), data: entry });
        // The sequence word last: native-endian, as the receiver loads it.
        ops.push(Op::Write { offset: self.layout.seq_offset(me, seq), data: seq.to_ne_bytes().to_vec() });
        if let Err(e) = remote.post(ops).wait() {
            // The slot and data are lost with the peer; start over if it returns.
            *ring = SenderRing::new();
            self.forget(to);
            return Err(e.into());
        }
        drop(ring);
        counters.record(message.body.msg_type(), moved);
        if source.is_some() {
            self.link.files_from_slab.fetch_add(1, Ordering::Relaxed);
        }
        self.ring_doorbell(to);
        Ok(TrySend::Sent)
    }

    /// After an entry to `to` is posted: rings `to`'s doorbell if it
    /// published an asleep generation this node has not rung yet.
    fn ring_doorbell(&self, to: Member) {
        // Pairs with the fence in `publish_asleep`: either `to` sees our
        // entry on its last look, or we see its generation here.
        fence(Ordering::SeqCst);
        let word = self.local.memory().load_u64(self.layout.asleep_offset(u64::from(to.0))).unwrap_or(0);
        let Some(rung) = self.rung.get(to.index()) else { return };
        if word == 0 || rung.swap(word, Ordering::Relaxed) == word {
            return;
        }
        // A doorbell is one empty message per receiver's sleep, which the
        // receiver drains whenever it wakes: its channel is full only
        // transiently, so the rare try that would block sends it anyway.
        let rung = match self.fabric.try_send(node_id(to), self.wake, &[]) {
            Ok(TrySend::WouldBlock) => self.fabric.send(node_id(to), self.wake, &[]),
            other => other.map(|_| ()),
        };
        match rung {
            Ok(()) => {
                self.link.doorbells.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(%to, error = %e, "press doorbell failed"),
        }
    }

    /// Writes a new asleep generation into every peer's region; returns
    /// whether every peer got it (one that is not up yet did not).
    fn publish_asleep(&self) -> bool {
        let sleeps = self.sleeps.fetch_add(1, Ordering::Relaxed) + 1;
        // The epoch in the high half: a restarted node's generations are new.
        let generation = (u64::from(self.epoch) << 32) | (sleeps & 0xffff_ffff);
        let offset = self.layout.asleep_offset(u64::from(self.me.0));
        let mut all = true;
        for p in 0..self.layout.nodes as usize {
            if p == self.me.index() {
                continue;
            }
            let peer = Member(p as u16);
            let written = self.handle(peer).ok().map(|remote| {
                let op = Op::Write { offset, data: generation.to_ne_bytes().to_vec() };
                remote.post(vec![op]).wait()
            });
            match written {
                Some(Ok(_)) => {}
                Some(Err(_)) => {
                    self.forget(peer);
                    all = false;
                }
                None => all = false,
            }
        }
        fence(Ordering::SeqCst);
        all
    }

    /// Overwrites this node's credit words in `sender`'s region. Called with
    /// the receive state locked, so the words only move forward.
    fn write_credits(&self, sender: Member, ring: &ReceiverRing, counters: &Counters) {
        let Ok(remote) = self.handle(sender) else { return };
        let mut words = Vec::with_capacity(16);
        words.extend_from_slice(&ring.last_seq.to_ne_bytes());
        words.extend_from_slice(&ring.released.to_ne_bytes());
        let op = Op::Write { offset: self.layout.credit_offset(u64::from(self.me.0)), data: words };
        match remote.post(vec![op]).wait() {
            Ok(_) => counters.record(MsgType::Flow, 16),
            Err(_) => self.forget(sender),
        }
    }

    fn inbound(&self) -> std::sync::MutexGuard<'_, Vec<Inbound>> {
        self.inbound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A file served from the ring is done (its response body was dropped):
    /// release it, and everything before it that is done, and tell the sender.
    fn free(&self, sender: Member, start: u64, generation: u64, counters: &Counters) {
        let mut inbound = self.inbound();
        let Some(state) = inbound.get_mut(sender.index()) else { return };
        if state.generation != generation {
            return;
        }
        if let Some(entry) = state.outstanding.iter_mut().find(|e| e.0 == start) {
            entry.2 = true;
        }
        let mut advanced = false;
        while let Some(&(start, len, true)) = state.outstanding.front() {
            state.ring.release(start, len);
            state.outstanding.pop_front();
            advanced = true;
        }
        if advanced {
            let ring = state.ring;
            self.write_credits(sender, &ring, counters);
        }
    }

    /// The poll loop: delivers every complete entry to `deliver` until
    /// `stop`; between entries it waits as the module docs describe.
    pub fn poll_loop(
        self: &Arc<Self>,
        stop: &AtomicBool,
        counters: &Arc<Counters>,
        mut deliver: impl FnMut(Member, Arrival),
    ) {
        let inbox = self.fabric.inbox(self.wake);
        // Whether every peer holds this node's current asleep generation.
        let mut published = false;
        while !stop.load(Ordering::Relaxed) {
            if self.poll_once(counters, &mut deliver) {
                published = false;
                continue;
            }
            if !published {
                published = self.publish_asleep();
                // One more look after publishing: an entry posted before a
                // sender could see the generation is found now.
                if self.poll_once(counters, &mut deliver) {
                    published = false;
                    continue;
                }
            }
            self.link.idle_waits.fetch_add(1, Ordering::Relaxed);
            match inbox.recv_timeout(WAIT_SLICE) {
                Ok(_) => {
                    self.link.woken.fetch_add(1, Ordering::Relaxed);
                    // Several senders may have rung for one generation.
                    while inbox.try_recv().is_some() {}
                    published = false;
                }
                Err(FabricError::RecvTimeout { .. }) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "press doorbell inbox closed");
                    return;
                }
            }
        }
    }

    /// One pass over every sender's ring; returns whether anything arrived.
    fn poll_once(self: &Arc<Self>, counters: &Arc<Counters>, deliver: &mut impl FnMut(Member, Arrival)) -> bool {
        let nodes = self.layout.nodes as usize;
        let memory = self.local.memory();
        let mut found = false;
        for s in 0..nodes {
            if s == self.me.index() {
                continue;
            }
            let sender = Member(s as u16);
            let mut inbound = self.inbound();
            let state = &mut inbound[s];
            let mut seq = state.ring.last_seq + 1;
            let seq_word = memory.load_u64(self.layout.seq_offset(s as u64, seq)).unwrap_or(0);
            // A restarted sender writes from sequence 1 again, with a new
            // epoch: seen at sequence 1 while we wait for a later one, or
            // at the very number we wait for (it sent that many already;
            // it cannot have sent more than a ring's entries unread, so
            // its first entries are all still there).
            // An entry of an earlier incarnation (a retired epoch) whose
            // number happens to be the one we wait for is not new.
            let check = if state.ring.is_next(seq_word) { seq } else { 1 };
            let written = (check == seq || seq != 1)
                && memory.load_u64(self.layout.seq_offset(s as u64, check)).unwrap_or(0) == check;
            let epoch_there = if written { self.entry_epoch(s as u64, check) } else { None };
            let stale = epoch_there.is_some_and(|e| state.retired.contains(&e));
            let restarted = !stale && state.epoch.is_some_and(|epoch| epoch_there.is_some_and(|e| e != epoch));
            if restarted {
                self.restart_peer(sender, state);
                seq = 1;
            } else if stale || !state.ring.is_next(seq_word) {
                continue;
            }
            found = true;
            let entry_offset = self.layout.entry_offset(s as u64, seq);
            let mut header = [0u8; 8];
            let read = memory.read(entry_offset, &mut header);
            state.epoch = Some(u32::from_le_bytes([header[4], header[5], header[6], header[7]]));
            let len = u64::from(u32::from_le_bytes([header[0], header[1], header[2], header[3]]));
            let mut payload = vec![0u8; len.min(ENTRY_PAYLOAD_MAX) as usize];
            let read = read.and_then(|()| memory.read(entry_offset + ENTRY_HEADER_BYTES, &mut payload));
            state.ring.consume();
            state.unacknowledged += 1;
            let mut credit_now = false;
            let arrival = match read.ok().and_then(|()| decode(&payload).ok()) {
                Some(Message { load, body: Body::FileInfo { request, status, offset, len } })
                    if u64::from(len) <= self.layout.data_bytes =>
                {
                    let at = self.layout.data_offset(s as u64, offset);
                    let data = if self.serve_from_ring {
                        // RDMA: no receiver copy; the client's response
                        // is sent from the ring, released when dropped.
                        state.outstanding.push_back((offset, u64::from(len), false));
                        // SAFETY: arrival: the sender wrote these bytes
                        // before the entry's sequence word in one
                        // in-order batch, and we read that word (an
                        // acquire load) as `last + 1`. Release: the
                        // sender reuses them only once `released` passes
                        // their end, which happens in `free`, called when
                        // this view's last owner is dropped.
                        match unsafe { RegionBytes::new(LocalSlice::new(self.local.clone(), at, len)) } {
                            Ok(view) => Some(Bytes::from_owner(RingView {
                                view,
                                rings: self.clone(),
                                counters: counters.clone(),
                                sender,
                                start: offset,
                                generation: state.generation,
                            })),
                            Err(_) => None,
                        }
                    } else {
                        // RDMA-1c: the one receiver copy, out of the ring at once.
                        let mut data = vec![0u8; len as usize];
                        let copied = memory.read(at, &mut data);
                        state.ring.release(offset, u64::from(len));
                        credit_now = true;
                        copied.ok().map(|()| Bytes::from(data))
                    };
                    data.map(|data| Arrival::File { load, request, status, data })
                }
                other => other.map(Arrival::Message),
            };
            // Credits go back with every file's release (buffer
            // management) and after a quarter of the window otherwise.
            if credit_now || state.unacknowledged >= (self.layout.entries / 4).max(1) {
                state.unacknowledged = 0;
                let ring = state.ring;
                self.write_credits(sender, &ring, counters);
            }
            drop(inbound);
            match arrival {
                Some(arrival) => deliver(sender, arrival),
                None => tracing::warn!(%sender, seq, "malformed ring entry skipped"),
            }
        }
        found
    }
}

/// What the poll loop hands the node.
pub enum Arrival {
    Message(Message),
    /// A file transfer's data: copied (RDMA-1c) or a view of the ring (RDMA).
    File {
        load: u32,
        request: u64,
        status: FileStatus,
        data: Bytes,
    },
}

/// A receiver's state towards one sender.
#[derive(Default)]
struct Inbound {
    ring: ReceiverRing,
    /// Files served from the ring, in arrival order: (start, len, done).
    outstanding: VecDeque<(u64, u64, bool)>,
    unacknowledged: u64,
    /// The epoch of the last entry consumed from this sender.
    epoch: Option<u32>,
    /// How many times this sender restarted: a ring view of an older
    /// generation releases nothing.
    generation: u64,
    /// The epochs of its earlier incarnations: their entries left in the
    /// ring are never taken for new ones.
    retired: Vec<u32>,
}

/// A file's bytes in the ring, owned by a response body; dropping it
/// releases them to the sender.
struct RingView {
    view: RegionBytes,
    rings: Arc<Rings>,
    counters: Arc<Counters>,
    sender: Member,
    start: u64,
    generation: u64,
}

impl AsRef<[u8]> for RingView {
    fn as_ref(&self) -> &[u8] {
        self.view.as_slice()
    }
}

impl Drop for RingView {
    fn drop(&mut self) {
        self.rings.free(self.sender, self.start, self.generation, &self.counters);
    }
}

fn no_credit(to: Member, start: Instant) -> LinkError {
    LinkError::NoCredit { to, waited_ms: start.elapsed().as_millis() as u64 }
}
