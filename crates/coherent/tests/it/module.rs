//! The application module over its socket, and proxies validating against
//! its version table on both fabric backends.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_cluster::{local_cluster, Backend};
use tierstack_coherent::module::{ModuleClient, ModuleError, ModuleServer};
use tierstack_coherent::version_table::{Incarnation, VersionChecker, VersionTable};
use tierstack_coherent::DepsHeader;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

pub(crate) fn keys(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn table1_over_the_socket_with_versions_checked_by_a_proxy_node() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 2).unwrap();
        let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 64, Incarnation(0xabc)).unwrap());
        let server = Arc::new(ModuleServer::new(table));
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("module.sock");
        let checker = VersionChecker::new(cluster.fabric(1).clone());
        runtime().block_on(async {
            let serving = server.clone();
            let path = socket.clone();
            tokio::spawn(async move { serving.serve(&path).await });
            let client = connect(&socket).await;

            let read = client.read(&keys(&["doc/1"])).await.unwrap();
            let at_read = DepsHeader::parse(&read.deps).unwrap();
            assert_eq!(at_read.deps[0].version, 1);
            assert!(checker.is_current(&at_read).await.unwrap(), "{}: fresh versions validate", backend.name());

            // An update waits for the reader (Table 1) ...
            let update = tokio::spawn({
                let client = client.clone();
                async move { client.update(&keys(&["doc/1"])).await.unwrap() }
            });
            // The update must be queued before the second read is sent: a read
            // that arrives first shares the key with the first reader.
            wait_for(|| server.requests_in_progress() == 2).await;
            let queued_read = tokio::spawn({
                let client = client.clone();
                async move { client.read(&keys(&["doc/1"])).await.unwrap() }
            });
            // The reader holds, the update and the second read are queued.
            wait_for(|| server.requests_in_progress() == 3).await;
            assert!(!update.is_finished(), "the update must wait for the reader");
            assert!(checker.is_current(&at_read).await.unwrap());
            client.read_done(read).await.unwrap();

            // ... and bumps the version when it proceeds, before it is done.
            let update = bounded(update).await.unwrap();
            let at_update = DepsHeader::parse(&update.deps).unwrap();
            assert_eq!(at_update.deps[0].version, 2);
            assert!(
                !checker.is_current(&at_read).await.unwrap(),
                "{}: cached copy must stop validating",
                backend.name()
            );
            assert!(!queued_read.is_finished(), "readers queued behind the update wait for it");
            let done = client.update_done(update).await.unwrap();
            assert_eq!(DepsHeader::parse(&done).unwrap().deps[0].version, 2);

            let queued = bounded(queued_read).await.unwrap();
            assert_eq!(
                DepsHeader::parse(&queued.deps).unwrap().deps[0].version,
                2,
                "queued reader sees the new version"
            );
            client.read_done(queued).await.unwrap();
        });
    }
}

/// Awaits `future`, failing the test instead of hanging if it never resolves.
pub(crate) async fn bounded<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future).await.expect("a granted request never resolved")
}

