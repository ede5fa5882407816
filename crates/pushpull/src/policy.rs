//! The push decision: a pure function of the document, one proxy's cache
//! state and the policy (coherency paper §4, §5.3).
//!
//! | policy | pushes the new version to a proxy when |
//! |---|---|
//! | `pull` | never: the proxy fetches it on the next request (client polling alone) |
//! | `push` | the proxy holds a copy (of any version): the paper's Data Push model |
//! | `hybrid:F` | the proxy holds a copy **and** the document is in the top fraction `F` of its tracked documents by recency of access: the paper's simple rule |
//! | `useful:P` | the proxy holds a copy **and** the estimated probability that it is requested there before the document's next update, λ/(λ+μ), is at least `P` |
//!
//! Requiring a held copy in `hybrid` makes it a refinement of `push`:
//! `hybrid:0` is `pull` and `hybrid:1` is `push`, so the fraction sweeps the
//! whole trade-off (the x-axis of Fig. 12–14). The paper's text only names
//! the recency list; a document the proxy no longer holds would be a new
//! entry it never asked for, exactly the eviction the paper warns about.
//!
//! `useful` is ours. A pushed copy is wasted iff the next update of the
//! document comes before the next request for it at that proxy. With
//! requests at rate λ (from the proxy's decayed access weight) and updates at
//! rate μ (from the application tier's update history), both Poisson, the
//! copy is used with probability λ/(λ+μ); pushing when that is at least `P`
//! bounds the expected waste per push by `1 − P`, whatever the popularity
//! ranking says. Without an update history yet (μ unknown) it pushes.

use crate::state::CacheStateSnapshot;
use serde::Serialize;
use std::fmt;

/// How updates reach the proxies' caches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "policy", rename_all = "kebab-case")]
pub enum PushPolicy {
    Pull,
    Push,
    Hybrid { fraction: f64 },
    Useful { probability: f64 },
}

impl PushPolicy {
    /// True if the policy needs the proxies' cache states.
    pub fn reads_state(&self) -> bool {
        !matches!(self, PushPolicy::Pull)
    }
}

impl fmt::Display for PushPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushPolicy::Pull => f.write_str("pull"),
            PushPolicy::Push => f.write_str("push"),
            PushPolicy::Hybrid { fraction } => write!(f, "hybrid:{fraction}"),
            PushPolicy::Useful { probability } => write!(f, "useful:{probability}"),
        }
    }
}

impl std::str::FromStr for PushPolicy {
    type Err = String;

    /// `pull`, `push`, `hybrid:<fraction>` or `useful:<probability>`, each
    /// parameter in [0, 1].
    fn from_str(s: &str) -> Result<Self, String> {
        let unit = |name: &str, value: &str| -> Result<f64, String> {
            match value.parse::<f64>() {
                Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
                _ => Err(format!("{name} parameter {value:?} must be a number in [0, 1]")),
            }
        };
        match s.split_once(':') {
            None if s == "pull" => Ok(PushPolicy::Pull),
            None if s == "push" => Ok(PushPolicy::Push),
            Some(("hybrid", v)) => Ok(PushPolicy::Hybrid { fraction: unit("hybrid", v)? }),
            Some(("useful", v)) => Ok(PushPolicy::Useful { probability: unit("useful", v)? }),
            _ => Err(format!(
                "unknown push policy {s:?} (expected pull, push, hybrid:<fraction> or useful:<probability>)"
            )),
        }
    }
}

/// What the application tier knows about the update at hand.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UpdateContext {
    /// The document's estimated update rate; `None` before it has a history.
    pub update_rate_hz: Option<f64>,
}

/// The outcome for one (document, proxy) pair, with the reason not to push.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    Push,
    /// The policy never pushes.
    Never,
    /// The proxy holds no copy (or does not track the document).
    NotCached,
    /// `hybrid`: outside the top fraction of recently accessed documents.
    NotRecent,
    /// `useful`: unlikely to be read before the next update.
    Unlikely,
}

impl Decision {
    pub fn is_push(self) -> bool {
        self == Decision::Push
    }
}

