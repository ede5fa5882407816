//! `tierstack reconfigure`: the reconfiguration agent (svc §3, §6) as a
//! process. Every window it reads each back end's role word and RDMA-Sync
//! load one-sidedly, asks the pure policy whether a node should move from
//! the idlest site to the busiest, and moves it with one compare-and-swap
//! claim ([`tierstack_monitor::ReconfigAgent`]). Several agents may run over
//! the same back ends: exactly one moves a node. It prints `ready`, then one
//! JSON line per event (`moved`, `lost`) with the agent's id and the time,
//! and runs until its standard input closes.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_monitor::{AgentEvent, ReconfigAgent, ReconfigConfig};

#[derive(Args)]
pub(crate) struct ReconfigureArgs {
    /// The agent's own fabric node.
    #[command(flatten)]
    at: super::NodeArgs,
    /// This agent's id (the holder named in a claimed role word).
    #[arg(long, default_value_t = 0)]
    agent_id: u16,
    /// A movable back end's fabric node (repeatable); each registers its
    /// role region (`app-server --site`) and publishes its load.
    #[arg(long = "backend", required = true)]
    backends: Vec<u32>,
    /// How often the agent reads and decides.
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Sensitivity: move when (busiest site's mean load + 1) / (idlest's + 1)
    /// reaches this …
    #[arg(long, default_value_t = 2.0)]
    ratio: f64,
    /// … in this many consecutive windows.
    #[arg(long, default_value_t = 3)]
    windows: u32,
    /// History: a node moved less than this long ago stays.
    #[arg(long, default_value_t = 5_000)]
    history_ms: u64,
    /// A site never shrinks below this many nodes.
    #[arg(long, default_value_t = 1)]
    min_nodes: usize,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
}

#[derive(Serialize)]
struct Line {
    agent: u16,
    /// `CLOCK_MONOTONIC`, ns.
    t_ns: u64,
    #[serde(flatten)]
    event: AgentEvent,
}

pub(crate) fn run(args: ReconfigureArgs) -> Result<()> {
    anyhow::ensure!(args.ratio.is_finite() && args.ratio >= 1.0, "--ratio must be at least 1");
    anyhow::ensure!(args.windows >= 1, "--windows must be at least 1");
    let (_, fabric) = args.at.open()?;
    let nodes: Vec<NodeId> = args.backends.iter().map(|n| NodeId(*n)).collect();
    let window = Duration::from_millis(args.window_ms.max(1));
    let config = ReconfigConfig {
        ratio: args.ratio,
        windows: args.windows,
        history_ns: args.history_ms.saturating_mul(1_000_000),
        min_nodes_per_site: args.min_nodes,
    };
    let mut agent = ReconfigAgent::connect(fabric, args.agent_id, &nodes, config, window)
        .context("connecting to the back ends' role regions")?;
    let stopped = args.service.stop_watch_thread()?;
    crate::service::announce_ready()?;
    let mut next = tierstack_base::time::instant_now();
    while matches!(stopped.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) {
        let now_ns = host_monotonic_ns();
        if let Some(event) = agent.step(now_ns)? {
            println!("{}", serde_json::to_string(&Line { agent: args.agent_id, t_ns: now_ns, event })?);
            std::io::stdout().flush()?;
        }
        // The agent's period (its policy's window), not a synchronization.
        next += window;
        std::thread::sleep(next.saturating_duration_since(tierstack_base::time::instant_now()));
    }
    Ok(())
}