/// Waits (bounded) until `condition` holds.
async fn wait_for(condition: impl Fn() -> bool) {
    let deadline = instant_now() + Duration::from_secs(30);
    while instant_now() < deadline {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never became true");
}

pub(crate) async fn connect(path: &std::path::Path) -> Arc<ModuleClient> {
    for _ in 0..200 {
        if let Ok(client) = ModuleClient::connect(path).await {
            return Arc::new(client);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("module socket never came up");
}

#[test]
fn bad_requests_get_clear_errors_and_a_full_table_is_reported() {
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 2, Incarnation(7)).unwrap());
    let server = Arc::new(ModuleServer::new(table));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("m.sock");
    runtime().block_on(async {
        let serving = server.clone();
        let path = socket.clone();
        tokio::spawn(async move { serving.serve(&path).await });
        let client = connect(&socket).await;
        let err =
            |r: Result<_, tierstack_coherent::module::ModuleError>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(client.read(&keys(&["bad key"])).await).contains("invalid dependency key"));
        assert!(err(client.read(&[]).await).contains("at least one key"));
        let a = client.read(&keys(&["a"])).await.unwrap();
        let b = client.read(&keys(&["b"])).await.unwrap();
        assert!(err(client.read(&keys(&["c"])).await).contains("full"), "a third key does not fit");
        client.read_done(a).await.unwrap();
        client.read_done(b).await.unwrap();

        // Raw protocol errors: malformed JSON, unknown op, done without request.
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        for (line, expect) in [
            ("not json\n", "malformed request"),
            ("{\"id\":1,\"op\":\"teleport\"}\n", "unknown op"),
            ("{\"id\":2,\"op\":\"read_done\"}\n", "unknown id"),
        ] {
            w.write_all(line.as_bytes()).await.unwrap();
            let reply = lines.next_line().await.unwrap().unwrap();
            assert!(reply.contains(expect), "{line:?} → {reply}");
        }
        // A read granted on this raw connection is released when it closes.
        w.write_all(b"{\"id\":3,\"op\":\"read_request\",\"keys\":[\"a\"]}\n").await.unwrap();
        assert!(lines.next_line().await.unwrap().unwrap().contains("read_proceed"));
        drop(w);
        drop(lines);
        let update = tokio::time::timeout(Duration::from_secs(10), client.update(&keys(&["a"]))).await;
        let update = update.expect("the closed connection's read must be released").unwrap();
        client.update_done(update).await.unwrap();
    });
}

#[test]
fn a_restarted_module_invalidates_everything_cached_before() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 2).unwrap();
        let checker = VersionChecker::new(cluster.fabric(1).clone());
        let table = VersionTable::create(cluster.fabric(0).as_ref(), 8, Incarnation(1)).unwrap();
        let slot = table.slot_of("doc/x").unwrap();
        let old = table.header(&[("doc/x".to_string(), slot)]).unwrap();
        assert!(checker.is_current_blocking(&old).unwrap());
        // Same versions, a different incarnation: as after a restart.
        let mut other = old.clone();
        other.incarnation = Incarnation(0x1234_5679);
        assert!(!checker.is_current_blocking(&other).unwrap(), "{}", backend.name());
        // A wrong slot or key never validates either.
        let mut wrong_key = old.clone();
        wrong_key.deps[0].key = "doc/y".into();
        assert!(!checker.is_current_blocking(&wrong_key).unwrap());
        let mut far_slot = old.clone();
        far_slot.deps[0].slot = 1_000_000;
        assert!(!checker.is_current_blocking(&far_slot).unwrap());
    }
}

/// One module on a one-node shm cluster, serving a socket in `dir`.
struct Module {
    _cluster: tierstack_cluster::LocalCluster,
    server: Arc<ModuleServer>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn module(capacity: u32) -> Module {
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), capacity, Incarnation(0x5eed)).unwrap());
    let server = Arc::new(ModuleServer::new(table));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("module.sock");
    Module { _cluster: cluster, server, socket, _dir: dir }
}

impl Module {
    fn serve(&self) {
        let serving = self.server.clone();
        let path = self.socket.clone();
        tokio::spawn(async move { serving.serve(&path).await });
    }
}

