//! A proxy's site (reconfiguration): it routes only to the upstreams whose
//! role word names its site, stamps each forward with the role it read, and
//! routes a forward that the upstream fences (421) once more.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_monitor::reconfig::{claim, complete_move, read_role, register_role, Claim, ROLE_HEADER, ROLE_REGION};
use tierstack_proxy::{
    BalancerConfig, Balancing, CacheMode, Policy, Proxy, ProxyConfig, ProxyOptions, ProxyStats, Site,
};
use tierstack_tier_http::{serve, text, Stop};

/// An upstream that records the role stamp of every request it gets and
/// answers 421 to every stamp while `fencing` is set.
async fn upstream(fencing: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stamps = Arc::new(Mutex::new(Vec::new()));
    let seen = stamps.clone();
    let handler = Arc::new(move |request: Request<tierstack_tier_http::RequestBody>| {
        let stamp = request.headers().get(ROLE_HEADER).map(|v| v.to_str().unwrap().to_string());
        seen.lock().unwrap().push(stamp.clone().unwrap_or_default());
        async move {
            match stamp {
                Some(_) if fencing => text(StatusCode::MISDIRECTED_REQUEST, "moved\n"),
                _ => text(StatusCode::OK, "ok\n"),
            }
        }
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    (format!("http://{addr}"), stamps)
}

async fn get(at: SocketAddr, path: &str) -> (StatusCode, Bytes) {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.uri_mut() = format!("http://{at}{path}").parse().unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_proxy_routes_by_role_words_stamps_and_reroutes_a_fenced_forward() {
    let root = tempfile::tempdir().unwrap();
    let nodes: Vec<NodeId> = (0..4).map(NodeId).collect();
    let fabric = |id: u32| -> Arc<dyn Fabric> {
        ShmFabric::open(ShmConfig::new(root.path(), NodeId(id)).with_nodes(nodes.clone())).unwrap()
    };
    // Upstreams 0 and 1 (nodes 1, 2) are in site 0, upstream 2 (node 3) in site 1;
    // upstream 1 fences every stamped request.
    let (owners, mut roles) = (vec![fabric(1), fabric(2), fabric(3)], Vec::new());
    for (owner, site) in owners.iter().zip([0u16, 0, 1]) {
        roles.push(register_role(owner.as_ref(), site).unwrap());
    }
    let mut upstreams = Vec::new();
    let mut stamps = Vec::new();
    for fencing in [false, true, false] {
        let (url, seen) = upstream(fencing).await;
        upstreams.push(url);
        stamps.push(seen);
    }
    let proxy_fabric = fabric(0);
    let regions: Vec<_> = (1..=3).map(|n| proxy_fabric.connect(NodeId(n), ROLE_REGION).unwrap()).collect();
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams,
        mode: CacheMode::NoCache,
        cache_bytes: 1 << 20,
        upstream_timeout: Duration::from_secs(10),
        fabric: None,
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
    };
    let proxy = Proxy::bind_with(config, ProxyOptions { cache_state: None, ..ProxyOptions::default() }).await.unwrap();
    let site = Site { site: 0, roles: regions.clone() };
    assert!(proxy.set_site(site.clone()).is_err(), "a site needs balancing first");
    let balancing = Balancing { config: BalancerConfig::new(Policy::RoundRobin), source: None };
    proxy.set_balancing(balancing).unwrap();
    assert!(proxy.set_site(Site { site: 0, roles: regions[..2].to_vec() }).is_err(), "one role per upstream");
    proxy.set_site(site).unwrap();
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    tokio::spawn(proxy.run(Stop::new()));

    for i in 0..4 {
        assert_eq!(get(addr, &format!("/doc/{i}")).await.0, StatusCode::OK);
    }
    let seen = |i: usize| stamps[i].lock().unwrap().clone();
    // Round-robin over site 0 = upstreams 0 and 1: 0, then 1 (fenced) and
    // again 0, three times: every request was served by upstream 0.
    assert_eq!(seen(0), vec!["0.1"; 4], "every request served by upstream 0, stamped with its role");
    assert_eq!(seen(1), vec!["0.1"; 3], "upstream 1 chosen first for the last three");
    assert!(seen(2).is_empty(), "site 1's upstream never");
    let stats: ProxyStats = serde_json::from_slice(&get(admin, "/_tierstack/stats").await.1).unwrap();
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    assert_eq!((stats.site, stats.fenced, stats.routed.clone()), (Some(0), 3, vec![4, 3, 0]));

    // Node 3 moves to site 0 (epoch 2): the proxy sees it at its next choice.
    let region = &regions[2];
    let Claim::Won(mine) = claim(region.as_ref(), read_role(region.as_ref()).unwrap().role, 5).unwrap() else {
        panic!("uncontended claim")
    };
    complete_move(region.as_ref(), mine, 0, 1).unwrap();
    for i in 0..6 {
        assert_eq!(get(addr, &format!("/doc/{i}")).await.0, StatusCode::OK);
    }
    // Round-robin over 0, 1, 2 now: each fenced forward from 1 goes on to 2.
    assert_eq!(seen(2), vec!["0.2"; 3], "the moved node serves site 0, stamped with its new epoch");
}

/// The only upstream of a site fences the first stamped request (421) and
/// answers the next with the request's `X-Probe` field: the forward routed
/// again carries the client's fields too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_forward_routed_again_keeps_the_client_s_fields() {
    let root = tempfile::tempdir().unwrap();
    let nodes: Vec<NodeId> = (0..2).map(NodeId).collect();
    let fabric = |id: u32| -> Arc<dyn Fabric> {
        ShmFabric::open(ShmConfig::new(root.path(), NodeId(id)).with_nodes(nodes.clone())).unwrap()
    };
    let owner = fabric(1);
    let _role = register_role(owner.as_ref(), 0).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let fenced = Arc::new(Mutex::new(0u32));
    let fences = fenced.clone();
    let handler = Arc::new(move |request: Request<tierstack_tier_http::RequestBody>| {
        let first = {
            let mut fenced = fences.lock().unwrap();
            *fenced += 1;
            *fenced == 1
        };
        let probe = request.headers().get("x-probe").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        async move {
            if first {
                text(StatusCode::MISDIRECTED_REQUEST, "moved\n")
            } else {
                text(StatusCode::OK, probe)
            }
        }
    });
    tokio::spawn(serve(listener, handler, Stop::new()));
    let proxy_fabric = fabric(0);
    let region = proxy_fabric.connect(NodeId(1), ROLE_REGION).unwrap();
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstreams: vec![upstream],
        mode: CacheMode::NoCache,
        cache_bytes: 1 << 20,
        upstream_timeout: Duration::from_secs(10),
        fabric: None,
        admin_listen: None,
    };
    let proxy = Proxy::bind_with(config, ProxyOptions { cache_state: None, ..ProxyOptions::default() }).await.unwrap();
    proxy.set_balancing(Balancing { config: BalancerConfig::new(Policy::RoundRobin), source: None }).unwrap();
    proxy.set_site(Site { site: 0, roles: vec![region] }).unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.run(Stop::new()));

    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.uri_mut() = format!("http://{addr}/doc/a").parse().unwrap();
    request.headers_mut().insert("x-probe", "probe-a".parse().unwrap());
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "routed again after the 421");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"probe-a", "the second attempt carried the client's field");
    assert_eq!(*fenced.lock().unwrap(), 2, "fenced once, then served");
}
