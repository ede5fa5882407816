//! The monitored back end of `bench monitor`'s accuracy run (Fig. 8a), run
//! as `tierstack monitor-node`: it publishes its load on its fabric node and
//! through a monitor socket server, and runs real threads whose number the
//! paper measures ("the number of threads running on the server"):
//!
//! - a pool of `walk_max` worker threads (`worker-N`) that *spin* while busy
//!   and *block* on a condition variable while idle; a seeded random walk
//!   (thread `walk`) wakes and idles them;
//! - `compute_threads` CPU-burning threads (`compute-N`), always running, as
//!   the application server's (`tierstack_appserver`'s `start_compute_threads`).
//!
//! Each running thread counts in `Gauge::RunningThreads`, and the counter
//! changes when the kernel's view of the thread does: the walk takes a
//! worker's guard just before waking it, the worker drops it just before it
//! blocks again (see [`Worker`]). So the load RDMA-Sync reads can be checked
//! against an observer that shares nothing with it: the tasks in state `R`
//! of `/proc/<pid>/task` (`bench::monitor::truth`). On
//! [`MonitoredNode::stop`] the node returns the walk's own log, one
//! `(t_ns, busy workers)` per step (`CLOCK_MONOTONIC`): what the walk meant,
//! a secondary column, not the truth. The binary parses its flags
//! ([`MonitorNodeArgs`], which `bench monitor` launches with
//! [`MonitorNodeArgs::to_args`]), says `ready` once every thread is named
//! and counted, and prints the log.
//!
//! `--fault uncounted-compute` is a **test fault**: the compute threads run
//! but take no guard, so the published load misses them, as it would with a
//! counter left out; a test uses it to watch the observer see the deviation.

use anyhow::{anyhow, Result};
use rand::Rng;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, seeded_rng};
use tierstack_cluster::NodeArgs;
use tierstack_fabric::Fabric;
use tierstack_monitor::{AgentConfig, Gauge, GaugeGuard, LoadPublisher, MonitorAgent};
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;

/// How long the node's threads may take to start (a loaded machine).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A fault a test injects into the node (never set in experiments).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Compute threads run but are not counted in the load.
    UncountedCompute,
}

impl Fault {
    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            Fault::UncountedCompute => "uncounted-compute",
        }
    }
}

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
    /// CPU-burning threads (`compute-N`), running threads of the load.
    #[arg(long, default_value_t = 0)]
    pub compute_threads: usize,
    /// Worker threads (`worker-N`); the walk keeps 0..=walk_max of them busy.
    #[arg(long, default_value_t = 64)]
    pub walk_max: usize,
    /// Mean time between steps of the walk, in microseconds (uniform in 0.2x..1.8x).
    #[arg(long, default_value_t = 1000)]
    pub step_us: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Pin the walk's thread to this CPU (off the compute threads' CPU), at
    /// real-time priority where allowed, so the walk moves at the same pace
    /// whatever the load on the monitor's CPU.
    #[arg(long)]
    pub walk_cpu: Option<usize>,
    /// A test fault (uncounted-compute: compute threads not counted).
    #[arg(long)]
    pub fault: Option<Fault>,
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
            fault: None,
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
            fault: self.fault,
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
        if let Some(fault) = self.fault {
            flag("--fault", fault.name().to_string());
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
    /// CPU-burning threads, counted as running (unless `fault` says not).
    pub compute_threads: usize,
    /// Worker threads; the walk keeps 0..=walk_max of them busy.
    pub walk_max: usize,
    /// Mean time between steps of the walk, in microseconds (uniform in 0.2x..1.8x).
    pub step_us: u64,
    pub seed: u64,
    /// Pin the walk's thread to this CPU (and raise it to real-time priority where allowed).
    pub walk_cpu: Option<usize>,
    /// A test fault.
    pub fault: Option<Fault>,
}

/// A worker's state, under its mutex.
#[derive(Default)]
struct WorkerState {
    /// The walk wants it busy.
    busy: bool,
    /// Its `RunningThreads` guard, held from just before the walk wakes it
    /// to just before it blocks again.
    running: Option<GaugeGuard>,
}

/// One worker thread of the pool and its hand-over with the walk.
///
/// Why the guard moves where it does: the kernel marks a task runnable
/// (`R`) when it is woken and sleeping (`S`) when it blocks. The walk makes
/// the guard just before `notify_one` (the wake), and the worker drops it
/// just before `Condvar::wait` (the block); between the two the worker is
/// `R` whether it spins on a CPU or waits for one. Told to idle, a worker
/// that has not yet been scheduled to notice is still `R`, and still
/// counted. What is left is a window of a few instructions at each end.
struct Worker {
    state: Mutex<WorkerState>,
    wake: Condvar,
    /// `state.busy`, polled without the lock while spinning.
    spin: AtomicBool,
}

