//! The security boundary of the tcp backend: with a cluster key every
//! connection is mutually authenticated and every frame sealed; regions
//! refuse what their access rights do not allow; the accept path bounds
//! connections that never finish a handshake.

use crate::common::{self, Proxy, RawClient};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Access, Fabric, FabricError, Op, Rights};
use tierstack_fabric_tcp::{ClusterKey, TcpConfig, TcpFabric};
use tierstack_testkit::nodes::tcp::{keyed_cluster, keyed_node};
use tierstack_testkit::{channels, transfers};

const TIMEOUT: Duration = Duration::from_secs(5);
const SHORT: Duration = Duration::from_millis(300);

fn key(digit: u8) -> ClusterKey {
    ClusterKey::parse(&[digit; 64]).unwrap()
}

#[test]
fn a_keyed_cluster_passes_the_transfer_and_channel_suites() {
    let nodes = keyed_cluster(0, 2, TIMEOUT, &key(b'1'));
    transfers::round_trips_match_plain_reads_and_writes(nodes[0].as_ref(), nodes[1].as_ref());
    transfers::large_transfers_round_trip(nodes[0].as_ref(), nodes[1].as_ref());
    transfers::bounds_errors_are_typed_and_execute_nothing(nodes[0].as_ref(), nodes[1].as_ref());
    channels::messages_stay_on_their_channel(nodes[0].clone(), nodes[1].clone());
}

#[test]
fn a_peer_with_a_wrong_key_is_refused_both_ways() {
    let (a, b) = (keyed_node(0, TIMEOUT, &key(b'1')), keyed_node(1, TIMEOUT, &key(b'2')));
    a.add_peer(NodeId(1), b.local_addr());
    b.add_peer(NodeId(0), a.local_addr());
    let region = a.register("r", 64, Access::all()).unwrap();
    b.register("r", 64, Access::all()).unwrap();
    match b.connect(NodeId(0), "r") {
        Err(FabricError::Unauthenticated { node: NodeId(0), reason }) => {
            assert!(reason.contains("key"), "{reason}")
        }
        other => panic!("a node with another key reached the region: {:?}", other.map(|r| r.len())),
    }
    assert!(matches!(a.connect(NodeId(1), "r"), Err(FabricError::Unauthenticated { .. })));
    assert!(matches!(
        b.send(NodeId(0), tierstack_fabric::Channel::TEST, b"hi"),
        Err(FabricError::Unauthenticated { .. })
    ));
    assert!(a.inbox(tierstack_fabric::Channel::TEST).try_recv().is_none(), "a message crossed without the key");
    assert_eq!(region.memory().load_u64(0).unwrap(), 0);
}

#[test]
fn a_peer_without_a_key_is_refused_and_its_connection_closed() {
    let owner = keyed_node(0, TIMEOUT, &key(b'1'));
    let region = owner.register("r", 64, Access::all()).unwrap();
    let keyless = common::node(1, SHORT);
    keyless.add_peer(NodeId(0), owner.local_addr());
    assert!(keyless.connect(NodeId(0), "r").is_err());
    // On the wire: a plain hello is answered by closing the connection.
    let mut raw = RawClient::hello(owner.local_addr(), NodeId(1));
    assert!(raw.closed_by_server(), "a keyless hello was kept open");
    // And a keyed peer meets a keyless node's refusal the same way.
    let keyed = keyed_node(2, SHORT, &key(b'1'));
    keyed.add_peer(NodeId(1), keyless.local_addr());
    keyless.register("k", 8, Access::all()).unwrap();
    assert!(matches!(keyed.connect(NodeId(1), "k"), Err(FabricError::Unauthenticated { .. })));
    assert_eq!(region.memory().load_u64(0).unwrap(), 0);
}

