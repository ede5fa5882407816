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
///
/// The rule every backend follows when it is full: **the sender is held
/// back, no message is dropped.** A backend's receiving side waits for room
/// ([`Inbox::deliver_wait`], [`Inbox::deliver_timeout`]) and stops reading
/// the sender's connection meanwhile, so the sender's `send` waits; a send
/// that cannot finish within the backend's bound fails with a typed error
/// (`Timeout`) that the sender sees. [`Inbox::deliver`], which refuses with
/// [`FabricError::InboxFull`], is for callers that can report the refusal.
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

    /// Delivers a message, waiting up to `timeout` while the inbox is full.
    /// `Ok(Some(message))` hands the message back undelivered when the time
    /// ran out, so a reader that must also watch for its own shutdown can
    /// check and wait again without losing it.
    pub fn deliver_timeout(&self, message: Message, timeout: Duration) -> Result<Option<Message>> {
        match self.tx.send_timeout(message, timeout) {
            Ok(()) => Ok(None),
            Err(flume::SendTimeoutError::Timeout(message)) => Ok(Some(message)),
            Err(flume::SendTimeoutError::Disconnected(_)) => Err(FabricError::Closed),
        }
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
