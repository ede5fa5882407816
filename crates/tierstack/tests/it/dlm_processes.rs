//! Multi-process lock-manager tests: every lock-manager node is a separate
//! `tierstack dlm-node` process, on `shm` and on `tcp`, for N-CoShED and the
//! SRSL and DQNL baselines.
//!
//! **Stress with a checker.** Five processes (two of them lock servers)
//! contend on three locks with a seeded mix of shared and exclusive holds.
//! Each prints its holds as `granted_ns..released_ns` on `CLOCK_MONOTONIC`
//! (one clock for every process of the host; read after the grant returned
//! and before the release was called, so each recorded interval lies inside
//! the real hold). The checker here, independent of the crate, then demands:
//! no two recorded holds of one lock overlap unless both are shared (under
//! DQNL, which has no shared mode, none may overlap at all); every exclusive
//! hold has a fencing token, and tokens strictly increase in grant order per
//! lock; every requested operation completed; no lock message failed. It also
//! demands that shared holds of different processes did overlap under
//! N-CoShED and SRSL, else the run would show little. A failing run prints
//! its seed; `TIERSTACK_TEST_SEED=<seed>` replays the same operation mix.
//!
//! **A holder killed by SIGKILL, recovery off** (`--no-recovery`). A
//! process holding a lock exclusively is killed while others wait for it.
//! `tierstack dlm status` shows the holder holding and the waiters waiting
//! for it, read one-sidedly. Under N-CoShED each waiter's request names the
//! node it waits for (its predecessor, or the exclusive holder a shared
//! request asked), and when its wait runs out it probes that node and
//! fails with `PeerDead` naming the dead holder; under SRSL the waiters
//! wait for the live server, which still counts the dead holder, and fail
//! with `Timeout` naming the server. Nobody hangs. Recovery is the
//! operator's: `tierstack dlm break 0`, whose fencing floor is above the
//! dead holder's token, and the lock is usable again with tokens above it.
//!
//! The chaos runs are in `dlm_chaos`.
//!
//! Every wait is bounded; a child that misbehaves is killed when its handle drops.

use crate::exe;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use tierstack_base::NodeId;
use tierstack_cluster::{open_fabric, Backend, Topology};
use tierstack_deploy::process::{write_topology, NodeLine};
use tierstack_dlm::{DlmConfig, LockId, LockManager, Scheme};

/// Bound on any one step of a test (a child becoming ready, a run finishing).
pub(crate) const STEP: Duration = Duration::from_secs(90);
/// Bound on a remote operation or a message send, in the topology.
const OP_TIMEOUT_MS: u64 = 3000;

/// A `tierstack dlm-node` child whose output lines are read as they come.
///
/// (`tierstack_deploy::process::ChildNode` reads a child's output only at the
/// end, after closing its standard input; a lock node must keep serving
/// until every peer has finished, so these tests read line by line.)
struct Node {
    id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Node {
    fn spawn(topology: &Path, id: u32, scheme: Scheme, locks: &str, extra: &[String]) -> Node {
        let mut child = Command::new(exe())
            .args(["dlm-node", "--topology", &topology.display().to_string(), "--node", &id.to_string()])
            .args(["--scheme", scheme.name(), "--locks", locks])
            .args(extra)
            .arg("--stop-on-stdin-eof")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting tierstack dlm-node");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("a stdout pipe");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Node { id, child, stdin, lines }
    }

    /// The next output line, waiting at most until `deadline`.
    fn line(&self, deadline: Instant) -> String {
        match self.lines.recv_timeout(deadline.saturating_duration_since(tierstack_base::time::instant_now())) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("node {}: no output line in time", self.id),
            Err(RecvTimeoutError::Disconnected) => panic!("node {}: output ended early", self.id),
        }
    }

