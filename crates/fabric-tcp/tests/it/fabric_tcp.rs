//! The tcp backend end to end, with threads standing in for nodes: every
//! operation, every error path, timeouts, dead and returning peers, message
//! order, contention, and hostile clients.

use crate::common;

use common::{black_hole, cluster, node, Proxy, RawClient};
use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;
use tierstack_base::limits::{BATCH_OPS_MAX, REGIONS_PER_NODE_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, Op, OpResult, RemoteRegion};
use tierstack_fabric_tcp::{TcpConfig, TcpFabric};
use tierstack_fabric_wire::Frame;

const TIMEOUT: Duration = Duration::from_secs(5);
/// For the tests that wait for a timeout on purpose.
const SHORT_TIMEOUT: Duration = Duration::from_millis(200);
const RECV: Duration = Duration::from_secs(10);

#[test]
fn every_operation_round_trips_and_the_owner_sees_it() {
    let nodes = cluster(0, 2, TIMEOUT);
    let (a, b) = (&nodes[0], &nodes[1]);
    let local = b.register("data", 60, tierstack_fabric::Access::all()).unwrap();
    assert_eq!(local.len(), 64, "rounded up to a multiple of 8");
    let remote = a.connect(NodeId(1), "data").unwrap();
    assert_eq!((remote.node(), remote.name(), remote.len()), (NodeId(1), "data", 64));

    remote.write(3, b"hello, tcp").unwrap();
    let mut buf = [0u8; 10];
    local.memory().read(3, &mut buf).unwrap();
    assert_eq!(&buf, b"hello, tcp", "the write reached the owner's memory");
    let mut back = [0u8; 10];
    remote.read(3, &mut back).unwrap();
    assert_eq!(&back, b"hello, tcp");

    local.memory().store_u64(16, 40).unwrap();
    assert_eq!(remote.read_u64(16).unwrap(), 40);
    assert_eq!(remote.fetch_add(16, 2).unwrap(), 40, "fetch_add returns the previous value");
    assert_eq!(local.memory().load_u64(16).unwrap(), 42);
    assert_eq!(remote.fetch_add(16, u64::MAX).unwrap(), 42, "wrapping add of -1");
    assert_eq!(local.memory().load_u64(16).unwrap(), 41);
    assert_eq!(remote.compare_swap(16, 7, 100).unwrap(), 41, "a failed CAS returns the current value");
    assert_eq!(local.memory().load_u64(16).unwrap(), 41, "and changes nothing");
    assert_eq!(remote.compare_swap(16, 41, 100).unwrap(), 41);
    assert_eq!(local.memory().load_u64(16).unwrap(), 100);
}

#[test]
fn a_batch_returns_its_results_in_order() {
    let nodes = cluster(0, 2, TIMEOUT);
    let local = nodes[1].register("batch", 64, tierstack_fabric::Access::all()).unwrap();
    let remote = nodes[0].connect(NodeId(1), "batch").unwrap();
    let ops = vec![
        Op::Write { offset: 0, data: 5u64.to_ne_bytes().to_vec() },
        Op::FetchAdd { offset: 0, delta: 3 },
        Op::CompareSwap { offset: 0, expected: 5, new: 0 },
        Op::CompareSwap { offset: 0, expected: 8, new: 9 },
        Op::Read { offset: 0, len: 8 },
        Op::Write { offset: 33, data: vec![1, 2, 3] },
        Op::Read { offset: 32, len: 5 },
    ];
    let results = remote.post(ops).wait().unwrap();
    assert_eq!(
        results,
        vec![
            OpResult::Written,
            OpResult::FetchAdd(5),
            OpResult::CompareSwap(8),
            OpResult::CompareSwap(8),
            OpResult::Read(9u64.to_ne_bytes().to_vec()),
            OpResult::Written,
            OpResult::Read(vec![0, 1, 2, 3, 0]),
        ],
        "ops execute in order and each result sits at its op's position"
    );
    assert_eq!(local.memory().load_u64(0).unwrap(), 9);
}

