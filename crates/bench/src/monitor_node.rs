//! The monitored back end of `bench monitor`'s accuracy run (Fig. 8a), run
//! as `tierstack monitor-node`: it publishes its load on its fabric node and
//! through a monitor socket server, runs a seeded random walk of requests in
//! flight (the true value), and burns CPU with compute threads that do not
//! count in the load but compete with the monitor thread for the CPU (the
//! walk itself can be pinned elsewhere). On [`MonitoredNode::stop`] it
//! returns the truth log, one `(t_ns, value)` per change (`CLOCK_MONOTONIC`,
//! the clock the front end stamps its samples with). The binary parses its
//! flags, says `ready` and prints the log.

use anyhow::{anyhow, Result};
use rand::Rng;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, seeded_rng};
use tierstack_fabric::Fabric;
use tierstack_monitor::{AgentConfig, Gauge, LoadPublisher, MonitorAgent};

/// What the node runs.
#[derive(Clone, Debug)]
pub struct MonitoredNodeConfig {
    /// The monitor socket server's address (socket schemes).
    pub monitor_listen: SocketAddr,
    /// The monitor thread's period (RDMA-Async record, Socket-Async pushes).
    pub interval: Duration,
    /// CPU-burning threads (not counted in the load).
    pub compute_threads: usize,
    /// The walk stays in 0..=walk_max.
    pub walk_max: usize,
    /// Mean time between steps of the walk, in microseconds (uniform in 0.2x..1.8x).
    pub step_us: u64,
    pub seed: u64,
    /// Pin the walk's thread to this CPU.
    pub walk_cpu: Option<usize>,
}

/// A running monitored node.
pub struct MonitoredNode {
    agent: MonitorAgent,
    stop: Arc<AtomicBool>,
    burners: Vec<JoinHandle<()>>,
    walker: JoinHandle<Vec<(u64, usize)>>,
}

impl MonitoredNode {
    /// Registers the load region on `fabric`, starts the monitor agent, the
    /// compute threads and the walk.
    pub fn start(fabric: &dyn Fabric, config: &MonitoredNodeConfig) -> Result<Self> {
        let publisher = LoadPublisher::register(fabric)?;
        let agent_config =
            AgentConfig { interval: config.interval, write_record: true, socket_listen: Some(config.monitor_listen) };
        let agent = MonitorAgent::start(publisher.clone(), agent_config)?;
        let stop = Arc::new(AtomicBool::new(false));
        let burners = (0..config.compute_threads)
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
        let (walk_cpu, seed, step_us, walk_max) = (config.walk_cpu, config.seed, config.step_us, config.walk_max);
        let walker = std::thread::spawn(move || {
            if let Some(cpu) = walk_cpu {
                if let Err(e) = tierstack_cluster::pin_to_cpu(cpu) {
                    tracing::warn!(error = %e, cpu, "cannot pin the walk");
                }
            }
            let mut rng = seeded_rng(seed);
            let mut held = Vec::new();
            let mut log = vec![(host_monotonic_ns(), 0usize)];
            while !walking.load(Ordering::Relaxed) {
                // The walk's own pacing (a workload, not a synchronization).
                let pause = step_us * rng.gen_range(200..=1800) / 1000;
                std::thread::sleep(Duration::from_micros(pause));
                let up = held.is_empty() || (held.len() < walk_max && rng.gen_bool(0.5));
                if up {
                    held.push(publisher.enter(Gauge::InFlightRequests));
                } else {
                    held.pop();
                }
                log.push((host_monotonic_ns(), held.len()));
            }
            log
        });
        Ok(Self { agent, stop, burners, walker })
    }

    /// Stops every thread and the agent; returns the truth log.
    pub fn stop(self) -> Result<Vec<(u64, usize)>> {
        self.stop.store(true, Ordering::Relaxed);
        let log = self.walker.join().map_err(|_| anyhow!("the walk thread panicked"))?;
        for burner in self.burners {
            let _ = burner.join();
        }
        drop(self.agent);
        Ok(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_cluster::{local_cluster, Backend};

    #[test]
    fn the_truth_log_is_a_walk_of_single_steps_within_its_bounds() {
        let cluster = local_cluster(Backend::Tcp, 1).unwrap();
        let config = MonitoredNodeConfig {
            monitor_listen: "127.0.0.1:0".parse().unwrap(),
            interval: Duration::from_millis(5),
            compute_threads: 1,
            walk_max: 2,
            step_us: 100,
            seed: 3,
            walk_cpu: None,
        };
        let node = MonitoredNode::start(cluster.fabric(0).as_ref(), &config).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let log = node.stop().unwrap();
        assert_eq!(log[0].1, 0, "the walk starts idle");
        assert!(log.len() >= 2, "the walk stepped at least once");
        for pair in log.windows(2) {
            assert!(pair[1].0 >= pair[0].0, "times never go back");
            assert_eq!(pair[0].1.abs_diff(pair[1].1), 1, "one step at a time");
            assert!(pair[1].1 <= config.walk_max);
        }
    }
}
