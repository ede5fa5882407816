//! Output of experiments: aligned tables, JSON files, SVG line and bar
//! plots; [`crate::html`] gathers them into a page a person opens.
//!
//! Plots are meant to be read without the code: every axis names its unit,
//! a linear axis of a quantity that cannot be negative starts at zero, and
//! a bounded quantity (a fraction, a percentage) gets its bounds
//! ([`PlotOptions::y_range`]) rather than padding past them.
//!
//! An experiment describes its report rather than drawing it: [`Table`]s
//! (columns with their units, rows) and [`Plot`]s (which series against
//! what, drawn from the same rows by [`series_by`] and [`bars_by`]); one
//! [`crate::html::Report`] prints the tables, writes the JSON, draws the
//! plots and the page, so every experiment's page has the same shape.

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;
use std::path::Path;

/// A printable table: a header and rows of cells.
#[derive(Clone, Debug)]
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    /// Each column's unit (`""`: none, or named in the header); the page
    /// sets it under the column's name, keeping the column narrow.
    pub units: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Self {
        let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
        Self { title: title.to_string(), units: vec![String::new(); header.len()], header, rows: Vec::new() }
    }

    /// A table whose columns are `(name, unit)`; the unit is `""` for a
    /// count, a name or a ratio. Printed, a column reads `name (unit)`.
    pub fn with_units(title: &str, columns: &[(&str, &str)]) -> Self {
        Self {
            title: title.to_string(),
            header: columns.iter().map(|c| c.0.to_string()).collect(),
            units: columns.iter().map(|c| c.1.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Column `i`'s heading as printed: its name, and its unit if it has one.
    pub fn heading(&self, i: usize) -> String {
        match self.units.get(i).map(String::as_str) {
            None | Some("") => self.header[i].clone(),
            Some(unit) => format!("{} ({unit})", self.header[i]),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as aligned text.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let header: Vec<String> = (0..columns).map(|i| self.heading(i)).collect();
        // Characters, not bytes: `format!` pads to characters, and a µ is two bytes.
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            cells.iter().enumerate().map(|(i, c)| format!("{:>w$}", c, w = widths[i])).collect::<Vec<_>>().join("  ")
        };
        let mut out = format!("== {} ==\n{}\n", self.title, line(&header));
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// One line of a plot.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Axis scaling of a line plot.
#[derive(Clone, Copy)]
pub struct Axes<'a> {
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub log_y: bool,
}

/// The range an axis shows for `values`. Log: a factor of 1.5 beyond
/// either end. Linear: from 0 when no value is negative (a throughput or a
/// latency drawn from an arbitrary floor exaggerates its changes), with 5 %
/// of room above the highest value.
fn bounds(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (if log { 1.0 } else { 0.0 }, 1.0);
    }
    if log {
        (lo / 1.5, hi * 1.5)
    } else if lo >= 0.0 {
        (0.0, if hi > 0.0 { hi * 1.05 } else { 1.0 })
    } else {
        let pad = ((hi - lo) * 0.05).max(1e-9);
        (lo - pad, hi.max(0.0) + pad)
    }
}

/// What a [`Plot`] draws.
pub enum Chart {
    /// One line per series, x against y ([`line_plot_with`]).
    Lines { series: Vec<Series>, options: PlotOptions },
    /// One cluster of bars per category, one bar per group ([`bar_chart`]).
    Bars { categories: Vec<String>, groups: Vec<BarGroup> },
}

/// A plot described, drawn by [`Plot::draw`] into the experiment's folder
/// as `file` (a name the experiment's docs and tests know).
pub struct Plot {
    pub file: String,
    pub title: String,
    pub axes: Axes<'static>,
    pub chart: Chart,
}

impl Plot {
    /// Lines: `series` against `axes`.
    pub fn lines(file: &str, title: &str, axes: Axes<'static>, series: Vec<Series>) -> Self {
        let chart = Chart::Lines { series, options: PlotOptions::default() };
        Self { file: file.to_string(), title: title.to_string(), axes, chart }
    }

    /// Bars: `groups` by `categories`.
    pub fn bars(
        file: &str,
        title: &str,
        axes: Axes<'static>,
        (categories, groups): (Vec<String>, Vec<BarGroup>),
    ) -> Self {
        let chart = Chart::Bars { categories, groups };
        Self { file: file.to_string(), title: title.to_string(), axes, chart }
    }

    /// The plot with `options` (lines only: bars start at zero anyway).
    pub fn with(mut self, options: PlotOptions) -> Self {
        if let Chart::Lines { options: o, .. } = &mut self.chart {
            *o = options;
        }
        self
    }

    /// Draws the plot as `dir/file`; returns that path.
    pub fn draw(&self, dir: &Path) -> Result<std::path::PathBuf> {
        let path = dir.join(&self.file);
        match &self.chart {
            Chart::Lines { series, options } => line_plot_with(&path, &self.title, self.axes, series, *options)?,
            Chart::Bars { categories, groups } => bar_chart(&path, &self.title, self.axes, categories, groups)?,
        }
        Ok(path)
    }
}

/// Lines from rows: one series per distinct `label(row)`, in the order the
/// labels first appear, of the points `point(row)` (a row giving `None` is
/// left out), sorted by x.
pub fn series_by<'r, R: 'r>(
    rows: impl IntoIterator<Item = &'r R>,
    label: impl Fn(&R) -> String,
    point: impl Fn(&R) -> Option<(f64, f64)>,
) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for row in rows {
        let Some(p) = point(row) else { continue };
        let label = label(row);
        match out.iter_mut().find(|s| s.label == label) {
            Some(series) => series.points.push(p),
            None => out.push(Series { label, points: vec![p] }),
        }
    }
    for series in &mut out {
        series.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Bars from rows: categories and groups in the order they first appear,
/// each bar `value(row)` of the row of its category and group (NaN, drawn
/// as "-", where no row has both).
pub fn bars_by<'r, R: 'r>(
    rows: impl IntoIterator<Item = &'r R> + Clone,
    category: impl Fn(&R) -> String,
    group: impl Fn(&R) -> String,
    value: impl Fn(&R) -> f64,
) -> (Vec<String>, Vec<BarGroup>) {
    let mut categories: Vec<String> = Vec::new();
    let mut groups: Vec<BarGroup> = Vec::new();
    for row in rows.clone() {
        let c = category(row);
        if !categories.contains(&c) {
            categories.push(c);
        }
        let g = group(row);
        if !groups.iter().any(|x| x.label == g) {
            groups.push(BarGroup { label: g, values: Vec::new() });
        }
    }
    for g in &mut groups {
        g.values = vec![f64::NAN; categories.len()];
    }
    for row in rows {
        let (c, g) = (category(row), group(row));
        if let (Some(i), Some(bars)) =
            (categories.iter().position(|x| *x == c), groups.iter_mut().find(|x| x.label == g))
        {
            bars.values[i] = value(row);
        }
    }
    (categories, groups)
}

/// Choices of a plot beyond its [`Axes`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PlotOptions {
    /// The y axis's range, for a quantity with known bounds (a hit rate in
    /// percent: `Some((0.0, 100.0))`); `None`: fitted to the values.
    pub y_range: Option<(f64, f64)>,
}

/// The y axis's range of a line plot: the options' range, or fitted.
fn y_bounds(series: &[Series], axes: Axes<'_>, options: PlotOptions) -> (f64, f64) {
    match options.y_range {
        Some(range) => range,
        None => bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), axes.log_y),
    }
}

