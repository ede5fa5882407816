//! The client side, per peer: a [`Link`] with the table of requests in flight,
//! a queue drained by a **writer** thread that dials and writes request
//! frames, a **reader** thread per request connection that completes answers
//! by request id, and a separate message connection.
//!
//! Transfers naming local registered memory cost one copy on each side of
//! the socket here: a `WriteFrom`'s source is copied into the request frame
//! when it is posted, and a `ReadInto`'s answer is copied from the received
//! frame straight into its local slice by the reader thread, just before
//! the completion (never after a timeout or other failure).
//!
//! Posting only encodes, registers the waiter and queues the frame: dialing
//! and writing happen on the writer thread, so a stalled or unreachable peer
//! never blocks a poster (an async runtime's worker above all); its requests
//! end by their deadline, failed by the sweeper.

use crate::pending::PendingTable;
use crate::secure::{self, FrameReader, SealState, WireReader, WireWriter, Wired};
use crate::{lock, Shared};
use std::io::BufReader;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_base::limits::CHANNELS_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, CompletionSender, FabricError, LocalSlice, Op, OpResult, Result, TrySend};
use tierstack_fabric_wire::auth::Opener;
use tierstack_fabric_wire::{decode_borrowed, encode, BorrowedFrame, Frame, ResultRef};

/// A reader keeps its frame buffer between frames up to this size; a larger
/// one (a big read's answer) is given back after use.
pub(crate) const FRAME_BUFFER_KEEP_BYTES: usize = 1 << 20;

/// What an `Ops` answer must look like, op by op, and where each result
/// goes: a responder that answers with other shapes is a protocol error, not
/// a panic in a caller that copies a read result into a buffer of the
/// requested length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Read(u32),
    /// A read whose data goes straight into this local slice.
    ReadInto(LocalSlice),
    Written,
    WrittenFrom,
    FetchAdd,
    CompareSwap,
}

impl Shape {
    pub(crate) fn of(op: &Op) -> Self {
        match op {
            Op::Read { len, .. } => Shape::Read(*len),
            Op::ReadInto { target, .. } => Shape::ReadInto(target.clone()),
            Op::Write { .. } => Shape::Written,
            Op::WriteFrom { .. } => Shape::WrittenFrom,
            Op::FetchAdd { .. } => Shape::FetchAdd,
            Op::CompareSwap { .. } => Shape::CompareSwap,
        }
    }

    fn matches(&self, result: &ResultRef<'_>) -> bool {
        match (self, result) {
            (Shape::Read(len), ResultRef::Read(data)) => data.len() == *len as usize,
            (Shape::ReadInto(target), ResultRef::Read(data)) => data.len() == target.len() as usize,
            (Shape::Written | Shape::WrittenFrom, ResultRef::Written)
            | (Shape::FetchAdd, ResultRef::FetchAdd(_))
            | (Shape::CompareSwap, ResultRef::CompareSwap(_)) => true,
            _ => false,
        }
    }

    /// The caller's result for a `result` that [`Shape::matches`]; a
    /// `ReadInto`'s data is copied from the frame into its local slice.
    fn complete(&self, result: ResultRef<'_>) -> Result<OpResult> {
        match (self, result) {
            (Shape::ReadInto(target), ResultRef::Read(data)) => {
                target.region().memory().write(target.offset(), data)?;
                Ok(OpResult::ReadInto)
            }
            (Shape::WrittenFrom, ResultRef::Written) => Ok(OpResult::WrittenFrom),
            (_, result) => Ok(result.into_owned()),
        }
    }
}

/// The results of a batch answered with `results`, or why the answer does
/// not fit the batch. Checks every result before copying any, so a bad
/// answer writes no local slice.
fn complete_ops(expect: &[Shape], results: Vec<ResultRef<'_>>) -> std::result::Result<Vec<OpResult>, String> {
    if expect.len() != results.len() || !expect.iter().zip(&results).all(|(shape, result)| shape.matches(result)) {
        return Err("the results do not match the posted operations".to_string());
    }
    expect
        .iter()
        .zip(results)
        .map(|(shape, result)| shape.complete(result).map_err(|e| format!("completing a result: {e}")))
        .collect()
}

/// Where a region lives at its owner: what a `Lookup` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionInfo {
    pub(crate) region: u32,
    pub(crate) incarnation: u64,
    pub(crate) len: u64,
}

