//! The ucx backend between processes.
//!
//! - **The stress test** (the design's guard against a lost wake-up): three
//!   sender processes each send a seeded random mix of small and large
//!   messages on three channels to the parent, interleaved with fetch-adds
//!   on a counter of the parent's and write-then-read round trips on a slot
//!   of their own, while the parent drains its channels from three threads.
//!   Every message must arrive once, whole, in order per sender and
//!   channel; the counter must equal the fetch-adds. An idle progress
//!   thread sleeps with no timer at all (only a waiter's deadline bounds
//!   its sleep), so a lost wake-up stalls an operation until it times out,
//!   and any `Timeout` fails the test.
//! - **One-sidedness, reported**: with UCX's shared-memory transports every
//!   operation completes while the owner process is SIGSTOPped; over UCX's
//!   TCP transport the test prints which operations needed the owner (they
//!   time out) and requires that some did.
//!
//! Children are this test binary run again on its `child_entry` test with
//! the role in environment variables; a child exits when its standard input
//! closes, so a failed test leaves no process behind.

use crate::common;

use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, Op, OpResult};
use tierstack_fabric_ucx::{UcxConfig, UcxFabric};
use tierstack_testkit::channels::salted;
use tierstack_testkit::child::{self, ChildProcess};

const ROLE: &str = "TIERSTACK_UCX_CHILD_ROLE";
/// The test the children run (its path in the crate's one test binary).
const CHILD_ENTRY: &str = "processes::child_entry";
const NODE: &str = "TIERSTACK_UCX_CHILD_NODE";
const PEERS: &str = "TIERSTACK_UCX_CHILD_PEERS";
const TLS: &str = "TIERSTACK_UCX_CHILD_TLS";
const SEED: &str = "TIERSTACK_UCX_CHILD_SEED";
const MESSAGES: &str = "TIERSTACK_UCX_CHILD_MESSAGES";
/// A bound on every wait, only so that a broken backend fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);
/// The fabric timeout of the stress test: any operation or send slower than
/// this (a lost wake-up) fails it.
const STRESS_TIMEOUT: Duration = Duration::from_secs(10);
const STRESS_CHANNELS: [Channel; 3] = [Channel::LOCKS, Channel::PRESS, Channel::TEST];
const SENDERS: u32 = 3;
/// The parent's region: a counter word, then one 4 KiB slot per sender.
const COUNTER: u64 = 0;
const SLOT_BYTES: u64 = 4096;

fn slot(sender: u32) -> u64 {
    8 + u64::from(sender) * SLOT_BYTES
}

/// Message `seq` of `sender` on `channel`, `len` bytes long.
fn payload(sender: u32, channel: Channel, seq: u32, len: usize) -> Vec<u8> {
    salted(channel, NodeId(sender), seq, len)
}

fn peers_env(peers: &[(u32, SocketAddr)]) -> String {
    peers.iter().map(|(id, addr)| format!("{id}={addr}")).collect::<Vec<_>>().join(",")
}

fn open_node(node: u32, tls: &str, peers: &str, timeout: Duration) -> Arc<UcxFabric> {
    let loopback: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut config = UcxConfig::new(NodeId(node), loopback).with_op_timeout(timeout).with_transports(tls);
    for entry in peers.split(',').filter(|e| !e.is_empty()) {
        let (id, addr) = entry.split_once('=').unwrap();
        config = config.with_peer(NodeId(id.parse().unwrap()), addr.parse().unwrap());
    }
    UcxFabric::open(config).unwrap()
}

// ------------------------------------------------------------------ children

/// Not a test: the entry point of the child processes (does nothing unless
/// started by a test as a child).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let node: u32 = std::env::var(NODE).unwrap().parse().unwrap();
    let tls = std::env::var(TLS).unwrap();
    let peers = std::env::var(PEERS).unwrap_or_default();
    match role.as_str() {
        "sender" => stress_sender(node, &tls, &peers),
        "owner" => owner(node, &tls),
        other => panic!("unknown child role {other}"),
    }
}

