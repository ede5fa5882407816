//! Adaptive push-pull end to end: the module, an application server that
//! pushes completed updates, and two proxies as processes; the load client,
//! the updater and the staleness checker in this process. Caches are small,
//! so pushes race with evictions; updates come every few milliseconds, so
//! pushes race with newer updates. Nothing stale may ever be served.
//! The same holds in write-through mode (pushes made before UPDATE_DONE,
//! the update waiting for them, bounded), with a proxy dying too.

use crate::{exe, start_deployment};
use serde_json::Value;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_loadgen::{run, LoadConfig, LoadReport};
use tierstack_proxy::ProxyStats;
use tierstack_workload::Trace;

/// Zipf sizes span 200 B to 1 MiB geometrically; with 100 documents the
/// ones that fit a 64 KiB cache's 8 KiB entry bound add up to more than the
/// cache, so caches evict (with 20, they would all fit).
const DOCS: usize = 100;

fn deploy(backend: Backend, options: DeploymentOptions) -> Deployment {
    let config = DeploymentConfig {
        exe: exe(),
        backend,
        mode: "poll".into(),
        proxies: 2,
        compute_threads: 0,
        documents: "zipf".into(),
        docs: DOCS,
        seed: 1,
        pin: false,
    };
    start_deployment(&config, &options, &ExtraArgs::default())
}

fn options(policy: &str, cache_bytes: usize) -> DeploymentOptions {
    DeploymentOptions {
        push_policy: Some(policy.into()),
        proxy_cache_bytes: Some(cache_bytes),
        state_slots: None,
        ..Default::default()
    }
}

fn load(targets: &[String], app_url: &str, requests: u64) -> LoadReport {
    let mut config = LoadConfig::new(targets[0].clone(), Trace::zipf(0.9, DOCS).unwrap());
    config.targets = targets.to_vec();
    config.update_target = Some(app_url.to_string());
    config.connections = 4;
    config.duration_ms = None;
    config.requests_max = Some(requests);
    config.update_interval_ms = 4;
    config.keep_records = true;
    config.check_bodies = true;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(config)).unwrap()
}

fn sum(stats: &[Value], field: &str) -> u64 {
    stats.iter().map(|s| s[field].as_u64().unwrap()).sum()
}

