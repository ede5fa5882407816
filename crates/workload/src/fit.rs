//! Fitting a Zipf exponent to observed request counts.
//!
//! Maximum likelihood over the known ranks: for a truncated Zipf over `n`
//! ranks, `P(k) ∝ k^-α` (1-based), the log-likelihood of counts `c_k` is
//! `−α Σ c_k ln k − N ln H(n, α)`, whose derivative vanishes where the
//! model's mean of `ln k` equals the sample's. That mean falls strictly as α
//! grows, so α is found by bisection. The ranks are the generator's (document
//! `k` is rank `k`), so the fit checks the sampler, not a ranking recovered
//! from counts. Its standard error is about `1 / sqrt(N · Var_α(ln k))`:
//! below 0.002 for 200 000 draws over the seeds' traces.

use crate::ALPHA_MAX;

/// Bisection steps (the bracket is [0, ALPHA_MAX]).
const FIT_STEPS: usize = 60;

/// The maximum-likelihood Zipf exponent for `counts_by_rank[k]` requests of
/// the `k`-th most popular item (0-based), over `counts_by_rank.len()` items.
/// `None` without any request. A sample whose mean `ln k` is at or above the
/// uniform distribution's fits 0 (the boundary); one concentrated on rank 0
/// fits `ALPHA_MAX`.
pub fn fit_zipf_alpha(counts_by_rank: &[u64]) -> Option<f64> {
    let total: u64 = counts_by_rank.iter().sum();
    if total == 0 {
        return None;
    }
    let logs: Vec<f64> = (1..=counts_by_rank.len()).map(|k| (k as f64).ln()).collect();
    let observed = counts_by_rank.iter().zip(&logs).map(|(&c, l)| c as f64 * l).sum::<f64>() / total as f64;
    let model_mean = |alpha: f64| {
        let (mut weight_sum, mut weighted_log) = (0.0f64, 0.0f64);
        for l in &logs {
            let w = (-alpha * l).exp();
            weight_sum += w;
            weighted_log += w * l;
        }
        weighted_log / weight_sum
    };
    if observed >= model_mean(0.0) {
        return Some(0.0);
    }
    let (mut lo, mut hi) = (0.0f64, ALPHA_MAX);
    if observed <= model_mean(hi) {
        return Some(hi);
    }
    for _ in 0..FIT_STEPS {
        let mid = 0.5 * (lo + hi);
        if model_mean(mid) > observed {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(0.5 * (lo + hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZipfTable;

    #[test]
    fn exact_expected_counts_give_back_the_exponent() {
        for alpha in [0.0, 0.61, 0.94, 1.5] {
            let t = ZipfTable::new(3000, alpha).unwrap();
            let counts: Vec<u64> = (0..3000).map(|k| (t.probability(k) * 1e12).round() as u64).collect();
            let fitted = fit_zipf_alpha(&counts).unwrap();
            assert!((fitted - alpha).abs() < 1e-4, "alpha {alpha}: fitted {fitted}");
        }
    }

    #[test]
    fn degenerate_samples() {
        assert_eq!(fit_zipf_alpha(&[]), None);
        assert_eq!(fit_zipf_alpha(&[0, 0, 0]), None);
        assert_eq!(fit_zipf_alpha(&[5, 0, 0]), Some(ALPHA_MAX));
        assert_eq!(fit_zipf_alpha(&[0, 0, 5]), Some(0.0));
        assert_eq!(fit_zipf_alpha(&[7]), Some(0.0));
    }
}