/// Draws a line plot with one line per series into an SVG file.
pub fn line_plot(path: &Path, title: &str, axes: Axes<'_>, series: &[Series]) -> Result<()> {
    line_plot_with(path, title, axes, series, PlotOptions::default())
}

/// As [`line_plot`], with `options`.
pub fn line_plot_with(path: &Path, title: &str, axes: Axes<'_>, series: &[Series], options: PlotOptions) -> Result<()> {
    let (x_lo, x_hi) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), axes.log_x);
    let (y_lo, y_hi) = y_bounds(series, axes, options);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    macro_rules! draw {
        ($x:expr, $y:expr) => {{
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 22))
                .margin(12)
                .x_label_area_size(48)
                .y_label_area_size(80)
                .build_cartesian_2d($x, $y)
                .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
            chart
                .configure_mesh()
                .x_desc(axes.x_label)
                .y_desc(axes.y_label)
                .axis_desc_style(AXIS_DESC_FONT)
                .label_style(TICK_FONT)
                .light_line_style(LIGHT_GRID)
                .x_label_formatter(&|v| compact(*v))
                .y_label_formatter(&|v| compact(*v))
                .draw()
                .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
            for (i, s) in series.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                let points: Vec<(f64, f64)> = s.points.clone();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                chart
                    .draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
            }
            chart
                .configure_series_labels()
                .label_font(LEGEND_FONT)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
        }};
    }
    match (axes.log_x, axes.log_y) {
        (false, false) => draw!(x_lo..x_hi, y_lo..y_hi),
        (true, false) => draw!((x_lo..x_hi).log_scale(), y_lo..y_hi),
        (false, true) => draw!(x_lo..x_hi, (y_lo..y_hi).log_scale()),
        (true, true) => draw!((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale()),
    }
    root.present().map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}

