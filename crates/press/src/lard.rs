//! The dispatcher hand-off server's choice of back-end: LARD (Pai et al.,
//! ASPLOS'98, "basic LARD"), the locality-aware front end the PRESS paper
//! compares against, as a pure state machine.
//!
//! ```text
//! if server[target] = ∅ then server[target] <- least loaded node
//! else if (load(server[target]) > T_high and some node has load < T_low)
//!         or load(server[target]) >= 2 T_high
//!      then server[target] <- least loaded node
//! send target to server[target]
//! ```
//!
//! A node's load is the number of connections handed to it and not yet
//! reported finished ([`Lard::assign`] adds one, [`Lard::finished`] takes
//! it back). Ties between least loaded nodes go by a hash of the target
//! (deterministic: `DefaultHasher::new()` has fixed keys), so an idle
//! cluster still spreads new targets instead of giving them all to node 0.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// LARD's thresholds, in open connections (the LARD paper's T_low = 25,
/// T_high = 65).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LardConfig {
    pub t_low: u32,
    pub t_high: u32,
}

impl Default for LardConfig {
    fn default() -> Self {
        LardConfig { t_low: 25, t_high: 65 }
    }
}

/// Why a dispatcher could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LardError {
    #[error("a dispatcher needs at least one back-end")]
    NoBackends,
    #[error("LARD needs t_low < t_high (got {t_low} and {t_high})")]
    Thresholds { t_low: u32, t_high: u32 },
}

/// The dispatcher's state: each target's server and each node's load.
#[derive(Clone, Debug)]
pub struct Lard<K> {
    config: LardConfig,
    loads: Vec<u32>,
    server: HashMap<K, usize>,
    reassignments: u64,
}

impl<K: Hash + Eq + Clone> Lard<K> {
    pub fn new(config: LardConfig, backends: usize) -> Result<Self, LardError> {
        if backends == 0 {
            return Err(LardError::NoBackends);
        }
        if config.t_low >= config.t_high {
            return Err(LardError::Thresholds { t_low: config.t_low, t_high: config.t_high });
        }
        Ok(Lard { config, loads: vec![0; backends], server: HashMap::new(), reassignments: 0 })
    }

    fn least_loaded(&self, target: &K) -> usize {
        // `loads` is never empty (checked in `new`).
        let min = self.loads.iter().copied().min().unwrap_or(0);
        let tied: Vec<usize> = (0..self.loads.len()).filter(|&i| self.loads[i] == min).collect();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        target.hash(&mut hasher);
        tied[(hasher.finish() % tied.len() as u64) as usize]
    }

    /// Chooses the back-end for a request of `target` and counts the
    /// connection against it.
    pub fn assign(&mut self, target: &K) -> usize {
        let least = self.least_loaded(target);
        let chosen = match self.server.get(target).copied() {
            None => least,
            Some(s) => {
                let load = self.loads[s];
                let idle_exists = self.loads.iter().any(|&l| l < self.config.t_low);
                if (load > self.config.t_high && idle_exists) || load >= 2 * self.config.t_high {
                    if least != s {
                        self.reassignments += 1;
                    }
                    least
                } else {
                    s
                }
            }
        };
        self.server.insert(target.clone(), chosen);
        self.loads[chosen] += 1;
        chosen
    }

    /// A connection handed to `backend` ended. Unknown indexes and loads
    /// already at zero are ignored (a late or repeated report).
    pub fn finished(&mut self, backend: usize) {
        if let Some(load) = self.loads.get_mut(backend) {
            *load = load.saturating_sub(1);
        }
    }

    /// A back-end that cannot take connections: its targets are forgotten
    /// (the next request of each goes to the least loaded node).
    pub fn forget_backend(&mut self, backend: usize) {
        self.server.retain(|_, s| *s != backend);
        if let Some(load) = self.loads.get_mut(backend) {
            // Kept high so it is not chosen as least loaded again at once.
            *load = u32::MAX / 4;
        }
    }

