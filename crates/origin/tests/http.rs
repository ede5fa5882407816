//! The origin over real HTTP on loopback: headers, conditional requests,
//! paths, the emulated disk and the memory cache, seen through responses
//! and the counters.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};
use tierstack_base::time::{instant_now, system_now};
use tierstack_origin::{
    file_etag, synthetic_body, synthetic_etag, synthetic_last_modified_default, synthetic_prefix, Caching, DiskModel,
    FileSet, Origin, OriginConfig, OriginError, OriginStats, StatsReader, Storage, StorageConfig, SyntheticSet,
    CACHE_CONTROL_DEFAULT,
};
use tierstack_tier_http::Stop;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Running {
    addr: SocketAddr,
    admin: SocketAddr,
    stats: StatsReader,
    stop: Stop,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn finish(self) {
        self.stop.stop();
        self.serving.await.unwrap().unwrap();
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn start(files: FileSet, storage: StorageConfig) -> Running {
    let mut config = OriginConfig::new(loopback(), files);
    config.admin_listen = Some(loopback());
    config.storage = storage;
    start_with(config).await
}

async fn start_with(config: OriginConfig) -> Running {
    let origin = Origin::bind(config).await.unwrap();
    let (addr, admin, stats) = (origin.local_addr().unwrap(), origin.admin_addr().unwrap(), origin.stats());
    let stop = Stop::new();
    let serving = tokio::spawn(origin.run(stop.clone()));
    Running { addr, admin, stats, stop, serving }
}

fn synthetic(objects: &[(&str, u64)]) -> FileSet {
    FileSet::Synthetic(SyntheticSet::new(objects.iter().map(|(p, s)| (p.to_string(), *s))).unwrap())
}

fn no_storage() -> StorageConfig {
    StorageConfig { cache_bytes: 0, cache_max_object_bytes: None, disk: None }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).unwrap_or_else(|| panic!("no {name} in {:?}", self.headers)).to_str().unwrap()
    }
}

async fn send(method: Method, url: &str, headers: &[(&str, &str)]) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client.request(request.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply { status: parts.status, headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
}

async fn get(url: &str) -> Reply {
    send(Method::GET, url, &[]).await
}

/// Sends `path` exactly as written (no client-side normalization) and
/// returns the status line and the whole answer.
async fn raw_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, answer)
}

async fn admin_stats(running: &Running) -> OriginStats {
    let reply = get(&format!("http://{}/stats", running.admin)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), "application/json");
    serde_json::from_slice(&reply.body).unwrap()
}