#[test]
fn invalid_batches_fail_whole_before_anything_executes() {
    let nodes = cluster(0, 2, TIMEOUT);
    let local = nodes[1].register("guarded", 32, tierstack_fabric::Access::all()).unwrap();
    let remote = nodes[0].connect(NodeId(1), "guarded").unwrap();
    let write_then_bad = |bad: Op| vec![Op::Write { offset: 0, data: vec![7; 8] }, bad];

    let err = remote.post(write_then_bad(Op::Read { offset: 30, len: 4 })).wait().unwrap_err();
    assert_eq!(err, FabricError::OutOfBounds { region: "guarded".into(), offset: 30, len: 4, region_len: 32 });
    let err = remote.post(write_then_bad(Op::Read { offset: u64::MAX, len: 2 })).wait().unwrap_err();
    assert!(matches!(err, FabricError::OutOfBounds { .. }), "offset overflow is out of bounds: {err:?}");
    let err = remote.post(write_then_bad(Op::FetchAdd { offset: 4, delta: 1 })).wait().unwrap_err();
    assert_eq!(err, FabricError::Misaligned { offset: 4 });
    let err = remote.post(write_then_bad(Op::CompareSwap { offset: 9, expected: 0, new: 1 })).wait().unwrap_err();
    assert_eq!(err, FabricError::Misaligned { offset: 9 });
    assert_eq!(remote.read_u64(3), Err(FabricError::Misaligned { offset: 3 }));
    assert_eq!(local.memory().load_u64(0).unwrap(), 0, "no op of a rejected batch executed");

    assert_eq!(remote.post(vec![]).wait(), Err(FabricError::BatchSize { ops: 0, max: BATCH_OPS_MAX }));
    let too_many = vec![Op::Read { offset: 0, len: 1 }; BATCH_OPS_MAX + 1];
    assert_eq!(
        remote.post(too_many).wait(),
        Err(FabricError::BatchSize { ops: BATCH_OPS_MAX + 1, max: BATCH_OPS_MAX })
    );
    let mut huge = vec![0u8; TRANSFER_BYTES_MAX + 1];
    assert_eq!(remote.read(0, &mut huge), Err(FabricError::TransferTooLarge { len: TRANSFER_BYTES_MAX + 1 }));

    // The handle still works after all those refusals.
    assert_eq!(remote.fetch_add(8, 1).unwrap(), 0);
}

#[test]
fn the_responder_validates_on_its_own() {
    // A raw client skips the handle's local checks: the owner must refuse too.
    let owner = node(1, TIMEOUT);
    let local = owner.register("r", 16, tierstack_fabric::Access::all()).unwrap();
    let mut raw = RawClient::hello(owner.local_addr(), NodeId(7));
    let Frame::LookupOk { request: 1, region, incarnation, len: 16 } =
        raw.call(&Frame::Lookup { request: 1, name: "r".into() })
    else {
        panic!("lookup failed")
    };
    let ops = |request, ops| Frame::Ops { request, region, incarnation, ops };
    let gone = |region: u32, incarnation: u64| FabricError::PeerDead {
        node: NodeId(1),
        reason: format!("region #{region} of incarnation {incarnation:#018x} is gone (the owner restarted)"),
    };
    let cases = [
        (
            ops(2, vec![Op::Read { offset: 12, len: 8 }]),
            FabricError::OutOfBounds { region: "r".into(), offset: 12, len: 8, region_len: 16 },
        ),
        (
            ops(3, vec![Op::Write { offset: 0, data: vec![1; 8] }, Op::FetchAdd { offset: 4, delta: 1 }]),
            FabricError::Misaligned { offset: 4 },
        ),
        (ops(4, vec![]), FabricError::BatchSize { ops: 0, max: BATCH_OPS_MAX }),
        (
            Frame::Ops { request: 5, region: region + 1, incarnation, ops: vec![Op::Read { offset: 0, len: 8 }] },
            gone(region + 1, incarnation),
        ),
        (
            // The right index with another incarnation: a handle from before a restart.
            Frame::Ops {
                request: 7,
                region,
                incarnation: incarnation.wrapping_add(1),
                ops: vec![Op::Write { offset: 0, data: vec![1; 8] }],
            },
            gone(region, incarnation.wrapping_add(1)),
        ),
        (
            Frame::Lookup { request: 6, name: "missing".into() },
            FabricError::UnknownRegion { node: NodeId(1), name: "missing".into() },
        ),
    ];
    for (request, expected) in cases {
        match raw.call(&request) {
            Frame::Error { error, .. } => assert_eq!(error, expected),
            other => panic!("expected an error for {request:?}, got {other:?}"),
        }
    }
    assert_eq!(local.memory().load_u64(0).unwrap(), 0, "the misaligned batch's write did not execute");
    // Pipelined requests are answered by id.
    raw.send(&ops(10, vec![Op::FetchAdd { offset: 8, delta: 5 }]));
    raw.send(&ops(11, vec![Op::FetchAdd { offset: 8, delta: 5 }]));
    assert_eq!(raw.recv(), Frame::OpsOk { request: 10, results: vec![OpResult::FetchAdd(0)] });
    assert_eq!(raw.recv(), Frame::OpsOk { request: 11, results: vec![OpResult::FetchAdd(5)] });
}

