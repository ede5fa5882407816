//! Latency statistics, one spelling for every crate that measures: the load
//! client (`loadgen`), the simulator (`sim`), the experiments (`bench`).
//!
//! - [`percentile`]: the nearest-rank percentile of sorted samples.
//! - [`Histogram`]: a fixed-size log-linear histogram for runs too long to
//!   keep every sample (percentiles within 1/64).
//! - [`LatencySummary`] and [`summarize`]: count, mean, p50/p90/p99/p99.9
//!   and max of a set of nanosecond samples, as reports serialize them.
//!
//! **The one convention**: a percentile is given in percent, `0.0..=100.0`
//! (`99.0` is p99, `99.9` is p99.9), never as a fraction. Its value is the
//! nearest rank's: the `⌈pct · n / 100⌉`-th smallest of `n` samples (at least
//! the first), so it is always one of the samples — p50 of two samples is the
//! smaller one. The rank is computed exactly for percents given to a
//! thousandth (`pct` is rounded to one), so that no floating-point error in
//! `pct / 100` moves it by one (as `99.9 / 100.0 · n` would for some `n`).
//! An empty set's percentiles are 0.
//!
//! - [`exposition`]: the Prometheus text format every tier's `/metrics`
//!   writes, and a duration histogram of atomics for it.
//!
//! Depends only on `serde` and `std`: every layer may use it.

pub mod exposition;

use serde::Serialize;

/// The nearest rank (1-based, in `1..=n`) of percentile `pct` among `n`
/// values; `n` must be positive.
fn rank(pct: f64, n: u64) -> u64 {
    // Thousandths of a percent, exactly: rank = ⌈milli · n / 100 000⌉.
    let milli = (pct.clamp(0.0, 100.0) * 1000.0).round() as u128;
    let rank = (milli * u128::from(n)).div_ceil(100_000);
    (rank as u64).clamp(1, n)
}

/// Percentile `pct` (percent, `0.0..=100.0`) of `sorted` samples by the
/// nearest-rank rule of this crate's convention; 0 if there are none.
pub fn percentile(sorted: &[u64], pct: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let r = rank(pct, sorted.len() as u64);
    // r is in 1..=len, so the index is in bounds.
    sorted[(r - 1) as usize]
}

/// Latencies of a set of operations, in nanoseconds; percentiles by
/// [`percentile`]. Field names are what reports write as JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub mean_ns: f64,
    pub max_ns: u64,
}

/// Summarizes `samples_ns` (in any order).
pub fn summarize(mut samples_ns: Vec<u64>) -> LatencySummary {
    samples_ns.sort_unstable();
    summarize_sorted(&samples_ns)
}

/// Summarizes samples already sorted ascending.
pub fn summarize_sorted(sorted_ns: &[u64]) -> LatencySummary {
    let count = sorted_ns.len() as u64;
    let sum: u128 = sorted_ns.iter().map(|&s| u128::from(s)).sum();
    LatencySummary {
        count,
        p50_ns: percentile(sorted_ns, 50.0),
        p90_ns: percentile(sorted_ns, 90.0),
        p99_ns: percentile(sorted_ns, 99.0),
        p999_ns: percentile(sorted_ns, 99.9),
        mean_ns: mean(sum, count),
        max_ns: sorted_ns.last().copied().unwrap_or(0),
    }
}

fn mean(sum: u128, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        sum as f64 / count as f64
    }
}

/// Sub-buckets per power of two: values are kept within 1/64 (1.6 %).
const SUB_BUCKET_BITS: u32 = 6;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Buckets covering every u64: 64 exact small values, then 64 per octave.
const BUCKETS: usize = SUB_BUCKETS + (64 - SUB_BUCKET_BITS as usize) * SUB_BUCKETS;

/// Log-linear histogram of u64 values (nanoseconds here): 30 KiB, any
/// number of samples, percentiles within 1.6 % relative error.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS], total: 0, sum: 0, max: 0 }
    }
}

fn bucket_of(value: u64) -> usize {
    if value < SUB_BUCKETS as u64 {
        return value as usize;
    }
    let msb = 63 - value.leading_zeros();
    let shift = msb - SUB_BUCKET_BITS;
    let sub = ((value >> shift) as usize) - SUB_BUCKETS;
    SUB_BUCKETS + shift as usize * SUB_BUCKETS + sub
}

