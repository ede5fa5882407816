//! `tierstack top`: every tier of a topology, live. Each service's
//! `/metrics` (CPU, memory, its busiest counter, a proxy's hit ratio:
//! `tierstack_deploy::top`), and with `--node` also every node's published
//! load (`monitor.load`), read one-sidedly from that fabric node
//! (`tierstack_monitor::top`). Redraws every interval; `--once` prints one
//! table (or `--json`, one line) and exits.

use anyhow::Result;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_deploy::top::{render as render_tiers, rows, scrape, targets};
use tierstack_monitor::top::{render as render_load, TopReader};

#[derive(Args)]
pub(crate) struct TopArgs {
    /// The cluster's topology file.
    #[arg(long)]
    topology: PathBuf,
    /// Also read every node's published load from this fabric node (an
    /// otherwise idle one, e.g. role `passive`).
    #[arg(long)]
    node: Option<u32>,
    /// Redraw period (also the interval the rates are measured over).
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Print once (after one interval) and exit.
    #[arg(long)]
    once: bool,
    /// With --once: one JSON line instead of tables.
    #[arg(long, requires = "once")]
    json: bool,
}

pub(crate) fn run(args: TopArgs) -> Result<()> {
    let interval = Duration::from_millis(args.interval_ms.max(1));
    let tiers = targets(&args.topology)?;
    let load = match args.node {
        Some(node) => {
            let (topology, fabric) = super::open_node(&args.topology, NodeId(node))?;
            let others = topology
                .nodes
                .iter()
                .filter(|n| n.id != NodeId(node))
                .map(|n| (n.id, format!("{:?}", n.role).to_lowercase()))
                .collect();
            Some(TopReader::new(fabric, others, interval))
        }
        None => None,
    };
    let mut before = scrape(&tiers);
    loop {
        std::thread::sleep(interval);
        let after = scrape(&tiers);
        let tier_rows = rows(&tiers, &before, &after);
        let load_rows = load.as_ref().map(TopReader::rows);
        let mut stdout = std::io::stdout().lock();
        if args.once && args.json {
            let both = serde_json::json!({ "tiers": tier_rows, "load": load_rows });
            writeln!(stdout, "{both}")?;
            return Ok(());
        }
        let mut screen = render_tiers(&tier_rows);
        if let Some(load_rows) = &load_rows {
            screen.push('\n');
            screen.push_str(&render_load(load_rows));
        }
        if args.once {
            write!(stdout, "{screen}")?;
            return Ok(());
        }
        // Home, clear, tables.
        write!(stdout, "\x1b[H\x1b[2J{screen}")?;
        stdout.flush()?;
        before = after;
    }
}
