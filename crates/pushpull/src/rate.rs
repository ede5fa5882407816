//! Per-document update rates, as the application tier sees its updates:
//! an exponentially weighted mean of the intervals between updates. Pure:
//! times come in as arguments (the caller's `tierstack_base::Clock`).

use std::collections::HashMap;

/// Documents whose update history is kept; beyond it, an arbitrary one is forgotten.
pub const DOCUMENTS_MAX: usize = 65_536;
/// Weight of the newest interval in the running mean.
const NEWEST_WEIGHT: f64 = 0.25;

#[derive(Debug, Default)]
pub struct UpdateRates {
    /// fingerprint → (last update, mean interval in ns once known)
    documents: HashMap<u64, (u64, Option<f64>)>,
}

impl UpdateRates {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an update of `fingerprint` at `now_ns` and returns the
    /// document's estimated update rate, if it has a history.
    pub fn record(&mut self, fingerprint: u64, now_ns: u64) -> Option<f64> {
        if !self.documents.contains_key(&fingerprint) && self.documents.len() >= DOCUMENTS_MAX {
            if let Some(victim) = self.documents.keys().next().copied() {
                self.documents.remove(&victim);
            }
        }
        let slot = self.documents.entry(fingerprint).or_insert((now_ns, None));
        if slot.0 < now_ns {
            let interval = (now_ns - slot.0) as f64;
            slot.1 = Some(match slot.1 {
                Some(mean) => mean + NEWEST_WEIGHT * (interval - mean),
                None => interval,
            });
            slot.0 = now_ns;
        }
        self.rate_hz(fingerprint)
    }

    /// Updates per second of `fingerprint`, if known.
    pub fn rate_hz(&self, fingerprint: u64) -> Option<f64> {
        let (_, mean) = self.documents.get(&fingerprint)?;
        mean.filter(|m| *m > 0.0).map(|m| 1e9 / m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_the_interval_between_updates() {
        let mut rates = UpdateRates::new();
        assert_eq!(rates.record(1, 0), None, "one update is no history");
        assert_eq!(rates.record(1, 500_000_000), Some(2.0));
        for k in 2..40u64 {
            rates.record(1, 500_000_000 + (k - 1) * 250_000_000);
        }
        let rate = rates.rate_hz(1).unwrap();
        assert!((rate - 4.0).abs() < 0.01, "converges to 4 updates/s: {rate}");
        assert_eq!(rates.rate_hz(2), None);
        assert_eq!(rates.record(1, 0), Some(rate), "time going backwards changes nothing");
    }
}