/// A man in the middle rewrites the node id in the connector's hello: the
/// acceptor's proof then covers another transcript and the connector
/// refuses it. The next connection, untouched, succeeds.
#[test]
fn a_rewritten_node_id_fails_the_handshake() {
    let k = key(b'3');
    let owner = keyed_node(0, TIMEOUT, &k);
    owner.register("r", 64, Access::all()).unwrap();
    let proxy = Proxy::start(owner.local_addr());
    let client = TcpFabric::open(
        TcpConfig::new(NodeId(1), common::loopback())
            .with_op_timeout(TIMEOUT)
            .with_key(&k)
            .with_peer(NodeId(0), proxy.addr),
    )
    .unwrap();
    // len (4) | kind (1) | magic (4) | version (2) | node (4): node's low byte is at 11.
    proxy.tamper_next(11);
    match client.connect(NodeId(0), "r") {
        Err(FabricError::Unauthenticated { reason, .. }) => assert!(reason.contains("proof"), "{reason}"),
        other => panic!("a rewritten hello passed: {:?}", other.map(|r| r.len())),
    }
    assert!(client.connect(NodeId(0), "r").is_ok(), "the untouched handshake must pass");
}

/// A byte of a write altered between the nodes: the owner's tag check
/// fails, it closes the connection, and nothing is written.
#[test]
fn a_frame_altered_in_flight_is_refused_and_changes_nothing() {
    let k = key(b'4');
    let owner = keyed_node(0, TIMEOUT, &k);
    let region = owner.register("r", 64, Access::all()).unwrap();
    let proxy = Proxy::start(owner.local_addr());
    let client = TcpFabric::open(
        TcpConfig::new(NodeId(1), common::loopback())
            .with_op_timeout(TIMEOUT)
            .with_key(&k)
            .with_peer(NodeId(0), proxy.addr),
    )
    .unwrap();
    let remote = client.connect(NodeId(0), "r").unwrap();
    // Byte 50 of the Ops frame lies in the write's data (header: 4 + 1 + 8 + 4 + 8 + 4, op: 1 + 8 + 4).
    proxy.tamper_next(50);
    let error = remote.write(0, &[0xab; 64]).unwrap_err();
    assert!(error.is_unreachable(), "{error}");
    assert_eq!(transfers::contents(region.memory()), vec![0u8; 64], "an altered frame was executed");
    // The link recovers on a fresh connection, and the same write lands.
    remote.write(0, &[0xab; 64]).unwrap();
    assert_eq!(transfers::contents(region.memory()), vec![0xab; 64]);
}

#[test]
fn an_op_the_region_does_not_allow_is_forbidden_and_executes_nothing() {
    let nodes = keyed_cluster(0, 3, TIMEOUT, &key(b'5'));
    // A version table: peers read it; node 2 (an application node) may update it.
    let table = nodes[0].register("vt", 64, Access::read_only().grant(NodeId(2), Rights::ALL)).unwrap();
    table.memory().store_u64(0, 7).unwrap();
    let proxy_side = nodes[1].connect(NodeId(0), "vt").unwrap();
    assert_eq!(proxy_side.read_u64(0).unwrap(), 7, "reads are allowed");
    let forbidden = |result: Result<u64, FabricError>, region: &str, needed: Rights, granted: Rights| match result {
        Err(FabricError::Forbidden { node: NodeId(1), region: r, needed: n, granted: g }) => {
            assert_eq!((r.as_str(), n, g), (region, needed, granted))
        }
        other => panic!("expected Forbidden({needed}), got {other:?}"),
    };
    forbidden(proxy_side.write(0, &99u64.to_ne_bytes()).map(|()| 0), "vt", Rights::WRITE, Rights::READ);
    forbidden(proxy_side.fetch_add(0, 1), "vt", Rights::ATOMIC, Rights::READ);
    forbidden(proxy_side.compare_swap(0, 7, 8), "vt", Rights::ATOMIC, Rights::READ);
    // A batch with one forbidden op executes none of it.
    let batch = vec![Op::FetchAdd { offset: 8, delta: 1 }, Op::Read { offset: 0, len: 8 }];
    assert!(matches!(proxy_side.post(batch).wait(), Err(FabricError::Forbidden { .. })));
    assert_eq!((table.memory().load_u64(0).unwrap(), table.memory().load_u64(8).unwrap()), (7, 0));
    // The granted node may update it.
    let app_side = nodes[2].connect(NodeId(0), "vt").unwrap();
    assert_eq!(app_side.fetch_add(0, 1).unwrap(), 7);
    assert_eq!(table.memory().load_u64(0).unwrap(), 8);
    // Lock words: atomics and reads, never plain writes.
    let locks = nodes[0].register("locks", 64, Access::new(Rights::READ_ATOMIC)).unwrap();
    let lock_side = nodes[1].connect(NodeId(0), "locks").unwrap();
    assert_eq!(lock_side.compare_swap(0, 0, 5).unwrap(), 0);
    forbidden(lock_side.write(0, &[0; 8]).map(|()| 0), "locks", Rights::WRITE, Rights::READ_ATOMIC);
    assert_eq!(locks.memory().load_u64(0).unwrap(), 5);
}

