//! The `shm` message rings on nodes of one process: a full ring, fragments,
//! a closed receiver and its next incarnation, corrupt and foreign ring
//! files. (Several processes: `ring_processes.rs`; the word protocol under
//! loom: `loom_ring.rs`.)

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::limits::{INBOX_MESSAGES_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::time::instant_now;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError};
use tierstack_fabric_shm::messages::layout;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};

/// A bound on every wait, only so that a broken transport fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

fn open(root: &Path, id: u32, nodes: &[u32], send_timeout: Duration) -> Arc<ShmFabric> {
    let nodes = nodes.iter().copied().map(NodeId).collect();
    ShmFabric::open(ShmConfig::new(root, NodeId(id)).with_nodes(nodes).with_send_timeout(send_timeout)).unwrap()
}

/// A payload naming its sequence number, padded to `len` with a pattern of its own.
fn numbered(seq: u32, len: usize) -> Vec<u8> {
    let mut payload = seq.to_le_bytes().to_vec();
    payload.extend((4..len.max(4)).map(|i| (i as u32 ^ seq.wrapping_mul(31)) as u8));
    payload
}

/// [`numbered`], cut to exactly `len` bytes (shorter than the number, too).
fn sized(seq: u32, len: usize) -> Vec<u8> {
    let mut payload = numbered(seq, len);
    payload.truncate(len);
    payload
}

/// The ring files in `receiver`'s node directory from `from` on `channel`.
fn ring_files(root: &Path, receiver: u32, channel: Channel, from: u32) -> Vec<PathBuf> {
    let prefix = format!("{}{}.{from}.", layout::RING_PREFIX, channel.id());
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(format!("node-{receiver}")))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// A ring file's words, mapped as a foreign process would map them.
struct MappedFile {
    map: memmap2::MmapMut,
}

impl MappedFile {
    fn open(path: &Path) -> MappedFile {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        // SAFETY: test-only mapping of a file another thread maps too; it
        // is accessed below only through atomic words.
        MappedFile { map: unsafe { memmap2::MmapMut::map_mut(&file).unwrap() } }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.map.len());
        // SAFETY: in bounds, aligned (the mapping is page aligned), atomics only.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

#[test]
fn a_full_ring_holds_its_sender_then_times_out_and_loses_nothing_that_was_sent() {
    let dir = tempfile::tempdir().unwrap();
    let sender = open(dir.path(), 0, &[0, 1], Duration::from_millis(200));
    let receiver = open(dir.path(), 1, &[0, 1], Duration::from_millis(200));
    // The receiver takes nothing: the ring fills, and a send waits for room
    // until its timeout.
    let mut sent = 0u32;
    let error = loop {
        match sender.send(NodeId(1), Channel::TEST, &numbered(sent, 64)) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 100_000, "a ring of 64 KiB never fills");
    };
    assert!(matches!(error, FabricError::Timeout { node: NodeId(1), .. }), "{error}");
    assert!(sent as usize > layout::RING_DATA_BYTES / 80, "the ring held {sent} messages");
    // Held back, not dropped: everything that was sent arrives, in order,
    // and the message that timed out does not.
    let inbox = receiver.inbox(Channel::TEST);
    for seq in 0..sent {
        assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, numbered(seq, 64));
    }
    assert!(inbox.is_empty());
    sender.send(NodeId(1), Channel::TEST, &numbered(sent, 64)).unwrap();
    assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, numbered(sent, 64), "room again: sends go through");
}

