//! The monitoring service between processes (shm): records read while their
//! writers hammer them are never torn; a stopped back end is still read by
//! RDMA-Sync while every other scheme goes stale; a killed one is reported
//! dead by every scheme; of several agent processes claiming a node's role
//! word, exactly one wins each round.
//!
//! The child processes are this test binary run again on its `child_entry`
//! test with the role in an environment variable; each child exits when its
//! standard input closes, so a failed test leaves no process behind.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_monitor::reconfig::{claim, read_role, register_role, Claim, RoleWord, ROLE_REGION, ROLE_WORD_OFFSET};
use tierstack_monitor::{
    open_source, AgentConfig, BackendAddress, Gauge, Health, KernelSample, LoadPublisher, LoadSource, MonitorAgent,
    Reading, Scheme, SourceConfig,
};
use tierstack_testkit::child::{self, ChildProcess};

/// A bound on every wait, only so that a broken service fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);
const ROLE: &str = "TIERSTACK_MONITOR_CHILD_ROLE";
const ROOT: &str = "TIERSTACK_MONITOR_CHILD_ROOT";
const NODE: &str = "TIERSTACK_MONITOR_CHILD_NODE";
/// The test the children run.
const CHILD_ENTRY: &str = "child_entry";
/// Every test's cluster: the parent is node 0, children 1 to 5.
const NODES: [u32; 6] = [0, 1, 2, 3, 4, 5];
/// Writer threads of the hammered back end (nested guards: three levels).
const WRITERS: usize = 3;
/// Each reader reads each RDMA scheme until the value changed this often…
const CHANGES_SEEN: u32 = 500;
/// … or for this long. A reader on a crowded machine (2 cores shared with
/// other tests: the writers run only when the scheduler lets them) may see
/// fewer changes; the test fails below `CHANGES_MIN`, which still proves
/// reads raced writes. (A count of reads as the bound is load-dependent: a
/// reader alone on its core reads millions of times between two writer
/// slices; this test failed once in CI with that bound.)
const READ_FOR: Duration = Duration::from_secs(30);
const CHANGES_MIN: u32 = 50;

fn fabric(root: &Path, node: u32) -> Arc<ShmFabric> {
    let config = ShmConfig::new(root, NodeId(node)).with_nodes(NODES.iter().copied().map(NodeId).collect());
    ShmFabric::open(config).unwrap()
}

fn source_config() -> SourceConfig {
    SourceConfig {
        stale_after: Duration::from_millis(100),
        liveness_every: Duration::from_millis(20),
        socket_timeout: Duration::from_millis(200),
        suspect_after: Some(SUSPECT_AFTER),
    }
}

/// The liveness bound of these tests: 10 heartbeats.
const SUSPECT_AFTER: Duration = Duration::from_millis(100);

/// A record the hammer writes at `t`: its kernel fields are functions of
/// `t`, so a record pieced together from two writes is detected.
fn hammer_kernel(t: u64) -> KernelSample {
    KernelSample {
        procs_running: Some((t % 1_000_003) as u32),
        cpu_busy_permille: Some((t % 1000) as u32),
        mem_available_kib: Some(t.wrapping_mul(3)),
        psi_cpu_some_centi: Some((t >> 20) as u32),
    }
}

/// What must hold of every reading of the hammered back end.
fn violation(reading: &Reading, check_kernel: bool) -> Option<String> {
    let c = reading.record.counters;
    // Each writer holds queue inside in-flight inside running: any
    // consistent snapshot has running >= in flight >= queued.
    if !(c.running_threads >= c.in_flight_requests && c.in_flight_requests >= c.queue_len)
        || usize::from(c.running_threads) > WRITERS
    {
        return Some(format!("impossible counters {c:?}"));
    }
    if check_kernel && reading.record.t_ns != 0 && reading.record.kernel != hammer_kernel(reading.record.t_ns) {
        return Some(format!("torn record {:?}", reading.record));
    }
    None
}

// ------------------------------------------------------------------ children

