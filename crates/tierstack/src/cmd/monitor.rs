//! `tierstack monitor-node` (hidden): the back end of `tierstack bench
//! monitor`'s accuracy run (Fig. 8a), run by
//! `tierstack_bench::monitor_node`. It publishes its load on its fabric
//! node and through a monitor socket server, runs a seeded random walk of
//! requests in flight (the true value), and burns CPU with compute threads
//! that do not count in the load but compete with the monitor thread for
//! the CPU (the walk itself can be pinned elsewhere: `--walk-cpu`). It prints `ready`; when its standard input closes it stops and
//! prints the truth log, one `<t_ns> <value>` line per change
//! (`CLOCK_MONOTONIC`, the clock the front end stamps its samples with).

use anyhow::Result;
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tierstack_bench::monitor_node::{MonitoredNode, MonitoredNodeConfig};

#[derive(Args)]
pub(crate) struct MonitorNodeArgs {
    #[command(flatten)]
    at: super::NodeArgs,
    /// The monitor socket server's address (socket schemes).
    #[arg(long)]
    monitor_listen: SocketAddr,
    /// The monitor thread's period (RDMA-Async record, Socket-Async pushes).
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
    /// CPU-burning threads (not counted in the load).
    #[arg(long, default_value_t = 0)]
    compute_threads: usize,
    /// The walk stays in 0..=walk_max.
    #[arg(long, default_value_t = 64)]
    walk_max: usize,
    /// Mean time between steps of the walk, in microseconds (uniform in 0.2x..1.8x).
    #[arg(long, default_value_t = 1000)]
    step_us: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Pin the walk's thread to this CPU (off the compute threads' CPU), so
    /// the truth moves at the same pace whatever the load on the monitor's CPU.
    #[arg(long)]
    walk_cpu: Option<usize>,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
}

pub(crate) fn run_node(args: MonitorNodeArgs) -> Result<()> {
    let (_, fabric) = args.at.open()?;
    let config = MonitoredNodeConfig {
        monitor_listen: args.monitor_listen,
        interval: Duration::from_millis(args.interval_ms.max(1)),
        compute_threads: args.compute_threads,
        walk_max: args.walk_max,
        step_us: args.step_us,
        seed: args.seed,
        walk_cpu: args.walk_cpu,
    };
    let node = MonitoredNode::start(fabric.as_ref(), &config)?;
    let stopped = args.service.stop_watch_thread()?;
    crate::service::announce_ready()?;
    let _ = stopped.recv();
    let log = node.stop()?;
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for (t_ns, value) in log {
        writeln!(stdout, "{t_ns} {value}")?;
    }
    stdout.flush()?;
    Ok(())
}
