//! The Prometheus text exposition format (version 0.0.4), written once for
//! every tier's `/metrics`.
//!
//! [`Exposition`] writes metric families: each gets its `# HELP` and
//! `# TYPE` lines, then its samples. Names follow Prometheus's conventions,
//! which the callers keep and `tierstack_testkit::metrics` checks: a
//! `tierstack_<tier>_` prefix, base units in the name (`_seconds`,
//! `_bytes`), counters ending in `_total`. Help text and label values are
//! escaped as the format requires, so no input can break a line.
//!
//! [`SecondsHistogram`] is a histogram of durations made of atomics
//! (recorded from any thread without a lock), written as a Prometheus
//! histogram (cumulative `_bucket{le=…}`, `_sum`, `_count`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Labels of one sample: `(name, value)` pairs.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// An exposition being written; [`Exposition::finish`] gives its text.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Exposition { out: String::with_capacity(4096) }
    }

    fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: Labels<'_>, value: impl std::fmt::Display) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels);
        let _ = writeln!(self.out, " {value}");
    }

    /// A counter family of one sample (the name ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.counters(name, help, &[(&[], value)]);
    }

    /// A counter family of labelled samples.
    pub fn counters(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, u64)]) {
        self.family(name, help, "counter");
        for (labels, value) in samples {
            self.sample(name, labels, value);
        }
    }

    /// A counter family of one sample whose value is not whole (seconds).
    pub fn counter_f64(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, help, "counter");
        self.sample(name, &[], FloatValue(value));
    }

    /// A gauge family of one sample.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.gauges(name, help, &[(&[], value)]);
    }

    /// A gauge family of labelled samples.
    pub fn gauges(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, f64)]) {
        self.family(name, help, "gauge");
        for (labels, value) in samples {
            self.sample(name, labels, FloatValue(*value));
        }
    }

    /// A histogram family (the name ends in its unit, `_seconds`).
    pub fn histogram(&mut self, name: &str, help: &str, histogram: &SecondsHistogram) {
        self.family(name, help, "histogram");
        let snapshot = histogram.snapshot();
        let bucket = format!("{name}_bucket");
        let mut running = 0;
        for (bound, count) in histogram.bounds.iter().zip(&snapshot.buckets) {
            running += count;
            let le = FloatValue(*bound).to_string();
            self.sample(&bucket, &[("le", &le)], running);
        }
        self.sample(&bucket, &[("le", "+Inf")], snapshot.count);
        self.sample(&format!("{name}_sum"), &[], FloatValue(snapshot.sum_ns as f64 / 1e9));
        self.sample(&format!("{name}_count"), &[], snapshot.count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A float as the format spells it (`+Inf`, `-Inf`, `NaN` for the special values).
struct FloatValue(f64);

impl std::fmt::Display for FloatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            v if v.is_nan() => f.write_str("NaN"),
            v if v == f64::INFINITY => f.write_str("+Inf"),
            v if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            v => write!(f, "{v}"),
        }
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

fn write_labels(out: &mut String, labels: Labels<'_>) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (at, (name, value)) in labels.iter().enumerate() {
        if at > 0 {
            out.push(',');
        }
        let value = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let _ = write!(out, "{name}=\"{value}\"");
    }
    out.push('}');
}

/// One sample of a scraped exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    /// `(name, value)` pairs, unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// The samples of an exposition in the text format (comments skipped; a
/// line that does not parse is skipped too: a reader shows what it can).
/// For tools that read other processes' `/metrics` (`tierstack top`).
pub fn parse_samples(text: &str) -> Vec<Sample> {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    let (name, rest) = match line.find(['{', ' ']) {
        Some(at) => line.split_at(at),
        None => return None,
    };
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inside) => parse_labels(inside)?,
        None => (Vec::new(), rest),
    };
    // A timestamp may follow the value.
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// Labels up to the closing brace; returns them and the text after it.
fn parse_labels(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([' ', ',']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (at, '"') => break at,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name.trim().to_string(), value));
        text = &rest[end + 1..];
    }
}

