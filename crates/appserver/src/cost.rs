//! Per-request CPU cost: what a "RUBiS-like" dynamic page costs to make.
//!
//! [I] The seed's throughput experiment (svc §5.2, Fig. 8b) uses RUBiS,
//! whose requests differ widely in CPU cost (browse pages are cheap, search
//! and bid pages expensive). We model that mix as a bounded Pareto
//! distribution of CPU time per request ([R]: heavy-tailed, so a few
//! requests hold a back end's CPU long enough for load-aware balancing to
//! matter; bounded, so no request is unbounded). The draw is a function of
//! the seed, the document and the request's sequence number at this server:
//! a run is reproducible, and the cost does not depend on which back end a
//! balancer chose. This is a synthetic model, not RUBiS itself: every output
//! that uses it says "RUBiS-like".

use serde::Serialize;
use tierstack_base::time::instant_now;

/// A bounded Pareto distribution of CPU time per request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CpuCost {
    /// Shape: smaller is heavier-tailed.
    pub alpha: f64,
    pub min_us: u64,
    pub max_us: u64,
    pub seed: u64,
}

impl CpuCost {
    /// The default "RUBiS-like" mix: α = 1.1 between 0.2 ms and 50 ms
    /// (mean ≈ 0.9 ms, a few percent of requests above 5 ms).
    pub const RUBIS_LIKE: CpuCost = CpuCost { alpha: 1.1, min_us: 200, max_us: 50_000, seed: 1 };

