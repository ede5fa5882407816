//! Output of experiments: aligned tables, JSON files and SVG line plots.

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

/// A printable table: a header and rows of cells.
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Self {
        Self { title: title.to_string(), header: header.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as aligned text.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.len());
            }
        }
        let line = |cells: &[String]| {
            cells.iter().enumerate().map(|(i, c)| format!("{:>w$}", c, w = widths[i])).collect::<Vec<_>>().join("  ")
        };
        let mut out = format!("== {} ==\n{}\n", self.title, line(&self.header));
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
    } else {
        let pad = ((hi - lo) * 0.05).max(hi.abs() * 0.05).max(1e-9);
        ((lo - pad).min(0.0_f64.max(lo - pad)), hi + pad)
    }
}

/// Draws a line plot with one line per series into an SVG file.
pub fn line_plot(path: &Path, title: &str, axes: Axes<'_>, series: &[Series]) -> Result<()> {
    let (x_lo, x_hi) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), axes.log_x);
    let (y_lo, y_hi) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), axes.log_y);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    let palette = [&BLUE, &RED, &GREEN, &MAGENTA, &CYAN, &BLACK, &RGBColor(255, 140, 0), &RGBColor(128, 0, 128)];
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
                .draw()
                .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
            for (i, s) in series.iter().enumerate() {
                let color = palette[i % palette.len()];
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
}
