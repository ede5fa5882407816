//! Exact counts: conservation in every load mode, an independent recount of
//! the `independent` policy through `ByteLru`, determinism, and the engine's
//! refusal of policies that break the request lifecycle.

use crate::common;

use common::closed;
use proptest::prelude::*;
use tierstack_model::{ByteLru, Storage, StorageConfig};
use tierstack_sim::{
    costs::Costs, run, Action, Actions, Arrivals, Budget, Caching, Independent, Load, Policy, Request, Served,
    SimConfig, SimError, SimReport, View,
};
use tierstack_workload::{TargetChoice, TargetChooser, Trace};

/// 60 documents of 200 B … 1 MiB, Zipf(0.8): a 2 MiB cache holds only part.
fn zipf() -> Trace {
    Trace::zipf(0.8, 60).unwrap()
}

fn check_conservation(report: &SimReport, requests: u64) {
    let t = &report.totals;
    assert_eq!(report.requests, requests, "every request ends once");
    assert_eq!(t.requests, requests, "every request reached one initial node");
    assert_eq!(t.replies, requests, "one reply each");
    assert_eq!(t.hits + t.misses, t.served, "every serve is a hit or a miss");
    assert_eq!(t.served, requests, "independent: one serve per request");
    assert_eq!(t.disk_reads, t.misses, "independent: a disk read per miss");
    assert_eq!(report.forwarded_requests, 0);
    assert!(report.messages.is_empty(), "independent nodes exchange no message");
    for n in &report.per_node {
        assert_eq!(n.hits + n.misses, n.served);
        assert_eq!(n.served, n.requests);
        assert_eq!(n.disk_reads, n.misses);
    }
    let bytes: u64 = report.per_node.iter().map(|n| n.reply_bytes).sum();
    assert_eq!(bytes, t.reply_bytes);
}

#[test]
fn counts_are_conserved_in_every_load_mode() {
    let trace = zipf();
    for choice in [TargetChoice::Fixed, TargetChoice::RoundRobin, TargetChoice::Random] {
        for new_connection in [false, true] {
            let mut config = closed(4, 12, 3_000, 2 << 20);
            config.target_choice = choice;
            config.new_connection_per_request = new_connection;
            let report = run(&config, &trace, Independent).unwrap();
            check_conservation(&report, 3_000);
            if new_connection {
                assert_eq!(report.totals.connections, 3_000);
            } else {
                assert!(report.totals.connections <= 12 * 4, "persistent: one per client and node at most");
            }
            config.load = Load::Open { rate_per_s: 5_000.0, requests: 2_000, streams: 7, arrivals: Arrivals::Poisson };
            let report = run(&config, &trace, Independent).unwrap();
            check_conservation(&report, 2_000);
        }
    }
}

#[test]
fn a_per_client_budget_issues_exactly_those_counts() {
    let mut config = closed(3, 3, 0, 2 << 20);
    config.load = Load::Closed { clients: 3, budget: Budget::PerClient(vec![5, 0, 17]) };
    let report = run(&config, &zipf(), Independent).unwrap();
    let requests: Vec<u64> = report.per_node.iter().map(|n| n.requests).collect();
    assert_eq!(requests, [5, 0, 17], "fixed targets: worker w is node w");
    check_conservation(&report, 22);
}

/// The independent recount: a node sees the documents of the requests sent to
/// it, in order; replaying them through a fresh `ByteLru` (lookup, then insert
/// after a miss) must give the simulator's counts exactly.
fn recount(sequences: &[Vec<usize>], trace: &Trace, capacity: u64) -> Vec<(u64, u64)> {
    sequences
        .iter()
        .map(|docs| {
            let mut cache = ByteLru::new(capacity);
            let (mut hits, mut misses) = (0, 0);
            for &doc in docs {
                if cache.touch(&doc) {
                    hits += 1;
                } else {
                    misses += 1;
                    cache.insert(doc, trace.documents()[doc].size_bytes);
                }
            }
            (hits, misses)
        })
        .collect()
}

fn simulated(report: &SimReport) -> Vec<(u64, u64)> {
    report.per_node.iter().map(|n| (n.hits, n.misses)).collect()
}

