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

use crate::report::Table;
use anyhow::{Context, Result};
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

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;\
color:#222}h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em}\
table{border-collapse:collapse;margin:1em 0;font-variant-numeric:tabular-nums}\
caption{text-align:left;font-weight:600;padding:.3em 0}th,td{border:1px solid #ccc;padding:.25em .6em}\
th{background:#f2f2f2}td{text-align:right;white-space:nowrap}td:first-child{text-align:left}\
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap}figure{margin:1em 0}\
svg{max-width:100%;height:auto}";

fn table_html(out: &mut String, table: &Table) {
    let _ = writeln!(out, "<table>\n<caption>{}</caption>", escape(&table.title));
    out.push_str("<thead><tr>");
    for cell in &table.header {
        let _ = write!(out, "<th>{}</th>", escape(cell));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", escape(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
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
        assert!(html.contains("<pre>verdict: &lt;ok&gt;</pre>"));
        assert!(html.contains("<svg") && html.contains("Fig. 9b: throughput"), "the plot is inline");
        for needle in ["http:", "https:", "src=", "href", "url(", "@import"] {
            assert!(!html.contains(needle), "{needle} in the page");
        }
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
