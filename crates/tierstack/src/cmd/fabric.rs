//! `tierstack fabric …`: a node that serves regions, and clients that operate
//! on them (`tierstack_bench::fabric_node`). The multi-process tests and
//! `bench fabric` drive these.

use super::NodeArgs;
use anyhow::Result;
use clap::{Args, Subcommand};
use std::io::BufRead;
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_bench::fabric_node::{self, ServingMetrics, ServingNode};
use tierstack_deploy::process::ServeArgs;
use tierstack_fabric::{Fabric, RemoteRegion};
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{Observed, ServingFlag};

/// What `fabric serve`'s `/metrics` and `/readyz` report.
struct ServeObserved {
    metrics: Arc<ServingMetrics>,
    serving: ServingFlag,
}

impl Observed for ServeObserved {
    fn metrics(&self, out: &mut Exposition) {
        self.metrics.write(out);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("serving", self.serving.check())]
    }
}

#[derive(Args)]
pub(crate) struct TargetArgs {
    /// The node that owns the region.
    #[arg(long)]
    target: u32,
    /// The region's name.
    #[arg(long)]
    region: String,
}

impl TargetArgs {
    /// Opens `node` and connects to the target region; the fabric is
    /// returned too, to be kept open while the region is used.
    fn connect(&self, node: &NodeArgs) -> Result<(Arc<dyn Fabric>, Arc<dyn RemoteRegion>)> {
        let (_, fabric) = node.open()?;
        let region = fabric.connect(NodeId(self.target), &self.region)?;
        Ok((fabric, region))
    }
}

#[derive(Subcommand)]
pub(crate) enum FabricCommand {
    /// Register regions and serve them until standard input closes.
    /// Prints `ready` once the regions exist. Answers messages whose first
    /// byte is 1 with a one-byte message (an acknowledgement for benchmarks).
    /// `/metrics` on `--metrics-listen`: regions, messages, acknowledgements.
    Serve(ServeArgs),
    /// Perform one operation and print its result as JSON.
    Op {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, value_parser = fabric_node::OPS)]
        op: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Value to write or add, or the new value of a compare-swap.
        #[arg(long, default_value_t = 0)]
        value: u64,
        #[arg(long, default_value_t = 0)]
        expected: u64,
    },
    /// Contend on a region: COUNT fetch_adds of 1 on offset 0, or ROUNDS
    /// compare_swap rounds (round r tries word r from 0 to node+1). Prints JSON.
    Hammer {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, default_value_t = 0)]
        fetch_adds: u64,
        #[arg(long, default_value_t = 0)]
        cas_rounds: u64,
        /// Wait for a line on standard input before starting, so that all
        /// contenders start together.
        #[arg(long)]
        wait_go: bool,
    },
    /// Read K seqlock records READS times, check each is untorn, print JSON
    /// (after a `ready` line).
    SeqRead {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long)]
        records: u32,
        #[arg(long)]
        reads: u64,
    },
}

pub(crate) fn run(command: FabricCommand) -> Result<()> {
    match command {
        FabricCommand::Serve(ServeArgs { node, regions, busy_threads, seq_records, service, observe }) => {
            let (_, fabric) = node.open()?;
            let serving = ServingNode::start(fabric, &regions, busy_threads, seq_records)?;
            let ready = ServingFlag::new();
            let observer =
                observe.start(Arc::new(ServeObserved { metrics: serving.metrics(), serving: ready.clone() }))?;
            let stopped = service.stop_watch_thread()?;
            // Ready before `ready` is printed, so whoever reads the line finds /readyz agreeing.
            ready.set(true);
            crate::service::announce_ready()?;
            let _ = stopped.recv();
            ready.set(false);
            drop(observer);
            serving.stop();
            Ok(())
        }
        FabricCommand::Op { node, target, op, offset, value, expected } => {
            let (_fabric, region) = target.connect(&node)?;
            println!("{}", fabric_node::op(region.as_ref(), &op, offset, value, expected)?);
            Ok(())
        }
        FabricCommand::Hammer { node, target, fetch_adds, cas_rounds, wait_go } => {
            let (_fabric, region) = target.connect(&node)?;
            crate::service::announce_ready()?;
            if wait_go {
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
            }
            println!("{}", fabric_node::hammer(region.as_ref(), node.node, fetch_adds, cas_rounds)?);
            Ok(())
        }
        FabricCommand::SeqRead { node, target, records, reads } => {
            let (_fabric, region) = target.connect(&node)?;
            let records = fabric_node::seq_records(records)?;
            crate::service::announce_ready()?;
            println!("{}", fabric_node::seq_read(region.as_ref(), &records, reads)?);
            Ok(())
        }
    }
}
