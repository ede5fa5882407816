//! The client side: one connection per peer, a writer behind a mutex, and a
//! reader thread that completes pending requests by request id.

use crate::pending::PendingTable;
use crate::{lock, Shared};
use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_base::NodeId;
use tierstack_fabric::{CompletionSender, FabricError, Op, OpResult, Result};
use tierstack_fabric_wire::{encode, read_frame, Frame};

/// What an `Ops` answer must look like, op by op: a responder that answers
/// with other shapes is a protocol error, not a panic in a caller that
/// copies a read result into a buffer of the requested length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Read(u32),
    Written,
    FetchAdd,
    CompareSwap,
}

impl Shape {
    pub(crate) fn of(op: &Op) -> Self {
        match op {
            Op::Read { len, .. } => Shape::Read(*len),
            Op::Write { .. } => Shape::Written,
            Op::FetchAdd { .. } => Shape::FetchAdd,
            Op::CompareSwap { .. } => Shape::CompareSwap,
        }
    }

    fn matches(self, result: &OpResult) -> bool {
        match (self, result) {
            (Shape::Read(len), OpResult::Read(data)) => data.len() == len as usize,
            (Shape::Written, OpResult::Written)
            | (Shape::FetchAdd, OpResult::FetchAdd(_))
            | (Shape::CompareSwap, OpResult::CompareSwap(_)) => true,
            _ => false,
        }
    }
}

/// Who waits for an answer.
pub(crate) enum Waiter {
    Ops { sender: CompletionSender, expect: Vec<Shape> },
    Lookup(flume::Sender<Result<(u32, u64)>>),
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

/// One outgoing connection to a peer's listener.
pub(crate) struct Conn {
    /// Unique within the fabric: region handles remember the connection their
    /// region index was looked up on, and look it up again on a new one.
    pub(crate) id: u64,
    pub(crate) peer: NodeId,
    writer: Mutex<TcpStream>,
    /// A clone used only to shut the socket down (waking the reader) while
    /// the writer may be blocked in a write.
    control: TcpStream,
    pending: Mutex<PendingTable<Waiter>>,
    dead: AtomicBool,
}

impl Conn {
    /// Connects to `addr`, sends `Hello`, and returns the connection and the
    /// stream its reader thread reads.
    pub(crate) fn dial(shared: &Shared, id: u64, peer: NodeId, addr: SocketAddr) -> Result<(Arc<Conn>, TcpStream)> {
        let unreachable = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                FabricError::Timeout { node: peer, timeout_ms: shared.timeout_ms }
            }
            _ => FabricError::PeerDead { node: peer, reason: format!("connecting to {addr}: {e}") },
        };
        let stream = TcpStream::connect_timeout(&addr, shared.op_timeout).map_err(unreachable)?;
        stream.set_nodelay(true).map_err(unreachable)?;
        // A peer that stops reading (stopped, overloaded) must not block a
        // poster forever inside `write_all`: the write fails and the
        // connection is dropped instead.
        stream.set_write_timeout(Some(shared.op_timeout)).map_err(unreachable)?;
        let mut writer = stream.try_clone().map_err(unreachable)?;
        let control = stream.try_clone().map_err(unreachable)?;
        writer.write_all(&encode(&Frame::Hello { node: shared.node })).map_err(unreachable)?;
        let conn = Arc::new(Conn {
            id,
            peer,
            writer: Mutex::new(writer),
            control,
            pending: Mutex::new(PendingTable::new()),
            dead: AtomicBool::new(false),
        });
        Ok((conn, stream))
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Registers a waiter. On a dead connection the waiter is failed here
    /// with the connection's error, which is also returned.
    pub(crate) fn register(&self, request: u64, deadline_ns: u64, waiter: Waiter) -> Result<()> {
        let refused = lock(&self.pending).insert(request, deadline_ns, waiter);
        match refused {
            Ok(()) => Ok(()),
            Err((error, waiter)) => {
                waiter.fail(error.clone());
                Err(error)
            }
        }
    }

    /// Fails the waiter of `request` if it is still registered (used when a
    /// request could not even be sent).
    pub(crate) fn abandon(&self, request: u64, error: FabricError) {
        let waiter = lock(&self.pending).take(request);
        if let Some(waiter) = waiter {
            waiter.fail(error);
        }
    }

