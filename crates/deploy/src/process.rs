//! A fabric node in its own process: the "remote owner" of the experiments.
//!
//! The owner runs `tierstack fabric serve`, registers its regions, prints
//! `ready`, and serves until its standard input closes. It can be pinned to a
//! CPU and loaded with busy threads, so that experiments show how each
//! backend depends on the owner's CPU. Its flags are [`ServeArgs`], here
//! beside their launcher [`spawn_owner`] rather than beside the serving code
//! (`tierstack_bench::fabric_node`): deploy may not depend on bench, and
//! `cluster` (a backend) cannot reach `tier-http`'s [`ServiceArgs`].

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;
use tierstack_cluster::{Backend, NodeArgs};
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;

/// Set to `1` in every [`ChildNode`]'s environment: a long-running
/// `tierstack` command then also stops when its standard input closes (as
/// `--stop-on-stdin-eof`), so dropping the child stops it. The services
/// define it (`tierstack_tier_http::service`).
pub use tierstack_tier_http::service::STOP_ON_STDIN_EOF_ENV;

/// How long a child may take to print `ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One `[[node]]` of a generated topology.
pub struct NodeLine {
    pub id: u32,
    pub role: &'static str,
    pub cpu: Option<usize>,
}

/// Writes a topology file for `nodes` on `backend` into `dir` and returns
/// its path. tcp and ucx nodes get free loopback ports and a fresh cluster
/// key, written beside the topology (`<name>.key`, 0600); ucx nodes use UCX's
/// shared-memory transports ([`tierstack_cluster::LOCAL_UCX_TRANSPORTS`])
/// unless `UCX_TLS` is set (see [`write_ucx_topology`] to choose).
pub fn write_topology(
    dir: &Path,
    name: &str,
    backend: Backend,
    op_timeout_ms: u64,
    nodes: &[NodeLine],
) -> Result<PathBuf> {
    write_topology_with_services(dir, name, backend, op_timeout_ms, nodes, &[])
}

/// As [`write_topology`], with a `[node.service]` section for some nodes:
/// `(node id, the section's TOML lines)`.
pub fn write_topology_with_services(
    dir: &Path,
    name: &str,
    backend: Backend,
    op_timeout_ms: u64,
    nodes: &[NodeLine],
    services: &[(u32, String)],
) -> Result<PathBuf> {
    let transports = (backend == Backend::Ucx && std::env::var("UCX_TLS").is_err())
        .then_some(tierstack_cluster::LOCAL_UCX_TRANSPORTS);
    write_topology_with(dir, name, backend, op_timeout_ms, nodes, transports, services)
}

/// As [`write_topology`] for a ucx cluster over `transports` (`UCX_TLS`,
/// such as `"sysv,self"` or `"tcp,self"`).
pub fn write_ucx_topology(
    dir: &Path,
    name: &str,
    transports: &str,
    op_timeout_ms: u64,
    nodes: &[NodeLine],
) -> Result<PathBuf> {
    write_topology_with(dir, name, Backend::Ucx, op_timeout_ms, nodes, Some(transports), &[])
}

