//! Lock-manager chaos with real processes.
//!
//! **Chaos, recovery on.** Five processes (two lock servers) run random
//! 2 ms holds on two locks for a fixed time while this test, on a seeded
//! schedule, SIGKILLs nodes (a passive one, a lock server, any) and
//! restarts them 300 ms later, and SIGSTOPs passive nodes for twice the
//! lease. The checker demands: holds whose release succeeded never
//! overlap conflictingly; fencing tokens increase with time (a hold before
//! another in time has the smaller token, across home restarts too), and a
//! hold that overlaps a later-token one was revoked (its release said
//! `Broken`: a fenced resource would reject its late writes); after every
//! kill, every node that was neither killed nor stopped meanwhile is
//! granted a hold again within [`RECOVERY_BOUND`]; no node that saw the
//! end met a protocol violation (a message of a restarted home's old
//! incarnation taken for one of the new, say).

use super::dlm_processes::{args, check, Hold, STEP};
use crate::exe;
use rand::Rng;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::process::{write_topology, NodeLine};
use tierstack_dlm::Scheme;

/// How long after a kill (or a lock server's stop) every untouched node
/// must have been granted again.
pub(crate) const RECOVERY_BOUND: Duration = Duration::from_secs(4);
pub(crate) const CHAOS_NODES: u32 = 5;
const CHAOS_SERVERS: u32 = 2;
pub(crate) const CHAOS_LEASE_MS: u64 = 600;
/// Fabric operation bound in the chaos topology: short, so a read of a
/// stopped node's heartbeat on tcp gives up well inside a lease.
const CHAOS_OP_TIMEOUT_MS: u64 = 300;
/// Time from the test's start to the first event, and between events.
const CHAOS_FIRST_EVENT: Duration = Duration::from_millis(1000);
const CHAOS_EVENT_GAP: Duration = Duration::from_millis(1500);
/// How long a killed node stays down.
pub(crate) const RESTART_AFTER: Duration = Duration::from_millis(300);

/// One event of a chaos schedule.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// SIGKILL; started again after `down` (never, with `None`).
    Kill { node: u32, down: Option<Duration> },
    /// SIGSTOP for twice the lease, then SIGCONT.
    Stop { node: u32 },
}

/// A chaos run's cluster and schedule.
pub(crate) struct ChaosSetup {
    /// Nodes `0..servers` keep lock tables.
    pub(crate) servers: u32,
    /// The schedule, from the run's seed.
    pub(crate) plan: fn(&mut tierstack_base::SeededRng) -> Vec<Step>,
    /// How long after a kill (or a lock server's stop) every untouched node
    /// must have been granted every lock again.
    pub(crate) recovery_bound: Duration,
}

/// The schedule of the chaos runs with two lock servers (no re-homing):
/// kill a passive node, stop one, kill a lock server, stop one, kill any
/// node, each killed node restarted after [`RESTART_AFTER`].
fn restarts_plan(rng: &mut tierstack_base::SeededRng) -> Vec<Step> {
    let passive = |rng: &mut tierstack_base::SeededRng| rng.gen_range(CHAOS_SERVERS..CHAOS_NODES);
    let down = Some(RESTART_AFTER);
    vec![
        Step::Kill { node: passive(rng), down },
        Step::Stop { node: passive(rng) },
        Step::Kill { node: rng.gen_range(0..CHAOS_SERVERS), down },
        Step::Stop { node: passive(rng) },
        Step::Kill { node: rng.gen_range(0..CHAOS_NODES), down },
    ]
}

/// One incarnation of a chaos node: its output lines are collected by a
/// thread into a list shared with the test.
struct Incarnation {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Kill { node: u32, at_ns: u64, restarted_ns: u64 },
    Stop { node: u32, at_ns: u64, continued_ns: u64 },
}

struct Chaos {
    topology: PathBuf,
    /// Where each incarnation's standard error goes (`node<id>-<n>.err`).
    logs: PathBuf,
    incarnations: u32,
    scheme: Scheme,
    common: Vec<String>,
    lines: std::sync::Arc<std::sync::Mutex<Vec<(u32, String)>>>,
    nodes: Vec<Incarnation>,
    /// Nodes killed for good.
    gone: Vec<u32>,
}

