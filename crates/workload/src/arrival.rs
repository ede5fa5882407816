//! The open loop's schedule: when each request is due, and which stream it
//! belongs to. One rule shared by the load client (`tierstack load --rate`)
//! and the simulator (`tierstack sim --rate`), so a simulated open loop issues
//! the same requests at the same offsets as a real one. Pure (no I/O, no
//! clock).
//!
//! # The rule
//!
//! An open-loop run at `rate` requests per second has schedule points
//! `t_0 < t_1 < …`, nanoseconds after the run's start:
//!
//! - [`Arrivals::Constant`]: `t_k = round((k + 1) · 10⁹ / rate)`.
//! - [`Arrivals::Poisson`]: `t_k = round(g_0 + … + g_k)` (the sum kept in
//!   `f64` nanoseconds), where `g_i = −ln(1 − u_i) · 10⁹ / rate` and `u_i` is
//!   the `i`-th `f64` drawn (`rand::Rng::gen`, uniform in `[0, 1)`) from
//!   `tierstack_base::seeded_rng(seed ^ ARRIVAL_SEED_SALT)`: exponential
//!   inter-arrival times of mean `1 / rate`.
//!
//! Request `k` (scheduled at `t_k`) belongs to **stream** `w = k mod W`
//! ([`stream_of`]), `W` being the run's stream count: it takes the next
//! document of `trace.stream(seed, w, W)` and the next target of
//! `TargetChooser::new(choice, targets, seed, w)` ([`crate::target`]), one
//! `next()` of each, whatever then happens to it (sent, refused for an
//! in-flight bound, abandoned at the end of the run). So the document and
//! target of request `k` depend on `k` alone, never on timing.
//!
//! A run with a duration `T` dispatches exactly the points with `t_k < T`;
//! a run with a request budget `N` dispatches `t_0 … t_{N−1}`.

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use tierstack_base::{seeded_rng, SeededRng};

/// Salt separating the arrival stream from the request and target streams.
pub const ARRIVAL_SEED_SALT: u64 = 0x6172_7269_7661_6c73; // "arrivals"

/// How the open loop spaces its requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arrivals {
    /// Evenly spaced, `1 / rate` apart.
    Constant,
    /// A Poisson process: exponential inter-arrival times, seeded.
    #[default]
    Poisson,
}

impl FromStr for Arrivals {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "constant" => Ok(Self::Constant),
            "poisson" => Ok(Self::Poisson),
            other => Err(format!("unknown arrivals {other:?} (constant or poisson)")),
        }
    }
}

/// The schedule points of an open-loop run, in nanoseconds after its start
/// (see the module documentation for the exact rule). Endless.
#[derive(Debug)]
pub struct ArrivalSchedule {
    arrivals: Arrivals,
    /// Mean gap in nanoseconds (`10⁹ / rate`).
    gap_ns: f64,
    /// Points produced so far.
    produced: u64,
    /// Poisson: the running sum of gaps, in nanoseconds.
    sum_ns: f64,
    rng: SeededRng,
}

impl ArrivalSchedule {
    /// The schedule of a run at `rate_per_s` requests per second (must be
    /// positive and finite; the load client and the simulator check it before
    /// building one) seeded by the run's `seed`.
    pub fn new(arrivals: Arrivals, rate_per_s: f64, seed: u64) -> Self {
        Self { arrivals, gap_ns: 1e9 / rate_per_s, produced: 0, sum_ns: 0.0, rng: seeded_rng(seed ^ ARRIVAL_SEED_SALT) }
    }
}

impl Iterator for ArrivalSchedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        self.produced += 1;
        let at_ns = match self.arrivals {
            // Multiplied, not accumulated: no drift over a long run.
            Arrivals::Constant => self.produced as f64 * self.gap_ns,
            Arrivals::Poisson => {
                let u: f64 = self.rng.gen();
                self.sum_ns += -(1.0 - u).ln() * self.gap_ns;
                self.sum_ns
            }
        };
        // `as` saturates, so an absurd horizon ends at u64::MAX, never wraps.
        Some(at_ns.round() as u64)
    }
}