fn write_topology_with(
    dir: &Path,
    name: &str,
    backend: Backend,
    op_timeout_ms: u64,
    nodes: &[NodeLine],
    ucx_transports: Option<&str>,
    services: &[(u32, String)],
) -> Result<PathBuf> {
    let mut text = format!(
        "[cluster]\nname = \"{name}\"\nfabric = \"{}\"\nop_timeout_ms = {op_timeout_ms}\nshm_root = \"{}\"\n",
        backend.name(),
        dir.join("shm").display()
    );
    if let Some(transports) = ucx_transports {
        text.push_str(&format!("ucx_transports = \"{transports}\"\n"));
    }
    if matches!(backend, Backend::Tcp | Backend::Ucx) {
        // Networked backends run authenticated, as a deployment should.
        let key_path = dir.join(format!("{name}.key"));
        match std::fs::remove_file(&key_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("replacing {}", key_path.display())),
        }
        tierstack_cluster::ClusterKey::generate().write_new(&key_path)?;
        text.push_str(&format!("key_file = \"{}\"\n", key_path.display()));
    }
    for node in nodes {
        text.push_str(&format!("\n[[node]]\nid = {}\nrole = \"{}\"\n", node.id, node.role));
        if matches!(backend, Backend::Tcp | Backend::Ucx) {
            text.push_str(&format!("address = \"{}\"\n", free_loopback_port()?));
        }
        if let Some(cpu) = node.cpu {
            text.push_str(&format!("cpu = {cpu}\n"));
        }
        for (_, section) in services.iter().filter(|(id, _)| *id == node.id) {
            text.push_str(&format!("[node.service]\n{}\n", section.trim_end()));
        }
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Lowest port [`free_loopback_port`] hands out: the shipped one-machine
/// example (`deploy/local.toml`, ports 18000 to 19401) listens below it,
/// so a test of it never races a test that chose a port at random.
const CHOSEN_PORT_MIN: u16 = 20_000;
/// Attempts at a random port before falling back to one the kernel picks.
const CHOSEN_PORT_ATTEMPTS: u32 = 200;

/// The start of the kernel's ephemeral port range (from which it assigns
/// local ports to outgoing connections and to `bind(0)`).
fn ephemeral_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next().and_then(|low| low.parse().ok()))
        .unwrap_or(32_768)
}

