//! `tierstack trace show` as text: for the seeds' traces (`press:*`,
//! `coop:*`) the seed's numbers next to what was synthesized (files, mean
//! file size, mean request size, α fitted over a sample of the request
//! stream, working set, cache per node) with the relative error; other
//! traces show the synthesized column alone. The binary prints [`show`]'s
//! text as it is.

use crate::published::{Targets, MB};
use crate::{fit_zipf_alpha, Trace};
use std::fmt::{self, Write};

/// The α of the request stream: the fit over the generator's ranks for a
/// popularity trace, over ranks ordered by count for a replayed list.
pub fn fitted_alpha(trace: &Trace, draws: usize, seed: u64) -> Option<f64> {
    let mut counts = vec![0u64; trace.documents().len()];
    for index in trace.stream(seed, 0, 1).take(draws) {
        counts[index] += 1;
    }
    if trace.popularity_alpha().is_none() {
        counts.sort_unstable_by(|a, b| b.cmp(a));
    }
    fit_zipf_alpha(&counts)
}

/// The `trace show` table of `trace` (built with `seed`), with `alpha`
/// fitted from `sample` draws ([`fitted_alpha`]).
pub fn show(trace: &Trace, seed: u64, sample: usize, alpha: Option<f64>) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_show(&mut out, trace, seed, sample, alpha);
    out
}

fn write_show(out: &mut String, trace: &Trace, seed: u64, sample: usize, alpha: Option<f64>) -> fmt::Result {
    let summary = trace.summary();
    let Some(published) = &summary.published else {
        writeln!(out, "trace {} (seed {})", summary.label, seed)?;
        let alpha_label = format!("alpha (fit, {} draws)", sample);
        let lines = [
            ("files", summary.documents.to_string()),
            ("mean file size", kb(summary.mean_document_bytes)),
            ("mean request size", kb(summary.mean_request_bytes)),
            (alpha_label.as_str(), alpha.map_or("-".into(), |a| format!("{a:.4}"))),
            ("working set", mib(summary.total_document_bytes as f64)),
        ];
        for (what, value) in lines {
            writeln!(out, "  {what:<28}  {value}")?;
        }
        return Ok(());
    };
    writeln!(out, "trace {} (seed {}, scale {}): {}", summary.label, seed, published.scale, published.source)?;
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
        &format!("alpha (MLE, {} draws)", sample),
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
    let line = |out: &mut String, cells: [&str; 5]| {
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
        writeln!(out, "  {}", text.join("  ").trim_end())
    };
    line(out, header)?;
    for r in &rows {
        line(out, [&r[0], &r[1], &r[2], &r[3], &r[4]])?;
    }
    let mut sizes: Vec<u64> = trace.documents().iter().map(|d| d.size_bytes).collect();
    sizes.sort_unstable();
    let at = |q: f64| sizes[((sizes.len() - 1) as f64 * q).round() as usize];
    writeln!(
        out,
        "  file sizes: min {}, median {}, p99 {}, max {}",
        bytes(at(0.0)),
        bytes(at(0.5)),
        bytes(at(0.99)),
        bytes(at(1.0))
    )?;
    match &published.size_model {
        Some(m) => writeln!(
            out,
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
        None => writeln!(out, "  every file has the same size; requests are uniform over the files"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

    fn build(name: &str) -> Trace {
        TraceSpec::parse(name, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT).unwrap().build(1).unwrap()
    }

    #[test]
    fn sizes_are_written_in_the_largest_unit_that_fits() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KB");
        assert_eq!(bytes(3 * MB), "3.0 MB");
        assert_eq!(kb(2048.0), "2.00 KB");
        assert_eq!(mib(MB as f64 / 2.0), "0.5 MB");
    }

    #[test]
    fn a_synthetic_trace_shows_the_synthesized_column_alone() {
        let trace = build("zipf");
        let alpha = fitted_alpha(&trace, 20_000, 1);
        let text = show(&trace, 1, 20_000, alpha);
        assert!(text.starts_with("trace "), "{text}");
        assert!(text.contains("(seed 1)\n"), "{text}");
        assert!(text.contains("alpha (fit, 20000 draws)"), "{text}");
        assert!(!text.contains("synthesized"), "no target columns: {text}");
        let alpha = alpha.expect("a fit");
        assert!((alpha - ZIPF_ALPHA_DEFAULT).abs() < 0.1, "the fit finds the generator's alpha: {alpha}");
    }

    #[test]
    fn a_seed_trace_shows_seed_target_and_error_columns() {
        let trace = build("coop:8k@0.05");
        let text = show(&trace, 1, 10_000, fitted_alpha(&trace, 10_000, 1));
        let header = text.lines().nth(1).expect("a header line");
        for column in ["quantity", "seed", "target (scaled)", "synthesized", "error"] {
            assert!(header.contains(column), "{column} in {header}");
        }
        for row in ["files", "mean file size", "working set / cache", "cache per node", "file sizes: min"] {
            assert!(text.contains(row), "{row} in {text}");
        }
        assert!(text.ends_with('\n'));
    }
}
