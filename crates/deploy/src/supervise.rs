//! The supervisor: a topology's services started in order, each restarted
//! with back-off when it dies, until asked to stop.
//!
//! `tierstack cluster up` runs it as a detached process (`tierstack cluster
//! supervise`, its pid in the state file); the demo runs it inside its own
//! process with the children tied to it ([`UpConfig::tied`]). Either way the
//! same code starts, watches and stops the processes:
//!
//! - **start**: [`crate::cluster::plan`]'s order, each process ready (its
//!   `ready` line, then `/readyz` 200 where it has one) before the next
//!   starts, except that a kind that is ready only with its peers
//!   (`ServiceKind::ready_with_peers`: lock managers, substrates, PRESS and
//!   cooperative-cache nodes) need only be alive (`/healthz`) then; once all
//!   started, every `/readyz` must answer 200. A failure stops what was
//!   started and is the error.
//! - **watch**: a thread per child waits for its exit (no polling); an exit
//!   the supervisor did not ask for is logged and the process started again
//!   after [`restart_delay`]: 100 ms doubling to 30 s while it keeps dying
//!   within 10 s of its start, back to 100 ms once it stayed up longer.
//!   Each restart is counted in the state file (`cluster status` shows it).
//! - **stop** ([`Supervisor::stop`], or the command's SIGTERM): no more
//!   restarts; every process gets SIGTERM in reverse start order (front
//!   ends first), SIGKILL after its grace period and a margin.
//!
//! A restarted process is a new process of the same node with the same
//! command line. What it held in memory is gone: a restarted module starts
//! a new version table (a new incarnation, which the proxies' checks see, so
//! nothing stale is served), a restarted proxy an empty cache.

use crate::cluster::{
    down_state, plan, start_one, wait_ready, DownReport, Launch, ProcessId, Started, State, UpConfig, STATE_FILE,
};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ExitStatus};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tierstack_cluster::Topology;

/// The first restart's delay.
pub const RESTART_DELAY_MIN: Duration = Duration::from_millis(100);
/// The longest delay between restarts of a process that keeps dying.
pub const RESTART_DELAY_MAX: Duration = Duration::from_secs(30);
/// A process that ran this long before it died is restarted at once
/// (after [`RESTART_DELAY_MIN`]): its death is not part of a crash loop.
pub const STABLE_AFTER: Duration = Duration::from_secs(10);

/// The delay before restarting a process that has died `quick_deaths`
/// times in a row within [`STABLE_AFTER`] of its start (pure).
pub fn restart_delay(quick_deaths: u32) -> Duration {
    let doubled = RESTART_DELAY_MIN.saturating_mul(1u32 << quick_deaths.saturating_sub(1).min(16));
    doubled.min(RESTART_DELAY_MAX)
}

enum Event {
    Exited { index: usize, pid: u32, status: std::io::Result<ExitStatus> },
    Stop,
}

/// A running supervisor; [`Supervisor::stop`] (or dropping it) stops it and
/// every process it watches.
pub struct Supervisor {
    state: Arc<Mutex<State>>,
    events: mpsc::Sender<Event>,
    thread: Option<std::thread::JoinHandle<DownReport>>,
    run_dir: PathBuf,
}

/// A child being watched.
struct Watched {
    launch: Launch,
    started_at: Instant,
    quick_deaths: u32,
    /// Tied mode: the pipe whose end stops the child.
    _stdin: Option<ChildStdin>,
}

