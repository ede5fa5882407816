//! `tierstack bench dlm`: the services paper's Fig. 5 (lock cascading
//! latency) for N-CoShED, SRSL and DQNL on our backends, plus uncontended
//! acquire+release latency and throughput under contention.
//!
//! The measurements themselves live in [`measure`] (each node's side of
//! them in `tierstack_dlm::harness`); this module chooses the sweep, runs it
//! on the nodes, and reports tables, JSON and plots. Nodes are separate OS processes by default
//! ([`crate::dlm_nodes::ProcessNodes`], one `tierstack dlm-bench-node` each,
//! on a generated topology); or threads of this process, each with its own
//! fabric ([`ThreadNodes`] on [`tierstack_cluster::local_cluster`]), for
//! tests and comparison.
//!
//! Node roles (those of the crate's bench functions): node 0 is the home of
//! the lock, node 1 the first holder or the uncontended client, nodes 2.. the
//! waiters; contenders are nodes 1..=K. Each backend gets one cluster sized
//! for the largest sweep point. A warm-up pass runs every scheme once and is
//! discarded (the first scheme measured in a process runs slower). Then the
//! schemes take turns for `passes` measured passes, each turn with fresh
//! managers under a region prefix of its own (regions cannot be
//! unregistered, and a manager drains its fabric's lock channel, so only one scheme
//! runs at a time); samples of all passes are pooled.
//!
//! On a machine with fewer cores than nodes, a cascade's latency includes
//! waking every waiter's receive and waiting threads, which separate
//! machines would do in parallel; compare schemes within one run.
//! **Recovery after a kill** (processes only): the time from a node's
//! SIGKILL to the next grant to a live node, for a dead holder (node 1
//! holds, node 2 waits; node 1 is killed) and for a dead waiter in the
//! middle of the queue (node 1 holds, node 3 waits behind it, node 2 behind
//! node 3; node 3 is killed and node 1 releases at once), beside the plain
//! hand-over from a release to the waiter's grant. Every manager runs the
//! default recovery settings (probe every 50 ms, a 10 s lease that a kill
//! does not wait for). The killed node is started again after each round.
//! **Dead home** (N-CoShED and DQNL, at least five nodes): the managers
//! start again with three lock servers (re-homing on); node 3 holds, node 4
//! waits, the lock's current home is SIGKILLed and node 3 releases at once;
//! the time from the kill to node 4's grant at the new home, beside etcd's
//! documented election timeout. The killed server is started again (it
//! rejoins as a candidate), so each round kills the previous round's new
//! home.
//!
//! N-CoShED and DQNL run the same code for exclusive requests, so their
//! exclusive columns show the run's noise floor. Contender threads may also
//! run one after another instead of meeting (1000 uncontended pairs on `shm`
//! fit in a scheduler slice); the throughput table therefore shows lock
//! messages per pair, which N-CoShED and DQNL only send when requests meet.

pub mod measure;

use crate::dlm_nodes::ProcessNodes;
use crate::html::Report;
use crate::report::{us, Axes, Plot, Series, Table};
use crate::stats::{summarize_serial, Summary};
use anyhow::{bail, Context, Result};
use measure::{contended_throughput, figure5, uncontended_ns, ThreadNodes};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tierstack_cluster::{local_cluster, Backend};
use tierstack_dlm::harness::{LockNodes, BENCH_WAIT};
use tierstack_dlm::LockMode;
use tierstack_dlm::REHOMING_SERVERS_MIN;

pub use tierstack_dlm::Scheme;

/// Region prefix of the discarded warm-up pass.
const WARMUP_PREFIX: &str = "dlm-warmup";
/// Region prefix of the measured passes (the pass number follows).
const MEASURED_PREFIX: &str = "dlm-bench";
/// Uncontended pairs per mode in the warm-up pass.
const WARMUP_UNCONTENDED: usize = 200;
/// How long no lock message may arrive before [`settle`] calls the managers quiet.
const SETTLE_QUIET: Duration = Duration::from_millis(30);
/// Poll interval of [`settle`].
const SETTLE_POLL: Duration = Duration::from_millis(1);
/// Bound on one [`settle`].
const SETTLE_MAX: Duration = Duration::from_secs(30);
/// Seed of the contenders' shared/exclusive choices.
const THROUGHPUT_SEED: u64 = 7;
/// Most waiters a sweep may ask for (each is a node, i.e. a thread here).
pub const WAITERS_MAX: usize = 64;

const MODES: [LockMode; 2] = [LockMode::Shared, LockMode::Exclusive];

