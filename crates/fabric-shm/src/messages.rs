//! Two-sided messages of the `shm` backend, over each receiver's Unix socket.

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
use tierstack_fabric::{FabricError, Inbox, Message, Result};
use tierstack_fabric_wire::{read_frame, write_frame, Frame};

/// Accepts connections on this node's socket; one reader thread per sender.
pub(crate) struct MessageListener {
    // A second handle on the listening socket, used to shut it down.
    control: UnixListener,
    stopping: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

impl MessageListener {
    pub(crate) fn start(path: &Path, node: NodeId, inbox: Arc<Inbox>) -> Result<Self> {
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
                        let inbox = inbox.clone();
                        let spawned = std::thread::Builder::new()
                            .name(format!("shm-recv-{}", node.0))
                            .spawn(move || receive_loop(stream, inbox));
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
/// the sender; a sender that breaks the protocol is disconnected and logged.
fn receive_loop(stream: UnixStream, inbox: Arc<Inbox>) {
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
            Ok(Some(Frame::Message { payload })) => {
                if inbox.deliver_wait(Message { from, payload }).is_err() {
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

/// Outgoing connections, one per receiver, opened on first use. One
/// connection per pair keeps messages of a pair in order.
pub(crate) struct MessageLinks {
    node: NodeId,
    send_timeout: Duration,
    links: Mutex<HashMap<NodeId, Arc<Mutex<UnixStream>>>>,
}

impl MessageLinks {
    pub(crate) fn new(node: NodeId, send_timeout: Duration) -> Self {
        Self { node, send_timeout, links: Mutex::new(HashMap::new()) }
    }

    fn link(&self, to: NodeId, socket: &Path) -> Result<Arc<Mutex<UnixStream>>> {
        let mut links = self.links.lock().map_err(|_| FabricError::Closed)?;
        if let Some(link) = links.get(&to) {
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
        links.insert(to, link.clone());
        Ok(link)
    }

    fn forget(&self, to: NodeId) {
        if let Ok(mut links) = self.links.lock() {
            links.remove(&to);
        }
    }

    pub(crate) fn send(&self, to: NodeId, socket: &Path, payload: &[u8]) -> Result<()> {
        let frame = Frame::Message { payload: payload.to_vec() };
        // A cached link may belong to an earlier incarnation of the receiver:
        // on failure, reconnect once before reporting the peer dead.
        for attempt in 0..2 {
            let link = self.link(to, socket)?;
            let mut stream = link.lock().map_err(|_| FabricError::Closed)?;
            match write_frame(&mut *stream, &frame) {
                Ok(()) => return Ok(()),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    self.forget(to);
                    return Err(FabricError::Timeout {
                        node: to,
                        timeout_ms: u64::try_from(self.send_timeout.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                Err(e) => {
                    drop(stream);
                    self.forget(to);
                    if attempt == 1 {
                        return Err(FabricError::PeerDead { node: to, reason: e.to_string() });
                    }
                }
            }
        }
        Err(FabricError::PeerDead { node: to, reason: "send failed".into() })
    }
}
