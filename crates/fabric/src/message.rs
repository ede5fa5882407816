//! Two-sided messages: channels, messages as received, and the per-channel
//! receive queues a backend delivers into.

use crate::{FabricError, Result};
use std::time::Duration;
use tierstack_base::limits::{CHANNELS_MAX, INBOX_MESSAGES_MAX};
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
/// reading the sender's connection meanwhile, so the sender's `send` waits;
/// a send that cannot finish within the backend's bound fails with a typed
/// error (`Timeout`) that the sender sees.
///
/// **A full channel holds back that channel only.** Every backend keeps one
/// message connection per ordered pair of nodes *and channel*, so a full
/// inbox stops the connections of its channel and nothing else: the same
/// sender's messages on other channels, and other senders' messages on
/// other channels, keep arriving; other senders on the full channel are held
/// back too, each on its own connection. The price is up to
/// [`CHANNELS_MAX`] message connections per ordered pair (opened on first
/// use of a channel) and no order between channels: messages of one channel
/// from one sender arrive in send order, and that is the only order.
///
/// [`Inbox::deliver`], which refuses with [`FabricError::InboxFull`], is for
/// a service that hands a message to itself on its own node.
pub struct Inbox {
    node: NodeId,
    channel: Channel,
    tx: flume::Sender<Message>,
    rx: flume::Receiver<Message>,
}

impl Inbox {
    fn new(node: NodeId, channel: Channel) -> Self {
        let (tx, rx) = flume::bounded(INBOX_MESSAGES_MAX);
        Self { node, channel, tx, rx }
    }

    /// The channel this inbox receives.
    pub fn channel(&self) -> Channel {
        self.channel
    }

    /// Queues a message from `from` on this inbox's channel without waiting:
    /// [`FabricError::InboxFull`] if there is no room. For a service that
    /// sends to itself without a round trip through the backend.
    pub fn deliver(&self, from: NodeId, payload: Vec<u8>) -> Result<()> {
        self.try_put(Message { from, channel: self.channel, payload })
    }

    fn try_put(&self, message: Message) -> Result<()> {
        self.tx.try_send(message).map_err(|e| match e {
            flume::TrySendError::Full(_) => FabricError::InboxFull { node: self.node },
            flume::TrySendError::Disconnected(_) => FabricError::Closed,
        })
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
        let by_channel = std::array::from_fn(|index| {
            // `index < CHANNELS_MAX <= 256`, so the id fits.
            Inbox::new(node, Channel(u8::try_from(index).unwrap_or(u8::MAX)))
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
        self.get(message.channel).try_put(message)
    }

    /// Delivers a message to its channel's inbox, waiting while that inbox
    /// is full: for socket readers, whose waiting pushes back on the sender
    /// instead of dropping messages.
    pub fn deliver_wait(&self, message: Message) -> Result<()> {
        self.get(message.channel).tx.send(message).map_err(|_| FabricError::Closed)
    }

    /// Delivers a message to its channel's inbox, waiting up to `timeout`
    /// while that inbox is full. `Ok(Some(message))` hands the message back
    /// undelivered when the time ran out, so a reader that must also watch
    /// for its own shutdown can check and wait again without losing it.
    pub fn deliver_timeout(&self, message: Message, timeout: Duration) -> Result<Option<Message>> {
        match self.get(message.channel).tx.send_timeout(message, timeout) {
            Ok(()) => Ok(None),
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
