//! The demo's story, as data: the same load through each way of serving
//! (no cache, a TTL cache, coherent polling over two-sided messages and over
//! one-sided reads), one row each, a one-line verdict, and the report page.
//!
//! `tierstack demo` runs the configurations (see [`tierstack_deploy::deployment`]); this
//! module turns their load reports and proxy counters into the comparison
//! table, the verdict and `index.html` with its plots. Everything here but
//! [`write_report`] is pure.

use crate::coherence::Mode;
use crate::html::Page;
use crate::report::{bar_chart, line_plot_with, thousands, Axes, BarGroup, PlotOptions, Series, Table};
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};
use tierstack_cluster::Backend;
use tierstack_loadgen::{LoadReport, SecondPoint};
use tierstack_proxy::ProxyStats;

/// The configurations of the comparison, in the order the story is told:
/// the floor (every request reaches the application tier), the fast but
/// incoherent TTL cache, then coherent polling, two-sided and one-sided.
pub fn comparison() -> Vec<Mode> {
    vec![
        Mode::new("no-cache", Backend::Shm),
        Mode::new("ttl", Backend::Shm),
        Mode::new("poll", Backend::Tcp),
        Mode::new("poll", Backend::Shm),
    ]
}

/// The mode named on the command line (`no-cache`, `ttl` or `poll`) on `backend`.
pub fn mode(cache: &str, backend: Backend) -> Result<Mode> {
    let cache = match cache {
        "no-cache" => "no-cache",
        "ttl" => "ttl",
        "poll" => "poll",
        other => anyhow::bail!("unknown proxy mode {other:?} (expected no-cache, ttl or poll)"),
    };
    Ok(Mode::new(cache, backend))
}

/// Does `mode` promise never to serve a stale response? Every mode but
/// `ttl` (which serves cached copies without asking whether they changed).
pub fn coherent(mode: &Mode) -> bool {
    mode.cache != "ttl"
}

/// One configuration's outcome: a row of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// `no-cache`, `ttl`, `poll/tcp`, `poll/shm`.
    pub mode: String,
    pub coherent: bool,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    /// `None` when no response said whether it was a hit.
    pub hit_rate: Option<f64>,
    /// Version checks the proxies made (one batched read each).
    pub version_checks: u64,
    /// Updates the updater completed during the run.
    pub updates: u64,
    /// Requests that failed, of any kind.
    pub errors: u64,
    /// Responses older than an update that completed before they were requested.
    pub stale: u64,
}

impl Row {
    pub fn of(mode: &Mode, load: &LoadReport, proxies: &[ProxyStats]) -> Row {
        let us = |ns: u64| ns as f64 / 1e3;
        Row {
            mode: mode.label(),
            coherent: coherent(mode),
            throughput_rps: load.throughput_rps,
            p50_us: us(load.latency.p50_ns),
            p90_us: us(load.latency.p90_ns),
            p99_us: us(load.latency.p99_ns),
            hit_rate: load.hit_rate,
            version_checks: proxies.iter().map(|p| p.checks).sum(),
            updates: load.updates.done,
            errors: load.errors.total(),
            stale: load.stale_responses,
        }
    }
}

/// The comparison table's columns, as printed.
pub const COLUMNS: [&str; 9] = [
    "mode",
    "throughput req/s",
    "p50 µs",
    "p99 µs",
    "hit rate",
    "version checks",
    "updates",
    "errors",
    "stale responses",
];

/// The comparison table: one row per configuration.
pub fn table(rows: &[Row]) -> Table {
    let mut table = Table::new("tierstack demo: the same load through each cache", &COLUMNS);
    for row in rows {
        table.row(vec![
            row.mode.clone(),
            thousands(row.throughput_rps.round() as i64),
            format!("{:.0}", row.p50_us),
            format!("{:.0}", row.p99_us),
            row.hit_rate.map_or_else(|| "-".to_string(), |h| format!("{:.1} %", 100.0 * h)),
            thousands(row.version_checks as i64),
            thousands(row.updates as i64),
            thousands(row.errors as i64),
            thousands(row.stale as i64),
        ]);
    }
    table
}

