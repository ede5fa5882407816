//! A report a person opens: one self-contained HTML page per experiment
//! (`<out>/index.html`) with the tables the experiment prints, its notes
//! (the paper's values beside ours, the targets), and its plots inlined as
//! SVG.
//!
//! Self-contained means the page loads nothing: no script, no stylesheet,
//! font or image from elsewhere, no link to follow for the content. It
//! opens from disk on a machine without network and survives being mailed.
//! Text is escaped; an inlined plot loses its `xmlns` attribute (HTML
//! needs none) so the page holds no address at all.
//!
//! Every experiment's page is made by one [`Report`]: a title that names
//! the experiment (`tierstack bench coherence --hot: ...`), its tables and
//! at least one plot; the experiment's JSON file beside it. A table fits
//! the page: headings wrap, units go under them, long numbers get
//! thousands separators, and a table still too wide scrolls inside its
//! own box rather than running off the page.

use crate::report::{readable, write_json, Plot, Table};
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The page's file name in an experiment's folder.
pub const INDEX: &str = "index.html";

enum Block {
    Heading(String),
    Paragraph(String),
    /// Monospaced text kept as printed (a verdict, a list of targets).
    Preformatted(String),
    Table(Table),
    /// An SVG document, ready to inline.
    Plot(String),
}

/// An HTML page being assembled, block by block, in reading order.
pub struct Page {
    title: String,
    blocks: Vec<Block>,
}

impl Page {
    pub fn new(title: &str) -> Self {
        Self { title: title.to_string(), blocks: Vec::new() }
    }

    pub fn heading(&mut self, text: &str) {
        self.blocks.push(Block::Heading(text.to_string()));
    }

    pub fn paragraph(&mut self, text: &str) {
        self.blocks.push(Block::Paragraph(text.to_string()));
    }

    pub fn preformatted(&mut self, text: &str) {
        self.blocks.push(Block::Preformatted(text.to_string()));
    }

    pub fn table(&mut self, table: &Table) {
        self.blocks.push(Block::Table(table.clone()));
    }

    /// Prints `table` on stdout, as every experiment does, and adds it to the page.
    pub fn print(&mut self, table: &Table) {
        println!("{}", table.render());
        self.table(table);
    }

    /// Prints `text` on stdout and adds it to the page, kept as printed.
    pub fn print_text(&mut self, text: &str) {
        println!("{text}");
        self.preformatted(text);
    }

    /// Inlines the SVG plot in `svg_file` (as written by
    /// [`crate::report::line_plot`] or [`crate::report::bar_chart`]).
    pub fn plot(&mut self, svg_file: &Path) -> Result<()> {
        let svg = std::fs::read_to_string(svg_file).with_context(|| format!("reading {}", svg_file.display()))?;
        self.blocks.push(Block::Plot(inline_svg(&svg)?));
        Ok(())
    }

    /// The page as HTML.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let title = escape(&self.title);
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
        );
        for block in &self.blocks {
            match block {
                Block::Heading(text) => {
                    let _ = writeln!(out, "<h2>{}</h2>", escape(text));
                }
                Block::Paragraph(text) => {
                    let _ = writeln!(out, "<p>{}</p>", escape(text));
                }
                Block::Preformatted(text) => {
                    let _ = writeln!(out, "<pre>{}</pre>", escape(text.trim_end()));
                }
                Block::Table(table) => table_html(&mut out, table),
                Block::Plot(svg) => {
                    let _ = writeln!(out, "<figure>\n{}\n</figure>", svg.trim());
                }
            }
        }
        out.push_str("</body>\n</html>\n");
        out
    }

    /// Writes the page as `dir/index.html`; returns its path.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(INDEX);
        std::fs::write(&path, self.render()).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// A table's headings wrap, and so do its first column, its words (`td.t`,
