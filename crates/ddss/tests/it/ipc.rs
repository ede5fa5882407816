//! The node daemon (IPC management): clients share a node's substrate over
//! the control socket, and get and put on shared memory directly.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_ddss::ipc::{DdssClient, DdssDaemon, IPC_LINE_BYTES_MAX};
use tierstack_ddss::{Coherence, Ddss, DdssError, Placement};
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_testkit::ddss::small_config;

struct Site {
    root: tempfile::TempDir,
    daemons: Vec<Arc<Ddss>>,
}

/// Two shm nodes with started substrates under one root.
fn site() -> Site {
    let root = tempfile::tempdir().unwrap();
    let daemons = (0..2)
        .map(|id| {
            let fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(root.path(), NodeId(id))).unwrap();
            Arc::new(Ddss::start(fabric, small_config(2)).unwrap())
        })
        .collect();
    Site { root, daemons }
}

/// A client process's own data-path endpoint on the same shm root.
fn endpoint(site: &Site, id: u32) -> Arc<dyn Fabric> {
    ShmFabric::open(ShmConfig::new(site.root.path(), NodeId(id))).unwrap()
}

#[test]
fn processes_share_a_node_through_its_daemon() {
    let site = site();
    let socket = site.root.path().join("ddss-0.sock");
    let daemon = DdssDaemon::serve(site.daemons[0].clone(), &socket).unwrap();
    let mut alice = DdssClient::connect(&socket).unwrap();
    let mut bob = DdssClient::connect(&socket).unwrap();
    assert_eq!(alice.info().node, NodeId(0));
    assert_eq!(alice.info().backend, "shm");
    assert_eq!(alice.info().members, vec![NodeId(0), NodeId(1)]);

    // Control path: allocation by the daemon, on its node or elsewhere.
    let local = alice.allocate(40, Placement::Local, Coherence::Read).unwrap();
    let remote = alice.allocate(8, Placement::Node(NodeId(1)), Coherence::Strict).unwrap();
    assert_eq!((local.home(), remote.home()), (NodeId(0), NodeId(1)));

    // Data path: each process attaches its own endpoint and works one-sidedly.
    let alice_data = alice.attach_data_path(endpoint(&site, 100)).unwrap();
    let bob_data = bob.attach_data_path(endpoint(&site, 101)).unwrap();
    let daemon_puts_before = site.daemons[0].stats().puts;
    assert_eq!(alice_data.put(local, b"hello").unwrap(), 1);
    assert_eq!(bob_data.get(local).unwrap(), (1, b"hello".to_vec()));
    assert_eq!(bob_data.put(remote, b"strict").unwrap(), 1);
    assert_eq!(alice_data.get(remote).unwrap(), (1, b"strict".to_vec()));
    assert_eq!(site.daemons[0].stats().puts, daemon_puts_before, "the data path bypasses the daemon");

    // The proxied fallback sees the same values and versions.
    assert_eq!(bob.get(local).unwrap(), (1, b"hello".to_vec()));
    assert_eq!(bob.put(local, b"via daemon").unwrap(), 2);
    assert_eq!(alice_data.get(local).unwrap(), (2, b"via daemon".to_vec()));

    // A key freed by one process is refused to the others, on both paths.
    bob.free(local).unwrap();
    assert!(matches!(alice_data.get(local), Err(DdssError::KeyFreed { .. })));
    assert_eq!(alice.get(local), Err(DdssError::KeyFreed { key: local }));
    assert_eq!(alice.free(local), Err(DdssError::KeyFreed { key: local }));
    assert!(daemon.clients() >= 2);
    daemon.stop();
    assert!(!socket.exists(), "stopping removes the socket");
    assert!(matches!(alice.allocate(8, Placement::Local, Coherence::Null), Err(DdssError::Ipc(_))));
}