#[test]
fn unknown_regions_nodes_and_bad_names_are_typed_errors() {
    let nodes = cluster(0, 2, TIMEOUT);
    let (a, b) = (&nodes[0], &nodes[1]);
    b.register("present", 8, tierstack_fabric::Access::all()).unwrap();
    assert_eq!(
        a.connect(NodeId(1), "absent").err(),
        Some(FabricError::UnknownRegion { node: NodeId(1), name: "absent".into() })
    );
    assert_eq!(a.connect(NodeId(9), "present").err(), Some(FabricError::UnknownNode { node: NodeId(9) }));
    assert_eq!(a.send(NodeId(9), Channel::TEST, b"x"), Err(FabricError::UnknownNode { node: NodeId(9) }));
    assert!(matches!(a.connect(NodeId(1), "bad/name"), Err(FabricError::InvalidName { .. })));
    assert!(matches!(a.connect(NodeId(1), ""), Err(FabricError::InvalidName { .. })));
    assert!(a.connect(NodeId(1), "present").is_ok(), "the connection survived the errors");
}

#[test]
fn registration_rules() {
    let fabric = node(0, TIMEOUT);
    assert_eq!(fabric.backend_name(), "tcp");
    assert_eq!(fabric.local_node(), NodeId(0));
    fabric.register("r", 8, tierstack_fabric::Access::all()).unwrap();
    assert_eq!(
        fabric.register("r", 8, tierstack_fabric::Access::all()).err(),
        Some(FabricError::RegionExists { name: "r".into() })
    );
    assert!(matches!(
        fabric.register(".hidden", 8, tierstack_fabric::Access::all()),
        Err(FabricError::InvalidName { .. })
    ));
    assert!(matches!(fabric.register("zero", 0, tierstack_fabric::Access::all()), Err(FabricError::RegionSize { .. })));
    for i in 1..REGIONS_PER_NODE_MAX {
        fabric.register(&format!("r{i}"), 8, tierstack_fabric::Access::all()).unwrap();
    }
    assert_eq!(
        fabric.register("one-too-many", 8, tierstack_fabric::Access::all()).err(),
        Some(FabricError::TooManyRegions { max: REGIONS_PER_NODE_MAX })
    );
    // The last registered region is reachable by its index.
    let remote = fabric.connect(NodeId(0), &format!("r{}", REGIONS_PER_NODE_MAX - 1)).unwrap();
    assert_eq!(remote.fetch_add(0, 1).unwrap(), 0);
}

#[test]
fn a_node_reaches_its_own_regions_through_its_socket() {
    let fabric = node(3, TIMEOUT);
    let local = fabric.register("mine", 16, tierstack_fabric::Access::all()).unwrap();
    let remote = fabric.connect(NodeId(3), "mine").unwrap();
    assert_eq!(remote.fetch_add(8, 11).unwrap(), 0);
    assert_eq!(local.memory().load_u64(8).unwrap(), 11);
    fabric.send(NodeId(3), Channel::TEST, b"note to self").unwrap();
    let message = fabric.inbox(Channel::TEST).recv_timeout(RECV).unwrap();
    assert_eq!((message.from, message.payload.as_slice()), (NodeId(3), b"note to self".as_slice()));
}

#[test]
fn an_unresponsive_owner_times_out() {
    let hole = black_hole();
    let client = node(0, SHORT_TIMEOUT);
    client.add_peer(NodeId(5), hole.local_addr().unwrap());
    let err = client.connect(NodeId(5), "anything").err();
    assert_eq!(err, Some(FabricError::Timeout { node: NodeId(5), timeout_ms: 200 }));
    assert!(err.is_some_and(|e| e.is_unreachable()));
}

