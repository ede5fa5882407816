//! `tierstack bench press --cpu --bisect-t GOAL`: Fig. 1's threshold T
//! found by bisection (seed-notes c.7 #2), per version and trace, on the
//! largest node count, instead of a list of T (`--thresholds`).
//!
//! - `balancing`: the largest T at which the load-balancing half of Fig. 1
//!   (lines 14-22 taken: the initial node or the idlest one takes the file
//!   over, or every node is overloaded) decides at least
//!   [`BALANCING_MATTERS_PCT`] of the client requests: below it those
//!   branches matter, above it PRESS only forwards to the holder.
//! - `fwd:PCT`: the largest T whose forwarded share is at most PCT + 2
//!   points (the notes' "tune T per server until Fwd is within ±2 points
//!   across servers"; run every version with one PCT).
//!
//! Both predicates hold at small T and fail at large T (a smaller T
//! overloads nodes sooner, so more requests are taken over where they
//! arrive and fewer forwarded), so one bisection serves both. Every probe
//! is a measured run; all of them are printed (T, Fwd, every branch's
//! share, CPU per request), so Fig. 1's branch shares per T come with it.

use super::{load_average, run_at, PressBenchConfig, PressRun};
use crate::html::Page;
use crate::report::{write_json, Table};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use tierstack_press_node::transport::BRANCHES;

/// The share of client requests the load-balancing branches must decide
/// for them to "matter".
pub(super) const BALANCING_MATTERS_PCT: f64 = 1.0;

/// The range T is searched in: 1 (every node overloaded at once) to the
/// paper's 256.
const T_LOW: u32 = 1;
const T_HIGH: u32 = tierstack_press::THRESHOLD_DEFAULT;

/// Indices of [`BRANCHES`] in Fig. 1's load-balancing half.
const BALANCING: [usize; 3] = [4, 5, 6];

/// What T is bisected for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BisectGoal {
    Balancing,
    Fwd(f64),
}

impl std::str::FromStr for BisectGoal {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "balancing" {
            return Ok(BisectGoal::Balancing);
        }
        let pct = s.strip_prefix("fwd:").ok_or_else(|| format!("{s:?}: expected `balancing` or `fwd:PCT`"))?;
        match pct.parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => Ok(BisectGoal::Fwd(p)),
            _ => Err(format!("{s:?}: PCT must be a number from 0 to 100")),
        }
    }
}

impl BisectGoal {
    /// Whether a run at some T satisfies the goal (true at small T).
    fn holds(self, run: &PressRun) -> bool {
        match self {
            BisectGoal::Balancing => balancing_pct(run) >= BALANCING_MATTERS_PCT,
            BisectGoal::Fwd(target) => run.forwarded_pct <= target + 2.0,
        }
    }

    fn describe(self) -> String {
        match self {
            BisectGoal::Balancing => {
                format!("the largest T at which lines 14-22 decide ≥ {BALANCING_MATTERS_PCT} % of requests")
            }
            BisectGoal::Fwd(target) => format!("the largest T with Fwd ≤ {target} + 2 %"),
        }
    }
}

/// The share of client requests decided by the load-balancing branches.
fn balancing_pct(run: &PressRun) -> f64 {
    let decided: u64 = run.branches.iter().sum();
    if decided == 0 {
        return 0.0;
    }
    100.0 * BALANCING.iter().map(|&i| run.branches[i]).sum::<u64>() as f64 / decided as f64
}

/// What a bisection found: the largest T in `[low, high]` at which the
/// predicate holds, or that it holds nowhere or everywhere there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Boundary {
    /// Holds at T and not at T + 1.
    At(u32),
    /// Holds even at the top of the range.
    Everywhere,
    /// Fails even at the bottom of the range.
    Nowhere,
}

