//! Which target (server node) each request goes to.
//!
//! One rule shared by the load client and the simulator, so a simulated run
//! sends every request of a seeded stream where the real one does.

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use tierstack_base::{seeded_rng, SeededRng};

/// How a worker (one client connection or simulated client) picks the target
/// of each request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetChoice {
    /// Worker `w` always uses target `w % n`.
    #[default]
    Fixed,
    /// Worker `w` starts at target `w % n` and moves to the next one after
    /// every request.
    RoundRobin,
    /// Each request picks a target uniformly at random (PRESS's clients:
    /// "in a randomized fashion with equal probabilities"), from a
    /// per-worker seeded generator.
    Random,
}

impl FromStr for TargetChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fixed" => Ok(Self::Fixed),
            "round-robin" => Ok(Self::RoundRobin),
            "random" => Ok(Self::Random),
            other => Err(format!("unknown target choice {other:?} (fixed, round-robin or random)")),
        }
    }
}

/// The sequence of target indices of one worker.
#[derive(Debug)]
pub struct TargetChooser {
    choice: TargetChoice,
    targets: usize,
    next: usize,
    rng: SeededRng,
}

impl TargetChooser {
    /// The chooser of worker `worker` over `targets` targets (at least one is
    /// assumed; zero is treated as one). `seed` is the run's seed.
    pub fn new(choice: TargetChoice, targets: usize, seed: u64, worker: usize) -> Self {
        let targets = targets.max(1);
        // A generator independent of the worker's request stream.
        let rng = seeded_rng(seed ^ 0x7A46_E7C4_0C5E_u64.wrapping_mul(worker as u64 + 1));
        Self { choice, targets, next: worker % targets, rng }
    }
}

impl Iterator for TargetChooser {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        Some(match self.choice {
            TargetChoice::Fixed => self.next,
            TargetChoice::RoundRobin => {
                let target = self.next;
                self.next = (self.next + 1) % self.targets;
                target
            }
            TargetChoice::Random => self.rng.gen_range(0..self.targets),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_round_robin_follow_the_worker_index() {
        let fixed: Vec<usize> = TargetChooser::new(TargetChoice::Fixed, 3, 1, 4).take(4).collect();
        assert_eq!(fixed, [1, 1, 1, 1]);
        let rr: Vec<usize> = TargetChooser::new(TargetChoice::RoundRobin, 3, 1, 4).take(5).collect();
        assert_eq!(rr, [1, 2, 0, 1, 2]);
    }

    #[test]
    fn random_is_seeded_per_worker_and_roughly_uniform() {
        let a: Vec<usize> = TargetChooser::new(TargetChoice::Random, 4, 7, 0).take(8000).collect();
        let again: Vec<usize> = TargetChooser::new(TargetChoice::Random, 4, 7, 0).take(8000).collect();
        let other: Vec<usize> = TargetChooser::new(TargetChoice::Random, 4, 7, 1).take(8000).collect();
        assert_eq!(a, again, "same seed and worker, same choices");
        assert_ne!(a, other, "workers choose independently");
        for target in 0..4 {
            let share = a.iter().filter(|&&t| t == target).count();
            assert!((1700..2300).contains(&share), "target {target} got {share} of 8000");
        }
    }

    #[test]
    fn parses_the_command_line_names() {
        assert_eq!("round-robin".parse(), Ok(TargetChoice::RoundRobin));
        assert!("everywhere".parse::<TargetChoice>().is_err());
    }
}