/// The stream (and so the trace stream and target chooser) of scheduled
/// request `k` when the run has `streams` streams (zero is treated as one).
pub fn stream_of(k: u64, streams: usize) -> usize {
    (k % streams.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_points_are_evenly_spaced_from_the_first_gap() {
        let points: Vec<u64> = ArrivalSchedule::new(Arrivals::Constant, 4.0, 1).take(4).collect();
        assert_eq!(points, [250_000_000, 500_000_000, 750_000_000, 1_000_000_000]);
        // 3 per second: each point rounded on its own …
        let points: Vec<u64> = ArrivalSchedule::new(Arrivals::Constant, 3.0, 1).take(3).collect();
        assert_eq!(points, [333_333_333, 666_666_667, 1_000_000_000]);
        // … with no drift from accumulation.
        let third = ArrivalSchedule::new(Arrivals::Constant, 3.0, 1).nth(299).unwrap();
        assert_eq!(third, 100_000_000_000);
        // The seed does not matter to a constant schedule.
        let other_seed: Vec<u64> = ArrivalSchedule::new(Arrivals::Constant, 3.0, 99).take(3).collect();
        assert_eq!(other_seed, [333_333_333, 666_666_667, 1_000_000_000]);
    }

    #[test]
    fn poisson_points_are_seeded_increasing_and_have_the_right_rate() {
        let a: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, 1000.0, 5).take(20_000).collect();
        let again: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, 1000.0, 5).take(20_000).collect();
        let other: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, 1000.0, 6).take(20_000).collect();
        assert_eq!(a, again, "same seed, same schedule");
        assert_ne!(a, other, "another seed, another schedule");
        assert!(a.windows(2).all(|w| w[0] <= w[1]), "points never go back");
        // 20,000 exponential gaps of mean 1 ms: the sum is 20 s with a
        // standard deviation of 0.14 s; 5 sigma either side.
        let total_s = *a.last().unwrap() as f64 / 1e9;
        assert!((19.3..20.7).contains(&total_s), "{total_s}");
        // The gaps' coefficient of variation is 1 for an exponential (0 for constant).
        let gaps: Vec<f64> = std::iter::once(a[0]).chain(a.windows(2).map(|w| w[1] - w[0])).map(|g| g as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((0.95..1.05).contains(&(sd / mean)), "cv {}", sd / mean);
    }

    #[test]
    fn the_poisson_points_follow_the_documented_formula() {
        // The rule written out independently of the iterator's state.
        let (rate, seed) = (250.0, 17);
        let mut rng = seeded_rng(seed ^ ARRIVAL_SEED_SALT);
        let mut sum = 0.0f64;
        let expected: Vec<u64> = (0..1_000)
            .map(|_| {
                let u: f64 = rng.gen();
                sum += -(1.0 - u).ln() * (1e9 / rate);
                sum.round() as u64
            })
            .collect();
        let got: Vec<u64> = ArrivalSchedule::new(Arrivals::Poisson, rate, seed).take(1_000).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn requests_are_dealt_to_streams_in_turn() {
        let streams: Vec<usize> = (0..7).map(|k| stream_of(k, 3)).collect();
        assert_eq!(streams, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(stream_of(5, 0), 0, "zero streams is treated as one");
    }

    #[test]
    fn parses_the_command_line_names_and_serializes_them_alike() {
        assert_eq!("constant".parse(), Ok(Arrivals::Constant));
        assert_eq!("poisson".parse(), Ok(Arrivals::Poisson));
        assert!("bursty".parse::<Arrivals>().unwrap_err().contains("bursty"));
        assert_eq!(serde_json::to_string(&Arrivals::Constant).unwrap(), "\"constant\"");
        assert_eq!(serde_json::from_str::<Arrivals>("\"poisson\"").unwrap(), Arrivals::Poisson);
    }
}
