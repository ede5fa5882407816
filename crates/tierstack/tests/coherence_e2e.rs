//! Strong coherence end to end: the application module, the application
//! server and two proxies as separate processes, the load client and the
//! updater in this process, on both fabric backends.

use serde_json::Value;
use std::path::PathBuf;
use tierstack_bench::deploy::{Deployment, DeploymentConfig};
use tierstack_cluster::Backend;
use tierstack_loadgen::{run, LoadConfig, LoadReport};
use tierstack_workload::Trace;

fn deploy(backend: Backend, mode: &str) -> Deployment {
    Deployment::start(&DeploymentConfig {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_tierstack")),
        backend,
        mode: mode.into(),
        proxies: 2,
        compute_threads: 0,
        documents: "zipf".into(),
        docs: 5,
        seed: 1,
        pin: false,
    })
    .unwrap()
}

fn load(deployment: &Deployment, requests: u64) -> LoadReport {
    let mut config = LoadConfig::new(deployment.proxy_urls[0].clone(), Trace::zipf(0.9, 5).unwrap());
    config.targets = deployment.proxy_urls.clone();
    config.update_target = Some(deployment.app_url.clone());
    config.connections = 4;
    config.duration_ms = None;
    config.requests_max = Some(requests);
    config.update_interval_ms = 5;
    config.keep_records = true;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(config)).unwrap()
}

fn sum(stats: &[Value], field: &str) -> u64 {
    stats.iter().map(|s| s[field].as_u64().unwrap()).sum()
}

fn poll_is_strongly_coherent(backend: Backend) {
    let deployment = deploy(backend, "poll");
    let report = load(&deployment, 4000);
    let stats: Vec<Value> = deployment.proxy_stats().unwrap();
    let name = backend.name();
    assert_eq!(report.stale_responses, 0, "{name}: stale responses served: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0), "{name}: offline recount");
    assert_eq!(report.errors.missing_deps + report.errors.malformed_deps, 0, "{name}: every response carries versions");
    assert_eq!(report.ok, report.requests, "{name}: errors {:?}", report.errors);
    assert!(report.updates.done >= 20, "{name}: the updater ran ({} updates)", report.updates.done);
    assert!(report.cache_hits > 0, "{name}: the cache served hits");
    assert!(sum(&stats, "checks") >= report.cache_hits, "{name}: every hit was validated");
    assert!(sum(&stats, "stale_dropped") > 0, "{name}: updates invalidated cached copies");
    assert_eq!(sum(&stats, "check_errors"), 0, "{name}: version checks succeeded");
    deployment.stop().unwrap();
}

#[test]
fn poll_mode_serves_nothing_stale_on_shm() {
    poll_is_strongly_coherent(Backend::Shm);
}

#[test]
fn poll_mode_serves_nothing_stale_on_tcp() {
    poll_is_strongly_coherent(Backend::Tcp);
}

#[test]
fn the_checker_catches_staleness_when_coherence_is_off() {
    let deployment = deploy(Backend::Shm, "ttl");
    let report = load(&deployment, 4000);
    assert!(report.updates.done >= 20);
    assert!(report.stale_responses > 0, "ttl mode never revalidates, so stale copies must be caught");
    assert_eq!(report.stale_responses_offline, Some(report.stale_responses));
    deployment.stop().unwrap();
}

#[test]
fn no_cache_mode_forwards_everything_and_is_coherent() {
    let deployment = deploy(Backend::Shm, "no-cache");
    let report = load(&deployment, 1000);
    assert_eq!(report.cache_hits, 0);
    assert_eq!(report.stale_responses, 0);
    let app: Value = deployment.app_stats().unwrap();
    assert!(app["reads"].as_u64().unwrap() >= report.ok, "every read reached the application server");
    deployment.stop().unwrap();
}