#[test]
fn a_full_inbox_leaves_the_rest_in_its_rings_and_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let sender = open(dir.path(), 0, &[0, 1], BOUND);
    let receiver = open(dir.path(), 1, &[0, 1], BOUND);
    let total = INBOX_MESSAGES_MAX as u32 + 5000;
    let sending = {
        let sender = sender.clone();
        std::thread::spawn(move || {
            for seq in 0..total {
                sender.send(NodeId(1), Channel::TEST, &numbered(seq, 16)).unwrap();
            }
        })
    };
    let inbox = receiver.inbox(Channel::TEST);
    let deadline = instant_now() + BOUND;
    while inbox.len() < INBOX_MESSAGES_MAX {
        assert!(instant_now() < deadline, "the inbox fills");
        std::thread::yield_now();
    }
    // Full: the rest waits in the ring, which fills and holds the sender;
    // what the inbox is offered and has no room for is kept, not lost.
    let ring = MappedFile::open(&ring_files(dir.path(), 1, Channel::TEST, 0)[0]);
    loop {
        let used = ring.word(layout::RING_HEAD_OFFSET).load(Ordering::Acquire)
            - ring.word(layout::RING_TAIL_OFFSET).load(Ordering::Acquire);
        assert_eq!(inbox.len(), INBOX_MESSAGES_MAX);
        if used + 3 > (layout::RING_DATA_BYTES / 8) as u64 {
            break;
        }
        assert!(instant_now() < deadline, "the ring fills");
        std::thread::yield_now();
    }
    assert!(!sending.is_finished(), "the sender is held");
    for seq in 0..total {
        assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, numbered(seq, 16), "in order, none lost");
    }
    sending.join().unwrap();
    assert!(inbox.is_empty());
}

#[test]
fn a_message_that_times_out_half_sent_is_never_delivered_and_the_next_one_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let sender = open(dir.path(), 0, &[0, 1], Duration::from_millis(200));
    let receiver = open(dir.path(), 1, &[0, 1], Duration::from_millis(200));
    sender.send(NodeId(1), Channel::TEST, b"before").unwrap();
    // Larger than the ring: its first fragments are published, the rest
    // wait for room that never comes.
    let large = numbered(7, layout::RING_DATA_BYTES + layout::FRAGMENT_BYTES_MAX);
    let error = sender.send(NodeId(1), Channel::TEST, &large).unwrap_err();
    assert!(matches!(error, FabricError::Timeout { .. }), "{error}");
    let inbox = receiver.inbox(Channel::TEST);
    assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, b"before");
    // Draining the published fragments delivers nothing.
    assert_eq!(inbox.len(), 0, "an unfinished message is not delivered");
    let files = ring_files(dir.path(), 1, Channel::TEST, 0);
    let ring = MappedFile::open(&files[0]);
    let (head, tail) = (ring.word(layout::RING_HEAD_OFFSET), ring.word(layout::RING_TAIL_OFFSET));
    assert_eq!(head.load(Ordering::Acquire), tail.load(Ordering::Acquire), "its fragments were taken");
    assert!(head.load(Ordering::Acquire) > (layout::RING_DATA_BYTES / 8) as u64 / 2, "fragments were published");
    sender.send(NodeId(1), Channel::TEST, b"after").unwrap();
    assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, b"after", "not glued to the unfinished one");
    assert!(inbox.is_empty());
}

#[test]
fn messages_of_every_size_arrive_whole_and_too_large_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sender = open(dir.path(), 0, &[0, 1], BOUND);
    let receiver = open(dir.path(), 1, &[0, 1], BOUND);
    let f = layout::FRAGMENT_BYTES_MAX;
    let sizes =
        [0, 1, 7, 8, 9, f - 1, f, f + 1, 3 * f, layout::RING_DATA_BYTES, 5 * f + 3, 1 << 20, TRANSFER_BYTES_MAX];
    let receiving = {
        let receiver = receiver.clone();
        std::thread::spawn(move || {
            for (seq, len) in sizes.iter().enumerate() {
                let message = receiver.inbox(Channel::TEST).recv_timeout(BOUND).unwrap();
                assert_eq!(message.payload.len(), *len);
                assert!(message.payload == sized(seq as u32, *len), "message {seq} of {len} bytes arrives whole");
            }
        })
    };
    for (seq, len) in sizes.iter().enumerate() {
        sender.send(NodeId(1), Channel::TEST, &sized(seq as u32, *len)).unwrap();
    }
    receiving.join().expect("every size arrived whole, in order");
    let too_large = vec![0u8; TRANSFER_BYTES_MAX + 1];
    assert_eq!(
        sender.send(NodeId(1), Channel::TEST, &too_large),
        Err(FabricError::TransferTooLarge { len: TRANSFER_BYTES_MAX + 1 })
    );
    assert!(receiver.inbox(Channel::TEST).is_empty());
}

