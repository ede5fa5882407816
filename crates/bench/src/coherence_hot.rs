//! `tierstack bench coherence --hot`: hot documents under updates
//! (issues 16 and 31).
//!
//! 32 connections on one hot 8 KiB document and on the Zipf trace, an
//! update per second, at 0 and 200 compute threads, with the application
//! server spending a CPU cost per page it generates (`--cpu-cost`: none, a
//! fixed few milliseconds, the RUBiS-like mix; on a busy tier that CPU comes
//! in slices, which is what makes a refetch slow). Modes ([`hot_modes`]):
//! the ttl bound, poll/shm, write-through push (`+wt`), proxy-side refresh
//! (`+refresh`) and published pages (`+publish`: versions change at
//! UPDATE_DONE and a failed check reads the published page one-sidedly).
//!
//! **Alternated rounds** ([`plan`]): round r runs every (trace, threads,
//! cost, mode) once, each cell's modes in an order rotated by r, so drift
//! over the experiment hits every mode alike. Each cell and mode is
//! reported as the median and min–max over rounds ([`summarize`]), with
//! the median over rounds of the ratios to ttl measured in the same round.
//!
//! **The acceptance line** ([`acceptance`]): at the most compute threads,
//! published pages' median p99 ≤ 2× ttl's and median throughput ≥ 0.95×
//! ttl's, per cost and trace; 0 stale in every coherent run (the run fails
//! otherwise). **The refresh study** ([`refresh_study`]): poll/shm with the
//! proxies' refresh on and off, the module in both placements, in the same
//! rounds, for choosing `--refresh-hot`'s default.

use crate::coherence::{
    load_average, measure, stale_verdict, CoherenceBenchConfig, Mode, Placement, Run, REFRESH_ARGS,
};
use crate::html::Report;
use crate::report::{bars_by, Axes, Plot, Table};
use anyhow::Result;
use serde::Serialize;
use tierstack_appserver::cost::CpuCost;
use tierstack_cluster::{pin_to_cpu, Backend};

/// ttl's label: the bound every ratio is to.
pub const TTL: &str = "ttl@own";
/// Published pages' label: the mode the acceptance line is about.
pub const PUBLISH: &str = "poll/shm+publish@own";
/// Published pages' p99 may be at most this multiple of ttl's.
pub const P99_BOUND: f64 = 2.0;
/// Published pages' throughput must be at least this fraction of ttl's.
pub const RPS_BOUND: f64 = 0.95;

/// The hot-document experiment's modes, the application tier in sessions
/// of its own ([`Placement::Own`]): with it in the load client's session,
/// the compute threads' load would take that session's CPU weight from the
/// proxies and the load client on the other CPU, and any other session
/// there (a shared machine) would starve them, ttl included.
pub fn hot_modes() -> Vec<Mode> {
    let poll = || Mode { placement: Placement::Own, ..Mode::new("poll", Backend::Shm) };
    vec![
        Mode { placement: Placement::Own, ..Mode::new("ttl", Backend::Shm) },
        poll(),
        Mode { write_through: true, ..poll() },
        Mode { refresh: true, ..poll() },
        Mode { publish: true, ..poll() },
    ]
}

/// The refresh study's modes beyond [`hot_modes`]: poll/shm with refresh
/// off and on, the module in the compute threads' session.
pub fn refresh_study_modes() -> Vec<Mode> {
    let poll = Mode::new("poll", Backend::Shm);
    vec![poll, Mode { refresh: true, ..poll }]
}

