use crate::{FabricError, Result};
use std::time::Duration;
use tierstack_base::limits::INBOX_MESSAGES_MAX;
use tierstack_base::NodeId;

/// A two-sided message as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub from: NodeId,
    pub payload: Vec<u8>,
}

/// A node's bounded receive queue, readable from threads and async tasks.
/// Backends deliver into it; when it is full the message is refused and the
/// sender's backend reports [`FabricError::InboxFull`] where it can.
pub struct Inbox {
    node: NodeId,
    tx: flume::Sender<Message>,
    rx: flume::Receiver<Message>,
}

impl Inbox {
    pub fn new(node: NodeId) -> Self {
        let (tx, rx) = flume::bounded(INBOX_MESSAGES_MAX);
        Self { node, tx, rx }
    }

    /// Delivers a message (backend side).
    pub fn deliver(&self, message: Message) -> Result<()> {
        self.tx.try_send(message).map_err(|e| match e {
            flume::TrySendError::Full(_) => FabricError::InboxFull { node: self.node },
            flume::TrySendError::Disconnected(_) => FabricError::Closed,
        })
    }

    /// Delivers a message, waiting while the inbox is full: for socket readers,
    /// whose waiting pushes back on the sender instead of dropping messages.
    pub fn deliver_wait(&self, message: Message) -> Result<()> {
        self.tx.send(message).map_err(|_| FabricError::Closed)
    }

    /// Waits up to `timeout` for the next message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        self.rx.recv_timeout(timeout).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => {
                FabricError::RecvTimeout { timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) }
            }
            flume::RecvTimeoutError::Disconnected => FabricError::Closed,
        })
    }

    /// The next message if one is queued.
    pub fn try_recv(&self) -> Option<Message> {
        self.rx.try_recv().ok()
    }

    /// Waits for the next message without blocking the async runtime.
    pub async fn recv_async(&self) -> Result<Message> {
        self.rx.recv_async().await.map_err(|_| FabricError::Closed)
    }

    /// Messages queued now.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}