#[test]
fn update_done_reports_the_versions_its_update_produced_not_the_next_ones() {
    let m = module(8);
    runtime().block_on(async {
        m.serve();
        let client = connect(&m.socket).await;
        let update = client.update(&keys(&["doc/1", "doc/2"])).await.unwrap();
        let produced = update.deps.clone();
        let at_grant = DepsHeader::parse(&produced).unwrap();
        assert_eq!(at_grant.deps.iter().map(|d| d.version).collect::<Vec<_>>(), [2, 2]);
        // The next update's bump lands before this UPDATE_DONE is answered, as
        // a grant released on another connection can at any moment.
        m.server.table().bump(at_grant.deps[0].slot).unwrap();
        let done = client.update_done(update).await.unwrap();
        assert_eq!(
            done, produced,
            "UPDATE_DONE must label this update's content with its own versions: the next update's version would \
             validate as current for content that predates it"
        );
        let next = client.update(&keys(&["doc/1"])).await.unwrap();
        let next_done = client.update_done(next).await.unwrap();
        assert_eq!(DepsHeader::parse(&next_done).unwrap().deps[0].version, 4);
        assert_eq!(m.server.updates(), 2, "the bump made here is not an update the module granted");
    });
}

#[test]
fn a_connection_that_stops_reading_its_replies_is_closed_and_releases_what_it_held() {
    let m = module(8);
    runtime().block_on(async {
        m.serve();
        let client = connect(&m.socket).await;
        // A raw client asks for far more shared reads than its reply queue and
        // socket buffers hold, and never reads a reply.
        let stalled = tokio::net::UnixStream::connect(&m.socket).await.unwrap();
        let (stalled_read, mut stalled_write) = stalled.into_split();
        let mut requests = Vec::new();
        for id in 1..=30_000u64 {
            requests
                .extend_from_slice(format!("{{\"id\":{id},\"op\":\"read_request\",\"keys\":[\"a\"]}}\n").as_bytes());
        }
        // The module closes the connection part-way (it stops reading and
        // drops its end), so the rest of the requests cannot be written.
        let written = bounded(stalled_write.write_all(&requests)).await;
        assert!(written.is_err(), "the module must close a connection that does not read its replies");
        // No grant may be lost: an update of "a" must not wait forever for
        // reads whose grants were dropped.
        let update = bounded(client.update(&keys(&["a"]))).await.unwrap();
        client.update_done(update).await.unwrap();
        // The stalled connection was closed: draining it reaches end of stream.
        let mut lines = BufReader::new(stalled_read).lines();
        let drained = bounded(async {
            let mut replies = 0u64;
            while let Ok(Some(_)) = lines.next_line().await {
                replies += 1;
            }
            replies
        })
        .await;
        assert!(drained < 30_000, "the module closed the connection before answering everything ({drained})");
        assert_eq!(m.server.requests_in_progress(), 0, "everything the closed connection held was released");
        assert_eq!(m.server.updates(), 1);
    });
}

#[test]
fn a_call_that_misses_its_deadline_fails_and_gives_its_request_back() {
    let m = module(8);
    runtime().block_on(async {
        m.serve();
        let holder = connect(&m.socket).await;
        let read = holder.read(&keys(&["a"])).await.unwrap();
        // This update cannot be granted while the read is held, so its deadline passes.
        let impatient = ModuleClient::connect_with_timeout(&m.socket, Duration::from_millis(200)).await.unwrap();
        let err = bounded(impatient.update(&keys(&["a"]))).await.unwrap_err();
        assert!(matches!(err, ModuleError::Timeout { .. }), "{err}");
        holder.read_done(read).await.unwrap();
        // The timed-out update is granted once the read is done, to a caller
        // that has gone: it must be given back, or this update waits forever.
        let update = bounded(holder.update(&keys(&["a"]))).await.unwrap();
        holder.update_done(update).await.unwrap();
        assert_eq!(m.server.requests_in_progress(), 0);
    });
}

/// A raw connection to the module: write lines, read reply lines.
pub(crate) struct Raw {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
}

impl Raw {
    pub(crate) async fn connect(path: &std::path::Path) -> Raw {
        let (read, write) = tokio::net::UnixStream::connect(path).await.unwrap().into_split();
        Raw { lines: BufReader::new(read).lines(), write }
    }

    pub(crate) async fn send(&mut self, line: &str) {
        self.write.write_all(line.as_bytes()).await.unwrap();
    }

