//! Lock-manager nodes as separate OS processes, for `tierstack bench dlm`:
//! both ends of the pipe protocol by which the benchmark drives them.
//!
//! Each node is a `tierstack dlm-bench-node --topology T --node I` process:
//! it attaches to the fabric, prints `ready`, then runs the commands it reads
//! on standard input, one per line, until standard input closes
//! ([`serve_node`]). [`ProcessNodes`] is the driver, a
//! [`LockNodes`] like the in-process [`crate::dlm::measure::ThreadNodes`],
//! so the same measurement code runs on both.
//!
//! Commands and their replies (`ok …` or `err MESSAGE`, one line each, in
//! order); node index 0 serves the lock; times are `CLOCK_MONOTONIC`
//! nanoseconds, comparable across the host's processes:
//!
//! ```text
//! start SCHEME PREFIX [SERVERS]  ok                 fresh manager; the first SERVERS (default 1) serve
//!                                                   locks and create the lock
//! home                           ok INDEX           the index of the lock's current home, as this node sees it
//! totals                         ok SENT HANDLED ERRORS
//! hold                           ok                 exclusive, kept until release
//! release                        ok RELEASED_NS     clock read just before the release
//! wait MODE                      ok                 acquire in the background, then:
//!                                granted GRANTED_NS   (or: waiter-err MESSAGE), later
//! uncontended MODE PAIRS         ok NS NS …
//! contend PERCENT PAIRS SEED AT  ok BEGAN_NS ENDED_NS   starts at clock AT
//! ```
//!
//! MODE is `shared` or `exclusive`. A `granted` line may come between any
//! reply lines; the driver sets it aside until it asks for it.

use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_cluster::Backend;
use tierstack_deploy::process::{write_topology, ChildNode, NodeLine};
use tierstack_dlm::harness::{
    contend_pairs, hold_exclusive, overall_span, release_timed, start_manager_with_servers, uncontended_pairs_ns,
    wait_and_release, LockNodes, MessageTotals, BENCH_LOCK, BENCH_WAIT,
};
use tierstack_dlm::{Grant, LockError, LockManager, LockMode, Scheme};
use tierstack_fabric::Fabric;

/// Longest a reply may take beyond the node's own bounded waits.
const REPLY_SLACK: Duration = Duration::from_secs(10);
/// Lead time of a `contend` start, per node told: every node must have read
/// its command before the start time.
const CONTEND_LEAD_PER_NODE: Duration = Duration::from_millis(2);
/// Fabric operation timeout of the generated topology.
const OP_TIMEOUT_MS: u64 = 1000;

/// The node side: serves the commands read from `input` until it closes.
/// `nodes` are every node's ids in index order; the first serves the lock.
pub fn serve_node(
    fabric: Arc<dyn Fabric>,
    nodes: Vec<NodeId>,
    input: impl BufRead,
    output: impl Write + Send + 'static,
) -> Result<()> {
    let output = Arc::new(Mutex::new(output));
    let mut node = NodeState { fabric, nodes, manager: None, hold: None, waiter: None };
    for line in input.lines() {
        let line = line.context("reading a command")?;
        let reply = match node.command(&line, &output) {
            Ok(fields) if fields.is_empty() => "ok".to_string(),
            Ok(fields) => format!("ok {fields}"),
            Err(e) => format!("err {}", e.replace('\n', " ")),
        };
        emit(&output, &reply)?;
    }
    node.join_waiter();
    Ok(())
}

fn emit(output: &Mutex<impl Write>, line: &str) -> Result<()> {
    let mut output = output.lock().map_err(|_| anyhow::anyhow!("output lock poisoned"))?;
    writeln!(output, "{line}")?;
    output.flush()?;
    Ok(())
}

struct NodeState {
    fabric: Arc<dyn Fabric>,
    nodes: Vec<NodeId>,
    manager: Option<Arc<LockManager>>,
    hold: Option<Grant>,
    waiter: Option<JoinHandle<()>>,
}

