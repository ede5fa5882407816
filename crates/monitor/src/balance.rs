//! The front end's load-balancing policy: a pure state machine (no I/O, no
//! clock: times are passed in).
//!
//! - [`Policy::Hash`]: FNV-1a of the request key, the load-oblivious baseline
//!   (the proxy's routing before this crate).
//! - [`Policy::RoundRobin`]: each back end in turn.
//! - [`Policy::LeastLoaded`]: the back end with the least *estimated* load,
//!   ties broken by a seeded RNG. The estimate corrects the value read for
//!   what this front end did since it was sampled:
//!   `estimate = value + (my in-flight now − my in-flight at the sample's time)`,
//!   so a stale value does not send every request to the same "least loaded"
//!   back end until the next sample (herding). [R] A refinement of
//!   seed-notes b.5 ("requests dispatched since"): completions count too.
//!   The estimate is never below this front end's own requests in flight
//!   there (as nginx's `least_conn` counts its own connections): a back end
//!   that stopped counting (a hung process: frozen counters read fresh by
//!   RDMA-Sync, whose sample time is the read's, so the correction above
//!   resets on every read) still fills up with what it was sent.
//!
//! Every policy skips back ends whose process is gone ([`Health::Dead`]),
//! and prefers any other to one that is [`Health::Suspect`] (alive but
//! making no progress: stopped or wedged), falling back to a suspect only
//! when nothing else is left. [`Failures`] is the passive half: nginx's
//! `max_fails`/`fail_timeout`, a back end that failed `max_fails` requests
//! within `fail_timeout` is paused for `fail_timeout`.
//! **Admission control** (optional): a request is refused when the chosen
//! back end's estimate is at or above `admit_max` (for least-loaded: when
//! every back end is), and the refusal is counted by the caller (503).

use crate::scheme::{Health, Reading};
use rand::Rng;
use serde::Serialize;
use std::collections::VecDeque;
use std::time::Duration;
use tierstack_base::{seeded_rng, SeededRng};

/// How requests are spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    Hash,
    RoundRobin,
    LeastLoaded,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Hash => "hash",
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoaded => "least-loaded",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hash" => Ok(Policy::Hash),
            "round-robin" => Ok(Policy::RoundRobin),
            "least-loaded" => Ok(Policy::LeastLoaded),
            other => Err(format!("unknown balancing policy {other:?} (expected hash, round-robin or least-loaded)")),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct BalancerConfig {
    pub policy: Policy,
    /// Refuse a request whose back end's estimate is at least this.
    pub admit_max: Option<u32>,
    /// Correct values for this front end's own dispatches since the sample
    /// (off only to show herding).
    pub correct: bool,
    /// Seed of the tie-breaking RNG.
    pub seed: u64,
}

impl BalancerConfig {
    pub fn new(policy: Policy) -> Self {
        BalancerConfig { policy, admit_max: None, correct: true, seed: 0x6d6f_6e69 }
    }
}

/// What to do with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send it to back end `index` (then call [`Balancer::dispatched`]).
    Route(usize),
    /// Admission control: every candidate is at or above `admit_max`.
    Overloaded,
    /// Every back end is dead (or serves another site).
    NoBackend,
}

/// Longest history of in-flight changes kept per back end.
const HISTORY_MAX: usize = 1 << 16;

#[derive(Debug, Default)]
struct Backend {
    /// The last value read and when it was sampled.
    value: Option<(u32, u64)>,
    dead: bool,
    /// Alive but making no progress (its last reading was suspect).
    suspect: bool,
    /// Serves another site now (reconfiguration): never chosen.
    elsewhere: bool,
    /// This front end's requests in flight to it now.
    in_flight: u32,
    /// In-flight count just after each change since the sample, by time.
    history: VecDeque<(u64, u32)>,
    /// In-flight count before the first change kept in `history`.
    base: u32,
}

impl Backend {
    fn eligible(&self) -> bool {
        !self.dead && !self.elsewhere
    }

    fn note(&mut self, now_ns: u64) {
        if self.history.len() == HISTORY_MAX {
            if let Some((_, after)) = self.history.pop_front() {
                self.base = after;
            }
        }
        self.history.push_back((now_ns, self.in_flight));
    }

