//! Independent checkers for histories of one key: each coherence model's
//! definition (see [`crate::Coherence`]) turned into a test over what clients
//! observed. They know nothing of the implementation; tests (and the lead's
//! multi-process runs) record events and call them.
//!
//! Every event has an invocation and a response position on one real-time
//! timeline (`invoked < responded`; `a.responded < b.invoked` means a
//! finished before b began), for example ticks of a shared [`Timeline`], and
//! readings of the substrate's clock (`*_ns`) for temporal coherence.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A real-time order for events of threads in one process: each call to
/// [`Timeline::tick`] returns a distinct, larger number.
#[derive(Debug, Default)]
pub struct Timeline(AtomicU64);

impl Timeline {
    pub fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// One completed put or get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Which client (reader or writer) issued it; its events do not overlap.
    pub client: u32,
    /// Version returned by the put, or observed by the get.
    pub version: u64,
    /// Bytes written by the put, or returned by the get.
    pub bytes: Vec<u8>,
    pub invoked: u64,
    pub responded: u64,
    pub invoked_ns: u64,
    pub responded_ns: u64,
}

/// Everything clients observed of one key (which started empty at version 0).
#[derive(Clone, Debug, Default)]
pub struct History {
    pub puts: Vec<Event>,
    pub gets: Vec<Event>,
}

/// A broken promise, with the events that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

type Check = Result<(), Violation>;

fn fail<T>(message: String) -> Result<T, Violation> {
    Err(Violation(message))
}

/// Every get returned exactly the bytes of the put with its version (or the
/// empty initial value at version 0), and no two puts share a version.
pub fn untorn(history: &History) -> Check {
    let mut written: HashMap<u64, &Event> = HashMap::new();
    for put in &history.puts {
        if let Some(other) = written.insert(put.version, put) {
            return fail(format!("two puts returned version {}: {other:?} and {put:?}", put.version));
        }
    }
    for get in &history.gets {
        let expected: &[u8] = match (get.version, written.get(&get.version)) {
            (0, _) => &[],
            (_, Some(put)) => &put.bytes,
            (v, None) => return fail(format!("get {get:?} returned version {v}, which no put wrote")),
        };
        if get.bytes != expected {
            return fail(format!("get {get:?} returned bytes that differ from version {}'s put", get.version));
        }
        if let Some(put) = written.get(&get.version) {
            if put.invoked > get.responded {
                return fail(format!("get {get:?} saw version {} before its put {put:?} began", get.version));
            }
        }
    }
    Ok(())
}

/// Write coherence: put versions are exactly 1..=n and respect real time (a
/// put that finished before another began has the smaller version).
pub fn write_ordered(history: &History) -> Check {
    let mut puts: Vec<&Event> = history.puts.iter().collect();
    puts.sort_by_key(|p| p.version);
    for (i, put) in puts.iter().enumerate() {
        if put.version != i as u64 + 1 {
            return fail(format!("put versions are not 1..={}: position {i} has {put:?}", puts.len()));
        }
    }
    // Sweep from the highest version down, keeping the earliest response
    // among higher versions: it must not precede this put's invocation.
    let mut earliest_higher: Option<&Event> = None;
    for put in puts.iter().rev() {
        if let Some(higher) = earliest_higher {
            if higher.responded < put.invoked {
                return fail(format!("put {higher:?} finished before {put:?} began but has a higher version"));
            }
        }
        if earliest_higher.is_none_or(|h| put.responded < h.responded) {
            earliest_higher = Some(put);
        }
    }
    Ok(())
}

/// Per client, the versions of successive gets never decrease.
pub fn monotonic(history: &History) -> Check {
    let mut last: HashMap<u32, &Event> = HashMap::new();
    let mut gets: Vec<&Event> = history.gets.iter().collect();
    gets.sort_by_key(|g| g.invoked);
    for get in gets {
        if let Some(previous) = last.get(&get.client) {
            if get.version < previous.version {
                return fail(format!("client {} went back from {previous:?} to {get:?}", get.client));
            }
        }
        last.insert(get.client, get);
    }
    Ok(())
}

