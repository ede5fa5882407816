use std::time::{Duration, Instant};
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
fn main() {
    let dir = tempfile::tempdir().unwrap();
    let a = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0))).unwrap();
    let b = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(1))).unwrap();
    let n: u64 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(2_000_000);
    let r = std::thread::spawn(move || {
        let inbox = b.inbox(Channel::APP);
        let t = Instant::now();
        for _ in 0..n { inbox.recv_timeout(Duration::from_secs(10)).unwrap(); }
        t.elapsed()
    });
    let payload = [0u8; 64];
    let t = Instant::now();
    for _ in 0..n { a.send(NodeId(1), Channel::APP, &payload).unwrap(); }
    let s = t.elapsed();
    let rr = r.join().unwrap();
    println!("send {:.0}/s, recv {:.0}/s", n as f64 / s.as_secs_f64(), n as f64 / rr.as_secs_f64());
}