    /// Forgets changes at or before `t_ns`: `base` becomes the count then.
    fn collapse_to(&mut self, t_ns: u64) {
        while let Some(&(t, after)) = self.history.front() {
            if t > t_ns {
                break;
            }
            self.base = after;
            self.history.pop_front();
        }
    }

    fn estimate(&self, correct: bool) -> u32 {
        match self.value {
            Some((value, _)) if correct => {
                let delta = i64::from(self.in_flight) - i64::from(self.base);
                let corrected = u32::try_from((i64::from(value) + delta).max(0)).unwrap_or(u32::MAX);
                // Its load includes at least what this front end has there now.
                corrected.max(self.in_flight)
            }
            Some((value, _)) => value,
            // Nothing read yet: only what this front end knows it sent.
            None => self.in_flight,
        }
    }
}

/// FNV-1a, 64 bits (stable across runs, so a key keeps its back end).
pub fn fnv1a(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The balancing state of one front end over a fixed list of back ends.
pub struct Balancer {
    config: BalancerConfig,
    backends: Vec<Backend>,
    next: usize,
    rng: SeededRng,
}

impl Balancer {
    pub fn new(backends: usize, config: BalancerConfig) -> Self {
        Balancer {
            config,
            backends: (0..backends).map(|_| Backend::default()).collect(),
            next: 0,
            rng: seeded_rng(config.seed),
        }
    }

    pub fn config(&self) -> &BalancerConfig {
        &self.config
    }

    pub fn len(&self) -> usize {
        self.backends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Takes a reading of back end `index` into account.
    pub fn observe(&mut self, index: usize, reading: &Reading) {
        let Some(backend) = self.backends.get_mut(index) else { return };
        backend.dead = reading.health == Health::Dead;
        backend.suspect = reading.health == Health::Suspect;
        if matches!(reading.health, Health::Fresh | Health::Stale | Health::Suspect) {
            let sampled = reading.record.t_ns;
            // A value older than the one held (reordered readings) is ignored.
            if backend.value.is_none_or(|(_, held)| sampled >= held) {
                backend.value = Some((reading.record.counters.load(), sampled));
                backend.collapse_to(sampled);
            }
        }
    }

    /// Whether back end `index` belongs to this front end's site now
    /// (reconfiguration moves nodes between sites); one that does not is
    /// never chosen. Every back end does until told otherwise.
    pub fn set_member(&mut self, index: usize, member: bool) {
        if let Some(backend) = self.backends.get_mut(index) {
            backend.elsewhere = !member;
        }
    }

    /// The estimated load of back end `index`.
    pub fn estimate(&self, index: usize) -> Option<u32> {
        self.backends.get(index).map(|b| b.estimate(self.config.correct))
    }

    /// Whether back end `index` is known dead.
    pub fn is_dead(&self, index: usize) -> bool {
        self.backends.get(index).is_some_and(|b| b.dead)
    }

    /// Whether back end `index`'s last reading was suspect (alive, no progress).
    pub fn is_suspect(&self, index: usize) -> bool {
        self.backends.get(index).is_some_and(|b| b.suspect)
    }

    /// Picks the back end for a request with `key` (hash policy's input).
    pub fn choose(&mut self, key: &str) -> Decision {
        self.choose_except(key, &[])
    }

    /// Picks the back end for a request with `key`, never one of `except`
    /// (back ends this request already failed on, or paused ones).
    pub fn choose_except(&mut self, key: &str, except: &[usize]) -> Decision {
        let n = self.backends.len();
        let candidate = |i: usize, b: &Backend| b.eligible() && !except.contains(&i);
        if !self.backends.iter().enumerate().any(|(i, b)| candidate(i, b)) {
            return Decision::NoBackend;
        }
        // Suspects only when nothing else is left.
        let avoid_suspects = self.backends.iter().enumerate().any(|(i, b)| candidate(i, b) && !b.suspect);
        let usable = |i: usize, b: &Backend| candidate(i, b) && !(avoid_suspects && b.suspect);
        let chosen = match self.config.policy {
            Policy::Hash => {
                let start = (fnv1a(key) % n as u64) as usize;
                (0..n).map(|i| (start + i) % n).find(|i| usable(*i, &self.backends[*i]))
            }
            Policy::RoundRobin => {
                let found = (0..n).map(|i| (self.next + i) % n).find(|i| usable(*i, &self.backends[*i]));
                if let Some(i) = found {
                    self.next = (i + 1) % n;
                }
                found
            }
            Policy::LeastLoaded => {
                let correct = self.config.correct;
                let live = || self.backends.iter().enumerate().filter(|(i, b)| usable(*i, b));
                let least = live().map(|(_, b)| b.estimate(correct)).min();
                let tied: Vec<usize> =
                    live().filter(|(_, b)| Some(b.estimate(correct)) == least).map(|(i, _)| i).collect();
                match tied.len() {
                    0 => None,
                    1 => Some(tied[0]),
                    k => Some(tied[self.rng.gen_range(0..k)]),
                }
            }
        };
        let Some(index) = chosen else { return Decision::NoBackend };
        match self.config.admit_max {
            Some(max) if self.backends[index].estimate(self.config.correct) >= max => Decision::Overloaded,
            _ => Decision::Route(index),
        }
    }

    /// A request was sent to `index` at `now_ns`.
    pub fn dispatched(&mut self, index: usize, now_ns: u64) {
        if let Some(backend) = self.backends.get_mut(index) {
            backend.in_flight = backend.in_flight.saturating_add(1);
            backend.note(now_ns);
        }
    }

    /// A request sent to `index` ended at `now_ns` (answered or failed).
    pub fn completed(&mut self, index: usize, now_ns: u64) {
        if let Some(backend) = self.backends.get_mut(index) {
            backend.in_flight = backend.in_flight.saturating_sub(1);
            backend.note(now_ns);
        }
    }

    /// This front end's requests in flight to `index`.
    pub fn in_flight(&self, index: usize) -> u32 {
        self.backends.get(index).map_or(0, |b| b.in_flight)
    }
}

/// nginx's `max_fails` and `fail_timeout`, per back end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureConfig {
    /// Failures within `fail_timeout` that pause a back end; 0: never paused.
    pub max_fails: u32,
    /// The window failures are counted in, and how long a pause lasts.
    pub fail_timeout: Duration,
}

impl Default for FailureConfig {
    /// nginx's defaults: one failure pauses a server for 10 s.
    fn default() -> Self {
        FailureConfig { max_fails: 1, fail_timeout: Duration::from_secs(10) }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct FailureWindow {
    fails: u32,
    window_start_ns: u64,
    paused_until_ns: u64,
}

/// The passive health check: failed requests pause a back end (pure: times
/// are passed in). A failure is what the caller counts as one (a refused
/// connection, no response in time, a broken response); a success clears
/// the count.
#[derive(Clone, Debug)]
pub struct Failures {
    config: FailureConfig,
    windows: Vec<FailureWindow>,
}

impl Failures {
    pub fn new(backends: usize, config: FailureConfig) -> Self {
        Failures { config, windows: vec![FailureWindow::default(); backends] }
    }

    fn timeout_ns(&self) -> u64 {
        u64::try_from(self.config.fail_timeout.as_nanos()).unwrap_or(u64::MAX)
    }

    /// A request to `index` failed at `now_ns`; true if that paused it.
    pub fn failed(&mut self, index: usize, now_ns: u64) -> bool {
        let (max_fails, timeout) = (self.config.max_fails, self.timeout_ns());
        let Some(window) = self.windows.get_mut(index) else { return false };
        if max_fails == 0 {
            return false;
        }
        if window.fails == 0 || now_ns.saturating_sub(window.window_start_ns) > timeout {
            *window = FailureWindow { fails: 0, window_start_ns: now_ns, paused_until_ns: window.paused_until_ns };
        }
        window.fails += 1;
        if window.fails >= max_fails {
            *window =
                FailureWindow { fails: 0, window_start_ns: now_ns, paused_until_ns: now_ns.saturating_add(timeout) };
            return true;
        }
        false
    }

    /// A request to `index` succeeded: its failures are forgotten.
    pub fn succeeded(&mut self, index: usize) {
        if let Some(window) = self.windows.get_mut(index) {
            window.fails = 0;
        }
    }

    /// Whether `index` is paused at `now_ns`.
    pub fn paused(&self, index: usize, now_ns: u64) -> bool {
        self.windows.get(index).is_some_and(|w| now_ns < w.paused_until_ns)
    }

    /// The back ends paused at `now_ns`.
    pub fn paused_set(&self, now_ns: u64) -> Vec<usize> {
        (0..self.windows.len()).filter(|i| self.paused(*i, now_ns)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Counters, LoadRecord};
    use proptest::prelude::*;

    fn reading(load: u16, t_ns: u64, health: Health) -> Reading {
        let counters = Counters { running_threads: load, ..Counters::default() };
        Reading { record: LoadRecord { t_ns, counters, ..LoadRecord::default() }, read_ns: t_ns, health }
    }

    fn route(decision: Decision) -> usize {
        match decision {
            Decision::Route(i) => i,
            other => panic!("expected a route, got {other:?}"),
        }
    }

    #[test]
    fn correction_stops_herding_on_a_stale_value() {
        for (correct, expect_all_to_one) in [(true, false), (false, true)] {
            let mut b = Balancer::new(3, BalancerConfig { correct, ..BalancerConfig::new(Policy::LeastLoaded) });
            for (i, load) in [5, 0, 5].into_iter().enumerate() {
                b.observe(i, &reading(load, 100, Health::Fresh));
            }
            let mut counts = [0u32; 3];
            for t in 0..16 {
                let i = route(b.choose("x"));
                counts[i] += 1;
                b.dispatched(i, 200 + t);
            }
            if expect_all_to_one {
                assert_eq!(counts, [0, 16, 0], "without correction every request herds to the stale minimum");
            } else {
                // 5 to fill the gap, then 11 spread over three equal back ends.
                assert!(counts[1] >= 5 + 3 && counts.iter().all(|c| *c >= 3), "{counts:?}");
                let estimates: Vec<u32> = (0..3).map(|i| b.estimate(i).unwrap()).collect();
                let spread = estimates.iter().max().unwrap() - estimates.iter().min().unwrap();
                assert!(spread <= 1, "{estimates:?}");
            }
        }
    }

    #[test]
    fn a_new_sample_absorbs_the_dispatches_it_already_counts() {
        let mut b = Balancer::new(1, BalancerConfig::new(Policy::LeastLoaded));
        b.observe(0, &reading(2, 10, Health::Fresh));
        b.dispatched(0, 20);
        b.dispatched(0, 30);
        assert_eq!(b.estimate(0), Some(4));
        // Sampled at 25: it counts the dispatch at 20 but not the one at 30.
        b.observe(0, &reading(3, 25, Health::Fresh));
        assert_eq!(b.estimate(0), Some(4));
        b.completed(0, 40);
        assert_eq!(b.estimate(0), Some(3));
        // An older reading arriving late changes nothing.
        b.observe(0, &reading(50, 5, Health::Stale));
        assert_eq!(b.estimate(0), Some(3));
    }

    #[test]
    fn admission_refuses_only_when_the_chosen_back_end_is_full() {
        let mut b = Balancer::new(2, BalancerConfig { admit_max: Some(4), ..BalancerConfig::new(Policy::LeastLoaded) });
        b.observe(0, &reading(4, 1, Health::Fresh));
        b.observe(1, &reading(3, 1, Health::Fresh));
        assert_eq!(b.choose("a"), Decision::Route(1));
        b.dispatched(1, 2);
        assert_eq!(b.choose("a"), Decision::Overloaded);
        b.completed(1, 3);
        assert_eq!(b.choose("a"), Decision::Route(1));
    }

    #[test]
    fn dead_back_ends_are_skipped_and_all_dead_is_no_backend() {
        for policy in [Policy::Hash, Policy::RoundRobin, Policy::LeastLoaded] {
            let mut b = Balancer::new(3, BalancerConfig::new(policy));
            b.observe(0, &reading(0, 1, Health::Dead));
            b.observe(2, &reading(0, 1, Health::Dead));
            for key in ["a", "b", "c", "d"] {
                assert_eq!(b.choose(key), Decision::Route(1), "{policy:?}");
            }
            b.observe(1, &reading(0, 1, Health::Dead));
            assert_eq!(b.choose("a"), Decision::NoBackend, "{policy:?}");
            b.observe(1, &reading(0, 2, Health::Fresh));
            assert_eq!(b.choose("a"), Decision::Route(1), "a node that comes back is used again");
        }
    }

    #[test]
    fn back_ends_of_another_site_are_never_chosen() {
        for policy in [Policy::Hash, Policy::RoundRobin, Policy::LeastLoaded] {
            let mut b = Balancer::new(3, BalancerConfig::new(policy));
            b.observe(2, &reading(0, 1, Health::Fresh));
            b.observe(0, &reading(9, 1, Health::Fresh));
            b.observe(1, &reading(9, 1, Health::Fresh));
            b.set_member(2, false);
            for key in ["a", "b", "c", "d", "e", "f"] {
                assert!(matches!(b.choose(key), Decision::Route(0 | 1)), "{policy:?}");
            }
            b.set_member(0, false);
            b.set_member(1, false);
            assert_eq!(b.choose("a"), Decision::NoBackend, "{policy:?}");
            b.set_member(2, true);
            assert_eq!(b.choose("a"), Decision::Route(2), "{policy:?}: a node that joins is used");
        }
    }

    #[test]
    fn hash_matches_the_proxys_fnv1a_routing() {
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
        let mut b = Balancer::new(5, BalancerConfig::new(Policy::Hash));
        for key in ["/doc/a", "/doc/b", "/doc/zz"] {
            assert_eq!(b.choose(key), Decision::Route((fnv1a(key) % 5) as usize));
        }
    }

    /// The hung-node black hole: a stopped back end's counters read as 0
    /// by RDMA-Sync (stamped with the read's time, so the correction for
    /// this front end's dispatches resets on every read). Its estimate must
    /// still grow with what was sent there and not answered.
    #[test]
    fn a_back_end_with_frozen_counters_fills_up_with_our_own_requests() {
        let mut b = Balancer::new(2, BalancerConfig::new(Policy::LeastLoaded));
        let mut counts = [0u32; 2];
        for t in 1..=40u64 {
            // Back end 0 is hung: reads 0 forever. Back end 1 reads what
            // this front end has in flight there (it answers at once).
            b.observe(0, &reading(0, t * 10, Health::Fresh));
            b.observe(1, &reading(b.in_flight(1) as u16, t * 10, Health::Fresh));
            let i = route(b.choose("k"));
            counts[i] += 1;
            b.dispatched(i, t * 10 + 1);
            if i == 1 {
                b.completed(1, t * 10 + 2);
            }
        }
        assert_eq!(b.estimate(0), Some(b.in_flight(0)), "the floor is our own requests in flight");
        assert!(counts[0] <= 2, "the hung back end got {counts:?}");
    }

    #[test]
    fn suspect_back_ends_are_chosen_only_when_nothing_else_is_left() {
        for policy in [Policy::Hash, Policy::RoundRobin, Policy::LeastLoaded] {
            let mut b = Balancer::new(3, BalancerConfig::new(policy));
            b.observe(0, &reading(0, 1, Health::Suspect));
            b.observe(1, &reading(9, 1, Health::Fresh));
            b.observe(2, &reading(9, 1, Health::Fresh));
            assert!(b.is_suspect(0));
            for key in ["a", "b", "c", "d", "e", "f", "g"] {
                assert!(matches!(b.choose(key), Decision::Route(1 | 2)), "{policy:?}: least loaded but suspect");
            }
            assert!(matches!(b.choose_except("a", &[1, 2]), Decision::Route(0)), "{policy:?}: the only one left");
            b.observe(0, &reading(0, 2, Health::Fresh));
            assert!(!b.is_suspect(0), "{policy:?}: a suspect that makes progress again is trusted again");
        }
    }

    #[test]
    fn except_removes_candidates_and_nothing_left_is_no_backend() {
        for policy in [Policy::Hash, Policy::RoundRobin, Policy::LeastLoaded] {
            let mut b = Balancer::new(3, BalancerConfig::new(policy));
            for key in ["a", "b", "c", "d"] {
                assert!(matches!(b.choose_except(key, &[0, 2]), Decision::Route(1)), "{policy:?}");
            }
            assert_eq!(b.choose_except("a", &[0, 1, 2]), Decision::NoBackend, "{policy:?}");
        }
    }

    #[test]
    fn max_fails_within_the_window_pause_a_back_end_for_fail_timeout() {
        let second = 1_000_000_000u64;
        let config = FailureConfig { max_fails: 2, fail_timeout: Duration::from_secs(10) };
        let mut f = Failures::new(2, config);
        assert!(!f.failed(0, second));
        assert!(!f.paused(0, second), "one failure of two");
        // The window passed: the count starts again.
        assert!(!f.failed(0, 12 * second));
        assert!(f.failed(0, 13 * second), "two within ten seconds");
        assert!(f.paused(0, 13 * second) && f.paused(0, 22 * second));
        assert!(!f.paused(0, 23 * second), "the pause lasts fail_timeout");
        assert_eq!(f.paused_set(14 * second), vec![0]);
        assert_eq!(f.paused_set(23 * second), Vec::<usize>::new());
        // A second failure exactly fail_timeout after the first is still
        // within its window.
        assert!(!f.failed(1, 30 * second));
        assert!(f.failed(1, 40 * second), "the window includes its last instant");
        assert_eq!(f.paused_set(41 * second), vec![1]);
        // A success forgets a failure.
        assert!(!f.failed(1, second));
        f.succeeded(1);
        assert!(!f.failed(1, 2 * second), "the count was reset");
        // max_fails 0: never paused; out of range: ignored.
        let mut never = Failures::new(1, FailureConfig { max_fails: 0, ..config });
        assert!((0..10).all(|t| !never.failed(0, t)) && !never.paused(0, 5));
        assert!(!f.failed(7, 1) && !f.paused(7, 1));
    }

    proptest! {
        #[test]
        fn round_robin_serves_every_live_back_end_equally(n in 1usize..8, dead_mask in 0u32..256, rounds in 1usize..10) {
            let mut b = Balancer::new(n, BalancerConfig::new(Policy::RoundRobin));
            let dead: Vec<bool> = (0..n).map(|i| dead_mask & (1 << i) != 0).collect();
            for (i, d) in dead.iter().enumerate() {
                b.observe(i, &reading(0, 1, if *d { Health::Dead } else { Health::Fresh }));
            }
            let live = dead.iter().filter(|d| !**d).count();
            let mut counts = vec![0usize; n];
            for _ in 0..rounds * live {
                match b.choose("k") {
                    Decision::Route(i) => counts[i] += 1,
                    other => prop_assert_eq!(live, 0, "{:?}", other),
                }
            }
            for i in 0..n {
                prop_assert_eq!(counts[i], if dead[i] { 0 } else { rounds });
            }
        }

        /// A back end loaded only by this front end, sampled at random past
        /// moments: the corrected estimate is always its true load now.
        #[test]
        fn the_estimate_is_exact_when_the_load_is_ours(ops in proptest::collection::vec((0u8..3, 0u64..4), 1..200)) {
            let mut b = Balancer::new(1, BalancerConfig::new(Policy::LeastLoaded));
            let mut log: Vec<(u64, u32)> = vec![(0, 0)];
            let (mut now, mut in_flight, mut last_sample) = (1u64, 0u32, 0u64);
            for (op, back) in ops {
                now += 10;
                match op {
                    0 => { in_flight += 1; b.dispatched(0, now); log.push((now, in_flight)); }
                    1 if in_flight > 0 => { in_flight -= 1; b.completed(0, now); log.push((now, in_flight)); }
                    _ => {
                        // A sample taken at a past instant, between two changes.
                        let t = now.saturating_sub(back * 10 + 5).max(last_sample);
                        let value = log.iter().rev().find(|(when, _)| *when <= t).map_or(0, |(_, v)| *v);
                        b.observe(0, &reading(value as u16, t, Health::Fresh));
                        last_sample = t;
                    }
                }
                if last_sample > 0 {
                    prop_assert_eq!(b.estimate(0), Some(in_flight));
                }
            }
        }
    }
}