/// Who waits for an answer.
pub(crate) enum Waiter {
    Ops { sender: CompletionSender, expect: Vec<Shape> },
    Lookup(flume::Sender<Result<RegionInfo>>),
}

impl Waiter {
    pub(crate) fn fail(self, error: FabricError) {
        match self {
            Waiter::Ops { sender, .. } => sender.complete(Err(error)),
            Waiter::Lookup(tx) => {
                let _ = tx.send(Err(error));
            }
        }
    }
}

fn fail_all(waiters: Vec<Waiter>, error: &FabricError) {
    for waiter in waiters {
        waiter.fail(error.clone());
    }
}

/// What the writer thread is asked to do.
pub(crate) enum Outgoing {
    /// Write the encoded request `request` (unless it is no longer pending).
    Request { request: u64, bytes: Vec<u8> },
    /// The fabric is shutting down.
    Stop,
}

/// Everything this node keeps for one peer. Lives until the fabric shuts
/// down; its connections come and go.
pub(crate) struct Link {
    pub(crate) peer: NodeId,
    /// Requests in flight to the peer, on any of its connections or queued.
    pending: Mutex<PendingTable<Waiter>>,
    queue: flume::Sender<Outgoing>,
    /// The request connection the writer uses now, so shutdown can end it.
    current: Mutex<Option<Arc<Conn>>>,
    /// The message connections, one per channel (indexed by
    /// [`Channel::index`]), dialed on first use. Separate from requests so
    /// that a receiver holding back messages (a full inbox) never delays
    /// requests, and from each other so that a full channel never holds back
    /// another. Senders write under the channel's lock, which keeps one
    /// sender's messages of a channel in order.
    messages: [Mutex<Option<MessageConn>>; CHANNELS_MAX],
}

/// One request connection to a peer's listener.
pub(crate) struct Conn {
    /// Unique within the fabric: a pending request records the connection it
    /// was written on, and fails when that connection breaks.
    pub(crate) id: u64,
    /// A clone used only to shut the socket down (waking the reader and a
    /// writer blocked in a write).
    control: TcpStream,
    dead: AtomicBool,
}

impl Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

/// Connects to `peer`, sets the socket up and sends `Hello`.
fn dial(shared: &Shared, peer: NodeId) -> Result<Wired> {
    let addr = shared.addr_of(peer)?;
    let unreachable = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            FabricError::Timeout { node: peer, timeout_ms: shared.timeout_ms }
        }
        _ => FabricError::PeerDead { node: peer, reason: format!("connecting to {addr}: {e}") },
    };
    let mut stream = TcpStream::connect_timeout(&addr, shared.op_timeout).map_err(unreachable)?;
    stream.set_nodelay(true).map_err(unreachable)?;
    // A peer that stops reading (stopped, overloaded, a full inbox) must not
    // hold a writer forever inside `write_all`: the write fails instead.
    stream.set_write_timeout(Some(shared.op_timeout)).map_err(unreachable)?;
    secure::connect(shared, peer, &mut stream)
}

/// A message connection to a peer (one per channel): only ever written.
struct MessageConn {
    control: TcpStream,
    writer: WireWriter,
    sealer: SealState,
}

/// True if the peer has closed `stream` (its end-of-stream has arrived). The
/// owner never writes on a message connection, so anything readable is its
/// end; checking first keeps a send to a peer that exited from "succeeding"
/// into a socket nobody will read.
fn closed_by_peer(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // A non-blocking peek that leaves the socket's own mode alone (a TLS
    // connection's socket stays non-blocking).
    // SAFETY: one byte into a local, on a socket we hold open.
    let n = unsafe { libc::recv(stream.as_raw_fd(), (&raw mut byte).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if n < 0 {
        let error = std::io::Error::last_os_error();
        return !matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted);
    }
    true
}

/// True if the kernel takes `len` more bytes on `stream` without putting
/// the writer to sleep: a TCP write sleeps once the memory queued for
/// sending (`SK_MEMINFO_WMEM_QUEUED`, buffers with their overhead) reaches
/// the send buffer (`SK_MEMINFO_SNDBUF`). The margin covers the overhead
/// of the new segments and of a TLS record or seal around the frame.
fn send_buffer_takes(stream: &TcpStream, len: usize) -> bool {
    use std::os::fd::AsRawFd;
    let mut info = [0u32; libc::SK_MEMINFO_DROPS as usize + 1];
    let mut size = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a writable buffer of `size` bytes; the kernel writes
    // at most that many and says how many.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MEMINFO, info.as_mut_ptr().cast(), &mut size)
    };
    if rc != 0 || (size as usize) < (libc::SK_MEMINFO_WMEM_QUEUED as usize + 1) * 4 {
        return false;
    }
    let queued = u64::from(info[libc::SK_MEMINFO_WMEM_QUEUED as usize]);
    let buffer = u64::from(info[libc::SK_MEMINFO_SNDBUF as usize]);
    let need = len as u64 + len as u64 / 4 + SEND_MARGIN_BYTES;
    queued + need <= buffer
}