impl NodeState {
    fn manager(&self) -> Result<&Arc<LockManager>, String> {
        self.manager.as_ref().ok_or_else(|| "no manager runs: send start first".to_string())
    }

    fn join_waiter(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            // The waiter reports its own outcome; a panic has nothing left to report.
            let _ = waiter.join();
        }
    }

    /// Runs one command; returns the reply's fields.
    fn command(&mut self, line: &str, output: &Arc<Mutex<impl Write + Send + 'static>>) -> Result<String, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| -> Result<u64, String> {
            let word = words.get(i).ok_or_else(|| format!("{line:?}: argument {i} missing"))?;
            word.parse().map_err(|e| format!("{line:?}: argument {i}: {e}"))
        };
        let mode = |i: usize| words.get(i).copied().unwrap_or("").parse::<LockMode>();
        let fail = |e: LockError| e.to_string();
        match words.first().copied() {
            Some("start") => {
                let scheme: Scheme = words.get(1).ok_or("start needs a scheme")?.parse()?;
                let prefix = words.get(2).ok_or("start needs a region prefix")?;
                let servers = if words.len() > 3 { number(3)? as usize } else { 1 };
                self.hold = None;
                self.join_waiter();
                // The old manager must give up the fabric's lock channel first.
                self.manager = None;
                let manager =
                    start_manager_with_servers(&self.fabric, &self.nodes, scheme, prefix, servers).map_err(fail)?;
                self.manager = Some(Arc::new(manager));
                Ok(String::new())
            }
            Some("home") => {
                let placement = self.manager()?.placement(BENCH_LOCK).map_err(fail)?;
                let index = self.nodes.iter().position(|n| *n == placement.home).ok_or("the home is not a node")?;
                Ok(index.to_string())
            }
            Some("totals") => {
                let stats = self.manager()?.stats();
                Ok(format!("{} {} {}", stats.messages_sent, stats.messages_handled, stats.message_errors))
            }
            Some("hold") => {
                self.hold = Some(hold_exclusive(self.manager()?).map_err(fail)?);
                Ok(String::new())
            }
            Some("release") => {
                let grant = self.hold.take().ok_or("nothing held")?;
                Ok(release_timed(self.manager()?, &grant).map_err(fail)?.to_string())
            }
            Some("wait") => {
                let mode = mode(1)?;
                let manager = self.manager()?.clone();
                self.join_waiter();
                let output = output.clone();
                let waiter = std::thread::Builder::new()
                    .name("bench-waiter".into())
                    .spawn(move || {
                        let line = match wait_and_release(&manager, mode) {
                            Ok(granted_ns) => format!("granted {granted_ns}"),
                            Err(e) => format!("waiter-err {}", e.to_string().replace('\n', " ")),
                        };
                        // Standard output gone means the driver is gone too.
                        let _ = emit(&output, &line);
                    })
                    .map_err(|e| format!("spawning the waiter: {e}"))?;
                self.waiter = Some(waiter);
                Ok(String::new())
            }
            Some("uncontended") => {
                let (mode, pairs) = (mode(1)?, number(2)?);
                let samples = uncontended_pairs_ns(self.manager()?, mode, pairs as usize).map_err(fail)?;
                Ok(samples.iter().map(u64::to_string).collect::<Vec<_>>().join(" "))
            }
            Some("contend") => {
                let (percent, pairs, seed, at) = (number(1)?, number(2)?, number(3)?, number(4)?);
                let percent = u32::try_from(percent.min(100)).unwrap_or(100);
                let now = host_monotonic_ns();
                if at > now {
                    std::thread::sleep(Duration::from_nanos(at - now));
                }
                let (began, ended) = contend_pairs(self.manager()?, percent, pairs as usize, seed).map_err(fail)?;
                Ok(format!("{began} {ended}"))
            }
            Some(other) => Err(format!("unknown command {other:?}")),
            None => Err("empty command".to_string()),
        }
    }
}

/// One node process, as the driver sees it.
struct NodeProcess {
    child: ChildNode,
    lines: Receiver<String>,
    /// A waiter's outcome that arrived while a reply was awaited.
    waiter_outcomes: VecDeque<String>,
}