impl Worker {
    fn new() -> Self {
        Worker { state: Mutex::new(WorkerState::default()), wake: Condvar::new(), spin: AtomicBool::new(false) }
    }

    fn lock(&self) -> MutexGuard<'_, WorkerState> {
        // A worker never panics holding the lock; take the state even so.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The walk: count the worker as running, then wake it.
    fn set_busy(&self, publisher: &Arc<LoadPublisher>) {
        {
            let mut state = self.lock();
            state.busy = true;
            self.spin.store(true, Ordering::Release);
            // Still holding its guard if it has not blocked since it was
            // last told to idle: it never stopped running.
            if state.running.is_none() {
                state.running = Some(publisher.enter(Gauge::RunningThreads));
            }
        }
        self.wake.notify_one();
    }

    /// The walk: tell the worker to idle (it keeps counting until it blocks).
    fn set_idle(&self) {
        let mut state = self.lock();
        state.busy = false;
        self.spin.store(false, Ordering::Release);
    }

    /// The worker thread's loop, until `stop`.
    fn run(&self, stop: &AtomicBool) {
        let mut x = 1u64;
        let mut state = self.lock();
        while !stop.load(Ordering::Relaxed) {
            if state.busy {
                drop(state);
                while self.spin.load(Ordering::Acquire) && !stop.load(Ordering::Relaxed) {
                    x = burn(x);
                }
                state = self.lock();
            } else {
                // Uncounted just before blocking: see the type's comment.
                state.running = None;
                state = self.wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
        state.running = None;
    }

    /// Wakes a blocked worker to see `stop`.
    fn release(&self) {
        // Under the lock: a worker between its check of `stop` and its wait
        // holds the lock, so it is waiting by the time this notifies.
        drop(self.lock());
        self.wake.notify_all();
    }
}

/// Puts the calling thread under `SCHED_FIFO` at the lowest real-time
/// priority, where the system allows it. For the walk alone: it wakes for
/// a few microseconds per step, and it is the workload's arrivals, which
/// should keep their pace however loaded the machine is. Pinned off the
/// node's CPU, a normal-priority walk starved anyway: Linux's autogroup
/// gives its session's weight on that CPU in proportion to the session's
/// load there (one sleeping thread against hundreds spinning on the other
/// CPU), so any other session's work there ran first (seen: 233 steps a
/// second at 200 compute threads against 850 at none).
fn realtime() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param for the call's duration; pid 0
    // is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A thousand steps of an LCG: CPU work the optimizer cannot remove.
fn burn(mut x: u64) -> u64 {
    for _ in 0..1000 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    }
    std::hint::black_box(x)
}

/// A running monitored node.
pub struct MonitoredNode {
    agent: MonitorAgent,
    stop: Arc<AtomicBool>,
    workers: Vec<Arc<Worker>>,
    threads: Vec<JoinHandle<()>>,
    walker: JoinHandle<Vec<(u64, usize)>>,
}

/// Spawns a named thread.
fn spawn<T: Send + 'static>(name: String, body: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.clone()).spawn(body).map_err(|e| anyhow!("starting thread {name}: {e}"))
}

