//! Message-channel scenarios written once against the `Fabric` trait and run
//! by every backend's tests (`fabric-shm`, `fabric-tcp` and `fabric-ucx`'s
//! `tests/it/channels.rs`), so all backends are held to the same observable
//! rules:
//!
//! - a message arrives in the receiver's inbox of the channel it was sent on,
//!   and a service draining one channel never sees another's messages;
//! - messages of one channel from one sender arrive in send order, with
//!   several senders and channels interleaved;
//! - a channel id out of range is a typed error, and a frame naming one on
//!   the wire is refused (the connection closed, nothing delivered) without
//!   harming the receiver;
//! - a full channel holds its sender back and loses nothing, and does not
//!   hold back the same sender's other channels.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::limits::{CHANNELS_MAX, INBOX_MESSAGES_MAX};
use tierstack_base::time::instant_now;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, Message, TrySend};
use tierstack_fabric_wire::{encode, Frame, LENGTH_PREFIX_BYTES};

/// A bound on every wait, only so that a broken backend fails instead of
/// hanging; nothing here waits for it to pass.
pub const BOUND: Duration = Duration::from_secs(30);

/// The fabric timeout the full-channel scenario needs: longer than filling
/// and draining a channel takes, so a held send waits for room instead of
/// timing out (a timeout would be a typed error, not a loss, but it is not
/// the scenario).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The channels the scenarios send on: every named service and a spare id.
pub fn channels() -> Vec<Channel> {
    vec![
        Channel::LOCKS,
        Channel::COOP_CACHE,
        Channel::PRESS,
        Channel::MONITOR,
        Channel::APP,
        Channel::TEST,
        Channel::new(CHANNELS_MAX as u8 - 1).unwrap(),
    ]
}

/// A payload that names its channel, sender and sequence number (per sender
/// and channel), padded to `len` bytes with a pattern of its own.
pub fn tagged(channel: Channel, sender: NodeId, seq: u32, len: usize) -> Vec<u8> {
    let mut payload = vec![channel.id()];
    payload.extend_from_slice(&sender.0.to_le_bytes());
    payload.extend_from_slice(&seq.to_le_bytes());
    let pad = (seq as u8) ^ channel.id();
    payload.resize(len.max(payload.len()), pad);
    payload
}

/// A payload with [`tagged`]'s header (read by [`tag_of`]), padded with bytes
/// that depend on the channel, sender, seq and position, so that a torn,
/// shifted or mixed-up message never equals the one expected: the payload of
/// the backends' multi-process stress tests.
pub fn salted(channel: Channel, sender: NodeId, seq: u32, len: usize) -> Vec<u8> {
    let mut payload = Vec::with_capacity(len.max(9));
    payload.push(channel.id());
    payload.extend_from_slice(&sender.0.to_le_bytes());
    payload.extend_from_slice(&seq.to_le_bytes());
    let salt = sender.0.wrapping_mul(0x9e37_79b9) ^ seq.wrapping_mul(0x85eb_ca6b) ^ u32::from(channel.id());
    payload.extend((9..len.max(9)).map(|i| (salt.rotate_left(i as u32 % 32) ^ i as u32) as u8));
    payload
}

/// The (channel id, sender, seq) a [`tagged`] or [`salted`] payload names.
pub fn tag_of(payload: &[u8]) -> (u8, NodeId, u32) {
    let sender = u32::from_le_bytes(payload[1..5].try_into().unwrap());
    let seq = u32::from_le_bytes(payload[5..9].try_into().unwrap());
    (payload[0], NodeId(sender), seq)
}

fn recv(fabric: &dyn Fabric, channel: Channel) -> Message {
    fabric.inbox(channel).recv_timeout(BOUND).unwrap_or_else(|e| panic!("{channel}: {e}"))
}

fn assert_all_empty(fabric: &dyn Fabric, what: &str) {
    for channel in Channel::all() {
        assert!(fabric.inbox(channel).is_empty(), "{what}: {channel} holds nothing more");
    }
}

