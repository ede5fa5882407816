//! `tierstack trace`: look at a workload trace and export it.
//!
//! `show` prints, for the seeds' traces (`press:*`, `coop:*`), the seed's
//! numbers next to what was synthesized: files, mean file size, mean request
//! size, α (the maximum-likelihood fit over a sample of the request stream,
//! `tierstack_workload::fit_zipf_alpha`), working set and cache per node.
//! Other traces show the synthesized column alone. `export` writes a
//! trace's request stream as Common Log Format, which `--trace clf:FILE`
//! replays (`tierstack_workload::write_clf`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tierstack_workload::published::{Targets, MB};
use tierstack_workload::{fit_zipf_alpha, write_clf, Trace, TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Target vs synthesized statistics: files, mean file and request size, alpha fitted from a sample, working set, cache per node.
    Show(ShowArgs),
    /// Write a trace's requests as Common Log Format (replay them with --trace clf:FILE).
    Export(ExportArgs),
}

/// Which trace: the name, and the options every subcommand shares.
#[derive(Args)]
pub struct TraceArgs {
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
pub struct ShowArgs {
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
pub struct ExportArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Requests to write.
    #[arg(long)]
    requests: usize,
    /// The log file to write.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(command: TraceCommand) -> Result<()> {
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

/// The α of the request stream: the fit over the generator's ranks for a
/// popularity trace, over ranks ordered by count for a replayed list.
fn fitted_alpha(trace: &Trace, draws: usize, seed: u64) -> Option<f64> {
    let mut counts = vec![0u64; trace.documents().len()];
    for index in trace.stream(seed, 0, 1).take(draws) {
        counts[index] += 1;
    }
    if trace.popularity_alpha().is_none() {
        counts.sort_unstable_by(|a, b| b.cmp(a));
    }
    fit_zipf_alpha(&counts)
}

fn show(args: ShowArgs) -> Result<()> {
    let trace = args.trace.build()?;
    let summary = trace.summary();
    let alpha = fitted_alpha(&trace, args.sample, args.trace.seed);
    if args.json {
        let value = serde_json::json!({ "summary": summary, "fitted_alpha": alpha, "alpha_sample": args.sample });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let Some(published) = &summary.published else {
        println!("trace {} (seed {})", summary.label, args.trace.seed);
        let alpha_label = format!("alpha (fit, {} draws)", args.sample);
        let lines = [
            ("files", summary.documents.to_string()),
            ("mean file size", kb(summary.mean_document_bytes)),
            ("mean request size", kb(summary.mean_request_bytes)),
            (alpha_label.as_str(), alpha.map_or("-".into(), |a| format!("{a:.4}"))),
            ("working set", mib(summary.total_document_bytes as f64)),
        ];
        for (what, value) in lines {
            println!("  {what:<28}  {value}");
        }
        return Ok(());
    };
    println!("trace {} (seed {}, scale {}): {}", summary.label, args.trace.seed, published.scale, published.source);
    let scaled = published.scale != 1.0;
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut row = |what: &str, seed: String, target: String, got: String, error: String| {
        rows.push([what.to_string(), seed, target, got, error]);
    };
    let relative = |got: f64, want: f64| {
        if want == 0.0 {
            format!("{:+.3}", got - want)
        } else {
            format!("{:+.3} %", 100.0 * (got / want - 1.0))
        }
    };
    let (s, t): (&Targets, &Targets) = (&published.seed, &published.target);
    row("files", s.files.to_string(), t.files.to_string(), summary.documents.to_string(), {
        let d = summary.documents as i64 - t.files as i64;
        format!("{d:+}")
    });
    row(
        "mean file size",
        kb(s.mean_file_bytes),
        kb(t.mean_file_bytes),
        kb(summary.mean_document_bytes),
        relative(summary.mean_document_bytes, t.mean_file_bytes),
    );
    row(
        "mean request size",
        kb(s.mean_request_bytes),
        kb(t.mean_request_bytes),
        kb(summary.mean_request_bytes),
        relative(summary.mean_request_bytes, t.mean_request_bytes),
    );
    row(
        &format!("alpha (MLE, {} draws)", args.sample),
        format!("{:.2}", s.alpha),
        format!("{:.2}", t.alpha),
        alpha.map_or("-".into(), |a| format!("{a:.4}")),
        alpha.map_or("-".into(), |a| format!("{:+.4}", a - t.alpha)),
    );
    let working_set = summary.total_document_bytes as f64;
    row(
        "working set",
        mib(s.working_set_bytes()),
        mib(t.working_set_bytes()),
        mib(working_set),
        relative(working_set, t.working_set_bytes()),
    );
    let cache = t.cache_bytes_per_node as f64;
    row("cache per node", mib(s.cache_bytes_per_node as f64), mib(cache), mib(cache), "exact".into());
    row(
        "working set / cache",
        format!("{:.3}", s.working_set_bytes() / s.cache_bytes_per_node as f64),
        format!("{:.3}", t.working_set_bytes() / cache),
        format!("{:.3}", working_set / cache),
        relative(working_set / cache, t.working_set_bytes() / cache),
    );
    row(
        "requests in the log",
        s.nominal_requests.map_or("-".into(), |r| r.to_string()),
        t.nominal_requests.map_or("-".into(), |r| r.to_string()),
        "(a run chooses)".into(),
        String::new(),
    );
    let header = ["quantity", "seed", if scaled { "target (scaled)" } else { "target" }, "synthesized", "error"];
    let columns = if scaled { vec![0, 1, 2, 3, 4] } else { vec![0, 2, 3, 4] };
    let widths: Vec<usize> =
        (0..5).map(|c| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0)).collect();
    let line = |cells: [&str; 5]| {
        let text: Vec<String> = columns
            .iter()
            .map(|&c| {
                if c == 0 {
                    format!("{:<w$}", cells[c], w = widths[c])
                } else {
                    format!("{:>w$}", cells[c], w = widths[c])
                }
            })
            .collect();
        println!("  {}", text.join("  ").trim_end());
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4]]);
    }
    let mut sizes: Vec<u64> = trace.documents().iter().map(|d| d.size_bytes).collect();
    sizes.sort_unstable();
    let at = |q: f64| sizes[((sizes.len() - 1) as f64 * q).round() as usize];
    println!(
        "  file sizes: min {}, median {}, p99 {}, max {}",
        bytes(at(0.0)),
        bytes(at(0.5)),
        bytes(at(0.99)),
        bytes(at(1.0))
    );
    match &published.size_model {
        Some(m) => println!(
            "  size model: log-normal body (sigma {}) + Pareto tail ({:.0} % of files, index {:.3}), {} to {}; \
             size-rank correlation rho {:.3}; polish swaps {}",
            m.shape.body_sigma,
            100.0 * m.shape.tail_share,
            m.shape.tail_index,
            bytes(m.shape.min_bytes),
            bytes(m.shape.max_bytes),
            m.size_rank_correlation,
            m.polish_swaps
        ),
        None => println!("  every file has the same size; requests are uniform over the files"),
    }
    Ok(())
}

fn kb(bytes: f64) -> String {
    format!("{:.2} KB", bytes / 1024.0)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MB", bytes / MB as f64)
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= MB => format!("{:.1} MB", n as f64 / MB as f64),
        n if n >= 1024 => format!("{:.1} KB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
