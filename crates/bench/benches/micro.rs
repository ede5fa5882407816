//! Criterion micro-benchmarks of the hot paths, each beside its baseline
//! in the same run (read the ratio, not the absolute time: the machines are
//! shared): one-sided operations on `shm` vs the two-sided `tcp` backend;
//! a proxy's batched version check on both; an uncontended lock
//! acquire+release under N-CoShED vs SRSL; parsing the dependency header;
//! 64 KiB transfers between registered regions through a `Vec` (`Write`,
//! `Read`) vs naming the local region (`WriteFrom`, `ReadInto`).
//!
//! `cargo bench -p tierstack-bench --bench micro` (add `-- <filter>` for one group).
//! Every node is a thread of this process with its own fabric endpoint.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_cluster::{local_cluster, Backend, LocalCluster};
use tierstack_coherent::{DepsHeader, Incarnation, VersionChecker, VersionTable};
use tierstack_dlm::harness::{start_managers, BENCH_LOCK};
use tierstack_dlm::{LockMode, Scheme, Wait};
use tierstack_fabric::{LocalSlice, Op, RemoteRegion};

const BACKENDS: [Backend; 2] = [Backend::Shm, Backend::Tcp];

/// Node 0 owns a region; node 1 holds a handle to it.
fn remote_region(backend: Backend) -> (LocalCluster, Arc<dyn RemoteRegion>) {
    let cluster = local_cluster(backend, 2).expect("cluster");
    cluster.fabric(0).register("micro", 4096, tierstack_fabric::Access::all()).expect("register");
    let region = cluster.fabric(1).connect(NodeId(0), "micro").expect("connect");
    (cluster, region)
}

fn fabric_ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("fabric");
    for backend in BACKENDS {
        let (_cluster, region) = remote_region(backend);
        let name = backend.name();
        group.bench_function(format!("read_u64/{name}"), |b| b.iter(|| black_box(region.read_u64(64).unwrap())));
        group.bench_function(format!("fetch_add/{name}"), |b| b.iter(|| black_box(region.fetch_add(0, 1).unwrap())));
        group.bench_function(format!("compare_swap/{name}"), |b| {
            b.iter(|| black_box(region.compare_swap(8, 0, 0).unwrap()))
        });
    }
    group.finish();
}

/// Bytes moved between a local registered region of node 1 (a cache pool
/// slot, say) and node 0's region, as before issue 11 (through a `Vec`: the
/// local bytes copied out into one for a `Write`; a `Read`'s fresh `Vec`
/// copied into the slot) and by naming the slot (`WriteFrom`, `ReadInto`).
fn transfers(c: &mut Criterion) {
    const BYTES: u32 = 64 << 10;
    let mut group = c.benchmark_group("transfer");
    group.throughput(criterion::Throughput::Bytes(u64::from(BYTES)));
    for backend in BACKENDS {
        let cluster = local_cluster(backend, 2).expect("cluster");
        cluster.fabric(0).register("xfer", u64::from(BYTES), tierstack_fabric::Access::all()).expect("register");
        let region = cluster.fabric(1).connect(NodeId(0), "xfer").expect("connect");
        let pool = cluster
            .fabric(1)
            .register("pool", u64::from(BYTES), tierstack_fabric::Access::all())
            .expect("register the pool");
        pool.memory().write(0, &vec![7u8; BYTES as usize]).expect("fill the pool");
        let slot = LocalSlice::new(pool.clone(), 0, BYTES);
        let name = backend.name();
        group.bench_function(format!("write_vec_64k/{name}"), |b| {
            b.iter(|| {
                let mut data = vec![0u8; BYTES as usize];
                pool.memory().read(0, &mut data).unwrap();
                black_box(region.post(vec![Op::Write { offset: 0, data }]).wait().unwrap())
            })
        });
        group.bench_function(format!("write_from_64k/{name}"), |b| {
            b.iter(|| black_box(region.post(vec![Op::WriteFrom { offset: 0, source: slot.clone() }]).wait().unwrap()))
        });
        group.bench_function(format!("read_vec_64k/{name}"), |b| {
            b.iter(|| {
                let results = region.post(vec![Op::Read { offset: 0, len: BYTES }]).wait().unwrap();
                let data = results.into_iter().next().unwrap().into_bytes().unwrap();
                pool.memory().write(0, &data).unwrap();
            })
        });
        group.bench_function(format!("read_into_64k/{name}"), |b| {
            b.iter(|| black_box(region.post(vec![Op::ReadInto { offset: 0, target: slot.clone() }]).wait().unwrap()))
        });
    }
    group.finish();
}

