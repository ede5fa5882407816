//! `tierstack monitor-node` (hidden): the back end of `tierstack bench
//! monitor`'s accuracy run (Fig. 8a). It publishes its load on its fabric
//! node and through a monitor socket server, runs a seeded random walk of
//! requests in flight (the true value), and burns CPU with compute threads
//! that do not count in the load but compete with the monitor thread for
//! the CPU (the walk itself can be pinned elsewhere: `--walk-cpu`). It prints `ready`; when its standard input closes it stops and
//! prints the truth log, one `<t_ns> <value>` line per change
//! (`CLOCK_MONOTONIC`, the clock the front end stamps its samples with).

use anyhow::Result;
use clap::Args;
use rand::Rng;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, seeded_rng};
use tierstack_monitor::{AgentConfig, Gauge, LoadPublisher, MonitorAgent};

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
    let publisher = LoadPublisher::register(fabric.as_ref())?;
    let config = AgentConfig {
        interval: Duration::from_millis(args.interval_ms.max(1)),
        write_record: true,
        socket_listen: Some(args.monitor_listen),
    };
    let agent = MonitorAgent::start(publisher.clone(), config)?;
    let stop = Arc::new(AtomicBool::new(false));
    let burners: Vec<_> = (0..args.compute_threads)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = i as u64 | 1;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    }
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    let walking = stop.clone();
    let walk_cpu = args.walk_cpu;
    let walker = std::thread::spawn(move || {
        if let Some(cpu) = walk_cpu {
            if let Err(e) = tierstack_cluster::pin_to_cpu(cpu) {
                tracing::warn!(error = %e, cpu, "cannot pin the walk");
            }
        }
        let mut rng = seeded_rng(args.seed);
        let mut held = Vec::new();
        let mut log = vec![(host_monotonic_ns(), 0usize)];
        while !walking.load(Ordering::Relaxed) {
            // The walk's own pacing (a workload, not a synchronization).
            let pause = args.step_us * rng.gen_range(200..=1800) / 1000;
            std::thread::sleep(Duration::from_micros(pause));
            let up = held.is_empty() || (held.len() < args.walk_max && rng.gen_bool(0.5));
            if up {
                held.push(publisher.enter(Gauge::InFlightRequests));
            } else {
                held.pop();
            }
            log.push((host_monotonic_ns(), held.len()));
        }
        log
    });
    let stopped = args.service.stop_watch_thread()?;
    crate::service::announce_ready()?;
    let _ = stopped.recv();
    stop.store(true, Ordering::Relaxed);
    let log = walker.join().map_err(|_| anyhow::anyhow!("the walk thread panicked"))?;
    for burner in burners {
        let _ = burner.join();
    }
    drop(agent);
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for (t_ns, value) in log {
        writeln!(stdout, "{t_ns} {value}")?;
    }
    stdout.flush()?;
    Ok(())
}
