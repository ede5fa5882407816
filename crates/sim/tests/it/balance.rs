//! The Fig. 8b balancing model (`tierstack_sim::balance`): cases with a
//! known answer, and determinism.

use tierstack_monitor::Policy;
use tierstack_sim::balance::{run_balance, BalanceSimConfig, BalanceSimError, BalanceSimReport, SchemeModel};
use tierstack_workload::Trace;

/// Divergent costs: 90 % of requests take 0.2 ms, 10 % take 5 ms.
fn two_point(u: f64) -> u64 {
    if u < 0.9 {
        200_000
    } else {
        5_000_000
    }
}

fn config(backends: usize, workers: usize, front_ends: usize, clients: usize) -> BalanceSimConfig {
    BalanceSimConfig {
        backends,
        workers,
        front_ends,
        clients,
        background_clients: 0,
        policy: Policy::Hash,
        scheme: None,
        warmup_requests: 500,
        requests: 5_000,
        seed: 7,
    }
}

fn sync(read_ns: u64) -> Option<SchemeModel> {
    Some(SchemeModel { name: "sync".into(), read_ns, sample_period_ns: 0 })
}

fn run(config: &BalanceSimConfig) -> BalanceSimReport {
    run_balance(config, &Trace::zipf(0.9, 64).unwrap(), two_point).unwrap()
}

fn with(base: &BalanceSimConfig, policy: Policy, scheme: Option<SchemeModel>) -> BalanceSimConfig {
    BalanceSimConfig { policy, scheme, ..base.clone() }
}

#[test]
fn with_one_back_end_every_policy_and_free_scheme_is_the_same() {
    let base = config(1, 4, 2, 9);
    let asynchronous = Some(SchemeModel { name: "async".into(), read_ns: 0, sample_period_ns: 1_000_000 });
    let reports: Vec<BalanceSimReport> = [
        with(&base, Policy::Hash, None),
        with(&base, Policy::RoundRobin, None),
        with(&base, Policy::LeastLoaded, None),
        with(&base, Policy::LeastLoaded, sync(0)),
        with(&base, Policy::LeastLoaded, asynchronous),
    ]
    .iter()
    .map(run)
    .collect();
    for report in &reports[1..] {
        assert_eq!(
            (report.throughput_rps, report.p99_us, &report.served),
            (reports[0].throughput_rps, reports[0].p99_us, &reports[0].served),
            "{}",
            report.label
        );
    }
}

#[test]
fn exact_least_loaded_with_one_client_per_worker_keeps_every_worker_busy() {
    // Known answer: N·W clients, and the one front end's estimate is exact,
    // so a freed worker's back end is always the least loaded: utilization 1.
    let base = config(4, 2, 1, 8);
    let least = run(&with(&base, Policy::LeastLoaded, sync(0)));
    assert!(least.utilization > 0.9999, "{least:?}");
    // Load-oblivious policies leave workers idle behind long requests.
    for policy in [Policy::Hash, Policy::RoundRobin] {
        let oblivious = run(&with(&base, policy, None));
        assert!(oblivious.utilization < 0.95, "{oblivious:?}");
        assert!(least.throughput_rps > oblivious.throughput_rps, "{least:?} vs {oblivious:?}");
    }
}

#[test]
fn a_back_end_serves_at_most_its_workers_at_once() {
    // Known answer: 1 ms per request, 4 back ends of 2 workers, 16 clients:
    // the cluster serves 8 at a time, 8 000 req/s, and each request waits
    // for one other (2 ms), under any policy that keeps the queues even.
    let base = BalanceSimConfig { warmup_requests: 1_000, requests: 8_000, ..config(4, 2, 1, 16) };
    let fixed = |_: f64| 1_000_000;
    let trace = Trace::zipf(0.9, 64).unwrap();
    for policy in [Policy::RoundRobin, Policy::LeastLoaded] {
        let report = run_balance(&with(&base, policy, None), &trace, fixed).unwrap();
        assert!((report.throughput_rps - 8_000.0).abs() < 1e-6, "{report:?}");
        assert_eq!((report.p50_us, report.p99_us), (2000.0, 2000.0), "{report:?}");
        assert!((report.utilization - 1.0).abs() < 1e-9, "{report:?}");
    }
}

