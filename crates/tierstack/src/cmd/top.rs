//! `tierstack top`: every node's published load (`monitor.load`), read
//! one-sidedly from this process's own fabric node (`tierstack_monitor::top`
//! reads and draws it). Redraws every interval; `--once` prints one table
//! (or `--json`, one line) and exits.

use anyhow::Result;
use clap::Args;
use std::io::Write;
use std::time::Duration;
use tierstack_monitor::top::{render, TopReader};

#[derive(Args)]
pub(crate) struct TopArgs {
    /// This process's node (an otherwise idle one, e.g. role `passive`).
    #[command(flatten)]
    at: super::NodeArgs,
    /// Redraw period.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Print once and exit.
    #[arg(long)]
    once: bool,
    /// With --once: one JSON line instead of a table.
    #[arg(long, requires = "once")]
    json: bool,
}

pub(crate) fn run(args: TopArgs) -> Result<()> {
    let (topology, fabric) = args.at.open()?;
    let others = topology
        .nodes
        .iter()
        .filter(|n| n.id != args.at.id())
        .map(|n| (n.id, format!("{:?}", n.role).to_lowercase()))
        .collect();
    let interval = Duration::from_millis(args.interval_ms.max(1));
    let reader = TopReader::new(fabric, others, interval);
    loop {
        let rows = reader.rows();
        let mut stdout = std::io::stdout().lock();
        if args.once {
            if args.json {
                writeln!(stdout, "{}", serde_json::to_string(&rows)?)?;
            } else {
                write!(stdout, "{}", render(&rows))?;
            }
            return Ok(());
        }
        // Home, clear, table.
        write!(stdout, "\x1b[H\x1b[2J{}", render(&rows))?;
        stdout.flush()?;
        drop(stdout);
        std::thread::sleep(interval);
    }
}
