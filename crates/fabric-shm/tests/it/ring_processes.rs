//! The `shm` message rings between processes: many senders with per-channel
//! order checked and nothing lost; a receiver that dies (its senders get
//! `PeerDead`, never a hang); a SIGSTOPped receiver (its senders are held
//! and time out, and after SIGCONT it receives exactly what was sent, never
//! a torn or unfinished message); a sender killed mid-message (its
//! unfinished message is never delivered, and the node id's next
//! incarnation is served).
//!
//! The child processes are this test binary run again on its `child_entry`
//! test with the role in an environment variable; each child exits when its
//! standard input closes, so a failed test leaves no process behind.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError};
use tierstack_fabric_shm::messages::layout;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_testkit::channels::{salted, tag_of};
use tierstack_testkit::child::{self, ChildProcess};

/// A bound on every wait, only so that a broken transport fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);
const ROLE: &str = "TIERSTACK_RING_CHILD_ROLE";
const ROOT: &str = "TIERSTACK_RING_CHILD_ROOT";
const NODE: &str = "TIERSTACK_RING_CHILD_NODE";
/// The test the children run (its path in the crate's one test binary).
const CHILD_ENTRY: &str = "ring_processes::child_entry";
/// Every test's cluster: the parent is node 0, children 1 to 4.
const NODES: [u32; 5] = [0, 1, 2, 3, 4];
/// The sequence number of a message that must never be delivered.
const NEVER: u32 = u32::MAX;

fn config(root: &Path, node: u32, send_timeout: Duration) -> ShmConfig {
    ShmConfig::new(root, NodeId(node))
        .with_nodes(NODES.iter().copied().map(NodeId).collect())
        .with_send_timeout(send_timeout)
}

/// The stress senders' channels, and which one message `i` of `sender` takes.
const STRESS_CHANNELS: [Channel; 3] = [Channel::LOCKS, Channel::PRESS, Channel::TEST];
const STRESS_MESSAGES: u32 = 3000;

fn stress_channel(sender: u32, i: u32) -> Channel {
    STRESS_CHANNELS[((i * 7 + sender * 3 + (i / 5) * sender) % 3) as usize]
}

/// Message `i`'s size: mostly small, every 97th larger than a ring fragment.
fn stress_len(sender: u32, i: u32) -> usize {
    if (i + sender).is_multiple_of(97) {
        20_000 + (i as usize * 7919) % 30_000
    } else {
        12 + (i as usize * 31 + sender as usize) % 200
    }
}

/// Message `seq` of `sender` on `channel`, `len` bytes long.
fn payload(sender: u32, channel: Channel, seq: u32, len: usize) -> Vec<u8> {
    salted(channel, NodeId(sender), seq, len)
}

// ------------------------------------------------------------------ children

/// Not a test: the entry point of the child processes (does nothing unless
/// started by a test as a child).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let root = PathBuf::from(std::env::var(ROOT).unwrap());
    let node: u32 = std::env::var(NODE).unwrap().parse().unwrap();
    // Exit when the parent closes our standard input (or dies).
    std::thread::spawn(|| {
        let mut line = String::new();
        while std::io::stdin().lock().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            line.clear();
        }
        std::process::exit(0);
    });
    let say = |line: &str| {
        let mut out = std::io::stdout().lock();
        // After a newline: libtest may have begun a line of its own.
        writeln!(out, "\n@@{line}").unwrap();
        out.flush().unwrap();
    };
    match role.as_str() {
        // Sends the stress messages to node 0, then exits.
        "stress-sender" => {
            let fabric = ShmFabric::open(config(&root, node, BOUND)).unwrap();
            let mut next = [0u32; 8];
            for i in 0..STRESS_MESSAGES {
                let channel = stress_channel(node, i);
                let seq = next[channel.index()];
                fabric.send(NodeId(0), channel, &payload(node, channel, seq, stress_len(node, i))).unwrap();
                next[channel.index()] += 1;
            }
            say("done");
        }
        // Opens its node and never receives.
        "idle-receiver" => {
            let _fabric = ShmFabric::open(config(&root, node, BOUND)).unwrap();
            say("ready");
            loop {
                std::thread::park();
            }
        }
        // Receives node 0's messages on TEST, checking each against its
        // sequence number; a message "report" makes it print its counts.
        "checking-receiver" => {
            let fabric = ShmFabric::open(config(&root, node, BOUND)).unwrap();
            say("ready");
            let (mut received, mut bad) = (0u32, 0u32);
            loop {
                let message = fabric.inbox(Channel::TEST).recv_timeout(Duration::from_secs(3600)).unwrap();
                if message.payload == b"report" {
                    say(&format!("received {received} bad {bad}"));
                    continue;
                }
                let (_, _, seq) = tag_of(&message.payload);
                if message.from != NodeId(0)
                    || seq != received
                    || message.payload != payload(0, Channel::TEST, seq, message.payload.len())
                {
                    bad += 1;
                }
                received += 1;
            }
        }
        // Sends "A", then a message far larger than its ring, which blocks
        // while node 0 does not receive.
        "unfinished-sender" => {
            let fabric = ShmFabric::open(config(&root, node, BOUND)).unwrap();
            fabric.send(NodeId(0), Channel::TEST, b"A").unwrap();
            say("started");
            let _ = fabric.send(NodeId(0), Channel::TEST, &vec![0x5a; 4 << 20]);
            say("finished");
        }
        "one-message-sender" => {
            let fabric = ShmFabric::open(config(&root, node, BOUND)).unwrap();
            fabric.send(NodeId(0), Channel::TEST, b"B").unwrap();
            say("done");
        }
        other => panic!("unknown child role {other}"),
    }
}