/// Whether to push the new version of the document `fingerprint` to the
/// proxy whose cache state is `state`.
pub fn decide(policy: PushPolicy, fingerprint: u64, state: &CacheStateSnapshot, context: &UpdateContext) -> Decision {
    if policy == PushPolicy::Pull {
        return Decision::Never;
    }
    let Some(entry) = state.entry(fingerprint).filter(|e| e.resident) else {
        return Decision::NotCached;
    };
    match policy {
        PushPolicy::Pull => Decision::Never,
        PushPolicy::Push => Decision::Push,
        PushPolicy::Hybrid { fraction } => {
            let tracked = state.entries.len();
            let top = ((fraction * tracked as f64).ceil() as usize).min(tracked);
            match state.recency_rank(fingerprint) {
                Some(rank) if rank < top => Decision::Push,
                _ => Decision::NotRecent,
            }
        }
        PushPolicy::Useful { probability } => {
            let lambda = state.request_rate_hz(entry);
            let used = match context.update_rate_hz {
                Some(mu) if mu > 0.0 && mu.is_finite() => lambda / (lambda + mu),
                _ => 1.0,
            };
            if used >= probability {
                Decision::Push
            } else {
                Decision::Unlikely
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateEntry;
    use proptest::prelude::*;

    const SECOND_NS: u64 = 1_000_000_000;

    fn entry(fingerprint: u64, last_access_ns: u64, weight: f64, resident: bool) -> StateEntry {
        StateEntry { fingerprint, last_access_ns, access_count: weight.ceil() as u64, weight, resident }
    }

    /// Ten documents 1..=10, document k last accessed at k seconds (10 is
    /// the most recent), all resident except 4; 11 is untracked.
    fn ten() -> CacheStateSnapshot {
        let entries = (1..=10).map(|k| entry(k, k * SECOND_NS, k as f64, k != 4)).collect();
        CacheStateSnapshot::from_entries(10 * SECOND_NS, SECOND_NS, entries)
    }

    fn pushed(policy: &str, state: &CacheStateSnapshot) -> Vec<u64> {
        let policy: PushPolicy = policy.parse().unwrap();
        (1..=11).filter(|fp| decide(policy, *fp, state, &UpdateContext::default()).is_push()).collect()
    }

    #[test]
    fn policy_table() {
        // (policy, documents pushed among 1..=11): one row per case.
        let rows: &[(&str, &[u64])] = &[
            ("pull", &[]),
            ("push", &[1, 2, 3, 5, 6, 7, 8, 9, 10]),
            ("hybrid:0", &[]),
            ("hybrid:0.01", &[10]),
            ("hybrid:0.1", &[10]),
            ("hybrid:0.25", &[8, 9, 10]),
            ("hybrid:0.5", &[6, 7, 8, 9, 10]),
            ("hybrid:0.7", &[5, 6, 7, 8, 9, 10]), // 4 is in the top 70 % but holds no copy
            ("hybrid:1", &[1, 2, 3, 5, 6, 7, 8, 9, 10]),
            ("useful:0", &[1, 2, 3, 5, 6, 7, 8, 9, 10]),
        ];
        let state = ten();
        for (policy, expected) in rows {
            assert_eq!(pushed(policy, &state), *expected, "policy {policy}");
        }
    }

    #[test]
    fn reasons_are_reported() {
        let state = ten();
        let ctx = UpdateContext::default();
        assert_eq!(decide(PushPolicy::Pull, 10, &state, &ctx), Decision::Never);
        assert_eq!(decide(PushPolicy::Push, 4, &state, &ctx), Decision::NotCached);
        assert_eq!(decide(PushPolicy::Push, 11, &state, &ctx), Decision::NotCached);
        assert_eq!(decide(PushPolicy::Hybrid { fraction: 0.1 }, 1, &state, &ctx), Decision::NotRecent);
        let rare = UpdateContext { update_rate_hz: Some(1e-3) };
        let frequent = UpdateContext { update_rate_hz: Some(1e3) };
        assert_eq!(decide(PushPolicy::Useful { probability: 0.5 }, 10, &state, &rare), Decision::Push);
        assert_eq!(decide(PushPolicy::Useful { probability: 0.5 }, 10, &state, &frequent), Decision::Unlikely);
    }

    #[test]
    fn useful_weighs_request_rate_against_update_rate() {
        // Document 1: weight 10 at now (λ = 10·ln2 ≈ 6.9/s); document 2:
        // weight 1, last read 4 half-lives ago (λ ≈ 0.043/s).
        let entries = vec![entry(1, 10 * SECOND_NS, 10.0, true), entry(2, 6 * SECOND_NS, 1.0, true)];
        let state = CacheStateSnapshot::from_entries(10 * SECOND_NS, SECOND_NS, entries);
        let ctx = UpdateContext { update_rate_hz: Some(1.0) };
        let policy = PushPolicy::Useful { probability: 0.5 };
        assert_eq!(decide(policy, 1, &state, &ctx), Decision::Push, "λ/(λ+μ) ≈ 0.87");
        assert_eq!(decide(policy, 2, &state, &ctx), Decision::Unlikely, "λ/(λ+μ) ≈ 0.04");
        let hybrid = PushPolicy::Hybrid { fraction: 0.5 };
        assert_eq!(decide(hybrid, 1, &state, &ctx), Decision::Push);
        assert_eq!(decide(hybrid, 2, &state, &ctx), Decision::NotRecent);
    }

    #[test]
    fn parses_and_prints() {
        for text in ["pull", "push", "hybrid:0.25", "hybrid:1", "useful:0.5"] {
            let policy: PushPolicy = text.parse().unwrap();
            assert_eq!(policy.to_string(), text);
        }
        for bad in ["", "hybrid", "hybrid:", "hybrid:1.5", "hybrid:-0.1", "hybrid:NaN", "useful:2", "pushy", "pull:1"] {
            assert!(bad.parse::<PushPolicy>().is_err(), "{bad:?} was accepted");
        }
        assert!(!PushPolicy::Pull.reads_state());
        assert!(PushPolicy::Hybrid { fraction: 0.5 }.reads_state());
    }

    fn arbitrary_state() -> impl Strategy<Value = CacheStateSnapshot> {
        proptest::collection::vec((1u64..40, 0u64..1000, 0.0f64..50.0, any::<bool>()), 0..30).prop_map(|rows| {
            let mut seen = std::collections::HashSet::new();
            let entries = rows
                .into_iter()
                .filter(|(fp, ..)| seen.insert(*fp))
                .map(|(fp, last, weight, resident)| entry(fp, last * 1_000_000, weight, resident))
                .collect();
            CacheStateSnapshot::from_entries(1_000_000_000, SECOND_NS, entries)
        })
    }

    proptest! {
        /// hybrid pushes a subset of push, grows with the fraction, and
        /// meets pull at 0 and push at 1.
        #[test]
        fn hybrid_sweeps_from_pull_to_push(state in arbitrary_state(), a in 0.0f64..=1.0, b in 0.0f64..=1.0, fp in 1u64..40) {
            let ctx = UpdateContext::default();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let push = decide(PushPolicy::Push, fp, &state, &ctx).is_push();
            let at_lo = decide(PushPolicy::Hybrid { fraction: lo }, fp, &state, &ctx).is_push();
            let at_hi = decide(PushPolicy::Hybrid { fraction: hi }, fp, &state, &ctx).is_push();
            prop_assert!(!at_lo || at_hi, "monotone in the fraction");
            prop_assert!(!at_hi || push, "a subset of push");
            let (none, all) = (PushPolicy::Hybrid { fraction: 0.0 }, PushPolicy::Hybrid { fraction: 1.0 });
            prop_assert!(!decide(none, fp, &state, &ctx).is_push(), "hybrid:0 is pull");
            prop_assert_eq!(decide(all, fp, &state, &ctx).is_push(), push);
        }

        /// useful pushes a subset of push and is monotone in its threshold.
        #[test]
        fn useful_is_a_monotone_subset_of_push(state in arbitrary_state(), a in 0.0f64..=1.0, b in 0.0f64..=1.0,
                                               mu in 0.001f64..100.0, fp in 1u64..40) {
            let ctx = UpdateContext { update_rate_hz: Some(mu) };
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let push = decide(PushPolicy::Push, fp, &state, &ctx).is_push();
            let at_lo = decide(PushPolicy::Useful { probability: lo }, fp, &state, &ctx).is_push();
            let at_hi = decide(PushPolicy::Useful { probability: hi }, fp, &state, &ctx).is_push();
            prop_assert!(!at_hi || at_lo);
            prop_assert!(!at_lo || push);
        }
    }
}