/// Registers `shared` (1 KiB), prints its bootstrap address, and serves
/// until standard input closes.
fn owner(node: u32, tls: &str) {
    let fabric = open_node(node, tls, "", Duration::from_secs(5));
    fabric.register("shared", 1024, tierstack_fabric::Access::all()).unwrap();
    println!("ready {}", fabric.local_addr());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Waits for `go`, then sends its seeded mix to node 0 and prints a report line.
fn stress_sender(node: u32, tls: &str, peers: &str) {
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let messages: u32 = std::env::var(MESSAGES).unwrap().parse().unwrap();
    let fabric = open_node(node, tls, peers, STRESS_TIMEOUT);
    println!("ready {}", fabric.local_addr());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let region = fabric.connect(NodeId(0), "stress").unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ u64::from(node) << 32);
    let mut seq: HashMap<u8, u32> = HashMap::new();
    let (mut fetch_adds, mut errors) = (0u64, Vec::new());
    for i in 0..messages {
        let channel = STRESS_CHANNELS[rng.gen_range(0..STRESS_CHANNELS.len())];
        let len = if rng.gen_ratio(1, 40) { rng.gen_range(10_000..300_000) } else { rng.gen_range(9..300) };
        let n = seq.entry(channel.id()).or_insert(0);
        match fabric.send(NodeId(0), channel, &payload(node, channel, *n, len)) {
            Ok(()) => *n += 1,
            Err(e) => errors.push(format!("send {i}: {e}")),
        }
        match rng.gen_range(0..3) {
            0 => match region.fetch_add(COUNTER, 1) {
                Ok(_) => fetch_adds += 1,
                Err(e) => errors.push(format!("fetch_add {i}: {e}")),
            },
            1 => {
                let data: Vec<u8> = (0..rng.gen_range(1..SLOT_BYTES as usize)).map(|_| rng.gen()).collect();
                let ops = vec![
                    Op::Write { offset: slot(node), data: data.clone() },
                    Op::Read { offset: slot(node), len: data.len() as u32 },
                ];
                match region.post(ops).wait() {
                    Ok(results) if results[1] == OpResult::Read(data) => {}
                    Ok(_) => errors.push(format!("round trip {i}: read back other bytes")),
                    Err(e) => errors.push(format!("round trip {i}: {e}")),
                }
            }
            _ => {}
        }
    }
    let sent: u32 = seq.values().sum();
    println!("done {sent} {fetch_adds} {}", errors.join("; "));
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_line(&mut line);
}

// ------------------------------------------------------------------ parent side

/// A child running `role` as `node` over `tls` (this binary re-run on
/// `child_entry`), given time to report on its way out when dropped.
fn spawn(role: &str, node: u32, tls: &str, extra: &[(&str, String)]) -> ChildProcess {
    let mut command = child::reentry(CHILD_ENTRY);
    command.env(ROLE, role).env(NODE, node.to_string()).env(TLS, tls);
    for (key, value) in extra {
        command.env(key, value);
    }
    ChildProcess::spawn(&mut command).with_bound(BOUND).exit_on_drop_within(Duration::from_secs(10))
}