#[test]
fn one_client_over_many_nodes_matches_a_direct_replay() {
    // One client: requests are sequential, so node k sees exactly the
    // subsequence of the client's stream whose targets are k.
    let (nodes, requests, capacity, seed) = (8, 5_000u64, 1u64 << 20, 11);
    let trace = zipf();
    for choice in [TargetChoice::Random, TargetChoice::RoundRobin] {
        let mut config = closed(nodes, 1, requests, capacity);
        config.target_choice = choice;
        config.seed = seed;
        let report = run(&config, &trace, Independent).unwrap();
        let mut sequences = vec![Vec::new(); nodes];
        let docs = trace.stream(seed, 0, 1);
        let targets = TargetChooser::new(choice, nodes, seed, 0);
        for (doc, node) in docs.zip(targets).take(requests as usize) {
            sequences[node].push(doc);
        }
        assert_eq!(simulated(&report), recount(&sequences, &trace, capacity), "{choice:?}");
        let total_hits: u64 = report.per_node.iter().map(|n| n.hits).sum();
        assert!(total_hits > 0 && total_hits < requests, "the cache both hits and misses: {total_hits}");
    }
}

#[test]
fn one_client_per_node_matches_a_direct_replay_of_each_stream_prefix() {
    // Fixed targets, one worker per node: node k sees a prefix of worker k's
    // stream, as long as the simulator says it received.
    let (nodes, capacity, seed) = (6, 1u64 << 20, 5);
    let trace = zipf();
    let mut config = closed(nodes, nodes, 6_000, capacity);
    config.seed = seed;
    let report = run(&config, &trace, Independent).unwrap();
    let sequences: Vec<Vec<usize>> =
        (0..nodes).map(|k| trace.stream(seed, k, nodes).take(report.per_node[k].requests as usize).collect()).collect();
    assert_eq!(simulated(&report), recount(&sequences, &trace, capacity));
}

