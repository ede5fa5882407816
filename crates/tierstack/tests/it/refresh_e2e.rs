//! Proxy-side refresh end to end (issue 16): the module, an application
//! server that pushes nothing, and a proxy with `--refresh-hot`, as
//! processes. After an update of a hot document, the proxy refetches it by
//! itself: the next client GET is a hit at the new version, with no client
//! miss. Under reads racing updates with refresh on, nothing stale is
//! served.

use crate::{exe, start_deployment};
use std::net::SocketAddr;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_loadgen::{run, LoadConfig};
use tierstack_proxy::ProxyStats;
use tierstack_testkit::http;
use tierstack_workload::Trace;

const DOCS: usize = 5;

fn deploy(backend: Backend, refresh: &[&str]) -> Deployment {
    let config = DeploymentConfig {
        exe: exe(),
        backend,
        mode: "poll".into(),
        proxies: 1,
        compute_threads: 0,
        documents: "zipf".into(),
        docs: DOCS,
        seed: 1,
        pin: false,
    };
    let extra = ExtraArgs { proxy: refresh.iter().map(|s| s.to_string()).collect(), ..ExtraArgs::default() };
    start_deployment(&config, &DeploymentOptions::default(), &extra)
}

/// One GET through the proxy: status, `X-Cache`, `X-Tierstack-Deps`.
fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let response = http::get(addr, path).unwrap();
    let field = |name: &str| response.header(name).unwrap_or_default().to_string();
    (response.status, field("x-cache"), field("x-tierstack-deps"))
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

fn stats(deployment: &Deployment) -> ProxyStats {
    deployment.proxy_stats_at(0).unwrap()
}

fn refetches_the_hot_document_before_clients_ask(backend: Backend) {
    let deployment = deploy(backend, &["--refresh-hot", "4", "--refresh-interval-ms", "5"]);
    let proxy = addr(&deployment.proxy_urls[0]);
    let path = Trace::zipf(0.9, DOCS).unwrap().documents()[0].path();
    let (code, cache, old_deps) = get(proxy, &path);
    assert_eq!((code, cache.as_str()), (200, "MISS"));
    for _ in 0..3 {
        let (code, cache, deps) = get(proxy, &path);
        assert_eq!((code, cache.as_str(), &deps), (200, "HIT", &old_deps), "cached, and hot now");
    }
    // The hot document's versions are read (bounded wait on the counter).
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
    let before = loop {
        let now = stats(&deployment);
        if now.refresh_reads > 0 {
            break now;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "the hot set is never read: {now:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    deployment.update(&path).unwrap();
    // The refresh finds the new version and installs a new copy by itself
    // (bounded wait on the counter, no client request meanwhile).
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
    let after = loop {
        let now = stats(&deployment);
        if now.refresh_installed > before.refresh_installed {
            break now;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "no refetch after the update: {now:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(after.requests, before.requests, "no client asked meanwhile");
    let (code, cache, new_deps) = get(proxy, &path);
    assert_eq!(code, 200);
    assert_ne!(new_deps, old_deps, "the copy is at the new version");
    assert_eq!(cache, "HIT", "the first GET after the update is a hit of the refetched copy");
    let end = stats(&deployment);
    assert_eq!(end.misses, before.misses, "no client missed on the update: {end:?}");
    assert_eq!(end.stale_dropped, 0, "no client found the old copy stale: {end:?}");
    assert_eq!(end.accounting_error(), None);
    deployment.stop().unwrap();
}

#[test]
fn refresh_refetches_the_hot_document_before_clients_ask_on_shm() {
    refetches_the_hot_document_before_clients_ask(Backend::Shm);
}

#[test]
fn refresh_refetches_the_hot_document_before_clients_ask_on_tcp() {
    refetches_the_hot_document_before_clients_ask(Backend::Tcp);
}

#[test]
fn refresh_serves_nothing_stale_under_reads_racing_updates() {
    let deployment = deploy(Backend::Shm, &["--refresh-hot", "4", "--refresh-interval-ms", "1"]);
    let mut config = LoadConfig::new(deployment.proxy_urls[0].clone(), Trace::zipf(0.9, DOCS).unwrap());
    config.update_target = Some(deployment.app_url.clone());
    config.connections = 4;
    config.update_interval_ms = 5;
    config.keep_records = true;
    config.check_bodies = true;
    config.duration_ms = None;
    config.requests_max = Some(4000);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = runtime.block_on(run(config)).unwrap();
    assert_eq!(report.stale_responses, 0, "stale responses served: {:?}", report.stale_examples);
    assert_eq!(report.stale_responses_offline, Some(0), "offline recount");
    assert_eq!(report.ok, report.requests, "errors {:?}", report.errors);
    assert_eq!(report.bodies_checked, report.checked_ok, "every body checked");
    assert!(report.updates.done >= 20, "the updater ran: {:?}", report.updates);
    let stats = deployment.settled_proxy_stats().unwrap().remove(0);
    assert!(stats.refresh_refetches > 0 && stats.refresh_installed > 0, "refresh raced the reads: {stats:?}");
    assert!(stats.checks >= stats.hits, "every hit, refetched or not, was validated: {stats:?}");
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
    loop {
        let stats = deployment.proxy_stats_at::<ProxyStats>(0).unwrap();
        let Some(error) = stats.accounting_error() else { break };
        assert!(tierstack_base::time::instant_now() < deadline, "the proxy's counters do not add up: {error}");
        std::thread::sleep(Duration::from_millis(20));
    }
    deployment.stop().unwrap();
}