impl NodeProcess {
    fn next_line(&mut self, index: usize, bound: Duration) -> Result<String, LockError> {
        match self.lines.recv_timeout(bound) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => {
                Err(LockError::Protocol(format!("node index {index} did not answer within {bound:?}")))
            }
            Err(RecvTimeoutError::Disconnected) => Err(LockError::Protocol(format!("node index {index} exited"))),
        }
    }

    fn send(&mut self, index: usize, command: &str) -> Result<(), LockError> {
        self.child
            .send_line(command)
            .map_err(|e| LockError::Protocol(format!("node index {index}: sending {command:?}: {e:#}")))
    }

    /// The reply to the command sent last: its fields after `ok`.
    fn reply(&mut self, index: usize, bound: Duration) -> Result<String, LockError> {
        let deadline = tierstack_base::time::instant_now() + bound;
        loop {
            let line =
                self.next_line(index, deadline.saturating_duration_since(tierstack_base::time::instant_now()))?;
            if line.starts_with("granted ") || line.starts_with("waiter-err ") {
                self.waiter_outcomes.push_back(line);
            } else if line == "ok" {
                return Ok(String::new());
            } else if let Some(fields) = line.strip_prefix("ok ") {
                return Ok(fields.to_string());
            } else if let Some(message) = line.strip_prefix("err ") {
                return Err(LockError::Protocol(format!("node index {index}: {message}")));
            } else {
                return Err(LockError::Protocol(format!("node index {index}: unexpected line {line:?}")));
            }
        }
    }

    fn call(&mut self, index: usize, command: &str) -> Result<String, LockError> {
        self.send(index, command)?;
        self.reply(index, BENCH_WAIT + REPLY_SLACK)
    }
}

fn spawn_process(exe: &Path, topology: &Path, id: u32) -> Result<NodeProcess> {
    let mut args = vec!["dlm-bench-node".to_string()];
    args.extend(tierstack_cluster::NodeArgs { topology: topology.to_path_buf(), node: id }.to_args());
    let mut child = ChildNode::spawn(exe, &args).with_context(|| format!("starting lock node {id}"))?;
    let lines = child.take_lines()?;
    Ok(NodeProcess { child, lines, waiter_outcomes: VecDeque::new() })
}

fn numbers(index: usize, fields: &str) -> Result<Vec<u64>, LockError> {
    fields
        .split_whitespace()
        .map(|word| {
            word.parse().map_err(|e| LockError::Protocol(format!("node index {index}: bad number {word:?}: {e}")))
        })
        .collect()
}

/// Every node a `tierstack dlm-bench-node` process; see the module documentation.
pub struct ProcessNodes {
    processes: Vec<NodeProcess>,
    scheme: Option<Scheme>,
    /// The running managers' region prefix.
    prefix: Option<String>,
    /// How many of the first nodes serve locks.
    servers: usize,
    exe: std::path::PathBuf,
    topology: std::path::PathBuf,
}

impl ProcessNodes {
    /// Starts `count` node processes of `exe` on `backend`, with their
    /// topology (and shm files) under `dir`.
    pub fn spawn(exe: &Path, backend: Backend, count: u32, dir: &Path) -> Result<Self> {
        let lines: Vec<NodeLine> =
            (0..count).map(|id| NodeLine { id, role: if id == 0 { "app" } else { "passive" }, cpu: None }).collect();
        let topology = write_topology(dir, "dlm-bench", backend, OP_TIMEOUT_MS, &lines)?;
        let mut processes = Vec::new();
        for id in 0..count {
            processes.push(spawn_process(exe, &topology, id)?);
        }
        Ok(Self { processes, scheme: None, prefix: None, servers: 1, exe: exe.to_path_buf(), topology })
    }

    /// The node processes' ids, by node index.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|p| p.child.pid()).collect()
    }

    fn process(&mut self, index: usize) -> Result<&mut NodeProcess, LockError> {
        let count = self.processes.len();
        self.processes.get_mut(index).ok_or_else(|| LockError::Config(format!("node index {index} of {count}")))
    }

    fn call(&mut self, index: usize, command: &str) -> Result<String, LockError> {
        self.process(index)?.call(index, command)
    }
}