/// left-aligned) and its cells of several numbers (`td.w`, a load
/// average); a number alone is read whole, so it does not wrap. The
/// table's box scrolls sideways when the table is still wider than the page.
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;\
color:#222}h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em}\
.table{max-width:100%;overflow-x:auto;margin:1em 0}.table>p{font-weight:600;margin:.3em 0}\
table{border-collapse:collapse;font-size:.85em;font-variant-numeric:tabular-nums}\
th,td{border:1px solid #ccc;padding:.2em .4em}\
th{background:#f2f2f2;vertical-align:bottom;min-width:3em}th small{font-weight:400;color:#555}\
td{text-align:right;white-space:nowrap}td:first-child,td.t{text-align:left}td:first-child,td.t,td.w{white-space:normal}\
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap}figure{margin:1em 0}\
svg{max-width:100%;height:auto}";

/// The table in its scrolling box, titled above it (a `caption` would
/// scroll away with a wide table).
fn table_html(out: &mut String, table: &Table) {
    let _ = writeln!(out, "<div class=\"table\">\n<p>{}</p>\n<table>", escape(&table.title));
    out.push_str("<thead><tr>");
    for (i, cell) in table.header.iter().enumerate() {
        match table.units.get(i).map(String::as_str) {
            None | Some("") => {
                let _ = write!(out, "<th>{}</th>", escape(cell));
            }
            Some(unit) => {
                let _ = write!(out, "<th>{}<br><small>{}</small></th>", escape(cell), escape(unit));
            }
        }
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            // The first column is left-aligned and may wrap by the style.
            let class = if i == 0 {
                ""
            } else if cell.starts_with(char::is_alphabetic) {
                " class=\"t\""
            } else if cell.contains(' ') {
                " class=\"w\""
            } else {
                ""
            };
            let _ = write!(out, "<td{class}>{}</td>", escape(&readable(cell)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n</div>\n");
}

/// One experiment's report: its page (tables printed as they are added,
/// plots drawn and inlined), its JSON file, and the line saying what was
/// written. [`Report::finish`] refuses a page without a plot.
pub struct Report {
    dir: PathBuf,
    page: Page,
    /// File names written into `dir`, in order, for the closing line.
    written: Vec<String>,
    plots: usize,
}

impl Report {
    /// The report of `experiment` (the command that runs it, after
    /// `tierstack`: `bench coherence --hot`), about `subject`, written into
    /// `dir`. Its title: `tierstack {experiment}: {subject}`.
    pub fn new(dir: &Path, experiment: &str, subject: &str) -> Self {
        let page = Page::new(&format!("tierstack {experiment}: {subject}"));
        Self { dir: dir.to_path_buf(), page, written: Vec::new(), plots: 0 }
    }

    /// The page, for what it holds beyond tables and plots (paragraphs,
    /// headings, a table the console does not print).
    pub fn page(&mut self) -> &mut Page {
        &mut self.page
    }

    /// Prints `table` and adds it to the page.
    pub fn table(&mut self, table: &Table) {
        self.page.print(table);
    }

    /// Prints `text` and adds it to the page, kept as printed.
    pub fn text(&mut self, text: &str) {
        self.page.print_text(text);
    }

    /// Writes `value` as `dir/file`.
    pub fn json<T: Serialize>(&mut self, file: &str, value: &T) -> Result<()> {
        write_json(&self.dir.join(file), value)?;
        self.written.push(file.to_string());
        Ok(())
    }

    /// Draws `plot` into the folder and inlines it in the page.
    pub fn plot(&mut self, plot: &Plot) -> Result<()> {
        let path = plot.draw(&self.dir)?;
        self.page.plot(&path)?;
        self.written.push(plot.file.clone());
        self.plots += 1;
        Ok(())
    }

    /// Writes `index.html` and prints what was written; returns the
    /// page's path.
    pub fn finish(self) -> Result<PathBuf> {
        anyhow::ensure!(self.plots > 0, "the report {:?} has no plot", self.page.title);
        let index = self.page.write(&self.dir)?;
        let (first, rest) = self.written.split_first().map_or(("", &[][..]), |(f, r)| (f.as_str(), r));
        let mut files = vec![self.dir.join(first).display().to_string()];
        files.extend(rest.iter().cloned());
        println!("wrote {} and {}", files.join(", "), index.display());
        Ok(index)
    }
}

/// `text` with HTML's special characters escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An SVG document made ready to inline: from its `<svg` element on (no
/// XML prolog), without the namespace attribute HTML does not need. Refuses
/// a document that loads anything (`href`, `src`, `url(`, `@import`): a plot
/// drawn here never does, so one that does is not ours.
fn inline_svg(svg: &str) -> Result<String> {
    let start = svg.find("<svg").context("not an SVG document")?;
    let svg = svg[start..].replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1);
    let lower = svg.to_ascii_lowercase();
    for needle in ["href", "src=", "url(", "@import", "http:", "https:"] {
        anyhow::ensure!(!lower.contains(needle), "the SVG refers to something outside it ({needle})");
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{line_plot, Axes, Series};

    #[test]
    fn a_page_holds_its_tables_text_and_plots_and_loads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("p.svg");
        let series = vec![Series { label: "a <b>".into(), points: vec![(0.5, 1.0), (1.5, 2.0)] }];
        line_plot(
            &svg,
            "Fig. 9b: throughput",
            Axes { x_label: "s", y_label: "req/s", log_x: false, log_y: false },
            &series,
        )
        .unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("http://"), "plotters writes a namespace");
        let mut page = Page::new("bench <x> & y");
        page.paragraph("why \"this\"");
        let mut table = Table::new("Fig. 9b", &["mode", "req/s"]);
        table.row(vec!["poll/shm".into(), "1,234".into()]);
        page.table(&table);
        page.preformatted("verdict: <ok>");
        page.plot(&svg).unwrap();
        let path = page.write(dir.path()).unwrap();
        assert_eq!(path, dir.path().join(INDEX));
        let html = std::fs::read_to_string(path).unwrap();
        assert!(html.contains("<title>bench &lt;x&gt; &amp; y</title>"), "{html}");
        assert!(html.contains("<p>why &quot;this&quot;</p>"));
        assert!(html.contains("<td>poll/shm</td><td>1,234</td>"));
        assert!(html.contains("<div class=\"table\">\n<p>Fig. 9b</p>\n<table>"), "the table scrolls in its box");
        assert!(html.contains("<pre>verdict: &lt;ok&gt;</pre>"));
        assert!(html.contains("<svg") && html.contains("Fig. 9b: throughput"), "the plot is inline");
        for needle in ["http:", "https:", "src=", "href", "url(", "@import"] {
            assert!(!html.contains(needle), "{needle} in the page");
        }
    }

    /// A small synthetic experiment, reported as every experiment is: the
    /// page names it, holds its table (units under the headings, long
    /// numbers grouped) and its plot, and the JSON is beside it.
    #[test]
    fn a_report_page_has_its_table_and_its_plot() {
        let dir = tempfile::tempdir().unwrap();
        let runs = [("ttl", 1, 1500.0, 123456.0), ("poll/shm", 1, 900.0, 98765.0), ("poll/shm", 4, 950.0, 97000.0)];
        let mut report = Report::new(dir.path(), "bench toy --hot", "a toy experiment");
        let mut table = Table::with_units(
            "Toy runs",
            &[("mode", ""), ("threads", ""), ("p99", "µs"), ("throughput", "requests/s")],
        );
        for r in &runs {
            table.row(vec![r.0.into(), r.1.to_string(), format!("{:.0}", r.2), format!("{:.0}", r.3)]);
        }
        report.table(&table);
        report.json("toy.json", &runs.iter().map(|r| r.3).collect::<Vec<_>>()).unwrap();
        let axes = Axes { x_label: "threads (count)", y_label: "throughput (requests/s)", log_x: false, log_y: false };
        let series = crate::report::series_by(&runs, |r| r.0.to_string(), |r| Some((r.1 as f64, r.3)));
        report.plot(&Plot::lines("toy-throughput.svg", "Toy throughput", axes, series)).unwrap();
        let bars = crate::report::bars_by(&runs, |r| format!("{} threads", r.1), |r| r.0.to_string(), |r| r.2);
        report.plot(&Plot::bars("toy-p99.svg", "Toy p99", Axes { y_label: "p99 (µs)", ..axes }, bars)).unwrap();
        let index = report.finish().unwrap();
        let html = std::fs::read_to_string(index).unwrap();
        assert!(html.contains("<title>tierstack bench toy --hot: a toy experiment</title>"), "the title names it");
        assert!(html.contains("<th>p99<br><small>µs</small></th>"), "units under the headings");
        assert!(html.contains("<td>poll/shm</td><td>4</td><td>950</td><td>97,000</td>"), "{html}");
        assert!(html.contains("<td>ttl</td><td>1</td><td>1,500</td>"), "four digits grouped as in the plots");
        assert_eq!(html.matches("<svg").count(), 2, "both plots inline");
        assert!(html.contains("Toy throughput") && html.contains("Toy p99"));
        assert!(html.contains("overflow-x:auto"), "a wide table scrolls in its box");
        for file in ["toy.json", "toy-throughput.svg", "toy-p99.svg"] {
            assert!(dir.path().join(file).exists(), "{file}");
        }
        let no_plot = Report::new(dir.path(), "bench toy", "nothing drawn");
        assert!(no_plot.finish().is_err(), "a report page has its plot");
    }

    #[test]
    fn an_svg_that_loads_something_is_refused() {
        assert!(inline_svg("<svg><image href=\"http://x/y.png\"/></svg>").is_err());
        assert!(inline_svg("<svg><style>@import 'x.css';</style></svg>").is_err());
        assert!(inline_svg("no svg here").is_err());
        let ok = inline_svg("<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"><g/></svg>").unwrap();
        assert_eq!(ok, "<svg><g/></svg>");
    }
}
