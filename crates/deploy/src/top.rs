//! `tierstack top`'s view of the tiers: every service of a topology that
//! serves `/metrics` (the proxies' and origins' admin listeners, every
//! other kind's `metrics` address), scraped twice an interval apart and
//! shown one line per service: up or not, its CPU (from
//! `process_cpu_seconds_total`), resident memory, threads, and its busiest
//! counter's rate; for a proxy also its hit ratio over the interval.
//!
//! [`rows`] is pure (two scrapes in, rows out); [`scrape`] does the I/O,
//! each request bounded so that a stopped service shows as down instead of
//! hanging the tool.

use crate::cluster::plan;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tierstack_cluster::Topology;
use tierstack_stats::exposition::{parse_samples, Sample};

/// How long one scrape may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);

/// A service to scrape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    pub node: u32,
    pub kind: String,
    pub addr: SocketAddr,
}

/// The services of the topology at `path` that serve `/metrics`, in start order.
pub fn targets(path: &Path) -> Result<Vec<Target>> {
    let path = std::fs::canonicalize(path).with_context(|| format!("reading topology {}", path.display()))?;
    let topology = Topology::load(&path)?;
    if topology.services().next().is_none() {
        return Ok(Vec::new());
    }
    let launches = plan(&topology, &path)?;
    Ok(launches
        .iter()
        .filter_map(|l| l.metrics.map(|addr| Target { node: l.node, kind: l.kind.command().to_string(), addr }))
        .collect())
}

/// One scrape of every target: the samples, or why there are none.
#[derive(Clone, Debug)]
pub struct Scrape {
    pub at: Instant,
    pub samples: Vec<Result<Vec<Sample>, String>>,
}

/// Scrapes every target now (one after the other, each bounded).
pub fn scrape(targets: &[Target]) -> Scrape {
    let at = tierstack_base::time::instant_now();
    let samples = targets
        .iter()
        .map(|t| match crate::deployment::get_within(t.addr, "/metrics", SCRAPE_TIMEOUT) {
            Ok((200, body)) => Ok(parse_samples(&body)),
            Ok((code, _)) => Err(format!("status {code}")),
            Err(e) => Err(format!("{e:#}")),
        })
        .collect();
    Scrape { at, samples }
}

/// One service's line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierRow {
    pub node: u32,
    pub kind: String,
    pub addr: SocketAddr,
    /// Why it could not be scraped, if it could not.
    pub down: Option<String>,
    /// CPU used over the interval, percent of one core.
    pub cpu_percent: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub threads: Option<f64>,
    /// The counter family (summed over its labels) that rose fastest, per second.
    pub busiest: Option<(String, f64)>,
    /// Proxies: hits per request over the interval.
    pub hit_ratio: Option<f64>,
}

/// Each counter family's total (summed over label sets); gauges by name.
fn totals(samples: &[Sample]) -> BTreeMap<&str, f64> {
    let mut totals = BTreeMap::new();
    for sample in samples {
        *totals.entry(sample.name.as_str()).or_insert(0.0) += sample.value;
    }
    totals
}

/// The rows of two scrapes of `targets` (pure).
pub fn rows(targets: &[Target], before: &Scrape, after: &Scrape) -> Vec<TierRow> {
    let seconds = after.at.saturating_duration_since(before.at).as_secs_f64();
    targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            let mut row = TierRow {
                node: target.node,
                kind: target.kind.clone(),
                addr: target.addr,
                down: None,
                cpu_percent: None,
                resident_bytes: None,
                threads: None,
                busiest: None,
                hit_ratio: None,
            };
            let now = match after.samples.get(i) {
                Some(Ok(samples)) => totals(samples),
                Some(Err(why)) => {
                    row.down = Some(why.clone());
                    return row;
                }
                None => {
                    row.down = Some("not scraped".into());
                    return row;
                }
            };
            row.resident_bytes = now.get("process_resident_memory_bytes").copied();
            row.threads = now.get("process_threads").copied();
            let Some(Ok(earlier)) = before.samples.get(i) else { return row };
            let then = totals(earlier);
            // A counter that fell was reset (the process restarted): no rate.
            let rise = |name: &str| match (then.get(name), now.get(name)) {
                (Some(a), Some(b)) if b >= a && seconds > 0.0 => Some(b - a),
                _ => None,
            };
            row.cpu_percent = rise("process_cpu_seconds_total").map(|cpu| 100.0 * cpu / seconds);
            row.busiest = now
                .keys()
                .filter(|name| name.starts_with("tierstack_") && name.ends_with("_total"))
                .filter_map(|name| rise(name).map(|r| (name.to_string(), r / seconds)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            if target.kind == "proxy" {
                if let (Some(hits), Some(requests)) =
                    (rise("tierstack_proxy_hits_total"), rise("tierstack_proxy_requests_total"))
                {
                    row.hit_ratio = (requests > 0.0).then(|| hits / requests);
                }
            }
            row
        })
        .collect()
}