impl LockNodes for ProcessNodes {
    fn count(&self) -> usize {
        self.processes.len()
    }

    fn start(&mut self, scheme: Scheme, region_prefix: &str) -> Result<(), LockError> {
        if region_prefix.is_empty() || region_prefix.contains(char::is_whitespace) {
            return Err(LockError::Config(format!("region prefix {region_prefix:?} must be one word")));
        }
        self.scheme = None;
        for index in 0..self.processes.len() {
            self.call(index, &format!("start {} {region_prefix}", scheme.name()))?;
            self.processes[index].waiter_outcomes.clear();
        }
        self.scheme = Some(scheme);
        self.prefix = Some(region_prefix.to_string());
        self.servers = 1;
        Ok(())
    }

    fn start_with_servers(&mut self, scheme: Scheme, region_prefix: &str, servers: usize) -> Result<(), LockError> {
        if region_prefix.is_empty() || region_prefix.contains(char::is_whitespace) {
            return Err(LockError::Config(format!("region prefix {region_prefix:?} must be one word")));
        }
        self.scheme = None;
        for index in 0..self.processes.len() {
            self.call(index, &format!("start {} {region_prefix} {servers}", scheme.name()))?;
            self.processes[index].waiter_outcomes.clear();
        }
        self.scheme = Some(scheme);
        self.prefix = Some(region_prefix.to_string());
        self.servers = servers;
        Ok(())
    }

    fn home(&mut self, node: usize) -> Result<usize, LockError> {
        let fields = numbers(node, &self.call(node, "home")?)?;
        let index = fields.first().copied().ok_or_else(|| LockError::Protocol(format!("node index {node}: home")))?;
        usize::try_from(index).map_err(|_| LockError::Protocol(format!("node index {node}: home {index}")))
    }

    fn kill(&mut self, node: usize) -> Result<u64, LockError> {
        let process = self.process(node)?;
        let at = host_monotonic_ns();
        process.child.kill().map_err(|e| LockError::Protocol(format!("killing node index {node}: {e:#}")))?;
        Ok(at)
    }

    fn restart(&mut self, node: usize) -> Result<(), LockError> {
        let (Some(scheme), Some(prefix)) = (self.scheme, self.prefix.clone()) else {
            return Err(LockError::Config("no managers started".into()));
        };
        let id = u32::try_from(node).map_err(|_| LockError::Config(format!("node index {node}")))?;
        let fresh = spawn_process(&self.exe, &self.topology, id)
            .map_err(|e| LockError::Protocol(format!("restarting node index {node}: {e:#}")))?;
        *self.process(node)? = fresh;
        self.call(node, &format!("start {} {prefix} {}", scheme.name(), self.servers)).map(|_| ())
    }

    fn scheme(&self) -> Result<Scheme, LockError> {
        self.scheme.ok_or_else(|| LockError::Config("no managers started".into()))
    }

    fn totals(&mut self) -> Result<MessageTotals, LockError> {
        let mut totals = MessageTotals::default();
        for index in 0..self.processes.len() {
            let fields = numbers(index, &self.call(index, "totals")?)?;
            let [sent, handled, errors] = fields[..] else {
                return Err(LockError::Protocol(format!("node index {index}: totals {fields:?}")));
            };
            totals.sent += sent;
            totals.handled += handled;
            totals.errors += errors;
        }
        Ok(totals)
    }

    fn hold(&mut self, node: usize) -> Result<(), LockError> {
        self.call(node, "hold").map(|_| ())
    }

    fn release_hold(&mut self, node: usize) -> Result<u64, LockError> {
        let fields = numbers(node, &self.call(node, "release")?)?;
        fields.first().copied().ok_or_else(|| LockError::Protocol(format!("node index {node}: release without time")))
    }

    fn start_waiter(&mut self, node: usize, mode: LockMode) -> Result<(), LockError> {
        self.call(node, &format!("wait {}", mode.name())).map(|_| ())
    }