    fn json(&self, deadline: Instant) -> Value {
        let line = self.line(deadline);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("node {}: bad line {line:?}: {e}", self.id))
    }

    fn expect_ready(&self) {
        assert_eq!(self.line(tierstack_base::time::instant_now() + STEP), "ready", "node {}", self.id);
    }

    fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "go").and_then(|()| stdin.flush()).expect("sending go");
    }

    /// Lines until the summary: the holds and failures, then the summary.
    fn run_report(&self, deadline: Instant) -> (Vec<Value>, Value) {
        let mut records = Vec::new();
        loop {
            let value = self.json(deadline);
            if value.get("done").is_some() {
                return (records, value);
            }
            if value.get("event").is_none() {
                records.push(value);
            }
        }
    }

    /// Closes standard input; returns the `stopped` line (skipping any
    /// unread output before it) and the exit status.
    fn stop(mut self) -> (Value, ExitStatus) {
        self.stdin.take();
        let deadline = tierstack_base::time::instant_now() + STEP;
        let stopped = loop {
            let value = self.json(deadline);
            if value.get("stopped").is_some() {
                break value;
            }
        };
        assert_eq!(stopped["stopped"], self.id, "node {}: {stopped}", self.id);
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for a child") {
                return (stopped, status);
            }
            assert!(tierstack_base::time::instant_now() < deadline, "node {} did not exit", self.id);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        // SAFETY: signalling our own child process, which has not been reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(rc, 0, "SIGKILL of node {}", self.id);
        self.child.wait().expect("reaping the killed node");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Only a failing test gets here with a live child.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A topology of `servers` lock servers (role app) followed by passive nodes.
fn topology(backend: Backend, name: &str, servers: u32, nodes: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<NodeLine> =
        (0..nodes).map(|id| NodeLine { id, role: if id < servers { "app" } else { "passive" }, cpu: None }).collect();
    let path = write_topology(dir.path(), name, backend, OP_TIMEOUT_MS, &lines).unwrap();
    (dir, path)
}

pub(crate) fn args(pairs: &[(&str, String)]) -> Vec<String> {
    pairs.iter().flat_map(|(flag, value)| [flag.to_string(), value.clone()]).collect()
}

// ---------------------------------------------------------------- the checker

/// One recorded hold.
#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub(crate) node: u64,
    pub(crate) lock: u64,
    pub(crate) shared: bool,
    pub(crate) token: Option<u64>,
    pub(crate) start_ns: u64,
    pub(crate) granted_ns: u64,
    pub(crate) released_ns: u64,
}

impl Hold {
    pub(crate) fn parse(value: &Value) -> Hold {
        let field = |name: &str| value[name].as_u64().unwrap_or_else(|| panic!("hold without {name}: {value}"));
        let shared = match value["mode"].as_str() {
            Some("shared") => true,
            Some("exclusive") => false,
            _ => panic!("hold without a mode: {value}"),
        };
        let hold = Hold {
            node: field("node"),
            lock: field("lock"),
            shared,
            token: value["token"].as_u64(),
            start_ns: field("start_ns"),
            granted_ns: field("granted_ns"),
            released_ns: field("released_ns"),
        };
        assert!(hold.start_ns <= hold.granted_ns && hold.granted_ns <= hold.released_ns, "{value}");
        hold
    }

    fn overlaps(&self, other: &Hold) -> bool {
        self.granted_ns < other.released_ns && other.granted_ns < self.released_ns
    }
}

/// What a history that passed the checker showed.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    exclusive_holds: usize,
    /// Pairs of shared holds of different processes that overlapped.
    shared_overlaps: usize,
    /// Exclusive requests made while another process held the lock: they
    /// had to wait, so mutual exclusion was actually exercised.
    contended: usize,
}

/// Mutual exclusion (shared holds may overlap only if `shared_may_overlap`)
/// and strictly increasing fencing tokens in grant order, per lock.
pub(crate) fn check(holds: &[Hold], shared_may_overlap: bool) -> Result<Checked, String> {
    let mut by_lock: BTreeMap<u64, Vec<&Hold>> = BTreeMap::new();
    for hold in holds {
        by_lock.entry(hold.lock).or_default().push(hold);
    }
    let mut checked = Checked::default();
    for (lock, mut holds) in by_lock {
        holds.sort_by_key(|h| h.granted_ns);
        for (i, a) in holds.iter().enumerate() {
            // Sorted by grant time: only later grants before a's release can overlap it.
            for b in holds[i + 1..].iter().take_while(|b| b.granted_ns < a.released_ns) {
                if !a.overlaps(b) {
                    continue;
                }
                if a.shared && b.shared && shared_may_overlap {
                    checked.shared_overlaps += usize::from(a.node != b.node);
                } else {
                    return Err(format!("lock {lock}: overlapping holds {a:?} and {b:?}"));
                }
            }
        }
        let mut last: Option<&Hold> = None;
        for hold in holds.iter().filter(|h| !h.shared) {
            let token = hold.token.ok_or_else(|| format!("lock {lock}: exclusive hold without a token: {hold:?}"))?;
            if let Some(previous) = last {
                if previous.token >= Some(token) {
                    return Err(format!("lock {lock}: token {token} granted after {previous:?}: {hold:?}"));
                }
            }
            last = Some(hold);
            checked.exclusive_holds += 1;
            checked.contended += usize::from(holds.iter().any(|other| {
                other.node != hold.node && other.granted_ns <= hold.start_ns && hold.start_ns < other.released_ns
            }));
        }
    }
    Ok(checked)
}