/// [`send_buffer_takes`]'s room beyond the frame itself.
const SEND_MARGIN_BYTES: u64 = 4096;

impl Link {
    /// A link to `peer` and the receiving end of its writer's queue.
    pub(crate) fn new(peer: NodeId) -> (Arc<Link>, flume::Receiver<Outgoing>) {
        let (queue, rx) = flume::unbounded();
        let link = Arc::new(Link {
            peer,
            pending: Mutex::new(PendingTable::new()),
            queue,
            current: Mutex::new(None),
            messages: std::array::from_fn(|_| Mutex::new(None)),
        });
        (link, rx)
    }

    /// Registers `waiter` for `request` and queues its frame for the writer.
    /// Never blocks on the network; failures complete the waiter.
    pub(crate) fn submit(&self, request: u64, deadline_ns: u64, bytes: Vec<u8>, waiter: Waiter) {
        if let Err((error, waiter)) = lock(&self.pending).insert(request, deadline_ns, waiter) {
            waiter.fail(error);
            return;
        }
        if self.queue.send(Outgoing::Request { request, bytes }).is_err() {
            // The writer is gone: the fabric is shutting down.
            self.abandon(request, FabricError::Closed);
        }
    }

    /// Fails the waiter of `request` if it is still pending.
    pub(crate) fn abandon(&self, request: u64, error: FabricError) {
        let waiter = lock(&self.pending).take(request);
        if let Some(waiter) = waiter {
            waiter.fail(error);
        }
    }

    /// Fails the requests whose deadline passed with `Timeout`.
    pub(crate) fn expire(&self, now_ns: u64, timeout_ms: u64) {
        let expired = lock(&self.pending).expire(now_ns);
        fail_all(expired, &FabricError::Timeout { node: self.peer, timeout_ms });
    }

    /// Ends `conn`: fails the requests written on it with `error` and shuts
    /// its socket so its reader exits.
    fn kill(&self, conn: &Conn, error: FabricError) {
        let waiters = {
            let mut pending = lock(&self.pending);
            // Marked under the table's lock, which `mark_sent` callers also
            // hold: a request is either marked before (and failed here) or
            // sees the connection dead.
            conn.dead.store(true, Ordering::Release);
            pending.fail_sent_on(conn.id)
        };
        let _ = conn.control.shutdown(Shutdown::Both);
        fail_all(waiters, &error);
    }

    /// Shutdown: fails everything pending with `Closed`, refuses new
    /// requests, ends the connections and stops the writer.
    pub(crate) fn stop(&self) {
        let current = lock(&self.current).take();
        if let Some(conn) = current {
            self.kill(&conn, FabricError::Closed);
        }
        let waiters = lock(&self.pending).close(FabricError::Closed);
        fail_all(waiters, &FabricError::Closed);
        for messages in &self.messages {
            if let Some(conn) = lock(messages).take() {
                let _ = conn.control.shutdown(Shutdown::Both);
            }
        }
        let _ = self.queue.send(Outgoing::Stop);
    }

    /// Dials a new request connection and starts its reader. Returns the
    /// connection and the stream the writer writes.
    fn connect(self: &Arc<Self>, shared: &Arc<Shared>) -> Result<(Arc<Conn>, WireWriter, SealState)> {
        let Wired { control, reader, writer, sealer, opener } = dial(shared, self.peer)?;
        let conn = Arc::new(Conn { id: shared.next_id(), control, dead: AtomicBool::new(false) });
        {
            let mut current = lock(&self.current);
            // Checked under `current`, which `stop` takes after the fabric
            // is marked closed: a connection is either ended by shutdown or
            // never installed.
            if shared.is_closed() {
                let _ = conn.control.shutdown(Shutdown::Both);
                return Err(FabricError::Closed);
            }
            *current = Some(Arc::clone(&conn));
        }
        let (reader_shared, reader_link, reader_conn) = (Arc::clone(shared), Arc::clone(self), Arc::clone(&conn));
        let spawned = shared.spawn(format!("tcp-{}-read{}", shared.node.0, self.peer.0), move || {
            run_reader(&reader_shared, &reader_link, &reader_conn, reader, opener)
        });
        if let Err(e) = spawned {
            self.kill(&conn, FabricError::PeerDead { node: self.peer, reason: format!("cannot start a reader: {e}") });
            return Err(e);
        }
        tracing::debug!(node = %shared.node, peer = %self.peer, "connected");
        Ok((conn, writer, sealer))
    }