/// Where the lock-manager nodes run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// Threads of this process, each with its own fabric.
    Threads,
    /// One `dlm-bench-node` process of this `tierstack` executable each.
    Processes { exe: PathBuf },
}

/// `tierstack bench dlm`'s flags; unset options keep
/// [`DlmBenchConfig::new`]'s `--quick`-dependent defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct DlmArgs {
    /// Output folder for JSON and plots.
    #[arg(long, default_value = "report/dlm")]
    pub out: PathBuf,
    /// Fewer rounds and waiter counts 1,4,16 (for smoke runs).
    #[arg(long)]
    pub quick: bool,
    /// Backends to measure.
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    pub backends: Vec<Backend>,
    /// Lock schemes to compare.
    #[arg(long, value_delimiter = ',', default_value = "ncoshed,srsl,dqnl")]
    pub schemes: Vec<Scheme>,
    /// Waiter counts of the cascade sweep (default 1,2,4,8,16; 1,4,16 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub waiters: Option<Vec<usize>>,
    /// Cascades per cell, spread over 3 passes (default 90; 5 in one pass with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Run the nodes as threads of this process (each with its own fabric) instead of processes.
    #[arg(long)]
    pub threads: bool,
    /// Rounds of the recovery-after-a-kill measurement per scheme and backend (default 15; 3 with
    /// --quick; 0 skips it; processes only).
    #[arg(long)]
    pub recovery_rounds: Option<usize>,
}