/// The modes named by `labels` (as [`Mode::label`] spells them), in the
/// experiment's order; an unknown label is an error.
pub fn select_modes(labels: &[String]) -> Result<Vec<Mode>> {
    let all: Vec<Mode> = hot_modes().into_iter().chain(refresh_study_modes()).collect();
    for label in labels {
        anyhow::ensure!(
            all.iter().any(|m| m.label() == *label),
            "mode {label:?}: expected one of {}",
            all.iter().map(Mode::label).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(all.into_iter().filter(|m| labels.contains(&m.label())).collect())
}

/// `--cpu-cost`'s list: specs separated by commas, where a part that does
/// not start with a letter continues the spec before it (`pareto:` takes
/// three comma-separated numbers). Each spec is checked.
pub fn cost_specs(text: &str) -> Result<Vec<String>> {
    let mut specs: Vec<String> = Vec::new();
    for part in text.split(',') {
        match (part.trim().starts_with(|c: char| c.is_ascii_alphabetic()), specs.last_mut()) {
            (false, Some(last)) => {
                last.push(',');
                last.push_str(part.trim());
            }
            _ => specs.push(part.trim().to_string()),
        }
    }
    for spec in &specs {
        if spec != crate::coherence::NO_COST {
            CpuCost::parse(spec, 1).map_err(|e| anyhow::anyhow!("--cpu-cost: {e}"))?;
        }
    }
    Ok(specs)
}

/// One cell of the experiment: what every mode is measured on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cell {
    pub trace: String,
    pub compute_threads: usize,
    /// The application server's `--cpu-cost` (`none`: none).
    pub cost: String,
}

impl Cell {
    fn of(run: &Run) -> Cell {
        Cell { trace: run.trace.clone(), compute_threads: run.compute_threads, cost: run.cpu_cost.clone() }
    }

    fn name(&self) -> String {
        format!("{}, {} threads, cost {}", self.trace, self.compute_threads, self.cost)
    }
}

/// One run of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub round: usize,
    pub cell: Cell,
    pub mode: Mode,
}

/// Every cell with its modes, and the refresh study's modes added to the
/// single document's cells at the most compute threads.
pub fn cells(config: &CoherenceBenchConfig) -> Vec<(Cell, Vec<Mode>)> {
    let modes = config.modes.clone().unwrap_or_else(|| hot_modes().into_iter().chain(refresh_study_modes()).collect());
    let (own, shared): (Vec<Mode>, Vec<Mode>) = modes.into_iter().partition(|m| m.placement == Placement::Own);
    let most = config.compute_threads.iter().copied().max().unwrap_or(0);
    let mut out = Vec::new();
    for trace in &config.traces {
        for &compute_threads in &config.compute_threads {
            for cost in &config.costs {
                let mut modes = own.clone();
                if trace == "single" && compute_threads == most {
                    modes.extend(shared.iter().copied());
                }
                if !modes.is_empty() {
                    out.push((Cell { trace: trace.clone(), compute_threads, cost: cost.clone() }, modes));
                }
            }
        }
    }
    out
}

/// The runs, round by round: each round every cell once, its modes rotated
/// left by the round's number, so each mode runs early in some rounds and
/// late in others.
pub fn plan(cells: &[(Cell, Vec<Mode>)], repeats: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for round in 0..repeats {
        for (cell, modes) in cells {
            let mut order = modes.clone();
            if !modes.is_empty() {
                order.rotate_left(round % modes.len());
            }
            steps.extend(order.into_iter().map(|mode| Step { round, cell: cell.clone(), mode }));
        }
    }
    steps
}

/// A median with the smallest and largest value it summarizes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` for no values; the median of an even count is the mean of
    /// the middle two.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let (first, last) = (*sorted.first()?, *sorted.last()?);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        Some(Spread { median, min: first, max: last })
    }

    /// `median (min–max)`, with `digits` decimals.
    fn show(&self, digits: usize) -> String {
        format!("{:.*} ({:.*}–{:.*})", digits, self.median, digits, self.min, digits, self.max)
    }
}

