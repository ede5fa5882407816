//! PRESS as a real web server: `tierstack press-node --root DIR` processes
//! on the Base version serving a directory the test writes. Every node
//! answers every file byte-identical, forwarded or not, with the same
//! validators (GET, HEAD, 304, ranges, MIME types, a large file streamed);
//! a changed file is served new with a new ETag; paths out of the root and
//! non-files are refused; a SIGSTOPped peer costs one bounded wait, is then
//! skipped by its circuit breaker, and is used again after SIGCONT.

use crate::exe;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tierstack_deploy::process::{free_loopback_port, ChildNode};
use tierstack_press::MsgType;
use tierstack_press_node::NodeStats;
use tierstack_testkit::http::{self, Response};

const STEP: Duration = Duration::from_secs(30);

struct Node {
    child: ChildNode,
    listen: SocketAddr,
    admin: SocketAddr,
    metrics: SocketAddr,
}

/// Starts `nodes` Base nodes serving `root`, with `extra` flags.
fn start(dir: &Path, root: &Path, name: &str, nodes: usize, extra: &[&str]) -> Vec<Node> {
    start_on(dir, root, name, "base", nodes, extra)
}

/// Starts `nodes` nodes of communication version `transport` serving `root`.
fn start_on(dir: &Path, root: &Path, name: &str, transport: &str, nodes: usize, extra: &[&str]) -> Vec<Node> {
    let path = crate::press_processes::write_topology(dir, name, transport, nodes);
    (0..nodes)
        .map(|i| {
            let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
            let metrics = free_loopback_port().unwrap();
            let mut args: Vec<String> = ["press-node", "--topology", path.to_str().unwrap(), "--node", &i.to_string()]
                .into_iter()
                .map(String::from)
                .collect();
            for (flag, value) in [
                ("--listen", listen.to_string()),
                ("--admin", admin.to_string()),
                ("--metrics-listen", metrics.to_string()),
                ("--root", root.display().to_string()),
                ("--transport", transport.to_string()),
                ("--threads", "1".into()),
            ] {
                args.extend([flag.to_string(), value]);
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            let child = ChildNode::spawn(&exe(), &args).unwrap_or_else(|e| panic!("node {i} did not start: {e:#}"));
            Node { child, listen, admin, metrics }
        })
        .collect()
}

fn stats(node: &Node) -> NodeStats {
    let response = http::get(node.admin, "/stats").unwrap();
    assert_eq!(response.status, 200);
    serde_json::from_slice(&response.body).unwrap()
}

/// The value of the sample `name` (with its labels, as written) in the
/// node's `/metrics`.
fn metric(node: &Node, name: &str) -> f64 {
    let text = http::get(node.metrics, "/metrics").unwrap().text();
    let line = text.lines().find(|l| l.split_once(' ').is_some_and(|(n, _)| n == name));
    line.and_then(|l| l.rsplit_once(' ')).and_then(|(_, v)| v.parse().ok()).unwrap_or_else(|| panic!("no {name}"))
}

fn ask(node: &Node, method: &str, path: &str, headers: &[&str]) -> Response {
    http::request(node.listen, method, path, headers).unwrap()
}

/// Polls `check` until it holds, failing after `STEP`.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = tierstack_base::time::instant_now();
    while !check() {
        assert!(start.elapsed() < STEP, "{what} did not happen within {STEP:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Some bytes that differ along the file and between files.
fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed).collect()
}

/// Node 1 reads `paths` (and caches them); node 0 learns it.
fn cache_at_node_1(cluster: &[Node], paths: &[&str]) {
    for path in paths {
        assert_eq!(ask(&cluster[1], "GET", path, &[]).status, 200, "{path}");
    }
    let cached = stats(&cluster[1]).cache_objects;
    eventually("node 0 learning node 1's files", || stats(&cluster[0]).files_in_view >= cached);
}

#[test]
fn files_are_served_byte_identical_from_every_node_with_head_304_and_ranges() {
    check_files_everywhere("base");
}

#[test]
fn files_are_served_byte_identical_from_every_node_on_tcp() {
    check_files_everywhere("tcp");
}

#[test]
fn files_are_served_byte_identical_from_every_node_on_rdma_1c() {
    check_files_everywhere("rdma-1c");
}

#[test]
fn files_are_served_byte_identical_from_every_node_on_rdma() {
    check_files_everywhere("rdma");
}

#[test]
fn files_are_served_byte_identical_from_every_node_on_zero() {
    check_files_everywhere("zero");
}

fn check_files_everywhere(transport: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(root.join("img")).unwrap();
    let files: Vec<(&str, Vec<u8>, &str)> = vec![
        ("/index.html", b"<html><body>PRESS serves real files</body></html>\n".to_vec(), "text/html; charset=utf-8"),
        ("/img/a.png", content(1, 10_000), "image/png"),
        ("/data", content(2, 70_000), "application/octet-stream"),
        // Larger than Fig. 1's max_size: served uncached, streamed from disk.
        ("/big.bin", content(3, 600_000), "application/octet-stream"),
    ];
    for (path, bytes, _) in &files {
        std::fs::write(root.join(&path[1..]), bytes).unwrap();
    }
    let cluster = start_on(dir.path(), &root, &format!("press-server-{transport}"), transport, 3, &[]);
    cache_at_node_1(&cluster, &["/index.html", "/img/a.png", "/data"]);
    let mut etags = Vec::new();
    for (path, bytes, mime) in &files {
        for (n, node) in cluster.iter().enumerate() {
            let get = ask(node, "GET", path, &[]);
            assert_eq!(get.status, 200, "GET {path} at node {n}");
            assert!(get.body == *bytes, "GET {path} at node {n}: the body differs from the file");
            assert_eq!(get.header("content-type"), Some(*mime), "{path}");
            assert_eq!(get.header("content-length"), Some(bytes.len().to_string().as_str()));
            let etag = get.header("etag").unwrap().to_string();
            let modified = get.header("last-modified").unwrap().to_string();
            etags.push((path, etag.clone()));
            let head = ask(node, "HEAD", path, &[]);
            assert_eq!((head.status, head.body.len()), (200, 0), "HEAD {path}");
            assert_eq!(head.header("content-length"), Some(bytes.len().to_string().as_str()));
            assert_eq!(head.header("etag"), Some(etag.as_str()), "HEAD {path} at node {n}");
            let by_tag = ask(node, "GET", path, &[&format!("If-None-Match: {etag}")]);
            assert_eq!((by_tag.status, by_tag.body.len()), (304, 0), "If-None-Match {path} at node {n}");
            assert_eq!(by_tag.header("etag"), Some(etag.as_str()));
            let by_date = ask(node, "GET", path, &[&format!("If-Modified-Since: {modified}")]);
            assert_eq!(by_date.status, 304, "If-Modified-Since {path} at node {n}");
            let other = ask(node, "GET", path, &["If-None-Match: \"other\""]);
            assert_eq!(other.status, 200);
            let range = ask(node, "GET", path, &["Range: bytes=10-19"]);
            assert_eq!(range.status, 206, "Range {path} at node {n}");
            assert_eq!(range.body, bytes[10..20], "Range {path} at node {n}");
            assert_eq!(range.header("content-range"), Some(format!("bytes 10-19/{}", bytes.len()).as_str()));
            let suffix = ask(node, "GET", path, &["Range: bytes=-5"]);
            assert_eq!((suffix.status, &suffix.body[..]), (206, &bytes[bytes.len() - 5..]), "{path}");
            let past = ask(node, "GET", path, &[&format!("Range: bytes={}-", bytes.len())]);
            assert_eq!(past.status, 416, "{path}");
            assert_eq!(past.header("content-range"), Some(format!("bytes */{}", bytes.len()).as_str()));
            let several = ask(node, "GET", path, &["Range: bytes=0-1,4-5"]);
            assert!(several.status == 200 && several.body == *bytes, "several ranges: the whole file");
        }
    }
    // One entity tag per file, whichever node answered.
    for (path, etag) in &etags {
        assert!(etags.iter().filter(|(p, _)| p == path).all(|(_, e)| e == etag), "{path}: {etags:?}");
    }
    let all: Vec<NodeStats> = cluster.iter().map(stats).collect();
    let sum = |f: fn(&NodeStats) -> u64| all.iter().map(f).sum::<u64>();
    // Node 1's files were forwarded from the others (ranges included).
    assert!(sum(|s| s.replies_relayed) >= 2 * 2 * 3, "{all:?}");
    assert_eq!(sum(|s| s.forward_fallbacks + s.bad_messages), 0, "{all:?}");
    assert!(sum(|s| s.streamed) >= 3, "the large file was streamed: {all:?}");
    if transport == "zero" {
        // Every forwarded file was cached at its service node: all went out
        // from the registered cache, none by a copy.
        assert_eq!(sum(|s| s.zero_copy_fallbacks), 0, "{all:?}");
    }
}

#[test]
fn a_changed_file_is_served_new_with_a_new_etag_from_every_node() {
    check_changed_file("base");
}

/// On Zero the service node's re-read lands in its registered cache and is
/// sent from there, not by a copy.
#[test]
fn a_changed_file_is_served_new_from_the_registered_cache_on_zero() {
    check_changed_file("zero");
}

fn check_changed_file(transport: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("page.txt");
    std::fs::write(&file, content(1, 5_000)).unwrap();
    let cluster = start_on(dir.path(), &root, &format!("press-change-{transport}"), transport, 2, &[]);
    cache_at_node_1(&cluster, &["/page.txt"]);
    let old = ask(&cluster[0], "GET", "/page.txt", &[]);
    assert_eq!(old.body, content(1, 5_000));
    assert_eq!(stats(&cluster[0]).replies_relayed, 1, "node 0 relayed node 1's cached copy");
    let old_etag = old.header("etag").unwrap().to_string();
    // The same size, new bytes and a new mtime (set, so a coarse clock
    // cannot hide the change).
    std::fs::write(&file, content(2, 5_000)).unwrap();
    let later = tierstack_base::time::system_now() + Duration::from_secs(5);
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(later).unwrap();
    for (n, node) in cluster.iter().enumerate() {
        let new = ask(node, "GET", "/page.txt", &[&format!("If-None-Match: {old_etag}")]);
        assert_eq!(new.status, 200, "node {n}: the old ETag no longer matches");
        assert!(new.body == content(2, 5_000), "node {n} served the old bytes");
        let new_etag = new.header("etag").unwrap();
        assert_ne!(new_etag, old_etag, "node {n}");
        let again = ask(node, "GET", "/page.txt", &[&format!("If-None-Match: {new_etag}")]);
        assert_eq!(again.status, 304, "node {n}");
    }
    assert!(stats(&cluster[1]).revalidated >= 1, "node 1 dropped its stale copy");
    assert_eq!(stats(&cluster[0]).forward_fallbacks, 0);
    assert!(stats(&cluster[0]).replies_relayed >= 2, "the new file came from node 1 too");
    assert_eq!(stats(&cluster[1]).zero_copy_fallbacks, 0, "{:?}", stats(&cluster[1]));
}

#[test]
fn paths_out_of_the_root_and_non_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(dir.path().join("secret"), b"SECRET-BYTES").unwrap();
    std::fs::write(root.join("ok.txt"), b"inside").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
    let cluster = start(dir.path(), &root, "press-refuse", 1, &[]);
    let node = &cluster[0];
    for (path, status) in [
        ("/ok.txt", 200),
        ("/../secret", 403),
        ("/%2e%2e/secret", 403),
        ("/sub/..%2f..%2fsecret", 403),
        ("/link", 403),
        ("/sub", 403),
        ("/missing", 404),
        ("/a%zz", 400),
    ] {
        let response =
            http::exchange(node.listen, &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
                .unwrap();
        assert_eq!(response.status, status, "GET {path}");
        assert!(!response.text().contains("SECRET"), "{path} leaked the file outside the root");
    }
    let long = format!("/{}", "a".repeat(20_000));
    assert_eq!(ask(node, "GET", &long, &[]).status, 404, "a name too long for the file system names no file");
    assert_eq!(ask(node, "GET", &format!("/{}", "a".repeat(70_000)), &[]).status, 414);
    let post = ask(node, "POST", "/ok.txt", &[]);
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
}

#[test]
fn a_stopped_peer_costs_one_bounded_wait_then_is_skipped_and_used_again_after_sigcont() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let paths: Vec<String> = (0..70).map(|i| format!("/f{i}")).collect();
    for (i, path) in paths.iter().enumerate() {
        std::fs::write(root.join(&path[1..]), content(i as u8, 2_000)).unwrap();
    }
    let extra = ["--forward-timeout-ms", "1000", "--breaker-cool-down-ms", "1500"];
    let cluster = start(dir.path(), &root, "press-breaker", 2, &extra);
    cache_at_node_1(&cluster, &paths.iter().map(String::as_str).collect::<Vec<_>>());
    let (during, after) = paths.split_at(6);
    let pid = cluster[1].child.pid();
    // SAFETY: signalling our own child process, alive (held by `cluster`).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    tierstack_testkit::child::wait_stopped(pid, STEP);
    let before = stats(&cluster[0]);
    for path in during {
        let response = ask(&cluster[0], "GET", path, &[]);
        let i: usize = path[2..].parse().unwrap();
        assert_eq!((response.status, response.body == content(i as u8, 2_000)), (200, true), "{path}");
    }
    let stopped = stats(&cluster[0]);
    let [opened, skipped, probes, _] = stopped.breaker;
    let forwards = |s: &NodeStats| s.sent_messages[MsgType::Forward as usize];
    assert_eq!(stopped.forward_fallbacks - before.forward_fallbacks, during.len() as u64, "{stopped:?}");
    assert_eq!(opened, 1, "the first unanswered forward opened the breaker: {stopped:?}");
    // Only the first forward and any probe went to the stopped peer (and
    // waited); the rest were served here at once.
    assert_eq!(forwards(&stopped) - forwards(&before), 1 + probes, "{stopped:?}");
    assert_eq!(skipped + probes, during.len() as u64 - 1, "{stopped:?}");
    assert!(skipped >= 1, "the stopped peer was avoided: {stopped:?}");
    assert_eq!(metric(&cluster[0], "tierstack_press_breaker_total{event=\"opened\"}"), 1.0);
    assert_eq!(metric(&cluster[0], "tierstack_press_peers_breaker_open"), 1.0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    // After the cool-down a probe reaches node 1 again and closes the breaker.
    let mut next = after.iter();
    eventually("a forward to node 1 relayed after SIGCONT", || {
        let path = next.next().expect("ran out of node 1's files before the breaker closed");
        let response = ask(&cluster[0], "GET", path, &[]);
        assert_eq!(response.status, 200, "{path}");
        std::thread::sleep(Duration::from_millis(80));
        let now = stats(&cluster[0]);
        now.replies_relayed > stopped.replies_relayed && now.breaker[3] >= 1
    });
    assert_eq!(metric(&cluster[0], "tierstack_press_peers_breaker_open"), 0.0, "closed again");
}
