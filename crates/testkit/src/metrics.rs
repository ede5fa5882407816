//! Checks a `/metrics` exposition as a Prometheus server would take it:
//! parsed by `prometheus-parse` (a parser of the text format that shares no
//! code with ours), by `promtool check metrics` where that tool is installed
//! (it also lints the naming conventions), and by the conventions we hold
//! every tier to: every family has HELP and TYPE before its samples, names
//! are valid, counters end in `_total`, histogram buckets are cumulative and
//! their `+Inf` bucket equals `_count`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

/// A checked exposition: every sample as `name{labels}` → value.
#[derive(Debug)]
pub struct Metrics {
    pub samples: Vec<prometheus_parse::Sample>,
    pub text: String,
}

impl Metrics {
    /// The value of the sample `name` whose labels include `labels`
    /// (histograms: `name_count`, `name_sum`, `name_bucket` with `le`).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        for sample in &self.samples {
            if let Some(v) = sample_value(sample, name, labels) {
                return Some(v);
            }
        }
        None
    }

    /// As [`Metrics::value`], panicking with the text when it is absent.
    pub fn get(&self, name: &str) -> f64 {
        self.value(name, &[]).unwrap_or_else(|| panic!("no sample {name} in\n{}", self.text))
    }

    /// Every family name (the `# TYPE` lines).
    pub fn families(&self) -> BTreeSet<String> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect()
    }
}

fn sample_value(sample: &prometheus_parse::Sample, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::Value;
    let has_labels = |extra: &[(&str, String)]| {
        labels.iter().all(|(k, v)| sample.labels.get(k) == Some(v) || extra.iter().any(|(ek, ev)| ek == k && ev == v))
    };
    match &sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) if sample.metric == name && has_labels(&[]) => Some(*v),
        Value::Histogram(buckets) => {
            for b in buckets {
                let le = if b.less_than.is_infinite() { "+Inf".to_string() } else { b.less_than.to_string() };
                if name == format!("{}_bucket", sample.metric) && has_labels(&[("le", le)]) {
                    return Some(b.count);
                }
            }
            None
        }
        _ => None,
    }
}

/// Checks `text` (see the module documentation) and parses it.
pub fn check(text: &str) -> Result<Metrics, String> {
    check_conventions(text)?;
    if let Some(lint) = promtool(text)? {
        return Err(format!("promtool check metrics: {lint}\n{text}"));
    }
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).map_err(|e| format!("prometheus-parse: {e}"))?;
    Ok(Metrics { samples: scrape.samples, text: text.to_string() })
}

/// `promtool check metrics` on `text`: `Ok(None)` if it passed or the tool
/// is not installed, `Ok(Some(output))` if it found problems.
fn promtool(text: &str) -> Result<Option<String>, String> {
    let spawned = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("starting promtool: {e}")),
    };
    child.stdin.take().expect("piped").write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    Ok((!output.status.success() || !said.trim().is_empty()).then_some(said))
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The conventions, line by line.
fn check_conventions(text: &str) -> Result<(), String> {
    let mut helped = BTreeSet::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    // Per histogram: the last bucket count, and the +Inf count.
    let mut last_bucket: BTreeMap<String, f64> = BTreeMap::new();
    let mut infinite: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines() {
        let fail = |why: &str| Err(format!("{why}: {line:?}"));
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !helped.insert(name.to_string()) {
                return fail("a second HELP");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (name, kind) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
            if !helped.contains(name) {
                return fail("TYPE before HELP");
            }
            if !valid_name(name) {
                return fail("invalid name");
            }
            if !["counter", "gauge", "histogram"].contains(&kind) {
                return fail("a type other than counter, gauge, histogram");
            }
            if (kind == "counter") != name.ends_with("_total") {
                return fail("counters, and only counters, end in _total");
            }
            if typed.insert(name.to_string(), kind.to_string()).is_some() {
                return fail("a second TYPE");
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| format!("no value: {line:?}"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| format!("bad value: {line:?}"))?,
        };
        let name = series.split('{').next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix).filter(|base| typed.get(*base).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        let Some(kind) = typed.get(family) else { return fail("a sample before its TYPE") };
        if kind == "counter" && (value.is_nan() || value < 0.0) {
            return fail("a negative or NaN counter");
        }
        if name.ends_with("_bucket") && kind == "histogram" {
            let previous = last_bucket.insert(family.to_string(), value).unwrap_or(0.0);
            if value < previous {
                return fail("histogram buckets are not cumulative");
            }
            if series.contains("le=\"+Inf\"") {
                infinite.insert(family.to_string(), value);
            }
        }
        if name.ends_with("_count") && kind == "histogram" && infinite.get(family) != Some(&value) {
            return fail("_count differs from the +Inf bucket");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# HELP tierstack_t_ops_total Ops.\n# TYPE tierstack_t_ops_total counter\n\
                        tierstack_t_ops_total{kind=\"a\"} 4\n\
                        # HELP tierstack_t_wait_seconds Waits.\n# TYPE tierstack_t_wait_seconds histogram\n\
                        tierstack_t_wait_seconds_bucket{le=\"0.1\"} 1\ntierstack_t_wait_seconds_bucket{le=\"+Inf\"} 2\n\
                        tierstack_t_wait_seconds_sum 0.5\ntierstack_t_wait_seconds_count 2\n";

    #[test]
    fn a_good_exposition_passes_and_its_values_are_found() {
        let metrics = check(GOOD).unwrap();
        assert_eq!(metrics.value("tierstack_t_ops_total", &[("kind", "a")]), Some(4.0));
        assert_eq!(metrics.value("tierstack_t_wait_seconds_bucket", &[("le", "+Inf")]), Some(2.0));
        assert_eq!(metrics.value("tierstack_t_ops_total", &[("kind", "b")]), None);
    }

    /// Each break of a convention is caught.
    #[test]
    fn every_broken_convention_fails() {
        let breaks = [
            GOOD.replace("tierstack_t_ops_total counter", "tierstack_t_ops_total gauge"),
            GOOD.replace("# HELP tierstack_t_ops_total Ops.\n", ""),
            GOOD.replace("_bucket{le=\"+Inf\"} 2", "_bucket{le=\"+Inf\"} 0"),
            GOOD.replace("_count 2", "_count 3"),
            GOOD.replace("{kind=\"a\"} 4", "{kind=\"a\"} -4"),
            GOOD.replace("{kind=\"a\"} 4", "{kind=\"a\"} four"),
            GOOD.replace("tierstack_t_ops_total", "tierstack-t-ops_total"),
        ];
        for text in breaks {
            assert!(check(&text).is_err(), "passed:\n{text}");
        }
    }
}