impl Supervisor {
    /// Starts every service of the topology at `topology_path` and begins
    /// watching them. The state file in `config.run_dir` names this process
    /// as the supervisor.
    pub fn start(topology_path: &Path, config: &UpConfig) -> Result<Supervisor> {
        let topology_path = std::fs::canonicalize(topology_path)
            .with_context(|| format!("reading topology {}", topology_path.display()))?;
        let topology = Topology::load(&topology_path)?;
        let launches = plan(&topology, &topology_path)?;
        std::fs::create_dir_all(&config.run_dir).with_context(|| format!("creating {}", config.run_dir.display()))?;
        refuse_if_running(&config.run_dir)?;
        let me = ProcessId::of(std::process::id()).context("reading this process's start time")?;
        let mut state = State {
            topology: topology_path.clone(),
            grace_ms: config.grace_ms,
            processes: Vec::new(),
            supervisor: Some(me),
        };
        let (events, received) = mpsc::channel();
        let mut watched = Vec::new();
        for (index, launch) in launches.into_iter().enumerate() {
            match start_one(&launch, config) {
                Ok((started, child)) => {
                    state.processes.push(started);
                    state.save(&config.run_dir)?;
                    watched.push(watch(index, launch, child, &events)?);
                }
                Err(e) => {
                    let stopped = down_state(&state);
                    let _ = std::fs::remove_file(config.run_dir.join(STATE_FILE));
                    let note = stopped.map(|r| r.summary()).unwrap_or_else(|e| format!("stopping the others: {e:#}"));
                    let mut what = format!("starting node {} ({})", launch.node, launch.kind.command());
                    if !note.is_empty() {
                        what = format!("{what}; stopped the others: {note}");
                    }
                    return Err(e.context(what));
                }
            }
        }
        if let Err(e) = wait_ready(&state) {
            let stopped = down_state(&state).map(|r| r.summary()).unwrap_or_else(|e| format!("{e:#}"));
            let _ = std::fs::remove_file(config.run_dir.join(STATE_FILE));
            return Err(e.context(format!("stopped every service: {stopped}")));
        }
        let state = Arc::new(Mutex::new(state));
        let shared = state.clone();
        let run_dir = config.run_dir.clone();
        let config = config.clone();
        let sender = events.clone();
        let thread = std::thread::Builder::new()
            .name("supervisor".into())
            .spawn(move || supervise(shared, watched, received, sender, &config))?;
        Ok(Supervisor { state, events, thread: Some(thread), run_dir })
    }

    /// The state as the file has it now (restarts included).
    pub fn state(&self) -> State {
        tierstack_base::sync::lock(&self.state).clone()
    }

    /// Stops watching and stops every process (reverse start order); the
    /// state file is removed.
    pub fn stop(mut self) -> Result<DownReport> {
        self.stop_now()
    }

    fn stop_now(&mut self) -> Result<DownReport> {
        let Some(thread) = self.thread.take() else { bail!("the supervisor was already stopped") };
        let _ = self.events.send(Event::Stop);
        let report = thread.join().map_err(|_| anyhow::anyhow!("the supervisor thread panicked"))?;
        match std::fs::remove_file(self.run_dir.join(STATE_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("removing the state file"),
        }
        Ok(report)
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.stop_now() {
                tracing::warn!(error = %format!("{e:#}"), "stopping the supervised services");
            }
        }
    }
}

/// Refuses to start over a cluster that still runs from `run_dir`.
pub(crate) fn refuse_if_running(run_dir: &Path) -> Result<()> {
    if let Ok(previous) = State::load(run_dir) {
        let supervisor_alive = previous.supervisor.as_ref().is_some_and(ProcessId::alive);
        if supervisor_alive || previous.processes.iter().any(Started::alive) {
            bail!("a cluster from {} is still up: `tierstack cluster down` it first", run_dir.display());
        }
    }
    Ok(())
}

/// Starts a thread that waits for `child` and reports its exit.
fn watch(index: usize, launch: Launch, mut child: Child, events: &mpsc::Sender<Event>) -> Result<Watched> {
    let stdin = child.stdin.take();
    let pid = child.id();
    let events = events.clone();
    std::thread::Builder::new().name(format!("watch-{}", launch.node)).spawn(move || {
        let status = child.wait();
        let _ = events.send(Event::Exited { index, pid, status });
    })?;
    Ok(Watched { launch, started_at: tierstack_base::time::instant_now(), quick_deaths: 0, _stdin: stdin })
}