#[test]
fn a_stalled_request_times_out_and_its_late_answer_is_dropped() {
    let owner = node(1, TIMEOUT);
    let local = owner.register("counter", 8, tierstack_fabric::Access::all()).unwrap();
    let proxy = Proxy::start(owner.local_addr());
    let client = TcpFabric::open(
        TcpConfig::new(NodeId(0), common::loopback()).with_op_timeout(SHORT_TIMEOUT).with_peer(NodeId(1), proxy.addr),
    )
    .unwrap();
    let remote = client.connect(NodeId(1), "counter").unwrap();
    assert_eq!(remote.fetch_add(0, 1).unwrap(), 0);

    proxy.freeze();
    assert_eq!(remote.fetch_add(0, 1), Err(FabricError::Timeout { node: NodeId(1), timeout_ms: 200 }));
    let also_stalled = remote.post(vec![Op::Read { offset: 0, len: 8 }]);
    assert_eq!(also_stalled.wait(), Err(FabricError::Timeout { node: NodeId(1), timeout_ms: 200 }));
    proxy.thaw();

    // The stalled add still executed at the owner (a timeout says nothing
    // about execution); its late answer must not be taken for this one's.
    assert_eq!(remote.fetch_add(0, 1).unwrap(), 2);
    assert_eq!(local.memory().load_u64(0).unwrap(), 3);
}

#[test]
fn a_broken_connection_fails_pending_requests_with_peer_dead_and_reconnects() {
    let owner = node(1, TIMEOUT);
    let local = owner.register("counter", 8, tierstack_fabric::Access::all()).unwrap();
    let proxy = Proxy::start(owner.local_addr());
    let client =
        TcpFabric::open(TcpConfig::new(NodeId(0), common::loopback()).with_peer(NodeId(1), proxy.addr)).unwrap();
    let remote = client.connect(NodeId(1), "counter").unwrap();
    assert_eq!(remote.fetch_add(0, 1).unwrap(), 0);

    // The requests reach the owner and execute; their answers are held.
    proxy.freeze_answers();
    let pending: Vec<_> = (0..3).map(|_| remote.post(vec![Op::FetchAdd { offset: 0, delta: 10 }])).collect();
    let deadline = tierstack_base::time::instant_now() + RECV;
    while local.memory().load_u64(0).unwrap() < 31 && tierstack_base::time::instant_now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(local.memory().load_u64(0).unwrap(), 31, "all three were written and executed");
    proxy.sever();
    for completion in pending {
        // Their answers can never come: the connection they were written on broke.
        let err = completion.wait().unwrap_err();
        assert!(matches!(err, FabricError::PeerDead { node: NodeId(1), .. }), "{err:?}");
    }
    // The next use dials a new connection through the proxy.
    assert_eq!(remote.fetch_add(0, 1).unwrap(), 31);
    assert_eq!(local.memory().load_u64(0).unwrap(), 32);
}

#[test]
fn a_dead_peer_is_peer_dead_and_a_restarted_one_only_through_a_fresh_connect() {
    let client = node(0, TIMEOUT);
    let owner = node(1, TIMEOUT);
    let addr = owner.local_addr();
    client.add_peer(NodeId(1), addr);
    let first = owner.register("r", 8, tierstack_fabric::Access::all()).unwrap();
    let remote = client.connect(NodeId(1), "r").unwrap();
    assert_eq!(remote.fetch_add(0, 5).unwrap(), 0);
    assert_eq!(first.memory().load_u64(0).unwrap(), 5);
    client.send(NodeId(1), Channel::TEST, b"hello").unwrap();
    assert_eq!(owner.inbox(Channel::TEST).recv_timeout(RECV).unwrap().payload, b"hello");

    drop(first);
    drop(owner); // Its listener and connections close.
    for _ in 0..3 {
        let err = remote.fetch_add(0, 1).unwrap_err();
        assert!(matches!(err, FabricError::PeerDead { node: NodeId(1), .. }), "{err:?}");
        assert!(err.is_unreachable());
    }
    assert!(matches!(client.connect(NodeId(1), "r"), Err(FabricError::PeerDead { .. })));
    // The message connection of the dead owner is not written into unread.
    assert!(matches!(client.send(NodeId(1), Channel::TEST, b"anyone?"), Err(FabricError::PeerDead { .. })));

    // The owner comes back on the same address and node id with the same
    // region at the same index: a new incarnation, zeroed. A handle bound to
    // the old incarnation must never reach it (its lock words would be reset
    // under their holders), exactly as an shm handle to a revoked region.
    let owner = TcpFabric::open(TcpConfig::new(NodeId(1), addr)).unwrap();
    let second = owner.register("r", 8, tierstack_fabric::Access::all()).unwrap();
    second.memory().store_u64(0, 99).unwrap();
    for _ in 0..3 {
        let err = remote.fetch_add(0, 7).unwrap_err();
        assert!(matches!(err, FabricError::PeerDead { node: NodeId(1), .. }), "{err:?}");
        let err = remote.post(vec![Op::Read { offset: 0, len: 8 }]).wait().unwrap_err();
        assert!(matches!(err, FabricError::PeerDead { node: NodeId(1), .. }), "{err:?}");
    }
    assert_eq!(second.memory().load_u64(0).unwrap(), 99, "the old handle changed nothing in the new incarnation");

    // A fresh connect binds to the new incarnation.
    let fresh = client.connect(NodeId(1), "r").unwrap();
    assert_eq!(fresh.fetch_add(0, 1).unwrap(), 99);
    assert_eq!(second.memory().load_u64(0).unwrap(), 100);
    assert!(remote.fetch_add(0, 1).is_err(), "the old handle stays dead beside a live fresh one");
    client.send(NodeId(1), Channel::TEST, b"back").unwrap();
    assert_eq!(owner.inbox(Channel::TEST).recv_timeout(RECV).unwrap().payload, b"back");
}