/// Bisection for the largest T in `[low, high]` at which `holds` is true,
/// assuming it is true below some T and false above (probes: the two ends,
/// then about log2(high - low) more). Errors from a probe end the search.
pub(super) fn bisect(low: u32, high: u32, mut holds: impl FnMut(u32) -> Result<bool>) -> Result<Boundary> {
    if low > high {
        bail!("an empty range of T: {low}..={high}");
    }
    if holds(high)? {
        return Ok(Boundary::Everywhere);
    }
    if !holds(low)? {
        return Ok(Boundary::Nowhere);
    }
    // Invariant: holds(low) && !holds(high).
    let (mut low, mut high) = (low, high);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if holds(mid)? {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(Boundary::At(low))
}

/// Bisects T for every version and trace; prints the boundaries and every
/// probe's branch shares, and writes `bisect.json`.
pub(super) fn run(config: &PressBenchConfig, goal: BisectGoal) -> Result<Vec<PressRun>> {
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    let nodes = config.nodes.iter().copied().max().unwrap_or(2).max(2);
    let versions = super::cpu::versions(config);
    let mut runs: Vec<PressRun> = Vec::new();
    let mut found: Vec<(String, &str, Boundary)> = Vec::new();
    for trace in &config.traces {
        for &system in &versions {
            let mut probes: BTreeMap<u32, PressRun> = BTreeMap::new();
            let boundary = bisect(T_LOW, T_HIGH, |t| {
                eprintln!(
                    "bench press --bisect-t: {trace} {system} T={t} on {nodes} nodes (load average {:.2})",
                    load_average()
                );
                let run = run_at(config, trace, system, nodes, 0, t)?;
                let holds = goal.holds(&run);
                probes.insert(t, run);
                Ok(holds)
            })?;
            found.push((trace.clone(), system, boundary));
            runs.extend(probes.into_values());
        }
    }
    write_json(&config.out.join("bisect.json"), &runs)?;
    let mut page = Page::new("tierstack bench press --bisect-t: Fig. 1's T by bisection");
    page.paragraph(&format!(
        "{nodes} nodes, traces at scale {}, {} connections over {} client process(es), {} s measured per probe; \
         goal: {}; T searched in {T_LOW}..={T_HIGH}.",
        config.scale,
        config.connections,
        config.clients,
        config.duration_s,
        goal.describe()
    ));
    let mut boundaries = Table::new(
        &format!("T found per version ({})", goal.describe()),
        &["trace", "version", "T", "Fwd % at T", "balancing % at T", "probes"],
    );
    for (trace, system, boundary) in &found {
        let at = |t: u32| runs.iter().find(|r| &r.trace == trace && r.system == *system && r.threshold == t);
        let (t, run) = match boundary {
            Boundary::At(t) => (t.to_string(), at(*t)),
            Boundary::Everywhere => (format!("≥ {T_HIGH}"), at(T_HIGH)),
            Boundary::Nowhere => (format!("< {T_LOW}"), at(T_LOW)),
        };
        let probes = runs.iter().filter(|r| &r.trace == trace && r.system == *system).count();
        boundaries.row(vec![
            trace.clone(),
            (*system).into(),
            t,
            run.map_or("–".into(), |r| format!("{:.1}", r.forwarded_pct)),
            run.map_or("–".into(), |r| format!("{:.1}", balancing_pct(r))),
            probes.to_string(),
        ]);
    }
    let mut shares = Table::new(
        "Fig. 1's branches per probed T: share of client requests per line (lines 15-22 are the load balancing)",
        &["trace", "version", "T", "Fwd %", "CPU-s / 1K", "req/s"]
            .into_iter()
            .chain(BRANCHES.iter().copied())
            .collect::<Vec<&str>>(),
    );
    for run in &runs {
        let decided: u64 = run.branches.iter().sum();
        let mut cells = vec![
            run.trace.clone(),
            run.system.clone(),
            run.threshold.to_string(),
            format!("{:.1}", run.forwarded_pct),
            format!("{:.3}", run.cpu_s_per_k()),
            format!("{:.0}", run.throughput_rps),
        ];
        cells.extend(
            run.branches
                .iter()
                .map(|&n| format!("{:.1}", if decided == 0 { f64::NAN } else { 100.0 * n as f64 / decided as f64 })),
        );
        shares.row(cells);
    }
    page.print(&boundaries);
    page.print(&shares);
    page.write(&config.out)?;
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bisection finds the boundary of a step predicate with few
    /// probes, and says so when the predicate holds everywhere or nowhere.
    #[test]
    fn bisection_finds_the_largest_t_that_holds() {
        for boundary in [1, 2, 7, 8, 100, 255] {
            let mut probes = Vec::new();
            let found = bisect(1, 256, |t| {
                probes.push(t);
                Ok(t <= boundary)
            })
            .unwrap();
            assert_eq!(found, Boundary::At(boundary));
            assert!(probes.len() <= 2 + 8, "{} probes for boundary {boundary}", probes.len());
        }
        assert_eq!(bisect(1, 256, |_| Ok(true)).unwrap(), Boundary::Everywhere);
        assert_eq!(bisect(1, 256, |_| Ok(false)).unwrap(), Boundary::Nowhere);
        assert!(bisect(5, 4, |_| Ok(true)).is_err(), "an empty range is an error, not a panic");
        assert!(bisect(1, 256, |_| bail!("a probe failed")).is_err());
    }

    #[test]
    fn goals_parse_and_bad_ones_say_why() {
        assert_eq!("balancing".parse::<BisectGoal>().unwrap(), BisectGoal::Balancing);
        assert_eq!("fwd:70".parse::<BisectGoal>().unwrap(), BisectGoal::Fwd(70.0));
        assert!("fwd:170".parse::<BisectGoal>().is_err());
        assert!("fwd".parse::<BisectGoal>().is_err());
        assert!("peak".parse::<BisectGoal>().is_err());
    }
}