/// One mode in one cell over every round.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub cell: Cell,
    pub mode: String,
    pub runs: usize,
    pub p50_us: Spread,
    pub p99_us: Spread,
    pub p999_us: Spread,
    pub max_us: Spread,
    pub throughput_rps: Spread,
    pub hit_rate: Spread,
    pub update_p50_us: Spread,
    pub update_p99_us: Spread,
    /// Stale responses, summed over the rounds.
    pub stale: u64,
    pub pages_installed: Option<Spread>,
    pub pages_unusable: Option<Spread>,
    /// Median over rounds of p99 / ttl's p99 in the same round and cell.
    pub p99_to_ttl: Option<f64>,
    /// Median over rounds of throughput / ttl's in the same round and cell.
    pub rps_to_ttl: Option<f64>,
}

/// Medians, spreads and ratios to ttl per cell and mode, in the order the
/// runs first show each.
pub fn summarize(runs: &[Run]) -> Vec<Summary> {
    let mut keys: Vec<(Cell, String)> = Vec::new();
    for run in runs {
        let key = (Cell::of(run), run.mode.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .filter_map(|(cell, mode)| {
            let mine: Vec<&Run> = runs.iter().filter(|r| r.mode == mode && Cell::of(r) == cell).collect();
            let spread = |f: fn(&Run) -> f64| Spread::of(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
            let ratio = |f: fn(&Run) -> f64| {
                let ratios: Vec<f64> = mine
                    .iter()
                    .filter_map(|r| {
                        let ttl = runs.iter().find(|t| t.mode == TTL && t.round == r.round && Cell::of(t) == cell)?;
                        Some(f(r) / f(ttl).max(1e-9))
                    })
                    .collect();
                Spread::of(&ratios).map(|s| s.median)
            };
            let counter = |f: fn(&Run) -> Option<u64>| {
                let values: Option<Vec<f64>> = mine.iter().map(|r| f(r).map(|n| n as f64)).collect();
                values.and_then(|v| Spread::of(&v))
            };
            Some(Summary {
                runs: mine.len(),
                p50_us: spread(|r| r.p50_us)?,
                p99_us: spread(|r| r.p99_us)?,
                p999_us: spread(|r| r.p999_us)?,
                max_us: spread(|r| r.max_us)?,
                throughput_rps: spread(|r| r.throughput_rps)?,
                hit_rate: spread(|r| r.hit_rate)?,
                update_p50_us: spread(|r| r.update_p50_us)?,
                update_p99_us: spread(|r| r.update_p99_us)?,
                stale: mine.iter().map(|r| r.stale_responses).sum(),
                pages_installed: counter(|r| r.pages_installed),
                pages_unusable: counter(|r| r.pages_unusable),
                p99_to_ttl: ratio(|r| r.p99_us),
                rps_to_ttl: ratio(|r| r.throughput_rps),
                cell,
                mode,
            })
        })
        .collect()
}

/// The acceptance line's verdict in one cell.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub cell: Cell,
    /// Published pages' median p99 / ttl's median p99.
    pub p99_ratio: f64,
    /// Published pages' median throughput / ttl's median throughput.
    pub rps_ratio: f64,
    pub pass: bool,
}

/// Published pages against ttl in every cell at `compute_threads`: median
/// p99 ≤ [`P99_BOUND`]× ttl's and median throughput ≥ [`RPS_BOUND`]× ttl's.
/// A cell without both modes has no verdict.
pub fn acceptance(summaries: &[Summary], compute_threads: usize) -> Vec<Verdict> {
    summaries
        .iter()
        .filter(|s| s.mode == PUBLISH && s.cell.compute_threads == compute_threads)
        .filter_map(|publish| {
            let ttl = summaries.iter().find(|s| s.mode == TTL && s.cell == publish.cell)?;
            let p99_ratio = publish.p99_us.median / ttl.p99_us.median.max(1e-9);
            let rps_ratio = publish.throughput_rps.median / ttl.throughput_rps.median.max(1e-9);
            Some(Verdict {
                cell: publish.cell.clone(),
                p99_ratio,
                rps_ratio,
                pass: p99_ratio <= P99_BOUND && rps_ratio >= RPS_BOUND,
            })
        })
        .collect()
}

/// Which of two spreads is better: only when their ranges do not overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Better {
    RefreshOn,
    RefreshOff,
    /// The ranges overlap: the rounds do not separate them.
    Neither,
}

impl Better {
    /// Of `on` and `off`, where a lower value is better when `lower_is_better`.
    pub fn of(on: Spread, off: Spread, lower_is_better: bool) -> Better {
        let (on_wins, off_wins) =
            if lower_is_better { (on.max < off.min, off.max < on.min) } else { (on.min > off.max, off.min > on.max) };
        match (on_wins, off_wins) {
            (true, _) => Better::RefreshOn,
            (_, true) => Better::RefreshOff,
            _ => Better::Neither,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Better::RefreshOn => "refresh on",
            Better::RefreshOff => "refresh off",
            Better::Neither => "neither (ranges overlap)",
        }
    }
}

/// Refresh on against off in one cell and placement.
#[derive(Clone, Debug, Serialize)]
pub struct RefreshComparison {
    pub cell: Cell,
    pub placement: String,
    pub off: Summary,
    pub on: Summary,
    pub p99: Better,
    pub throughput: Better,
}

/// poll/shm with refresh on against off, per cell and placement where
/// both were measured.
pub fn refresh_study(summaries: &[Summary]) -> Vec<RefreshComparison> {
    let mut out = Vec::new();
    for placement in [Placement::Shared, Placement::Own] {
        let label = |refresh| Mode { placement, refresh, ..Mode::new("poll", Backend::Shm) }.label();
        for off in summaries.iter().filter(|s| s.mode == label(false)) {
            let Some(on) = summaries.iter().find(|s| s.mode == label(true) && s.cell == off.cell) else { continue };
            out.push(RefreshComparison {
                cell: off.cell.clone(),
                placement: placement.name().to_string(),
                p99: Better::of(on.p99_us, off.p99_us, true),
                throughput: Better::of(on.throughput_rps, off.throughput_rps, false),
                off: off.clone(),
                on: on.clone(),
            });
        }
    }
    out
}

/// What `coherence-hot.json` holds.
#[derive(Serialize)]
pub struct HotReport {
    pub runs: Vec<Run>,
    pub summaries: Vec<Summary>,
    pub acceptance: Vec<Verdict>,
    pub refresh_study: Vec<RefreshComparison>,
}

/// Runs the [`plan`] of `config`'s cells over `config.repeats` rounds,
/// writes and prints the report, and fails (after writing it) if a
/// coherent mode served a stale response.
pub fn run_hot(config: &CoherenceBenchConfig) -> Result<HotReport> {
    std::fs::create_dir_all(&config.out_dir)?;
    if tierstack_cluster::online_cpus() >= 2 {
        pin_to_cpu(0)?;
    }
    let steps = plan(&cells(config), config.repeats);
    let mut runs = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        eprintln!(
            "bench coherence --hot [{}/{}] round {}: {} on {} (load {})",
            i + 1,
            steps.len(),
            step.round + 1,
            step.mode.label(),
            step.cell.name(),
            load_average()
        );
        let mut run = measure(config, step.mode, &step.cell.trace, step.cell.compute_threads, &step.cell.cost)?;
        run.round = step.round;
        runs.push(run);
    }
    let summaries = summarize(&runs);
    let most = config.compute_threads.iter().copied().max().unwrap_or(0);
    let report = HotReport {
        acceptance: acceptance(&summaries, most),
        refresh_study: refresh_study(&summaries),
        summaries,
        runs,
    };
    write_report(config, &report)?;
    stale_verdict(report.runs.iter().map(|r| (r.mode.as_str(), r.trace.as_str(), r.stale_responses)))?;
    Ok(report)
}