/// Delta coherence: every get's version is at least `L - delta`, where `L`
/// is the highest version of a put that completed before the get began.
pub fn delta(history: &History, delta: u64) -> Check {
    let mut completed: Vec<(u64, u64)> = history.puts.iter().map(|p| (p.responded, p.version)).collect();
    completed.sort_unstable();
    // Running maximum of versions in response order.
    let mut best = 0;
    let prefix_max: Vec<u64> = completed
        .iter()
        .map(|(_, v)| {
            best = best.max(*v);
            best
        })
        .collect();
    for get in &history.gets {
        let done = completed.partition_point(|(responded, _)| *responded < get.invoked);
        let latest = if done == 0 { 0 } else { prefix_max[done - 1] };
        if get.version.saturating_add(delta) < latest {
            return fail(format!(
                "get {get:?} returned version {} but version {latest} had completed before it began (delta {delta})",
                get.version
            ));
        }
    }
    Ok(())
}

/// Read coherence: [`delta`] with 0.
pub fn read(history: &History) -> Check {
    delta(history, 0)
}

/// Temporal coherence: a get that returned version `v` began no more than
/// `max_age_ns` after version `v + 1`'s put completed (so `v` was current
/// at some instant within `max_age_ns` of the get), by the `*_ns` clock.
pub fn temporal(history: &History, max_age_ns: u64) -> Check {
    let next: HashMap<u64, &Event> = history.puts.iter().map(|p| (p.version, p)).collect();
    for get in &history.gets {
        if let Some(successor) = next.get(&(get.version + 1)) {
            if successor.responded_ns.saturating_add(max_age_ns) < get.invoked_ns {
                return fail(format!(
                    "get {get:?} returned version {} although {successor:?} replaced it more than {max_age_ns} ns earlier",
                    get.version
                ));
            }
        }
    }
    Ok(())
}

/// Most events [`linearizable`] accepts (its search is exponential in the worst case).
pub const LINEARIZABLE_EVENTS_MAX: usize = 128;