#[test]
fn a_closed_receiver_is_peer_dead_and_its_next_incarnation_gets_the_next_messages() {
    let dir = tempfile::tempdir().unwrap();
    let sender = open(dir.path(), 0, &[0, 1], BOUND);
    let receiver = open(dir.path(), 1, &[0, 1], BOUND);
    sender.send(NodeId(1), Channel::TEST, b"first").unwrap();
    assert_eq!(receiver.inbox(Channel::TEST).recv_timeout(BOUND).unwrap().payload, b"first");
    drop(receiver);
    let error = sender.send(NodeId(1), Channel::TEST, b"to nobody").unwrap_err();
    assert!(matches!(error, FabricError::PeerDead { node: NodeId(1), .. }), "{error}");
    let reopened = open(dir.path(), 1, &[0, 1], BOUND);
    sender.send(NodeId(1), Channel::TEST, b"second").unwrap();
    let message = reopened.inbox(Channel::TEST).recv_timeout(BOUND).unwrap();
    assert_eq!((message.from, message.payload.as_slice()), (NodeId(0), &b"second"[..]));
    assert!(reopened.inbox(Channel::TEST).is_empty(), "nothing of the first incarnation's");
}

#[test]
fn a_sender_held_by_a_full_ring_gets_peer_dead_when_its_receiver_closes() {
    let dir = tempfile::tempdir().unwrap();
    let sender = open(dir.path(), 0, &[0, 1], BOUND);
    let receiver = open(dir.path(), 1, &[0, 1], BOUND);
    let filling = {
        let sender = sender.clone();
        std::thread::spawn(move || {
            let mut seq = 0;
            loop {
                if let Err(e) = sender.send(NodeId(1), Channel::TEST, &numbered(seq, 256)) {
                    return e;
                }
                seq += 1;
            }
        })
    };
    // Wait until the ring is full: the sender is then held.
    let deadline = instant_now() + BOUND;
    let full = loop {
        if let Some(path) = ring_files(dir.path(), 1, Channel::TEST, 0).first() {
            let ring = MappedFile::open(path);
            let used = ring.word(layout::RING_HEAD_OFFSET).load(Ordering::Acquire)
                - ring.word(layout::RING_TAIL_OFFSET).load(Ordering::Acquire);
            if used + 33 > (layout::RING_DATA_BYTES / 8) as u64 {
                break true;
            }
        }
        if instant_now() > deadline {
            break false;
        }
        std::thread::yield_now();
    };
    assert!(full, "the ring filled");
    drop(receiver);
    let error = filling.join().unwrap();
    assert!(matches!(error, FabricError::PeerDead { node: NodeId(1), .. }), "not a timeout: {error}");
}

