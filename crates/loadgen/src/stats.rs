//! Latency statistics: a nearest-rank percentile over samples, and a
//! fixed-size log-linear histogram for runs too long to keep every sample.

use serde::Serialize;

/// Percentile `pct` (0..=100) of sorted samples, nearest rank; 0 if empty.
pub fn percentile(sorted: &[u64], pct: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

    /// Nearest-rank percentile, reported as the middle of its bucket (never
    /// above the largest value recorded); 0 if empty.
    pub fn percentile(&self, pct: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = (((pct / 100.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
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
            mean_ns: if self.total == 0 { 0.0 } else { self.sum as f64 / self.total as f64 },
            max_ns: self.max,
        }
    }
}

/// Latency percentiles.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub mean_ns: f64,
    pub max_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn percentile_uses_nearest_rank() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!((percentile(&s, 50.0), percentile(&s, 99.0), percentile(&s, 100.0)), (50, 99, 100));
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(percentile(&[7], 1.0), 7);
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
