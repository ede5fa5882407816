//! The monitored back end of `bench monitor`'s accuracy run (Fig. 8a), run
//! as `tierstack monitor-node`: it publishes its load on its fabric node and
//! through a monitor socket server, runs a seeded random walk of requests in
//! flight (the true value), and burns CPU with compute threads that do not
//! count in the load but compete with the monitor thread for the CPU (the
//! walk itself can be pinned elsewhere). On [`MonitoredNode::stop`] it
//! returns the truth log, one `(t_ns, value)` per change (`CLOCK_MONOTONIC`,
//! the clock the front end stamps its samples with). The binary parses its
//! flags ([`MonitorNodeArgs`], which `bench monitor` launches with
//! [`MonitorNodeArgs::to_args`]), says `ready` and prints the log.

use anyhow::{anyhow, Result};
use rand::Rng;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, seeded_rng};
use tierstack_cluster::NodeArgs;
use tierstack_fabric::Fabric;
use tierstack_monitor::{AgentConfig, Gauge, LoadPublisher, MonitorAgent};
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;

/// `tierstack monitor-node`'s flags, spelled once.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct MonitorNodeArgs {
    #[command(flatten)]
    pub at: NodeArgs,
    /// The monitor socket server's address (socket schemes).
    #[arg(long)]
    pub monitor_listen: SocketAddr,
    /// The monitor thread's period (RDMA-Async record, Socket-Async pushes).
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// CPU-burning threads (not counted in the load).
    #[arg(long, default_value_t = 0)]
    pub compute_threads: usize,
    /// The walk stays in 0..=walk_max.
    #[arg(long, default_value_t = 64)]
    pub walk_max: usize,
    /// Mean time between steps of the walk, in microseconds (uniform in 0.2x..1.8x).
    #[arg(long, default_value_t = 1000)]
    pub step_us: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Pin the walk's thread to this CPU (off the compute threads' CPU), so
    /// the truth moves at the same pace whatever the load on the monitor's CPU.
    #[arg(long)]
    pub walk_cpu: Option<usize>,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl MonitorNodeArgs {
    /// The required flags given, every other one at its default.
    pub fn new(at: NodeArgs, monitor_listen: SocketAddr) -> MonitorNodeArgs {
        MonitorNodeArgs {
            at,
            monitor_listen,
            interval_ms: 10,
            compute_threads: 0,
            walk_max: 64,
            step_us: 1000,
            seed: 1,
            walk_cpu: None,
            service: ServiceArgs::default(),
            observe: ObserveArgs::default(),
        }
    }

    /// What the node runs (a period of at least a millisecond).
    pub fn config(&self) -> MonitoredNodeConfig {
        MonitoredNodeConfig {
            monitor_listen: self.monitor_listen,
            interval: Duration::from_millis(self.interval_ms.max(1)),
            compute_threads: self.compute_threads,
            walk_max: self.walk_max,
            step_us: self.step_us,
            seed: self.seed,
            walk_cpu: self.walk_cpu,
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the required flags, then each flag whose value is
    /// not the parser's default (so that a launcher may append flags of its
    /// own).
    pub fn to_args(&self) -> Vec<String> {
        let default = MonitorNodeArgs::new(self.at.clone(), self.monitor_listen);
        let mut args = self.at.to_args();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        flag("--monitor-listen", self.monitor_listen.to_string());
        if self.interval_ms != default.interval_ms {
            flag("--interval-ms", self.interval_ms.to_string());
        }
        if self.compute_threads != default.compute_threads {
            flag("--compute-threads", self.compute_threads.to_string());
        }
        if self.walk_max != default.walk_max {
            flag("--walk-max", self.walk_max.to_string());
        }
        if self.step_us != default.step_us {
            flag("--step-us", self.step_us.to_string());
        }
        if self.seed != default.seed {
            flag("--seed", self.seed.to_string());
        }
        if let Some(cpu) = self.walk_cpu {
            flag("--walk-cpu", cpu.to_string());
        }
        if self.service != default.service {
            args.extend(self.service.to_args());
        }
        args.extend(self.observe.to_args());
        args
    }
}

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

    /// The agent's counters and published load, for `/metrics`.
    pub fn agent_view(&self) -> tierstack_monitor::AgentView {
        self.agent.view()
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
    use std::path::PathBuf;
    use tierstack_cluster::{local_cluster, Backend};

    fn parse(args: &MonitorNodeArgs) -> MonitorNodeArgs {
        let words = std::iter::once("monitor-node".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<MonitorNodeArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn monitor_node_args_round_trip_through_their_words() {
        let args = MonitorNodeArgs {
            at: NodeArgs { topology: PathBuf::from("/tmp/a cluster.toml"), node: 3 },
            monitor_listen: "127.0.0.1:9000".parse().unwrap(),
            interval_ms: 7,
            compute_threads: 2,
            walk_max: 9,
            step_us: 250,
            seed: 5,
            walk_cpu: Some(1),
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse(&args), args);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["monitor-node", "--topology", "t.toml", "--node", "0", "--monitor-listen", "127.0.0.1:9000"];
        let parsed = tierstack_testkit::args::parse::<MonitorNodeArgs, _, _>(words).unwrap();
        let at = NodeArgs { topology: PathBuf::from("t.toml"), node: 0 };
        assert_eq!(parsed, MonitorNodeArgs::new(at, "127.0.0.1:9000".parse().unwrap()));
        assert_eq!(parse(&parsed), parsed);
    }

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
