//! Cooperative-cache nodes as separate OS processes, for `tierstack bench
//! coop --figure 7`: both ends of the pipe protocol by which the benchmark
//! drives them (the pattern of [`crate::dlm_nodes`]).
//!
//! Each node is a `tierstack coop-bench-node --topology T --node I` process:
//! it attaches to the fabric, prints `ready`, then runs the commands it reads
//! on standard input, one per line, until standard input closes
//! ([`serve_node`]). Replies are `ok …` or `err MESSAGE`, one line each:
//!
//! ```text
//! start SCHEME POOL_BYTES ACTIVE PASSIVE  ok            a CoopNode; members are node ids 0..ACTIVE (proxies),
//!                                                       then ACTIVE..ACTIVE+PASSIVE (passive back ends)
//! put FIRST COUNT BYTES                   ok            Cache Store of keys FIRST.. (checked bodies)
//! counts                                  ok SENT HANDLED  service messages so far (quiescence)
//! cpu                                     ok NS         this process's CPU time so far (all threads)
//! time KIND FIRST COUNT                   ok WRONG THREAD_CPU_NS NS NS …
//! ```
//!
//! `time` looks each key up once and returns the wall time of the lookups
//! that found what KIND expects (`local`: a local hit; `remote`: a remote
//! hit, whose copy is dropped again after the clock stops, so the next
//! round reads it remotely too; `home`: Cache Validate of a key whose home
//! is another node, one metadata read there), the number that did not
//! (WRONG; groupcache keys this node owns are local, not remote), and the
//! calling thread's CPU time over the timed lookups only.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_cluster::Backend;
use tierstack_coop::service::{CoopConfig, CoopNode, Lookup};
use tierstack_coop::Scheme;
use tierstack_deploy::process::{write_topology, ChildNode, NodeLine};
use tierstack_fabric::Fabric;

/// Longest a reply may take (a `time` of thousands of tcp lookups on a
/// loaded host included).
const REPLY_BOUND: Duration = Duration::from_secs(120);
/// Fabric operation timeout of the generated topology.
const OP_TIMEOUT_MS: u64 = 1000;

/// The body of `key`: `bytes` bytes that differ per key (checked on reads).
pub fn body_of(key: u64, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| (tierstack_coop::key::mix(key ^ (i / 8)) >> (8 * (i % 8))) as u8).collect()
}

/// CPU time of the calling thread, nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of this process (every thread), nanoseconds.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// The node side: serves the commands read from `input` until it closes.
pub fn serve_node(fabric: Arc<dyn Fabric>, input: impl BufRead, mut output: impl Write) -> Result<()> {
    let mut node: Option<CoopNode> = None;
    for line in input.lines() {
        let line = line.context("reading a command")?;
        let reply = match command(&fabric, &mut node, &line) {
            Ok(fields) if fields.is_empty() => "ok".to_string(),
            Ok(fields) => format!("ok {fields}"),
            Err(e) => format!("err {}", format!("{e:#}").replace('\n', " ")),
        };
        writeln!(output, "{reply}")?;
        output.flush()?;
    }
    Ok(())
}

fn command(fabric: &Arc<dyn Fabric>, node: &mut Option<CoopNode>, line: &str) -> Result<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> Result<u64> {
        let word = words.get(i).with_context(|| format!("{line:?}: argument {i} missing"))?;
        word.parse().with_context(|| format!("{line:?}: argument {i}"))
    };
    let started = |node: &Option<CoopNode>| -> Result<()> {
        if node.is_none() {
            bail!("no node runs: send start first");
        }
        Ok(())
    };
    match words.first().copied() {
        Some("start") => {
            let scheme: Scheme = words.get(1).context("start needs a scheme")?.parse()?;
            let (pool, active, passive) = (number(2)?, number(3)?, number(4)?);
            let ids = |range: std::ops::Range<u64>| range.map(|n| NodeId(n as u32)).collect::<Vec<_>>();
            let config = CoopConfig::new(scheme, ids(0..active), ids(active..active + passive), pool);
            *node = None;
            *node = Some(CoopNode::start(fabric.clone(), config)?);
            Ok(String::new())
        }
        Some("put") => {
            started(node)?;
            let (first, count, bytes) = (number(1)?, number(2)?, number(3)?);
            let Some(n) = node.as_ref() else { bail!("no node") };
            for key in first..first + count {
                n.put(key, 0, &body_of(key, bytes))?;
            }
            Ok(String::new())
        }
        Some("counts") => {
            let Some(n) = node.as_ref() else { return Ok("0 0".into()) };
            let (sent, handled) = n.message_counts();
            Ok(format!("{sent} {handled}"))
        }
        Some("cpu") => Ok(process_cpu_ns().to_string()),
        Some("time") => {
            started(node)?;
            let kind = *words.get(1).context("time needs a kind")?;
            let (first, count) = (number(2)?, number(3)?);
            let Some(n) = node.as_ref() else { bail!("no node") };
            time(n, kind, first, count)
        }
        Some(other) => bail!("unknown command {other:?}"),
        None => bail!("empty command"),
    }
}

