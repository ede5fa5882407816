//! Updates that publish their page (issue 31) end to end: the module with
//! `--versions-at done`, an application server with `--publish`, and
//! proxies without refresh, as processes, on shm and tcp. After an update,
//! the first GET of the document is a hit of the published page, read
//! one-sidedly, with no request reaching the application server; under
//! reads racing updates, a module restart and pages evicting each other,
//! nothing stale is served and every body checks.

use crate::{exe, start_deployment};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{strings, Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_loadgen::{run, run_with, LiveStats, LoadConfig, LoadReport};
use tierstack_proxy::ProxyStats;
use tierstack_testkit::http;
use tierstack_workload::Trace;

const DOCS: usize = 5;

fn deploy(backend: Backend, proxies: u32, module: &[&str]) -> Deployment {
    let config = DeploymentConfig {
        exe: exe(),
        backend,
        mode: "poll".into(),
        proxies,
        compute_threads: 0,
        documents: "zipf".into(),
        docs: DOCS,
        seed: 1,
        pin: false,
    };
    let mut app_module = strings(&["--versions-at", "done"]);
    app_module.extend(strings(module));
    let extra = ExtraArgs { app_module, app_server: strings(&["--publish"]), proxy: strings(&["--refresh-hot", "0"]) };
    start_deployment(&config, &DeploymentOptions::default(), &extra)
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

fn load_config(deployment: &Deployment) -> LoadConfig {
    let mut config = LoadConfig::new(deployment.proxy_urls[0].clone(), Trace::zipf(0.9, DOCS).unwrap());
    config.targets = deployment.proxy_urls.clone();
    config.update_target = Some(deployment.app_url.clone());
    config.connections = 4;
    config.update_interval_ms = 5;
    config.keep_records = true;
    config.check_bodies = true;
    config
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn assert_coherent(report: &LoadReport, what: &str) {
    assert_eq!(report.stale_responses, 0, "{what}: stale responses served: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0), "{what}: offline recount");
    assert!(report.accounted(), "{what}: {} requests, errors {:?}", report.requests, report.errors);
    assert_eq!(report.bodies_checked, report.checked_ok, "{what}: every body checked");
    let e = &report.errors;
    assert_eq!(e.body_mismatch + e.deps_wrong_key + e.missing_deps + e.malformed_deps, 0, "{what}: {e:?}");
}

/// The proxies' counters once they add up (requests in flight ended).
fn settled(deployment: &Deployment) -> Vec<ProxyStats> {
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
    loop {
        let stats = deployment.settled_proxy_stats().unwrap();
        let errors: Vec<_> = stats.iter().filter_map(ProxyStats::accounting_error).collect();
        if errors.is_empty() {
            return stats;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "the proxies' counters do not add up: {errors:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn the_first_get_after_an_update_is_a_hit_of_the_published_page(backend: Backend) {
    let deployment = deploy(backend, 1, &[]);
    let proxy = addr(&deployment.proxy_urls[0]);
    let path = Trace::zipf(0.9, DOCS).unwrap().documents()[0].path();
    let first = http::get(proxy, &path).unwrap();
    assert_eq!((first.status, first.header("x-cache")), (200, Some("MISS")));
    let old_deps = first.header("x-tierstack-deps").unwrap().to_string();
    assert_eq!(http::get(proxy, &path).unwrap().header("x-cache"), Some("HIT"));
    let reads_before = deployment.app_stats::<Value>().unwrap()["reads"].as_u64().unwrap();

    deployment.update(&path).unwrap();
    let after = http::get(proxy, &path).unwrap();
    let new_deps = after.header("x-tierstack-deps").unwrap().to_string();
    assert_eq!((after.status, after.header("x-cache")), (200, Some("HIT")), "{}", backend.name());
    assert_ne!(new_deps, old_deps, "the new version");
    let version = tierstack_coherent::DepsHeader::parse(&new_deps).unwrap().deps[0].version;
    let body = String::from_utf8_lossy(&after.body).to_string();
    let first_line = body.lines().next().unwrap_or_default().to_string();
    assert!(first_line.contains(&format!(" version={version} ")), "the page of the new version: {first_line}");

    let app = deployment.app_stats::<Value>().unwrap();
    assert_eq!(app["reads"].as_u64(), Some(reads_before), "no GET reached the application server");
    assert_eq!((app["pages_published"].as_u64(), app["pages_unpublished"].as_u64()), (Some(1), Some(0)));
    let stats = settled(&deployment).remove(0);
    assert_eq!((stats.pages_installed, stats.misses), (1, 1), "{stats:?}");
    deployment.stop().unwrap();
}

#[test]
fn the_first_get_after_an_update_is_a_hit_of_the_published_page_on_shm() {
    the_first_get_after_an_update_is_a_hit_of_the_published_page(Backend::Shm);
}

#[test]
fn the_first_get_after_an_update_is_a_hit_of_the_published_page_on_tcp() {
    the_first_get_after_an_update_is_a_hit_of_the_published_page(Backend::Tcp);
}

fn nothing_stale_under_reads_racing_updates(backend: Backend) {
    let deployment = deploy(backend, 2, &[]);
    let mut config = load_config(&deployment);
    config.duration_ms = None;
    config.requests_max = Some(4000);
    let report = runtime().block_on(run(config)).unwrap();
    assert_coherent(&report, backend.name());
    assert!(report.updates.done >= 20, "the updater ran: {:?}", report.updates);
    let stats = settled(&deployment);
    let installed: u64 = stats.iter().map(|s| s.pages_installed).sum();
    assert!(installed > 0, "published pages raced the reads: {stats:?}");
    deployment.stop().unwrap();
}

#[test]
fn publishing_serves_nothing_stale_under_reads_racing_updates_on_shm() {
    nothing_stale_under_reads_racing_updates(Backend::Shm);
}

#[test]
fn publishing_serves_nothing_stale_under_reads_racing_updates_on_tcp() {
    nothing_stale_under_reads_racing_updates(Backend::Tcp);
}

/// Two records for five documents, so pages evict each other, and the
/// application tier restarted under load (a new incarnation: every
/// published page of the old one must stop validating).
fn nothing_stale_across_a_restart_with_evictions(backend: Backend) {
    let mut deployment = deploy(backend, 1, &["--publish-pages", "2"]);
    let runtime = runtime();
    let live = Arc::new(LiveStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut config = load_config(&deployment);
    config.duration_ms = Some(120_000);
    config.request_timeout_ms = 5_000;
    let shutdown = async move {
        let _ = stop_rx.await;
    };
    let handle = runtime.spawn(run_with(config, live.clone(), shutdown));
    let before = crate::wait_live(&live, "load before the restart", |s| s.ok >= 500 && s.updates >= 10 && s.hits > 0);
    deployment.restart_application_tier().unwrap();
    crate::wait_live(&live, "load after the restart", |s| s.ok >= before.ok + 1000 && s.updates >= before.updates + 10);
    stop_tx.send(()).unwrap();
    let report = runtime.block_on(handle).unwrap().unwrap();
    let stats = settled(&deployment).remove(0);
    deployment.stop().unwrap();
    assert_coherent(&report, backend.name());
    let seen: Vec<_> = report.incarnations.iter().map(|i| (i.node, i.epoch)).collect();
    assert_eq!(seen, vec![(0, 0), (0, 1)], "both incarnations were seen: {:?}", report.incarnations);
    assert!(stats.pages_installed > 0 && stats.pages_unusable > 0, "pages served and missed: {stats:?}");
}

#[test]
fn publishing_serves_nothing_stale_across_a_restart_with_evictions_on_shm() {
    nothing_stale_across_a_restart_with_evictions(Backend::Shm);
}

#[test]
fn publishing_serves_nothing_stale_across_a_restart_with_evictions_on_tcp() {
    nothing_stale_across_a_restart_with_evictions(Backend::Tcp);
}

/// The same on ucx over UCX shared memory (skipped, saying why, in a
/// build without UCX; CI requires it).
#[test]
fn publishing_serves_nothing_stale_under_reads_racing_updates_on_ucx() {
    if !crate::ucx_or_skip() {
        return;
    }
    nothing_stale_under_reads_racing_updates(Backend::Ucx);
}
