//! `tierstack origin` as a child process: a trace's documents served as a
//! synthetic set through an emulated disk and a memory cache, the counters
//! on the admin listener and as the exit line, the stop signals, and
//! startup errors.

use crate::exe;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tierstack_deploy::process::free_loopback_port;
use tierstack_origin::{synthetic_prefix, DiskModel, OriginStats};
use tierstack_workload::{Trace, TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

/// Bound on a child becoming ready or exiting.
const STEP: Duration = Duration::from_secs(30);

struct OriginChild {
    child: Child,
    lines: mpsc::Receiver<String>,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl OriginChild {
    /// Starts `tierstack origin` with `args` on free loopback ports and
    /// waits for `ready`. A port taken by someone else first is retried.
    fn start(args: &[&str]) -> OriginChild {
        for attempt in 0.. {
            let (listen, admin) = (free_loopback_port().unwrap(), free_loopback_port().unwrap());
            let mut child = Command::new(exe())
                .arg("origin")
                .args(["--listen", &listen.to_string(), "--admin", &admin.to_string()])
                .args(args)
                .arg("--stop-on-stdin-eof")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let (tx, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in stdout.lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            match lines.recv_timeout(STEP) {
                Ok(line) if line == "ready" => return OriginChild { child, lines, listen, admin },
                other if attempt < 2 => {
                    eprintln!("origin did not start ({other:?}); retrying");
                    let _ = child.kill();
                    let _ = child.wait();
                }
                other => panic!("origin did not start: {other:?}"),
            }
        }
        unreachable!()
    }

    /// Waits for the child to exit by itself; returns its exit line.
    fn exit_line(mut self) -> String {
        let line = self.lines.recv_timeout(STEP).expect("the origin prints its counters as it exits");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "origin exited with {status}");
        assert!(self.lines.recv_timeout(STEP).is_err(), "nothing follows the counters");
        line
    }
}

impl Drop for OriginChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange on a fresh connection: status, head, body.
fn http_get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(STEP)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a header block");
    let head = String::from_utf8(answer[..split].to_vec()).unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, answer[split + 4..].to_vec())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

#[test]
fn an_origin_serves_a_traces_documents_through_its_cache_and_disk_and_reports_its_counters() {
    const DOCS: usize = 12;
    let child = OriginChild::start(&[
        "--trace",
        "zipf",
        "--docs",
        &DOCS.to_string(),
        "--cache-bytes",
        "10000000",
        "--disk-seek-us",
        "2000",
        "--disk-mb-per-s",
        "50",
    ]);
    // The same document set, built here: the origin must serve exactly it.
    let trace = Trace::zipf(tierstack_workload::ZIPF_ALPHA_DEFAULT, DOCS).unwrap();
    let documents = trace.documents();
    let disk = DiskModel::new(2_000_000, 50_000_000).unwrap();
    let fetched = [0usize, 5, DOCS - 1, 0, 5];
    let mut expected_busy_ns = 0;
    let mut expected_disk_bytes = 0;
    let mut sent = 0;
    for (i, &index) in fetched.iter().enumerate() {
        let document = &documents[index];
        let path = document.path();
        let (status, head, body) = http_get(child.listen, &path);
        assert_eq!(status, 200, "{path}: {head}");
        assert_eq!(body.len() as u64, document.size_bytes, "{path}");
        let prefix = synthetic_prefix(&path, document.size_bytes);
        assert!(body.starts_with(prefix.as_bytes()), "{path} starts with {prefix:?}");
        assert_eq!(header(&head, "content-length"), Some(document.size_bytes.to_string().as_str()));
        assert!(header(&head, "etag").is_some() && header(&head, "last-modified").is_some());
        if !fetched[..i].contains(&index) {
            expected_busy_ns += disk.service_ns(document.size_bytes);
            expected_disk_bytes += document.size_bytes;
        }
        sent += document.size_bytes;
    }
    assert_eq!(http_get(child.listen, "/doc/nope").0, 404);

    let (status, _, body) = http_get(child.admin, "/stats");
    assert_eq!(status, 200);
    let stats: OriginStats = serde_json::from_slice(&body).unwrap();
    assert_eq!(stats.requests, 6);
    assert_eq!(stats.responses, [(200, 5), (404, 1)].into_iter().collect());
    assert_eq!((stats.cache_misses, stats.cache_hits, stats.disk_reads), (3, 2, 3));
    assert_eq!(stats.disk_bytes, expected_disk_bytes);
    assert_eq!(stats.disk_busy_ns, expected_busy_ns, "the emulated disk ran the given model");
    assert_eq!(stats.bytes_sent, sent);

    // Closing standard input stops it; it prints the same counters.
    let mut child = child;
    drop(child.child.stdin.take());
    let line = child.exit_line();
    let at_exit: OriginStats = serde_json::from_str(&line).unwrap();
    assert_eq!(at_exit, stats, "the exit line: {line}");
}

/// Without `--cache-bytes`, `tierstack origin` and `tierstack sim` give each
/// node the cache the trace publishes (coop: 64 MiB per node, scaled with
/// the trace); `--cache-bytes` still decides when given.
#[test]
fn origin_and_sim_default_to_the_traces_published_cache() {
    // 100 files of 8 KiB against 1 % of 64 MiB: the cache holds 81 of them.
    const TRACE: &str = "coop:8k@0.01";
    let trace = TraceSpec::parse(TRACE, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT).unwrap().build(1).unwrap();
    let cache_bytes = trace.cache_bytes_per_node().expect("the coop traces publish a per-node cache");
    let documents = trace.documents();
    let fits = (cache_bytes / documents[0].size_bytes) as usize;
    assert!(fits > 0 && fits < documents.len(), "the cache holds some documents, not all ({fits})");

    for (flags, expected_objects) in [(&[][..], fits), (&["--cache-bytes", "0"][..], 0)] {
        let child = OriginChild::start(&[&["--trace", TRACE][..], flags].concat());
        for document in documents {
            assert_eq!(http_get(child.listen, &document.path()).0, 200);
        }
        let (_, _, body) = http_get(child.admin, "/stats");
        let stats: OriginStats = serde_json::from_slice(&body).unwrap();
        assert_eq!(stats.cache_objects as usize, expected_objects, "origin {flags:?}");
    }

    let dir = tempfile::tempdir().unwrap();
    for (flags, expected) in [(&[][..], cache_bytes), (&["--cache-bytes", "12345"][..], 12_345)] {
        let json = dir.path().join("sim.json");
        let status = Command::new(exe())
            .args(["sim", "--nodes", "1", "--trace", TRACE, "--requests", "10", "--costs", "seeds"])
            .args(["--json", json.to_str().unwrap()])
            .args(flags)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(report["cache_bytes"].as_u64(), Some(expected), "sim {flags:?}");
    }
}

#[test]
fn sigterm_stops_an_origin_which_then_prints_its_counters() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), b"hello").unwrap();
    let child = OriginChild::start(&["--root", dir.path().to_str().unwrap()]);
    let (status, head, body) = http_get(child.listen, "/hello.txt");
    assert_eq!((status, &body[..]), (200, &b"hello"[..]));
    assert_eq!(header(&head, "content-type"), Some("text/plain; charset=utf-8"));
    // SAFETY: kill(2) on our own child's pid with a valid signal.
    let rc = unsafe { libc::kill(child.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let stats: OriginStats = serde_json::from_str(&child.exit_line()).unwrap();
    assert_eq!((stats.requests, stats.bytes_sent), (1, 5));
}

fn startup_error(args: &[&str]) -> String {
    let output = Command::new(exe())
        .args(["origin", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success(), "{args:?} started");
    assert!(output.stdout.is_empty(), "{args:?} never became ready");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn bad_content_stops_an_origin_at_startup_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("files.txt");
    std::fs::write(&list, "/a 10\n/b ten\n").unwrap();
    let message = startup_error(&["--files", list.to_str().unwrap()]);
    assert!(message.contains("files.txt") && message.contains("line 2"), "{message}");
    let missing = dir.path().join("missing");
    let message = startup_error(&["--root", missing.to_str().unwrap()]);
    assert!(message.contains("cannot serve root") && message.contains("missing"), "{message}");
    let message = startup_error(&["--trace", "zipf", "--docs", "0"]);
    assert!(message.contains("document count"), "{message}");
    let message = startup_error(&["--trace", "zipf", "--disk-seek-us", "10"]);
    assert!(message.contains("--disk-mb-per-s"), "the two disk flags go together: {message}");
    let message = startup_error(&["--trace", "zipf", "--disk-seek-us", "10", "--disk-mb-per-s", "0"]);
    assert!(message.contains("positive"), "{message}");
}