    pub fn loads(&self) -> &[u32] {
        &self.loads
    }

    /// Targets moved from one server to another by the load rule.
    pub fn reassignments(&self) -> u64 {
        self.reassignments
    }

    pub fn server_of(&self, target: &K) -> Option<usize> {
        self.server.get(target).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lard(n: usize) -> Lard<&'static str> {
        Lard::new(LardConfig { t_low: 2, t_high: 4 }, n).unwrap()
    }

    #[test]
    fn a_new_target_goes_to_the_least_loaded_node() {
        let mut l = lard(3);
        let mut used: Vec<usize> = ["a", "b", "c"].iter().map(|t| l.assign(t)).collect();
        used.sort_unstable();
        assert_eq!(used, [0, 1, 2], "each new target to a node with no load");
        l.finished(1);
        assert_eq!(l.assign(&"d"), 1);
    }

    #[test]
    fn ties_spread_new_targets_over_an_idle_cluster() {
        let mut l: Lard<String> = Lard::new(LardConfig { t_low: 2, t_high: 4 }, 3).unwrap();
        let mut per_node = [0; 3];
        for t in 0..300u32 {
            let n = l.assign(&format!("f{t}"));
            per_node[n] += 1;
            l.finished(n);
        }
        assert!(per_node.iter().all(|&c| c > 50), "{per_node:?}");
    }

    #[test]
    fn a_target_stays_on_its_server_while_it_is_not_overloaded() {
        let mut l = lard(2);
        let s = l.assign(&"a");
        for _ in 0..3 {
            assert_eq!(l.assign(&"a"), s);
        }
        assert_eq!(l.loads()[s], 4);
        assert_eq!(l.reassignments(), 0);
    }

    #[test]
    fn an_overloaded_server_loses_its_target_to_an_idle_node() {
        let mut l = lard(2);
        let s = l.assign(&"a");
        for _ in 0..4 {
            assert_eq!(l.assign(&"a"), s);
        }
        // load 5 > T_high 4 and the other node (load 0) < T_low: moved.
        assert_eq!(l.assign(&"a"), 1 - s);
        assert_eq!(l.server_of(&"a"), Some(1 - s));
        assert_eq!(l.reassignments(), 1);
    }

    #[test]
    fn without_an_idle_node_a_target_moves_only_at_twice_t_high() {
        let mut l = lard(2);
        let b = l.assign(&"b");
        for _ in 0..2 {
            assert_eq!(l.assign(&"b"), b);
        }
        let c = l.assign(&"c");
        assert_eq!(c, 1 - b, "the least loaded");
        for _ in 0..2 {
            assert_eq!(l.assign(&"c"), c);
        }
        // Loads 3 and 3: nobody below T_low 2. "b" stays on its node past
        // T_high until its load reaches 2 T_high = 8.
        for expected_load in 4..=8 {
            assert_eq!(l.assign(&"b"), b);
            assert_eq!(l.loads()[b], expected_load);
        }
        assert_eq!(l.assign(&"b"), c, "8 >= 2 T_high: moved to the least loaded");
    }

    #[test]
    fn finishing_releases_load_and_never_underflows() {
        let mut l = lard(2);
        let s = l.assign(&"a");
        l.finished(s);
        l.finished(s);
        l.finished(9);
        assert_eq!(l.loads(), &[0, 0]);
    }

    #[test]
    fn a_forgotten_backend_gets_no_new_targets() {
        let mut l = lard(2);
        let first = l.assign(&"a");
        l.forget_backend(first);
        let other = 1 - first;
        assert_eq!(l.assign(&"a"), other);
        assert_eq!(l.assign(&"z"), other);
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(Lard::<u8>::new(LardConfig::default(), 0).unwrap_err(), LardError::NoBackends);
        assert!(matches!(Lard::<u8>::new(LardConfig { t_low: 5, t_high: 5 }, 2), Err(LardError::Thresholds { .. })));
    }
}