/// A proxy validating a response that depends on three keys: one batch.
fn version_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("coherent");
    for backend in BACKENDS {
        let cluster = local_cluster(backend, 2).expect("cluster");
        let table = VersionTable::create(cluster.fabric(0).as_ref(), 64, Incarnation(7)).expect("table");
        let keys: Vec<(String, u32)> = ["doc/a", "stock/IBM", "user/42"]
            .iter()
            .map(|k| (k.to_string(), table.slot_of(k).expect("slot")))
            .collect();
        let header = table.header(&keys).expect("header");
        let checker = VersionChecker::new(cluster.fabric(1).clone());
        assert!(checker.is_current_blocking(&header).expect("check"), "fresh versions validate");
        group.bench_function(format!("check_3_keys/{}", backend.name()), |b| {
            b.iter(|| black_box(checker.is_current_blocking(&header).unwrap()))
        });
    }
    let text = "n=0;i=00000000000000ab;doc/a=12@0,stock/IBM=3@1,user/42=7@2";
    group.bench_function("parse_deps_header", |b| b.iter(|| black_box(DepsHeader::parse(black_box(text)).unwrap())));
    group.finish();
}

/// Node 1 takes and gives back a lock homed at node 0, nobody else asking.
fn uncontended_lock(c: &mut Criterion) {
    let mut group = c.benchmark_group("dlm");
    let cluster = local_cluster(Backend::Shm, 2).expect("cluster");
    for (i, scheme) in [Scheme::CoShed, Scheme::Srsl].into_iter().enumerate() {
        let managers = start_managers(cluster.fabrics(), scheme, &format!("micro{i}")).expect("managers");
        let me = managers[1].scheme().clone();
        for mode in [LockMode::Shared, LockMode::Exclusive] {
            let label = format!("acquire_release/{}/{}/shm", scheme.name(), mode.name());
            group.bench_function(label, |b| {
                b.iter(|| {
                    let grant = me.acquire(BENCH_LOCK, mode, Wait::Timeout(Duration::from_secs(5))).unwrap();
                    me.release(&grant).unwrap();
                })
            });
        }
    }
    group.finish();
}

