//! Two-sided messages: channels, messages as received, and the per-channel
//! receive queues a backend delivers into.

use crate::{FabricError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;
use tierstack_base::limits::{CHANNELS_MAX, INBOX_MESSAGES_MAX};
use tierstack_base::time::instant_now;
use tierstack_base::NodeId;

/// A message channel: which service of the receiving node a message is for.
///
/// Every node has one receive queue ([`Inbox`]) per channel, so several
/// services (locks, cache metadata, PRESS forwarding, monitoring) share one
/// process and one fabric node without reading each other's messages.
///
/// A `Channel` always names a valid id (below [`CHANNELS_MAX`]): the known
/// services are constants, and an id that comes from outside (a
/// configuration, a command line) goes through [`Channel::new`], which
/// refuses an out-of-range id with [`FabricError::UnknownChannel`]. So
/// [`crate::Fabric::send`] and [`crate::Fabric::inbox`] cannot be handed a bad
/// channel, and `inbox` needs no error path. On the wire the channel is one
/// byte, and a frame naming an id out of range is refused by the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Channel(u8);

impl Channel {
    /// The distributed lock manager (`tierstack-dlm`).
    pub const LOCKS: Channel = Channel(0);
    /// Cooperative caching: cache metadata updates and broadcasts.
    pub const COOP_CACHE: Channel = Channel(1);
    /// PRESS: intra-cluster request forwarding and load/cache announcements.
    pub const PRESS: Channel = Channel(2);
    /// Resource monitoring and load balancing.
    pub const MONITOR: Channel = Channel(3);
    /// Applications and tools with messages of their own (the fabric
    /// benchmark's ping and acknowledgement, demos).
    pub const APP: Channel = Channel(4);
    /// Tests.
    pub const TEST: Channel = Channel(5);

    /// The channel with id `id`, or [`FabricError::UnknownChannel`] if it is
    /// not below [`CHANNELS_MAX`].
    pub fn new(id: u8) -> Result<Channel> {
        if usize::from(id) < CHANNELS_MAX {
            Ok(Channel(id))
        } else {
            Err(FabricError::UnknownChannel { channel: id })
        }
    }

    /// The channel's id, as carried on the wire.
    pub const fn id(self) -> u8 {
        self.0
    }

    /// The channel's index among a node's receive queues (`< CHANNELS_MAX`).
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// Every channel, in id order.
    pub fn all() -> impl Iterator<Item = Channel> {
        // CHANNELS_MAX <= 256 (checked below), so every index fits a u8.
        (0..CHANNELS_MAX).filter_map(|index| u8::try_from(index).ok()).map(Channel)
    }

    /// The service's name for a known channel, `None` for a spare id.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Channel::LOCKS => "locks",
            Channel::COOP_CACHE => "coop-cache",
            Channel::PRESS => "press",
            Channel::MONITOR => "monitor",
            Channel::APP => "app",
            Channel::TEST => "test",
            _ => return None,
        })
    }
}

// Channel ids are one byte, and every named channel must be valid.
const _: () = assert!(CHANNELS_MAX >= 1 && CHANNELS_MAX <= 256);
const _: () = assert!(Channel::TEST.index() < CHANNELS_MAX);

impl TryFrom<u8> for Channel {
    type Error = FabricError;
    fn try_from(id: u8) -> Result<Channel> {
        Channel::new(id)
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "channel {} ({name})", self.0),
            None => write!(f, "channel {}", self.0),
        }
    }
}

/// A two-sided message as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub from: NodeId,
    /// The channel it was sent on, which is the inbox it was delivered to.
    pub channel: Channel,
    pub payload: Vec<u8>,
}