/// The node counts come from the storage `tierstack origin` serves with
/// (`tierstack_model::Storage`): a node's hits, misses, evictions, disk reads,
/// disk bytes and disk time equal those of a `Storage` fed the node's
/// sequence (the origin's `/stats` reads the same counts; see
/// `crates/origin/tests/http.rs`).
#[test]
fn the_node_counts_are_the_storages_counts() {
    let (nodes, requests, capacity, seed) = (4, 3_000u64, 1u64 << 20, 23);
    let trace = zipf();
    let mut config = closed(nodes, 1, requests, capacity);
    config.target_choice = TargetChoice::Random;
    config.seed = seed;
    config.cache_max_object_bytes = Some(200_000);
    let report = run(&config, &trace, Independent).unwrap();
    let mut storages: Vec<Storage<usize>> = (0..nodes)
        .map(|_| {
            Storage::new(StorageConfig {
                cache_bytes: capacity,
                cache_max_object_bytes: Some(200_000),
                disk: Some(config.disk),
            })
        })
        .collect();
    let pairs = trace.stream(seed, 0, 1).zip(TargetChooser::new(TargetChoice::Random, nodes, seed, 0));
    for (now, (doc, node)) in (0u64..).zip(pairs.take(requests as usize)) {
        storages[node].read(now, &doc, trace.documents()[doc].size_bytes, Caching::Normal);
    }
    for (node, (got, storage)) in report.per_node.iter().zip(&storages).enumerate() {
        let want = storage.counts();
        assert_eq!(
            (got.hits, got.misses, got.evictions, got.disk_reads, got.disk_bytes, got.disk_busy_ns),
            (want.cache_hits, want.cache_misses, want.evictions, want.disk_reads, want.disk_bytes, want.disk_busy_ns),
            "node {node}"
        );
        assert!(want.evictions > 0 && want.cache_hits > 0, "node {node} both evicts and hits: {want:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_sequential_run_matches_a_direct_replay(
        nodes in 1usize..7,
        requests in 1u64..600,
        capacity in 0u64..(3 << 20),
        seed in 0u64..1_000,
        random in any::<bool>(),
    ) {
        let trace = zipf();
        let choice = if random { TargetChoice::Random } else { TargetChoice::RoundRobin };
        let mut config = closed(nodes, 1, requests, capacity);
        config.target_choice = choice;
        config.seed = seed;
        let report = run(&config, &trace, Independent).unwrap();
        let mut sequences = vec![Vec::new(); nodes];
        let pairs = trace.stream(seed, 0, 1).zip(TargetChooser::new(choice, nodes, seed, 0));
        for (doc, node) in pairs.take(requests as usize) {
            sequences[node].push(doc);
        }
        prop_assert_eq!(simulated(&report), recount(&sequences, &trace, capacity));
    }
}

fn busy_config(seed: u64) -> SimConfig {
    let mut config = closed(8, 32, 5_000, 2 << 20);
    config.target_choice = TargetChoice::Random;
    config.seed = seed;
    config.costs = Costs::resolve("measured").unwrap();
    config
}

#[test]
fn the_same_inputs_give_a_byte_identical_report_and_another_seed_another() {
    let trace = zipf();
    let a = serde_json::to_string(&run(&busy_config(3), &trace, Independent).unwrap()).unwrap();
    let b = serde_json::to_string(&run(&busy_config(3), &trace, Independent).unwrap()).unwrap();
    assert_eq!(a, b);
    let c = run(&busy_config(4), &trace, Independent).unwrap();
    let c_json = serde_json::to_string(&c).unwrap();
    assert_ne!(a, c_json);
    let a_report = run(&busy_config(3), &trace, Independent).unwrap();
    assert_ne!(simulated(&a_report), simulated(&c), "the counts themselves differ");
    assert_eq!(a_report.text(), run(&busy_config(3), &trace, Independent).unwrap().text());
}

/// A policy that breaks the lifecycle in the way `mode` says.
struct Broken {
    mode: u8,
}

impl Policy for Broken {
    type Message = std::convert::Infallible;
    type Token = ();

    fn name(&self) -> &'static str {
        "broken"
    }

    fn on_request(&mut self, _view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        match self.mode {
            0 => out.push(Action::Serve { node: 99, request: request.id, caching: Caching::Normal, token: () }),
            1 => {}
            _ => out.push(Action::Serve { node, request: request.id, caching: Caching::Normal, token: () }),
        }
    }

    fn on_served(&mut self, _view: &View<'_>, served: Served<()>, out: &mut Actions<Self>) {
        out.push(Action::Reply { node: served.node, request: served.request.id });
        if self.mode == 2 {
            out.push(Action::Reply { node: served.node, request: served.request.id });
        }
    }
}

#[test]
fn a_policy_that_breaks_the_request_lifecycle_is_refused() {
    let trace = zipf();
    let config = closed(2, 2, 10, 1 << 20);
    let bad_node = run(&config, &trace, Broken { mode: 0 }).unwrap_err();
    assert!(matches!(&bad_node, SimError::Policy { .. }) && bad_node.to_string().contains("node 99"), "{bad_node}");
    let silent = run(&config, &trace, Broken { mode: 1 }).unwrap_err();
    assert!(matches!(silent, SimError::Unfinished { pending: 2, issued: 2, .. }), "{silent}");
    let twice = run(&config, &trace, Broken { mode: 2 }).unwrap_err();
    assert!(twice.to_string().contains("after its reply"), "{twice}");
}

#[test]
fn bad_configurations_are_typed_errors() {
    let trace = zipf();
    let mut config = closed(0, 1, 1, 0);
    assert!(run(&config, &trace, Independent).unwrap_err().to_string().contains("nodes"));
    config.nodes = 1;
    config.load = Load::Closed { clients: 0, budget: Budget::Total(1) };
    assert!(run(&config, &trace, Independent).unwrap_err().to_string().contains("clients"));
    config.load = Load::Closed { clients: 1, budget: Budget::Total(0) };
    assert!(run(&config, &trace, Independent).unwrap_err().to_string().contains("requests"));
    config.load = Load::Open { rate_per_s: f64::NAN, requests: 1, streams: 1, arrivals: Arrivals::Poisson };
    assert!(run(&config, &trace, Independent).unwrap_err().to_string().contains("rate"));
}
