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
    /// Distributed lock manager (services paper Fig. 5): lock cascading latency, uncontended
    /// latency and contended throughput of N-CoShED, SRSL and DQNL; nodes are threads of this process.
    Dlm {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/dlm")]
        out: PathBuf,
        /// Fewer rounds and waiter counts 1,4,16 (for smoke runs).
        #[arg(long)]
        quick: bool,
        /// Backends to measure.
        #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
        backends: Vec<Backend>,
        /// Lock schemes to compare.
        #[arg(long, value_delimiter = ',', default_value = "ncoshed,srsl,dqnl")]
        schemes: Vec<tierstack_bench::dlm::Scheme>,
        /// Waiter counts of the cascade sweep (default 1,2,4,8,16; 1,4,16 with --quick).
        #[arg(long, value_delimiter = ',')]
        waiters: Option<Vec<usize>>,
        /// Cascades per cell, spread over 3 passes (default 90; 5 in one pass with --quick).
        #[arg(long)]
        rounds: Option<usize>,
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
        BenchCommand::Dlm { out, quick, backends, schemes, waiters, rounds } => {
            let mut config = tierstack_bench::dlm::DlmBenchConfig::new(out, quick);
            config.backends = backends;
            config.schemes = schemes;
            if let Some(waiters) = waiters {
                config.waiters = waiters;
            }
            if let Some(rounds) = rounds {
                config.rounds = rounds;
            }
            tierstack_bench::dlm::run(&config)?;
            Ok(())
        }
    }
}