/// One channel's bounded receive queue at a node, readable from threads and
/// async tasks. Obtained with [`crate::Fabric::inbox`]; it holds only
/// messages sent on its channel.
///
/// The rule every backend follows when it is full: **the sender is held
/// back, no message is dropped.** A backend's receiving side waits for room
/// ([`Inboxes::deliver_wait`], [`Inboxes::deliver_timeout`]) and stops
/// reading the sender's connection meanwhile (`tcp`), or leaves the
/// message in its ring (`shm`, see below), so the sender's `send` waits;
/// a send that cannot finish within the backend's bound fails with a typed
/// error (`Timeout`) that the sender sees.
///
/// **A full channel holds back that channel only.** Every backend keeps one
/// message path per ordered pair of nodes *and channel* (`tcp`: a
/// connection; `shm`: a ring), so a full inbox stops the paths of its
/// channel and nothing else: the same sender's messages on other channels,
/// and other senders' messages on other channels, keep arriving; other
/// senders on the full channel are held back too, each on its own path. The
/// price is up to [`CHANNELS_MAX`] message paths per ordered pair (opened
/// on first use of a channel) and no order between channels: messages of
/// one channel from one sender arrive in send order, and that is the only
/// order.
///
/// [`Inbox::deliver`], which refuses with [`FabricError::InboxFull`], is for
/// a service that hands a message to itself on its own node.
///
/// **An inbox backed by its backend** ([`Inboxes::with_source`]): a backend
/// whose messages wait in memory the receiver can read itself (the `shm`
/// backend's rings) needs no thread of its own to move them. The thread
/// that receives ([`Inbox::recv_timeout`], [`Inbox::try_recv`],
/// [`Inbox::len`]) takes them from the [`InboxSource`] into the queue, and
/// waits through the source (which may poll before it sleeps). The rules
/// above hold unchanged: the queue is bounded by [`INBOX_MESSAGES_MAX`], and
/// messages the queue has no room for stay in the source, holding their
/// sender back.
pub struct Inbox {
    node: NodeId,
    channel: Channel,
    tx: flume::Sender<Message>,
    rx: flume::Receiver<Message>,
    source: Option<Arc<dyn InboxSource>>,
    /// Async receivers of a backed inbox, and the thread that wakes them.
    async_waiters: Arc<AsyncWaiters>,
}

/// The messages of a backend that keeps them outside the inbox's queue
/// until a receiving thread takes them (see [`Inbox`]).
pub trait InboxSource: Send + Sync {
    /// Moves the messages of `channel` that have arrived into `sink`, in
    /// order per sender, until `sink` refuses one (hands it back: the source
    /// keeps it and offers it first next time) or none is left.
    fn take(&self, channel: Channel, sink: &mut dyn FnMut(Message) -> std::result::Result<(), Message>);

    /// Returns once a message of `channel` may have arrived, `ready()`
    /// holds, the source closed, or `timeout` passed; it may also return
    /// early. With `spin` it may poll for a while before it sleeps.
    fn wait(&self, channel: Channel, timeout: Duration, spin: bool, ready: &dyn Fn() -> bool);

    /// Wakes the waiters of `channel`: a message was put straight into its
    /// queue, where [`InboxSource::wait`] looks only through `ready`.
    fn notify(&self, channel: Channel);

    /// True once the backend closed; waits end at once.
    fn is_closed(&self) -> bool;
}

/// How long the thread that wakes async receivers of a backed inbox sleeps
/// in one wait before it looks at its waiters again.
const ASYNC_WAIT_SLICE: Duration = Duration::from_millis(200);

#[derive(Default)]
struct AsyncWaiters {
    wakers: Mutex<Vec<Waker>>,
    changed: Condvar,
    thread_started: AtomicBool,
}

impl Inbox {
    fn new(node: NodeId, channel: Channel, source: Option<Arc<dyn InboxSource>>) -> Self {
        let (tx, rx) = flume::bounded(INBOX_MESSAGES_MAX);
        Self { node, channel, tx, rx, source, async_waiters: Arc::default() }
    }

    /// The channel this inbox receives.
    pub fn channel(&self) -> Channel {
        self.channel
    }

    /// Queues a message from `from` on this inbox's channel without waiting:
    /// [`FabricError::InboxFull`] if there is no room. For a service that
    /// sends to itself without a round trip through the backend.
    pub fn deliver(&self, from: NodeId, payload: Vec<u8>) -> Result<()> {
        self.try_put(Message { from, channel: self.channel, payload })?;
        self.notify();
        Ok(())
    }