#[test]
fn a_silent_connection_is_closed_at_the_handshake_deadline() {
    let owner = keyed_node(0, SHORT, &key(b'6'));
    let mut silent = RawClient::connect(owner.local_addr());
    assert!(silent.closed_by_server(), "a connection that never said hello was kept past the deadline");
}

/// 1,100 idle sockets (more than the 1,024 connections a node serves)
/// do not keep a real peer out: each new connection evicts the oldest one
/// still handshaking, and the peer's handshake takes one round trip.
#[test]
fn idle_sockets_do_not_lock_real_peers_out() {
    let k = key(b'7');
    // A long deadline: the idlers are not reaped by time during the test.
    let owner = keyed_node(0, Duration::from_secs(30), &k);
    let region = owner.register("r", 8, Access::all()).unwrap();
    let idlers: Vec<std::net::TcpStream> =
        (0..1100).map(|_| std::net::TcpStream::connect(owner.local_addr()).unwrap()).collect();
    let peer = keyed_node(1, TIMEOUT, &k);
    peer.add_peer(NodeId(0), owner.local_addr());
    let remote = peer.connect(NodeId(0), "r").unwrap();
    remote.write(0, &5u64.to_ne_bytes()).unwrap();
    assert_eq!(region.memory().load_u64(0).unwrap(), 5);
    drop(idlers);
}

#[test]
fn a_keyless_node_refuses_to_listen_beyond_loopback() {
    let config = TcpConfig::new(NodeId(0), "0.0.0.0:0".parse().unwrap());
    match TcpFabric::open(config) {
        Err(FabricError::Unauthenticated { reason, .. }) => assert!(reason.contains("cluster key"), "{reason}"),
        other => panic!("a keyless node listened on every interface: {:?}", other.map(|f| f.local_addr())),
    }
    let keyed = TcpFabric::open(TcpConfig::new(NodeId(0), "0.0.0.0:0".parse().unwrap()).with_key(&key(b'8')));
    assert!(keyed.is_ok());
    let _: Arc<TcpFabric> = keyed.unwrap();
}

/// The shared access-rights scenarios (`tierstack_testkit::rights`), on a keyed cluster.
mod rights_suite {
    use super::*;
    use tierstack_testkit::rights as suite;

    fn three() -> Vec<Arc<TcpFabric>> {
        keyed_cluster(0, 3, TIMEOUT, &key(b'9'))
    }

    #[test]
    fn a_read_only_region_refuses_a_peers_writes_and_atomics() {
        let nodes = three();
        suite::a_read_only_region_refuses_a_peers_writes_and_atomics(nodes[0].as_ref(), nodes[1].as_ref());
    }

    #[test]
    fn a_grant_allows_its_node_only() {
        let nodes = three();
        suite::a_grant_allows_its_node_only(nodes[0].as_ref(), nodes[2].as_ref(), nodes[1].as_ref());
    }

    #[test]
    fn rights_are_granted_separately() {
        let nodes = three();
        suite::rights_are_granted_separately(nodes[0].as_ref(), nodes[1].as_ref());
    }

    /// As on shm: the owner's own handle to its region has every right.
    #[test]
    fn the_owner_may_do_everything_through_its_own_handle() {
        let nodes = three();
        let region = nodes[0].register("own", 8, Access::read_only()).unwrap();
        let own = nodes[0].connect(NodeId(0), "own").unwrap();
        assert_eq!(own.fetch_add(0, 3).unwrap(), 0);
        assert_eq!(region.memory().load_u64(0).unwrap(), 3);
    }
}

/// Connections inside TLS (`TcpConfig::with_tls`): encrypted as well as
/// authenticated, the key's handshake bound to the TLS session.
mod tls {
    use super::*;
    use tierstack_testkit::nodes::tcp::tls_cluster;