fn http_date(time: SystemTime) -> String {
    httpdate::fmt_http_date(time)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synthetic_object_carries_every_header_and_its_named_body() {
    let before = system_now() - Duration::from_secs(1);
    let running = start(synthetic(&[("/doc/page.html", 5_000), ("/doc/z0", 17)]), no_storage()).await;
    let reply = get(&running.url("/doc/page.html")).await;
    let after = system_now();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-length"), "5000");
    assert_eq!(reply.header("content-type"), "text/html; charset=utf-8");
    assert_eq!(reply.header("etag"), synthetic_etag("/doc/page.html", 5_000));
    assert_eq!(reply.header("last-modified"), http_date(synthetic_last_modified_default()));
    assert_eq!(reply.header("cache-control"), CACHE_CONTROL_DEFAULT);
    assert_eq!(reply.header("accept-ranges"), "none");
    let date = httpdate::parse_http_date(reply.header("date")).unwrap();
    assert!(before <= date && date <= after, "Date is the time of the answer");
    assert_eq!(reply.body, synthetic_body("/doc/page.html", 5_000));
    assert!(reply.body.starts_with(synthetic_prefix("/doc/page.html", 5_000).as_bytes()));
    assert!(reply.body.starts_with(b"tierstack-origin /doc/page.html 5000 bytes\n"), "a human sees what they got");

    let small = get(&running.url("/doc/z0")).await;
    assert_eq!(small.body.len(), 17, "a body shorter than its first line is cut, never padded");
    assert_eq!(small.header("content-type"), "application/octet-stream");
    assert_eq!(&small.body[..], &b"tierstack-origin /doc/z0 17 bytes\n"[..17]);
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_synthetic_body_is_whole_and_exact() {
    const SIZE: u64 = (3 << 20) + 17;
    let running = start(synthetic(&[("/big.bin", SIZE)]), no_storage()).await;
    let reply = get(&running.url("/big.bin")).await;
    assert_eq!(reply.header("content-length"), SIZE.to_string());
    assert_eq!(reply.body.len() as u64, SIZE);
    assert_eq!(reply.body, synthetic_body("/big.bin", SIZE));
    assert_eq!(running.stats.snapshot().bytes_sent, SIZE);
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_control_and_the_synthetic_date_are_configurable() {
    let mut config = OriginConfig::new(loopback(), synthetic(&[("/a", 1)]));
    config.admin_listen = Some(loopback());
    config.cache_control = Some("no-cache".into());
    config.synthetic_last_modified = SystemTime::UNIX_EPOCH + Duration::from_millis(1_234_567_890_999);
    let running = start_with(config).await;
    let reply = get(&running.url("/a")).await;
    assert_eq!(reply.header("cache-control"), "no-cache");
    assert_eq!(reply.header("last-modified"), "Fri, 13 Feb 2009 23:31:30 GMT");
    running.finish().await;

    let mut config = OriginConfig::new(loopback(), synthetic(&[("/a", 1)]));
    config.admin_listen = Some(loopback());
    config.cache_control = Some(String::new());
    let running = start_with(config).await;
    assert!(get(&running.url("/a")).await.headers.get("cache-control").is_none(), "empty: no header");
    running.finish().await;
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_file_has_validators_from_its_metadata_and_they_change_when_it_does() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("index.html"), b"<p>hello</p>");
    write(&dir.path().join("a b.txt"), b"spaced");
    let running = start(FileSet::Root(dir.path().to_path_buf()), no_storage()).await;

    let metadata = std::fs::metadata(dir.path().join("index.html")).unwrap();
    let mtime = metadata.modified().unwrap();
    let mtime_ns = mtime.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let reply = get(&running.url("/index.html")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"<p>hello</p>");
    assert_eq!(reply.header("content-length"), "12");
    assert_eq!(reply.header("content-type"), "text/html; charset=utf-8");
    assert_eq!(reply.header("etag"), file_etag(metadata.ino(), 12, mtime_ns));
    assert_eq!(reply.header("last-modified"), http_date(mtime));
    assert_eq!(reply.header("cache-control"), CACHE_CONTROL_DEFAULT);
    httpdate::parse_http_date(reply.header("date")).unwrap();

    let spaced = get(&running.url("/a%20b.txt")).await;
    assert_eq!((spaced.status, &spaced.body[..]), (StatusCode::OK, &b"spaced"[..]), "paths are percent-decoded");
    assert_eq!(spaced.header("content-type"), "text/plain; charset=utf-8");

    // A rewrite changes the size and the mtime, so the tag: the old tag no
    // longer matches and the client gets the new body.
    let old_tag = reply.header("etag").to_string();
    write(&dir.path().join("index.html"), b"<p>hello again</p>");
    let reply = send(Method::GET, &running.url("/index.html"), &[("if-none-match", &old_tag)]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"<p>hello again</p>");
    assert_ne!(reply.header("etag"), old_tag);
    running.finish().await;
}

/// What, how, which headers, and the status expected.
type Case<'a> = (&'a str, Method, &'a [(&'a str, &'a str)], StatusCode);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_requests_follow_rfc_9110() {
    let disk = DiskModel::new(0, 1_000_000_000).unwrap();
    let storage = StorageConfig { cache_bytes: 0, cache_max_object_bytes: None, disk: Some(disk) };
    let running = start(synthetic(&[("/doc/a", 100)]), storage).await;
    let url = running.url("/doc/a");
    let tag = synthetic_etag("/doc/a", 100);
    let modified = synthetic_last_modified_default();
    let same_date = http_date(modified);
    let later = http_date(modified + Duration::from_secs(60));
    let earlier = http_date(modified - Duration::from_secs(1));
    let weak = format!("W/{tag}");
    let listed = format!("\"nope\", {tag}");

    let cases: &[Case] = &[
        ("tag matches", Method::GET, &[("if-none-match", &tag)], StatusCode::NOT_MODIFIED),
        ("weak comparison", Method::GET, &[("if-none-match", &weak)], StatusCode::NOT_MODIFIED),
        ("tag in a list", Method::GET, &[("if-none-match", &listed)], StatusCode::NOT_MODIFIED),
        ("star", Method::GET, &[("if-none-match", "*")], StatusCode::NOT_MODIFIED),
        ("HEAD too", Method::HEAD, &[("if-none-match", &tag)], StatusCode::NOT_MODIFIED),
        ("tag differs", Method::GET, &[("if-none-match", "\"nope\"")], StatusCode::OK),
        (
            "the tag wins over a date that says modified",
            Method::GET,
            &[("if-none-match", &tag), ("if-modified-since", &earlier)],
            StatusCode::NOT_MODIFIED,
        ),
        (
            "a tag that differs wins over a date that says unmodified",
            Method::GET,
            &[("if-none-match", "\"nope\""), ("if-modified-since", &later)],
            StatusCode::OK,
        ),
        ("unmodified since that date", Method::GET, &[("if-modified-since", &same_date)], StatusCode::NOT_MODIFIED),
        ("unmodified since a later date", Method::GET, &[("if-modified-since", &later)], StatusCode::NOT_MODIFIED),
        ("modified since", Method::GET, &[("if-modified-since", &earlier)], StatusCode::OK),
        ("a bad date is ignored", Method::GET, &[("if-modified-since", "soon")], StatusCode::OK),
    ];
    let mut expected_not_modified = 0;
    let mut expected_reads = 0;
    for (what, method, headers, status) in cases {
        let reply = send(method.clone(), &url, headers).await;
        assert_eq!(reply.status, *status, "{what}");
        assert_eq!(reply.header("etag"), tag, "{what}: the validators come with the answer");
        assert_eq!(reply.header("last-modified"), same_date, "{what}");
        assert_eq!(reply.header("cache-control"), CACHE_CONTROL_DEFAULT, "{what}");
        httpdate::parse_http_date(reply.header("date")).unwrap();
        if *status == StatusCode::NOT_MODIFIED {
            expected_not_modified += 1;
            assert!(reply.body.is_empty(), "{what}");
            assert!(reply.headers.get("content-type").is_none(), "{what}: no representation metadata");
        } else {
            expected_reads += 1;
            assert_eq!(reply.body.len(), 100, "{what}");
        }
        let stats = running.stats.snapshot();
        assert_eq!(stats.not_modified, expected_not_modified, "{what}");
        assert_eq!(stats.disk_reads, expected_reads, "{what}: only a 200 to GET reads the object");
    }
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_sends_the_headers_of_a_get_and_reads_nothing() {
    let disk = DiskModel::new(0, 1_000_000_000).unwrap();
    let storage = StorageConfig { cache_bytes: 0, cache_max_object_bytes: None, disk: Some(disk) };
    let running = start(synthetic(&[("/doc/page.css", 3_000)]), storage).await;
    let head = send(Method::HEAD, &running.url("/doc/page.css"), &[]).await;
    let get = get(&running.url("/doc/page.css")).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    for name in ["content-length", "content-type", "etag", "last-modified", "cache-control", "accept-ranges"] {
        assert_eq!(head.header(name), get.header(name), "{name}");
    }
    assert_eq!(head.header("content-length"), "3000");
    let stats = running.stats.snapshot();
    assert_eq!((stats.disk_reads, stats.bytes_sent), (1, 3_000), "the GET read and sent; the HEAD did neither");
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_request_gets_the_whole_representation() {
    let running = start(synthetic(&[("/a", 1_000)]), no_storage()).await;
    let reply = send(Method::GET, &running.url("/a"), &[("range", "bytes=0-9")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body.len(), 1_000);
    assert!(reply.headers.get("content-range").is_none());
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_are_404_and_other_methods_405_with_allow() {
    let running = start(synthetic(&[("/a", 10)]), no_storage()).await;
    assert_eq!(get(&running.url("/b")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&running.url("/a/")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&running.url("/a?x=1")).await.status, StatusCode::OK, "the query is not part of the path");
    for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
        let reply = send(method.clone(), &running.url("/a"), &[]).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(reply.header("allow"), "GET, HEAD", "{method}");
    }
    let stats = admin_stats(&running).await;
    assert_eq!(stats.requests, 7);
    assert_eq!(stats.responses, [(200, 1), (404, 2), (405, 4)].into_iter().collect());
    assert_eq!(stats, running.stats.snapshot(), "the admin listener serves the same counters");
    let other = get(&format!("http://{}/other", running.admin)).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_outside_the_root_is_served_however_it_is_spelled() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    write(&dir.path().join("secret.txt"), b"SECRET");
    write(&root.join("sub/inside.txt"), b"inside");
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(root.join("sub/inside.txt"), root.join("good-link.txt")).unwrap();
    let running = start(FileSet::Root(root), no_storage()).await;

    for path in [
        "/../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/sub/%2e%2e%2f%2e%2e%2fsecret.txt",
        "/sub/..%2f..%2fsecret.txt",
        "/.%2e/secret.txt",
    ] {
        let (status, answer) = raw_get(running.addr, path).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(!answer.contains("SECRET"), "{path}");
    }
    let (status, answer) = raw_get(running.addr, "/link.txt").await;
    assert_eq!(status, 403, "a link out of the root: {answer}");
    assert!(!answer.contains("SECRET"));
    assert_eq!(raw_get(running.addr, "/good-link.txt").await.0, 200, "a link within the root is followed");
    assert_eq!(raw_get(running.addr, "/sub/./inside.txt").await.0, 200);
    assert_eq!(raw_get(running.addr, "/sub/").await.0, 404, "no directory listing");
    assert_eq!(raw_get(running.addr, "/sub").await.0, 404, "no directory listing");
    assert_eq!(raw_get(running.addr, "/").await.0, 404, "no directory listing");
    assert_eq!(raw_get(running.addr, "/a%zz").await.0, 400, "a bad escape");
    running.finish().await;
}

/// A disk whose every read of `SIZE` bytes takes exactly `SERVICE`.
const SIZE: u64 = 1_000;
const SERVICE: Duration = Duration::from_millis(21);

fn slow_disk() -> DiskModel {
    // 20 ms seek + 1,000 bytes at 1 MB/s (1 ms).
    let disk = DiskModel::new(20_000_000, 1_000_000).unwrap();
    assert_eq!(disk.service_ns(SIZE), SERVICE.as_nanos() as u64);
    disk
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_queue_on_the_disk_and_their_service_times_add_up() {
    const K: usize = 5;
    let objects: Vec<(String, u64)> = (0..K).map(|i| (format!("/doc/{i}"), SIZE)).collect();
    let files = FileSet::Synthetic(SyntheticSet::new(objects.clone()).unwrap());
    let storage = StorageConfig { cache_bytes: 0, cache_max_object_bytes: None, disk: Some(slow_disk()) };
    let running = start(files, storage).await;
    let replies = futures_join(objects.iter().map(|(path, _)| running.url(path)).collect()).await;
    let elapsed = replies.iter().map(|(_, done)| *done).max().unwrap();
    assert!(replies.iter().all(|(r, _)| r.status == StatusCode::OK && r.body.len() as u64 == SIZE));
    assert!(elapsed >= SERVICE * K as u32, "{K} misses of {SERVICE:?} each were served in {elapsed:?}");
    let stats = running.stats.snapshot();
    assert_eq!(stats.disk_reads, K as u64);
    assert_eq!(stats.disk_bytes, K as u64 * SIZE);
    assert_eq!(stats.disk_busy_ns, K as u64 * SERVICE.as_nanos() as u64, "busy time is exactly K service times");
    assert!(stats.disk_wait_ns > 0, "later reads waited behind earlier ones");
    running.finish().await;
}

/// Fetches every URL at once, each on its own connection; each reply comes
/// with the time from the start until it was complete.
async fn futures_join(urls: Vec<String>) -> Vec<(Reply, Duration)> {
    let started = instant_now();
    let tasks: Vec<_> = urls
        .into_iter()
        .map(|url| {
            tokio::spawn(async move {
                let reply = get(&url).await;
                (reply, started.elapsed())
            })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_hit_skips_the_disk_even_while_the_first_read_is_in_flight() {
    let storage = StorageConfig { cache_bytes: 1 << 20, cache_max_object_bytes: None, disk: Some(slow_disk()) };
    let running = start(synthetic(&[("/doc/x", SIZE)]), storage).await;
    let first = get(&running.url("/doc/x")).await;
    let second = get(&running.url("/doc/x")).await;
    assert_eq!(first.body, second.body);
    let stats = running.stats.snapshot();
    assert_eq!((stats.cache_misses, stats.cache_hits, stats.disk_reads), (1, 1, 1));
    assert_eq!(stats.disk_busy_ns, SERVICE.as_nanos() as u64, "the hit did not touch the disk");
    assert_eq!((stats.cache_bytes, stats.cache_objects), (SIZE, 1));

    // Four requests at once for an object not yet cached: one reads, the
    // others hit and wait for that read, so together they take one service time.
    let running2 = start(synthetic(&[("/doc/y", SIZE)]), storage).await;
    let replies = futures_join(vec![running2.url("/doc/y"); 4]).await;
    for (reply, done) in &replies {
        assert_eq!(reply.body.len() as u64, SIZE);
        assert!(*done >= SERVICE, "every reply, hits too, waited for the read in flight: {done:?}");
    }
    let stats = running2.stats.snapshot();
    assert_eq!((stats.cache_misses, stats.cache_hits, stats.disk_busy_ns), (1, 3, SERVICE.as_nanos() as u64));
    running.finish().await;
    running2.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_evicts_the_least_recently_used_object() {
    let storage = StorageConfig { cache_bytes: 2 * SIZE, cache_max_object_bytes: None, disk: None };
    let running = start(synthetic(&[("/a", SIZE), ("/b", SIZE), ("/c", SIZE)]), storage).await;
    // (path, hit?) in order. After a, b, a the order is b < a, so c evicts
    // b (FIFO would evict a); then a hits and b misses, evicting c.
    let steps = [("/a", false), ("/b", false), ("/a", true), ("/c", false), ("/a", true), ("/b", false), ("/c", false)];
    let (mut hits, mut misses) = (0, 0);
    for (path, hit) in steps {
        assert_eq!(get(&running.url(path)).await.status, StatusCode::OK);
        if hit {
            hits += 1;
        } else {
            misses += 1;
        }
        let stats = running.stats.snapshot();
        assert_eq!((stats.cache_hits, stats.cache_misses), (hits, misses), "after {path}");
        assert_eq!(stats.disk_reads, misses);
        assert!(stats.cache_bytes <= 2 * SIZE);
    }
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_above_the_object_bound_are_never_cached() {
    let storage = StorageConfig { cache_bytes: 10_000, cache_max_object_bytes: Some(500), disk: None };
    let running = start(synthetic(&[("/big", 501), ("/small", 500)]), storage).await;
    for path in ["/big", "/big", "/small", "/small"] {
        get(&running.url(path)).await;
    }
    let stats = running.stats.snapshot();
    assert_eq!((stats.cache_misses, stats.cache_hits), (3, 1));
    assert_eq!((stats.cache_bytes, stats.cache_objects), (500, 1));
    running.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_content_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let error = Origin::bind(OriginConfig::new(loopback(), FileSet::Root(missing.clone()))).await.err().unwrap();
    assert!(matches!(error, OriginError::Root { .. }), "{error}");
    assert!(error.to_string().contains(&missing.display().to_string()), "{error}");

    let file = dir.path().join("file");
    write(&file, b"x");
    let error = Origin::bind(OriginConfig::new(loopback(), FileSet::Root(file))).await.err().unwrap();
    assert!(matches!(error, OriginError::RootNotADirectory(_)), "{error}");

    let list = dir.path().join("list.txt");
    write(&list, b"/a 10\n/b 20\n/c twenty\n");
    let error = SyntheticSet::from_list_file(&list).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("list.txt") && message.contains("line 3") && message.contains("twenty"), "{message}");
    let error = SyntheticSet::from_list_file(&dir.path().join("nope.txt")).unwrap_err();
    assert!(matches!(error, OriginError::Read { .. }), "{error}");

    let mut config = OriginConfig::new(loopback(), synthetic(&[("/a", 1)]));
    config.cache_control = Some("bad\nvalue".into());
    let error = Origin::bind(config).await.err().unwrap();
    assert!(matches!(error, OriginError::BadCacheControl(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_add_up_over_a_mixed_run() {
    let storage = StorageConfig { cache_bytes: 10_000, cache_max_object_bytes: None, disk: None };
    let running = start(synthetic(&[("/a", 100), ("/b", 200)]), storage).await;
    let tag = synthetic_etag("/a", 100);
    get(&running.url("/a")).await;
    get(&running.url("/b")).await;
    get(&running.url("/a")).await;
    send(Method::GET, &running.url("/a"), &[("if-none-match", &tag)]).await;
    send(Method::HEAD, &running.url("/b"), &[]).await;
    get(&running.url("/missing")).await;
    let stats = admin_stats(&running).await;
    assert_eq!(stats.requests, 6);
    assert_eq!(stats.responses, [(200, 4), (304, 1), (404, 1)].into_iter().collect());
    assert_eq!(stats.not_modified, 1);
    assert_eq!((stats.cache_hits, stats.cache_misses, stats.disk_reads, stats.disk_bytes), (1, 2, 2, 300));
    assert_eq!(stats.bytes_sent, 400);
    assert_eq!(stats.disk_busy_ns, 0, "no emulated disk");
    running.finish().await;
}

/// The counters `/stats` serves are the storage's (`tierstack_model::Storage`,
/// which `tierstack sim`'s nodes hold too): a run of sequential GETs counts
/// exactly what a `Storage` fed the same paths in the same order counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_counters_are_the_storages_counts() {
    let objects: Vec<(String, u64)> = (0..12u64).map(|i| (format!("/o{i}"), 100 + 97 * i)).collect();
    let files = FileSet::Synthetic(SyntheticSet::new(objects.clone()).unwrap());
    let disk = DiskModel::new(100_000, 100_000_000).unwrap();
    let storage = StorageConfig { cache_bytes: 2_500, cache_max_object_bytes: Some(900), disk: Some(disk) };
    let running = start(files, storage).await;
    let mut model: Storage<String> = Storage::new(storage);
    // A skewed, deterministic sequence: small indices come up more often.
    let mut state = 7u64;
    for now in 0..80u64 {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let draw = (state >> 33) % 144;
        let (path, size) = &objects[(draw as f64).sqrt() as usize % objects.len()];
        assert_eq!(get(&running.url(path)).await.status, StatusCode::OK);
        // One request at a time: each arrives after the previous read ended,
        // so none waits for the disk, on either side.
        model.read(now * 1_000_000_000, path, *size, Caching::Normal);
    }
    let (stats, want) = (admin_stats(&running).await, model.counts());
    assert_eq!(
        (stats.cache_hits, stats.cache_misses, stats.disk_reads, stats.disk_bytes),
        (want.cache_hits, want.cache_misses, want.disk_reads, want.disk_bytes)
    );
    assert_eq!(
        (stats.disk_busy_ns, stats.disk_wait_ns, stats.cache_bytes, stats.cache_objects),
        (want.disk_busy_ns, want.disk_wait_ns, want.cache_bytes, want.cache_objects)
    );
    assert!(want.cache_hits > 0 && want.evictions > 0, "the run both hits and evicts: {want:?}");
    running.finish().await;
}