/// Isolation: `sender` sends rounds over every channel of [`channels`], to
/// `receiver` and to itself. A service thread drains `Channel::LOCKS` of
/// the receiver while the others are still being sent, and sees exactly its
/// own messages; every other channel then holds exactly its own, in order.
pub fn messages_stay_on_their_channel(sender: Arc<dyn Fabric>, receiver: Arc<dyn Fabric>) {
    const ROUNDS: u32 = 200;
    let (to, me) = (receiver.local_node(), sender.local_node());
    let locks_service = {
        let receiver = Arc::clone(&receiver);
        std::thread::spawn(move || {
            for seq in 0..ROUNDS {
                let message = recv(receiver.as_ref(), Channel::LOCKS);
                assert_eq!(message.channel, Channel::LOCKS);
                assert_eq!(message.from, me);
                assert_eq!(message.payload, tagged(Channel::LOCKS, me, seq, 9 + seq as usize % 40));
            }
        })
    };
    for seq in 0..ROUNDS {
        // A different channel order each round, so neighbours on the wire differ.
        let mut order = channels();
        let shift = seq as usize % order.len();
        order.rotate_left(shift);
        for channel in order {
            let payload = tagged(channel, me, seq, 9 + seq as usize % 40);
            sender.send(to, channel, &payload).unwrap();
            if seq % 10 == 0 {
                sender.send(me, channel, &payload).unwrap();
            }
        }
    }
    locks_service.join().expect("the LOCKS service saw only its own messages");
    for channel in channels().into_iter().filter(|c| *c != Channel::LOCKS) {
        for seq in 0..ROUNDS {
            let message = recv(receiver.as_ref(), channel);
            assert_eq!((message.from, message.channel), (me, channel));
            assert_eq!(message.payload, tagged(channel, me, seq, 9 + seq as usize % 40), "{channel}");
        }
    }
    for channel in channels() {
        for seq in (0..ROUNDS).step_by(10) {
            let message = recv(sender.as_ref(), channel);
            assert_eq!((message.from, message.channel), (me, channel), "sent to itself");
            assert_eq!(message.payload, tagged(channel, me, seq, 9 + seq as usize % 40));
        }
    }
    // Every message was taken from the inbox it belonged to, in order; had
    // one landed elsewhere, its own channel would have come up short above.
    assert_all_empty(receiver.as_ref(), "receiver");
    assert_all_empty(sender.as_ref(), "sender");
}

/// Order: every sender (a thread each) sends `PER_SENDER` messages, each on a
/// channel picked by a formula that differs per sender, with sizes from 9
/// bytes to a few KiB. The receiver drains every channel concurrently (a
/// thread per channel) and sees, per channel and sender, sequence numbers
/// 0, 1, 2, … without gaps.
pub fn per_sender_order_holds_per_channel(senders: Vec<Arc<dyn Fabric>>, receiver: Arc<dyn Fabric>) {
    const PER_SENDER: u32 = 3000;
    let chosen = channels();
    let pick = |sender: u32, i: u32| chosen[((i * 7 + sender * 3 + (i / 5) * sender) as usize) % chosen.len()];
    // Expected messages per channel and sender, computed from the same formula.
    let mut expected = vec![vec![0u32; senders.len()]; CHANNELS_MAX];
    for (s, _) in senders.iter().enumerate() {
        for i in 0..PER_SENDER {
            expected[pick(s as u32, i).index()][s] += 1;
        }
    }
    let to = receiver.local_node();
    let ids: Vec<NodeId> = senders.iter().map(|s| s.local_node()).collect();
    let sending: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(s, fabric)| {
            let chosen = chosen.clone();
            std::thread::spawn(move || {
                let pick = |i: u32| chosen[((i * 7 + s as u32 * 3 + (i / 5) * s as u32) as usize) % chosen.len()];
                let mut next = [0u32; CHANNELS_MAX];
                for i in 0..PER_SENDER {
                    let channel = pick(i);
                    let len = 9 + (i as usize * 997) % 4096;
                    fabric
                        .send(to, channel, &tagged(channel, fabric.local_node(), next[channel.index()], len))
                        .unwrap();
                    next[channel.index()] += 1;
                }
            })
        })
        .collect();
    let draining: Vec<_> = chosen
        .iter()
        .map(|&channel| {
            let receiver = Arc::clone(&receiver);
            let (ids, want) = (ids.clone(), expected[channel.index()].clone());
            std::thread::spawn(move || {
                let mut next = vec![0u32; ids.len()];
                for _ in 0..want.iter().sum::<u32>() {
                    let message = recv(receiver.as_ref(), channel);
                    let s = ids.iter().position(|id| *id == message.from).expect("a known sender");
                    let (tag_channel, tag_sender, seq) = tag_of(&message.payload);
                    assert_eq!(
                        (message.channel.id(), tag_channel, tag_sender),
                        (channel.id(), channel.id(), message.from)
                    );
                    assert_eq!(seq, next[s], "{channel}: messages from {} arrive in send order", message.from);
                    next[s] += 1;
                }
                assert_eq!(next, want, "{channel}: every message of every sender");
            })
        })
        .collect();
    for thread in sending {
        thread.join().expect("every send succeeded");
    }
    for thread in draining {
        thread.join().expect("every channel in order");
    }
    assert_all_empty(receiver.as_ref(), "receiver");
}