impl DlmArgs {
    /// The configuration these flags describe; `exe` (the `tierstack`
    /// executable) is asked for only when the nodes are processes.
    pub fn config(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<DlmBenchConfig> {
        let nodes = if self.threads { NodeKind::Threads } else { NodeKind::Processes { exe: exe()? } };
        let mut config = DlmBenchConfig::new(self.out, nodes, self.quick);
        config.backends = self.backends;
        config.schemes = self.schemes;
        if let Some(waiters) = self.waiters {
            config.waiters = waiters;
        }
        if let Some(rounds) = self.rounds {
            config.rounds = rounds;
        }
        if let Some(recovery_rounds) = self.recovery_rounds {
            config.recovery_rounds = recovery_rounds;
        }
        Ok(config)
    }

    /// Runs the experiment.
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        run(&self.config(exe)?)?;
        Ok(())
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct DlmBenchConfig {
    pub out_dir: PathBuf,
    pub nodes: NodeKind,
    pub backends: Vec<Backend>,
    pub schemes: Vec<Scheme>,
    /// Waiter counts of the cascade sweep (Fig. 5's x axis).
    pub waiters: Vec<usize>,
    /// Cascades per (scheme, mode, waiters) cell, split evenly over the passes.
    pub rounds: usize,
    /// The schemes take turns this many times, each turn with fresh managers,
    /// so that a burst of load from elsewhere on the machine does not land
    /// on one scheme only.
    pub passes: usize,
    /// Uncontended acquire+release pairs per (scheme, mode), split over the passes.
    pub uncontended_pairs: usize,
    /// Numbers of contending nodes of the throughput sweep.
    pub contenders: Vec<usize>,
    /// Acquire+release pairs per contending node, in every pass.
    pub contended_pairs_per_node: usize,
    /// Share of the contenders' requests that are shared, in percent, one run each.
    pub shared_percents: Vec<u32>,
    /// Rounds of each recovery measurement per (backend, scheme); 0 skips
    /// them (they need nodes that are processes).
    pub recovery_rounds: usize,
}

impl DlmBenchConfig {
    pub fn new(out_dir: PathBuf, nodes: NodeKind, quick: bool) -> Self {
        Self {
            out_dir,
            nodes,
            backends: vec![Backend::Shm, Backend::Tcp],
            schemes: Scheme::ALL.to_vec(),
            waiters: if quick { vec![1, 4, 16] } else { vec![1, 2, 4, 8, 16] },
            rounds: if quick { 5 } else { 90 },
            passes: if quick { 1 } else { 3 },
            uncontended_pairs: if quick { 300 } else { 3000 },
            contenders: vec![2, 4, 8],
            contended_pairs_per_node: if quick { 200 } else { 1000 },
            shared_percents: vec![0, 50],
            recovery_rounds: if quick { 3 } else { 15 },
        }
    }

    /// Nodes a cluster needs for this sweep: home + holder + waiters, and home + contenders.
    fn node_count(&self) -> usize {
        let cascade = self.waiters.iter().max().map_or(0, |w| w + 2);
        let contended = self.contenders.iter().max().map_or(0, |k| k + 1);
        cascade.max(contended).max(2)
    }

    fn validate(&self) -> Result<()> {
        if self.backends.is_empty() || self.schemes.is_empty() {
            bail!("bench dlm needs at least one backend and one scheme");
        }
        if self.waiters.is_empty() || self.waiters.iter().any(|&w| w == 0 || w > WAITERS_MAX) {
            bail!("waiter counts must be in 1..={WAITERS_MAX}, got {:?}", self.waiters);
        }
        if self.contenders.iter().any(|&k| k == 0 || k > WAITERS_MAX) {
            bail!("contender counts must be in 1..={WAITERS_MAX}, got {:?}", self.contenders);
        }
        if self.shared_percents.iter().any(|&p| p > 100) {
            bail!("shared percentages must be at most 100, got {:?}", self.shared_percents);
        }
        if self.rounds == 0 || self.passes == 0 || self.uncontended_pairs == 0 || self.contended_pairs_per_node == 0 {
            bail!("rounds, passes and pair counts must be positive");
        }
        Ok(())
    }
}

/// One cell of Fig. 5: latency from the first release until the last waiter is granted.
#[derive(Clone, Debug, Serialize)]
pub struct CascadeResult {
    pub backend: String,
    pub scheme: String,
    pub mode: String,
    pub waiters: usize,
    /// One sample per round, nanoseconds.
    pub samples_ns: Vec<u64>,
    /// Over the rounds (`ops_per_sec` = cascades per second of cascade time).
    pub summary: Summary,
}

/// Uncontended acquire+release by one node of a lock homed elsewhere.
#[derive(Clone, Debug, Serialize)]
pub struct UncontendedResult {
    pub backend: String,
    pub scheme: String,
    pub mode: String,
    pub summary: Summary,
}

/// Completed acquire+release pairs per second with K nodes competing for one lock.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputResult {
    pub backend: String,
    pub scheme: String,
    pub contenders: usize,
    pub shared_percent: u32,
    /// Of the pass with the median rate.
    pub pairs_per_sec: f64,
    /// Lock messages handled per pair in that pass. N-CoShED and DQNL send
    /// none unless requests meet (SRSL always sends three), so this shows
    /// how much the contenders actually contended.
    pub messages_per_pair: f64,
    /// Every pass, by ascending rate.
    pub per_pass: Vec<ThroughputPass>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct ThroughputPass {
    pub pairs_per_sec: f64,
    pub messages_per_pair: f64,
}

/// Cascade latency of a baseline over N-CoShED's (> 1: N-CoShED is faster).
#[derive(Clone, Debug, Serialize)]
pub struct CascadeRatio {
    pub backend: String,
    pub mode: String,
    pub waiters: usize,
    pub srsl_over_ncoshed: Option<f64>,
    pub dqnl_over_ncoshed: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DlmReport {
    /// How nodes were run.
    pub nodes_are: String,
    pub nodes: usize,
    pub cpus: usize,
    pub passes: usize,
    /// Cascades per cell, over all passes.
    pub rounds: usize,
    pub waiters: Vec<usize>,
    pub cascade: Vec<CascadeResult>,
    pub ratios: Vec<CascadeRatio>,
    pub uncontended: Vec<UncontendedResult>,
    pub throughput: Vec<ThroughputResult>,
    /// Per backend: lock messages whose handling failed in the measured
    /// passes (a protocol violation; 0 in a sound run).
    pub message_errors: BTreeMap<String, u64>,
    /// Recovery after a kill, per backend and scheme.
    pub recovery: Vec<RecoveryResult>,
}

/// Recovery after a kill, one (backend, scheme): nanoseconds per round.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryResult {
    pub backend: String,
    pub scheme: String,
    /// A release to the waiter's grant, nobody dead (the baseline).
    pub handoff: Summary,
    /// The holder's kill to its waiter's grant.
    pub dead_holder: Summary,
    /// A queued waiter's kill (the holder releasing at once) to the grant
    /// of the live waiter behind it.
    pub dead_waiter: Summary,
    /// With three lock servers (re-homing, N-CoShED and DQNL, at least five
    /// nodes): the kill of the lock's home to a waiter's grant at its new
    /// home, the holder releasing at once.
    pub dead_home: Option<Summary>,
}

impl DlmReport {
    fn cascade_p50(&self, backend: &str, scheme: Scheme, mode: LockMode, waiters: usize) -> Option<u64> {
        self.cascade
            .iter()
            .find(|c| {
                c.backend == backend && c.scheme == scheme.name() && c.mode == mode.name() && c.waiters == waiters
            })
            .map(|c| c.summary.p50_ns)
    }
}

/// Raw samples of one backend, gathered over the passes.
#[derive(Default)]
struct Samples {
    /// Per (scheme name, mode, waiters).
    cascade: BTreeMap<(&'static str, LockMode, usize), Vec<u64>>,
    /// Per (scheme, mode).
    uncontended: BTreeMap<(&'static str, LockMode), Vec<u64>>,
    /// Per (scheme, contenders, shared percent): one entry per pass.
    throughput: BTreeMap<(&'static str, usize, u32), Vec<ThroughputPass>>,
    /// Lock messages whose handling failed (a protocol violation).
    message_errors: u64,
}

/// Runs the whole experiment, prints the tables, writes `dlm.json` and the plots.
pub fn run(config: &DlmBenchConfig) -> Result<DlmReport> {
    config.validate()?;
    std::fs::create_dir_all(&config.out_dir).with_context(|| format!("creating {}", config.out_dir.display()))?;
    let nodes = config.node_count();
    let nodes_are = match &config.nodes {
        NodeKind::Threads => format!("threads of one process, each with its own fabric ({nodes} nodes)"),
        NodeKind::Processes { .. } => format!("separate processes (tierstack dlm-bench-node, {nodes} nodes)"),
    };
    println!("bench dlm: nodes are {nodes_are}; node 0 is the lock's home, node 1 the first holder");
    let rounds_per_pass = config.rounds.div_ceil(config.passes);
    let mut report = DlmReport {
        nodes_are,
        nodes,
        cpus: tierstack_cluster::online_cpus(),
        passes: config.passes,
        rounds: rounds_per_pass * config.passes,
        waiters: config.waiters.clone(),
        cascade: Vec::new(),
        ratios: Vec::new(),
        uncontended: Vec::new(),
        throughput: Vec::new(),
        message_errors: BTreeMap::new(),
        recovery: Vec::new(),
    };
    let node_count = u32::try_from(nodes).context("node count")?;
    let max_waiters = config.waiters.iter().copied().max().unwrap_or(1);
    for &backend in &config.backends {
        let mut started = start_nodes(config, backend, node_count)?;
        let nodes = started.nodes.as_mut();
        for &scheme in &config.schemes {
            eprintln!("bench dlm: {} {} warm-up", backend.name(), scheme.name());
            nodes.start(scheme, WARMUP_PREFIX)?;
            figure5(nodes, &[max_waiters], 1)?;
            for mode in MODES {
                uncontended_ns(nodes, mode, WARMUP_UNCONTENDED)?;
            }
            settle(nodes)?;
        }
        let mut samples = Samples::default();
        for pass in 0..config.passes {
            for &scheme in &config.schemes {
                eprintln!("bench dlm: {} {} pass {}/{}", backend.name(), scheme.name(), pass + 1, config.passes);
                nodes.start(scheme, &format!("{MEASURED_PREFIX}{pass}"))?;
                measure_pass(config, nodes, scheme, rounds_per_pass, &mut samples)?;
            }
        }
        collect(backend, samples, &mut report);
        if config.recovery_rounds > 0 && matches!(config.nodes, NodeKind::Processes { .. }) && nodes.count() >= 4 {
            for &scheme in &config.schemes {
                eprintln!("bench dlm: {} {} recovery after kills", backend.name(), scheme.name());
                nodes.start(scheme, &format!("{RECOVERY_PREFIX}-{}", scheme.name()))?;
                let (handoff, dead_holder, dead_waiter) = measure_recovery(nodes, config.recovery_rounds)?;
                let dead_home = if nodes.count() >= DEAD_HOME_NODES {
                    eprintln!("bench dlm: {} {} dead homes", backend.name(), scheme.name());
                    let prefix = format!("{RECOVERY_PREFIX}-home-{}", scheme.name());
                    nodes.start_with_servers(scheme, &prefix, REHOMING_SERVERS_MIN)?;
                    Some(summarize_serial(measure_dead_home(nodes, config.recovery_rounds)?))
                } else {
                    None
                };
                report.recovery.push(RecoveryResult {
                    backend: backend.name().to_string(),
                    scheme: scheme.name().to_string(),
                    handoff: summarize_serial(handoff),
                    dead_holder: summarize_serial(dead_holder),
                    dead_waiter: summarize_serial(dead_waiter),
                    dead_home,
                });
            }
        }
    }
    report.ratios = ratios(config, &report);
    print_and_plot(config, &report)?;
    Ok(report)
}

/// The nodes of one backend, with what keeps them alive.
struct StartedNodes {
    nodes: Box<dyn LockNodes>,
    // In-process fabrics' shm files, or the node processes' topology.
    _cluster: Option<tierstack_cluster::LocalCluster>,
    _scratch: Option<tempfile::TempDir>,
}

fn start_nodes(config: &DlmBenchConfig, backend: Backend, count: u32) -> Result<StartedNodes> {
    let context = || format!("starting {count} {} lock nodes", backend.name());
    match &config.nodes {
        NodeKind::Threads => {
            let cluster = local_cluster(backend, count).with_context(context)?;
            let nodes = Box::new(ThreadNodes::new(cluster.fabrics().to_vec()));
            Ok(StartedNodes { nodes, _cluster: Some(cluster), _scratch: None })
        }
        NodeKind::Processes { exe } => {
            let scratch = tempfile::tempdir().context("creating the nodes' scratch folder")?;
            let nodes = Box::new(ProcessNodes::spawn(exe, backend, count, scratch.path()).with_context(context)?);
            Ok(StartedNodes { nodes, _cluster: None, _scratch: Some(scratch) })
        }
    }
}

/// One pass of every measurement for the scheme of `nodes` (freshly started).
///
/// The cascades go first: their accounting counts every lock message of a
/// round, so they need managers with no message in flight. The other
/// measurements end with messages that may still be on their way (an SRSL
/// release, say), so they [`settle`] before they count and before the
/// managers are dropped: a stale message must not reach the next managers.
fn measure_pass(
    config: &DlmBenchConfig,
    nodes: &mut dyn LockNodes,
    scheme: Scheme,
    rounds: usize,
    samples: &mut Samples,
) -> Result<()> {
    for row in figure5(nodes, &config.waiters, rounds)? {
        samples.cascade.entry((scheme.name(), row.mode, row.waiters)).or_default().extend(row.samples_ns);
    }
    let pairs = config.uncontended_pairs.div_ceil(config.passes);
    for mode in MODES {
        samples.uncontended.entry((scheme.name(), mode)).or_default().extend(uncontended_ns(nodes, mode, pairs)?);
    }
    let mut messages_before = settle(nodes)?;
    for &contenders in &config.contenders {
        for &shared_percent in &config.shared_percents {
            let pairs_per_sec = contended_throughput(
                nodes,
                contenders,
                shared_percent,
                config.contended_pairs_per_node,
                THROUGHPUT_SEED,
            )?;
            let messages_after = settle(nodes)?;
            let pairs = (contenders * config.contended_pairs_per_node) as f64;
            let messages_per_pair = messages_after.saturating_sub(messages_before) as f64 / pairs;
            messages_before = messages_after;
            samples
                .throughput
                .entry((scheme.name(), contenders, shared_percent))
                .or_default()
                .push(ThroughputPass { pairs_per_sec, messages_per_pair });
        }
    }
    samples.message_errors += nodes.totals()?.errors;
    Ok(())
}

/// Region prefix of the recovery measurements (the scheme follows).
const RECOVERY_PREFIX: &str = "dlm-recovery";

/// Waits until the lock messages handled reach `base + 1`: a request made
/// after `base` was read has reached the node it queues at.
fn await_queued(nodes: &mut dyn LockNodes, base: u64) -> Result<()> {
    let started = tierstack_base::time::instant_now();
    while nodes.totals()?.handled <= base {
        if started.elapsed() > BENCH_WAIT {
            bail!("a waiter's request was never handled");
        }
        std::thread::sleep(SETTLE_POLL);
    }
    Ok(())
}

/// Starts an exclusive waiter on `node` and waits until it is queued.
fn queue_waiter(nodes: &mut dyn LockNodes, node: usize) -> Result<()> {
    let base = nodes.totals()?.handled;
    nodes.start_waiter(node, LockMode::Exclusive)?;
    await_queued(nodes, base)
}

/// `rounds` of each recovery measurement (see the module docs): hand-over,
/// dead holder, dead waiter, in nanoseconds.
fn measure_recovery(nodes: &mut dyn LockNodes, rounds: usize) -> Result<(Vec<u64>, Vec<u64>, Vec<u64>)> {
    let (mut handoff, mut dead_holder, mut dead_waiter) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        settle(nodes)?;
        nodes.hold(1)?;
        queue_waiter(nodes, 2)?;
        let released = nodes.release_hold(1)?;
        handoff.push(nodes.finish_waiter(2)?.saturating_sub(released));

        settle(nodes)?;
        nodes.hold(1)?;
        queue_waiter(nodes, 2)?;
        let killed = nodes.kill(1)?;
        dead_holder.push(nodes.finish_waiter(2)?.saturating_sub(killed));
        nodes.restart(1)?;

        settle(nodes)?;
        nodes.hold(1)?;
        queue_waiter(nodes, 3)?;
        queue_waiter(nodes, 2)?;
        let killed = nodes.kill(3)?;
        nodes.release_hold(1)?;
        dead_waiter.push(nodes.finish_waiter(2)?.saturating_sub(killed));
        nodes.restart(3)?;
    }
    settle(nodes)?;
    Ok((handoff, dead_holder, dead_waiter))
}

/// Nodes the dead-home measurement needs: three lock servers (indexes 0–2)
/// and two clients (3 holds, 4 waits).
const DEAD_HOME_NODES: usize = REHOMING_SERVERS_MIN + 2;

/// `rounds` of the dead-home measurement (three lock servers): node 3
/// holds, node 4 waits; SIGKILL the lock's current home (as node 4 sees
/// it), node 3 releases at once (at the dead home: it ends locally); the
/// time from the kill to node 4's grant at the new home. The killed server
/// is started again (it rejoins as a candidate), so each round kills the
/// home the previous round moved the lock to.
fn measure_dead_home(nodes: &mut dyn LockNodes, rounds: usize) -> Result<Vec<u64>> {
    let (holder, waiter) = (REHOMING_SERVERS_MIN, REHOMING_SERVERS_MIN + 1);
    let mut dead_home = Vec::new();
    for _ in 0..rounds {
        settle(nodes)?;
        nodes.hold(holder)?;
        queue_waiter(nodes, waiter)?;
        let home = nodes.home(waiter)?;
        let killed = nodes.kill(home)?;
        nodes.release_hold(holder)?;
        dead_home.push(nodes.finish_waiter(waiter)?.saturating_sub(killed));
        nodes.restart(home)?;
    }
    settle(nodes)?;
    Ok(dead_home)
}

/// Waits until no lock message has been handled for [`SETTLE_QUIET`]
/// (bounded by [`SETTLE_MAX`]); returns the messages handled so far. Only
/// for measurements without exact message accounting; a message delayed by
/// more than the quiet time would still be missed, and shows up as a
/// message error.
fn settle(nodes: &mut dyn LockNodes) -> Result<u64> {
    let started = tierstack_base::time::instant_now();
    let mut seen = nodes.totals()?.handled;
    let mut quiet_since = tierstack_base::time::instant_now();
    loop {
        std::thread::sleep(SETTLE_POLL);
        let now = nodes.totals()?.handled;
        if now != seen {
            seen = now;
            quiet_since = tierstack_base::time::instant_now();
        } else if quiet_since.elapsed() >= SETTLE_QUIET {
            return Ok(seen);
        }
        if started.elapsed() > SETTLE_MAX {
            bail!("lock messages were still being handled after {SETTLE_MAX:?}");
        }
    }
}

/// Turns one backend's samples into report entries.
fn collect(backend: Backend, samples: Samples, report: &mut DlmReport) {
    let b = backend.name().to_string();
    for ((scheme, mode, waiters), samples_ns) in samples.cascade {
        report.cascade.push(CascadeResult {
            backend: b.clone(),
            scheme: scheme.to_string(),
            mode: mode.name().to_string(),
            waiters,
            summary: summarize_serial(samples_ns.clone()),
            samples_ns,
        });
    }
    for ((scheme, mode), samples_ns) in samples.uncontended {
        report.uncontended.push(UncontendedResult {
            backend: b.clone(),
            scheme: scheme.to_string(),
            mode: mode.name().to_string(),
            summary: summarize_serial(samples_ns),
        });
    }
    for ((scheme, contenders, shared_percent), mut per_pass) in samples.throughput {
        per_pass.sort_by(|a, b| a.pairs_per_sec.total_cmp(&b.pairs_per_sec));
        let median = per_pass.get(per_pass.len().saturating_sub(1) / 2).copied();
        report.throughput.push(ThroughputResult {
            backend: b.clone(),
            scheme: scheme.to_string(),
            contenders,
            shared_percent,
            pairs_per_sec: median.map_or(0.0, |m| m.pairs_per_sec),
            messages_per_pair: median.map_or(0.0, |m| m.messages_per_pair),
            per_pass,
        });
    }
    report.message_errors.insert(b, samples.message_errors);
}

fn ratios(config: &DlmBenchConfig, report: &DlmReport) -> Vec<CascadeRatio> {
    let mut out = Vec::new();
    for &backend in &config.backends {
        for mode in MODES {
            for &waiters in &config.waiters {
                let p50 = |scheme| report.cascade_p50(backend.name(), scheme, mode, waiters);
                let over = |scheme| match (p50(scheme), p50(Scheme::CoShed)) {
                    (Some(baseline), Some(ours)) if ours > 0 => Some(baseline as f64 / ours as f64),
                    _ => None,
                };
                out.push(CascadeRatio {
                    backend: backend.name().to_string(),
                    mode: mode.name().to_string(),
                    waiters,
                    srsl_over_ncoshed: over(Scheme::Srsl),
                    dqnl_over_ncoshed: over(Scheme::Dqnl),
                });
            }
        }
    }
    out
}

fn ratio_cell(ratio: Option<f64>) -> String {
    ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".to_string())
}

fn print_and_plot(config: &DlmBenchConfig, report: &DlmReport) -> Result<()> {
    let mut out = Report::new(&config.out_dir, "bench dlm", "the distributed lock manager (services paper Fig. 5)");
    out.table(&cascade_table(config, report));
    out.table(&uncontended_table(config, report));
    out.table(&throughput_table(config, report));
    print_recovery(report);
    for (backend, &errors) in &report.message_errors {
        if errors > 0 {
            out.text(&format!("WARNING: {errors} lock messages failed on {backend}: the numbers above are suspect"));
        }
    }
    out.json("dlm.json", report)?;
    for mode in MODES {
        let series: Vec<Series> = config
            .backends
            .iter()
            .flat_map(|backend| config.schemes.iter().map(move |scheme| (*backend, *scheme)))
            .map(|(backend, scheme)| Series {
                label: format!("{} {}", backend.name(), scheme.name()),
                points: config
                    .waiters
                    .iter()
                    .filter_map(|&w| {
                        report.cascade_p50(backend.name(), scheme, mode, w).map(|ns| (w as f64, ns as f64 / 1000.0))
                    })
                    .collect(),
            })
            .collect();
        let name = mode.name();
        let figure = if name == "shared" { "Fig. 5a" } else { "Fig. 5b" };
        out.plot(&Plot::lines(
            &format!("dlm-cascade-{name}.svg"),
            &format!("{figure}: lock cascading latency, {name} lock queue (p50)"),
            Axes { x_label: "waiting nodes (count)", y_label: "cascade latency p50 (µs)", log_x: true, log_y: true },
            series,
        ))?;
    }
    out.finish()?;
    Ok(())
}

/// Fig. 5: cascade latency by waiters and mode, and the ratios to N-CoShED.
fn cascade_table(config: &DlmBenchConfig, report: &DlmReport) -> Table {
    let has = |scheme| config.schemes.contains(&scheme);
    let show_srsl = has(Scheme::CoShed) && has(Scheme::Srsl);
    let show_dqnl = has(Scheme::CoShed) && has(Scheme::Dqnl);
    let mut header = vec!["waiters".to_string(), "mode".to_string()];
    for backend in &config.backends {
        for scheme in &config.schemes {
            header.push(format!("{} {}", backend.name(), scheme.name()));
        }
        if show_srsl {
            header.push(format!("{} srsl/ncoshed", backend.name()));
        }
        if show_dqnl {
            header.push(format!("{} dqnl/ncoshed", backend.name()));
        }
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let title =
        format!("Fig. 5: lock cascading latency (µs), p50 over {} rounds; ratios > 1: N-CoShED faster", report.rounds);
    let mut cascade = Table::new(&title, &header_refs);
    for mode in MODES {
        for &waiters in &config.waiters {
            let mut row = vec![waiters.to_string(), mode.name().to_string()];
            for backend in &config.backends {
                for &scheme in &config.schemes {
                    row.push(report.cascade_p50(backend.name(), scheme, mode, waiters).map(us).unwrap_or_default());
                }
                let ratio = report
                    .ratios
                    .iter()
                    .find(|r| r.backend == backend.name() && r.mode == mode.name() && r.waiters == waiters);
                if show_srsl {
                    row.push(ratio_cell(ratio.and_then(|r| r.srsl_over_ncoshed)));
                }
                if show_dqnl {
                    row.push(ratio_cell(ratio.and_then(|r| r.dqnl_over_ncoshed)));
                }
            }
            cascade.row(row);
        }
    }
    cascade
}

/// Uncontended acquire+release by scheme, mode and backend.
fn uncontended_table(config: &DlmBenchConfig, report: &DlmReport) -> Table {
    let mut uncontended =
        Table::new("Uncontended acquire+release latency (µs)", &["scheme", "mode", "backend", "p50", "p99", "mean"]);
    for &scheme in &config.schemes {
        for mode in MODES {
            for backend in &config.backends {
                let found = report
                    .uncontended
                    .iter()
                    .find(|u| u.backend == backend.name() && u.scheme == scheme.name() && u.mode == mode.name());
                if let Some(u) = found {
                    uncontended.row(vec![
                        u.scheme.clone(),
                        u.mode.clone(),
                        u.backend.clone(),
                        us(u.summary.p50_ns),
                        us(u.summary.p99_ns),
                        format!("{:.2}", u.summary.mean_ns / 1000.0),
                    ]);
                }
            }
        }
    }
    uncontended
}

/// Throughput with K contending nodes, and lock messages per pair.
fn throughput_table(config: &DlmBenchConfig, report: &DlmReport) -> Table {
    let mut header = vec!["contenders".to_string(), "% shared".to_string()];
    for backend in &config.backends {
        for scheme in &config.schemes {
            header.push(format!("{} {}", backend.name(), scheme.name()));
        }
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut throughput = Table::new(
        "Throughput with K contending nodes: acquire+release pairs/s (lock messages per pair; \
         N-CoShED/DQNL send none unless requests meet)",
        &header_refs,
    );
    for &contenders in &config.contenders {
        for &shared_percent in &config.shared_percents {
            let mut row = vec![contenders.to_string(), shared_percent.to_string()];
            for backend in &config.backends {
                for scheme in &config.schemes {
                    let found = report.throughput.iter().find(|t| {
                        t.backend == backend.name()
                            && t.scheme == scheme.name()
                            && t.contenders == contenders
                            && t.shared_percent == shared_percent
                    });
                    row.push(
                        found
                            .map(|t| format!("{:.0} ({:.2})", t.pairs_per_sec, t.messages_per_pair))
                            .unwrap_or_default(),
                    );
                }
            }
            throughput.row(row);
        }
    }
    throughput
}

/// Recovery after a kill, printed (not on the page), with etcd's and
/// ZooKeeper's documented bounds beside it.
fn print_recovery(report: &DlmReport) {
    if !report.recovery.is_empty() {
        let ms = |ns: u64| format!("{:.1}", ns as f64 / 1e6);
        let mut recovery = Table::new(
            "Recovery after a kill (ms, p50; no operator): dead holder = kill to the waiter's grant; dead waiter = \
             kill of the middle waiter (the holder releasing at once) to the grant of the waiter behind it; dead \
             home (p50 / p99, three lock servers) = kill of the lock's home to the waiter's grant at the new home",
            &["backend", "scheme", "hand-over", "dead holder", "dead waiter", "dead home", "dead holder / hand-over"],
        );
        for r in &report.recovery {
            let ratio = r.dead_holder.p50_ns as f64 / r.handoff.p50_ns.max(1) as f64;
            let dead_home =
                r.dead_home.as_ref().map_or("-".to_string(), |d| format!("{} / {}", ms(d.p50_ns), ms(d.p99_ns)));
            recovery.row(vec![
                r.backend.clone(),
                r.scheme.clone(),
                ms(r.handoff.p50_ns),
                ms(r.dead_holder.p50_ns),
                ms(r.dead_waiter.p50_ns),
                dead_home,
                format!("{ratio:.0}"),
            ]);
        }
        println!("{}", recovery.render());
        println!(
            "For comparison with the dead home (documented, not run here): etcd's defaults are a 100 ms heartbeat \
             interval and a 1000 ms election timeout, so a dead leader is replaced after at least the election \
             timeout (etcd docs, \"Tuning\")."
        );
        println!(
            "For comparison (documented, not run here): an etcd lock (clientv3 concurrency.Mutex) is a key \
             attached to its session's lease (concurrency.NewSession: TTL 60 s unless set); a killed client's \
             lock frees only when that lease expires, up to the TTL after the kill. A ZooKeeper lock's \
             ephemeral node goes when the session times out: 2 to 20 times tickTime unless \
             min/maxSessionTimeout say otherwise (tickTime 2 s in the sample configuration)."
        );
    }
}