/// Messages each sender sends in one stress run (`TIERSTACK_UCX_STRESS_MESSAGES`
/// overrides, for long runs by hand).
fn stress_messages() -> u32 {
    std::env::var("TIERSTACK_UCX_STRESS_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1500)
}

fn stress(tls: &str) {
    if !common::ucx_or_skip() {
        return;
    }
    let seed = tierstack_testkit::test_seed();
    let messages = stress_messages();
    eprintln!(
        "ucx stress over {tls}: seed {seed} (replay with TIERSTACK_TEST_SEED={seed}), {messages} messages per sender"
    );
    let parent = open_node(0, tls, "", STRESS_TIMEOUT);
    let region =
        parent.register("stress", 8 + SLOT_BYTES * u64::from(SENDERS + 1), tierstack_fabric::Access::all()).unwrap();
    let parent_peer = vec![(0, parent.local_addr())];
    let mut children: Vec<ChildProcess> = (1..=SENDERS)
        .map(|node| {
            spawn(
                "sender",
                node,
                tls,
                &[(PEERS, peers_env(&parent_peer)), (SEED, seed.to_string()), (MESSAGES, messages.to_string())],
            )
        })
        .collect();
    for (i, child) in children.iter_mut().enumerate() {
        let addr: SocketAddr = child.line_after("ready").parse().unwrap();
        parent.add_peer(NodeId(i as u32 + 1), addr);
    }
    // Three receiving threads, one per channel, checking order and contents.
    let done = Arc::new(AtomicBool::new(false));
    let received: Arc<Mutex<HashMap<(u32, u8), u32>>> = Arc::default();
    let receivers: Vec<_> = STRESS_CHANNELS
        .iter()
        .map(|&channel| {
            let (parent, done, received) = (Arc::clone(&parent), Arc::clone(&done), Arc::clone(&received));
            std::thread::spawn(move || -> Result<(), String> {
                while !done.load(Ordering::Acquire) {
                    let message = match parent.inbox(channel).recv_timeout(Duration::from_millis(50)) {
                        Ok(message) => message,
                        Err(FabricError::RecvTimeout { .. }) => continue,
                        Err(e) => return Err(e.to_string()),
                    };
                    let sender = message.from.0;
                    let mut received = received.lock().unwrap();
                    let next = received.entry((sender, channel.id())).or_insert(0);
                    let expected = payload(sender, channel, *next, message.payload.len());
                    if message.payload != expected {
                        return Err(format!("from {sender} on {channel}: message {next} is wrong or out of order"));
                    }
                    *next += 1;
                }
                Ok(())
            })
        })
        .collect();
    for child in &mut children {
        child.tell("go");
    }
    let (mut sent, mut fetch_adds) = (0u64, 0u64);
    for (i, child) in children.iter_mut().enumerate() {
        let report = child.line_after("done");
        let mut fields = report.splitn(3, ' ');
        let s: u64 = fields.next().unwrap().parse().unwrap();
        let f: u64 = fields.next().unwrap().parse().unwrap();
        let errors = fields.next().unwrap_or("").trim();
        assert!(errors.is_empty(), "sender {}: {errors}", i + 1);
        assert_eq!(s, u64::from(messages), "sender {} sent every message", i + 1);
        sent += s;
        fetch_adds += f;
    }
    // Every send returned only once acknowledged in the inbox: all are queued.
    let until = tierstack_base::time::instant_now() + BOUND;
    while received.lock().unwrap().values().map(|n| u64::from(*n)).sum::<u64>() < sent
        && tierstack_base::time::instant_now() < until
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    done.store(true, Ordering::Release);
    for receiver in receivers {
        receiver.join().unwrap().unwrap();
    }
    let total: u64 = received.lock().unwrap().values().map(|n| u64::from(*n)).sum();
    assert_eq!(total, sent, "every acknowledged message arrived, once");
    assert_eq!(region.memory().load_u64(COUNTER).unwrap(), fetch_adds, "the counter equals the fetch-adds");
    eprintln!("ucx stress over {tls}: {sent} messages and {fetch_adds} fetch-adds checked");
}

#[test]
fn stress_messages_and_ops_over_shm() {
    stress(common::SHM);
}

#[test]
fn stress_messages_and_ops_over_tcp() {
    stress(common::TCP);
}

// ------------------------------------------------------------------ one-sidedness

/// Each op kind's outcome against a SIGSTOPped owner: `true` if it completed.
fn ops_against_a_stopped_owner(tls: &str) -> Vec<(&'static str, Result<(), FabricError>)> {
    let mut owner = spawn("owner", 0, tls, &[]);
    let addr: SocketAddr = owner.line_after("ready").parse().unwrap();
    let me = open_node(1, tls, &peers_env(&[(0, addr)]), Duration::from_millis(500));
    let region = me.connect(NodeId(0), "shared").unwrap();
    region.write(0, &5u64.to_ne_bytes()).unwrap();
    owner.stop();
    let outcomes = vec![
        ("read", region.read_u64(0).map(|v| assert_eq!(v, 5))),
        ("write", region.write(64, b"written while stopped")),
        ("fetch_add", region.fetch_add(0, 1).map(|v| assert!(v == 5 || v == 6))),
        ("compare_swap", region.compare_swap(8, 0, 1).map(drop)),
    ];
    drop(owner); // SIGCONT, close stdin, reap
    outcomes
}

#[test]
fn over_ucx_shared_memory_ops_complete_while_the_owner_is_stopped() {
    if !common::ucx_or_skip() {
        return;
    }
    for (op, outcome) in ops_against_a_stopped_owner(common::SHM) {
        eprintln!("ucx {}: {op} with the owner stopped: {outcome:?}", common::SHM);
        assert!(outcome.is_ok(), "{op} needed the stopped owner over UCX shared memory: {outcome:?}");
    }
}

#[test]
fn over_ucx_tcp_ops_need_the_owner_and_the_test_says_which() {
    if !common::ucx_or_skip() {
        return;
    }
    let outcomes = ops_against_a_stopped_owner(common::TCP);
    let mut needed = 0;
    for (op, outcome) in &outcomes {
        let verdict = match outcome {
            Ok(()) => "completed without the owner",
            Err(FabricError::Timeout { .. }) => {
                needed += 1;
                "needed the owner (timed out)"
            }
            Err(_) => "failed otherwise",
        };
        eprintln!("ucx {}: {op} with the owner stopped: {verdict} ({outcome:?})", common::TCP);
        assert!(matches!(outcome, Ok(()) | Err(FabricError::Timeout { .. })), "{op}: {outcome:?}");
    }
    assert!(needed > 0, "over UCX's TCP transport no operation needed the owner: {outcomes:?}");
}