impl MonitoredNode {
    /// Registers the load region on `fabric`, starts the monitor agent, the
    /// compute threads, the workers and the walk; returns once every
    /// compute thread is counted and every worker has started.
    pub fn start(fabric: &dyn Fabric, config: &MonitoredNodeConfig) -> Result<Self> {
        let publisher = LoadPublisher::register(fabric)?;
        let agent_config =
            AgentConfig { interval: config.interval, write_record: true, socket_listen: Some(config.monitor_listen) };
        let agent = MonitorAgent::start(publisher.clone(), agent_config)?;
        let stop = Arc::new(AtomicBool::new(false));
        // Threads say they started on a counter, not a `Barrier`: a barrier's
        // waiters leave it one by one through its mutex, and with hundreds
        // of spinning threads on one CPU that hand-over took seconds, every
        // waiter counted but asleep (seen: +185 threads at 200).
        let started = Arc::new(AtomicUsize::new(0));
        let counted = config.fault != Some(Fault::UncountedCompute);
        // Made here, on the node's CPU (the walk's pinning is its own).
        let workers: Vec<Arc<Worker>> = (0..config.walk_max).map(|_| Arc::new(Worker::new())).collect();
        let mut threads = Vec::new();
        let start_threads = || -> Result<JoinHandle<Vec<(u64, usize)>>> {
            for i in 0..config.compute_threads {
                let (stop, started, publisher) = (stop.clone(), started.clone(), publisher.clone());
                threads.push(spawn(format!("compute-{i}"), move || {
                    let _running = counted.then(|| publisher.enter(Gauge::RunningThreads));
                    started.fetch_add(1, Ordering::Release);
                    let mut x = i as u64 | 1;
                    while !stop.load(Ordering::Relaxed) {
                        x = burn(x);
                    }
                })?);
            }
            for (i, worker) in workers.iter().enumerate() {
                let (stop, started, worker) = (stop.clone(), started.clone(), worker.clone());
                threads.push(spawn(format!("worker-{i}"), move || {
                    started.fetch_add(1, Ordering::Release);
                    worker.run(&stop);
                })?);
            }
            let everyone = config.compute_threads + config.walk_max;
            let deadline = tierstack_base::time::instant_now() + START_TIMEOUT;
            while started.load(Ordering::Acquire) < everyone {
                if tierstack_base::time::instant_now() > deadline {
                    return Err(anyhow!(
                        "{} of {everyone} threads started within {START_TIMEOUT:?}",
                        started.load(Ordering::Acquire)
                    ));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            let (walking, pool) = (stop.clone(), workers.clone());
            let (walk_cpu, seed, step_us) = (config.walk_cpu, config.seed, config.step_us);
            spawn("walk".into(), move || {
                if let Some(cpu) = walk_cpu {
                    if let Err(e) = tierstack_cluster::pin_to_cpu(cpu) {
                        tracing::warn!(error = %e, cpu, "cannot pin the walk");
                    }
                    if let Err(e) = realtime() {
                        tracing::warn!(error = %e, "the walk keeps its normal priority");
                    }
                }
                let mut rng = seeded_rng(seed);
                // Workers 0..busy are busy: a step wakes the next or idles the last.
                let mut busy = 0usize;
                let mut log = vec![(host_monotonic_ns(), 0usize)];
                while !walking.load(Ordering::Relaxed) {
                    // The walk's own pacing (a workload, not a synchronization).
                    let pause = step_us * rng.gen_range(200..=1800) / 1000;
                    std::thread::sleep(Duration::from_micros(pause));
                    if pool.is_empty() {
                        continue;
                    }
                    let up = busy == 0 || (busy < pool.len() && rng.gen_bool(0.5));
                    if up {
                        pool[busy].set_busy(&publisher);
                        busy += 1;
                    } else {
                        busy -= 1;
                        pool[busy].set_idle();
                    }
                    log.push((host_monotonic_ns(), busy));
                }
                log
            })
        };
        match start_threads() {
            Ok(walker) => Ok(Self { agent, stop, workers, threads, walker }),
            Err(e) => {
                // Whatever started stops: spinning threads see `stop`, blocked workers are woken.
                stop.store(true, Ordering::Relaxed);
                workers.iter().for_each(|worker| worker.release());
                Err(e)
            }
        }
    }

    /// The agent's counters and published load, for `/metrics`.
    pub fn agent_view(&self) -> tierstack_monitor::AgentView {
        self.agent.view()
    }

    /// Stops every thread and the agent; returns the walk's log.
    pub fn stop(self) -> Result<Vec<(u64, usize)>> {
        self.stop.store(true, Ordering::Relaxed);
        let log = self.walker.join().map_err(|_| anyhow!("the walk thread panicked"))?;
        for worker in &self.workers {
            worker.release();
        }
        for thread in self.threads {
            let _ = thread.join();
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
            fault: Some(Fault::UncountedCompute),
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
            fault: None,
        };
        let node = MonitoredNode::start(cluster.fabric(0).as_ref(), &config).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let log = node.stop().unwrap();
        assert_eq!(log[0].1, 0, "the walk starts idle");
        assert!(log.iter().any(|(_, busy)| *busy > 0), "a worker was woken");
        assert!(log.len() >= 2, "the walk stepped at least once");
        for pair in log.windows(2) {
            assert!(pair[1].0 >= pair[0].0, "times never go back");
            assert_eq!(pair[0].1.abs_diff(pair[1].1), 1, "one step at a time");
            assert!(pair[1].1 <= config.walk_max);
        }
    }

    /// The hand-over counts a worker from just before its wake to just
    /// before it blocks: once woken it is counted at once; told to idle it
    /// stays counted until it has left its spin (then it blocks); woken
    /// again before it noticed, it is counted once, not twice.
    #[test]
    fn a_worker_counts_from_its_wake_to_its_block() {
        let publisher = LoadPublisher::unregistered().unwrap();
        let running = || publisher.counters().running_threads;
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Arc::new(Worker::new());
        let thread = {
            let (stop, worker) = (stop.clone(), worker.clone());
            std::thread::spawn(move || worker.run(&stop))
        };
        assert_eq!(running(), 0);
        worker.set_busy(&publisher);
        assert_eq!(running(), 1, "counted before it is even scheduled");
        worker.set_idle();
        worker.set_busy(&publisher);
        assert_eq!(running(), 1, "woken twice, counted once");
        worker.set_idle();
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(10);
        while running() != 0 {
            assert!(tierstack_base::time::instant_now() < deadline, "the idle worker never uncounted itself");
            std::thread::yield_now();
        }
        assert!(!worker.lock().busy);
        stop.store(true, Ordering::Relaxed);
        worker.release();
        thread.join().unwrap();
        assert_eq!(running(), 0);
    }
}