    fn try_put(&self, message: Message) -> Result<()> {
        self.tx.try_send(message).map_err(|e| match e {
            flume::TrySendError::Full(_) => FabricError::InboxFull { node: self.node },
            flume::TrySendError::Disconnected(_) => FabricError::Closed,
        })
    }

    fn notify(&self) {
        if let Some(source) = &self.source {
            source.notify(self.channel);
        }
    }

    /// Moves what the source holds into the queue, as far as it has room.
    fn refill(&self) {
        if let Some(source) = &self.source {
            source.take(self.channel, &mut |message| {
                self.tx.try_send(message).map_err(|e| match e {
                    flume::TrySendError::Full(m) | flume::TrySendError::Disconnected(m) => m,
                })
            });
        }
    }

    /// Waits up to `timeout` for the next message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        let timeout_error =
            || FabricError::RecvTimeout { timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) };
        let Some(source) = &self.source else {
            return self.rx.recv_timeout(timeout).map_err(|e| match e {
                flume::RecvTimeoutError::Timeout => timeout_error(),
                flume::RecvTimeoutError::Disconnected => FabricError::Closed,
            });
        };
        // The clock only once nothing is there: the busy path reads none.
        if let Some(message) = self.try_recv() {
            return Ok(message);
        }
        let start = instant_now();
        loop {
            if let Some(message) = self.try_recv() {
                return Ok(message);
            }
            if source.is_closed() {
                return Err(FabricError::Closed);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(timeout_error());
            }
            source.wait(self.channel, timeout - waited, true, &|| !self.rx.is_empty());
        }
    }

    /// The next message if one is queued.
    pub fn try_recv(&self) -> Option<Message> {
        if let Ok(message) = self.rx.try_recv() {
            return Some(message);
        }
        let source = self.source.as_ref()?;
        // The source's first message goes straight to the caller if the
        // queue is still empty (the sink runs under the source's lock, so no
        // earlier message of the source can be queued meanwhile); the rest
        // into the queue.
        let mut first = None;
        source.take(self.channel, &mut |message| {
            if first.is_none() && self.rx.is_empty() {
                first = Some(message);
                return Ok(());
            }
            self.tx.try_send(message).map_err(|e| match e {
                flume::TrySendError::Full(m) | flume::TrySendError::Disconnected(m) => m,
            })
        });
        first.or_else(|| self.rx.try_recv().ok())
    }

    /// Waits for the next message without blocking the async runtime.
    pub async fn recv_async(&self) -> Result<Message> {
        let Some(source) = &self.source else {
            return self.rx.recv_async().await.map_err(|_| FabricError::Closed);
        };
        std::future::poll_fn(|cx| {
            if let Some(message) = self.try_recv() {
                return Poll::Ready(Ok(message));
            }
            if source.is_closed() {
                return Poll::Ready(Err(FabricError::Closed));
            }
            if let Err(e) = self.register_async_waiter(source, cx.waker()) {
                return Poll::Ready(Err(e));
            }
            // A message that arrived before the waker was registered has not
            // woken it: look once more.
            match self.try_recv() {
                Some(message) => Poll::Ready(Ok(message)),
                None => Poll::Pending,
            }
        })
        .await
    }

    /// Registers `waker` to be woken when a message may have arrived, and
    /// starts, once per inbox, the thread that waits on the source for async
    /// receivers (a thread cannot be woken by a futex and a task can).
    fn register_async_waiter(&self, source: &Arc<dyn InboxSource>, waker: &Waker) -> Result<()> {
        let waiters = &self.async_waiters;
        if let Ok(mut wakers) = waiters.wakers.lock() {
            if !wakers.iter().any(|w| w.will_wake(waker)) {
                wakers.push(waker.clone());
            }
        }
        waiters.changed.notify_all();
        if waiters.thread_started.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (waiters, source, rx, channel) =
            (self.async_waiters.clone(), source.clone(), self.rx.clone(), self.channel);
        let spawned = std::thread::Builder::new()
            .name(format!("inbox-async-{}", channel.id()))
            .spawn(move || wake_async_waiters(&waiters, source.as_ref(), &rx, channel));
        if let Err(e) = spawned {
            // Without the thread this receiver would wait forever: fail it,
            // and let the next registration try again.
            self.async_waiters.thread_started.store(false, Ordering::Release);
            return Err(e.into());
        }
        Ok(())
    }

    /// Messages queued now (with a backed inbox, after taking what has
    /// arrived, as far as the queue has room).
    pub fn len(&self) -> usize {
        self.refill();
        self.rx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The async-waiter thread of a backed inbox: while tasks wait, waits on the
/// source and wakes them; while none waits, sleeps on a condition variable.
/// Ends when the source closes.
fn wake_async_waiters(
    waiters: &AsyncWaiters,
    source: &dyn InboxSource,
    rx: &flume::Receiver<Message>,
    channel: Channel,
) {
    while !source.is_closed() {
        let Ok(mut wakers) = waiters.wakers.lock() else { return };
        while wakers.is_empty() && !source.is_closed() {
            wakers = match waiters.changed.wait_timeout(wakers, ASYNC_WAIT_SLICE) {
                Ok((wakers, _)) => wakers,
                Err(_) => return,
            };
        }
        drop(wakers);
        source.wait(channel, ASYNC_WAIT_SLICE, false, &|| !rx.is_empty());
        let woken = match waiters.wakers.lock() {
            Ok(mut wakers) => std::mem::take(&mut *wakers),
            Err(_) => return,
        };
        for waker in woken {
            waker.wake();
        }
    }
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("node", &self.node)
            .field("channel", &self.channel)
            .field("len", &self.len())
            .finish()
    }
}