/// The page: the summary table, the acceptance line, the refresh study,
/// bars of median p99 and throughput per cost, and `coherence-hot.json`.
fn write_report(config: &CoherenceBenchConfig, report: &HotReport) -> Result<()> {
    let mut out = Report::new(&config.out_dir, "bench coherence --hot", "hot documents under updates, page costs");
    out.page().paragraph(&format!(
        "{} connections, an update every {} ms, {:.0} s per run, warm caches, {} proxies; {} rounds, each running \
         every cell's modes once in an order rotated per round; each cell shows the median (min–max) over rounds \
         and the median over rounds of the ratio to ttl in the same round. Cost: the application server's CPU per \
         page generated (--cpu-cost). poll/shm+wt pushes each update's new version to the proxies before \
         UPDATE_DONE (bound {:?}); +refresh: the proxies refresh their hot documents ({}); +publish: versions \
         change at UPDATE_DONE and a failed check reads the page the update published at the module; @own: module \
         and application server in sessions of their own, else in the compute threads' session.",
        config.connections,
        config.update_interval_ms,
        config.duration.as_secs_f64(),
        config.proxies,
        config.repeats,
        config.write_through_bound,
        REFRESH_ARGS.join(" ")
    ));
    out.table(&summary_table(&report.summaries));
    out.text(&acceptance_lines(report).join("\n"));
    out.table(&refresh_table(&report.refresh_study));
    out.text(&refresh_verdict(&report.refresh_study));
    out.json("coherence-hot.json", report)?;
    let axes = |y| Axes {
        x_label: "trace, compute threads on the application server",
        y_label: y,
        log_x: false,
        log_y: false,
    };
    let own: Vec<&Summary> = report.summaries.iter().filter(|s| s.mode.ends_with("@own")).collect();
    for (i, cost) in config.costs.iter().enumerate() {
        let mine: Vec<&Summary> = own.iter().copied().filter(|s| s.cell.cost == *cost).collect();
        let case = |s: &&Summary| format!("{}, {} threads", s.cell.trace, s.cell.compute_threads);
        let mode = |s: &&Summary| s.mode.clone();
        out.plot(&Plot::bars(
            &format!("coherence-hot-p99-{i}.svg"),
            &format!("Hot documents, page cost {cost}: median p99 by mode"),
            Axes { log_y: true, ..axes("response time p99, median over rounds (µs)") },
            bars_by(&mine, case, mode, |s| s.p99_us.median),
        ))?;
        out.plot(&Plot::bars(
            &format!("coherence-hot-throughput-{i}.svg"),
            &format!("Hot documents, page cost {cost}: median throughput by mode"),
            axes("throughput, median over rounds (requests/s)"),
            bars_by(&mine, case, mode, |s| s.throughput_rps.median),
        ))?;
    }
    out.finish()?;
    Ok(())
}

