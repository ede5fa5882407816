//! The simulator's clients follow `tierstack load`'s rules: an open loop's
//! request `k` is issued at the schedule point `t_k` of the rule both share
//! (`tierstack_workload::arrival`, which `tierstack_loadgen` re-exports and
//! its `tests/modes.rs` checks a real run against), and takes the next
//! document and target of stream `k mod W`.

use crate::common;

use common::{closed, ROUND_COSTS};
use std::cell::RefCell;
use std::rc::Rc;
use tierstack_sim::{run, Action, Actions, Arrivals, Caching, Costs, Load, Policy, Request, Served, View};
use tierstack_workload::arrival::ArrivalSchedule;
use tierstack_workload::{TargetChoice, TargetChooser, Trace};

/// A request as the policy first saw it: (id, time, initial node, document).
type Seen = (u64, u64, usize, usize);

/// Serves every request where it arrived, after writing down when the
/// policy first saw it, where and for what.
struct Recorder {
    seen: Rc<RefCell<Vec<Seen>>>,
}

impl Policy for Recorder {
    type Message = std::convert::Infallible;
    type Token = ();

    fn name(&self) -> &'static str {
        "recorder"
    }

    fn on_request(&mut self, view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        self.seen.borrow_mut().push((request.id.0, view.now_ns(), request.initial, request.doc));
        out.push(Action::Serve { node, request: request.id, caching: Caching::Normal, token: () });
    }

    fn on_served(&mut self, _view: &View<'_>, served: Served<()>, out: &mut Actions<Self>) {
        out.push(Action::Reply { node: served.node, request: served.request.id });
    }
}

#[test]
fn an_open_loop_issues_request_k_at_t_k_with_stream_k_mod_w() {
    // Enough cores that a parse never queues, and a new connection per
    // request, so every request reaches its policy a fixed time after it
    // was issued: connect + one-way latency + the request's bytes + the
    // connection's setup + the parse.
    let costs = Costs::parse(&ROUND_COSTS.replace("cores = 1", "cores = 256"), "many cores").unwrap();
    let net = &costs.client_network;
    let after_issue_ns = net.connect_ns
        + net.latency_ns
        + net.request_bytes * 1_000_000_000 / net.bandwidth_bytes_per_s
        + costs.cpu.connection_setup_ns
        + costs.cpu.request_ns;
    let trace = Trace::zipf(0.8, 60).unwrap();
    let (nodes, streams, requests) = (3, 4, 400u64);
    for arrivals in [Arrivals::Constant, Arrivals::Poisson] {
        for (rate, seed) in [(200.0, 1), (1_000.0, 42), (5_000.0, u64::MAX)] {
            let mut config = closed(nodes, 1, 1, 1 << 20);
            config.costs = costs.clone();
            config.new_connection_per_request = true;
            config.target_choice = TargetChoice::Random;
            config.seed = seed;
            config.load = Load::Open { rate_per_s: rate, requests, streams, arrivals };
            let seen = Rc::new(RefCell::new(Vec::new()));
            let report = run(&config, &trace, Recorder { seen: Rc::clone(&seen) }).unwrap();
            assert_eq!(report.requests, requests);
            let mut seen = seen.take();
            seen.sort_unstable();

            let mut docs: Vec<_> = (0..streams).map(|w| trace.stream(seed, w, streams)).collect();
            let mut targets: Vec<_> =
                (0..streams).map(|w| TargetChooser::new(TargetChoice::Random, nodes, seed, w)).collect();
            let schedule = ArrivalSchedule::new(arrivals, rate, seed);
            let expected: Vec<Seen> = (0..requests)
                .zip(schedule)
                .map(|(k, t_k)| {
                    // The documented rule, written out: stream k mod W.
                    let w = (k % streams as u64) as usize;
                    (k, t_k + after_issue_ns, targets[w].next().unwrap(), docs[w].next().unwrap())
                })
                .collect();
            assert_eq!(seen, expected, "{arrivals:?} at {rate}/s, seed {seed}");
        }
    }
}
