//! The table of requests in flight on one connection: a pure state machine.
//!
//! Events in: a request is posted ([`PendingTable::insert`]), an answer
//! arrives ([`PendingTable::take`]), time passes ([`PendingTable::expire`]),
//! the connection breaks ([`PendingTable::close`]). Actions out: the waiters
//! to complete, returned to the caller, which completes them outside the lock.
//! Time is a number of nanoseconds passed in, so tests drive it directly.

use std::collections::HashMap;
use tierstack_fabric::FabricError;

/// Requests in flight, each with its deadline, until answered, expired or
/// failed by the connection's end. Every waiter inserted leaves the table
/// exactly once, through one of `take`, `expire` or `close`.
pub(crate) struct PendingTable<W> {
    entries: HashMap<u64, Entry<W>>,
    /// Set when the connection ended; later inserts are refused with it.
    closed: Option<FabricError>,
}

struct Entry<W> {
    deadline_ns: u64,
    waiter: W,
}

impl<W> PendingTable<W> {
    pub(crate) fn new() -> Self {
        Self { entries: HashMap::new(), closed: None }
    }

    /// Registers `waiter` for `request`. On a closed table, returns the
    /// closing error with the waiter, which the caller then fails.
    pub(crate) fn insert(&mut self, request: u64, deadline_ns: u64, waiter: W) -> Result<(), (FabricError, W)> {
        if let Some(error) = &self.closed {
            return Err((error.clone(), waiter));
        }
        debug_assert!(!self.entries.contains_key(&request), "request ids are unique");
        self.entries.insert(request, Entry { deadline_ns, waiter });
        Ok(())
    }

    /// The waiter for an answer to `request`; `None` for a late or unknown
    /// answer, which the caller drops.
    pub(crate) fn take(&mut self, request: u64) -> Option<W> {
        self.entries.remove(&request).map(|entry| entry.waiter)
    }

    /// Removes and returns the waiters whose deadline is at or before `now_ns`.
    pub(crate) fn expire(&mut self, now_ns: u64) -> Vec<W> {
        if self.entries.is_empty() {
            return Vec::new();
        }
        let due: Vec<u64> =
            self.entries.iter().filter(|(_, entry)| entry.deadline_ns <= now_ns).map(|(request, _)| *request).collect();
        due.into_iter().filter_map(|request| self.take(request)).collect()
    }

    /// Closes the table with `error`: returns every waiter, and refuses
    /// later inserts. Closing twice keeps the first error.
    pub(crate) fn close(&mut self, error: FabricError) -> Vec<W> {
        if self.closed.is_none() {
            self.closed = Some(error);
        }
        self.entries.drain().map(|(_, entry)| entry.waiter).collect()
    }

    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use tierstack_base::NodeId;

    fn dead() -> FabricError {
        FabricError::PeerDead { node: NodeId(1), reason: "test".into() }
    }

    #[test]
    fn answers_expiry_and_close() {
        let mut table = PendingTable::new();
        table.insert(1, 100, "a").unwrap();
        table.insert(2, 200, "b").unwrap();
        table.insert(3, 300, "c").unwrap();
        assert_eq!(table.take(2), Some("b"));
        assert_eq!(table.take(2), None, "a second answer is dropped");
        assert!(table.expire(99).is_empty());
        assert_eq!(table.expire(100), vec!["a"], "the deadline itself expires");
        assert_eq!(table.take(1), None, "a late answer after expiry finds nothing");
        assert_eq!(table.close(dead()), vec!["c"]);
        let (error, waiter) = table.insert(4, 400, "d").unwrap_err();
        assert_eq!((error, waiter), (dead(), "d"), "a closed table refuses and hands the waiter back");
        assert!(table.is_closed());
        assert!(table.close(FabricError::Closed).is_empty());
        assert_eq!(table.insert(5, 0, "e").unwrap_err().0, dead(), "the first close error sticks");
    }

    #[derive(Debug, Clone)]
    enum Event {
        Insert { deadline_ns: u64 },
        Take { request: u64 },
        Expire { now_ns: u64 },
        Close,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => (0u64..1000).prop_map(|deadline_ns| Event::Insert { deadline_ns }),
            3 => (0u64..40).prop_map(|request| Event::Take { request }),
            2 => (0u64..1000).prop_map(|now_ns| Event::Expire { now_ns }),
            1 => Just(Event::Close),
        ]
    }

    proptest! {
        /// Against a BTreeMap model: every inserted waiter leaves exactly once,
        /// by the right path.
        #[test]
        fn matches_model(events in proptest::collection::vec(event(), 1..80)) {
            let mut table = PendingTable::new();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut closed = false;
            let mut next = 0u64;
            let mut left = Vec::new();
            for event in events {
                match event {
                    Event::Insert { deadline_ns } => {
                        let request = next;
                        next += 1;
                        let result = table.insert(request, deadline_ns, request);
                        if closed {
                            prop_assert_eq!(result.unwrap_err().1, request);
                            left.push(request);
                        } else {
                            prop_assert!(result.is_ok());
                            model.insert(request, deadline_ns);
                        }
                    }
                    Event::Take { request } => {
                        let got = table.take(request);
                        prop_assert_eq!(got, model.remove(&request).map(|_| request));
                        left.extend(got);
                    }
                    Event::Expire { now_ns } => {
                        let mut got = table.expire(now_ns);
                        got.sort_unstable();
                        let due: Vec<u64> = model.iter().filter(|(_, d)| **d <= now_ns).map(|(r, _)| *r).collect();
                        for r in &due {
                            model.remove(r);
                        }
                        prop_assert_eq!(&got, &due);
                        left.extend(got);
                    }
                    Event::Close => {
                        let mut got = table.close(FabricError::Closed);
                        got.sort_unstable();
                        let all: Vec<u64> = std::mem::take(&mut model).into_keys().collect();
                        prop_assert_eq!(&got, &all);
                        left.extend(got);
                        closed = true;
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            left.extend(table.close(FabricError::Closed));
            left.sort_unstable();
            prop_assert_eq!(left, (0..next).collect::<Vec<_>>(), "every waiter leaves exactly once");
        }
    }
}