/// An external program: the path in environment variable `env` if it
/// names a file, else the first `name` on `PATH`, else in `/usr/sbin`;
/// `None` when there is none.
pub fn find_program(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A loopback address with a port that was free a moment ago, for a child
/// process to listen on.
///
/// The port is chosen at random *below* the kernel's ephemeral range and
/// never twice by one process. A port the kernel picked (`bind(0)`) would,
/// once released, be back in the pool it draws from for every outgoing
/// connection, and a busy machine can hand it to one before the child
/// binds it. Ports outside that pool can only collide with another process
/// choosing the same one (about one chance in twelve thousand).
pub fn free_loopback_port() -> Result<SocketAddr> {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let end = ephemeral_port_start();
    if end > CHOSEN_PORT_MIN {
        // Ports differ per process by a fresh seed (two test processes must
        // not walk the same sequence); nothing replays a port choice.
        let mut rng = tierstack_base::seeded_rng(tierstack_base::fresh_seed());
        for _ in 0..CHOSEN_PORT_ATTEMPTS {
            let port = rng.gen_range(CHOSEN_PORT_MIN..end);
            let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if given.contains(&port) {
                continue;
            }
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                given.push(port);
                return Ok(listener.local_addr()?);
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// Makes `command`'s process lead a session of its own (see
/// [`ChildNode::spawn_in_own_session`]; [`spawn_service`] detaches with it).
fn in_own_session(command: &mut Command) {
    // SAFETY: setsid is async-signal-safe and touches no memory of ours;
    // it fails only if the child already leads a process group, which a
    // freshly forked child does not.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Starts `exe args…` as a service that outlives us: in a session of its
/// own, standard input `/dev/null` (so it stops only on SIGTERM or SIGINT:
/// [`STOP_ON_STDIN_EOF_ENV`] is removed from its environment), its output
/// into `stdout` and `stderr`. `tierstack cluster up` waits for its
/// `ready` line in `stdout`'s file ([`crate::cluster`]).
pub fn spawn_service(exe: &Path, args: &[String], stdout: std::fs::File, stderr: std::fs::File) -> Result<Child> {
    let mut command = Command::new(exe);
    in_own_session(&mut command);
    command
        .args(args)
        .env_remove(STOP_ON_STDIN_EOF_ENV)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {} {}", exe.display(), args.join(" ")))
}

/// As [`spawn_service`], but stopped when its parent goes: standard input
/// is a pipe the caller holds (`Child::stdin`) and the child runs with
/// [`STOP_ON_STDIN_EOF_ENV`], so dropping the pipe, or the parent's death,
/// stops it. For a supervisor inside a short-lived command (the demo).
pub fn spawn_tied_service(exe: &Path, args: &[String], stdout: std::fs::File, stderr: std::fs::File) -> Result<Child> {
    let mut command = Command::new(exe);
    in_own_session(&mut command);
    command
        .args(args)
        .env(STOP_ON_STDIN_EOF_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {} {}", exe.display(), args.join(" ")))
}

/// A child `tierstack` process that has printed `ready`. It runs with
/// [`STOP_ON_STDIN_EOF_ENV`] set: closing its standard input (dropping it)
/// stops it.
pub struct ChildNode {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<std::process::ChildStdout>>,
}

impl ChildNode {
    /// Starts `exe args…` and waits (bounded) for its `ready` line.
    pub fn spawn(exe: &Path, args: &[String]) -> Result<ChildNode> {
        Self::start(Command::new(exe), exe, args)
    }

    /// As [`ChildNode::spawn`], in a session of its own, as a process on
    /// another machine would be. Linux's autogroup scheduling shares one
    /// CPU weight among a session's processes, spread over the CPUs where
    /// they run: busy threads of a child in our session (an application
    /// tier's compute threads) would shrink the weight of our processes on
    /// the other CPU, and any other session's work there would starve them.
    /// The child still stops when its standard input closes
    /// ([`STOP_ON_STDIN_EOF_ENV`]).
    pub fn spawn_in_own_session(exe: &Path, args: &[String]) -> Result<ChildNode> {
        let mut command = Command::new(exe);
        in_own_session(&mut command);
        Self::start(command, exe, args)
    }

    fn start(mut command: Command, exe: &Path, args: &[String]) -> Result<ChildNode> {
        let mut child = command
            .args(args)
            .env(STOP_ON_STDIN_EOF_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("child has no stdout")?;
        // Read the ready line on a thread so a hung child cannot hang us.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let result = reader.read_line(&mut line).map(|_| line);
            let _ = tx.send((result, reader));
        });
        let mut node = ChildNode { child, stdin, stdout: None };
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok((Ok(line), reader)) if line.trim() == "ready" => {
                node.stdout = Some(reader);
                Ok(node)
            }
            Ok((Ok(line), _)) => bail!("child {args:?} exited or printed {line:?} instead of ready"),
            Ok((Err(e), _)) => bail!("reading from child {args:?}: {e}"),
            Err(_) => bail!("child {args:?} did not become ready within {READY_TIMEOUT:?}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Sends one line to the child's standard input.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// Hands the child's further output lines to a reader thread and returns
    /// them as a channel, so a caller can wait for a line with a bound. The
    /// channel closes when the child's standard output does.
    pub fn take_lines(&mut self) -> Result<std::sync::mpsc::Receiver<String>> {
        let reader = self.stdout.take().context("the child's output was already taken")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name(format!("child-{}-lines", self.child.id())).spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        })?;
        Ok(rx)
    }

    /// Closes stdin and collects the rest of the child's output and exit status.
    pub fn finish(mut self) -> Result<String> {
        self.stdin.take();
        let mut rest = String::new();
        if let Some(mut reader) = self.stdout.take() {
            std::io::Read::read_to_string(&mut reader, &mut rest)?;
        }
        let status = self.child.wait()?;
        if !status.success() {
            bail!("child exited with {status}; output: {rest}");
        }
        Ok(rest)
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        self.stdin.take();
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if tierstack_base::time::instant_now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
            }
        }
    }
}

/// Parses `NAME:BYTES`, a region to register.
pub fn parse_region(s: &str) -> Result<(String, u64), String> {
    let (name, bytes) = s.split_once(':').ok_or_else(|| format!("expected NAME:BYTES, got {s:?}"))?;
    let bytes = bytes.parse::<u64>().map_err(|e| format!("bad size in {s:?}: {e}"))?;
    Ok((name.to_string(), bytes))
}

/// `tierstack fabric serve`'s flags, spelled once.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct ServeArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// A region to register, as NAME:BYTES (repeatable).
    #[arg(long = "region", value_parser = parse_region)]
    pub regions: Vec<(String, u64)>,
    /// CPU-burning threads to run in this process (owner load).
    #[arg(long, default_value_t = 0)]
    pub busy_threads: usize,
    /// Rewrite K seqlock records at the start of the first region
    /// continuously (all payload words equal), for torn-read stress tests.
    #[arg(long, default_value_t = 0)]
    pub seq_records: u32,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl ServeArgs {
    /// The node given, no region, every other flag at its default.
    pub fn new(node: NodeArgs) -> ServeArgs {
        ServeArgs {
            node,
            regions: Vec::new(),
            busy_threads: 0,
            seq_records: 0,
            service: ServiceArgs::default(),
            observe: ObserveArgs::default(),
        }
    }

    /// The command-line words (after `fabric serve`) that parse back into
    /// these arguments: the node and the regions, then each flag whose value
    /// is not the parser's default.
    pub fn to_args(&self) -> Vec<String> {
        let default = ServeArgs::new(self.node.clone());
        let mut args = self.node.to_args();
        for (name, bytes) in &self.regions {
            args.extend(["--region".to_string(), format!("{name}:{bytes}")]);
        }
        if self.busy_threads != default.busy_threads {
            args.extend(["--busy-threads".to_string(), self.busy_threads.to_string()]);
        }
        if self.seq_records != default.seq_records {
            args.extend(["--seq-records".to_string(), self.seq_records.to_string()]);
        }
        if self.service != default.service {
            args.extend(self.service.to_args());
        }
        args.extend(self.observe.to_args());
        args
    }
}

/// Starts `tierstack fabric serve` for `node` with `regions` and `busy_threads`.
pub fn spawn_owner(
    exe: &Path,
    topology: &Path,
    node: u32,
    regions: &[(&str, u64)],
    busy_threads: usize,
) -> Result<ChildNode> {
    let serve = ServeArgs {
        regions: regions.iter().map(|(name, bytes)| (name.to_string(), *bytes)).collect(),
        busy_threads,
        ..ServeArgs::new(NodeArgs { topology: topology.to_path_buf(), node })
    };
    let mut args = vec!["fabric".to_string(), "serve".into()];
    args.extend(serve.to_args());
    ChildNode::spawn(exe, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_specs_parse_or_say_why_not() {
        assert_eq!(parse_region("data:4096"), Ok(("data".to_string(), 4096)));
        assert!(parse_region("data").unwrap_err().contains("NAME:BYTES"));
        assert!(parse_region("data:x").unwrap_err().contains("bad size"));
    }

    fn parse(args: &ServeArgs) -> ServeArgs {
        let words = ["fabric serve".to_string()].into_iter().chain(args.to_args());
        tierstack_testkit::args::parse::<ServeArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn serve_args_round_trip_through_their_words() {
        let args = ServeArgs {
            node: NodeArgs { topology: PathBuf::from("/tmp/a cluster.toml"), node: 2 },
            regions: vec![("a".into(), 4096), ("b b".into(), 8)],
            busy_threads: 3,
            seq_records: 4,
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse(&args), args);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["fabric serve", "--topology", "t.toml", "--node", "1"];
        let parsed = tierstack_testkit::args::parse::<ServeArgs, _, _>(words).unwrap();
        assert_eq!(parsed, ServeArgs::new(NodeArgs { topology: PathBuf::from("t.toml"), node: 1 }));
        assert_eq!(parse(&parsed), parsed);
    }

    /// The session id of process `pid` (field 6 of `/proc/<pid>/stat`).
    fn session_of(pid: u32) -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_name = stat.rsplit(')').next().unwrap();
        after_name.split_whitespace().nth(3).unwrap().parse().unwrap()
    }

    #[test]
    fn a_child_in_its_own_session_leads_a_new_one_and_still_stops_when_its_stdin_closes() {
        let shell = Path::new("/bin/sh");
        let args = ["-c".to_string(), "echo ready; cat >/dev/null; echo bye".to_string()];
        let ours = session_of(std::process::id());
        let plain = ChildNode::spawn(shell, &args).unwrap();
        assert_eq!(session_of(plain.pid()), ours, "a plain child shares our session");
        let apart = ChildNode::spawn_in_own_session(shell, &args).unwrap();
        assert_eq!(session_of(apart.pid()), apart.pid(), "it leads a session of its own");
        assert_ne!(session_of(apart.pid()), ours);
        assert_eq!(apart.finish().unwrap().trim(), "bye", "closing its stdin stopped it");
        assert_eq!(plain.finish().unwrap().trim(), "bye");
    }
}