/// The supervising loop: restarts what dies until told to stop, then stops
/// everything and returns what happened to each process.
fn supervise(
    state: Arc<Mutex<State>>,
    mut watched: Vec<Watched>,
    events: mpsc::Receiver<Event>,
    sender: mpsc::Sender<Event>,
    config: &UpConfig,
) -> DownReport {
    // (index, when) of the restarts due.
    let mut due: Vec<(usize, Instant)> = Vec::new();
    loop {
        let now = tierstack_base::time::instant_now();
        let wait =
            due.iter().map(|(_, at)| at.saturating_duration_since(now)).min().unwrap_or(Duration::from_secs(3600));
        match events.recv_timeout(wait) {
            Ok(Event::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(Event::Exited { index, pid, status }) => {
                let current = tierstack_base::sync::lock(&state).processes.get(index).map(|p| p.pid);
                if current != Some(pid) {
                    continue; // a process already replaced
                }
                let entry = &mut watched[index];
                let ran = entry.started_at.elapsed();
                entry.quick_deaths = if ran >= STABLE_AFTER { 1 } else { entry.quick_deaths + 1 };
                let delay = restart_delay(entry.quick_deaths);
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| format!("unknown ({e})"));
                tracing::warn!(
                    node = entry.launch.node,
                    kind = entry.launch.kind.command(),
                    pid,
                    %status,
                    ran_ms = ran.as_millis() as u64,
                    delay_ms = delay.as_millis() as u64,
                    "a supervised process exited; restarting it"
                );
                due.push((index, tierstack_base::time::instant_now() + delay));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = tierstack_base::time::instant_now();
        let (ready, later): (Vec<_>, Vec<_>) = due.drain(..).partition(|(_, at)| *at <= now);
        due = later;
        for (index, _) in ready {
            let launch = watched[index].launch.clone();
            match start_one(&launch, config) {
                Ok((mut started, child)) => {
                    let mut state = tierstack_base::sync::lock(&state);
                    started.restarts = state.processes[index].restarts + 1;
                    state.processes[index] = started;
                    if let Err(e) = state.save(&config.run_dir) {
                        tracing::warn!(error = %format!("{e:#}"), "writing the state file");
                    }
                    drop(state);
                    let quick_deaths = watched[index].quick_deaths;
                    match watch(index, launch, child, &sender) {
                        Ok(entry) => watched[index] = Watched { quick_deaths, ..entry },
                        Err(e) => tracing::warn!(error = %format!("{e:#}"), "watching a restarted process"),
                    }
                }
                Err(e) => {
                    let entry = &mut watched[index];
                    entry.quick_deaths += 1;
                    let delay = restart_delay(entry.quick_deaths);
                    tracing::warn!(node = launch.node, error = %format!("{e:#}"), delay_ms = delay.as_millis() as u64, "a restart failed; trying again");
                    due.push((index, tierstack_base::time::instant_now() + delay));
                }
            }
        }
    }
    let state = tierstack_base::sync::lock(&state).clone();
    down_state(&state).unwrap_or_else(|e| DownReport { nodes: vec![(0, "supervisor".into(), 0, format!("{e:#}"))] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_doubling_to_a_bound() {
        assert_eq!(restart_delay(0), RESTART_DELAY_MIN);
        assert_eq!(restart_delay(1), RESTART_DELAY_MIN);
        assert_eq!(restart_delay(2), RESTART_DELAY_MIN * 2);
        assert_eq!(restart_delay(4), RESTART_DELAY_MIN * 8);
        assert_eq!(restart_delay(9), RESTART_DELAY_MIN * 256);
        assert_eq!(restart_delay(10), RESTART_DELAY_MAX);
        assert_eq!(restart_delay(u32::MAX), RESTART_DELAY_MAX);
    }
}
