//! Request coalescing for misses: concurrent GETs of one document share a
//! single upstream fetch instead of each loading the application server.
//!
//! Coherence is kept by validation, not by timing: a waiter serves the shared
//! result only after checking its versions itself, after its own request
//! began. If an update completed before the waiter's request started, its
//! versions were bumped before that check, so a copy generated before the
//! update fails it and the waiter fetches for itself.
//!
//! The leader's fetch is tied to the leader's request: if that client goes
//! away the fetch is dropped, the flight ends, and waiters fetch for
//! themselves.

use crate::cache::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// What a finished flight produced: a cacheable entry, or nothing usable.
type Outcome = Option<Arc<Entry>>;

/// Fetches in progress, by cache key.
#[derive(Default)]
pub(crate) struct Flights {
    in_progress: Arc<Mutex<InProgress>>,
}

type InProgress = HashMap<String, watch::Receiver<Option<Outcome>>>;

/// The role a request takes for a missing document.
pub(crate) enum Role {
    /// Fetch, then `finish` with the outcome.
    Leader(Leader),
    /// Wait for the leader's outcome.
    Waiter(watch::Receiver<Option<Outcome>>),
}

/// The request that fetches (it may outlive the request's handler: a
/// streamed body is stored after the response began). Dropping it without
/// `finish` ends the flight with no outcome.
pub(crate) struct Leader {
    flights: Arc<Mutex<InProgress>>,
    key: String,
    sender: watch::Sender<Option<Outcome>>,
}

impl Flights {
    /// Joins the flight for `key`, or starts one.
    pub(crate) fn join(&self, key: &str) -> Role {
        let Ok(mut in_progress) = self.in_progress.lock() else {
            // A poisoned map only loses coalescing: lead alone.
            let (sender, _) = watch::channel(None);
            return Role::Leader(Leader { flights: self.in_progress.clone(), key: String::new(), sender });
        };
        if let Some(receiver) = in_progress.get(key) {
            return Role::Waiter(receiver.clone());
        }
        let (sender, receiver) = watch::channel(None);
        in_progress.insert(key.to_string(), receiver);
        Role::Leader(Leader { flights: self.in_progress.clone(), key: key.to_string(), sender })
    }

    /// Flights in progress.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.in_progress.lock().map(|m| m.len()).unwrap_or(0)
    }
}

impl Leader {
    pub(crate) fn finish(self, outcome: Outcome) {
        let _ = self.sender.send(Some(outcome));
        // Drop removes the flight.
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if let Ok(mut in_progress) = self.flights.lock() {
            in_progress.remove(&self.key);
        }
    }
}

/// Waits for the leader; `None` if it ended without a usable outcome.
pub(crate) async fn outcome(mut receiver: watch::Receiver<Option<Outcome>>) -> Outcome {
    match receiver.wait_for(|v| v.is_some()).await {
        Ok(value) => value.clone().flatten(),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use hyper::header::HeaderValue;
    use tierstack_coherent::{DepsHeader, Incarnation};

    fn entry() -> Arc<Entry> {
        Arc::new(Entry::pushed(
            Bytes::from_static(b"x"),
            None,
            HeaderValue::from_static("n=0;i=0000000000000001;a=1@0"),
            DepsHeader { node: tierstack_fabric::NodeId(0), incarnation: Incarnation(1), deps: vec![] },
        ))
    }

    #[tokio::test]
    async fn waiters_get_the_leaders_outcome_and_the_flight_ends() {
        let flights = Flights::default();
        let Role::Leader(leader) = flights.join("/doc/a") else { panic!("first request leads") };
        let Role::Waiter(first) = flights.join("/doc/a") else { panic!("second request waits") };
        let Role::Waiter(second) = flights.join("/doc/a") else { panic!("third request waits") };
        assert!(matches!(flights.join("/doc/b"), Role::Leader(_)), "other documents fly alone");
        assert_eq!(flights.len(), 1, "the flight for /doc/b ended when its leader was dropped");
        let stored = entry();
        leader.finish(Some(stored.clone()));
        assert_eq!(flights.len(), 0);
        assert!(Arc::ptr_eq(&outcome(first).await.unwrap(), &stored));
        assert!(Arc::ptr_eq(&outcome(second).await.unwrap(), &stored));
        assert!(matches!(flights.join("/doc/a"), Role::Leader(_)), "a finished flight is not joined again");
    }

    #[tokio::test]
    async fn a_leader_that_goes_away_releases_its_waiters() {
        let flights = Flights::default();
        let leader = flights.join("/doc/a");
        let Role::Waiter(waiter) = flights.join("/doc/a") else { panic!("second request waits") };
        drop(leader);
        assert!(outcome(waiter).await.is_none(), "waiters fetch for themselves");
        assert_eq!(flights.len(), 0);
    }
}