#[test]
fn the_checker_rejects_what_it_must() {
    let hold = |node, shared, token, granted_ns, released_ns| Hold {
        node,
        lock: 0,
        shared,
        token,
        start_ns: granted_ns,
        granted_ns,
        released_ns,
    };
    let shared_pair = [hold(1, true, None, 10, 20), hold(2, true, None, 15, 25)];
    assert_eq!(check(&shared_pair, true).unwrap().shared_overlaps, 1);
    assert!(check(&shared_pair, false).is_err(), "DQNL: shared holds must not overlap");
    let exclusives = [hold(1, false, Some(1), 10, 20), hold(2, false, Some(2), 19, 25)];
    assert!(check(&exclusives, true).is_err(), "two exclusive holds overlapping");
    let mixed = [hold(1, true, None, 10, 20), hold(2, false, Some(1), 19, 25)];
    assert!(check(&mixed, true).is_err(), "an exclusive overlapping a shared hold");
    let mut touching = [hold(1, false, Some(1), 10, 20), hold(2, false, Some(2), 20, 25)];
    touching[1].start_ns = 12;
    let checked = check(&touching, true).unwrap();
    assert_eq!(checked.exclusive_holds, 2, "holds that only touch are disjoint");
    assert_eq!(checked.contended, 1, "the second was requested during the first");
    let stale = [hold(1, false, Some(2), 10, 20), hold(2, false, Some(2), 21, 25)];
    assert!(check(&stale, true).is_err(), "a token that does not increase");
    let untokened = [hold(1, false, None, 10, 20)];
    assert!(check(&untokened, true).is_err(), "an exclusive hold without a token");
}

// ---------------------------------------------------------------- stress

const STRESS_NODES: u32 = 5;
const STRESS_SERVERS: u32 = 2;
const STRESS_LOCKS: &str = "0..3";

fn stress(backend: Backend, scheme: Scheme, ops: usize) {
    let seed = tierstack_testkit::test_seed();
    let label = format!("{} {} seed {seed}", scheme.name(), backend.name());
    eprintln!("dlm_processes {label} (replay with TIERSTACK_TEST_SEED={seed})");
    let (_dir, topology) =
        topology(backend, &format!("dlm-{}-{}", scheme.name(), backend.name()), STRESS_SERVERS, STRESS_NODES);
    let extra = args(&[
        ("--ops", ops.to_string()),
        ("--shared-percent", "50".into()),
        ("--seed", seed.to_string()),
        ("--hold-us", "200".into()),
        ("--acquire-timeout-ms", "60000".into()),
    ]);
    let mut nodes: Vec<Node> = (0..STRESS_NODES)
        .map(|id| {
            let mut extra = extra.clone();
            extra.push("--wait-go".into());
            Node::spawn(&topology, id, scheme, STRESS_LOCKS, &extra)
        })
        .collect();
    for node in &nodes {
        node.expect_ready();
    }
    for node in &mut nodes {
        node.go();
    }
    let deadline = tierstack_base::time::instant_now() + STEP;
    let mut holds = Vec::new();
    for node in &nodes {
        let (records, summary) = node.run_report(deadline);
        assert_eq!(summary["errors"], 0, "{label}: node {} failed: {records:?}", node.id);
        assert_eq!(summary["holds"], ops as u64, "{label}: node {}", node.id);
        assert_eq!(records.len(), ops, "{label}: node {} reported every hold", node.id);
        holds.extend(records.iter().map(Hold::parse));
    }
    // Every node has finished: nobody waits for anybody; stop them all.
    for node in nodes {
        let id = node.id;
        let (stopped, status) = node.stop();
        assert!(status.success(), "{label}: node {id} exited with {status}");
        assert_eq!(stopped["message_errors"], 0, "{label}: node {id} mishandled lock messages");
    }

    let shared_may_overlap = scheme != Scheme::Dqnl;
    let checked = check(&holds, shared_may_overlap).unwrap_or_else(|v| panic!("{label}: {v}"));
    eprintln!("{label}: {} holds, {checked:?}", holds.len());
    assert_eq!(holds.len(), ops * STRESS_NODES as usize);
    assert!(checked.contended > 0, "{label}: no exclusive request ever waited for another process");
    let locks_used: std::collections::BTreeSet<u64> = holds.iter().map(|h| h.lock).collect();
    assert_eq!(locks_used.len(), 3, "{label}: every lock was used");
    if shared_may_overlap {
        assert!(checked.shared_overlaps > 0, "{label}: shared holds of different processes never overlapped");
    }
}