#[test]
fn daemon_errors_are_typed_and_bad_requests_fail_alone() {
    let site = site();
    let socket = site.root.path().join("ddss.sock");
    let _daemon = DdssDaemon::serve(site.daemons[0].clone(), &socket).unwrap();
    assert!(
        matches!(DdssDaemon::serve(site.daemons[0].clone(), &socket), Err(DdssError::Ipc(_))),
        "one daemon per socket"
    );

    let mut client = DdssClient::connect(&socket).unwrap();
    for _ in 0..16 {
        client.allocate(8, Placement::Local, Coherence::Null).unwrap();
    }
    // Fill the 64-byte class: the refusal comes back as a typed error.
    let mut small = 0;
    let full = loop {
        match client.allocate(64, Placement::Local, Coherence::Null) {
            Ok(_) => small += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(small, 8);
    assert_eq!(full, DdssError::RegionFull { node: NodeId(0), class_bytes: 64 });
    assert!(
        matches!(client.allocate(1 << 30, Placement::Local, Coherence::Null), Err(DdssError::Daemon { ref kind, .. }) if kind == "allocation_too_large")
    );
    assert!(
        matches!(client.allocate(8, Placement::Node(NodeId(5)), Coherence::Null), Err(DdssError::Daemon { ref kind, .. }) if kind == "not_member")
    );

    // Raw lines: malformed requests get answers and the connection stays.
    let stream = UnixStream::connect(&socket).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut exchange = |line: &str| -> String {
        writer.write_all(line.as_bytes()).unwrap();
        writer.write_all(b"\n").unwrap();
        let mut answer = String::new();
        reader.read_line(&mut answer).unwrap();
        answer
    };
    assert!(exchange("not json").contains(r#""error":"bad_request""#));
    assert!(exchange(r#"{"op":"teleport"}"#).contains("bad_request"));
    assert!(exchange(r#"{"op":"get","key":"zz"}"#).contains("bad_request"));
    assert!(exchange(r#"{"op":"allocate","bytes":8,"placement":"moon","coherence":"null"}"#).contains("bad_request"));
    let key = "000000000000014000000001000300000000000000000000";
    assert!(exchange(&format!(r#"{{"op":"put","key":"{key}","value":"xyz"}}"#)).contains("bad_request"));
    assert!(exchange(&format!(r#"{{"op":"get","key":"{key}"}}"#)).contains(r#""ok":false"#));
    assert!(exchange(r#"{"op":"hello"}"#).contains(r#""ok":true"#), "still served after bad lines");

    // A line over the limit closes that connection only.
    let long = UnixStream::connect(&socket).unwrap();
    let mut long_writer = long.try_clone().unwrap();
    let junk = vec![b'x'; IPC_LINE_BYTES_MAX + 10];
    let _ = long_writer.write_all(&junk);
    let mut rest = String::new();
    let closed = BufReader::new(long).read_line(&mut rest).map(|n| n == 0).unwrap_or(true);
    assert!(closed, "the oversized connection was closed");
    assert!(DdssClient::connect(&socket).is_ok(), "others are unaffected");
}

#[test]
fn stale_sockets_are_replaced_and_backends_must_match() {
    let site = site();
    let socket = site.root.path().join("stale.sock");
    {
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    } // dropped: the file stays, nobody listens
    assert!(socket.exists());
    let _daemon = DdssDaemon::serve(site.daemons[1].clone(), &socket).unwrap();
    let client = DdssClient::connect(&socket).unwrap();
    assert_eq!(client.info().node, NodeId(1));
    let tcp: Arc<dyn Fabric> = tierstack_fabric_tcp::TcpFabric::open(tierstack_fabric_tcp::TcpConfig::new(
        NodeId(7),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .unwrap();
    assert!(matches!(client.attach_data_path(tcp), Err(DdssError::Config(_))));
    assert!(matches!(DdssClient::connect(site.root.path().join("nobody.sock")), Err(DdssError::Ipc(_))));
}

#[test]
fn a_daemon_refuses_clients_beyond_its_limit() {
    use tierstack_ddss::ipc::IPC_CLIENTS_MAX;
    let site = site();
    let socket = site.root.path().join("busy.sock");
    let daemon = DdssDaemon::serve(site.daemons[0].clone(), &socket).unwrap();
    let clients: Vec<DdssClient> = (0..IPC_CLIENTS_MAX).map(|_| DdssClient::connect(&socket).unwrap()).collect();
    assert_eq!(daemon.clients(), IPC_CLIENTS_MAX);
    match DdssClient::connect(&socket) {
        Err(DdssError::Daemon { kind, message }) => {
            assert_eq!(kind, "bad_request");
            assert!(message.contains("at most"), "{message}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|c| c.info().clone())),
    }
    drop(clients);
}