/// The proxy's hit path without the network: a `GET` of a cached page
/// (ten response header fields, 4 KiB body) handled as the client listener
/// would, in `ttl` mode so no version check is timed (that one is
/// `coherent/check_3_keys`), against building the same response by hand;
/// and the miss path (`miss_4k`): a new path each time, forwarded to an
/// origin in the same runtime and stored.
fn proxy_hit(c: &mut Criterion) {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::header::{HeaderMap, HeaderValue};
    use tierstack_proxy::{CacheMode, Proxy, ProxyConfig, ProxyOptions};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let proxy = runtime
        .block_on(Proxy::bind_with(
            ProxyConfig {
                listen: "127.0.0.1:0".parse().expect("addr"),
                upstreams: vec!["http://127.0.0.1:9".into()],
                mode: CacheMode::Ttl,
                cache_bytes: 64 << 20,
                upstream_timeout: Duration::from_secs(1),
                fabric: None,
                admin_listen: None,
            },
            ProxyOptions { cache_state: None, ..ProxyOptions::default() },
        ))
        .expect("proxy");
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("content-type", "text/html; charset=utf-8"),
        ("x-tierstack-deps", "n=0;i=00000000000000ab;doc/a=12@0,stock/IBM=3@1,user/42=7@2"),
        ("cache-control", "public, max-age=60"),
        ("etag", "\"5f3a-1c2b\""),
        ("last-modified", "Mon, 23 Nov 2026 10:00:00 GMT"),
        ("date", "Mon, 23 Nov 2026 10:00:00 GMT"),
        ("content-length", "4096"),
        ("vary", "accept-encoding"),
        ("server", "tierstack-appserver"),
        ("x-request-id", "0123456789abcdef"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    let body = Bytes::from(vec![b'x'; 4096]);
    let request = || {
        let mut request = hyper::Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = "/doc/a".parse().expect("uri");
        request.headers_mut().insert("host", HeaderValue::from_static("www.example.com"));
        request.headers_mut().insert("accept-encoding", HeaderValue::from_static("gzip"));
        request.headers_mut().insert("user-agent", HeaderValue::from_static("bench"));
        request
    };
    let stored = proxy.bench_store("www.example.com", "/doc/a", request().headers(), &headers, body.clone());
    assert!(stored, "the page is cacheable");
    let hit = runtime.block_on(proxy.bench_request(request()));
    assert_eq!(hit.headers().get("x-cache").map(|v| v.as_bytes()), Some(&b"HIT"[..]), "the page is a hit");
    // A second proxy, in front of an origin in this runtime answering every
    // path with a 4 KiB page carrying a dependency header: each request of a
    // new path is a miss that goes upstream and is stored (`ttl` mode: no
    // version check timed).
    let origin = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("origin");
    let origin_addr = origin.local_addr().expect("origin addr");
    let page = Bytes::from(vec![b'y'; 4096]);
    let handler = std::sync::Arc::new(move |_request: hyper::Request<tierstack_tier_http::RequestBody>| {
        let page = page.clone();
        async move {
            let mut response = hyper::Response::new(Full::new(page));
            response.headers_mut().insert("content-type", HeaderValue::from_static("text/html"));
            response
                .headers_mut()
                .insert("x-tierstack-deps", HeaderValue::from_static("n=0;i=00000000000000ab;doc/a=12@0"));
            response
        }
    });
    runtime.spawn(tierstack_tier_http::serve(origin, handler, tierstack_tier_http::Stop::new()));
    let missing = runtime
        .block_on(Proxy::bind_with(
            ProxyConfig {
                listen: "127.0.0.1:0".parse().expect("addr"),
                upstreams: vec![format!("http://{origin_addr}")],
                mode: CacheMode::Ttl,
                cache_bytes: 64 << 20,
                upstream_timeout: Duration::from_secs(5),
                fabric: None,
                admin_listen: None,
            },
            ProxyOptions { cache_state: None, ..ProxyOptions::default() },
        ))
        .expect("proxy");
    let mut next = 0u64;
    let mut group = c.benchmark_group("proxy");
    group.bench_function("miss_4k", |b| {
        b.iter(|| {
            next += 1;
            let mut request = hyper::Request::new(Full::new(Bytes::new()));
            *request.uri_mut() = format!("/doc/m{next}").parse().expect("uri");
            request.headers_mut().insert("host", HeaderValue::from_static("www.example.com"));
            let response = runtime.block_on(missing.bench_request(request));
            assert_eq!(response.status(), 200);
            black_box(response)
        })
    });
    group.bench_function("hit_4k", |b| b.iter(|| black_box(runtime.block_on(proxy.bench_request(request())))));
    group.bench_function("baseline_build_response", |b| {
        b.iter(|| {
            let _request = black_box(request());
            let mut response = hyper::Response::new(Full::new(body.clone()));
            *response.headers_mut() = headers.clone();
            black_box(response)
        })
    });
    group.finish();
}

criterion_group! {
    name = micro;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = fabric_ops, version_check, uncontended_lock, transfers, proxy_hit
}
criterion_main!(micro);
