//! The wasted-update metric (coherency paper §5.3): a push of a document to
//! a proxy is **wasted** if the next push of that document to that proxy
//! arrives with no request for the document in between — the first push
//! served nobody.
//!
//! [`WasteTracker`] is the pure per-proxy bookkeeping: the set of documents
//! pushed and not requested since. It is bounded; documents beyond the bound
//! are not tracked (counted in [`WasteTracker::untracked`]), so the metric
//! can only under-count, never invent waste.

use std::collections::HashSet;

/// Documents tracked by default (pushed and not yet requested).
pub const TRACKED_DEFAULT: usize = 65_536;

#[derive(Debug)]
pub struct WasteTracker {
    unused: HashSet<u64>,
    capacity: usize,
    pushes: u64,
    wasted: u64,
    untracked: u64,
}

impl Default for WasteTracker {
    fn default() -> Self {
        Self::new(TRACKED_DEFAULT)
    }
}

impl WasteTracker {
    pub fn new(capacity: usize) -> Self {
        Self { unused: HashSet::new(), capacity, pushes: 0, wasted: 0, untracked: 0 }
    }

    /// A push of `fingerprint` arrived. Returns true if it makes the
    /// previous push of the document a wasted update.
    pub fn on_push(&mut self, fingerprint: u64) -> bool {
        self.pushes += 1;
        if self.unused.contains(&fingerprint) {
            self.wasted += 1;
            return true;
        }
        if self.unused.len() >= self.capacity {
            self.untracked += 1;
        } else {
            self.unused.insert(fingerprint);
        }
        false
    }

    /// A request for `fingerprint` arrived (hit or miss).
    pub fn on_request(&mut self, fingerprint: u64) {
        if !self.unused.is_empty() {
            self.unused.remove(&fingerprint);
        }
    }

    pub fn pushes(&self) -> u64 {
        self.pushes
    }

    pub fn wasted(&self) -> u64 {
        self.wasted
    }

    /// Pushes not tracked because the tracker was full.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// Documents pushed and not requested since.
    pub fn pending(&self) -> usize {
        self.unused.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_the_papers_definition() {
        // Events per document: P = push, R = request. Wasted pushes: a P
        // followed by another P with no R between.
        let cases: &[(&str, u64)] =
            &[("", 0), ("P", 0), ("PP", 1), ("PPP", 2), ("PRP", 0), ("PRPP", 1), ("RRPRRPPRP", 1), ("PPRPP", 2)];
        for (events, expected) in cases {
            let mut tracker = WasteTracker::default();
            for event in events.chars() {
                match event {
                    'P' => {
                        tracker.on_push(7);
                    }
                    _ => tracker.on_request(7),
                }
            }
            assert_eq!(tracker.wasted(), *expected, "events {events}");
        }
    }

    #[test]
    fn documents_are_independent_and_the_bound_holds() {
        let mut tracker = WasteTracker::new(2);
        assert!(!tracker.on_push(1));
        assert!(!tracker.on_push(2));
        tracker.on_request(2);
        assert!(!tracker.on_push(3));
        assert!(!tracker.on_push(4), "beyond the bound: not tracked");
        assert_eq!(tracker.untracked(), 1);
        assert!(tracker.on_push(1), "1 was never requested");
        assert_eq!((tracker.pushes(), tracker.wasted(), tracker.pending()), (5, 1, 2));
    }

    proptest! {
        /// Against a model that keeps the whole event history per document.
        #[test]
        fn matches_a_history_model(events in proptest::collection::vec((any::<bool>(), 0u64..5), 0..200)) {
            let mut tracker = WasteTracker::default();
            let mut history: Vec<Vec<bool>> = vec![Vec::new(); 5];
            for (push, doc) in &events {
                if *push { tracker.on_push(*doc); } else { tracker.on_request(*doc); }
                history[*doc as usize].push(*push);
            }
            let expected: u64 = history.iter().map(|h| h.windows(2).filter(|w| w[0] && w[1]).count() as u64).sum();
            prop_assert_eq!(tracker.wasted(), expected);
        }
    }
}