/// Operations per process: fewer on tcp, where each one costs round trips.
const STRESS_OPS_SHM: usize = 120;
const STRESS_OPS_TCP: usize = 80;

#[test]
fn stress_ncoshed_shm() {
    stress(Backend::Shm, Scheme::CoShed, STRESS_OPS_SHM);
}

#[test]
fn stress_ncoshed_tcp() {
    stress(Backend::Tcp, Scheme::CoShed, STRESS_OPS_TCP);
}

#[test]
fn stress_srsl_shm() {
    stress(Backend::Shm, Scheme::Srsl, STRESS_OPS_SHM);
}

#[test]
fn stress_srsl_tcp() {
    stress(Backend::Tcp, Scheme::Srsl, STRESS_OPS_TCP);
}

#[test]
fn stress_dqnl_shm() {
    stress(Backend::Shm, Scheme::Dqnl, STRESS_OPS_SHM);
}

#[test]
fn stress_dqnl_tcp() {
    stress(Backend::Tcp, Scheme::Dqnl, STRESS_OPS_TCP);
}

// ---------------------------------------------------------------- a killed holder

/// How long the waiters of the killed holder wait before they probe it.
const WAITER_TIMEOUT_MS: u64 = 4000;
const HOME: u32 = 0;
const HOLDER: u32 = 1;
/// Two shared waiters, then an exclusive one.
const WAITERS: [(u32, bool); 3] = [(2, true), (3, true), (4, false)];
/// The operator's node (the `dlm` tools, then this test process).
const ADMIN: u32 = 5;

/// Runs `tierstack dlm <words> --topology T --node ADMIN --scheme S` and
/// returns its JSON output.
fn dlm_tool(topology: &Path, scheme: Scheme, words: &[&str]) -> Value {
    let output = Command::new(exe())
        .arg("dlm")
        .args(words)
        .args(["--topology", &topology.display().to_string(), "--node", &ADMIN.to_string()])
        .args(["--scheme", scheme.name()])
        .stderr(Stdio::inherit())
        .output()
        .expect("running tierstack dlm");
    assert!(output.status.success(), "tierstack dlm {words:?} failed");
    let text = String::from_utf8(output.stdout).unwrap();
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("tierstack dlm {words:?}: {text:?}: {e}"))
}

/// Waits until the holder reports having handled at least `n` lock messages.
fn await_handled(holder: &Node, n: u64) {
    let deadline = tierstack_base::time::instant_now() + STEP;
    loop {
        let value = holder.json(deadline);
        if value["event"] == "handled" && value["messages"].as_u64().unwrap() >= n {
            return;
        }
    }
}