/// Bucket bounds for request-scale latencies: 10 µs to 10 s.
pub const REQUEST_SECONDS_BOUNDS: &[f64] =
    &[1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// A duration histogram of atomics: one count per bucket (not cumulative),
/// the count above the last bound, and the sum in nanoseconds.
pub struct SecondsHistogram {
    bounds: &'static [f64],
    /// The bounds in nanoseconds: recording compares integers.
    bounds_ns: Vec<u64>,
    buckets: Vec<AtomicU64>,
    above: AtomicU64,
    sum_ns: AtomicU64,
}

/// A histogram's counts at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Per bucket, not cumulative.
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
}

impl SecondsHistogram {
    /// Buckets at `bounds` (seconds, increasing).
    pub fn new(bounds: &'static [f64]) -> Self {
        SecondsHistogram {
            bounds,
            bounds_ns: bounds.iter().map(|b| (b * 1e9).round() as u64).collect(),
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            above: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    pub fn record_ns(&self, ns: u64) {
        match self.bounds_ns.iter().position(|bound| ns <= *bound) {
            Some(at) => self.buckets[at].fetch_add(1, Ordering::Relaxed),
            None => self.above.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn record(&self, elapsed: std::time::Duration) {
        self.record_ns(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The counts now (each word read once; a record racing the read may
    /// be in the buckets and not yet in the sum, never counted twice).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let count = buckets.iter().sum::<u64>() + self.above.load(Ordering::Relaxed);
        HistogramSnapshot { buckets, count, sum_ns: self.sum_ns.load(Ordering::Relaxed) }
    }
}

impl Default for SecondsHistogram {
    fn default() -> Self {
        SecondsHistogram::new(REQUEST_SECONDS_BOUNDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_type_and_escaped_samples() {
        let mut out = Exposition::new();
        out.counter("tierstack_x_requests_total", "Requests.\nTwo lines \\ here.", 7);
        out.gauges("tierstack_x_state", "A state.", &[(&[("peer", "a\"b\\c\nd")], 1.5), (&[("peer", "e")], f64::NAN)]);
        let text = out.finish();
        let expected = "# HELP tierstack_x_requests_total Requests.\\nTwo lines \\\\ here.\n\
                        # TYPE tierstack_x_requests_total counter\n\
                        tierstack_x_requests_total 7\n\
                        # HELP tierstack_x_state A state.\n\
                        # TYPE tierstack_x_state gauge\n\
                        tierstack_x_state{peer=\"a\\\"b\\\\c\\nd\"} 1.5\n\
                        tierstack_x_state{peer=\"e\"} NaN\n";
        assert_eq!(text, expected);
    }

    /// What the writer writes, the reader reads back (escapes included).
    #[test]
    fn samples_read_back_as_written() {
        let mut out = Exposition::new();
        out.counters("tierstack_x_ops_total", "Ops.", &[(&[("op", "put"), ("model", "a\"b\\c\nd")], 5)]);
        out.gauge("tierstack_x_level", "Level.", -2.5);
        let text = out.finish() + "tierstack_x_timed 7 1700000000000\nbroken line\n";
        let samples = parse_samples(&text);
        assert_eq!(
            samples,
            vec![
                Sample {
                    name: "tierstack_x_ops_total".into(),
                    labels: vec![("op".into(), "put".into()), ("model".into(), "a\"b\\c\nd".into())],
                    value: 5.0
                },
                Sample { name: "tierstack_x_level".into(), labels: vec![], value: -2.5 },
                Sample { name: "tierstack_x_timed".into(), labels: vec![], value: 7.0 },
            ]
        );
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        static BOUNDS: &[f64] = &[0.001, 0.01];
        let histogram = SecondsHistogram::new(BOUNDS);
        for ns in [500_000, 1_000_000, 5_000_000, 2_000_000_000] {
            histogram.record_ns(ns);
        }
        let mut out = Exposition::new();
        out.histogram("tierstack_x_wait_seconds", "Waits.", &histogram);
        let text = out.finish();
        assert!(text.contains("tierstack_x_wait_seconds_bucket{le=\"0.001\"} 2\n"), "{text}");
        assert!(text.contains("tierstack_x_wait_seconds_bucket{le=\"0.01\"} 3\n"), "{text}");
        assert!(text.contains("tierstack_x_wait_seconds_bucket{le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("tierstack_x_wait_seconds_sum 2.0065\n"), "{text}");
        assert!(text.contains("tierstack_x_wait_seconds_count 4\n"), "{text}");
    }
}