fn ratio(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.2}")).unwrap_or_default()
}

/// Every cell and mode: medians (min–max) over rounds, ratios to ttl.
fn summary_table(summaries: &[Summary]) -> Table {
    let mut table = Table::with_units(
        "Hot documents: median (min–max) over rounds",
        &[
            ("trace", ""),
            ("threads", ""),
            ("cost", ""),
            ("mode", ""),
            ("p50", "µs"),
            ("p99", "µs"),
            ("p99 / ttl", "median"),
            ("p99.9", "µs"),
            ("max", "µs"),
            ("throughput", "requests/s"),
            ("rps / ttl", "median"),
            ("hit rate", ""),
            ("update p50", "µs"),
            ("update p99", "µs"),
            ("pages installed", ""),
            ("pages unusable", ""),
            ("stale", "sum"),
            ("runs", ""),
        ],
    );
    for s in summaries {
        table.row(vec![
            s.cell.trace.clone(),
            s.cell.compute_threads.to_string(),
            s.cell.cost.clone(),
            s.mode.clone(),
            s.p50_us.show(0),
            s.p99_us.show(0),
            ratio(s.p99_to_ttl),
            s.p999_us.show(0),
            s.max_us.show(0),
            s.throughput_rps.show(0),
            ratio(s.rps_to_ttl),
            s.hit_rate.show(3),
            s.update_p50_us.show(0),
            s.update_p99_us.show(0),
            s.pages_installed.map(|p| p.show(0)).unwrap_or_else(|| "-".into()),
            s.pages_unusable.map(|p| p.show(0)).unwrap_or_else(|| "-".into()),
            s.stale.to_string(),
            s.runs.to_string(),
        ]);
    }
    table
}

