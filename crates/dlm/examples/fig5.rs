//! Lock cascading latency (the services paper's Fig. 5) with every node a
//! thread of this process, each with its own fabric.
//!
//! `cargo run --release -p tierstack-dlm --example fig5 -- [shm|tcp] [max_waiters] [rounds] [schemes]`
//! (schemes: comma-separated, default `ncoshed,srsl,dqnl`, run in that order)

use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_dlm::bench::{contended_throughput, figure5, median, start_managers, uncontended_ns};
use tierstack_dlm::{LockMode, Scheme};
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_fabric_tcp::{TcpConfig, TcpFabric};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args.first().map(String::as_str).unwrap_or("shm").to_string();
    let max_waiters: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(16);
    let rounds: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let schemes: Vec<Scheme> = match args.get(3) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => Scheme::ALL.to_vec(),
    };
    let nodes = max_waiters as u32 + 2;
    let dir = tempfile::tempdir()?;
    let fabrics: Vec<Arc<dyn Fabric>> = match backend.as_str() {
        "shm" => (0..nodes)
            .map(|i| ShmFabric::open(ShmConfig::new(dir.path(), NodeId(i))).map(|f| f as Arc<dyn Fabric>))
            .collect::<Result<_, _>>()?,
        "tcp" => {
            let tcp: Vec<Arc<TcpFabric>> = (0..nodes)
                .map(|i| TcpFabric::open(TcpConfig::new(NodeId(i), "127.0.0.1:0".parse().expect("address"))))
                .collect::<Result<_, _>>()?;
            for a in &tcp {
                for b in &tcp {
                    a.add_peer(b.local_node(), b.local_addr());
                }
            }
            tcp.into_iter().map(|f| f as Arc<dyn Fabric>).collect()
        }
        other => return Err(format!("unknown backend {other}").into()),
    };
    let counts: Vec<usize> = [1, 2, 4, 8, 16, 32].into_iter().filter(|&n| n <= max_waiters).collect();
    // Warm-up pass (discarded): the first scheme measured in a process runs slower.
    for &scheme in &schemes {
        let managers = start_managers(&fabrics, scheme, "warmup")?;
        uncontended_ns(&managers, LockMode::Exclusive, 500)?;
        figure5(&managers, &counts, 2)?;
    }
    let mut rows = Vec::new();
    for &scheme in &schemes {
        let managers = start_managers(&fabrics, scheme, "dlm")?;
        for mode in [LockMode::Shared, LockMode::Exclusive] {
            let samples = uncontended_ns(&managers, mode, 2000)?;
            println!(
                "uncontended {backend} {:8} {:9} acquire+release median {:>8.2} us",
                scheme.name(),
                format!("{mode:?}"),
                median(&samples) as f64 / 1000.0
            );
        }
        let contenders = 4.min(nodes as usize - 1);
        let ops = contended_throughput(&managers, contenders, 50, 5000, 7)?;
        println!("contended   {backend} {:8} {contenders} nodes, 50% shared: {ops:>10.0} pairs/s", scheme.name());
        rows.extend(figure5(&managers, &counts, rounds)?);
    }
    println!("# cascade latency ({backend}, {rounds} rounds, median us)");
    println!("{:9} {:>7} {:>10} {:>10} {:>10}", "mode", "waiters", "ncoshed", "srsl", "dqnl");
    for mode in [LockMode::Shared, LockMode::Exclusive] {
        for &n in &counts {
            let cell = |scheme: Scheme| {
                rows.iter()
                    .find(|r| r.scheme == scheme && r.mode == mode && r.waiters == n)
                    .map(|r| r.median_ns())
                    .unwrap_or(0)
            };
            let (c, s, d) = (cell(Scheme::CoShed), cell(Scheme::Srsl), cell(Scheme::Dqnl));
            println!(
                "{:9} {:>7} {:>10.1} {:>10.1} {:>10.1}   srsl/ncoshed {:.2}  dqnl/ncoshed {:.2}",
                format!("{mode:?}"),
                n,
                c as f64 / 1e3,
                s as f64 / 1e3,
                d as f64 / 1e3,
                s as f64 / c.max(1) as f64,
                d as f64 / c.max(1) as f64
            );
        }
    }
    Ok(())
}