/// A channel id out of range is refused with a typed error before anything
/// is sent, and nothing arrives anywhere.
pub fn out_of_range_channels_are_typed_errors(sender: &dyn Fabric, receiver: &dyn Fabric) {
    for id in [CHANNELS_MAX as u8, 200, u8::MAX] {
        let sent = Channel::new(id).and_then(|channel| sender.send(receiver.local_node(), channel, b"nowhere"));
        assert_eq!(sent, Err(FabricError::UnknownChannel { channel: id }));
    }
    sender.send(receiver.local_node(), Channel::TEST, b"fence").unwrap();
    assert_eq!(recv(receiver, Channel::TEST).payload, b"fence");
    assert_all_empty(receiver, "receiver");
}

/// A byte stream to a receiver's message endpoint, as a backend opens it.
pub trait RawStream: Read + Write {}
impl<T: Read + Write> RawStream for T {}

/// A raw connection that says `Hello` as `from`, delivers one good message,
/// then a `Message` frame whose channel byte is out of range, then another
/// good message. The receiver delivers the first, closes the connection at
/// the bad frame (never reading the third), and goes on serving `sender`.
/// `open_raw` connects to the receiver's message endpoint with a read
/// timeout of [`BOUND`].
pub fn a_bad_channel_byte_on_the_wire_closes_that_connection_only(
    open_raw: &dyn Fn() -> Box<dyn RawStream>,
    from: NodeId,
    sender: &dyn Fabric,
    receiver: &dyn Fabric,
) {
    for bad in [CHANNELS_MAX as u8, 200, u8::MAX] {
        let mut raw = open_raw();
        let before = encode(&Frame::Message { channel: Channel::TEST, payload: b"before".to_vec() });
        let mut malformed = encode(&Frame::Message { channel: Channel::TEST, payload: b"bad".to_vec() });
        // The channel byte follows the length prefix and the kind byte.
        assert_eq!(malformed[LENGTH_PREFIX_BYTES + 1], Channel::TEST.id());
        malformed[LENGTH_PREFIX_BYTES + 1] = bad;
        let after = encode(&Frame::Message { channel: Channel::TEST, payload: b"after".to_vec() });
        let mut bytes = encode(&Frame::Hello { node: from });
        for frame in [before, malformed, after] {
            bytes.extend_from_slice(&frame);
        }
        raw.write_all(&bytes).unwrap();
        let message = recv(receiver, Channel::TEST);
        assert_eq!((message.from, message.channel, message.payload), (from, Channel::TEST, b"before".to_vec()));
        assert!(closed_by_receiver(raw.as_mut()), "channel {bad}: the receiver closes the connection");
        // The connection's frames are handled in order and it is closed, so
        // nothing after the bad frame can still arrive.
        assert_all_empty(receiver, "after a bad channel byte");
        sender.send(receiver.local_node(), Channel::TEST, b"still served").unwrap();
        assert_eq!(recv(receiver, Channel::TEST).payload, b"still served");
    }
}

