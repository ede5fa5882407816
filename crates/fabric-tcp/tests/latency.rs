//! Round-trip latency of an 8-byte remote read on loopback (a measurement,
//! not a pass/fail test). Run:
//! `cargo test --release -p tierstack-fabric-tcp --test latency -- --ignored --nocapture`

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Fabric, Op};

#[test]
#[ignore = "measurement; run explicitly with --ignored --nocapture"]
fn read_8_bytes_round_trip_latency() {
    const WARMUP: usize = 2_000;
    const SAMPLES: usize = 20_000;
    let nodes = tierstack_testkit::nodes::tcp::cluster(0, 2, Duration::from_secs(5));
    nodes[1].register("lat", 64, tierstack_fabric::Access::all()).unwrap();
    let remote = nodes[0].connect(NodeId(1), "lat").unwrap();
    for _ in 0..WARMUP {
        remote.read_u64(0).unwrap();
    }
    let mut samples_ns: Vec<u64> = (0..SAMPLES)
        .map(|_| {
            let start = tierstack_base::time::instant_now();
            remote.post(vec![Op::Read { offset: 8, len: 8 }]).wait().unwrap();
            start.elapsed().as_nanos() as u64
        })
        .collect();
    samples_ns.sort_unstable();
    let pct = |p: f64| samples_ns[((SAMPLES as f64 * p) as usize).min(SAMPLES - 1)] as f64 / 1000.0;
    println!(
        "tcp 8-byte read round trip over {SAMPLES} samples: p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us",
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(1.0)
    );
}