#[test]
fn corrupt_rings_and_foreign_files_are_refused_without_harming_the_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = open(dir.path(), 1, &[0, 1, 2], BOUND);
    let node_dir = dir.path().join("node-1");
    // Files that look like rings but are not ours to read: a channel out of
    // range, a sender outside the cluster, garbage, a header naming another
    // channel. They are looked at when the next ring appears, and refused.
    let real_len = layout::RING_DATA_OFFSET + layout::RING_DATA_BYTES;
    // Private files of ours (0600), so it is their content that is refused
    // (planted files: `private_root.rs`).
    let plant = |name: &str, bytes: Vec<u8>| {
        let path = node_dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    };
    plant("q.200.0.x-0", vec![0u8; real_len]);
    plant("q.5.7.x-0", vec![0u8; real_len]);
    plant("q.5.0.garbage-0", vec![0xa5u8; real_len]);
    let mut other_channel = vec![0u8; real_len];
    other_channel[..8].copy_from_slice(&layout::RING_MAGIC.to_le_bytes());
    other_channel[8..16].copy_from_slice(&((layout::RING_DATA_BYTES / 8) as u64).to_ne_bytes());
    other_channel[24..32].copy_from_slice(&4u64.to_ne_bytes());
    plant("q.5.0.other-0", other_channel);

    let good = open(dir.path(), 0, &[0, 1, 2], BOUND);
    let victim = open(dir.path(), 2, &[0, 1, 2], BOUND);
    good.send(NodeId(1), Channel::TEST, b"good 1").unwrap();
    victim.send(NodeId(1), Channel::TEST, b"victim 1").unwrap();
    let inbox = receiver.inbox(Channel::TEST);
    let mut got: Vec<Vec<u8>> = (0..2).map(|_| inbox.recv_timeout(BOUND).unwrap().payload).collect();
    got.sort();
    assert_eq!(got, vec![b"good 1".to_vec(), b"victim 1".to_vec()], "no foreign file was read");

    // Corrupt the victim's ring: a published record whose header is garbage.
    let files = ring_files(dir.path(), 1, Channel::TEST, 2);
    assert_eq!(files.len(), 1);
    let ring = MappedFile::open(&files[0]);
    let head = ring.word(layout::RING_HEAD_OFFSET).load(Ordering::Acquire);
    let slot = layout::RING_DATA_OFFSET + (head as usize % (layout::RING_DATA_BYTES / 8)) * 8;
    ring.word(slot).store(0xdead_beef, Ordering::Relaxed);
    ring.word(layout::RING_HEAD_OFFSET).store(head + 1, Ordering::Release);
    assert_eq!(inbox.len(), 0, "the corrupt record is not delivered");
    assert_eq!(ring.word(layout::RING_REFUSED_OFFSET).load(Ordering::Acquire), 1, "the ring is refused");

    // Both senders are still served; the victim on a new ring.
    good.send(NodeId(1), Channel::TEST, b"good 2").unwrap();
    victim.send(NodeId(1), Channel::TEST, b"victim 2").unwrap();
    let mut got: Vec<Vec<u8>> = (0..2).map(|_| inbox.recv_timeout(BOUND).unwrap().payload).collect();
    got.sort();
    assert_eq!(got, vec![b"good 2".to_vec(), b"victim 2".to_vec()]);
    assert!(inbox.is_empty());
    let victim_rings = ring_files(dir.path(), 1, Channel::TEST, 2);
    assert_eq!(victim_rings.len(), 1, "the refused ring was deleted, the new one serves");
    assert_ne!(victim_rings[0], files[0]);
    for foreign in ["q.200.0.x-0", "q.5.7.x-0", "q.5.0.garbage-0", "q.5.0.other-0"] {
        assert!(node_dir.join(foreign).exists(), "{foreign} was left alone");
    }
}

#[test]
fn a_closed_senders_drained_ring_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = open(dir.path(), 1, &[0, 1, 2], BOUND);
    let leaving = open(dir.path(), 0, &[0, 1, 2], BOUND);
    leaving.send(NodeId(1), Channel::TEST, b"last words").unwrap();
    drop(leaving);
    assert_eq!(ring_files(dir.path(), 1, Channel::TEST, 0).len(), 1, "kept until drained");
    assert_eq!(receiver.inbox(Channel::TEST).recv_timeout(BOUND).unwrap().payload, b"last words");
    // The next look at the rings (a new ring appears) deletes it.
    let other = open(dir.path(), 2, &[0, 1, 2], BOUND);
    other.send(NodeId(1), Channel::TEST, b"hello").unwrap();
    assert_eq!(receiver.inbox(Channel::TEST).recv_timeout(BOUND).unwrap().payload, b"hello");
    assert!(ring_files(dir.path(), 1, Channel::TEST, 0).is_empty());
}