/// Axis descriptions and tick labels: legible when the page is read at
/// the SVG's own size or smaller.
const AXIS_DESC_FONT: (&str, u32) = ("sans-serif", 17);
const TICK_FONT: (&str, u32) = ("sans-serif", 15);
/// The fine grid, faint enough to leave the lines in front.
const LIGHT_GRID: RGBColor = RGBColor(242, 242, 242);

/// Line and bar colours, in order (the "tab10" palette: distinguishable).
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(140, 86, 75),
];

/// One kind of bar in a bar chart: its value for each category.
pub struct BarGroup {
    pub label: String,
    pub values: Vec<f64>,
}

/// Draws a bar chart into an SVG file: one cluster of bars per category
/// (left to right), one bar per group in each cluster, each bar labelled
/// with its value (so a zero is seen, not guessed from a missing bar). On a
/// log axis a bar with a value of zero or less is not drawn; its label is.
pub fn bar_chart(path: &Path, title: &str, axes: Axes<'_>, categories: &[String], groups: &[BarGroup]) -> Result<()> {
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let values = || groups.iter().flat_map(|g| g.values.iter().copied());
    let (y_lo, y_hi) = bounds(values(), axes.log_y);
    // Room above the tallest bar for its label.
    let y_hi = if axes.log_y { y_hi * 1.5 } else { y_hi * 1.08 };
    let y_hi = above_legend(y_lo, y_hi, if groups.len() > 1 { groups.len() } else { 0 }, axes.log_y);
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let x_range = -0.5..(categories.len().max(1) as f64 - 0.5);
    let cluster = 0.8;
    let width = cluster / groups.len().max(1) as f64;
    macro_rules! draw {
        ($y:expr) => {{
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 22))
                .margin(12)
                .x_label_area_size(56)
                .y_label_area_size(80)
                .build_cartesian_2d(x_range.clone(), $y)
                .map_err(|e| plot_error(&e))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(0)
                .x_desc(axes.x_label)
                .y_desc(axes.y_label)
                .axis_desc_style(AXIS_DESC_FONT)
                .label_style(TICK_FONT)
                .light_line_style(LIGHT_GRID)
                .y_label_formatter(&|v| compact(*v))
                .draw()
                .map_err(|e| plot_error(&e))?;
            for (j, group) in groups.iter().enumerate() {
                let color = PALETTE[j % PALETTE.len()];
                let bars: Vec<(f64, f64)> = group
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (i as f64 - cluster / 2.0 + j as f64 * width, v))
                    .collect();
                let drawn = bars
                    .iter()
                    .filter(|(_, v)| v.is_finite() && (!axes.log_y || *v > 0.0))
                    .map(|&(x, v)| Rectangle::new([(x + width * 0.05, y_lo), (x + width * 0.95, v)], color.filled()));
                let series = chart.draw_series(drawn).map_err(|e| plot_error(&e))?;
                if groups.len() > 1 {
                    series
                        .label(group.label.clone())
                        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], color.filled()));
                }
                let style = ("sans-serif", 14).into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Bottom));
                let labels = bars.iter().map(|&(x, v)| {
                    let at = if v.is_finite() && (!axes.log_y || v > 0.0) { v } else { y_lo };
                    Text::new(compact(v), (x + width / 2.0, at), style.clone())
                });
                chart.draw_series(labels).map_err(|e| plot_error(&e))?;
            }
            let style = ("sans-serif", 16).into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Top));
            for (i, name) in categories.iter().enumerate() {
                let (x, y) = chart.backend_coord(&(i as f64, y_lo));
                root.draw(&Text::new(name.clone(), (x, y + 8), style.clone())).map_err(|e| plot_error(&e))?;
            }
            if groups.len() > 1 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .label_font(LEGEND_FONT)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| plot_error(&e))?;
            }
        }};
    }
    if axes.log_y {
        draw!((y_lo..y_hi).log_scale());
    } else {
        draw!(y_lo..y_hi);
    }
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

/// A legend's entries: as legible as the ticks.
const LEGEND_FONT: (&str, u32) = ("sans-serif", 14);

/// The top of a bar chart's y axis that leaves the upper band of the plot
/// to a legend of `entries` lines (none: `y_hi` unchanged), so the legend
/// covers no bar: about 20 px a line of a plot about 400 px high.
fn above_legend(y_lo: f64, y_hi: f64, entries: usize, log: bool) -> f64 {
    if entries == 0 {
        return y_hi;
    }
    let band = ((entries as f64 * 20.0 + 16.0) / 400.0).min(0.6);
    if log {
        (y_lo.ln() + (y_hi.ln() - y_lo.ln()) / (1.0 - band)).exp()
    } else {
        y_lo + (y_hi - y_lo) / (1.0 - band)
    }
}