    /// `rubis` (the default mix), `pareto:<alpha>,<min_us>,<max_us>` or
    /// `fixed:<us>` (every page costs exactly that), with `seed`.
    pub fn parse(spec: &str, seed: u64) -> Result<CpuCost, String> {
        let cost = if spec == "rubis" {
            CpuCost { seed, ..CpuCost::RUBIS_LIKE }
        } else if let Some(micros) = spec.strip_prefix("fixed:") {
            let micros =
                micros.trim().parse::<u64>().map_err(|_| format!("{spec:?}: {micros:?} is not a whole number"))?;
            // A Pareto bounded to one point: every draw is that point.
            CpuCost { alpha: 1.0, min_us: micros, max_us: micros, seed }
        } else if let Some(params) = spec.strip_prefix("pareto:") {
            let fields: Vec<&str> = params.split(',').collect();
            let [alpha, min_us, max_us] = fields[..] else {
                return Err(format!("{spec:?}: expected pareto:<alpha>,<min_us>,<max_us>"));
            };
            let number =
                |s: &str| s.trim().parse::<u64>().map_err(|_| format!("{spec:?}: {s:?} is not a whole number"));
            CpuCost {
                alpha: alpha.trim().parse().map_err(|_| format!("{spec:?}: {alpha:?} is not a number"))?,
                min_us: number(min_us)?,
                max_us: number(max_us)?,
                seed,
            }
        } else {
            return Err(format!(
                "unknown CPU cost {spec:?} (expected rubis, pareto:<alpha>,<min_us>,<max_us> or fixed:<us>)"
            ));
        };
        cost.validate()?;
        Ok(cost)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!("CPU cost shape {} must be a positive number", self.alpha));
        }
        if self.min_us == 0 || self.min_us > self.max_us || self.max_us > 10_000_000 {
            return Err(format!(
                "CPU cost bounds {}..{} us must satisfy 0 < min <= max <= 10 s",
                self.min_us, self.max_us
            ));
        }
        Ok(())
    }

    /// The inverse CDF of the bounded Pareto at `u` in [0, 1).
    pub fn quantile_us(&self, u: f64) -> u64 {
        let (low, high) = (self.min_us as f64, self.max_us as f64);
        let ratio = (low / high).powf(self.alpha);
        let x = low * (1.0 - u.clamp(0.0, 1.0) * (1.0 - ratio)).powf(-1.0 / self.alpha);
        (x.round() as u64).clamp(self.min_us, self.max_us)
    }

    /// The CPU time of request number `sequence` for document `name`.
    pub fn cost_us(&self, name: &str, sequence: u64) -> u64 {
        let mixed = splitmix64(self.seed ^ crate::fnv1a64(name.as_bytes()) ^ splitmix64(sequence));
        // 53 random bits -> [0, 1).
        self.quantile_us((mixed >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// CPU time this thread has used (`CLOCK_THREAD_CPUTIME_ID`), in ns.
pub fn thread_cpu_ns() -> Option<u64> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (rc == 0).then(|| u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0))
}

/// Keeps this thread on the CPU until it has used `micros` of **CPU time**
/// (not wall time: on a busy CPU the request takes longer, as a real one
/// would, which is what makes a back end's load matter to a balancer).
/// Falls back to wall time where the thread's CPU clock is unavailable.
pub fn burn_cpu(micros: u64) {
    let budget_ns = micros.saturating_mul(1000);
    let start_cpu = thread_cpu_ns();
    let start_wall = instant_now();
    let mut x: u64 = micros | 1;
    loop {
        for _ in 0..256 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        }
        std::hint::black_box(x);
        let used = match (start_cpu, thread_cpu_ns()) {
            (Some(start), Some(now)) => now.saturating_sub(start),
            _ => u64::try_from(start_wall.elapsed().as_nanos()).unwrap_or(u64::MAX),
        };
        if used >= budget_ns {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_bounds_and_are_heavy_tailed() {
        let cost = CpuCost::RUBIS_LIKE;
        let draws: Vec<u64> = (0..20_000).map(|i| cost.cost_us("doc", i)).collect();
        assert!(draws.iter().all(|&d| (cost.min_us..=cost.max_us).contains(&d)));
        let mut sorted = draws.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        let p99 = sorted[sorted.len() * 99 / 100];
        // Heavy tail: the mean well above the median, the 99th percentile
        // an order of magnitude above it (an exponential would give ~6.6x).
        assert!(mean > 1.5 * median as f64, "mean {mean} median {median}");
        assert!(p99 > 10 * median, "p99 {p99} median {median}");
    }

    #[test]
    fn the_quantile_matches_the_closed_form_cdf() {
        let cost = CpuCost { alpha: 1.5, min_us: 100, max_us: 10_000, seed: 0 };
        let (l, h, a) = (100f64, 10_000f64, 1.5f64);
        for u in [0.0, 0.1, 0.5, 0.9, 0.99] {
            let x = cost.quantile_us(u) as f64;
            let cdf = (1.0 - (l / x).powf(a)) / (1.0 - (l / h).powf(a));
            assert!((cdf - u).abs() < 0.01, "u {u} x {x} cdf {cdf}");
        }
    }

    #[test]
    fn draws_are_reproducible_and_differ_between_requests() {
        let cost = CpuCost::RUBIS_LIKE;
        assert_eq!(cost.cost_us("a", 7), cost.cost_us("a", 7));
        let distinct: std::collections::HashSet<u64> = (0..100).map(|i| cost.cost_us("a", i)).collect();
        assert!(distinct.len() > 50);
        let reseeded = CpuCost { seed: 2, ..cost };
        assert!((0..100).any(|i| reseeded.cost_us("a", i) != cost.cost_us("a", i)));
    }

    #[test]
    fn a_burn_uses_at_least_its_cost_in_cpu_time() {
        let before = thread_cpu_ns().unwrap();
        burn_cpu(3_000);
        assert!(thread_cpu_ns().unwrap() - before >= 3_000_000);
    }

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        assert_eq!(CpuCost::parse("rubis", 9).unwrap(), CpuCost { seed: 9, ..CpuCost::RUBIS_LIKE });
        let custom = CpuCost::parse("pareto:0.8,50,2000", 3).unwrap();
        assert_eq!((custom.alpha, custom.min_us, custom.max_us), (0.8, 50, 2000));
        for bad in ["", "pareto:1", "pareto:x,1,2", "pareto:1,0,5", "pareto:1,9,5", "pareto:-1,1,5", "exp:1"] {
            assert!(CpuCost::parse(bad, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_fixed_cost_is_that_cost_for_every_page() {
        let cost = CpuCost::parse("fixed:3000", 5).unwrap();
        assert!((0..1000).all(|i| cost.cost_us("hot", i) == 3000));
        assert!((0..1000).all(|i| cost.cost_us(&format!("doc{i}"), 7) == 3000));
        assert_eq!(CpuCost::parse("fixed:1", 0).unwrap().cost_us("a", 1), 1);
    }

    #[test]
    fn bad_fixed_costs_are_refused() {
        for bad in ["fixed:", "fixed:x", "fixed:-3", "fixed:0", "fixed:1,2", "fixed:1.5", "fixed:10000001"] {
            let err = CpuCost::parse(bad, 0).unwrap_err();
            assert!(err.contains("fixed") || err.contains("bounds"), "{bad:?}: {err}");
        }
        assert!(CpuCost::parse("fixed:10000000", 0).is_ok(), "10 s is the bound, inclusive");
    }
}