    /// Sends a two-sided message on the channel's message connection,
    /// dialing it if needed. Blocks while the receiver holds the channel back
    /// (its inbox of `channel` is full), up to the op timeout, as the `shm`
    /// backend's sends do.
    pub(crate) fn send_message(&self, shared: &Shared, channel: Channel, payload: &[u8]) -> Result<()> {
        let encode_frame = || encode(&Frame::Message { channel, payload: payload.to_vec() });
        // Sealing appends to the bytes: the retry (rare) encodes afresh.
        let mut first = Some(encode_frame());
        // A `Channel` is always below CHANNELS_MAX, the array's length.
        let mut slot = lock(&self.messages[channel.index()]);
        if slot.as_ref().is_some_and(|conn| closed_by_peer(&conn.control)) {
            *slot = None;
        }
        // A cached connection may still break on write: reconnect once
        // before reporting the peer dead.
        for attempt in 0..2 {
            shared.check_open()?;
            let conn = match slot.as_mut() {
                Some(conn) => conn,
                None => {
                    let Wired { control, writer, sealer, .. } = dial(shared, self.peer)?;
                    slot.insert(MessageConn { control, writer, sealer })
                }
            };
            let frame = first.take().unwrap_or_else(encode_frame);
            match secure::write_frame_bytes(&mut conn.writer, &mut conn.sealer, frame) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // The stream may be mid-frame: never write on it again.
                    if let Some(conn) = slot.take() {
                        let _ = conn.control.shutdown(Shutdown::Both);
                    }
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                        return Err(FabricError::Timeout { node: self.peer, timeout_ms: shared.timeout_ms });
                    }
                    if attempt == 1 {
                        return Err(FabricError::PeerDead { node: self.peer, reason: format!("sending: {e}") });
                    }
                }
            }
        }
        Err(FabricError::PeerDead { node: self.peer, reason: "sending failed".to_string() })
    }

    /// Sends a message only if that needs no wait: the channel's connection
    /// is up, no other thread writes on it, and the socket's send buffer
    /// takes the whole frame now (so `write_all` returns without sleeping).
    /// [`TrySend::WouldBlock`] otherwise, nothing written; `send_message`
    /// then dials, waits for room or reports the peer.
    pub(crate) fn try_send_message(&self, shared: &Shared, channel: Channel, payload: &[u8]) -> Result<TrySend> {
        shared.check_open()?;
        let mut slot = match self.messages[channel.index()].try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(TrySend::WouldBlock),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        let Some(conn) = slot.as_mut() else { return Ok(TrySend::WouldBlock) };
        if closed_by_peer(&conn.control) {
            return Ok(TrySend::WouldBlock);
        }
        let frame = encode(&Frame::Message { channel, payload: payload.to_vec() });
        if !send_buffer_takes(&conn.control, frame.len()) {
            return Ok(TrySend::WouldBlock);
        }
        match secure::write_frame_bytes(&mut conn.writer, &mut conn.sealer, frame) {
            Ok(()) => Ok(TrySend::Sent),
            Err(e) => {
                // The stream may be mid-frame: never write on it again.
                if let Some(conn) = slot.take() {
                    let _ = conn.control.shutdown(Shutdown::Both);
                }
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                    return Err(FabricError::Timeout { node: self.peer, timeout_ms: shared.timeout_ms });
                }
                Err(FabricError::PeerDead { node: self.peer, reason: format!("sending: {e}") })
            }
        }
    }

    /// Handles one frame from the owner. `Err` means the owner broke the
    /// protocol and the connection must end.
    fn on_frame(&self, frame: BorrowedFrame<'_>) -> std::result::Result<(), String> {
        let (request, outcome) = match frame {
            BorrowedFrame::OpsOk { request, results } => (request, Answer::Ops(results)),
            BorrowedFrame::Owned(Frame::LookupOk { request, region, incarnation, len }) => {
                (request, Answer::Lookup(RegionInfo { region, incarnation, len }))
            }
            BorrowedFrame::Owned(Frame::Error { request, error }) => (request, Answer::Error(error)),
            BorrowedFrame::Owned(other) => {
                return Err(format!("unexpected {} frame from the owner", frame_name(&other)))
            }
        };
        let Some(waiter) = lock(&self.pending).take(request) else {
            tracing::debug!(peer = %self.peer, request, "dropping a late answer");
            return Ok(());
        };
        let protocol = |reason: &str| FabricError::Protocol { node: self.peer, reason: reason.to_string() };
        match (waiter, outcome) {
            (waiter, Answer::Error(error)) => waiter.fail(error),
            (Waiter::Ops { sender, expect }, Answer::Ops(results)) => {
                sender.complete(complete_ops(&expect, results).map_err(|reason| protocol(&reason)));
            }
            (Waiter::Lookup(tx), Answer::Lookup(info)) => {
                let _ = tx.send(Ok(info));
            }
            (waiter, _) => waiter.fail(protocol("the answer's kind does not match the request")),
        }
        Ok(())
    }
}