/// The smallest value of bucket `b`.
fn bucket_low(b: usize) -> u64 {
    if b < SUB_BUCKETS {
        return b as u64;
    }
    let shift = ((b - SUB_BUCKETS) / SUB_BUCKETS) as u32;
    let sub = ((b - SUB_BUCKETS) % SUB_BUCKETS) as u64;
    (SUB_BUCKETS as u64 + sub) << shift
}

impl Histogram {
    pub fn record(&mut self, value: u64) {
        self.counts[bucket_of(value)] += 1;
        self.total += 1;
        self.sum += u128::from(value);
        self.max = self.max.max(value);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// Percentile `pct` (percent) by the nearest-rank rule, reported as the
    /// middle of its bucket (never above the largest value recorded); 0 if
    /// empty.
    pub fn percentile(&self, pct: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = rank(pct, self.total);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let low = bucket_low(b);
                let high = if b + 1 < BUCKETS { bucket_low(b + 1) } else { u64::MAX };
                return (low + (high - low) / 2).min(self.max);
            }
        }
        self.max
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.total,
            p50_ns: self.percentile(50.0),
            p90_ns: self.percentile(90.0),
            p99_ns: self.percentile(99.0),
            p999_ns: self.percentile(99.9),
            mean_ns: mean(self.sum, self.total),
            max_ns: self.max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn percentile_uses_nearest_rank() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!((percentile(&s, 50.0), percentile(&s, 99.0), percentile(&s, 100.0)), (50, 99, 100));
        assert_eq!(percentile(&s, 99.9), 100);
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(percentile(&[7], 1.0), 7);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[1, 2], 50.0), 1, "p50 of two is the smaller");
    }

    /// The rank is exact where `pct / 100` is not: 99.9 / 100.0 · n rounds
    /// up past an integer for some n (1000 among them).
    #[test]
    fn ranks_are_exact_for_thousandths_of_a_percent() {
        for n in 1..20_000u64 {
            assert_eq!(rank(99.9, n), (999 * n).div_ceil(1000).max(1), "n = {n}");
            assert_eq!(rank(99.0, n), (99 * n).div_ceil(100).max(1), "n = {n}");
            assert_eq!(rank(50.0, n), n.div_ceil(2), "n = {n}");
        }
        assert_eq!((rank(0.0, 5), rank(100.0, 5), rank(250.0, 5)), (1, 5, 5));
    }

    #[test]
    fn summaries_of_samples() {
        let s = summarize((1..=100).rev().map(|i| i * 1000).collect());
        assert_eq!(
            (s.count, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns),
            (100, 50_000, 90_000, 99_000, 100_000, 100_000)
        );
        assert!((s.mean_ns - 50_500.0).abs() < 1e-9);
        assert_eq!(summarize(Vec::new()), LatencySummary::default());
    }

    #[test]
    fn buckets_tile_the_u64_range() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(63), 63);
        assert_eq!(bucket_of(64), 64);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for b in 1..BUCKETS {
            assert!(bucket_low(b) > bucket_low(b - 1));
            assert_eq!(bucket_of(bucket_low(b)), b);
            assert_eq!(bucket_of(bucket_low(b) - 1), b - 1);
        }
    }

    proptest! {
        /// Histogram percentiles are within 1/64 of the exact ones.
        #[test]
        fn histogram_matches_exact_percentiles(mut samples in proptest::collection::vec(0u64..10_000_000_000, 1..400)) {
            let mut h = Histogram::default();
            for &s in &samples { h.record(s); }
            samples.sort_unstable();
            for pct in [1.0, 50.0, 90.0, 99.0, 100.0] {
                let exact = percentile(&samples, pct) as f64;
                let approx = h.percentile(pct) as f64;
                prop_assert!((approx - exact).abs() <= exact / 64.0 + 1.0, "p{}: {} vs {}", pct, approx, exact);
            }
            prop_assert_eq!(h.summary().max_ns, *samples.last().unwrap());
        }
    }
}