    /// Writes one encoded frame with one `write_all`. A failed write leaves
    /// the stream mid-frame, so it kills the connection.
    pub(crate) fn send(&self, frame: &[u8]) -> Result<()> {
        let result = lock(&self.writer).write_all(frame);
        result.map_err(|e| {
            let reason = format!("writing to the connection: {e}");
            let error = FabricError::PeerDead { node: self.peer, reason };
            self.kill(error.clone());
            error
        })
    }

    /// Ends the connection: fails every pending request with `error`, refuses
    /// new ones, and shuts the socket so the reader thread exits.
    pub(crate) fn kill(&self, error: FabricError) {
        self.dead.store(true, Ordering::Release);
        let waiters = lock(&self.pending).close(error.clone());
        let _ = self.control.shutdown(Shutdown::Both);
        for waiter in waiters {
            waiter.fail(error.clone());
        }
    }

    /// Fails the requests whose deadline passed with `Timeout`.
    pub(crate) fn expire(&self, now_ns: u64, timeout_ms: u64) {
        let expired = lock(&self.pending).expire(now_ns);
        for waiter in expired {
            waiter.fail(FabricError::Timeout { node: self.peer, timeout_ms });
        }
    }

    /// Handles one frame from the owner. `Err` means the owner broke the
    /// protocol and the connection must end.
    fn on_frame(&self, frame: Frame) -> std::result::Result<(), String> {
        let (request, outcome) = match frame {
            Frame::OpsOk { request, results } => (request, Answer::Ops(results)),
            Frame::LookupOk { request, region, len } => (request, Answer::Lookup(region, len)),
            Frame::Error { request, error } => (request, Answer::Error(error)),
            other => return Err(format!("unexpected {} frame from the owner", frame_name(&other))),
        };
        let Some(waiter) = lock(&self.pending).take(request) else {
            tracing::debug!(peer = %self.peer, request, "dropping a late answer");
            return Ok(());
        };
        let protocol = |reason: &str| FabricError::Protocol { node: self.peer, reason: reason.to_string() };
        match (waiter, outcome) {
            (waiter, Answer::Error(error)) => waiter.fail(error),
            (Waiter::Ops { sender, expect }, Answer::Ops(results)) => {
                if expect.len() == results.len() && expect.iter().zip(&results).all(|(s, r)| s.matches(r)) {
                    sender.complete(Ok(results));
                } else {
                    sender.complete(Err(protocol("the results do not match the posted operations")));
                }
            }
            (Waiter::Lookup(tx), Answer::Lookup(region, len)) => {
                let _ = tx.send(Ok((region, len)));
            }
            (waiter, _) => waiter.fail(protocol("the answer's kind does not match the request")),
        }
        Ok(())
    }
}

enum Answer {
    Ops(Vec<OpResult>),
    Lookup(u32, u64),
    Error(FabricError),
}

pub(crate) fn frame_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello { .. } => "Hello",
        Frame::Message { .. } => "Message",
        Frame::Lookup { .. } => "Lookup",
        Frame::LookupOk { .. } => "LookupOk",
        Frame::Ops { .. } => "Ops",
        Frame::OpsOk { .. } => "OpsOk",
        Frame::Error { .. } => "Error",
    }
}

/// The reader thread of `conn`: completes answers until the stream ends,
/// then kills the connection (failing what is still pending with `PeerDead`).
pub(crate) fn run_reader(shared: Arc<Shared>, conn: Arc<Conn>, stream: TcpStream) {
    let mut reader = BufReader::with_capacity(crate::READ_BUFFER_BYTES, stream);
    let reason = loop {
        match read_frame(&mut reader) {
            Ok(Some(frame)) => {
                if let Err(reason) = conn.on_frame(frame) {
                    tracing::warn!(peer = %conn.peer, %reason, "closing a connection to a misbehaving owner");
                    break reason;
                }
            }
            Ok(None) => break "the connection was closed".to_string(),
            Err(e) => break format!("reading from the connection: {e}"),
        }
    };
    let error =
        if shared.is_closed() { FabricError::Closed } else { FabricError::PeerDead { node: conn.peer, reason } };
    conn.kill(error);
    shared.forget_conn(conn.id);
}
