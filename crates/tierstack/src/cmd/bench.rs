//! `tierstack bench …`: the experiments.

use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;
use tierstack_bench::fabric::{run as run_fabric, FabricBenchConfig};
use tierstack_cluster::Backend;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Fabric micro-benchmarks (coherency paper Fig. 8) and owner-load sensitivity.
    Fabric {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/fabric")]
        out: PathBuf,
        /// Shorter measurements (for smoke runs).
        #[arg(long)]
        quick: bool,
        /// Backends to measure.
        #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
        backends: Vec<Backend>,
        /// Busy threads in the owner, one run each.
        #[arg(long, value_delimiter = ',', default_value = "0,16,64,200")]
        loads: Vec<usize>,
    },
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Fabric { out, quick, backends, loads } => {
            let mut config = FabricBenchConfig::new(std::env::current_exe()?, out, quick);
            config.backends = backends;
            config.loads = loads;
            run_fabric(&config)?;
            Ok(())
        }
    }
}