/// A node's receive queues, one [`Inbox`] per channel: what a backend owns
/// and delivers into. Delivery routes each message by its `channel`, so a
/// message can only land in the inbox of the channel it was sent on.
pub struct Inboxes {
    by_channel: [Inbox; CHANNELS_MAX],
}

impl Inboxes {
    pub fn new(node: NodeId) -> Self {
        Self::build(node, None)
    }

    /// Receive queues backed by `source`: receiving threads take its
    /// messages themselves (see [`Inbox`]).
    pub fn with_source(node: NodeId, source: Arc<dyn InboxSource>) -> Self {
        Self::build(node, Some(source))
    }

    fn build(node: NodeId, source: Option<Arc<dyn InboxSource>>) -> Self {
        let by_channel = std::array::from_fn(|index| {
            // `index < CHANNELS_MAX <= 256`, so the id fits.
            Inbox::new(node, Channel(u8::try_from(index).unwrap_or(u8::MAX)), source.clone())
        });
        Self { by_channel }
    }

    /// The inbox of `channel`.
    pub fn get(&self, channel: Channel) -> &Inbox {
        // A `Channel` is always below CHANNELS_MAX, the array's length.
        &self.by_channel[channel.index()]
    }

    /// Delivers a message to its channel's inbox without waiting:
    /// [`FabricError::InboxFull`] if that inbox has no room.
    pub fn deliver(&self, message: Message) -> Result<()> {
        let inbox = self.get(message.channel);
        inbox.try_put(message)?;
        inbox.notify();
        Ok(())
    }

    /// Delivers a message to its channel's inbox, waiting while that inbox
    /// is full: for socket readers, whose waiting pushes back on the sender
    /// instead of dropping messages.
    pub fn deliver_wait(&self, message: Message) -> Result<()> {
        let inbox = self.get(message.channel);
        inbox.tx.send(message).map_err(|_| FabricError::Closed)?;
        inbox.notify();
        Ok(())
    }

    /// Delivers a message to its channel's inbox, waiting up to `timeout`
    /// while that inbox is full. `Ok(Some(message))` hands the message back
    /// undelivered when the time ran out, so a reader that must also watch
    /// for its own shutdown can check and wait again without losing it.
    pub fn deliver_timeout(&self, message: Message, timeout: Duration) -> Result<Option<Message>> {
        let inbox = self.get(message.channel);
        match inbox.tx.send_timeout(message, timeout) {
            Ok(()) => {
                inbox.notify();
                Ok(None)
            }
            Err(flume::SendTimeoutError::Timeout(message)) => Ok(Some(message)),
            Err(flume::SendTimeoutError::Disconnected(_)) => Err(FabricError::Closed),
        }
    }
}