/// A child running `role` as `node` (this binary re-run on `child_entry`);
/// its answers are the lines it prints after `@@`.
fn start(role: &str, root: &Path, node: u32) -> ChildProcess {
    let mut command = child::reentry(CHILD_ENTRY);
    command.env(ROLE, role).env(ROOT, root).env(NODE, node.to_string()).stderr(Stdio::inherit());
    ChildProcess::spawn(&mut command).with_marker("@@").with_bound(BOUND)
}

/// Waits until `node`'s ring from `from` on TEST holds at least `words`
/// unread words (its sender is then held by a full ring).
fn wait_for_ring_fill(root: &Path, node: u32, from: u32, words: u64) -> PathBuf {
    let prefix = format!("{}{}.{from}.", layout::RING_PREFIX, Channel::TEST.id());
    let deadline = tierstack_base::time::instant_now() + BOUND;
    loop {
        let entries = std::fs::read_dir(root.join(format!("node-{node}"))).unwrap();
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let file = std::fs::File::open(entry.path()).unwrap();
            // SAFETY: a read-only test mapping, read through atomics only.
            let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
            // SAFETY: both offsets are aligned words inside the ring's header.
            let word =
                |offset: usize| unsafe { &*map.as_ptr().add(offset).cast::<AtomicU64>() }.load(Ordering::Acquire);
            if word(layout::RING_HEAD_OFFSET) - word(layout::RING_TAIL_OFFSET) >= words {
                return entry.path();
            }
        }
        assert!(tierstack_base::time::instant_now() < deadline, "the ring of {from} at {node} never filled");
        std::thread::yield_now();
    }
}

const RING_WORDS: u64 = (layout::RING_DATA_BYTES / 8) as u64;

// --------------------------------------------------------------------- tests

#[test]
fn many_sender_processes_keep_per_channel_order_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = ShmFabric::open(config(dir.path(), 0, BOUND)).unwrap();
    let senders = [1u32, 2, 3];
    let mut expected = [[0u32; 4]; 8];
    for &sender in &senders {
        for i in 0..STRESS_MESSAGES {
            expected[stress_channel(sender, i).index()][sender as usize] += 1;
        }
    }
    let draining: Vec<_> = STRESS_CHANNELS
        .iter()
        .map(|&channel| {
            let receiver = receiver.clone();
            let want = expected[channel.index()];
            std::thread::spawn(move || {
                let mut next = [0u32; 4];
                for _ in 0..want.iter().sum::<u32>() {
                    let message = receiver.inbox(channel).recv_timeout(BOUND).unwrap();
                    let from = message.from.0;
                    let (tag_channel, tag_sender, seq) = tag_of(&message.payload);
                    assert_eq!((tag_channel, tag_sender.0), (channel.id(), from), "on its channel, from its sender");
                    assert_eq!(seq, next[from as usize], "{channel}: {from}'s messages in send order, none lost");
                    assert_eq!(message.payload, payload(from, channel, seq, message.payload.len()), "whole");
                    next[from as usize] += 1;
                }
                assert_eq!(next, want);
            })
        })
        .collect();
    let mut children: Vec<ChildProcess> =
        senders.iter().map(|&node| start("stress-sender", dir.path(), node)).collect();
    for child in &mut children {
        assert_eq!(child.line(), "done");
        child.finish();
    }
    for thread in draining {
        thread.join().expect("every channel complete and in order");
    }
    for channel in Channel::all() {
        assert!(receiver.inbox(channel).is_empty(), "{channel}: nothing more");
    }
}

