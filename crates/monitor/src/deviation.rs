//! The accuracy experiment's offline join (Fig. 8a): each reported value
//! against the true value at the moment the front end used it.
//!
//! The back end logs every change of the true value with the host clock; the
//! front end logs (time of use, reported value). Both clocks are
//! `CLOCK_MONOTONIC` of one host, so the join is exact. Pure.

use serde::Serialize;

/// One change of the true value: from `t_ns` on, the value is `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub t_ns: u64,
    pub value: i64,
}

/// One value a scheme reported, and when the front end used it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub used_ns: u64,
    pub reported: i64,
}

/// Reported − actual at each sample's time of use, as (time, deviation).
/// Samples used before the first change are skipped (the truth is not
/// known then). Changes at equal times apply in log order (the last wins).
pub fn deviations(changes: &[Change], samples: &[Sample]) -> Vec<(u64, i64)> {
    let mut truth = changes.to_vec();
    truth.sort_by_key(|c| c.t_ns); // stable: equal times keep log order
    samples
        .iter()
        .filter_map(|sample| {
            // The last change at or before the time of use.
            let after = truth.partition_point(|c| c.t_ns <= sample.used_ns);
            let actual = truth.get(after.checked_sub(1)?)?.value;
            Some((sample.used_ns, sample.reported - actual))
        })
        .collect()
}

/// Summary of |deviation| over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct DeviationSummary {
    pub samples: usize,
    pub mean_abs: f64,
    pub p99_abs: u64,
    pub max_abs: u64,
    /// Share of samples with deviation exactly 0, in [0, 1].
    pub exact_share: f64,
}

/// Summarizes deviations (p99 by the nearest-rank rule).
pub fn summarize(deviations: &[(u64, i64)]) -> DeviationSummary {
    if deviations.is_empty() {
        return DeviationSummary::default();
    }
    let mut magnitudes: Vec<u64> = deviations.iter().map(|(_, d)| d.unsigned_abs()).collect();
    magnitudes.sort_unstable();
    let n = magnitudes.len();
    let rank = (n * 99).div_ceil(100).max(1);
    let exact = magnitudes.iter().take_while(|m| **m == 0).count();
    DeviationSummary {
        samples: n,
        mean_abs: magnitudes.iter().map(|m| *m as f64).sum::<f64>() / n as f64,
        p99_abs: magnitudes[rank - 1],
        max_abs: magnitudes[n - 1],
        exact_share: exact as f64 / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn change(t_ns: u64, value: i64) -> Change {
        Change { t_ns, value }
    }

    #[test]
    fn each_sample_is_compared_with_the_value_in_force_when_it_was_used() {
        let changes = [change(10, 1), change(20, 3), change(30, 0)];
        let samples = [
            Sample { used_ns: 5, reported: 9 },  // before any truth: skipped
            Sample { used_ns: 10, reported: 1 }, // at the change: the new value
            Sample { used_ns: 25, reported: 1 }, // stale by one step
            Sample { used_ns: 99, reported: 0 },
        ];
        assert_eq!(deviations(&changes, &samples), vec![(10, 0), (25, -2), (99, 0)]);
    }

    #[test]
    fn equal_times_apply_in_log_order_and_order_of_the_log_does_not_matter_otherwise() {
        let samples = [Sample { used_ns: 20, reported: 0 }];
        assert_eq!(deviations(&[change(20, 4), change(20, 7)], &samples), vec![(20, -7)]);
        assert_eq!(deviations(&[change(30, 1), change(10, 2)], &samples), vec![(20, -2)]);
    }

    #[test]
    fn the_summary_counts_exact_samples_and_the_tail() {
        let mut devs: Vec<(u64, i64)> = (0..98).map(|i| (i, 0)).collect();
        devs.push((98, -3));
        devs.push((99, 10));
        let s = summarize(&devs);
        assert_eq!(s.samples, 100);
        assert_eq!(s.p99_abs, 3);
        assert_eq!(s.max_abs, 10);
        assert!((s.mean_abs - 0.13).abs() < 1e-12);
        assert!((s.exact_share - 0.98).abs() < 1e-12);
        assert_eq!(summarize(&[]), DeviationSummary::default());
    }

    proptest! {
        /// Against a brute force: replay the log up to each sample.
        #[test]
        fn the_join_agrees_with_a_replay(
            log in proptest::collection::vec((0u64..100, -5i64..5), 1..30),
            uses in proptest::collection::vec((0u64..120, -5i64..5), 0..30),
        ) {
            let changes: Vec<Change> = log.iter().map(|(t, v)| change(*t, *v)).collect();
            let samples: Vec<Sample> = uses.iter().map(|(t, r)| Sample { used_ns: *t, reported: *r }).collect();
            let expected: Vec<(u64, i64)> = samples.iter().filter_map(|s| {
                let mut actual = None;
                let mut best_t = None;
                for c in &changes {
                    if c.t_ns <= s.used_ns && best_t.is_none_or(|b| c.t_ns >= b) {
                        best_t = Some(c.t_ns);
                        actual = Some(c.value);
                    }
                }
                actual.map(|a| (s.used_ns, s.reported - a))
            }).collect();
            prop_assert_eq!(deviations(&changes, &samples), expected);
        }
    }
}
