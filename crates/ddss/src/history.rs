//! The randomized client history of `tierstack ddss-client`: a seeded,
//! shuffled mix of gets and puts on several keys, each recorded as one JSON
//! event `{client, key, op, version, value, start_ns, end_ns}` (`value` in
//! lower-case hex, times from `CLOCK_MONOTONIC`) for the checkers of
//! [`crate::check`] run outside. The binary connects to the daemon and
//! chooses the path (its own one-sided data path or the daemon); this module
//! chooses the operations, runs them through that path and shapes the lines.
//!
//! Put values are [`pattern`]s: distinct per (client, operation) and
//! position, so a torn or misattributed value cannot pass the checkers.

use crate::{DdssStats, Key, Result};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use std::time::Duration;
use tierstack_base::host_monotonic_ns as monotonic_ns;
use tierstack_base::{seeded_rng, SeededRng};

/// What a client runs.
#[derive(Clone, Debug)]
pub struct HistoryConfig {
    /// The keys and the number of operations on each; all are shuffled together.
    pub keys: Vec<(Key, usize)>,
    /// The client id in the events.
    pub client: u32,
    /// Percent of operations that are puts.
    pub put_percent: u32,
    /// Longest value written (also bounded by each key's capacity).
    pub value_bytes_max: usize,
    /// Seed of the mix and of the value lengths.
    pub seed: u64,
    /// A random pause of up to this many microseconds after each operation
    /// (spreads the history over time, for temporal coherence).
    pub think_us_max: u64,
}

/// A history ready to run: the schedule is drawn when it is made, so a
/// client can say `ready` between drawing and running.
pub struct History {
    config: HistoryConfig,
    schedule: Vec<usize>,
    rng: SeededRng,
}

/// Parses `KEY:OPS`.
pub fn parse_key_ops(text: &str) -> std::result::Result<(Key, usize), String> {
    let (key, ops) = text.split_once(':').ok_or_else(|| format!("expected KEY:OPS, got {text:?}"))?;
    let key = key.parse::<Key>().map_err(|e| format!("bad key in {text:?}: {e}"))?;
    let ops = ops.parse::<usize>().map_err(|e| format!("bad operation count in {text:?}: {e}"))?;
    Ok((key, ops))
}

/// The bytes a client writes in its `n`-th put.
pub fn pattern(client: u32, n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (client as usize * 97 + n * 31 + i * 7) as u8).collect()
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The counters of a substrate handle as a JSON object.
pub fn stats_json(stats: &DdssStats) -> Value {
    json!({
        "gets_from_copy": stats.gets_from_copy,
        "gets_validated": stats.gets_validated,
        "gets_fetched": stats.gets_fetched,
        "gets_locked": stats.gets_locked,
        "puts": stats.puts,
        "lock_retries": stats.lock_retries,
        "lock_takeovers": stats.lock_takeovers,
        "values_lost": stats.values_lost,
        "allocations": stats.allocations,
        "frees": stats.frees,
    })
}

impl History {
    /// Draws the shuffled schedule.
    pub fn new(config: HistoryConfig) -> Self {
        let mut rng = seeded_rng(config.seed);
        let mut schedule: Vec<usize> = config.keys.iter().enumerate().flat_map(|(i, (_, ops))| vec![i; *ops]).collect();
        schedule.shuffle(&mut rng);
        Self { config, schedule, rng }
    }

    /// Runs the operations through `op` — a get when given no value, a put
    /// of the value otherwise, returning the version and the bytes read or
    /// written — and returns one event per operation.
    pub fn run(mut self, mut op: impl FnMut(Key, Option<&[u8]>) -> Result<(u64, Vec<u8>)>) -> Result<Vec<Value>> {
        let config = &self.config;
        let rng = &mut self.rng;
        let mut events = Vec::with_capacity(self.schedule.len());
        for (n, &index) in self.schedule.iter().enumerate() {
            let key = config.keys[index].0;
            let is_put = rng.gen_range(0..100) < config.put_percent;
            let len_max = config.value_bytes_max.min(key.capacity_bytes() as usize);
            let value = if is_put { pattern(config.client, n, rng.gen_range(0..=len_max)) } else { Vec::new() };
            let start_ns = monotonic_ns();
            let (version, bytes) = if is_put {
                let (version, _) = op(key, Some(&value))?;
                (version, value)
            } else {
                op(key, None)?
            };
            // A reading after the operation; at least one tick after the start,
            // which only widens the event (weakens what the checkers conclude).
            let end_ns = monotonic_ns().max(start_ns + 1);
            events.push(json!({
                "client": config.client,
                "key": key.to_string(),
                "op": if is_put { "put" } else { "get" },
                "version": version,
                "value": hex(&bytes),
                "start_ns": start_ns,
                "end_ns": end_ns,
            }));
            if config.think_us_max > 0 {
                std::thread::sleep(Duration::from_micros(rng.gen_range(0..=config.think_us_max)));
            }
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tierstack_base::NodeId;

    #[test]
    fn a_history_runs_every_scheduled_operation_with_its_patterns() {
        let coherence = crate::Coherence::examples()[0];
        let (a, b) = (Key::new(NodeId(0), 64, 1, 1, coherence), Key::new(NodeId(1), 128, 2, 2, coherence));
        let keys = vec![parse_key_ops(&format!("{a}:5")).unwrap(), parse_key_ops(&format!("{b}:3")).unwrap()];
        let config = HistoryConfig { keys, client: 4, put_percent: 50, value_bytes_max: 16, seed: 7, think_us_max: 0 };
        let mut store: HashMap<Key, (u64, Vec<u8>)> = HashMap::new();
        let events = History::new(config.clone())
            .run(|key, value| {
                let slot = store.entry(key).or_default();
                if let Some(value) = value {
                    *slot = (slot.0 + 1, value.to_vec());
                }
                Ok(slot.clone())
            })
            .unwrap();
        assert_eq!(events.len(), 8);
        for (n, event) in events.iter().enumerate() {
            assert_eq!(event["client"], 4);
            assert!(event["end_ns"].as_u64() > event["start_ns"].as_u64());
            if event["op"] == "put" {
                let len = event["value"].as_str().unwrap().len() / 2;
                assert_eq!(event["value"], hex(&pattern(4, n, len)));
            }
        }
        let again = History::new(config).run(|_, _| Ok((0, Vec::new()))).unwrap();
        let ops = |events: &[Value]| events.iter().map(|e| (e["key"].clone(), e["op"].clone())).collect::<Vec<_>>();
        assert_eq!(ops(&events), ops(&again), "the mix is a function of the seed");
    }

    #[test]
    fn key_ops_parse_or_say_why_not() {
        let key = Key::new(NodeId(0), 64, 1, 1, crate::Coherence::examples()[0]);
        assert_eq!(parse_key_ops(&format!("{key}:9")), Ok((key, 9)));
        assert!(parse_key_ops("1").unwrap_err().contains("KEY:OPS"));
        assert!(parse_key_ops("1:2").unwrap_err().contains("bad key"));
        assert!(parse_key_ops(&format!("{key}:x")).unwrap_err().contains("bad operation count"));
    }
}