#[test]
fn a_receiver_that_dies_gives_its_senders_peer_dead_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let sender: Arc<dyn Fabric> = ShmFabric::open(config(dir.path(), 0, BOUND)).unwrap();

    // Killed while its ring has room: sends fail once the sender looks
    // (at the latest when the ring is full), with PeerDead.
    let mut receiver = start("idle-receiver", dir.path(), 1);
    assert_eq!(receiver.line(), "ready");
    sender.send(NodeId(1), Channel::TEST, b"hello").unwrap();
    receiver.kill();
    let mut accepted = 0;
    let error = loop {
        match sender.send(NodeId(1), Channel::TEST, &[7; 64]) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 2 * RING_WORDS, "sends to a dead receiver never stop succeeding");
    };
    assert!(matches!(error, FabricError::PeerDead { node: NodeId(1), .. }), "{error}");

    // Killed while its sender waits for room: the waiting send fails with
    // PeerDead (the send timeout is a minute: not a timeout).
    let mut receiver = start("idle-receiver", dir.path(), 2);
    assert_eq!(receiver.line(), "ready");
    let filling = {
        let sender = sender.clone();
        std::thread::spawn(move || loop {
            if let Err(e) = sender.send(NodeId(2), Channel::TEST, &[9; 256]) {
                return e;
            }
        })
    };
    wait_for_ring_fill(dir.path(), 2, 0, RING_WORDS - 33);
    receiver.kill();
    let error = filling.join().unwrap();
    assert!(matches!(error, FabricError::PeerDead { node: NodeId(2), .. }), "{error}");
    let again = sender.send(NodeId(2), Channel::TEST, b"anyone?");
    assert!(matches!(again, Err(FabricError::PeerDead { .. })), "{again:?}");
}

#[test]
fn a_stopped_receiver_holds_its_senders_and_then_gets_exactly_what_was_sent() {
    let dir = tempfile::tempdir().unwrap();
    let sender = ShmFabric::open(config(dir.path(), 0, Duration::from_millis(300))).unwrap();
    let mut receiver = start("checking-receiver", dir.path(), 1);
    assert_eq!(receiver.line(), "ready");
    let mut seq = 0u32;
    // Sends the next numbered message; only a message sent counts.
    let send_numbered = |seq: &mut u32, len: usize| {
        let result = sender.send(NodeId(1), Channel::TEST, &payload(0, Channel::TEST, *seq, len));
        if result.is_ok() {
            *seq += 1;
        }
        result
    };
    for i in 0..100 {
        send_numbered(&mut seq, 9 + i * 13).unwrap();
    }
    receiver.stop();
    // Stopped: a message larger than the ring is half sent, then times out.
    let unfinished = sender.send(NodeId(1), Channel::TEST, &payload(0, Channel::TEST, NEVER, 200_000));
    assert!(matches!(unfinished, Err(FabricError::Timeout { node: NodeId(1), .. })), "{unfinished:?}");
    receiver.signal(libc::SIGCONT);
    for i in 0..100 {
        send_numbered(&mut seq, 9 + i * 7).unwrap();
    }
    // Stopped again: small messages fill the ring, then a send times out.
    receiver.stop();
    let error = loop {
        if let Err(e) = send_numbered(&mut seq, 100) {
            break e;
        }
        assert!(seq < 1_000_000, "a stopped receiver's ring never fills");
    };
    assert!(matches!(error, FabricError::Timeout { node: NodeId(1), .. }), "{error}");
    receiver.signal(libc::SIGCONT);
    // The ring may still be full: a report that times out was not sent.
    let deadline = tierstack_base::time::instant_now() + BOUND;
    while let Err(e) = sender.send(NodeId(1), Channel::TEST, b"report") {
        assert!(matches!(e, FabricError::Timeout { .. }) && tierstack_base::time::instant_now() < deadline, "{e}");
    }
    assert_eq!(receiver.line(), format!("received {seq} bad 0"), "every sent message, in order, whole; no other");
}

#[test]
fn a_sender_killed_mid_message_delivers_nothing_unfinished_and_its_next_incarnation_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = ShmFabric::open(config(dir.path(), 0, BOUND)).unwrap();
    let mut unfinished = start("unfinished-sender", dir.path(), 2);
    assert_eq!(unfinished.line(), "started");
    // The receiver takes nothing: the large message's fragments fill the ring.
    let old_ring = wait_for_ring_fill(dir.path(), 0, 2, RING_WORDS / 2);
    unfinished.kill();
    let inbox = receiver.inbox(Channel::TEST);
    assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, b"A");
    assert_eq!(inbox.len(), 0, "the unfinished message is never delivered");
    // The same node id again, a new process: its message arrives whole,
    // and the dead incarnation's drained ring is deleted.
    let mut next = start("one-message-sender", dir.path(), 2);
    assert_eq!(next.line(), "done");
    next.finish();
    let message = inbox.recv_timeout(BOUND).unwrap();
    assert_eq!((message.from, message.payload.as_slice()), (NodeId(2), &b"B"[..]));
    assert!(inbox.is_empty());
    assert!(!old_ring.exists(), "the dead sender's ring is gone");
}
