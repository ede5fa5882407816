//! `tierstack trace`: look at a workload trace and export it.
//!
//! `show` prints, for the seeds' traces (`press:*`, `coop:*`), the seed's
//! numbers next to what was synthesized: files, mean file size, mean request
//! size, α (the maximum-likelihood fit over a sample of the request stream,
//! `tierstack_workload::fit_zipf_alpha`), working set and cache per node.
//! Other traces show the synthesized column alone. `export` writes a
//! trace's request stream as Common Log Format, which `--trace clf:FILE`
//! replays (`tierstack_workload::write_clf`). The table is
//! `tierstack_workload::show`'s text.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tierstack_workload::show::fitted_alpha;
use tierstack_workload::{write_clf, Trace, TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

#[derive(Subcommand)]
pub(crate) enum TraceCommand {
    /// Target vs synthesized statistics: files, mean file and request size, alpha fitted from a sample, working set, cache per node.
    Show(ShowArgs),
    /// Write a trace's requests as Common Log Format (replay them with --trace clf:FILE).
    Export(ExportArgs),
}

/// Which trace: the name, and the options every subcommand shares.
#[derive(Args)]
pub(crate) struct TraceArgs {
    /// press:{clarknet,nasa,rutgers,usask,wc98}[@SCALE], coop:{8k,16k,32k,64k}[@SCALE], single, zipf, worldcup or clf:PATH.
    name: String,
    /// Seed of the synthesis and of the request stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Shrink the file count and the per-node cache by this factor in (0, 1] (the same as NAME@SCALE).
    #[arg(long)]
    scale: Option<f64>,
}

impl TraceArgs {
    fn build(&self) -> Result<Trace> {
        let mut spec = TraceSpec::parse(&self.name, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT)?;
        if let Some(scale) = self.scale {
            if self.name.contains('@') {
                bail!("give the scale once: either {} or --scale {scale}", self.name);
            }
            spec = spec.with_scale(scale)?;
        }
        spec.build(self.seed).with_context(|| format!("building trace {}", self.name))
    }
}

#[derive(Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Requests drawn for the alpha fit.
    #[arg(long, default_value_t = 1_000_000)]
    sample: usize,
    /// Print the trace summary and the fitted alpha as JSON instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Requests to write.
    #[arg(long)]
    requests: usize,
    /// The log file to write.
    #[arg(long)]
    out: PathBuf,
}

pub(crate) fn run(command: TraceCommand) -> Result<()> {
    match command {
        TraceCommand::Show(args) => show(args),
        TraceCommand::Export(args) => export(args),
    }
}

fn export(args: ExportArgs) -> Result<()> {
    let trace = args.trace.build()?;
    let file = std::fs::File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let written = write_clf(&trace, args.requests, args.trace.seed, file)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {written} requests of {} (seed {}) to {}", trace.label(), args.trace.seed, args.out.display());
    Ok(())
}

fn show(args: ShowArgs) -> Result<()> {
    let trace = args.trace.build()?;
    let alpha = fitted_alpha(&trace, args.sample, args.trace.seed);
    if args.json {
        let value =
            serde_json::json!({ "summary": trace.summary(), "fitted_alpha": alpha, "alpha_sample": args.sample });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    print!("{}", tierstack_workload::show::show(&trace, args.trace.seed, args.sample, alpha));
    Ok(())
}