/// The acceptance line per cell, and the coherent runs' stale count.
fn acceptance_lines(report: &HotReport) -> Vec<String> {
    let mut lines = vec![format!(
        "== Acceptance: {PUBLISH} at the most compute threads, median p99 <= {P99_BOUND}x ttl's and median \
         throughput >= {RPS_BOUND}x ttl's =="
    )];
    if report.acceptance.is_empty() {
        lines.push(format!("not measured ({PUBLISH} or {TTL} not run)"));
    }
    for v in &report.acceptance {
        lines.push(format!(
            "{}: p99 {:.2}x ttl, throughput {:.2}x ttl: {}",
            v.cell.name(),
            v.p99_ratio,
            v.rps_ratio,
            if v.pass { "PASS" } else { "FAIL" }
        ));
    }
    let coherent = report.runs.iter().filter(|r| !r.mode.starts_with("ttl"));
    let (count, stale) = coherent.fold((0, 0), |(n, s), r| (n + 1, s + r.stale_responses));
    lines.push(format!("stale responses in {count} coherent runs: {stale} (must be 0)"));
    lines
}

/// The refresh study: each placement and cell, off beside on.
fn refresh_table(study: &[RefreshComparison]) -> Table {
    let mut table = Table::with_units(
        "Refresh study: poll/shm, proxies' refresh off and on, median (min–max) over rounds",
        &[
            ("placement", ""),
            ("cell", ""),
            ("p99 off", "µs"),
            ("p99 on", "µs"),
            ("better p99", ""),
            ("rps off", "requests/s"),
            ("rps on", "requests/s"),
            ("better rps", ""),
        ],
    );
    for c in study {
        table.row(vec![
            c.placement.clone(),
            c.cell.name(),
            c.off.p99_us.show(0),
            c.on.p99_us.show(0),
            c.p99.name().into(),
            c.off.throughput_rps.show(0),
            c.on.throughput_rps.show(0),
            c.throughput.name().into(),
        ]);
    }
    table
}

