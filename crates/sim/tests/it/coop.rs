//! The cooperative caching policy in the simulator: every request ends,
//! the counts are the model's for the same request order, one-sided reads
//! appear only for the one-sided schemes, and bad configurations are refused.

use crate::common;

use common::closed;
use tierstack_coop::{Model, ModelConfig, Scheme};
use tierstack_sim::coop::{Coop, CoopSim};
use tierstack_sim::{run, run_named, PolicyName};
use tierstack_workload::{TargetChoice, TraceSpec};

const PROXIES: usize = 2;
const BACKENDS: usize = 2;

fn trace() -> tierstack_workload::Trace {
    TraceSpec::parse("coop:16k@0.02", 0.0, 0).unwrap().build(1).unwrap()
}

fn sim(scheme: Scheme, cache_bytes: u64) -> CoopSim {
    CoopSim {
        scheme,
        proxies: PROXIES,
        backends: BACKENDS,
        cache_bytes,
        lookup_ns: 2_500,
        lookup_fixed_ns: 0,
        announce_bytes: 0,
        miss_cpu_ns: 10_000,
    }
}

#[test]
fn one_client_gives_exactly_the_models_counts() {
    let trace = trace();
    let cache = trace.cache_bytes_per_node().unwrap();
    for name in ["ac", "bcc", "ccwr", "mtacc", "hybcc", "groupcache"] {
        let scheme: Scheme = name.parse().unwrap();
        let mut config = closed(PROXIES + BACKENDS, 1, 3_000, 0);
        config.client_nodes = Some(PROXIES);
        config.target_choice = TargetChoice::RoundRobin;
        let report = run(&config, &trace, Coop::new(sim(scheme, cache)).unwrap()).unwrap();
        assert_eq!(report.requests, 3_000);
        // One request at a time, round-robin from node 0: replay it.
        let pages = (cache / tierstack_coop::PAGE_BYTES) as u32;
        let mut model =
            Model::new(ModelConfig { scheme, active: PROXIES, passive: BACKENDS, pages_per_node: pages }).unwrap();
        for (i, doc) in trace.stream(config.seed, 0, 1).take(3_000).enumerate() {
            model.request(i % PROXIES, doc as u64, trace.documents()[doc].size_bytes).unwrap();
        }
        let c = |k: &str| report.policy_counters.get(k).copied().unwrap_or(0);
        let s = model.stats();
        assert_eq!(
            (c("coop_local_hits"), c("coop_remote_hits"), c("coop_misses")),
            (s.local_hits, s.remote_hits, s.misses),
            "{name}"
        );
        for (kind, n) in &model.tally().messages {
            assert_eq!(c(&format!("coop_msg_{}", kind.name())), *n, "{name}: {kind:?}");
        }
        // Clients only ever reached the proxies.
        assert!(report.per_node[PROXIES..].iter().all(|n| n.requests == 0), "{name}");
        let one_sided = report.messages.contains_key("data-read");
        assert_eq!(one_sided, !matches!(name, "ac" | "groupcache"), "{name}: {:?}", report.messages.keys());
        // Every miss read a web server's disk, and nothing else did.
        let disk_reads: u64 = report.per_node.iter().map(|n| n.disk_reads).sum();
        assert_eq!(disk_reads, s.misses, "{name}");
    }
}

#[test]
fn cooperation_beats_independent_caches_when_the_working_set_fits_only_together() {
    // 16k-trace on 2 proxies + 2 web servers: the working set (about 156 MiB
    // at full scale) fits MTACC's 4 × 64 MiB but not one proxy's 64 MiB.
    let trace = trace();
    let cache = trace.cache_bytes_per_node().unwrap();
    let tps = |name: &str| {
        let mut config = closed(PROXIES + BACKENDS, 16, 4_000, 0);
        config.client_nodes = Some(PROXIES);
        let mut policy = Coop::new(sim(name.parse().unwrap(), cache)).unwrap();
        policy.warm_up(&trace, 99, 4_000);
        run(&config, &trace, policy).unwrap().throughput_per_s
    };
    let (ac, mtacc) = (tps("ac"), tps("mtacc"));
    assert!(mtacc > 1.2 * ac, "mtacc {mtacc:.0} vs ac {ac:.0}");
}

#[test]
fn coop_policies_need_web_servers_and_parse_by_name() {
    let trace = trace();
    let mut config = closed(2, 1, 10, 1 << 20);
    config.client_nodes = Some(2);
    let policy: PolicyName = "coop:ccwr".parse().unwrap();
    assert!(run_named(policy, &config, &trace).is_err());
    config.nodes = 3;
    assert_eq!(run_named(policy, &config, &trace).unwrap().requests, 10);
    assert!("coop:lru".parse::<PolicyName>().is_err());
    config.client_nodes = Some(4);
    assert!(run_named(policy, &config, &trace).is_err(), "client nodes beyond the cluster");
}

/// The service announces every change of a node's contents to every other
/// member (issue 34): with `announce_bytes` set, the simulator sends exactly
/// one announce per changed node per decision to each other member (counted
/// by replaying the model), so more members mean more announces; with 0,
/// and for AC and groupcache, none.
#[test]
fn announces_are_charged_per_change_to_every_other_member() {
    let trace = trace();
    let cache = trace.cache_bytes_per_node().unwrap();
    let requests = 2_000;
    let announces = |scheme: Scheme, proxies: usize, bytes: u64| -> (u64, u64) {
        let mut config = closed(proxies + BACKENDS, 1, requests, 0);
        config.client_nodes = Some(proxies);
        config.target_choice = TargetChoice::RoundRobin;
        let sim = CoopSim { proxies, announce_bytes: bytes, ..sim(scheme, cache) };
        let report = run(&config, &trace, Coop::new(sim).unwrap()).unwrap();
        let counted = report.messages.get("announce").map_or(0, |m| m.messages);
        // The model's replay: every node whose contents changed tells every other member.
        let pages = (cache / tierstack_coop::PAGE_BYTES) as u32;
        let mut model =
            Model::new(ModelConfig { scheme, active: proxies, passive: BACKENDS, pages_per_node: pages }).unwrap();
        let members = proxies + if scheme.uses_passive() { BACKENDS } else { 0 };
        let mut expected = 0;
        for (i, doc) in trace.stream(config.seed, 0, 1).take(requests as usize).enumerate() {
            let before: Vec<u64> = (0..members).map(|n| model.changes(n)).collect();
            model.request(i % proxies, doc as u64, trace.documents()[doc].size_bytes).unwrap();
            let changed = (0..members).filter(|&n| model.changes(n) != before[n]).count() as u64;
            expected += changed * (members as u64 - 1);
        }
        (counted, expected)
    };
    for scheme in ["bcc", "ccwr", "mtacc"] {
        let scheme: Scheme = scheme.parse().unwrap();
        let (two, two_expected) = announces(scheme, 2, 100);
        let (four, four_expected) = announces(scheme, 4, 100);
        assert_eq!(two, two_expected, "{scheme:?} on 2 proxies");
        assert_eq!(four, four_expected, "{scheme:?} on 4 proxies");
        assert!(two > 0 && four > two, "{scheme:?}: {two} announces on 2 proxies, {four} on 4");
        assert_eq!(announces(scheme, 2, 0).0, 0, "{scheme:?}: not charged when off");
    }
    for scheme in [Scheme::Ac, Scheme::Groupcache] {
        assert_eq!(announces(scheme, 2, 100).0, 0, "{scheme:?} announces nothing");
    }
}