impl Chaos {
    fn spawn(&mut self, id: u32) -> Incarnation {
        self.incarnations += 1;
        let log = std::fs::File::create(self.logs.join(format!("node{id}-{}.err", self.incarnations))).unwrap();
        let mut child = Command::new(exe())
            .args(["dlm-node", "--topology", &self.topology.display().to_string(), "--node", &id.to_string()])
            .args(["--scheme", self.scheme.name(), "--locks", "0..2"])
            .args(&self.common)
            .arg("--stop-on-stdin-eof")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .env("TIERSTACK_LOG", "tierstack_dlm=info")
            .spawn()
            .expect("starting tierstack dlm-node");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("a stdout pipe");
        let lines = self.lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                lines.lock().unwrap().push((id, line));
            }
        });
        Incarnation { child, stdin, reader: Some(reader) }
    }

    fn ready_count(&self, id: u32) -> usize {
        self.lines.lock().unwrap().iter().filter(|(n, l)| *n == id && l == "ready").count()
    }

    fn signal(&self, id: u32, signal: libc::c_int) {
        // SAFETY: signalling our own child process, which has not been reaped.
        let rc = unsafe { libc::kill(self.nodes[id as usize].child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "signal {signal} to node {id}");
    }

    /// Kills node `id` and starts it again after `down` (never, with `None`:
    /// then "restarted" is `u64::MAX`).
    fn kill_and_restart(&mut self, id: u32, down: Option<Duration>) -> (u64, u64) {
        let at_ns = tierstack_base::host_monotonic_ns();
        self.signal(id, libc::SIGKILL);
        let node = &mut self.nodes[id as usize];
        node.child.wait().expect("reaping a killed node");
        if let Some(reader) = node.reader.take() {
            reader.join().unwrap();
        }
        let Some(down) = down else {
            self.gone.push(id);
            return (at_ns, u64::MAX);
        };
        std::thread::sleep(down); // the schedule: the node stays down this long
        let readies = self.ready_count(id);
        self.nodes[id as usize] = self.spawn(id);
        let deadline = tierstack_base::time::instant_now() + STEP;
        while self.ready_count(id) == readies {
            assert!(tierstack_base::time::instant_now() < deadline, "node {id} did not come back");
            std::thread::yield_now();
        }
        (at_ns, tierstack_base::host_monotonic_ns())
    }

    fn stop_and_continue(&mut self, id: u32) -> (u64, u64) {
        let at_ns = tierstack_base::host_monotonic_ns();
        self.signal(id, libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(2 * CHAOS_LEASE_MS)); // the schedule: stopped past its lease
        self.signal(id, libc::SIGCONT);
        (at_ns, tierstack_base::host_monotonic_ns())
    }
}

/// Every hold of a chaos run: `valid` if its release succeeded, else
/// revoked (its release said `Broken`).
#[derive(Clone, Debug)]
pub(crate) struct ChaosHold {
    pub(crate) hold: Hold,
    pub(crate) valid: bool,
}

fn chaos_holds(lines: &[(u32, String)], servers: u32) -> (Vec<ChaosHold>, Vec<Value>) {
    let mut holds = Vec::new();
    let mut summaries = Vec::new();
    for (_, line) in lines {
        let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
        if value.get("done").is_some() {
            summaries.push(value);
        } else if value.get("granted_ns").is_some() && value.get("event").is_none() {
            // A release that failed: the hold was revoked (a recovery went
            // past it while its node was stopped), or lost with its home.
            let valid = value.get("error").is_none();
            if !valid {
                let lost_home = value["error"] == "peer_dead" && value["peer"].as_u64() < Some(servers.into());
                assert!(value["error"] == "broken" || lost_home, "a release failed otherwise: {value}");
            }
            holds.push(ChaosHold { hold: Hold::parse(&value), valid });
        }
    }
    (holds, summaries)
}