impl std::fmt::Debug for Inboxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_channel.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: NodeId = NodeId(3);

    #[test]
    fn channel_ids_below_the_limit_are_accepted_and_the_rest_refused() {
        for id in 0..=u8::MAX {
            let channel = Channel::new(id);
            if usize::from(id) < CHANNELS_MAX {
                assert_eq!(channel.map(Channel::id), Ok(id));
            } else {
                assert_eq!(channel, Err(FabricError::UnknownChannel { channel: id }));
            }
            assert_eq!(Channel::try_from(id), Channel::new(id));
        }
        assert_eq!(Channel::all().count(), CHANNELS_MAX);
        assert!(Channel::all().zip(0..).all(|(channel, index)| channel.index() == index));
    }

    #[test]
    fn named_channels_are_distinct_and_valid() {
        let named =
            [Channel::LOCKS, Channel::COOP_CACHE, Channel::PRESS, Channel::MONITOR, Channel::APP, Channel::TEST];
        let mut ids: Vec<u8> = named.iter().map(|c| c.id()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), named.len(), "no two services share a channel");
        for channel in named {
            assert_eq!(Channel::new(channel.id()), Ok(channel));
            assert!(channel.name().is_some());
        }
        assert_eq!(Channel::LOCKS.to_string(), "channel 0 (locks)");
    }

    #[test]
    fn delivery_lands_in_the_messages_channel_only() {
        let inboxes = Inboxes::new(NODE);
        for channel in Channel::all() {
            inboxes.deliver(Message { from: NodeId(1), channel, payload: vec![channel.id()] }).unwrap();
        }
        inboxes.get(Channel::PRESS).deliver(NodeId(2), b"self".to_vec()).unwrap();
        for channel in Channel::all() {
            let inbox = inboxes.get(channel);
            assert_eq!(inbox.channel(), channel);
            let first = inbox.try_recv().unwrap();
            assert_eq!((first.channel, first.payload), (channel, vec![channel.id()]));
            if channel == Channel::PRESS {
                let own = inbox.try_recv().unwrap();
                assert_eq!((own.from, own.channel, own.payload), (NodeId(2), Channel::PRESS, b"self".to_vec()));
            }
            assert!(inbox.try_recv().is_none(), "{channel} holds nothing of another channel");
        }
    }

    #[test]
    fn a_full_channel_refuses_or_waits_while_the_others_take_messages() {
        let inboxes = Inboxes::new(NODE);
        let message = |channel, seq: u32| Message { from: NodeId(1), channel, payload: seq.to_le_bytes().to_vec() };
        for seq in 0..INBOX_MESSAGES_MAX as u32 {
            inboxes.deliver(message(Channel::TEST, seq)).unwrap();
        }
        assert_eq!(inboxes.deliver(message(Channel::TEST, 0)), Err(FabricError::InboxFull { node: NODE }));
        assert_eq!(inboxes.get(Channel::TEST).deliver(NodeId(1), vec![]), Err(FabricError::InboxFull { node: NODE }));
        let back = inboxes.deliver_timeout(message(Channel::TEST, 7), Duration::from_millis(1)).unwrap();
        assert_eq!(back, Some(message(Channel::TEST, 7)), "handed back undelivered");
        // Another channel is not full.
        assert_eq!(inboxes.deliver_timeout(message(Channel::APP, 1), Duration::from_millis(1)), Ok(None));
        inboxes.deliver_wait(message(Channel::LOCKS, 2)).unwrap();
        assert_eq!(inboxes.get(Channel::APP).len(), 1);
        assert_eq!(inboxes.get(Channel::LOCKS).len(), 1);
        assert_eq!(inboxes.get(Channel::TEST).len(), INBOX_MESSAGES_MAX);
        // Room again: the held message goes in, after the others, in order.
        assert_eq!(inboxes.get(Channel::TEST).try_recv().unwrap(), message(Channel::TEST, 0));
        assert_eq!(inboxes.deliver_timeout(message(Channel::TEST, 7), Duration::from_millis(1)), Ok(None));
        let mut last = None;
        while let Some(m) = inboxes.get(Channel::TEST).try_recv() {
            last = Some(m);
        }
        assert_eq!(last, Some(message(Channel::TEST, 7)));
    }
}
