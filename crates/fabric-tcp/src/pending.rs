//! The table of requests in flight to one peer: a pure state machine.
//!
//! Events in: a request is posted ([`PendingTable::insert`]), the writer
//! puts it on a connection ([`PendingTable::mark_sent`]), an answer arrives
//! ([`PendingTable::take`]), time passes ([`PendingTable::expire`]), a
//! connection breaks ([`PendingTable::fail_sent_on`]), a dial fails
//! ([`PendingTable::fail_unsent`]), the fabric shuts down
//! ([`PendingTable::close`]). Actions out: the waiters to complete, returned
//! to the caller, which completes them outside the lock. Time is a number of
//! nanoseconds passed in, so tests drive it directly.

use std::collections::HashMap;
use tierstack_fabric::FabricError;

/// Requests in flight, each with its deadline and the connection it was
/// written on (none while it waits in the writer's queue), until answered,
/// expired or failed. Every waiter inserted leaves the table exactly once,
/// through one of `take`, `expire`, `fail_sent_on`, `fail_unsent` or `close`.
pub(crate) struct PendingTable<W> {
    entries: HashMap<u64, Entry<W>>,
    /// Set when the fabric closed; later inserts are refused with it.
    closed: Option<FabricError>,
}

struct Entry<W> {
    deadline_ns: u64,
    /// The connection the request was written on, once it was.
    sent_on: Option<u64>,
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
        self.entries.insert(request, Entry { deadline_ns, sent_on: None, waiter });
        Ok(())
    }

    /// Whether `request` still waits for an answer (the writer skips one
    /// that expired or failed while queued).
    pub(crate) fn contains(&self, request: u64) -> bool {
        self.entries.contains_key(&request)
    }

    /// Records that `request` is being written on connection `conn`; false if
    /// it is no longer pending, and then it must not be written.
    pub(crate) fn mark_sent(&mut self, request: u64, conn: u64) -> bool {
        match self.entries.get_mut(&request) {
            Some(entry) => {
                entry.sent_on = Some(conn);
                true
            }
            None => false,
        }
    }

    /// Removes and returns the waiters of requests written on `conn`, which
    /// broke: their answers can no longer come.
    pub(crate) fn fail_sent_on(&mut self, conn: u64) -> Vec<W> {
        self.remove_where(|entry| entry.sent_on == Some(conn))
    }

    /// Removes and returns the waiters of requests not yet written (a dial
    /// failed: they would fail the same way).
    pub(crate) fn fail_unsent(&mut self) -> Vec<W> {
        self.remove_where(|entry| entry.sent_on.is_none())
    }

    fn remove_where(&mut self, doomed: impl Fn(&Entry<W>) -> bool) -> Vec<W> {
        let requests: Vec<u64> =
            self.entries.iter().filter(|(_, entry)| doomed(entry)).map(|(request, _)| *request).collect();
        requests.into_iter().filter_map(|request| self.take(request)).collect()
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
        self.remove_where(|entry| entry.deadline_ns <= now_ns)
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

    #[test]
    fn requests_fail_with_the_connection_they_were_written_on() {
        let mut table = PendingTable::new();
        for request in 1..=4 {
            table.insert(request, 1000, request).unwrap();
        }
        assert!(table.mark_sent(1, 10));
        assert!(table.mark_sent(2, 10));
        assert!(table.mark_sent(3, 11));
        assert!(!table.mark_sent(9, 10), "an unknown request is not written");
        assert_eq!(sorted(table.fail_sent_on(10)), vec![1, 2]);
        assert!(!table.contains(1) && table.contains(3) && table.contains(4));
        assert!(!table.mark_sent(1, 11), "a failed request is not written again");
        assert_eq!(table.fail_unsent(), vec![4], "only the request never written");
        assert_eq!(table.take(3), Some(3));
        assert_eq!(table.len(), 0);
    }

    fn sorted(mut waiters: Vec<u64>) -> Vec<u64> {
        waiters.sort_unstable();
        waiters
    }

    #[derive(Debug, Clone)]
    enum Event {
        Insert { deadline_ns: u64 },
        MarkSent { request: u64, conn: u64 },
        Take { request: u64 },
        Expire { now_ns: u64 },
        FailConn { conn: u64 },
        FailUnsent,
        Close,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => (0u64..1000).prop_map(|deadline_ns| Event::Insert { deadline_ns }),
            3 => (0u64..40, 0u64..3).prop_map(|(request, conn)| Event::MarkSent { request, conn }),
            3 => (0u64..40).prop_map(|request| Event::Take { request }),
            2 => (0u64..1000).prop_map(|now_ns| Event::Expire { now_ns }),
            1 => (0u64..3).prop_map(|conn| Event::FailConn { conn }),
            1 => Just(Event::FailUnsent),
            1 => Just(Event::Close),
        ]
    }

    proptest! {
        /// Against a BTreeMap model: every inserted waiter leaves exactly once,
        /// by the right path.
        #[test]
        fn matches_model(events in proptest::collection::vec(event(), 1..80)) {
            let mut table = PendingTable::new();
            // request -> (deadline, connection written on)
            let mut model: BTreeMap<u64, (u64, Option<u64>)> = BTreeMap::new();
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
                            model.insert(request, (deadline_ns, None));
                        }
                    }
                    Event::MarkSent { request, conn } => {
                        let marked = table.mark_sent(request, conn);
                        let entry = model.get_mut(&request);
                        prop_assert_eq!(marked, entry.is_some());
                        if let Some(entry) = entry {
                            entry.1 = Some(conn);
                        }
                    }
                    Event::FailConn { conn } => {
                        let got = sorted(table.fail_sent_on(conn));
                        let doomed: Vec<u64> = model.iter().filter(|(_, e)| e.1 == Some(conn)).map(|(r, _)| *r).collect();
                        model.retain(|_, e| e.1 != Some(conn));
                        prop_assert_eq!(&got, &doomed);
                        left.extend(got);
                    }
                    Event::FailUnsent => {
                        let got = sorted(table.fail_unsent());
                        let doomed: Vec<u64> = model.iter().filter(|(_, e)| e.1.is_none()).map(|(r, _)| *r).collect();
                        model.retain(|_, e| e.1.is_some());
                        prop_assert_eq!(&got, &doomed);
                        left.extend(got);
                    }
                    Event::Take { request } => {
                        let got = table.take(request);
                        prop_assert_eq!(got, model.remove(&request).map(|_| request));
                        left.extend(got);
                    }
                    Event::Expire { now_ns } => {
                        let mut got = table.expire(now_ns);
                        got.sort_unstable();
                        let due: Vec<u64> = model.iter().filter(|(_, e)| e.0 <= now_ns).map(|(r, _)| *r).collect();
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
