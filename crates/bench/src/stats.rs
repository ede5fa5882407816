//! Latency summaries.

use serde::Serialize;

/// Summary of a set of per-operation latencies.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub mean_ns: f64,
    /// Operations completed per second of measured wall time.
    pub ops_per_sec: f64,
}

/// Percentile (0..=100) of sorted samples, nearest rank.
pub fn percentile(sorted: &[u64], pct: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarizes `samples_ns` measured over `wall_ns` of wall time.
pub fn summarize(mut samples_ns: Vec<u64>, wall_ns: u64) -> Summary {
    samples_ns.sort_unstable();
    let count = samples_ns.len();
    let mean_ns = if count == 0 { 0.0 } else { samples_ns.iter().map(|&s| s as f64).sum::<f64>() / count as f64 };
    Summary {
        count,
        p50_ns: percentile(&samples_ns, 50.0),
        p99_ns: percentile(&samples_ns, 99.0),
        mean_ns,
        ops_per_sec: if wall_ns == 0 { 0.0 } else { count as f64 * 1e9 / wall_ns as f64 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&samples, 50.0), 50);
        assert_eq!(percentile(&samples, 99.0), 99);
        assert_eq!(percentile(&samples, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        let s = summarize(vec![3, 1, 2], 1_000_000_000);
        assert_eq!((s.count, s.p50_ns, s.ops_per_sec), (3, 2, 3.0));
    }
}