/// How often refresh on or off was better, over every comparison.
fn refresh_verdict(study: &[RefreshComparison]) -> String {
    let count = |b: Better| study.iter().flat_map(|c| [c.p99, c.throughput]).filter(|&x| x == b).count();
    format!(
        "== Refresh study ({} comparisons of p99 and of throughput) ==\nrefresh on better: {}, refresh off better: \
         {}, not separated by the rounds: {}",
        study.len() * 2,
        count(Better::RefreshOn),
        count(Better::RefreshOff),
        count(Better::Neither)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coherence::Breakdown;

    fn cell(trace: &str, threads: usize, cost: &str) -> Cell {
        Cell { trace: trace.into(), compute_threads: threads, cost: cost.into() }
    }

    fn run(mode: &str, round: usize, p99_us: f64, throughput_rps: f64) -> Run {
        Run {
            mode: mode.into(),
            placement: "own".into(),
            write_through: false,
            trace: "single".into(),
            compute_threads: 200,
            cpu_cost: "none".into(),
            round,
            load_average: String::new(),
            update_p50_us: 10.0,
            update_p99_us: 20.0,
            throughput_rps,
            p50_us: p99_us / 2.0,
            p99_us,
            p999_us: p99_us * 2.0,
            max_us: p99_us * 4.0,
            mean_us: p99_us / 2.0,
            hit_rate: 0.99,
            stale_responses: 0,
            updates: 5,
            errors: 0,
            pages_installed: None,
            pages_unusable: None,
            breakdown: Breakdown::default(),
            proxies: Vec::new(),
        }
    }

    #[test]
    fn every_round_runs_every_cell_and_mode_once_in_a_rotated_order() {
        let modes = hot_modes();
        let cells = vec![(cell("single", 200, "none"), modes.clone()), (cell("zipf", 0, "rubis"), modes[..2].to_vec())];
        let steps = plan(&cells, 3);
        assert_eq!(steps.len(), 3 * (5 + 2));
        for round in 0..3 {
            let mine: Vec<&Step> = steps.iter().filter(|s| s.round == round).collect();
            for (c, ms) in &cells {
                let order: Vec<Mode> = mine.iter().filter(|s| s.cell == *c).map(|s| s.mode).collect();
                assert_eq!(order.len(), ms.len(), "each mode once per round");
                assert!(ms.iter().all(|m| order.contains(m)));
                assert_eq!(order[0], ms[round % ms.len()], "rotated by the round");
            }
        }
        // Every mode of the first cell leads a round: no mode always runs first.
        let leaders: Vec<Mode> = (0..3).map(|r| steps.iter().find(|s| s.round == r).unwrap().mode).collect();
        assert_eq!(leaders, modes[..3]);
        // Rounds run one after another: all of round 0 before any of round 1.
        assert!(steps.windows(2).all(|w| w[0].round <= w[1].round));
    }

    #[test]
    fn cells_cover_traces_threads_and_costs_with_the_refresh_study_at_the_most_threads() {
        let mut config = CoherenceBenchConfig::hot("tierstack".into(), "out".into(), false);
        config.costs = vec!["none".into(), "fixed:3000".into()];
        let cells = cells(&config);
        assert_eq!(cells.len(), 2 * 2 * 2, "traces x threads x costs");
        for (c, modes) in &cells {
            let study = c.trace == "single" && c.compute_threads == 200;
            assert_eq!(modes.len(), if study { 7 } else { 5 }, "{c:?}");
            assert_eq!(modes.iter().any(|m| m.placement == Placement::Shared), study, "{c:?}");
        }
        config.modes = Some(select_modes(&["ttl@own".into(), "poll/shm".into()]).unwrap());
        assert_eq!(modes_per_cell(&config), [1, 1, 2, 2, 1, 1, 1, 1]);
        assert!(select_modes(&["poll/shm+publish".into()]).is_err(), "unknown label");
    }

    fn modes_per_cell(config: &CoherenceBenchConfig) -> Vec<usize> {
        cells(config).iter().map(|(_, m)| m.len()).collect()
    }

    #[test]
    fn cost_lists_keep_pareto_specs_whole_and_refuse_bad_ones() {
        assert_eq!(
            cost_specs("none,fixed:3000,pareto:1.1,200,50000,rubis").unwrap(),
            ["none", "fixed:3000", "pareto:1.1,200,50000", "rubis"]
        );
        assert!(cost_specs("none,fixed:0").is_err());
        assert!(cost_specs("pareto:1.1,200").is_err());
        assert!(cost_specs("free").is_err());
    }

    #[test]
    fn spreads_are_medians_with_their_range() {
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]), Some(Spread { median: 2.0, min: 1.0, max: 3.0 }));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 10.0]), Some(Spread { median: 3.0, min: 1.0, max: 10.0 }));
        assert_eq!(Spread::of(&[7.0]), Some(Spread { median: 7.0, min: 7.0, max: 7.0 }));
        assert_eq!(Spread::of(&[]), None);
    }

    #[test]
    fn ratios_are_to_ttl_in_the_same_round_then_the_median() {
        // ttl drifts from round to round; publish tracks it at 1.5x p99.
        let runs = vec![
            run(TTL, 0, 100.0, 1000.0),
            run(PUBLISH, 0, 150.0, 900.0),
            run(TTL, 1, 1000.0, 500.0),
            run(PUBLISH, 1, 1500.0, 500.0),
            run(PUBLISH, 2, 90.0, 1100.0),
            run(TTL, 2, 60.0, 1000.0),
        ];
        let summaries = summarize(&runs);
        assert_eq!(summaries.len(), 2);
        let publish = summaries.iter().find(|s| s.mode == PUBLISH).unwrap();
        assert_eq!(publish.runs, 3);
        assert_eq!(publish.p99_us, Spread { median: 150.0, min: 90.0, max: 1500.0 });
        // Per round: 1.5, 1.5, 1.5 (not 150 / 100 of the medians' mix).
        assert_eq!(publish.p99_to_ttl, Some(1.5));
        // Per round: 0.9, 1.0, 1.1.
        assert!((publish.rps_to_ttl.unwrap() - 1.0).abs() < 1e-9);
        let ttl = summaries.iter().find(|s| s.mode == TTL).unwrap();
        assert_eq!(ttl.p99_to_ttl, Some(1.0));
        // Another cell's ttl is not this cell's.
        let mut other = run(PUBLISH, 0, 5.0, 5.0);
        other.cpu_cost = "rubis".into();
        let summaries = summarize(&[run(TTL, 0, 100.0, 1000.0), other]);
        assert_eq!(summaries[1].p99_to_ttl, None);
    }

    #[test]
    fn the_acceptance_line_holds_publish_to_twice_ttls_p99_and_95_percent_of_its_throughput() {
        let verdict = |p99: f64, rps: f64| {
            let runs = [run(TTL, 0, 100.0, 1000.0), run(PUBLISH, 0, p99, rps)];
            acceptance(&summarize(&runs), 200)
        };
        assert!(verdict(200.0, 950.0)[0].pass, "both bounds inclusive");
        assert!(!verdict(201.0, 1000.0)[0].pass, "p99 over 2x");
        assert!(!verdict(100.0, 949.0)[0].pass, "throughput under 0.95x");
        let v = &verdict(150.0, 1200.0)[0];
        assert_eq!((v.p99_ratio, v.rps_ratio, v.pass), (1.5, 1.2, true));
        assert!(acceptance(&summarize(&[run(TTL, 0, 100.0, 1000.0), run(PUBLISH, 0, 1.0, 1.0)]), 0).is_empty());
        assert!(acceptance(&summarize(&[run(PUBLISH, 0, 1.0, 1.0)]), 200).is_empty(), "no ttl, no verdict");
    }

    #[test]
    fn the_refresh_study_calls_a_winner_only_when_the_ranges_separate() {
        let s = |min: f64, median: f64, max: f64| Spread { median, min, max };
        assert_eq!(Better::of(s(1.0, 2.0, 3.0), s(4.0, 5.0, 6.0), true), Better::RefreshOn);
        assert_eq!(Better::of(s(1.0, 2.0, 3.0), s(4.0, 5.0, 6.0), false), Better::RefreshOff);
        assert_eq!(Better::of(s(4.0, 5.0, 6.0), s(1.0, 2.0, 3.0), true), Better::RefreshOff);
        assert_eq!(Better::of(s(1.0, 2.0, 4.0), s(4.0, 5.0, 6.0), true), Better::Neither, "touching ranges");
        let mut runs = Vec::new();
        for round in 0..3 {
            for (mode, p99) in [
                ("poll/shm", 100.0),
                ("poll/shm+refresh", 900.0),
                ("poll/shm@own", 100.0),
                ("poll/shm+refresh@own", 90.0),
            ] {
                runs.push(run(mode, round, p99 + round as f64 * 20.0, 1000.0 + round as f64));
            }
        }
        let study = refresh_study(&summarize(&runs));
        assert_eq!(study.len(), 2);
        assert_eq!(
            (study[0].placement.as_str(), study[0].p99, study[0].throughput),
            ("shared", Better::RefreshOff, Better::Neither)
        );
        assert_eq!((study[1].placement.as_str(), study[1].p99), ("own", Better::Neither));
        assert_eq!(
            refresh_verdict(&study).lines().nth(1).unwrap(),
            "refresh on better: 0, refresh off better: 1, not separated by the rounds: 3"
        );
    }
}