    fn through_proxy(k: &ClusterKey, tls: bool) -> (Arc<TcpFabric>, Arc<TcpFabric>, Proxy) {
        let owner = TcpConfig::new(NodeId(0), common::loopback()).with_op_timeout(TIMEOUT).with_key(k);
        let owner = TcpFabric::open(if tls { owner.with_tls() } else { owner }).unwrap();
        let proxy = Proxy::start(owner.local_addr());
        let client = TcpConfig::new(NodeId(1), common::loopback())
            .with_op_timeout(TIMEOUT)
            .with_key(k)
            .with_peer(NodeId(0), proxy.addr);
        let client = TcpFabric::open(if tls { client.with_tls() } else { client }).unwrap();
        (owner, client, proxy)
    }

    #[test]
    fn a_tls_cluster_passes_the_transfer_and_channel_suites() {
        let nodes = tls_cluster(0, 3, TIMEOUT, &key(b'a'));
        transfers::round_trips_match_plain_reads_and_writes(nodes[0].as_ref(), nodes[1].as_ref());
        transfers::large_transfers_round_trip(nodes[0].as_ref(), nodes[1].as_ref());
        transfers::bounds_errors_are_typed_and_execute_nothing(nodes[0].as_ref(), nodes[1].as_ref());
        channels::messages_stay_on_their_channel(nodes[0].clone(), nodes[1].clone());
        let senders: Vec<Arc<dyn Fabric>> = nodes[1..].iter().map(|n| n.clone() as Arc<dyn Fabric>).collect();
        channels::per_sender_order_holds_per_channel(senders, nodes[0].clone());
    }

    /// A write's bytes are visible on the wire of a keyed connection (sealed,
    /// not encrypted) and invisible inside TLS.
    #[test]
    fn inside_tls_the_bytes_on_the_wire_are_not_the_data() {
        let secret = b"a price nobody on the wire may read, sixty-four bytes long......";
        for (tls, visible) in [(false, true), (true, false)] {
            let (owner, client, proxy) = through_proxy(&key(b'b'), tls);
            let region = owner.register("r", 64, Access::all()).unwrap();
            client.connect(NodeId(0), "r").unwrap().write(0, secret).unwrap();
            assert_eq!(transfers::contents(region.memory()), secret.to_vec());
            let wire = proxy.captured();
            let seen = wire.windows(secret.len()).any(|w| w == secret);
            assert_eq!(seen, visible, "tls {tls}: the data was {} on the wire", if seen { "seen" } else { "not seen" });
        }
    }

    #[test]
    fn a_byte_altered_inside_tls_closes_the_connection_and_changes_nothing() {
        let (owner, client, proxy) = through_proxy(&key(b'c'), true);
        let region = owner.register("r", 64, Access::all()).unwrap();
        let remote = client.connect(NodeId(0), "r").unwrap();
        proxy.tamper_next(40);
        assert!(remote.write(0, &[0xab; 64]).unwrap_err().is_unreachable());
        assert_eq!(transfers::contents(region.memory()), vec![0u8; 64]);
        remote.write(0, &[0xab; 64]).unwrap();
        assert_eq!(transfers::contents(region.memory()), vec![0xab; 64]);
    }

    #[test]
    fn tls_and_plain_nodes_refuse_each_other_and_tls_needs_the_key() {
        let k = key(b'd');
        let tls_node = TcpFabric::open(TcpConfig::new(NodeId(0), common::loopback()).with_key(&k).with_tls()).unwrap();
        let plain_node = keyed_node(1, SHORT, &k);
        tls_node.register("r", 8, Access::all()).unwrap();
        plain_node.register("r", 8, Access::all()).unwrap();
        plain_node.add_peer(NodeId(0), tls_node.local_addr());
        tls_node.add_peer(NodeId(1), plain_node.local_addr());
        assert!(plain_node.connect(NodeId(0), "r").is_err(), "a peer outside TLS reached a TLS node");
        assert!(tls_node.connect(NodeId(1), "r").is_err(), "a TLS node reached a peer outside TLS");
        let keyless = TcpFabric::open(TcpConfig::new(NodeId(2), common::loopback()).with_tls());
        assert!(matches!(keyless, Err(FabricError::Unauthenticated { .. })));
    }
}
