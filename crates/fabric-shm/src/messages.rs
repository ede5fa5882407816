//! Two-sided messages of the `shm` backend, over each receiver's Unix socket.
//!
//! A sender keeps one connection per receiver *and channel*, so a receiver
//! holding back one channel (its inbox is full, the reader of that
//! connection waits) never holds back the sender's other channels.

use std::collections::HashMap;
use std::io::BufReader;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, FabricError, Inboxes, Message, Result};
use tierstack_fabric_wire::{read_frame, write_frame, Frame};

/// Accepts connections on this node's socket; one reader thread per sender.
pub(crate) struct MessageListener {
    // A second handle on the listening socket, used to shut it down.
    control: UnixListener,
    stopping: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

impl MessageListener {
    pub(crate) fn start(path: &Path, node: NodeId, inboxes: Arc<Inboxes>) -> Result<Self> {
        let listener = UnixListener::bind(path)?;
        let control = listener.try_clone()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop_flag = stopping.clone();
        let accept_thread = std::thread::Builder::new().name(format!("shm-accept-{}", node.0)).spawn(move || {
            for stream in listener.incoming() {
                if stop_flag.load(Ordering::Acquire) {
                    break;
                }
                match stream {
                    Ok(stream) => {
                        let inboxes = inboxes.clone();
                        let spawned = std::thread::Builder::new()
                            .name(format!("shm-recv-{}", node.0))
                            .spawn(move || receive_loop(stream, inboxes));
                        if let Err(e) = spawned {
                            tracing::error!(error = %e, "cannot start a message receiver thread");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "accept failed on the message socket"),
                }
            }
        })?;
        Ok(Self { control, stopping, accept_thread: Some(accept_thread) })
    }

    pub(crate) fn stop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag. Shutting the listening
        // socket down makes a blocked accept fail at once on Linux, even if
        // the socket's file is already gone (connecting to it would not).
        // SAFETY: shutdown on a descriptor we own; it does not close it.
        unsafe { libc::shutdown(self.control.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads frames from one sender until it disconnects. The first frame names
/// the sender; a sender that breaks the protocol (a frame naming a channel
/// that does not exist, among others) is disconnected and logged. Each
/// message is delivered to its channel's inbox before the next frame is read,
/// waiting while that inbox is full: the sender is held back, nothing is
/// dropped.
fn receive_loop(stream: UnixStream, inboxes: Arc<Inboxes>) {
    let mut reader = BufReader::new(stream);
    let from = match read_frame(&mut reader) {
        Ok(Some(Frame::Hello { node })) => node,
        Ok(None) => return,
        Ok(Some(other)) => {
            tracing::warn!(?other, "message connection did not start with Hello; closing it");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "bad frame on a message connection; closing it");
            return;
        }
    };
    loop {
        match read_frame(&mut reader) {
            Ok(Some(Frame::Message { channel, payload })) => {
                if inboxes.deliver_wait(Message { from, channel, payload }).is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Ok(Some(other)) => {
                tracing::warn!(%from, ?other, "unexpected frame on a message connection; closing it");
                return;
            }
            Err(e) => {
                tracing::warn!(%from, error = %e, "bad frame on a message connection; closing it");
                return;
            }
        }
    }
}

/// Outgoing connections, one per receiver and channel, opened on first use.
/// One connection per pair and channel keeps a channel's messages of a pair
/// in order, and lets a full channel hold back only its own connection.
pub(crate) struct MessageLinks {
    node: NodeId,
    send_timeout: Duration,
    links: Mutex<HashMap<(NodeId, Channel), Link>>,
}

/// One outgoing connection; its lock keeps each frame whole and in order.
type Link = Arc<Mutex<UnixStream>>;

impl MessageLinks {
    pub(crate) fn new(node: NodeId, send_timeout: Duration) -> Self {
        Self { node, send_timeout, links: Mutex::new(HashMap::new()) }
    }

    fn link(&self, to: NodeId, channel: Channel, socket: &Path) -> Result<Link> {
        let mut links = self.links.lock().map_err(|_| FabricError::Closed)?;
        if let Some(link) = links.get(&(to, channel)) {
            return Ok(link.clone());
        }
        let mut stream = UnixStream::connect(socket).map_err(|e| FabricError::PeerDead {
            node: to,
            reason: format!("cannot connect to its message socket: {e}"),
        })?;
        stream.set_write_timeout(Some(self.send_timeout))?;
        write_frame(&mut stream, &Frame::Hello { node: self.node })
            .map_err(|e| FabricError::PeerDead { node: to, reason: e.to_string() })?;
        let link = Arc::new(Mutex::new(stream));
        links.insert((to, channel), link.clone());
        Ok(link)
    }

    fn forget(&self, to: NodeId, channel: Channel) {
        if let Ok(mut links) = self.links.lock() {
            links.remove(&(to, channel));
        }
    }

    pub(crate) fn send(&self, to: NodeId, channel: Channel, socket: &Path, payload: &[u8]) -> Result<()> {
        let frame = Frame::Message { channel, payload: payload.to_vec() };
        // A cached link may belong to an earlier incarnation of the receiver:
        // on failure, reconnect once before reporting the peer dead.
        for attempt in 0..2 {
            let link = self.link(to, channel, socket)?;
            let mut stream = link.lock().map_err(|_| FabricError::Closed)?;
            match write_frame(&mut *stream, &frame) {
                Ok(()) => return Ok(()),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    self.forget(to, channel);
                    return Err(FabricError::Timeout {
                        node: to,
                        timeout_ms: u64::try_from(self.send_timeout.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                Err(e) => {
                    drop(stream);
                    self.forget(to, channel);
                    if attempt == 1 {
                        return Err(FabricError::PeerDead { node: to, reason: e.to_string() });
                    }
                }
            }
        }
        Err(FabricError::PeerDead { node: to, reason: "send failed".into() })
    }
}