/// Linearizability against the sequential spec of a versioned register
/// (state: the current version, initially 0; a put returns state + 1 and
/// makes it the state; a get returns the state), by a Wing–Gong search with
/// memoization on the set of linearized events. Values are checked by
/// [`untorn`]; call both.
pub fn linearizable(history: &History) -> Check {
    #[derive(Clone, Copy)]
    struct Op {
        put: bool,
        version: u64,
        invoked: u64,
        responded: u64,
    }
    let ops: Vec<Op> = history
        .puts
        .iter()
        .map(|e| (true, e))
        .chain(history.gets.iter().map(|e| (false, e)))
        .map(|(put, e)| Op { put, version: e.version, invoked: e.invoked, responded: e.responded })
        .collect();
    if ops.len() > LINEARIZABLE_EVENTS_MAX {
        return fail(format!("{} events exceed the checker's limit of {LINEARIZABLE_EVENTS_MAX}", ops.len()));
    }
    let all: u128 = if ops.is_empty() { 0 } else { u128::MAX >> (128 - ops.len()) };
    let mut seen: HashSet<u128> = HashSet::new();
    // Depth-first search with an explicit stack of (linearized set, state).
    let mut stack = vec![(0u128, 0u64)];
    while let Some((done, state)) = stack.pop() {
        if done == all {
            return Ok(());
        }
        if !seen.insert(done) {
            continue;
        }
        let pending = || (0..ops.len()).filter(move |i| done & (1u128 << i) == 0);
        let first_response = pending().map(|i| ops[i].responded).min().unwrap_or(u64::MAX);
        for i in pending() {
            let op = ops[i];
            if op.invoked > first_response {
                continue; // some pending op finished before this one began
            }
            let next = if op.put {
                (op.version == state + 1).then_some(op.version)
            } else {
                (op.version == state).then_some(state)
            };
            if let Some(next) = next {
                stack.push((done | (1u128 << i), next));
            }
        }
    }
    fail(format!("no linearization of {} puts and {} gets exists", history.puts.len(), history.gets.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(client: u32, version: u64, invoked: u64, responded: u64) -> Event {
        Event {
            client,
            version,
            bytes: vec![version as u8],
            invoked,
            responded,
            invoked_ns: invoked,
            responded_ns: responded,
        }
    }

    fn get(client: u32, version: u64, invoked: u64, responded: u64) -> Event {
        let mut e = ev(client, version, invoked, responded);
        if version == 0 {
            e.bytes.clear();
        }
        e
    }

    fn history(puts: Vec<Event>, gets: Vec<Event>) -> History {
        History { puts, gets }
    }

    #[test]
    fn untorn_catches_mixed_bytes_and_phantom_versions() {
        let good = history(vec![ev(0, 1, 1, 2)], vec![get(1, 1, 3, 4), get(1, 0, 0, 1)]);
        assert!(untorn(&good).is_ok());
        let mut torn = good.clone();
        torn.gets[0].bytes = vec![9];
        assert!(untorn(&torn).is_err());
        let phantom = history(vec![ev(0, 1, 1, 2)], vec![get(1, 2, 3, 4)]);
        assert!(untorn(&phantom).is_err());
        let duplicate = history(vec![ev(0, 1, 1, 2), ev(1, 1, 1, 2)], vec![]);
        assert!(untorn(&duplicate).is_err());
        let from_the_future = history(vec![ev(0, 1, 5, 6)], vec![get(1, 1, 1, 2)]);
        assert!(untorn(&from_the_future).is_err());
    }

    #[test]
    fn write_order_needs_consecutive_versions_in_real_time_order() {
        assert!(write_ordered(&history(vec![ev(0, 2, 3, 4), ev(1, 1, 1, 5)], vec![])).is_ok());
        assert!(write_ordered(&history(vec![ev(0, 1, 3, 4), ev(1, 2, 1, 2)], vec![])).is_err());
        assert!(write_ordered(&history(vec![ev(0, 1, 1, 2), ev(1, 3, 3, 4)], vec![])).is_err());
    }

    #[test]
    fn monotonic_is_per_client() {
        let ok = history(vec![], vec![get(0, 2, 1, 2), get(1, 1, 3, 4), get(0, 2, 5, 6)]);
        assert!(monotonic(&ok).is_ok());
        let back = history(vec![], vec![get(0, 2, 1, 2), get(0, 1, 3, 4)]);
        assert!(monotonic(&back).is_err());
    }

    #[test]
    fn delta_and_read_measure_lag_behind_completed_puts() {
        let puts = vec![ev(0, 1, 1, 2), ev(0, 2, 3, 4), ev(0, 3, 5, 6)];
        // A get beginning at 7 (after version 3 completed) that returns 1 lags by 2.
        let lagging = history(puts.clone(), vec![get(1, 1, 7, 8)]);
        assert!(delta(&lagging, 2).is_ok());
        assert!(delta(&lagging, 1).is_err());
        assert!(read(&lagging).is_err());
        // Overlapping version 3's put: version 2 is the latest completed.
        let overlapping = history(puts, vec![get(1, 2, 5, 8)]);
        assert!(read(&overlapping).is_ok());
    }

    #[test]
    fn temporal_measures_age_on_the_clock() {
        let puts = vec![ev(0, 1, 10, 20), ev(0, 2, 30, 40)];
        assert!(temporal(&history(puts.clone(), vec![get(1, 1, 45, 46)]), 5).is_ok());
        assert!(temporal(&history(puts.clone(), vec![get(1, 1, 46, 47)]), 5).is_err());
        assert!(temporal(&history(puts, vec![get(1, 2, 1000, 1001)]), 5).is_ok(), "the latest never ages");
    }

    #[test]
    fn linearizability_search() {
        // Overlapping put and get: either order is fine.
        assert!(linearizable(&history(vec![ev(0, 1, 1, 4)], vec![get(1, 0, 2, 3)])).is_ok());
        assert!(linearizable(&history(vec![ev(0, 1, 1, 4)], vec![get(1, 1, 2, 3)])).is_ok());
        // A get after a completed put must see it.
        assert!(linearizable(&history(vec![ev(0, 1, 1, 2)], vec![get(1, 0, 3, 4)])).is_err());
        // New-old inversion between two readers during one put.
        let inversion = history(vec![ev(0, 1, 1, 10)], vec![get(1, 1, 2, 3), get(2, 0, 4, 5)]);
        assert!(linearizable(&inversion).is_err());
        assert!(read(&inversion).is_ok(), "read coherence alone does not forbid it");
        // Concurrent puts may take versions in either order.
        let swapped = history(vec![ev(0, 2, 1, 5), ev(1, 1, 2, 6)], vec![get(2, 2, 7, 8)]);
        assert!(linearizable(&swapped).is_ok());
        let too_many = History { puts: (0..130).map(|i| ev(0, i + 1, 2 * i, 2 * i + 1)).collect(), gets: vec![] };
        assert!(linearizable(&too_many).is_err());
    }
}