    /// The next reply line, or None at end of stream.
    pub(crate) async fn reply(&mut self) -> Option<String> {
        bounded(self.lines.next_line()).await.unwrap()
    }
}

#[test]
fn a_request_line_of_the_longest_length_is_served_and_a_longer_one_closes_the_connection() {
    use tierstack_coherent::deps::{DEPS_KEYS_MAX, KEY_BYTES_MAX};
    use tierstack_coherent::module::LINE_BYTES_MAX;
    let m = module(DEPS_KEYS_MAX as u32 + 1);
    runtime().block_on(async {
        m.serve();
        let client = connect(&m.socket).await;
        // The largest request a response's header can describe fits in a line.
        let most: Vec<String> = (0..DEPS_KEYS_MAX).map(|i| format!("{i:0>KEY_BYTES_MAX$}")).collect();
        let read = bounded(client.read(&most)).await.unwrap();
        assert_eq!(DepsHeader::parse(&read.deps).unwrap().deps.len(), DEPS_KEYS_MAX);
        client.read_done(read).await.unwrap();
        let mut raw = Raw::connect(&m.socket).await;
        // Exactly LINE_BYTES_MAX bytes with its newline: padded with blanks.
        let request = "{\"id\":1,\"op\":\"read_request\",\"keys\":[\"a\"]}";
        raw.send(&format!("{request}{}\n", " ".repeat(LINE_BYTES_MAX - 1 - request.len()))).await;
        assert!(raw.reply().await.unwrap().contains("read_proceed"));
        raw.send("{\"id\":1,\"op\":\"read_done\"}\n").await;
        let done = raw.reply().await.unwrap();
        assert!(done.contains("\"done\""), "the longest line is one request, nothing left over: {done}");
        // One byte more is refused, and the connection closed.
        let request = "{\"id\":2,\"op\":\"read_request\",\"keys\":[\"a\"]}";
        raw.send(&format!("{request}{}\n", " ".repeat(LINE_BYTES_MAX - request.len()))).await;
        let refused = raw.reply().await.unwrap();
        assert!(refused.contains("too long"), "{refused}");
        assert_eq!(raw.reply().await, None, "the module closes the connection after a line too long");
        assert_eq!(m.server.requests_in_progress(), 0);
    });
}

#[test]
fn a_done_of_the_wrong_kind_is_refused_and_changes_nothing() {
    let m = module(8);
    runtime().block_on(async {
        m.serve();
        let _ = connect(&m.socket).await;
        let mut raw = Raw::connect(&m.socket).await;
        raw.send("{\"id\":1,\"op\":\"update_request\",\"keys\":[\"a\"]}\n").await;
        assert!(raw.reply().await.unwrap().contains("update_proceed"));
        raw.send("{\"id\":1,\"op\":\"read_done\"}\n").await;
        let refused = raw.reply().await.unwrap();
        assert!(refused.contains("needs update_done"), "{refused}");
        assert_eq!(m.server.requests_in_progress(), 1, "the update still holds its key");
        raw.send("{\"id\":2,\"op\":\"read_request\",\"keys\":[\"b\"]}\n").await;
        assert!(raw.reply().await.unwrap().contains("read_proceed"));
        raw.send("{\"id\":2,\"op\":\"update_done\"}\n").await;
        let refused = raw.reply().await.unwrap();
        assert!(refused.contains("needs read_done"), "{refused}");
        raw.send("{\"id\":1,\"op\":\"update_done\"}\n").await;
        let done = raw.reply().await.unwrap();
        assert!(done.contains("\"done\"") && done.contains("a=2@0"), "{done}");
        // Cancel gives a granted request back whatever its kind.
        raw.send("{\"id\":2,\"op\":\"cancel\"}\n").await;
        assert!(raw.reply().await.unwrap().contains("\"done\""));
        assert_eq!(m.server.requests_in_progress(), 0);
        assert_eq!(m.server.updates(), 1);
    });
}