#[test]
fn exact_free_readings_are_never_worse_than_round_robin_on_divergent_costs() {
    for (backends, front_ends) in [(2, 1), (2, 3), (8, 1), (8, 4)] {
        for seed in 1..=3 {
            let base = BalanceSimConfig { seed, ..config(backends, 4, front_ends, backends * 4) };
            let least = run(&with(&base, Policy::LeastLoaded, sync(0)));
            let round = run(&with(&base, Policy::RoundRobin, None));
            assert!(
                least.throughput_rps >= round.throughput_rps,
                "N {backends} F {front_ends} seed {seed}: {least:?} vs {round:?}"
            );
        }
    }
}

#[test]
fn readings_show_a_second_services_load_that_counting_our_own_requests_cannot() {
    // As many clients as workers, half of them a second service routed by
    // hash of Zipf documents, so some back ends carry more of it. A front
    // end counting only its own requests (least-conn) spreads evenly and
    // leaves workers idle where the second service is light; exact
    // readings see it and fill them.
    for (backends, seed) in [(2, 1), (4, 2), (8, 3)] {
        let workers = backends * 4;
        let base = BalanceSimConfig { background_clients: workers / 2, seed, ..config(backends, 4, 1, workers / 2) };
        let exact = run(&with(&base, Policy::LeastLoaded, sync(0)));
        let blind = run(&with(&base, Policy::LeastLoaded, None));
        assert!(exact.utilization > blind.utilization, "N {backends}: {exact:?} vs {blind:?}");
        assert!(exact.throughput_rps > blind.throughput_rps, "N {backends}: {exact:?} vs {blind:?}");
    }
}

#[test]
fn reads_that_wait_delay_every_request_by_one_read_per_back_end() {
    // One client, one back end of one worker, every request 1 ms: a
    // 100 µs read per back end adds N · 100 µs to each request.
    let base = BalanceSimConfig { requests: 100, warmup_requests: 0, ..config(3, 1, 1, 1) };
    let fixed = |_: f64| 1_000_000;
    let trace = Trace::zipf(0.9, 64).unwrap();
    let free = run_balance(&with(&base, Policy::LeastLoaded, sync(0)), &trace, fixed).unwrap();
    let slow = run_balance(&with(&base, Policy::LeastLoaded, sync(100_000)), &trace, fixed).unwrap();
    assert_eq!(free.p50_us, 1000.0);
    assert_eq!(slow.p50_us, 1300.0);
    assert_eq!(slow.read_wait_us, 300.0);
    assert!((free.throughput_rps / slow.throughput_rps - 1.3).abs() < 1e-9, "{free:?} {slow:?}");
}

#[test]
fn a_run_is_a_pure_function_of_its_seed() {
    let asynchronous = Some(SchemeModel { name: "async".into(), read_ns: 3_000, sample_period_ns: 10_000_000 });
    let base = with(&config(8, 4, 3, 40), Policy::LeastLoaded, asynchronous);
    let (a, b) = (run(&base), run(&base));
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    let other = run(&BalanceSimConfig { seed: 8, ..base });
    assert_ne!(a.served, other.served);
}

#[test]
fn bad_configurations_are_typed_errors() {
    let trace = Trace::zipf(0.9, 64).unwrap();
    let base = config(2, 2, 1, 4);
    for bad in [
        BalanceSimConfig { backends: 0, ..base.clone() },
        BalanceSimConfig { backends: 100_000, ..base.clone() },
        BalanceSimConfig { workers: 0, ..base.clone() },
        BalanceSimConfig { front_ends: 0, ..base.clone() },
        BalanceSimConfig { clients: 0, ..base.clone() },
        BalanceSimConfig { requests: 0, ..base.clone() },
        with(&base, Policy::Hash, sync(0)),
        with(&base, Policy::LeastLoaded, sync(u64::MAX)),
    ] {
        let error = run_balance(&bad, &trace, two_point).unwrap_err();
        assert!(matches!(error, BalanceSimError::BadConfig(_)), "{bad:?}: {error}");
    }
}