/// A value as a bar's or a tick's label: whole numbers with thousands
/// separators, small ones with the decimals that matter.
pub fn compact(value: f64) -> String {
    if !value.is_finite() {
        "-".to_string()
    } else if value.abs() >= 100.0 || value.fract() == 0.0 {
        thousands(value.round() as i64)
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        // Three significant digits, without trailing zeros: 2.5, 0.125, 0.001.
        let decimals = (2 - value.abs().log10().floor() as i32).clamp(1, 9) as usize;
        let text = format!("{value:.decimals$}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// An integer with commas between thousands: `12,345`.
pub fn thousands(value: i64) -> String {
    let digits = value.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if value < 0 {
        out.insert(0, '-');
    }
    out
}

/// `cell` as a person reads it on a page: a number of four or more
/// digits before its point gets thousands separators (`1234567.5` is
/// `1,234,567.5`), as [`compact`] writes plots' labels; anything else is
/// kept as it is.
pub fn readable(cell: &str) -> String {
    let (sign, unsigned) = match cell.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", cell),
    };
    let (whole, fraction) = match unsigned.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (unsigned, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if whole.len() < 4 || !digits(whole) || fraction.is_some_and(|f| !digits(f)) {
        return cell.to_string();
    }
    let mut out = String::from(sign);
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if let Some(f) = fraction {
        out.push('.');
        out.push_str(f);
    }
    out
}

/// Formats nanoseconds as microseconds with two decimals.
pub fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new("t", &["op", "p50"]);
        t.row(vec!["read".into(), "1.00".into()]);
        t.row(vec!["compare_swap".into(), "12.50".into()]);
        let text = t.render();
        assert!(text.contains("          op    p50"), "{text}");
        assert!(text.contains("compare_swap  12.50"), "{text}");
    }

    #[test]
    fn plots_are_written_as_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let series = vec![Series { label: "a".into(), points: vec![(4.0, 1.0), (1024.0, 10.0)] }];
        line_plot(&path, "test", Axes { x_label: "x", y_label: "y", log_x: true, log_y: true }, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") || svg.contains("<svg"), "not an svg");
        assert!(svg.contains("polyline") || svg.contains("path"), "no line drawn");
    }

    #[test]
    fn linear_axes_of_non_negative_quantities_start_at_zero() {
        assert_eq!(bounds([40.0, 50.0].into_iter(), false), (0.0, 52.5));
        assert_eq!(bounds([0.0, 0.0].into_iter(), false), (0.0, 1.0), "all zeros still get a range");
        let (lo, hi) = bounds([-10.0, 10.0].into_iter(), false);
        assert!(lo < -10.0 && hi > 10.0, "negative values are padded: {lo}..{hi}");
        let (lo, hi) = bounds([0.0, 10.0, 1000.0].into_iter(), true);
        assert!(lo > 0.0 && lo < 10.0 && hi > 1000.0, "log ignores zeros: {lo}..{hi}");
    }

    /// The y-axis ticks of a plotters SVG: each end-anchored `text` element
    /// (right-aligned against the y axis) as (value, pixel row).
    fn y_ticks(svg: &str) -> Vec<(f64, f64)> {
        svg.split("<text")
            .filter(|t| t.contains("text-anchor=\"end\""))
            .filter_map(|t| {
                let value = t.split('>').nth(1)?.split('<').next()?.trim().replace(',', "").parse().ok()?;
                let row = t.split(" y=\"").nth(1)?.split('"').next()?.parse().ok()?;
                Some((value, row))
            })
            .collect()
    }

    #[test]
    fn a_bounded_quantity_is_drawn_within_its_bounds() {
        let series = vec![Series { label: "hit rate".into(), points: vec![(0.5, 99.0), (1.5, 100.0)] }];
        let axes = Axes { x_label: "time (s)", y_label: "hit rate (%)", log_x: false, log_y: false };
        let (_, fitted) = y_bounds(&series, axes, PlotOptions::default());
        assert!(fitted > 100.0, "fitted, the axis runs past 100 %: {fitted}");
        let bounded = PlotOptions { y_range: Some((0.0, 100.0)) };
        assert_eq!(y_bounds(&series, axes, bounded), (0.0, 100.0));
        // Drawn: every tick within the bounds, and 100 % at the top of the
        // axis, higher than where the fitted axis (running on to 105) puts it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let row_of_100 = |options| {
            line_plot_with(&path, "hit rate", axes, &series, options).unwrap();
            let ticks = y_ticks(&std::fs::read_to_string(&path).unwrap());
            assert!(ticks.iter().all(|&(t, _)| (0.0..=100.0).contains(&t)), "{ticks:?}");
            ticks.iter().find(|&&(t, _)| t == 100.0).map(|&(_, row)| row).expect("a tick at 100")
        };
        assert!(row_of_100(bounded) < row_of_100(PlotOptions::default()), "the bounded axis ends at 100");
    }

    #[test]
    fn bar_charts_label_every_bar_and_category() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bars.svg");
        let categories = vec!["no-cache".to_string(), "ttl".to_string()];
        let groups = vec![BarGroup { label: "stale".into(), values: vec![0.0, 12345.0] }];
        let axes = Axes { x_label: "mode", y_label: "stale responses (count)", log_x: false, log_y: false };
        bar_chart(&path, "stale", axes, &categories, &groups).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in ["no-cache", "ttl", "\n12,345\n", "\n0\n", "stale responses (count)"] {
            assert!(svg.contains(text), "{text} in the chart");
        }
        let log = Axes { log_y: true, ..axes };
        let groups = vec![
            BarGroup { label: "p50".into(), values: vec![0.0, 10.0] },
            BarGroup { label: "p99".into(), values: vec![5.0, 100.0] },
        ];
        bar_chart(&path, "latency", log, &categories, &groups).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("p50") && svg.contains("p99"), "a legend names the groups");
    }

    #[test]
    fn a_bar_charts_legend_gets_a_band_of_its_own() {
        assert_eq!(above_legend(0.0, 100.0, 0, false), 100.0, "no legend, no band");
        let top = above_legend(0.0, 100.0, 4, false);
        assert!(top > 100.0 / (1.0 - 0.2) - 1e-9, "4 lines take over a fifth of the height: {top}");
        let top = above_legend(10.0, 1000.0, 4, true);
        assert!(top > 1000.0 * 2.0, "the band is a share of the log range: {top}");
    }

    #[test]
    fn numbers_are_written_for_people() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(-1234567), "-1,234,567");
        assert_eq!(compact(12345.4), "12,345");
        assert_eq!(compact(3.0), "3");
        assert_eq!(compact(42.26), "42.3");
        assert_eq!(compact(2.5), "2.5");
        assert_eq!(compact(0.125), "0.125");
        assert_eq!(compact(0.001), "0.001");
        assert_eq!(compact(0.0314159), "0.0314");
        assert_eq!(compact(f64::NAN), "-");
        assert_eq!(readable("123"), "123", "short numbers stay");
        assert_eq!(readable("1.000"), "1.000");
        assert_eq!(readable("4227"), "4,227", "grouped as the plots' labels are");
        assert_eq!(readable("12345"), "12,345");
        assert_eq!(readable("-1234567.25"), "-1,234,567.25");
        for kept in ["poll/shm", "0.95 0.80 0.71", "12345x", "1.2e10", "", "-", "123456.7.8"] {
            assert_eq!(readable(kept), kept);
        }
    }

    #[test]
    fn units_are_printed_beside_the_column_names() {
        let mut t = Table::with_units("t", &[("mode", ""), ("p99", "µs")]);
        t.row(vec!["ttl".into(), "12".into()]);
        assert!(t.render().contains("mode  p99 (µs)"), "{}", t.render());
        assert_eq!(Table::new("t", &["a"]).units, [""], "a plain table has no units");
    }

    #[test]
    fn rows_become_series_and_bars() {
        let rows = [("a", 2.0, 20.0), ("b", 1.0, 5.0), ("a", 1.0, 10.0)];
        let lines = series_by(&rows, |r| r.0.to_string(), |r| Some((r.1, r.2)));
        let shown: Vec<(&str, &[(f64, f64)])> = lines.iter().map(|s| (s.label.as_str(), &s.points[..])).collect();
        assert_eq!(shown, [("a", &[(1.0, 10.0), (2.0, 20.0)][..]), ("b", &[(1.0, 5.0)][..])]);
        let (categories, groups) = bars_by(&rows, |r| format!("x{}", r.1), |r| r.0.to_string(), |r| r.2);
        assert_eq!(categories, ["x2", "x1"]);
        assert_eq!(groups[0].values, [20.0, 10.0]);
        assert!(groups[1].values[0].is_nan() && groups[1].values[1] == 5.0, "b has no bar at x2");
    }
}
