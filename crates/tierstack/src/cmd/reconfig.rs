//! `tierstack reconfigure`: the reconfiguration agent (svc §3, §6) as a
//! process. Every window it reads each back end's role word and RDMA-Sync
//! load one-sidedly, asks the pure policy whether a node should move from
//! the idlest site to the busiest, and moves it with one compare-and-swap
//! claim ([`tierstack_monitor::ReconfigAgent`]). Several agents may run over
//! the same back ends: exactly one moves a node. It prints `ready`, then one
//! JSON line per event (`moved`, `lost`) with the agent's id and the time,
//! and runs until its standard input closes. With `--metrics-listen` it
//! serves `/metrics` (`tierstack_monitor::metrics::ReconfigMetrics`).

use anyhow::{Context, Result};
use serde::Serialize;
use std::io::Write;
use std::sync::Arc;
use tierstack_base::host_monotonic_ns;
pub(crate) use tierstack_bench::reconfig_agent::ReconfigureArgs;
use tierstack_monitor::metrics::ReconfigMetrics;
use tierstack_monitor::{AgentEvent, ReconfigAgent};
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{Observed, ServingFlag};

#[derive(Serialize)]
struct Line {
    agent: u16,
    /// `CLOCK_MONOTONIC`, ns.
    t_ns: u64,
    #[serde(flatten)]
    event: AgentEvent,
}

/// What an agent's `/metrics` and `/readyz` report.
struct ReconfigObserved {
    metrics: Arc<ReconfigMetrics>,
    serving: ServingFlag,
}

impl Observed for ReconfigObserved {
    fn metrics(&self, out: &mut Exposition) {
        self.metrics.write(out);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("serving", self.serving.check())]
    }
}

pub(crate) fn run(args: ReconfigureArgs) -> Result<()> {
    anyhow::ensure!(args.ratio.is_finite() && args.ratio >= 1.0, "--ratio must be at least 1");
    anyhow::ensure!(args.windows >= 1, "--windows must be at least 1");
    let (_, fabric) = args.at.open()?;
    let (nodes, window) = (args.backend_nodes(), args.window());
    let mut agent = ReconfigAgent::connect(fabric, args.agent_id, &nodes, args.config(), window)
        .context("connecting to the back ends' role regions")?;
    let serving = ServingFlag::new();
    let _observer =
        args.observe.start(Arc::new(ReconfigObserved { metrics: agent.metrics(), serving: serving.clone() }))?;
    let stopped = args.service.stop_watch_thread()?;
    // Ready before `ready` is printed, so whoever reads the line finds /readyz agreeing.
    serving.set(true);
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
    serving.set(false);
    Ok(())
}