fn killed_holder(backend: Backend, scheme: Scheme) {
    let label = format!("{} {}", scheme.name(), backend.name());
    let (_dir, topology) = topology(backend, &format!("dlm-kill-{}-{}", scheme.name(), backend.name()), 1, 6);
    let lock = "0..1";
    let no_recovery = vec!["--no-recovery".to_string()];
    let home =
        Node::spawn(&topology, HOME, scheme, lock, &[args(&[("--ops", "0".into())]), no_recovery.clone()].concat());
    home.expect_ready();
    let hold_forever =
        args(&[("--ops", "1".into()), ("--shared-percent", "0".into()), ("--hold-us", "600000000".into())]);
    let mut holder = Node::spawn(
        &topology,
        HOLDER,
        scheme,
        lock,
        &[hold_forever, vec!["--announce".into()], no_recovery.clone()].concat(),
    );
    holder.expect_ready();
    let granted = holder.json(tierstack_base::time::instant_now() + STEP);
    assert_eq!(granted["event"], "granted", "{label}: {granted}");
    let dead_token = granted["token"].as_u64().expect("an exclusive grant has a token");

    let mut waiters: Vec<Node> = WAITERS
        .iter()
        .map(|&(id, shared)| {
            let mut extra = args(&[
                ("--ops", "1".into()),
                ("--shared-percent", if shared { "100" } else { "0" }.into()),
                ("--acquire-timeout-ms", WAITER_TIMEOUT_MS.to_string()),
            ]);
            extra.push("--wait-go".into());
            extra.extend(no_recovery.clone());
            Node::spawn(&topology, id, scheme, lock, &extra)
        })
        .collect();
    for waiter in &waiters {
        waiter.expect_ready();
    }
    if scheme == Scheme::CoShed {
        // Shared requests ask the exclusive holder (one message each), then
        // the exclusive request names it as predecessor (one more): queued
        // in this order, all three wait for the holder.
        waiters[0].go();
        waiters[1].go();
        await_handled(&holder, 2);
        waiters[2].go();
        await_handled(&holder, 3);
    } else {
        // SRSL: requests go to the server, which queues them behind the holder.
        for waiter in &mut waiters {
            waiter.go();
        }
    }
    // The operator's view, read one-sidedly: the holder holds, and (N-CoShED)
    // each waiter names the node it waits for.
    let status = dlm_tool(&topology, scheme, &["status", "--json"]);
    let entry = |node: u32| -> Value {
        let view = status["nodes"].as_array().unwrap().iter().find(|n| n["node"] == node).unwrap().clone();
        view["locks"][0].clone()
    };
    assert_eq!(entry(HOLDER)["state"], "Holding { mode: Exclusive }", "{label}: {status}");
    if scheme == Scheme::CoShed {
        for &(id, _) in &WAITERS {
            assert!(entry(id)["state"].as_str().unwrap().starts_with("Waiting"), "{label}: {status}");
            assert_eq!(entry(id)["waits_for"], HOLDER, "{label}: node {id}: {status}");
        }
        assert_eq!(status["homes"][0]["locks"][0]["tail"], WAITERS[2].0, "{label}: the last exclusive is the tail");
    }
    holder.kill();

    // No waiter hangs: each fails with the documented typed error.
    let (expected_error, expected_peer) = match scheme {
        Scheme::Srsl => ("timeout", HOME),
        _ => ("peer_dead", HOLDER),
    };
    let deadline = tierstack_base::time::instant_now() + STEP;
    for waiter in &waiters {
        let (records, summary) = waiter.run_report(deadline);
        assert_eq!(summary["errors"], 1, "{label}: node {}: {records:?}", waiter.id);
        assert_eq!(summary["holds"], 0, "{label}: node {}", waiter.id);
        let failure = &records[0];
        assert_eq!(failure["phase"], "acquire", "{label}: {failure}");
        assert_eq!(failure["error"], expected_error, "{label}: node {}: {failure}", waiter.id);
        assert_eq!(failure["peer"], expected_peer, "{label}: node {}: {failure}", waiter.id);
    }

    // Recovery is the operator's: `tierstack dlm break`. The floor fences
    // the dead holder out, and the lock works again.
    let broken = dlm_tool(&topology, scheme, &["break", "0", "--no-recovery"]);
    let floor = broken["floor"].as_u64().expect("a floor");
    assert!(floor > dead_token, "{label}: floor {floor} must exceed the dead holder's token {dead_token}");
    let topo = Topology::load(&topology).unwrap();
    let fabric = open_fabric(&topo, NodeId(ADMIN)).unwrap();
    let config = DlmConfig::new(scheme, vec![NodeId(HOME)], topo.node_ids()).with_recovery(false);
    let admin = LockManager::start(fabric, config).unwrap();
    let guard = admin.acquire_exclusive(LockId(0), Duration::from_millis(OP_TIMEOUT_MS * 10)).unwrap();
    assert!(guard.fencing_token() > floor, "{label}: a token after the break is above the floor");
    guard.release().unwrap();
    admin.acquire_shared(LockId(0), Duration::from_millis(OP_TIMEOUT_MS * 10)).unwrap().release().unwrap();
    drop(admin);

    for waiter in waiters {
        let id = waiter.id;
        let (_, status) = waiter.stop();
        assert!(!status.success(), "{label}: node {id} reports its failed operation in its exit status");
    }
    let (stopped, status) = home.stop();
    assert!(status.success(), "{label}: the home exited with {status}");
    // SRSL's server sends the break notice to every queued node, the dead
    // holder too: that one send fails, and only that one.
    let undeliverable = u64::from(scheme == Scheme::Srsl);
    assert_eq!(stopped["message_errors"], undeliverable, "{label}: the home's failed lock messages");
}

#[test]
fn a_killed_holder_is_reported_dead_and_break_lock_recovers_ncoshed_shm() {
    killed_holder(Backend::Shm, Scheme::CoShed);
}

#[test]
fn a_killed_holder_is_reported_dead_and_break_lock_recovers_ncoshed_tcp() {
    killed_holder(Backend::Tcp, Scheme::CoShed);
}

#[test]
fn a_killed_holder_leaves_srsl_waiters_timing_out_at_the_server_shm() {
    killed_holder(Backend::Shm, Scheme::Srsl);
}
