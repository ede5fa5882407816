//! A circuit breaker per peer: a dead or hung service node costs one
//! bounded wait, not one per request.
//!
//! Without it an initial node forwards every request for a hung peer's
//! files and waits `forward_timeout` for each (a SIGSTOPped process is not
//! `Gone`, so the view keeps it). With it, a forward that failed or went
//! unanswered *opens* the peer's breaker: for `cool_down_ns` its requests
//! are served locally at once. After the cool-down the next forward is a
//! *probe* (half-open; only one at a time, the others are still served
//! locally): its success closes the breaker, its failure opens it for
//! another cool-down. Pure: time is passed in, nothing blocks.

/// A breaker's cool-down unless told otherwise.
pub const COOL_DOWN_MS_DEFAULT: u64 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed,
    /// Skipped until this time (ns on the caller's clock).
    Open {
        until_ns: u64,
    },
    /// A probe is in flight.
    Probing,
}

/// What the breaker says about one forward to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Forward as usual.
    Forward,
    /// Forward: it is the probe after a cool-down.
    Probe,
    /// Do not forward: serve it elsewhere (locally).
    Skip,
}

/// Counters of every breaker of a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakerCounts {
    /// Closed → open transitions (a failure while closed).
    pub opened: u64,
    /// Forwards skipped while a breaker was open or probing.
    pub skipped: u64,
    /// Probes sent after a cool-down.
    pub probes: u64,
    /// Probes that closed their breaker again.
    pub closed: u64,
}

/// One breaker per peer.
#[derive(Clone, Debug)]
pub struct Breakers {
    cool_down_ns: u64,
    states: Vec<State>,
    counts: BreakerCounts,
}

impl Breakers {
    /// Breakers for peers `0..nodes`, all closed.
    pub fn new(nodes: usize, cool_down_ns: u64) -> Breakers {
        Breakers { cool_down_ns, states: vec![State::Closed; nodes], counts: BreakerCounts::default() }
    }

    /// May a request be forwarded to `peer` at `now_ns`? A peer index out
    /// of range is skipped.
    pub fn admit(&mut self, peer: usize, now_ns: u64) -> Admit {
        let Some(state) = self.states.get_mut(peer) else { return Admit::Skip };
        match *state {
            State::Closed => Admit::Forward,
            State::Open { until_ns } if now_ns >= until_ns => {
                *state = State::Probing;
                self.counts.probes += 1;
                Admit::Probe
            }
            State::Open { .. } | State::Probing => {
                self.counts.skipped += 1;
                Admit::Skip
            }
        }
    }

    /// A forward to `peer` was answered.
    pub fn success(&mut self, peer: usize) {
        if let Some(state) = self.states.get_mut(peer) {
            if *state == State::Probing {
                self.counts.closed += 1;
            }
            // An answer to a forward sent before the breaker opened also
            // shows the peer alive again.
            *state = State::Closed;
        }
    }

    /// A forward to `peer` failed or went unanswered at `now_ns`.
    pub fn failure(&mut self, peer: usize, now_ns: u64) {
        if let Some(state) = self.states.get_mut(peer) {
            if *state == State::Closed {
                self.counts.opened += 1;
            }
            *state = State::Open { until_ns: now_ns.saturating_add(self.cool_down_ns) };
        }
    }

    /// Whether `peer`'s breaker is closed (for the view's "alive" gauge).
    pub fn is_closed(&self, peer: usize) -> bool {
        self.states.get(peer) == Some(&State::Closed)
    }

    pub fn counts(&self) -> BreakerCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_opens_for_the_cool_down_then_one_probe_decides() {
        let mut b = Breakers::new(3, 100);
        assert_eq!(b.admit(1, 0), Admit::Forward);
        b.failure(1, 10);
        assert_eq!(b.admit(1, 50), Admit::Skip, "open during the cool-down");
        assert_eq!(b.admit(2, 50), Admit::Forward, "other peers are unaffected");
        assert_eq!(b.admit(1, 110), Admit::Probe, "the first request after the cool-down probes");
        assert_eq!(b.admit(1, 111), Admit::Skip, "one probe at a time");
        b.failure(1, 200);
        assert_eq!(b.admit(1, 299), Admit::Skip, "a failed probe opens it again");
        assert_eq!(b.admit(1, 300), Admit::Probe);
        b.success(1);
        assert_eq!(b.admit(1, 301), Admit::Forward, "a good probe closes it");
        assert_eq!(b.counts(), BreakerCounts { opened: 1, skipped: 3, probes: 2, closed: 1 });
        assert!(b.is_closed(1));
        assert_eq!(b.admit(7, 0), Admit::Skip, "an unknown peer is never forwarded to");
    }

    #[test]
    fn a_late_answer_closes_an_open_breaker() {
        let mut b = Breakers::new(2, 100);
        b.failure(0, 0);
        b.success(0);
        assert_eq!(b.admit(0, 1), Admit::Forward);
        assert_eq!(b.counts().closed, 0, "not a probe");
    }
}