/// The rows as a table.
pub fn render(rows: &[TierRow]) -> String {
    let mut out = format!(
        "{:>4}  {:<11} {:<21} {:>6} {:>9} {:>7} {:>6}  busiest counter\n",
        "node", "kind", "metrics", "cpu%", "rss MiB", "threads", "hit%"
    );
    for row in rows {
        let number = |v: Option<f64>, scale: f64, digits: usize| match v {
            Some(v) => format!("{:.*}", digits, v / scale),
            None => "-".to_string(),
        };
        let busiest = match (&row.down, &row.busiest) {
            (Some(why), _) => format!("DOWN: {why}"),
            (None, Some((name, rate))) => format!("{name} {rate:.0}/s"),
            (None, None) => "-".to_string(),
        };
        out.push_str(&format!(
            "{:>4}  {:<11} {:<21} {:>6} {:>9} {:>7} {:>6}  {busiest}\n",
            row.node,
            row.kind,
            row.addr.to_string(),
            number(row.cpu_percent, 1.0, 1),
            number(row.resident_bytes, 1024.0 * 1024.0, 1),
            number(row.threads, 1.0, 0),
            number(row.hit_ratio.map(|r| r * 100.0), 1.0, 1),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Sample { name: name.into(), labels, value }
    }

    #[test]
    fn rates_cpu_and_hit_ratio_come_from_the_rise_over_the_interval() {
        let targets = vec![
            Target { node: 2, kind: "proxy".into(), addr: "127.0.0.1:1".parse().unwrap() },
            Target { node: 4, kind: "dlm-node".into(), addr: "127.0.0.1:2".parse().unwrap() },
            Target { node: 5, kind: "origin".into(), addr: "127.0.0.1:3".parse().unwrap() },
        ];
        let start = tierstack_base::time::instant_now();
        let proxy = |requests: f64, hits: f64, cpu: f64| {
            vec![
                sample("tierstack_proxy_requests_total", &[], requests),
                sample("tierstack_proxy_hits_total", &[], hits),
                sample("process_cpu_seconds_total", &[], cpu),
                sample("process_resident_memory_bytes", &[], 2.0 * 1024.0 * 1024.0),
            ]
        };
        let dlm = |shared: f64, exclusive: f64| {
            vec![
                sample("tierstack_dlm_acquires_total", &[("mode", "shared")], shared),
                sample("tierstack_dlm_acquires_total", &[("mode", "exclusive")], exclusive),
            ]
        };
        let before = Scrape { at: start, samples: vec![Ok(proxy(100.0, 50.0, 1.0)), Ok(dlm(10.0, 10.0)), Ok(vec![])] };
        let after = Scrape {
            at: start + Duration::from_secs(2),
            samples: vec![Ok(proxy(300.0, 230.0, 1.5)), Ok(dlm(30.0, 50.0)), Err("connection refused".into())],
        };
        let rows = rows(&targets, &before, &after);
        assert_eq!(rows[0].busiest, Some(("tierstack_proxy_requests_total".to_string(), 100.0)));
        assert_eq!(rows[0].hit_ratio, Some(0.9));
        assert_eq!(rows[0].cpu_percent, Some(25.0));
        // Label sets of a family are summed: (20 + 40) / 2 s.
        assert_eq!(rows[1].busiest, Some(("tierstack_dlm_acquires_total".to_string(), 30.0)));
        assert_eq!(rows[2].down.as_deref(), Some("connection refused"));
        let table = render(&rows);
        assert!(table.contains("DOWN: connection refused"), "{table}");
        assert!(table.contains("90.0"), "{table}");
    }

    /// A restarted process's counters start again from zero: no rate then.
    #[test]
    fn a_counter_that_fell_gives_no_rate() {
        let targets = vec![Target { node: 0, kind: "proxy".into(), addr: "127.0.0.1:1".parse().unwrap() }];
        let start = tierstack_base::time::instant_now();
        let one = |v: f64| vec![sample("tierstack_proxy_requests_total", &[], v)];
        let before = Scrape { at: start, samples: vec![Ok(one(500.0))] };
        let after = Scrape { at: start + Duration::from_secs(1), samples: vec![Ok(one(3.0))] };
        assert_eq!(rows(&targets, &before, &after)[0].busiest, None);
    }
}