#[test]
fn messages_arrive_in_order_per_pair() {
    const COUNT: u32 = 500;
    let nodes = cluster(0, 3, TIMEOUT);
    let senders: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|i| {
            let fabric = Arc::clone(&nodes[i]);
            std::thread::spawn(move || {
                for seq in 0..COUNT {
                    let mut payload = seq.to_le_bytes().to_vec();
                    payload.resize(4 + (seq as usize % 64), 0xab);
                    fabric.send(NodeId(1), Channel::TEST, &payload).unwrap();
                }
            })
        })
        .collect();
    let mut next = [0u32; 3];
    for _ in 0..2 * COUNT {
        let message = nodes[1].inbox(Channel::TEST).recv_timeout(RECV).unwrap();
        let seq = u32::from_le_bytes(message.payload[..4].try_into().unwrap());
        assert_eq!(message.payload.len(), 4 + (seq as usize % 64));
        let from = message.from.0 as usize;
        assert_eq!(seq, next[from], "messages from {} arrive in send order", message.from);
        next[from] += 1;
    }
    assert_eq!(next, [COUNT, 0, COUNT]);
    for sender in senders {
        sender.join().unwrap();
    }
    assert!(nodes[1].inbox(Channel::TEST).is_empty());
    assert_eq!(
        nodes[0].send(NodeId(1), Channel::TEST, &vec![0; TRANSFER_BYTES_MAX + 1]),
        Err(FabricError::TransferTooLarge { len: TRANSFER_BYTES_MAX + 1 })
    );
}

#[test]
fn concurrent_fetch_add_from_several_fabrics_is_exact() {
    const THREADS_PER_CLIENT: usize = 3;
    const ADDS: u64 = 300;
    let nodes = cluster(0, 3, TIMEOUT);
    let local = nodes[0].register("counter", 8, tierstack_fabric::Access::all()).unwrap();
    let workers: Vec<_> = nodes
        .iter()
        .flat_map(|fabric| (0..THREADS_PER_CLIENT).map(move |_| Arc::clone(fabric)))
        .map(|fabric| {
            std::thread::spawn(move || {
                let remote = fabric.connect(NodeId(0), "counter").unwrap();
                (0..ADDS).map(|_| remote.fetch_add(0, 1).unwrap()).collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut seen: Vec<u64> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let total = (nodes.len() * THREADS_PER_CLIENT) as u64 * ADDS;
    assert_eq!(local.memory().load_u64(0).unwrap(), total);
    seen.sort_unstable();
    assert_eq!(seen, (0..total).collect::<Vec<_>>(), "every previous value was handed out exactly once");
}

#[test]
fn compare_swap_contention_has_exactly_one_winner_per_round() {
    const ROUNDS: u64 = 60;
    const THREADS: usize = 4;
    let nodes = cluster(0, 3, TIMEOUT);
    let local = nodes[0].register("word", 8, tierstack_fabric::Access::all()).unwrap();
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let fabric = Arc::clone(&nodes[1 + t % 2]);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let remote = fabric.connect(NodeId(0), "word").unwrap();
                let mut wins = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    if remote.compare_swap(0, round, round + 1).unwrap() == round {
                        wins.push(round);
                    }
                    barrier.wait();
                }
                wins
            })
        })
        .collect();
    let mut wins: Vec<u64> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    wins.sort_unstable();
    assert_eq!(wins, (0..ROUNDS).collect::<Vec<_>>(), "one winner per round, never two");
    assert_eq!(local.memory().load_u64(0).unwrap(), ROUNDS);
}