/// The story in one line: how the one-sided coherent cache compares with
/// each other configuration, and what the incoherent ones served stale.
/// Without a `poll/shm` row, each row's stale count.
pub fn verdict(rows: &[Row]) -> String {
    let mut parts = Vec::new();
    let best = rows.iter().find(|r| r.mode == "poll/shm");
    if let Some(best) = best {
        let mut ratios: Vec<String> = rows
            .iter()
            .filter(|r| r.mode != best.mode && r.throughput_rps > 0.0)
            .map(|r| format!("{} {}'s", ratio(best.throughput_rps / r.throughput_rps), r.mode))
            .collect();
        if let Some(first) = ratios.first_mut() {
            first.push_str(" throughput");
        }
        ratios.push(format!("{} stale", thousands(best.stale as i64)));
        parts.push(format!("{}: {}", best.mode, ratios.join(", ")));
    }
    for row in rows.iter().filter(|r| best.is_none_or(|b| b.mode != r.mode)) {
        if !row.coherent || row.stale > 0 || best.is_none() {
            let why = if row.coherent { "" } else { " (never revalidates)" };
            parts.push(format!("{}: {} stale{why}", row.mode, thousands(row.stale as i64)));
        }
    }
    format!("verdict: {}", parts.join("; "))
}

/// A ratio with the digits that matter: `95x`, `9.5x`, `0.95x`.
fn ratio(value: f64) -> String {
    if value >= 10.0 {
        format!("{value:.0}x")
    } else if value >= 1.0 {
        format!("{value:.1}x")
    } else {
        format!("{value:.2}x")
    }
}

/// The points of `series` that cover a whole second of a run that lasted
/// `elapsed_s`: the last, partial second is left out, so it is not drawn as
/// a drop in throughput.
pub fn whole_seconds(series: &[SecondPoint], elapsed_s: f64) -> impl Iterator<Item = &SecondPoint> {
    series.iter().filter(move |p| f64::from(p.second) + 1.0 <= elapsed_s + 1e-9)
}

/// One configuration's run, for the report.
pub struct RunView<'a> {
    pub mode: String,
    pub load: &'a LoadReport,
}

/// What the page says about the set-up, above the numbers.
pub struct Setup {
    pub description: String,
    /// The command that reproduces the run.
    pub command: String,
}