#[test]
fn concurrent_clients_each_update_reports_its_own_versions_and_every_version_is_produced_once() {
    const CONNECTIONS: usize = 4;
    const OPS_PER_TASK: usize = 40;
    let m = module(8);
    let names = ["k0", "k1", "k2"];
    runtime().block_on(async {
        m.serve();
        let _ = connect(&m.socket).await;
        let mut tasks = Vec::new();
        for c in 0..CONNECTIONS {
            let client = Arc::new(ModuleClient::connect(&m.socket).await.unwrap());
            for t in 0..2u64 {
                let client = client.clone();
                tasks.push(tokio::spawn(async move {
                    // A fixed pseudo-random walk per task: which keys, read or update.
                    let mut state = (c as u64) * 7919 + t * 104_729 + 1;
                    let mut updates = Vec::new();
                    for _ in 0..OPS_PER_TASK {
                        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        let pick = (state >> 33) as usize;
                        let chosen: Vec<String> = names
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| pick >> i & 1 == 1)
                            .map(|(_, k)| k.to_string())
                            .collect();
                        let chosen = if chosen.is_empty() { vec![names[pick % 3].to_string()] } else { chosen };
                        if pick >> 3 & 1 == 1 {
                            let access = client.update(&chosen).await.unwrap();
                            let proceed = access.deps.clone();
                            let done = client.update_done(access).await.unwrap();
                            assert_eq!(done, proceed, "an update's done reports the versions of its own grant");
                            updates.push(DepsHeader::parse(&done).unwrap());
                        } else {
                            let access = client.read(&chosen).await.unwrap();
                            client.read_done(access).await.unwrap();
                        }
                    }
                    updates
                }));
            }
        }
        let mut produced: std::collections::HashMap<String, Vec<u64>> = std::collections::HashMap::new();
        for task in tasks {
            for header in bounded(task).await.unwrap() {
                for dep in header.deps {
                    produced.entry(dep.key).or_default().push(dep.version);
                }
            }
        }
        for (key, mut versions) in produced {
            versions.sort_unstable();
            let expected: Vec<u64> = (2..2 + versions.len() as u64).collect();
            assert_eq!(versions, expected, "{key}: each update produced a new version, and no two the same");
            let slot = m.server.table().slot_of(&key).unwrap();
            assert_eq!(m.server.table().version(slot).unwrap(), 1 + expected.len() as u64);
        }
        assert_eq!(m.server.requests_in_progress(), 0);
    });
}

#[test]
fn one_batch_judges_each_header_as_its_own_check_would() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 2).unwrap();
        let checker = VersionChecker::new(cluster.fabric(1).clone());
        let table = VersionTable::create(cluster.fabric(0).as_ref(), 8, Incarnation(1)).unwrap();
        let header = |keys: &[&str]| {
            let keys: Vec<(String, u32)> = keys.iter().map(|k| (k.to_string(), table.slot_of(k).unwrap())).collect();
            table.header(&keys).unwrap()
        };
        let a = header(&["doc/a"]);
        let ab = header(&["doc/a", "doc/b"]);
        let b = header(&["doc/b"]);
        let c = header(&["doc/c"]);
        table.bump(table.slot_of("doc/b").unwrap()).unwrap();
        let mut far_slot = a.clone();
        far_slot.deps[0].slot = 1_000_000;
        let mut other = c.clone();
        other.incarnation = Incarnation(2);
        let all = [&a, &ab, &b, &far_slot, &c, &other];
        let verdicts = runtime().block_on(checker.are_current(&all));
        let verdicts: Vec<bool> = verdicts.into_iter().map(Result::unwrap).collect();
        assert_eq!(verdicts, [true, false, false, false, true, false], "{}", backend.name());
        for (header, verdict) in all.iter().zip(&verdicts) {
            assert_eq!(checker.is_current_blocking(header).unwrap(), *verdict, "{}: as one check", backend.name());
        }
    }
}
