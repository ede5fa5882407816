mod common;

use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, Op, OpResult};

fn basic(transports: &str) {
    if !common::ucx_or_skip() {
        return;
    }
    let nodes = common::cluster(0, 2, transports, Duration::from_secs(2));
    let owner = nodes[0].register("smoke", 64).unwrap();
    owner.memory().store_u64(8, 41).unwrap();
    let remote = nodes[1].connect(NodeId(0), "smoke").unwrap();
    assert_eq!(remote.read_u64(8).unwrap(), 41);
    remote.write(16, b"hello ucx").unwrap();
    let mut buf = [0u8; 9];
    owner.memory().read(16, &mut buf).unwrap();
    assert_eq!(&buf, b"hello ucx");
    assert_eq!(remote.fetch_add(8, 1).unwrap(), 41);
    assert_eq!(remote.compare_swap(8, 42, 7).unwrap(), 42);
    assert_eq!(remote.compare_swap(8, 42, 9).unwrap(), 7);
    let results = remote
        .post(vec![
            Op::Write { offset: 0, data: vec![1; 8] },
            Op::Read { offset: 0, len: 8 },
            Op::FetchAdd { offset: 0, delta: 1 },
        ])
        .wait()
        .unwrap();
    assert_eq!(results[1], OpResult::Read(vec![1; 8]));
    nodes[1].send(NodeId(0), Channel::TEST, b"ping").unwrap();
    let message = nodes[0].inbox(Channel::TEST).recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(message.payload, b"ping");
    nodes[0].send(NodeId(0), Channel::TEST, b"self").unwrap();
    let message = nodes[0].inbox(Channel::TEST).recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(message.payload, b"self");
}

#[test]
fn basic_shm() {
    basic(common::SHM);
}

#[test]
fn basic_tcp() {
    basic(common::TCP);
}