/// The chaos run's properties; see the module documentation.
fn check_chaos(holds: &[ChaosHold], events: &[Event], end_ns: u64, setup: &ChaosSetup) -> Result<(), String> {
    let (servers, bound) = (setup.servers, setup.recovery_bound);
    let valid: Vec<Hold> = holds.iter().filter(|h| h.valid).map(|h| h.hold.clone()).collect();
    check(&valid, true)?;
    let mut by_lock: BTreeMap<u64, Vec<&ChaosHold>> = BTreeMap::new();
    for h in holds.iter().filter(|h| !h.hold.shared) {
        by_lock.entry(h.hold.lock).or_default().push(h);
    }
    for (lock, exclusive) in &by_lock {
        for a in exclusive {
            for b in exclusive {
                let (ta, tb) = (a.hold.token.unwrap_or(0), b.hold.token.unwrap_or(0));
                if a.hold.released_ns <= b.hold.granted_ns && ta >= tb {
                    return Err(format!("lock {lock}: token {tb} granted after {ta}: {a:?} then {b:?}"));
                }
                if ta < tb && a.hold.released_ns > b.hold.granted_ns && a.valid {
                    return Err(format!("lock {lock}: a valid hold outlived a later-token one: {a:?} {b:?}"));
                }
            }
        }
    }
    let locks: std::collections::BTreeSet<u64> = holds.iter().map(|h| h.hold.lock).collect();
    for event in events {
        // After a kill, and after a lock server's stop (its locks' home may
        // have to move), every untouched node makes progress.
        let (killed, at_ns) = match *event {
            Event::Kill { node, at_ns, .. } => (node, at_ns),
            Event::Stop { node, at_ns, .. } if node < servers => (node, at_ns),
            Event::Stop { .. } => continue,
        };
        let window = at_ns..at_ns + bound.as_nanos() as u64;
        if window.end > end_ns {
            continue;
        }
        for n in (0..CHAOS_NODES).filter(|&n| n != killed) {
            let disturbed = events.iter().any(|e| match *e {
                Event::Kill { node, at_ns, restarted_ns } => {
                    node == n && at_ns < window.end && restarted_ns > window.start
                }
                Event::Stop { node, at_ns, continued_ns } => {
                    node == n && at_ns < window.end && continued_ns > window.start
                }
            });
            if disturbed {
                continue;
            }
            // Per lock: a lock whose home died must come back too.
            for &lock in &locks {
                let progressed = holds.iter().any(|h| {
                    h.valid && h.hold.node == u64::from(n) && h.hold.lock == lock && window.contains(&h.hold.granted_ns)
                });
                if !progressed {
                    return Err(format!(
                        "node {n} was not granted lock {lock} within {bound:?} after node {killed} was \
                         killed or stopped at {at_ns}"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn chaos(backend: Backend, scheme: Scheme, run: Duration) {
    chaos_with(
        backend,
        scheme,
        run,
        &ChaosSetup { servers: CHAOS_SERVERS, plan: restarts_plan, recovery_bound: RECOVERY_BOUND },
    );
}

/// What a chaos run recorded (after its checks passed).
pub(crate) struct ChaosRun {
    pub(crate) holds: Vec<ChaosHold>,
    pub(crate) events: Vec<Event>,
    pub(crate) end_ns: u64,
    /// The `done` line of every node that saw the end.
    pub(crate) summaries: Vec<Value>,
}

/// A chaos run (see the module documentation) of `setup`'s cluster and
/// schedule.
pub(crate) fn chaos_with(backend: Backend, scheme: Scheme, run: Duration, setup: &ChaosSetup) -> ChaosRun {
    let seed = tierstack_testkit::test_seed();
    let label = format!("chaos {} {} seed {seed}", scheme.name(), backend.name());
    eprintln!("dlm_chaos {label} (replay the schedule with TIERSTACK_TEST_SEED={seed})");
    let dir = tempfile::tempdir().unwrap();
    let lines_spec: Vec<NodeLine> = (0..CHAOS_NODES)
        .map(|id| NodeLine { id, role: if id < setup.servers { "app" } else { "passive" }, cpu: None })
        .collect();
    let name = format!("dlm-chaos-{}-{}", scheme.name(), backend.name());
    let topology = write_topology(dir.path(), &name, backend, CHAOS_OP_TIMEOUT_MS, &lines_spec).unwrap();
    let start_ns = tierstack_base::host_monotonic_ns();
    let end_ns = start_ns + run.as_nanos() as u64;
    let common = args(&[
        ("--ops", "100000000".into()),
        ("--shared-percent", "50".into()),
        ("--seed", seed.to_string()),
        ("--hold-us", "2000".into()),
        ("--acquire-timeout-ms", "3000".into()),
        ("--run-until-ns", end_ns.to_string()),
        ("--lease-ms", CHAOS_LEASE_MS.to_string()),
        ("--probe-ms", "20".into()),
        ("--suspect-ms", "300".into()),
    ]);
    let logs = dir.path().to_path_buf();
    let mut chaos = Chaos {
        topology,
        logs,
        incarnations: 0,
        scheme,
        common,
        lines: Default::default(),
        nodes: Vec::new(),
        gone: Vec::new(),
    };
    // Servers first: the others create their locks at the servers before `ready`.
    for id in 0..CHAOS_NODES {
        let node = chaos.spawn(id);
        chaos.nodes.push(node);
        let deadline = tierstack_base::time::instant_now() + STEP;
        while chaos.ready_count(id) == 0 {
            assert!(tierstack_base::time::instant_now() < deadline, "{label}: node {id} never ready");
            std::thread::yield_now();
        }
    }
    // The schedule; which nodes comes from the seed.
    let mut rng = tierstack_base::seeded_rng(seed);
    let mut events = Vec::new();
    let mut due = tierstack_base::time::instant_now() + CHAOS_FIRST_EVENT;
    for step in (setup.plan)(&mut rng) {
        std::thread::sleep(due.saturating_duration_since(tierstack_base::time::instant_now())); // the schedule
        events.push(match step {
            Step::Kill { node, down } => {
                let (at_ns, restarted_ns) = chaos.kill_and_restart(node, down);
                Event::Kill { node, at_ns, restarted_ns }
            }
            Step::Stop { node } => {
                let (at_ns, continued_ns) = chaos.stop_and_continue(node);
                Event::Stop { node, at_ns, continued_ns }
            }
        });
        due += CHAOS_EVENT_GAP;
    }
    // Every node ends its operations at `end_ns`; wait for their summaries.
    let deadline = tierstack_base::time::instant_now() + run + STEP;
    loop {
        let done: std::collections::BTreeSet<u32> =
            chaos.lines.lock().unwrap().iter().filter(|(_, l)| l.starts_with("{\"done\"")).map(|(n, _)| *n).collect();
        if done.len() + chaos.gone.len() == CHAOS_NODES as usize {
            break;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "{label}: only {done:?} finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    for node in &mut chaos.nodes {
        node.stdin.take();
    }
    for node in &mut chaos.nodes {
        let _ = node.child.wait();
        if let Some(reader) = node.reader.take() {
            reader.join().unwrap();
        }
    }
    let lines = chaos.lines.lock().unwrap().clone();
    let (holds, summaries) = chaos_holds(&lines, setup.servers);
    let revoked = holds.iter().filter(|h| !h.valid).count();
    let moves: u64 = summaries.iter().map(|s| s["moves"].as_u64().unwrap_or(0)).sum();
    eprintln!(
        "{label}: {} holds ({revoked} revoked), events {events:?}, moves at surviving nodes {moves}",
        holds.len()
    );
    if let Err(violation) = check_chaos(&holds, &events, end_ns, setup) {
        // What each node reported after the last event before the failure, for diagnosis.
        for (n, line) in lines.iter().filter(|(_, l)| !l.contains("\"released_ns\"") || l.contains("error")) {
            eprintln!("node {n}: {line}");
        }
        print_warnings(dir.path());
        panic!("{label}: {violation}");
    }
    for summary in &summaries {
        if summary["violations"] != 0 {
            print_warnings(dir.path());
        }
        assert_eq!(summary["violations"], 0, "{label}: {summary}");
    }
    assert!(holds.len() > 100, "{label}: the run did little");
    ChaosRun { holds, events, end_ns, summaries }
}

/// Prints the nodes' warnings (their standard error), for a failing run.
fn print_warnings(dir: &Path) {
    let mut logs: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    logs.sort();
    for log in logs.iter().filter(|p| p.extension().is_some_and(|e| e == "err")) {
        for line in std::fs::read_to_string(log).unwrap_or_default().lines().filter(|l| l.contains("WARN")) {
            eprintln!("{}: {line}", log.file_name().unwrap().to_string_lossy());
        }
    }
}

/// Seconds of chaos per run: events take the first 7.5 s, and the last
/// kill's recovery window must end before the run does.
pub(crate) const CHAOS_RUN: Duration = Duration::from_secs(12);

#[test]
fn chaos_ncoshed_shm() {
    chaos(Backend::Shm, Scheme::CoShed, CHAOS_RUN);
}

#[test]
fn chaos_ncoshed_tcp() {
    chaos(Backend::Tcp, Scheme::CoShed, CHAOS_RUN);
}

#[test]
fn chaos_srsl_shm() {
    chaos(Backend::Shm, Scheme::Srsl, CHAOS_RUN);
}

#[test]
fn chaos_dqnl_shm() {
    chaos(Backend::Shm, Scheme::Dqnl, CHAOS_RUN);
}

#[test]
fn the_chaos_checker_rejects_what_it_must() {
    let hold = |node, shared, token, granted_ns, released_ns, valid| ChaosHold {
        hold: Hold { node, lock: 0, shared, token, start_ns: granted_ns, granted_ns, released_ns },
        valid,
    };
    let end = 100_000_000_000;
    let setup = ChaosSetup { servers: CHAOS_SERVERS, plan: restarts_plan, recovery_bound: RECOVERY_BOUND };
    // A stopped holder's hold, revoked, overlaps a later-token one: fine.
    let revoked = [hold(1, false, Some(5), 10, 50, false), hold(2, false, Some(6), 30, 40, true)];
    assert!(check_chaos(&revoked, &[], end, &setup).is_ok());
    // The same overlap with both valid: mutual exclusion is broken.
    let both = [hold(1, false, Some(5), 10, 50, true), hold(2, false, Some(6), 30, 40, true)];
    assert!(check_chaos(&both, &[], end, &setup).is_err());
    // A revoked hold whose token is the later one: fencing would not reject it.
    let backwards = [hold(1, false, Some(7), 10, 50, false), hold(2, false, Some(6), 30, 40, true)];
    assert!(check_chaos(&backwards, &[], end, &setup).is_err());
    // Tokens that go down in time (a home restarted with a lower fence).
    let down = [hold(1, false, Some(7), 10, 20, true), hold(2, false, Some(6), 30, 40, true)];
    assert!(check_chaos(&down, &[], end, &setup).is_err());
    // A kill after which an untouched node is never granted again.
    let kill = Event::Kill { node: 4, at_ns: 1_000, restarted_ns: 2_000 };
    let mut quiet: Vec<ChaosHold> = (0..CHAOS_NODES as u64).map(|n| hold(n, true, None, 5_000, 6_000, true)).collect();
    // Two locks: node 2 granted only lock 0 after the kill (lock 1's home died, say).
    let mut two_locks = quiet.clone();
    two_locks.extend(quiet.iter().map(|h| ChaosHold { hold: Hold { lock: 1, ..h.hold.clone() }, valid: true }));
    assert!(check_chaos(&two_locks, &[kill], end, &setup).is_ok());
    two_locks.retain(|h| !(h.hold.node == 2 && h.hold.lock == 1));
    assert!(check_chaos(&two_locks, &[kill], end, &setup).is_err(), "node 2 never granted lock 1 again");
    assert!(check_chaos(&quiet, &[kill], end, &setup).is_ok());
    quiet.retain(|h| h.hold.node != 2);
    assert!(check_chaos(&quiet, &[kill], end, &setup).is_err(), "node 2 made no progress");
    let stopped = Event::Stop { node: 2, at_ns: 1_500, continued_ns: 1_800 };
    assert!(check_chaos(&quiet, &[kill, stopped], end, &setup).is_ok(), "a stopped node is excused");
    // A lock server's stop (its locks' home may move): every other node must progress.
    let server_stop = Event::Stop { node: 0, at_ns: 1_000, continued_ns: 2_000 };
    assert!(check_chaos(&quiet, &[server_stop], end, &setup).is_err(), "node 2 made no progress");
}
