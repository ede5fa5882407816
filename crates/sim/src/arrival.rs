//! The open loop's schedule, by `tierstack load`'s rule (its
//! `loadgen::arrival`, which the simulator cannot import: both are tools of
//! layer 10), so a simulated open loop issues the same requests at the same
//! offsets as a real one.
//!
//! Points `t_0 < t_1 < …` in nanoseconds after the start:
//! - constant: `t_k = round((k + 1) · 10⁹ / rate)`;
//! - Poisson: `t_k = round(g_0 + … + g_k)` (the sum kept in `f64`), with
//!   `g_i = −ln(1 − u_i) · 10⁹ / rate` and `u_i` the `i`-th `f64` drawn from
//!   `seeded_rng(seed ^ ARRIVAL_SEED_SALT)`.
//!
//! Request `k` belongs to stream `k mod W`: the next document of
//! `trace.stream(seed, w, W)` and the next target of its `TargetChooser`.

use crate::config::Arrivals;
use rand::Rng;
use tierstack_base::{seeded_rng, SeededRng};

/// `tierstack load`'s salt for the arrival stream ("arrivals").
pub const ARRIVAL_SEED_SALT: u64 = 0x6172_7269_7661_6c73;

/// The schedule points of an open loop (endless).
#[derive(Debug)]
pub struct ArrivalSchedule {
    arrivals: Arrivals,
    gap_ns: f64,
    produced: u64,
    sum_ns: f64,
    rng: SeededRng,
}

impl ArrivalSchedule {
    /// The schedule at `rate_per_s` (positive and finite) for `seed`.
    pub fn new(arrivals: Arrivals, rate_per_s: f64, seed: u64) -> Self {
        Self { arrivals, gap_ns: 1e9 / rate_per_s, produced: 0, sum_ns: 0.0, rng: seeded_rng(seed ^ ARRIVAL_SEED_SALT) }
    }
}

impl Iterator for ArrivalSchedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        self.produced += 1;
        let at_ns = match self.arrivals {
            Arrivals::Constant => self.produced as f64 * self.gap_ns,
            Arrivals::Poisson => {
                let u: f64 = self.rng.gen();
                self.sum_ns += -(1.0 - u).ln() * self.gap_ns;
                self.sum_ns
            }
        };
        // `as` saturates: an absurd horizon ends at u64::MAX, never wraps.
        Some(at_ns.round() as u64)
    }
}

/// The stream of scheduled request `k` among `streams`.
pub fn stream_of(k: u64, streams: usize) -> usize {
    (k % streams.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_points_are_evenly_spaced_from_one_gap() {
        let points: Vec<u64> = ArrivalSchedule::new(Arrivals::Constant, 3.0, 1).take(3).collect();
        assert_eq!(points, [333_333_333, 666_666_667, 1_000_000_000]);
    }

    #[test]
    fn poisson_points_are_seeded_increasing_and_average_the_rate() {
        let a: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, 1000.0, 7).take(20_000).collect();
        let b: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, 1000.0, 7).take(20_000).collect();
        let c: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, 1000.0, 8).take(20_000).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // 20 000 gaps of mean 1 ms: the sum's standard deviation is 1.4 %.
        let seconds = a[a.len() - 1] as f64 / 1e9;
        assert!((19.0..21.0).contains(&seconds), "{seconds}");
        assert_eq!((stream_of(7, 3), stream_of(7, 0)), (1, 0));
    }
}
