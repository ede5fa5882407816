//! `tierstack cluster up|status|down <topology.toml>`, and `cluster key`: the tier processes a
//! topology's `[node.service]` sections describe, on this host, as detached
//! services (glue over `tierstack_deploy::cluster`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use tierstack_deploy::cluster::{self, UpConfig};

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Start every service of the topology, in dependency order, each once the one before is ready; they keep running after this command returns.
    Up(UpArgs),
    /// Every service's process, /healthz, /readyz and load; fails unless all are alive and ready.
    Status(Where),
    /// Stop every service gracefully (SIGTERM, proxies first; SIGKILL after the grace period and a margin).
    Down(Where),
    /// Become one node's service (what `up` would start for it), in this process's place: for systemd units and containers.
    Exec(ExecArgs),
    /// The supervisor `up` starts (detached): start the services, restart any that dies, stop them all on SIGTERM.
    #[command(hide = true)]
    Supervise(UpArgs),
    /// Make a new cluster key (32 random bytes, in a new file of mode 0600) for `[cluster] key_file`; copy it to every host.
    Key(KeyArgs),
}

#[derive(Args)]
pub(crate) struct KeyArgs {
    /// The file to create; an existing file is never replaced.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub(crate) struct ExecArgs {
    /// The cluster's topology file.
    topology: PathBuf,
    /// The node whose service to run.
    #[arg(long)]
    node: u32,
    /// Refuse unless the node's service is this kind (app-module, app-server, proxy): a unit names its tier.
    #[arg(long)]
    kind: Option<String>,
    /// The service's grace period on SIGTERM.
    #[arg(long, default_value_t = crate::service::GRACE_MS_DEFAULT)]
    grace_ms: u64,
}

/// `cluster supervise`: the services under a supervisor until SIGTERM or
/// SIGINT, then stopped; what stopping did is left for `down` to print.
fn supervise(args: UpArgs) -> Result<()> {
    let config =
        UpConfig { exe: std::env::current_exe()?, run_dir: args.at.run_dir(), grace_ms: args.grace_ms, tied: false };
    // Installed before the services start: a stop asked for meanwhile waits
    // for the start to finish instead of killing us without cleanup.
    let stop = crate::service::ServiceArgs::default().stop_watch_thread()?;
    let supervisor = tierstack_deploy::supervise::Supervisor::start(&args.at.topology, &config)?;
    crate::service::announce_ready()?;
    let _cause = stop.recv();
    let report = supervisor.stop()?;
    cluster::write_down_report(&config.run_dir, &report)?;
    for (node, kind, pid, outcome) in &report.nodes {
        println!("node {node} {kind} pid {pid}: {outcome}");
    }
    Ok(())
}

/// Replaces this process with the node's service.
fn exec(args: ExecArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let error = cluster::exec_command(&exe, &args.topology, args.node, args.kind.as_deref(), args.grace_ms)?.exec();
    Err(error).context("starting the service")
}

#[derive(Args)]
pub(crate) struct Where {
    /// The cluster's topology file.
    topology: PathBuf,
    /// Where the pid/state file and the services' logs are (default: `<topology file>.run` beside it).
    #[arg(long)]
    run_dir: Option<PathBuf>,
}

impl Where {
    /// Absolute, so that the state file names log files any directory can find.
    fn run_dir(&self) -> PathBuf {
        let run_dir = self.run_dir.clone().unwrap_or_else(|| default_run_dir(&self.topology));
        std::path::absolute(&run_dir).unwrap_or(run_dir)
    }
}

fn default_run_dir(topology: &Path) -> PathBuf {
    let mut name = topology.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "cluster".into());
    name.push(".run");
    topology.with_file_name(name)
}

#[derive(Args)]
pub(crate) struct UpArgs {
    #[command(flatten)]
    at: Where,
    /// Each service's grace period on SIGTERM (its --grace-ms).
    #[arg(long, default_value_t = crate::service::GRACE_MS_DEFAULT)]
    grace_ms: u64,
}

pub(crate) fn run(command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Up(args) => {
            let config = UpConfig {
                exe: std::env::current_exe()?,
                run_dir: args.at.run_dir(),
                grace_ms: args.grace_ms,
                tied: false,
            };
            let state = cluster::up(&args.at.topology, &config)?;
            for started in &state.processes {
                let health = started.health.map(|a| format!(" health http://{a}/readyz")).unwrap_or_default();
                println!(
                    "node {} {} pid {}{health} (log {})",
                    started.node,
                    started.kind,
                    started.pid,
                    started.log.display()
                );
            }
            let supervisor = state.supervisor.map(|s| format!(", supervisor pid {}", s.pid)).unwrap_or_default();
            println!("up: {} processes{supervisor}; state in {}", state.processes.len(), config.run_dir.display());
            Ok(())
        }
        ClusterCommand::Supervise(args) => supervise(args),
        ClusterCommand::Status(at) => {
            let status = cluster::status(&at.run_dir())?;
            let yes_no = |v: Option<bool>| v.map(|b| if b { "yes" } else { "NO" }).unwrap_or("-");
            match status.supervisor {
                Some(s) => println!(
                    "supervisor pid {}: {}",
                    s.pid,
                    if status.supervisor_alive { "alive" } else { "NOT RUNNING (nothing is restarted)" }
                ),
                None => println!("supervisor: none recorded (nothing is restarted)"),
            }
            println!(
                "{:>4}  {:<11} {:>8}  {:<5} {:<7} {:<5} {:>8}  load",
                "node", "kind", "pid", "alive", "healthy", "ready", "restarts"
            );
            for n in &status.nodes {
                println!(
                    "{:>4}  {:<11} {:>8}  {:<5} {:<7} {:<5} {:>8}  {}{}",
                    n.node,
                    n.kind,
                    n.pid,
                    if n.alive { "yes" } else { "NO" },
                    yes_no(n.healthy),
                    yes_no(n.ready),
                    n.restarts,
                    n.load.as_deref().unwrap_or("-"),
                    n.not_ready.as_ref().map(|why| format!("  not ready: {why}")).unwrap_or_default()
                );
            }
            let bad = status.nodes.iter().filter(|n| !n.ok()).count();
            if bad > 0 {
                bail!("{bad} of {} services are not alive and ready", status.nodes.len());
            }
            if !status.supervisor_alive {
                bail!("the supervisor is not running");
            }
            Ok(())
        }
        ClusterCommand::Exec(args) => exec(args),
        ClusterCommand::Key(args) => {
            let key = tierstack_cluster::ClusterKey::generate();
            key.write_new(&args.out)?;
            println!("wrote a new cluster key to {} (fingerprint {})", args.out.display(), key.fingerprint());
            Ok(())
        }
        ClusterCommand::Down(at) => {
            let report = cluster::down(&at.run_dir())?;
            for (node, kind, pid, outcome) in &report.nodes {
                println!("node {node} {kind} pid {pid}: {outcome}");
            }
            if !report.clean() {
                bail!("some services had to be killed");
            }
            Ok(())
        }
    }
}