#[test]
fn garbage_from_a_client_closes_only_that_connection() {
    let owner = node(1, TIMEOUT);
    let local = owner.register("r", 8, tierstack_fabric::Access::all()).unwrap();
    let client = node(0, TIMEOUT);
    client.add_peer(NodeId(1), owner.local_addr());
    let remote = client.connect(NodeId(1), "r").unwrap();

    let mut bad_hello = tierstack_fabric_wire::encode(&Frame::Hello { node: NodeId(9) });
    bad_hello[5] ^= 0xff; // corrupt the magic
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("oversized length", u32::MAX.to_le_bytes().to_vec()),
        ("empty frame", 0u32.to_le_bytes().to_vec()),
        ("bad magic", bad_hello),
        (
            "ops before hello",
            tierstack_fabric_wire::encode(&Frame::Ops { request: 1, region: 0, incarnation: 0, ops: vec![] }),
        ),
    ];
    for (what, bytes) in garbage {
        let mut raw = RawClient::connect(owner.local_addr());
        std::io::Write::write_all(&mut raw.stream, &bytes).unwrap();
        assert!(raw.closed_by_server(), "{what}: the owner closes the connection");
        assert!(remote.fetch_add(0, 1).is_ok(), "{what}: the owner still serves others");
    }

    let after_hello: Vec<(&str, Vec<u8>)> = vec![
        ("unknown kind", vec![1, 0, 0, 0, 99]),
        ("truncated body", vec![9, 0, 0, 0, 5, 1]),
        ("a second hello", tierstack_fabric_wire::encode(&Frame::Hello { node: NodeId(9) })),
        ("an answer frame", tierstack_fabric_wire::encode(&Frame::OpsOk { request: 1, results: vec![] })),
        ("trailing bytes", {
            let mut bytes = tierstack_fabric_wire::encode(&Frame::Lookup { request: 1, name: "r".into() });
            bytes[0] += 1;
            bytes.push(0);
            bytes
        }),
    ];
    for (what, bytes) in after_hello {
        let mut raw = RawClient::hello(owner.local_addr(), NodeId(9));
        std::io::Write::write_all(&mut raw.stream, &bytes).unwrap();
        if what == "truncated body" {
            raw.stream.shutdown(std::net::Shutdown::Write).unwrap();
        }
        assert!(raw.closed_by_server(), "{what}: the owner closes the connection");
        assert!(remote.fetch_add(0, 1).is_ok(), "{what}: the owner still serves others");
    }
    assert_eq!(local.memory().load_u64(0).unwrap(), 10);
    assert!(owner.inbox(Channel::TEST).is_empty(), "nothing from the garbage reached the inbox");
}

#[test]
fn shutdown_fails_everything_with_closed_and_stops_every_thread() {
    // A node id no other test uses, so its thread names are ours alone.
    const ID: u32 = 4093;
    let prefix = format!("tcp-{ID}-");
    let fabric = node(ID, TIMEOUT);
    let peer = node(ID - 1, TIMEOUT);
    fabric.add_peer(peer.local_node(), peer.local_addr());
    peer.add_peer(fabric.local_node(), fabric.local_addr());
    peer.register("p", 8, tierstack_fabric::Access::all()).unwrap();
    fabric.register("f", 8, tierstack_fabric::Access::all()).unwrap();
    let to_peer = fabric.connect(peer.local_node(), "p").unwrap();
    let to_self = fabric.connect(fabric.local_node(), "f").unwrap();
    let from_peer = peer.connect(fabric.local_node(), "f").unwrap();
    assert_eq!(to_peer.fetch_add(0, 1).unwrap(), 0);
    assert_eq!(to_self.fetch_add(0, 1).unwrap(), 0);
    assert_eq!(from_peer.fetch_add(0, 1).unwrap(), 1);
    assert!(threads_named_at_least(&prefix, 5), "listener, sweeper, readers and responders run");

    fabric.shutdown();
    assert!(no_threads_named(&prefix), "shutdown joined every thread");
    assert_eq!(to_peer.fetch_add(0, 1), Err(FabricError::Closed));
    assert_eq!(fabric.send(peer.local_node(), Channel::TEST, b"x"), Err(FabricError::Closed));
    assert_eq!(fabric.register("g", 8, tierstack_fabric::Access::all()).err(), Some(FabricError::Closed));
    let err = from_peer.fetch_add(0, 1).unwrap_err();
    assert!(err.is_unreachable(), "the peer sees a dead node: {err:?}");
    fabric.shutdown(); // idempotent
    drop(fabric);

    // Dropping a fabric shuts it down too.
    let dropped = node(ID, TIMEOUT);
    dropped.register("f", 8, tierstack_fabric::Access::all()).unwrap();
    dropped.connect(NodeId(ID), "f").unwrap().fetch_add(0, 1).unwrap();
    assert!(threads_named_at_least(&prefix, 4));
    drop(dropped);
    assert!(no_threads_named(&prefix), "drop joined every thread");
}

