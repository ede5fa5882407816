//! `tierstack monitor-node` (hidden): the back end of `tierstack bench
//! monitor`'s accuracy run (Fig. 8a), run by
//! `tierstack_bench::monitor_node`. It publishes its load on its fabric
//! node and through a monitor socket server, runs a seeded random walk of
//! requests in flight (the true value), and burns CPU with compute threads
//! that do not count in the load but compete with the monitor thread for
//! the CPU (the walk itself can be pinned elsewhere: `--walk-cpu`). It prints `ready`; when its standard input closes it stops and
//! prints the truth log, one `<t_ns> <value>` line per change
//! (`CLOCK_MONOTONIC`, the clock the front end stamps its samples with).

use anyhow::Result;
use std::io::Write;
pub(crate) use tierstack_bench::monitor_node::MonitorNodeArgs;
use tierstack_bench::monitor_node::MonitoredNode;

pub(crate) fn run_node(args: MonitorNodeArgs) -> Result<()> {
    let (_, fabric) = args.at.open()?;
    let node = MonitoredNode::start(fabric.as_ref(), &args.config())?;
    let stopped = args.service.stop_watch_thread()?;
    crate::service::announce_ready()?;
    let _ = stopped.recv();
    let log = node.stop()?;
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for (t_ns, value) in log {
        writeln!(stdout, "{t_ns} {value}")?;
    }
    stdout.flush()?;
    Ok(())
}