/// The writer thread of `link`: writes queued requests in order, dialing
/// when there is no live connection. A failed dial fails the requests not
/// yet written; a failed write ends the connection (it may be mid-frame).
pub(crate) fn run_writer(shared: &Arc<Shared>, link: &Arc<Link>, queue: &flume::Receiver<Outgoing>) {
    let mut current: Option<(Arc<Conn>, WireWriter, SealState)> = None;
    while let Ok(Outgoing::Request { request, bytes }) = queue.recv() {
        if shared.is_closed() {
            break;
        }
        // Expired or failed while queued: nobody waits, so nothing is sent.
        if !lock(&link.pending).contains(request) {
            continue;
        }
        let (conn, mut stream, mut sealer) = match current.take().filter(|(conn, ..)| !conn.is_dead()) {
            Some(live) => live,
            None => match link.connect(shared) {
                Ok(fresh) => fresh,
                Err(error) => {
                    let waiters = lock(&link.pending).fail_unsent();
                    fail_all(waiters, &error);
                    continue;
                }
            },
        };
        let marked = {
            let mut pending = lock(&link.pending);
            !conn.is_dead() && pending.mark_sent(request, conn.id)
        };
        if !marked {
            // The connection broke just now, or the request ended meanwhile.
            link.abandon(request, FabricError::PeerDead { node: link.peer, reason: "the connection broke".into() });
            continue;
        }
        if let Err(e) = secure::write_frame_bytes(&mut stream, &mut sealer, bytes) {
            let error = if shared.is_closed() {
                FabricError::Closed
            } else {
                FabricError::PeerDead { node: link.peer, reason: format!("writing to the connection: {e}") }
            };
            link.kill(&conn, error);
            continue;
        }
        current = Some((conn, stream, sealer));
    }
    if let Some((conn, ..)) = current {
        link.kill(&conn, FabricError::Closed);
    }
}

enum Answer<'a> {
    Ops(Vec<ResultRef<'a>>),
    Lookup(RegionInfo),
    Error(FabricError),
}

pub(crate) fn frame_name(frame: &Frame) -> &'static str {
    frame.kind_name()
}

/// The reader thread of `conn`: completes answers until the stream ends,
/// then ends the connection (failing what was written on it with `PeerDead`).
fn run_reader(shared: &Shared, link: &Link, conn: &Conn, stream: WireReader, opener: Option<Opener>) {
    let mut frames = FrameReader::new(BufReader::with_capacity(crate::READ_BUFFER_BYTES, stream), opener);
    let reason = loop {
        match frames.next_body() {
            Ok(Some(body)) => {
                let handled = decode_borrowed(body)
                    .map_err(|e| format!("decoding a frame: {e}"))
                    .and_then(|frame| link.on_frame(frame));
                if let Err(reason) = handled {
                    tracing::warn!(peer = %link.peer, %reason, "closing a connection to a misbehaving owner");
                    break reason;
                }
            }
            Ok(None) => break "the connection was closed".to_string(),
            Err(e) => break format!("reading from the connection: {e}"),
        }
    };
    let error =
        if shared.is_closed() { FabricError::Closed } else { FabricError::PeerDead { node: link.peer, reason } };
    link.kill(conn, error);
}