/// Not a test: the entry point of the child processes (does nothing unless
/// started by a test as a child).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let root = PathBuf::from(std::env::var(ROOT).unwrap());
    let node: u32 = std::env::var(NODE).unwrap().parse().unwrap();
    let say = |line: &str| {
        let mut out = std::io::stdout().lock();
        // After a newline: libtest may have begun a line of its own.
        writeln!(out, "\n@@{line}").unwrap();
        out.flush().unwrap();
    };
    let exit_when_stdin_closes = || {
        std::thread::spawn(|| {
            let mut line = String::new();
            while std::io::stdin().lock().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                line.clear();
            }
            std::process::exit(0);
        })
    };
    match role.as_str() {
        // Writer threads take nested guards as fast as they can; another
        // thread rewrites the sampled record without pause.
        "hammered-back-end" => {
            exit_when_stdin_closes();
            let fabric = fabric(&root, node);
            let publisher = LoadPublisher::register(fabric.as_ref()).unwrap();
            for i in 0..WRITERS {
                let publisher = publisher.clone();
                std::thread::spawn(move || loop {
                    let running = publisher.enter(Gauge::RunningThreads);
                    let in_flight = publisher.enter(Gauge::InFlightRequests);
                    if i % 2 == 0 {
                        let queued = publisher.enter(Gauge::QueueLength);
                        drop(queued);
                    }
                    drop(in_flight);
                    drop(running);
                });
            }
            let writer = publisher.clone();
            std::thread::spawn(move || loop {
                let t = host_monotonic_ns();
                writer.write_record(hammer_kernel(t), t).unwrap();
            });
            say("ready");
            loop {
                std::thread::park();
            }
        }
        // Reads node 1 through both RDMA schemes and reports violations.
        "reader" => {
            exit_when_stdin_closes();
            let fabric: Arc<dyn Fabric> = fabric(&root, node);
            let mut report = Vec::new();
            for scheme in [Scheme::RdmaSync, Scheme::RdmaAsync] {
                let address = BackendAddress { node: Some(NodeId(1)), socket: None };
                let source = open_source(scheme, Some(fabric.clone()), &[address], source_config()).unwrap();
                let (mut bad, mut nonzero, mut first) = (0u32, 0u32, None);
                // Until the value changed often enough under the reader's
                // eyes (a reader that ran while the writers slept proves nothing).
                let (mut changes, mut previous, mut reads) = (0u32, None, 0u64);
                let until = tierstack_base::time::instant_now() + READ_FOR;
                while changes < CHANGES_SEEN && (reads % 1024 != 0 || tierstack_base::time::instant_now() < until) {
                    reads += 1;
                    let reading = source.read(0);
                    let value =
                        (reading.record.counters, if scheme == Scheme::RdmaAsync { reading.record.t_ns } else { 0 });
                    changes += u32::from(previous.is_some() && previous != Some(value));
                    previous = Some(value);
                    assert_ne!(reading.health, Health::Dead);
                    if let Some(what) = violation(&reading, scheme == Scheme::RdmaAsync) {
                        bad += 1;
                        first.get_or_insert(what);
                    }
                    nonzero += u32::from(reading.record.counters.running_threads > 0);
                }
                report.push(format!(
                    "{scheme} bad {bad} nonzero {nonzero} changes {changes} reads {reads} first {first:?}"
                ));
            }
            say(&report.join(" | "));
        }
        // A back end with a monitor thread (1 ms), a socket server and a
        // heartbeat (a thread stands in for a serving runtime); says its
        // socket address.
        "back-end" => {
            exit_when_stdin_closes();
            let fabric = fabric(&root, node);
            let publisher = LoadPublisher::register(fabric.as_ref()).unwrap();
            let config = AgentConfig {
                interval: Duration::from_millis(1),
                write_record: true,
                socket_listen: Some("127.0.0.1:0".parse().unwrap()),
            };
            let agent = MonitorAgent::start(publisher.clone(), config).unwrap();
            let _busy = [publisher.enter(Gauge::RunningThreads), publisher.enter(Gauge::RunningThreads)];
            let beating = publisher.clone();
            std::thread::spawn(move || loop {
                beating.beat();
                std::thread::sleep(tierstack_monitor::publisher::HEARTBEAT);
            });
            say(&format!("ready {}", agent.socket_addr().unwrap()));
            loop {
                std::thread::park();
            }
        }
        // On each line "go": read node 0's role word, claim it once, say
        // whether it won. Exits when its standard input closes.
        "claimer" => {
            let fabric = fabric(&root, node);
            let region = fabric.connect(NodeId(0), ROLE_REGION).unwrap();
            say("ready");
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let Ok(_go) = line else { break };
                let seen = read_role(region.as_ref()).unwrap().role;
                match claim(region.as_ref(), seen, node as u16).unwrap() {
                    Claim::Won(_) => say("won"),
                    Claim::Lost(_) => say("lost"),
                }
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

/// A child running `role` as `node` (this binary re-run on `child_entry`);
/// its answers are the lines it prints after `@@`.
fn start(role: &str, root: &Path, node: u32) -> ChildProcess {
    let mut command = child::reentry(CHILD_ENTRY);
    command.env(ROLE, role).env(ROOT, root).env(NODE, node.to_string()).stderr(Stdio::inherit());
    ChildProcess::spawn(&mut command).with_marker("@@").with_bound(BOUND)
}

/// Reads until `done` holds, within the bound.
fn read_until(source: &dyn LoadSource, done: impl Fn(&Reading) -> bool) -> Reading {
    let deadline = tierstack_base::time::instant_now() + BOUND;
    loop {
        let reading = source.read(0);
        if done(&reading) || tierstack_base::time::instant_now() > deadline {
            return reading;
        }
        std::thread::yield_now();
    }
}

// --------------------------------------------------------------------- tests

#[test]
fn readers_in_other_processes_never_see_a_torn_record_or_impossible_counters() {
    let root = tempfile::tempdir().unwrap();
    let mut back_end = start("hammered-back-end", root.path(), 1);
    assert_eq!(back_end.line(), "ready");
    let mut readers: Vec<ChildProcess> = (2..=3).map(|node| start("reader", root.path(), node)).collect();
    for reader in &mut readers {
        // Two schemes of at most READ_FOR each, after a start under load.
        let report = reader.line_within(2 * READ_FOR + BOUND);
        for part in report.split(" | ") {
            assert!(part.contains(" bad 0 "), "{report}");
            // The counters moved while being read (the test exercised something).
            let nonzero: u32 = part.split(" nonzero ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
            assert!(nonzero > 0, "{report}");
            let changes: u32 = part.split(" changes ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
            assert!(changes >= CHANGES_MIN, "{report}");
        }
    }
    back_end.kill();
}

#[test]
fn a_stopped_back_end_is_suspect_for_every_scheme_and_a_killed_one_is_dead() {
    let root = tempfile::tempdir().unwrap();
    let parent: Arc<dyn Fabric> = fabric(root.path(), 0);
    let mut back_end = start("back-end", root.path(), 1);
    let socket = back_end.line().strip_prefix("ready ").unwrap().parse().unwrap();
    let address = [BackendAddress { node: Some(NodeId(1)), socket: Some(socket) }];
    let sources: Vec<Arc<dyn LoadSource>> = Scheme::ALL
        .iter()
        .map(|scheme| open_source(*scheme, Some(parent.clone()), &address, source_config()).unwrap())
        .collect();
    for source in &sources {
        let reading = read_until(source.as_ref(), |r| r.health == Health::Fresh);
        assert_eq!(reading.health, Health::Fresh, "{}", source.scheme());
        assert_eq!(reading.record.counters.running_threads, 2, "{}", source.scheme());
    }

    // Without the liveness check, a stopped node's frozen counters read as
    // fresh forever through RDMA-Sync: the hung-node black hole.
    let blind_config = SourceConfig { suspect_after: None, ..source_config() };
    let blind = open_source(Scheme::RdmaSync, Some(parent.clone()), &address, blind_config).unwrap();
    back_end.stop();
    let stopped = host_monotonic_ns();
    for source in &sources {
        let scheme = source.scheme();
        let reading = read_until(source.as_ref(), |r| r.health == Health::Suspect);
        assert_eq!(reading.health, Health::Suspect, "{scheme}: a stopped node is suspect, not dead");
        assert_eq!(reading.record.counters.running_threads, 2, "{scheme}: the last value is kept");
        if scheme == Scheme::RdmaSync {
            // One-sided: the read itself succeeded with nobody running there.
            assert!(reading.record.t_ns >= stopped, "{scheme}: read after the stop");
        }
        // It stays suspect while stopped (and a read costs no wait: see
        // `a_hung_read_is_not_retried_within_the_bound`).
        assert_eq!(source.read(0).health, Health::Suspect, "{scheme}");
    }
    for _ in 0..100 {
        let reading = blind.read(0);
        assert_eq!((reading.health, reading.record.counters.running_threads), (Health::Fresh, 2), "blind rdma-sync");
    }
    back_end.signal(libc::SIGCONT);
    for source in &sources {
        // Resumed: the heartbeat moves again (the quiet window after a hung
        // read ends within the bound).
        let reading = read_until(source.as_ref(), |r| r.health == Health::Fresh);
        assert_eq!(reading.health, Health::Fresh, "{} after SIGCONT", source.scheme());
    }

    back_end.kill();
    for source in &sources {
        let reading = read_until(source.as_ref(), |r| r.health == Health::Dead);
        assert_eq!(reading.health, Health::Dead, "{}: a killed node is dead, not stale forever", source.scheme());
    }
}

#[test]
fn of_several_agent_processes_exactly_one_claims_the_role_word_each_round() {
    const ROUNDS: u32 = 40;
    let root = tempfile::tempdir().unwrap();
    let owner = fabric(root.path(), 0);
    let role = register_role(owner.as_ref(), 0).unwrap();
    let mut claimers: Vec<ChildProcess> = (1..=4).map(|node| start("claimer", root.path(), node)).collect();
    for claimer in &mut claimers {
        assert_eq!(claimer.line(), "ready");
    }
    for round in 0..ROUNDS {
        let unclaimed = RoleWord { site: 0, epoch: round + 1, holder: None };
        role.memory().store_u64(ROLE_WORD_OFFSET, unclaimed.to_word()).unwrap();
        for claimer in &mut claimers {
            claimer.tell("go");
        }
        let won = claimers.iter_mut().map(|c| c.line()).filter(|line| line == "won").count();
        assert_eq!(won, 1, "round {round}");
        let word = RoleWord::from_word(role.memory().load_u64(ROLE_WORD_OFFSET).unwrap());
        assert_eq!(RoleWord { holder: None, ..word }, unclaimed, "a claim changes only the holder");
        assert!(word.holder.is_some_and(|h| (1..=4).contains(&h)));
    }
}
