//! `tierstack monitor-node` (hidden): the back end of `tierstack bench
//! monitor`'s accuracy run (Fig. 8a), run by
//! `tierstack_bench::monitor_node`. It publishes its load on its fabric
//! node and through a monitor socket server, and runs real threads counted
//! as running threads: workers that a seeded random walk wakes (they spin)
//! and idles (they block), and compute threads that always spin (the walk
//! itself can be pinned elsewhere: `--walk-cpu`). The truth they are judged
//! by is the bench's `/proc` observer. It prints `ready`; when its standard
//! input closes it stops and prints the walk's log, one `<t_ns> <busy
//! workers>` line per step (`CLOCK_MONOTONIC`, the clock the front end
//! stamps its samples with). `--fault uncounted-compute` is a test fault.
//! With `--metrics-listen` it serves `/metrics` (the published load and
//! what the agent served, `tierstack_monitor::metrics::write_agent`).

use anyhow::Result;
use std::io::Write;
use std::sync::Arc;
pub(crate) use tierstack_bench::monitor_node::MonitorNodeArgs;
use tierstack_bench::monitor_node::MonitoredNode;
use tierstack_monitor::AgentView;
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{Observed, ServingFlag};

/// What a monitored node's `/metrics` and `/readyz` report.
struct MonitorObserved {
    agent: AgentView,
    serving: ServingFlag,
}

impl Observed for MonitorObserved {
    fn metrics(&self, out: &mut Exposition) {
        tierstack_monitor::metrics::write_agent(&self.agent, out);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let agent = if self.agent.running() { Ok(()) } else { Err("the monitor agent stopped".into()) };
        vec![("serving", self.serving.check()), ("monitor agent", agent)]
    }
}

pub(crate) fn run_node(args: MonitorNodeArgs) -> Result<()> {
    let (_, fabric) = args.at.open()?;
    let node = MonitoredNode::start(fabric.as_ref(), &args.config())?;
    let serving = ServingFlag::new();
    let observer =
        args.observe.start(Arc::new(MonitorObserved { agent: node.agent_view(), serving: serving.clone() }))?;
    let stopped = args.service.stop_watch_thread()?;
    // Ready before `ready` is printed, so whoever reads the line finds /readyz agreeing.
    serving.set(true);
    crate::service::announce_ready()?;
    let _ = stopped.recv();
    serving.set(false);
    drop(observer);
    let log = node.stop()?;
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for (t_ns, value) in log {
        writeln!(stdout, "{t_ns} {value}")?;
    }
    stdout.flush()?;
    Ok(())
}