fn time(node: &CoopNode, kind: &str, first: u64, count: u64) -> Result<String> {
    if !matches!(kind, "local" | "remote" | "home") {
        bail!("unknown kind {kind:?}");
    }
    let (mut samples, mut wrong, mut cpu) = (Vec::new(), 0u64, 0u64);
    for key in first..first + count {
        if kind == "home" && node.holders_at_home(key).is_some() {
            // This node is the key's home: not a round trip.
            continue;
        }
        let (began_cpu, began) = (thread_cpu_ns(), host_monotonic_ns());
        let found = if kind == "home" { node.validate(key).map(|_| None) } else { Some(Some(node.get(key)?)) };
        let (ended, ended_cpu) = (host_monotonic_ns(), thread_cpu_ns());
        // Checked after the clock stops (building the expected body costs more than a lookup).
        let right = |body: &[u8]| body == body_of(key, body.len() as u64);
        let (expected, remote) = match found {
            Some(None) => (kind == "home", false),
            Some(Some(Lookup::Local { body, .. })) => (kind == "local" && right(&body), false),
            Some(Some(Lookup::Remote { body, .. })) => (kind == "remote" && right(&body), true),
            Some(Some(Lookup::Miss)) | None => (false, false),
        };
        if expected {
            samples.push(ended.saturating_sub(began));
            cpu += ended_cpu.saturating_sub(began_cpu);
        } else {
            wrong += 1;
        }
        if remote {
            // Not timed: so the next round's lookup of the key is remote again.
            node.drop_local(key);
        }
    }
    let mut out = format!("{wrong} {cpu}");
    for s in samples {
        out.push(' ');
        out.push_str(&s.to_string());
    }
    Ok(out)
}

/// One node process, as the driver sees it.
struct NodeProcess {
    child: ChildNode,
    lines: Receiver<String>,
}

impl NodeProcess {
    fn call(&mut self, index: usize, command: &str) -> Result<String> {
        self.child.send_line(command).with_context(|| format!("node {index}: sending {command:?}"))?;
        let line = self
            .lines
            .recv_timeout(REPLY_BOUND)
            .map_err(|e| anyhow::anyhow!("node {index}: no reply to {command:?} within {REPLY_BOUND:?}: {e}"))?;
        if line == "ok" {
            Ok(String::new())
        } else if let Some(fields) = line.strip_prefix("ok ") {
            Ok(fields.to_string())
        } else if let Some(message) = line.strip_prefix("err ") {
            bail!("node {index}: {command:?}: {message}")
        } else {
            bail!("node {index}: unexpected line {line:?}")
        }
    }
}

/// Every node a `tierstack coop-bench-node` process (see the module docs).
pub struct CoopProcesses {
    processes: Vec<NodeProcess>,
}

impl CoopProcesses {
    /// Starts `count` node processes of `exe` on `backend`, with their
    /// topology (and shm files) under `dir`.
    pub fn spawn(exe: &Path, backend: Backend, active: u32, passive: u32, dir: &Path) -> Result<Self> {
        let lines: Vec<NodeLine> = (0..active + passive)
            .map(|id| NodeLine { id, role: if id < active { "proxy" } else { "passive" }, cpu: None })
            .collect();
        let topology = write_topology(dir, "coop-fig7", backend, OP_TIMEOUT_MS, &lines)?;
        let mut processes = Vec::new();
        for id in 0..active + passive {
            let mut args = vec!["coop-bench-node".to_string()];
            args.extend(tierstack_cluster::NodeArgs { topology: topology.clone(), node: id }.to_args());
            let mut child = ChildNode::spawn(exe, &args).with_context(|| format!("starting coop node {id}"))?;
            let lines = child.take_lines()?;
            processes.push(NodeProcess { child, lines });
        }
        Ok(Self { processes })
    }

    /// Sends `command` to node `index`; its reply's fields.
    pub fn call(&mut self, index: usize, command: &str) -> Result<String> {
        let count = self.processes.len();
        let process = self.processes.get_mut(index).with_context(|| format!("node index {index} of {count}"))?;
        process.call(index, command)
    }

    pub fn count(&self) -> usize {
        self.processes.len()
    }

    /// This process's CPU time so far, nanoseconds.
    pub fn cpu_ns(&mut self, index: usize) -> Result<u64> {
        Ok(self.call(index, "cpu")?.trim().parse()?)
    }

    /// Waits until every message sent has been handled, twice in a row
    /// (nothing in flight), within `bound`.
    pub fn settle(&mut self, bound: Duration) -> Result<()> {
        let deadline = tierstack_base::time::instant_now() + bound;
        let mut quiet = 0;
        let mut last = (u64::MAX, u64::MAX);
        while quiet < 2 {
            let (mut sent, mut handled) = (0u64, 0u64);
            for index in 0..self.processes.len() {
                let fields = self.call(index, "counts")?;
                let mut words = fields.split_whitespace().map(str::parse::<u64>);
                sent += words.next().context("counts: sent")??;
                handled += words.next().context("counts: handled")??;
            }
            quiet = if sent == handled && (sent, handled) == last { quiet + 1 } else { 0 };
            last = (sent, handled);
            if tierstack_base::time::instant_now() > deadline {
                bail!("coop nodes did not settle within {bound:?} (sent {sent}, handled {handled})");
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}