    fn finish_waiter(&mut self, node: usize) -> Result<u64, LockError> {
        let process = self.process(node)?;
        let line = match process.waiter_outcomes.pop_front() {
            Some(line) => line,
            None => process.next_line(node, BENCH_WAIT + REPLY_SLACK)?,
        };
        if let Some(granted) = line.strip_prefix("granted ") {
            return numbers(node, granted)?
                .first()
                .copied()
                .ok_or_else(|| LockError::Protocol(format!("node index {node}: grant without time")));
        }
        let message = line.strip_prefix("waiter-err ").unwrap_or(&line);
        Err(LockError::Protocol(format!("node index {node}: waiter: {message}")))
    }

    fn uncontended_ns(&mut self, node: usize, mode: LockMode, pairs: usize) -> Result<Vec<u64>, LockError> {
        numbers(node, &self.call(node, &format!("uncontended {} {pairs}", mode.name()))?)
    }

    fn contend(
        &mut self,
        nodes: Range<usize>,
        shared_percent: u32,
        pairs: usize,
        seed: u64,
    ) -> Result<(u64, u64), LockError> {
        let lead = CONTEND_LEAD_PER_NODE * u32::try_from(nodes.len()).unwrap_or(u32::MAX);
        let at = host_monotonic_ns() + u64::try_from(lead.as_nanos()).unwrap_or(u64::MAX);
        for index in nodes.clone() {
            let node_seed = seed.wrapping_add(index as u64);
            self.process(index)?.send(index, &format!("contend {shared_percent} {pairs} {node_seed} {at}"))?;
        }
        let mut spans = Vec::new();
        for index in nodes {
            let fields = numbers(index, &self.process(index)?.reply(index, BENCH_WAIT + REPLY_SLACK + lead)?)?;
            let [began, ended] = fields[..] else {
                return Err(LockError::Protocol(format!("node index {index}: contend {fields:?}")));
            };
            spans.push((began, ended));
        }
        overall_span(spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_cluster::local_cluster;

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_node_answers_every_command_in_order_and_bad_ones_with_errors() {
        let cluster = local_cluster(Backend::Shm, 1).unwrap();
        let commands = "hold\nwait sideways\nstart nosuch p\nstart ncoshed a\ntotals\nrelease\nhold\n\
                        release\nuncontended shared 3\nuncontended shared many\ncontend 50 4 1 0\nfrobnicate\n\n";
        let output = Captured::default();
        serve_node(cluster.fabric(0).clone(), vec![NodeId(0)], commands.as_bytes(), output.clone()).unwrap();
        let text = String::from_utf8(output.0.lock().unwrap().clone()).unwrap();
        let replies: Vec<&str> = text.lines().collect();
        assert_eq!(replies.len(), 13, "{text}");
        assert!(replies[0].starts_with("err no manager runs"), "{text}");
        assert!(replies[1].starts_with("err unknown mode \"sideways\""), "{text}");
        assert!(replies[2].starts_with("err "), "{text}");
        assert_eq!(replies[3], "ok");
        assert_eq!(replies[4], "ok 0 0 0", "a lone uncontended node sends no messages");
        assert_eq!(replies[5], "err nothing held");
        assert_eq!(replies[6], "ok");
        let released: u64 = replies[7].strip_prefix("ok ").unwrap().parse().unwrap();
        assert!(released > 0);
        let samples = numbers(0, replies[8].strip_prefix("ok ").unwrap()).unwrap();
        assert_eq!(samples.len(), 3);
        assert!(samples.iter().all(|&ns| ns > 0));
        assert!(replies[9].starts_with("err ") && replies[9].contains("argument 2"), "{text}");
        let span = numbers(0, replies[10].strip_prefix("ok ").unwrap()).unwrap();
        assert!(span.len() == 2 && span[0] <= span[1], "{text}");
        assert_eq!(replies[11], "err unknown command \"frobnicate\"");
        assert_eq!(replies[12], "err empty command");
    }
}