fn assert_coherent(what: &str, report: &LoadReport) {
    assert_eq!(report.stale_responses, 0, "{what}: stale responses served: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0), "{what}: offline recount");
    assert_eq!(report.ok, report.requests, "{what}: errors {:?}", report.errors);
    assert!(report.accounted(), "{what}: every request accounted for");
    assert_eq!(report.bodies_checked, report.checked_ok, "{what}: every body checked (pushed ones too)");
    assert!(
        report.updates.done >= 50,
        "{what}: the updater ran ({} updates, {:?})",
        report.updates.done,
        report.updates
    );
    assert_eq!(report.updates.errors.total(), 0, "{what}: updates failed: {:?}", report.updates.errors);
}

/// Every proxy's counters add up (`ProxyStats::accounting_error`) once the
/// pushes the last updates started have landed: the identities hold when
/// nothing is in flight, so they are polled until then (bounded).
fn assert_proxies_account_for_everything(what: &str, deployment: &Deployment) {
    let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(20);
    loop {
        let stats: Vec<ProxyStats> = deployment.proxy_stats().unwrap();
        let errors: Vec<String> = stats.iter().filter_map(ProxyStats::accounting_error).collect();
        if errors.is_empty() {
            return;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "{what}: proxies' counters do not add up: {errors:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Write-through's bound on an update's wait in these tests.
const WRITE_THROUGH_BOUND: std::time::Duration = std::time::Duration::from_millis(500);

fn write_through(policy: &str, cache_bytes: usize) -> DeploymentOptions {
    DeploymentOptions { write_through: Some(WRITE_THROUGH_BOUND), ..options(policy, cache_bytes) }
}

fn pushes_stay_coherent(backend: Backend, policy: &str) {
    pushes_stay_coherent_with(backend, policy, options(policy, 64 << 10));
}

fn pushes_stay_coherent_with(backend: Backend, policy: &str, options: DeploymentOptions) -> Value {
    let what = format!("{} {policy} write-through {:?}", backend.name(), options.write_through);
    let deployment = deploy(backend, options);
    let report = load(&deployment.proxy_urls, &deployment.app_url, 5000);
    assert_coherent(&what, &report);
    assert_proxies_account_for_everything(&what, &deployment);
    let stats: Vec<Value> = deployment.proxy_stats().unwrap();
    let app: Value = deployment.app_stats().unwrap();
    let push = &app["push"];
    assert_eq!(push["policy"].as_str(), Some(policy));
    assert!(push["state_reads"].as_u64().unwrap() > 0, "{what}: the server read cache states: {push}");
    assert!(sum(&stats, "pushes_installed") > 0, "{what}: pushes were installed: {stats:?}");
    assert!(sum(&stats, "push_hits") > 0, "{what}: pushed copies served hits: {stats:?}");
    assert!(sum(&stats, "evictions") > 0, "{what}: pushes raced with evictions: {stats:?}");
    assert!(sum(&stats, "checks") >= report.cache_hits, "{what}: every hit, pushed or fetched, was validated");
    assert_eq!(sum(&stats, "pushes_refused"), 0, "{what}: every push was well-formed: {stats:?}");
    deployment.stop().unwrap();
    app
}

#[test]
fn push_serves_nothing_stale_on_shm() {
    pushes_stay_coherent(Backend::Shm, "push");
}

#[test]
fn push_serves_nothing_stale_on_tcp() {
    pushes_stay_coherent(Backend::Tcp, "push");
}

#[test]
fn hybrid_serves_nothing_stale_on_tcp() {
    pushes_stay_coherent(Backend::Tcp, "hybrid:0.5");
}

#[test]
fn useful_serves_nothing_stale_on_shm() {
    pushes_stay_coherent(Backend::Shm, "useful:0.5");
}

#[test]
fn write_through_serves_nothing_stale_on_shm() {
    let app = pushes_stay_coherent_with(Backend::Shm, "push", write_through("push", 64 << 10));
    let push = &app["push"];
    assert_eq!(push["write_through"], true, "{push}");
    assert!(push["write_through_updates"].as_u64().unwrap() >= 50, "updates waited for their pushes: {push}");
}

#[test]
fn write_through_serves_nothing_stale_on_tcp() {
    let app = pushes_stay_coherent_with(Backend::Tcp, "hybrid:0.5", write_through("hybrid:0.5", 64 << 10));
    assert!(app["push"]["write_through_updates"].as_u64().unwrap() >= 50, "{}", app["push"]);
}

#[test]
fn pull_pushes_nothing_and_wastes_nothing() {
    let deployment = deploy(Backend::Shm, options("pull", 256 << 10));
    let report = load(&deployment.proxy_urls, &deployment.app_url, 2000);
    assert_coherent("pull", &report);
    let stats: Vec<Value> = deployment.proxy_stats().unwrap();
    assert_eq!(sum(&stats, "pushes_received"), 0);
    assert_eq!(sum(&stats, "wasted_updates"), 0);
    assert!(sum(&stats, "stale_dropped") > 0, "updates invalidated copies, which pull re-fetches on a miss");
    deployment.stop().unwrap();
}

fn dead_proxy_is_skipped(backend: Backend) {
    dead_proxy_is_skipped_with(backend, options("push", 256 << 10), 1);
}

/// Returns the application server's push counters at the end.
/// `scale` multiplies the requests of each phase (write-through updates
/// take longer, and each phase needs enough of them).
fn dead_proxy_is_skipped_with(backend: Backend, options: DeploymentOptions, scale: u64) -> Value {
    let what = format!("{} dead proxy, write-through {:?}", backend.name(), options.write_through);
    let mut deployment = deploy(backend, options);
    let warm = load(&deployment.proxy_urls, &deployment.app_url, 1000 * scale);
    assert_coherent(&what, &warm);
    let before: Value = deployment.app_stats().unwrap();
    deployment.stop_proxy(1).unwrap();
    let report = load(&deployment.proxy_urls[..1], &deployment.app_url, 3000 * scale);
    assert_coherent(&what, &report);
    let after: Value = deployment.app_stats().unwrap();
    let delta = |field: &str| after["push"][field].as_u64().unwrap() - before["push"][field].as_u64().unwrap();
    assert!(
        delta("state_read_errors") + delta("pushes_failed") > 0,
        "{what}: pushes to the dead proxy were skipped and counted: {}",
        after["push"]
    );
    let live: Value = deployment.proxy_stats_at(0).unwrap();
    assert!(live["pushes_installed"].as_u64().unwrap() > 0, "{what}: the live proxy still gets pushes");
    deployment.stop().unwrap();
    after["push"].clone()
}

#[test]
fn a_dead_proxy_is_skipped_on_shm() {
    dead_proxy_is_skipped(Backend::Shm);
}

#[test]
fn a_dead_proxy_is_skipped_on_tcp() {
    dead_proxy_is_skipped(Backend::Tcp);
}

/// A dead proxy never holds a write-through update up: every update of
/// the run completed (`assert_coherent`: at least 50, none failed) and
/// each waited for its pushes at most the bound (timeouts are counted).
fn write_through_survives_a_dead_proxy(backend: Backend) {
    let push = dead_proxy_is_skipped_with(backend, write_through("push", 256 << 10), 3);
    let updates = push["write_through_updates"].as_u64().unwrap();
    let timeouts = push["write_through_timeouts"].as_u64().unwrap();
    assert!(updates >= 100, "{push}");
    eprintln!("write-through with a dead proxy: {push}");
    assert!(timeouts <= updates, "{push}");
}

#[test]
fn write_through_survives_a_dead_proxy_on_shm() {
    write_through_survives_a_dead_proxy(Backend::Shm);
}

#[test]
fn write_through_survives_a_dead_proxy_on_tcp() {
    write_through_survives_a_dead_proxy(Backend::Tcp);
}

/// The version in a self-checking body's first line (`doc=<name> version=<v> …`).
fn body_version(body: &str) -> u64 {
    let line = body.lines().next().unwrap();
    let word = line.split_whitespace().find_map(|w| w.strip_prefix("version=")).unwrap();
    word.parse().unwrap()
}

/// Updates the most popular document `rounds` times; after each update
/// answers, a GET through every proxy. Returns the summed proxy counters'
/// growth (hits, misses, push hits) over the rounds.
fn gets_after_updates(options: DeploymentOptions, rounds: u64) -> (u64, u64, u64) {
    let deployment = deploy(Backend::Shm, options);
    let trace = Trace::zipf(0.9, DOCS).unwrap();
    let path = trace.documents()[0].path();
    deployment.warm_up(std::slice::from_ref(&path)).unwrap();
    let before: Vec<ProxyStats> = deployment.proxy_stats().unwrap();
    let mut last = 0;
    for round in 0..rounds {
        deployment.update(&path).unwrap();
        let versions: Vec<u64> = deployment
            .proxy_urls
            .iter()
            .map(|url| {
                let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
                let (code, body) = tierstack_deploy::deployment::get(addr, &path).unwrap();
                assert_eq!(code, 200, "round {round}: {body}");
                body_version(&body)
            })
            .collect();
        assert!(versions.iter().all(|&v| v == versions[0] && v > last), "round {round}: {versions:?} after {last}");
        last = versions[0];
    }
    let after: Vec<ProxyStats> = deployment.proxy_stats().unwrap();
    deployment.stop().unwrap();
    let growth = |f: fn(&ProxyStats) -> u64| after.iter().map(f).sum::<u64>() - before.iter().map(f).sum::<u64>();
    (growth(|p| p.hits), growth(|p| p.misses), growth(|p| p.push_hits))
}

/// Write-through's promise: a proxy holding a document has the new
/// version when the update answers, so the first request after it is a
/// validated hit on the pushed copy, never a miss. (Without write-through
/// the push lands after the answer and these requests miss: seen failing.)
#[test]
fn write_through_leaves_no_miss_after_an_update() {
    let rounds = 10;
    let (hits, misses, push_hits) = gets_after_updates(write_through("push", 256 << 10), rounds);
    assert_eq!(misses, 0, "a request after a write-through update missed");
    assert_eq!((hits, push_hits), (2 * rounds, 2 * rounds), "every request hit a pushed copy");
}

#[test]
fn full_cache_states_and_caches_refuse_pushes_without_staleness() {
    // 8 slots (one bucket) track 8 of the 100 documents; a 64 KiB cache takes
    // entries of at most 8 KiB. Documents untracked or never cached are not
    // pushed (a 507 for a push too large is tested in the proxy's unit tests).
    let options = DeploymentOptions {
        push_policy: Some("push".into()),
        proxy_cache_bytes: Some(64 << 10),
        state_slots: Some(8),
        ..Default::default()
    };
    let deployment = deploy(Backend::Shm, options);
    let report = load(&deployment.proxy_urls, &deployment.app_url, 4000);
    assert_coherent("full", &report);
    let stats: Vec<Value> = deployment.proxy_stats().unwrap();
    assert!(stats.iter().all(|s| s["cache_state_slots"] == 8));
    let app: Value = deployment.app_stats().unwrap();
    let push = &app["push"];
    assert!(
        push["decided_not_cached"].as_u64().unwrap() > 0,
        "untracked or uncached documents were not pushed: {push}"
    );
    deployment.stop().unwrap();
}