/// Draws the demo's plots into `dir` and writes `dir/index.html`: the
/// comparison table and verdict, throughput per whole second per
/// configuration on one chart, stale responses per configuration, latency
/// percentiles, hit rate per whole second, then `details` (a table per
/// configuration). Returns the page's path.
pub fn write_report(
    dir: &Path,
    setup: &Setup,
    rows: &[Row],
    runs: &[RunView<'_>],
    details: &[Table],
) -> Result<PathBuf> {
    let mut page = Page::new("tierstack demo");
    page.paragraph(&setup.description);
    page.preformatted(&setup.command);
    page.table(&table(rows));
    page.preformatted(&verdict(rows));

    let per_second = |f: fn(&SecondPoint) -> Option<f64>| -> Vec<Series> {
        runs.iter()
            .map(|run| Series {
                label: run.mode.clone(),
                points: whole_seconds(&run.load.series, run.load.elapsed_s)
                    .filter_map(|p| f(p).map(|y| (f64::from(p.second) + 0.5, y)))
                    .collect(),
            })
            .collect()
    };
    let throughput = per_second(|p| Some(p.throughput_rps));
    // No cache and a one-sided cache differ by orders of magnitude under
    // load: a log axis keeps both readable.
    let values: Vec<f64> = throughput.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|v| *v > 0.0).collect();
    let spread = values.iter().copied().fold(0.0, f64::max) / values.iter().copied().fold(f64::INFINITY, f64::min);
    let time = "time since the load started (s), one point per whole second";
    page.heading("Throughput");
    let path = dir.join("throughput.svg");
    line_plot_with(
        &path,
        "Throughput per second, by configuration (cf. coherency paper Fig. 9b)",
        Axes { x_label: time, y_label: "throughput (requests/s)", log_x: false, log_y: spread > 20.0 },
        &throughput,
        PlotOptions::default(),
    )?;
    page.plot(&path)?;

    page.heading("Stale responses");
    page.paragraph(
        "A response is stale when an update of a document it depends on completed before the request was sent. \
         Every response is checked.",
    );
    let names: Vec<String> = rows.iter().map(|r| r.mode.clone()).collect();
    let path = dir.join("stale.svg");
    bar_chart(
        &path,
        "Stale responses served, by configuration",
        Axes { x_label: "configuration", y_label: "stale responses (count)", log_x: false, log_y: false },
        &names,
        &[BarGroup { label: "stale".into(), values: rows.iter().map(|r| r.stale as f64).collect() }],
    )?;
    page.plot(&path)?;

    page.heading("Response time");
    let path = dir.join("latency.svg");
    let percentile =
        |label: &str, f: fn(&Row) -> f64| BarGroup { label: label.to_string(), values: rows.iter().map(f).collect() };
    bar_chart(
        &path,
        "Response time percentiles, by configuration (cf. coherency paper Fig. 9a)",
        Axes { x_label: "configuration", y_label: "response time (µs)", log_x: false, log_y: true },
        &names,
        &[percentile("p50", |r| r.p50_us), percentile("p90", |r| r.p90_us), percentile("p99", |r| r.p99_us)],
    )?;
    page.plot(&path)?;

    page.heading("Hit rate");
    let path = dir.join("hit-rate.svg");
    line_plot_with(
        &path,
        "Cache hit rate per second, by configuration",
        Axes { x_label: time, y_label: "hit rate (%)", log_x: false, log_y: false },
        &per_second(|p| p.hit_rate.map(|h| 100.0 * h)),
        PlotOptions { y_range: Some((0.0, 100.0)) },
    )?;
    page.plot(&path)?;

    page.heading("Each configuration in detail");
    for table in details {
        page.table(table);
    }
    page.write(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, throughput_rps: f64, stale: u64) -> Row {
        Row {
            mode: mode.to_string(),
            coherent: mode != "ttl",
            throughput_rps,
            p50_us: 100.0,
            p90_us: 150.0,
            p99_us: 300.0,
            hit_rate: Some(0.9),
            version_checks: 1000,
            updates: 6,
            errors: 0,
            stale,
        }
    }

    #[test]
    fn the_verdict_compares_the_one_sided_cache_with_each_other_and_names_the_stale() {
        let rows = [
            row("no-cache", 400.0, 0),
            row("ttl", 40_000.0, 12_345),
            row("poll/tcp", 4_000.0, 0),
            row("poll/shm", 38_000.0, 0),
        ];
        assert_eq!(
            verdict(&rows),
            "verdict: poll/shm: 95x no-cache's throughput, 0.95x ttl's, 9.5x poll/tcp's, 0 stale; \
             ttl: 12,345 stale (never revalidates)"
        );
        // A coherent mode that served stale responses is named too.
        let broken = [row("poll/tcp", 4_000.0, 3), row("poll/shm", 38_000.0, 0)];
        assert_eq!(verdict(&broken), "verdict: poll/shm: 9.5x poll/tcp's throughput, 0 stale; poll/tcp: 3 stale");
        // One configuration alone.
        assert_eq!(verdict(&[row("ttl", 1.0, 7)]), "verdict: ttl: 7 stale (never revalidates)");
        assert_eq!(verdict(&[row("poll/shm", 1.0, 0)]), "verdict: poll/shm: 0 stale");
        assert_eq!(verdict(&[row("poll/tcp", 1.0, 0)]), "verdict: poll/tcp: 0 stale");
    }

    #[test]
    fn the_table_has_a_row_per_configuration_and_the_documented_columns() {
        let rows = [row("no-cache", 400.4, 0), row("ttl", 40_000.0, 12_345)];
        let t = table(&rows);
        assert_eq!(t.header, COLUMNS);
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[1], ["ttl", "40,000", "100", "300", "90.0 %", "1,000", "6", "0", "12,345"]);
        assert_eq!(t.rows[0][1], "400");
    }

    #[test]
    fn the_partial_last_second_is_left_out() {
        let point = |second| SecondPoint { second, ok: 10, throughput_rps: 10.0, ..Default::default() };
        let series = [point(0), point(1), point(2)];
        let kept = |elapsed| whole_seconds(&series, elapsed).map(|p| p.second).collect::<Vec<_>>();
        assert_eq!(kept(2.4), [0, 1]);
        assert_eq!(kept(3.0), [0, 1, 2]);
        assert_eq!(kept(0.9), Vec::<u32>::new());
    }

    #[test]
    fn modes_are_named_as_on_the_command_line() {
        assert_eq!(mode("poll", Backend::Tcp).unwrap().label(), "poll/tcp");
        assert_eq!(mode("no-cache", Backend::Shm).unwrap().label(), "no-cache");
        assert!(mode("polling", Backend::Shm).is_err());
        assert_eq!(
            comparison().iter().map(Mode::label).collect::<Vec<_>>(),
            ["no-cache", "ttl", "poll/tcp", "poll/shm"]
        );
        assert!(!coherent(&comparison()[1]) && comparison().iter().filter(|m| coherent(m)).count() == 3);
    }
}