/// Waits (bounded) until at least `count` threads are named `prefix`...: a
/// new thread sets its own name when it first runs, which under load can be
/// a moment after `spawn` returns.
fn threads_named_at_least(prefix: &str, count: usize) -> bool {
    let deadline = tierstack_base::time::instant_now() + RECV;
    while tierstack_base::time::instant_now() < deadline {
        if threads_named(prefix) >= count {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

/// Waits (bounded) until no thread is named `prefix`...: a joined thread can
/// linger in /proc for a moment after `join` returns.
fn no_threads_named(prefix: &str) -> bool {
    let deadline = tierstack_base::time::instant_now() + RECV;
    while tierstack_base::time::instant_now() < deadline {
        if threads_named(prefix) == 0 {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// Threads of this process whose name starts with `prefix` (Linux only; 0 elsewhere).
fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn posted_batches_complete_asynchronously_and_out_of_order_waits_work() {
    let nodes = cluster(0, 2, TIMEOUT);
    nodes[1].register("r", 64, tierstack_fabric::Access::all()).unwrap();
    let remote: Arc<dyn RemoteRegion> = nodes[0].connect(NodeId(1), "r").unwrap();
    let completions: Vec<_> =
        (0..32u64).map(|i| remote.post(vec![Op::FetchAdd { offset: (i % 8) * 8, delta: 1 }])).collect();
    let mut previous: HashSet<(u64, u64)> = HashSet::new();
    for (i, completion) in completions.into_iter().enumerate().rev() {
        let value = completion.wait().unwrap().remove(0).into_u64().unwrap();
        assert!(previous.insert((i as u64 % 8, value)), "each word's previous values are distinct");
    }
    for word in 0..8 {
        assert_eq!(remote.read_u64(word * 8).unwrap(), 4);
    }
}

#[test]
fn a_misbehaving_owner_yields_typed_errors_not_panics() {
    use tierstack_fabric_wire::{read_frame, write_frame};
    let listener = std::net::TcpListener::bind(common::loopback()).unwrap();
    let addr = listener.local_addr().unwrap();
    let fake_owner = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let next = |stream: &mut std::net::TcpStream| read_frame(stream).unwrap().unwrap();
        assert_eq!(next(&mut stream), Frame::Hello { node: NodeId(0) });
        let Frame::Lookup { request, .. } = next(&mut stream) else { panic!("expected a lookup") };
        write_frame(&mut stream, &Frame::LookupOk { request, region: 0, incarnation: 1, len: 64 }).unwrap();
        // A read of 8 bytes answered with 3.
        let Frame::Ops { request, .. } = next(&mut stream) else { panic!("expected ops") };
        write_frame(&mut stream, &Frame::OpsOk { request, results: vec![OpResult::Read(vec![1, 2, 3])] }).unwrap();
        // A fetch_add answered with a lookup answer.
        let Frame::Ops { request, .. } = next(&mut stream) else { panic!("expected ops") };
        write_frame(&mut stream, &Frame::LookupOk { request, region: 0, incarnation: 1, len: 64 }).unwrap();
        // An answer to a request nobody made, then bytes that are no frame.
        let Frame::Ops { .. } = next(&mut stream) else { panic!("expected ops") };
        write_frame(&mut stream, &Frame::OpsOk { request: u64::MAX, results: vec![] }).unwrap();
        std::io::Write::write_all(&mut stream, &[1, 0, 0, 0, 99]).unwrap();
        // Hold the connection open: the client must close it on its own.
        let _ = read_frame(&mut stream);
    });
    let client = node(0, TIMEOUT);
    client.add_peer(NodeId(6), addr);
    let remote = client.connect(NodeId(6), "fake").unwrap();
    assert_eq!(remote.len(), 64);
    let err = remote.read_u64(0).unwrap_err();
    assert!(matches!(err, FabricError::Protocol { node: NodeId(6), .. }), "{err:?}");
    let err = remote.fetch_add(0, 1).unwrap_err();
    assert!(matches!(err, FabricError::Protocol { node: NodeId(6), .. }), "{err:?}");
    let err = remote.fetch_add(0, 1).unwrap_err();
    assert!(matches!(err, FabricError::PeerDead { node: NodeId(6), .. }), "garbage ends the connection: {err:?}");
    fake_owner.join().unwrap();
}

/// Posting never blocks the caller on network I/O: on a single-threaded async
/// runtime (a proxy's worker), posts to an owner that stopped reading return
/// at once, and posts to a healthy owner keep completing while it stays
/// stalled. The stall outlasts every bounded wait here (its op timeout is
/// longer), so the healthy completions can only come from a runtime that the
/// stalled owner does not hold.
#[test]
fn posting_to_a_stalled_owner_never_blocks_an_async_runtime() {
    /// Longer than any wait of this test: the stall never resolves by itself.
    const STALL_TIMEOUT: Duration = Duration::from_secs(120);
    /// More bytes than the socket buffers and the frozen proxy can absorb
    /// (at most a few tens of MiB on Linux), so a blocking writer must block.
    const STALLED_POSTS: usize = 4;
    const HEALTHY_POSTS: u64 = 20;
    let stalled_owner = node(1, STALL_TIMEOUT);
    stalled_owner.register("big", TRANSFER_BYTES_MAX as u64, tierstack_fabric::Access::all()).unwrap();
    let healthy_owner = node(2, STALL_TIMEOUT);
    let counter = healthy_owner.register("counter", 8, tierstack_fabric::Access::all()).unwrap();
    let proxy = Proxy::start(stalled_owner.local_addr());
    let client = TcpFabric::open(
        TcpConfig::new(NodeId(0), common::loopback())
            .with_op_timeout(STALL_TIMEOUT)
            .with_peer(NodeId(1), proxy.addr)
            .with_peer(NodeId(2), healthy_owner.local_addr()),
    )
    .unwrap();
    let stalled = client.connect(NodeId(1), "big").unwrap();
    let healthy = client.connect(NodeId(2), "counter").unwrap();
    proxy.freeze();

    #[derive(Debug, PartialEq)]
    enum Progress {
        StalledPosted,
        Healthy(u64),
    }
    let (progress_tx, progress_rx) = std::sync::mpsc::channel();
    let runtime_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let stalled_completions: Vec<_> = (0..STALLED_POSTS)
                .map(|_| stalled.post(vec![Op::Write { offset: 0, data: vec![7; TRANSFER_BYTES_MAX] }]))
                .collect();
            progress_tx.send(Progress::StalledPosted).unwrap();
            for i in 0..HEALTHY_POSTS {
                let previous = healthy.post(vec![Op::FetchAdd { offset: 0, delta: 1 }]).wait_async().await;
                assert_eq!(previous.unwrap(), vec![OpResult::FetchAdd(i)]);
                progress_tx.send(Progress::Healthy(i)).unwrap();
            }
            let mut outcomes = Vec::new();
            for completion in stalled_completions {
                outcomes.push(completion.wait_async().await);
            }
            outcomes
        })
    });
    // Bounded waits only so that a blocking `post` fails the test instead of hanging it.
    let bound = Duration::from_secs(20);
    assert_eq!(progress_rx.recv_timeout(bound), Ok(Progress::StalledPosted), "posts to the stalled owner returned");
    for i in 0..HEALTHY_POSTS {
        assert_eq!(progress_rx.recv_timeout(bound), Ok(Progress::Healthy(i)), "the healthy owner's posts completed");
    }
    assert_eq!(counter.memory().load_u64(0).unwrap(), HEALTHY_POSTS);
    // Release the stall: the stalled batches end, with results or a typed error.
    proxy.sever();
    for outcome in runtime_thread.join().unwrap() {
        assert!(
            outcome.as_ref().is_ok_and(|r| r == &[OpResult::Written])
                || outcome.as_ref().is_err_and(|e| e.is_unreachable()),
            "{outcome:?}"
        );
    }
}