/// True once the far end closed the stream (end of stream or reset); false
/// if the read timeout passed with the stream open.
fn closed_by_receiver(raw: &mut dyn RawStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match raw.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Messages that fill a channel, then large ones that exceed every socket
/// buffer between two nodes (loopback TCP buffers reach a few tens of MiB;
/// Unix sockets hold far less): a sender that is really held back cannot
/// finish while the channel stays full.
const SMALL_MESSAGES: usize = INBOX_MESSAGES_MAX;
const LARGE_MESSAGES: usize = 1024;
const LARGE_MESSAGE_BYTES: usize = 64 * 1024;
const FILL_TOTAL: usize = SMALL_MESSAGES + LARGE_MESSAGES;

fn fill_payload(seq: usize) -> Vec<u8> {
    let mut payload = (seq as u64).to_le_bytes().to_vec();
    if seq >= SMALL_MESSAGES {
        payload.resize(LARGE_MESSAGE_BYTES, 0x5a);
    }
    payload
}

/// What the full-channel scenario observed; every backend must produce
/// [`FullChannelOutcome::EXPECTED`].
#[derive(Debug, PartialEq, Eq)]
pub struct FullChannelOutcome {
    /// The full channel's inbox reached its bound while its sender was held
    /// back (had not finished sending).
    pub filled_while_sender_held: bool,
    /// While the sender was held on the full channel, the same sender's
    /// messages on other channels arrived, in order.
    pub other_channels_delivered_while_held: usize,
    /// The held sender was still held after those arrived.
    pub still_held_after_other_channels: bool,
    pub send_errors: usize,
    /// Messages of the full channel received, in send order, once drained.
    pub received_in_order: usize,
}

const OTHER_CHANNEL_MESSAGES: usize = 100;

impl FullChannelOutcome {
    pub const EXPECTED: FullChannelOutcome = FullChannelOutcome {
        filled_while_sender_held: true,
        other_channels_delivered_while_held: OTHER_CHANNEL_MESSAGES,
        still_held_after_other_channels: true,
        send_errors: 0,
        received_in_order: FILL_TOTAL,
    };
}

/// The full-channel rule. `sender` fills the receiver's `Channel::TEST`
/// from one thread and goes on sending (held back: the receiver does not
/// drain it); meanwhile the same sender node sends on `Channel::APP` from
/// another thread, and those messages arrive. Then the receiver drains
/// `TEST` and every message arrives, in order. Both fabrics need a send
/// timeout of at least [`SEND_TIMEOUT`].
pub fn a_full_channel_holds_back_only_itself(sender: Arc<dyn Fabric>, receiver: Arc<dyn Fabric>) -> FullChannelOutcome {
    let to = receiver.local_node();
    let sent = Arc::new(AtomicUsize::new(0));
    let filling = {
        let (sender, sent) = (Arc::clone(&sender), Arc::clone(&sent));
        std::thread::spawn(move || {
            let mut errors = 0;
            for seq in 0..FILL_TOTAL {
                if let Err(e) = sender.send(to, Channel::TEST, &fill_payload(seq)) {
                    eprintln!("send {seq} failed: {e}");
                    errors += 1;
                }
                sent.fetch_add(1, Ordering::Release);
            }
            errors
        })
    };
    let full = receiver.inbox(Channel::TEST);
    // Bounded by progress, not by a total: a backend whose sends are slow
    // (each one acknowledged, on a loaded machine) still fills the inbox; a
    // broken one stops making progress and fails.
    let (mut seen, mut progressed) = ((0, 0), instant_now());
    while full.len() < INBOX_MESSAGES_MAX {
        let now = (full.len(), sent.load(Ordering::Acquire));
        if now != seen {
            (seen, progressed) = (now, instant_now());
        } else if progressed.elapsed() > BOUND {
            break;
        }
        std::thread::yield_now();
    }
    let filled_while_sender_held = full.len() == INBOX_MESSAGES_MAX && sent.load(Ordering::Acquire) < FILL_TOTAL;

    // The same sender node, another channel: not held back by the full one.
    let mut other_channels_delivered_while_held = 0;
    for seq in 0..OTHER_CHANNEL_MESSAGES {
        let payload = tagged(Channel::APP, sender.local_node(), seq as u32, 64);
        if sender.send(to, Channel::APP, &payload).is_err() {
            break;
        }
        match receiver.inbox(Channel::APP).recv_timeout(BOUND) {
            Ok(message) if message.payload == payload => other_channels_delivered_while_held += 1,
            _ => break,
        }
    }
    // Still held: the rest of the full channel's messages cannot fit in the
    // buffers between the nodes while it is not drained.
    let still_held_after_other_channels = sent.load(Ordering::Acquire) < FILL_TOTAL && full.len() == INBOX_MESSAGES_MAX;

    let mut received_in_order = 0;
    while received_in_order < FILL_TOTAL {
        let Ok(message) = full.recv_timeout(BOUND) else { break };
        let seq = u64::from_le_bytes(message.payload[..8].try_into().unwrap()) as usize;
        if message.from != sender.local_node() || seq != received_in_order || message.payload != fill_payload(seq) {
            break;
        }
        received_in_order += 1;
    }
    let send_errors = filling.join().unwrap();
    assert_all_empty(receiver.as_ref(), "receiver after draining");
    FullChannelOutcome {
        filled_while_sender_held,
        other_channels_delivered_while_held,
        still_held_after_other_channels,
        send_errors,
        received_in_order,
    }
}

/// What the try-send scenario observed; every backend must produce
/// [`TrySendOutcome::EXPECTED`].
#[derive(Debug, PartialEq, Eq)]
pub struct TrySendOutcome {
    /// `try_send` into a channel the receiver does not drain answered
    /// `WouldBlock` (it returned: a send that waited would have stayed
    /// until the 30 s send timeout, then failed with `Timeout`).
    pub would_block_when_full: bool,
    /// Some messages were sent before it did (the try path sends).
    pub sent_before_full: bool,
    /// Once the receiver drained, a `try_send` was `Sent` again.
    pub sent_after_drain: bool,
    /// Every message a try reported `Sent` arrived once, in order, and
    /// none a try reported `WouldBlock`.
    pub received_exactly_the_sent: bool,
    pub errors: usize,
}

impl TrySendOutcome {
    pub const EXPECTED: TrySendOutcome = TrySendOutcome {
        would_block_when_full: true,
        sent_before_full: true,
        sent_after_drain: true,
        received_exactly_the_sent: true,
        errors: 0,
    };
}

/// The try path: after one ordinary `send` (a backend may dial or wire up
/// on the first), `sender` calls `try_send` on `Channel::TEST` until it
/// answers `WouldBlock`, the receiver draining nothing (small messages to
/// fill the inbox, then 8 KiB ones, smaller than any backend's ring, to
/// fill the buffers between the nodes). Then the receiver drains, and a
/// `try_send` retried until `Sent` (bounded) goes through. Both fabrics
/// need a send timeout of at least [`SEND_TIMEOUT`].
pub fn a_try_send_never_waits_on_a_full_channel(sender: Arc<dyn Fabric>, receiver: Arc<dyn Fabric>) -> TrySendOutcome {
    const LARGE_BYTES: usize = 8 * 1024;
    let try_payload = |seq: usize| {
        let mut payload = (seq as u64).to_le_bytes().to_vec();
        if seq > SMALL_MESSAGES {
            payload.resize(LARGE_BYTES, seq as u8);
        }
        payload
    };
    let to = receiver.local_node();
    let inbox = receiver.inbox(Channel::TEST);
    let mut errors = 0;
    let mut sent = 0usize;
    if sender.send(to, Channel::TEST, &try_payload(0)).is_err() {
        errors += 1;
    }
    sent += 1;
    // Bounded only so that a backend that never blocks fails: far more
    // than the inbox and the largest socket buffers hold.
    let mut would_block_when_full = false;
    while sent < SMALL_MESSAGES + 16 * 1024 {
        match sender.try_send(to, Channel::TEST, &try_payload(sent)) {
            Ok(TrySend::Sent) => sent += 1,
            Ok(TrySend::WouldBlock) => {
                // Room may still free up as the receiver's reader moves
                // messages in; full means the inbox is at its bound.
                if inbox.len() == INBOX_MESSAGES_MAX {
                    would_block_when_full = true;
                    break;
                }
                std::thread::yield_now();
            }
            Err(e) => {
                eprintln!("try_send {sent} failed: {e}");
                errors += 1;
                break;
            }
        }
    }
    let sent_before_full = sent > 1;

    let mut received = 0usize;
    let mut in_order = true;
    let drain = |upto: usize, received: &mut usize| {
        while *received < upto {
            let Ok(message) = inbox.recv_timeout(BOUND) else { return false };
            if message.from != sender.local_node() || message.payload != try_payload(*received) {
                return false;
            }
            *received += 1;
        }
        true
    };
    in_order &= drain(sent, &mut received);

    let mut sent_after_drain = false;
    let start = instant_now();
    while start.elapsed() < BOUND {
        match sender.try_send(to, Channel::TEST, &try_payload(sent)) {
            Ok(TrySend::Sent) => {
                sent += 1;
                sent_after_drain = true;
                break;
            }
            Ok(TrySend::WouldBlock) => std::thread::yield_now(),
            Err(e) => {
                eprintln!("try_send after draining failed: {e}");
                errors += 1;
                break;
            }
        }
    }
    in_order &= drain(sent, &mut received);
    // Nothing beyond what was reported sent.
    std::thread::yield_now();
    let received_exactly_the_sent = in_order && received == sent && inbox.try_recv().is_none();
    assert_all_empty(receiver.as_ref(), "receiver after draining");
    TrySendOutcome { would_block_when_full, sent_before_full, sent_after_drain, received_exactly_the_sent, errors }
}
