//! Latency summaries of the experiments: `tierstack_stats`'s
//! [`LatencySummary`] with the rate the operations ran at.

use serde::Serialize;
use std::ops::Deref;
use tierstack_stats::LatencySummary;

/// Summary of a set of per-operation latencies and of their rate. Serialized
/// flat (`count`, `p50_ns`, `p99_ns`, `mean_ns`, … and `ops_per_sec`), and it
/// reads as its [`LatencySummary`], so a report writes `summary.p50_ns`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    #[serde(flatten)]
    pub latency: LatencySummary,
    /// Operations completed per second of measured wall time.
    pub ops_per_sec: f64,
}

impl Deref for Summary {
    type Target = LatencySummary;

    fn deref(&self) -> &LatencySummary {
        &self.latency
    }
}

/// Summarizes `samples_ns` measured over `wall_ns` of wall time.
pub fn summarize(samples_ns: Vec<u64>, wall_ns: u64) -> Summary {
    let latency = tierstack_stats::summarize(samples_ns);
    let ops_per_sec = if wall_ns == 0 { 0.0 } else { latency.count as f64 * 1e9 / wall_ns as f64 };
    Summary { latency, ops_per_sec }
}

/// Summarizes operations run one after another: the wall time is the sum
/// of their latencies, so the rate is 1 / mean.
pub fn summarize_serial(samples_ns: Vec<u64>) -> Summary {
    let wall_ns = samples_ns.iter().sum();
    summarize(samples_ns, wall_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_carry_the_rate() {
        let s = summarize(vec![3, 1, 2], 1_000_000_000);
        assert_eq!((s.count, s.p50_ns, s.ops_per_sec), (3, 2, 3.0));
        assert_eq!(summarize_serial(vec![500_000_000, 500_000_000]).ops_per_sec, 2.0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!((json["p50_ns"].as_u64(), json["ops_per_sec"].as_f64()), (Some(2), Some(3.0)), "flat");
    }
}
