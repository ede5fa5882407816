//! The module's socket as a boundary: one live module per path, the file's
//! mode, peer credentials, and grants that a stopped holder cannot keep.

use crate::module::{bounded, connect, keys, runtime, Raw};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_cluster::{local_cluster, Backend, LocalCluster};
use tierstack_coherent::module::{ClientOptions, ModuleClient, ModuleError, ModuleOptions, ModuleServer};
use tierstack_coherent::module_socket::{self, effective_uid, SocketAccess};
use tierstack_coherent::version_table::{Incarnation, VersionTable};
use tierstack_coherent::DepsHeader;

/// The environment variable that turns [`helper_connects_as_the_user_it_runs_as`] into a client.
const HELPER_SOCKET_ENV: &str = "TIERSTACK_TEST_MODULE_SOCKET";
/// The environment variable that turns [`helper_listens_as_the_user_it_runs_as`] into a listener.
const HELPER_LISTEN_ENV: &str = "TIERSTACK_TEST_LISTEN_SOCKET";
/// A user id that is neither root nor (in these tests) the module's.
const NOBODY: u32 = 65534;

struct Module {
    _cluster: LocalCluster,
    server: Arc<ModuleServer>,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

fn module(options: &ModuleOptions) -> Module {
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 8, Incarnation(0x50c)).unwrap());
    let server = Arc::new(ModuleServer::with_options(table, options).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("module.sock");
    Module { _cluster: cluster, server, socket, dir }
}

impl Module {
    /// Binds (with the module's own access rules) and serves in the background.
    async fn serve(&self) {
        let serving = self.server.clone();
        let path = self.socket.clone();
        let listener = ModuleServer::bind(&path).await.unwrap();
        tokio::spawn(async move { serving.serve_on(listener).await });
    }

    fn version(&self, key: &str) -> u64 {
        let table = self.server.table();
        table.version(table.slot_of(key).unwrap()).unwrap()
    }
}

/// A read and its release: the module at `socket` serves.
async fn serves(socket: &Path) {
    let client = connect(socket).await;
    let read = bounded(client.read(&keys(&["doc"]))).await.unwrap();
    client.read_done(read).await.unwrap();
}

#[test]
fn a_second_module_does_not_take_over_a_live_one() {
    let m = module(&ModuleOptions::default());
    runtime().block_on(async {
        m.serve().await;
        serves(&m.socket).await;
        let before = std::fs::symlink_metadata(&m.socket).unwrap();
        let second = ModuleServer::bind(&m.socket).await;
        match second {
            Err(ModuleError::AlreadyServed(path)) => assert_eq!(path, m.socket),
            other => panic!("a second module must refuse a live module's socket, got {other:?}"),
        }
        assert!(second_err_text(&m.socket).await.contains("a module already serves"));
        let after = std::fs::symlink_metadata(&m.socket).unwrap();
        assert_eq!((after.dev(), after.ino()), (before.dev(), before.ino()), "the live module's socket file is kept");
        serves(&m.socket).await;
        // Nothing of the refused start is left beside the socket.
        let names: Vec<_> = std::fs::read_dir(m.dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["module.sock"], "{names:?}");
    });
}

async fn second_err_text(path: &Path) -> String {
    ModuleServer::bind(path).await.map(|_| ()).unwrap_err().to_string()
}

#[test]
fn a_stale_socket_file_nobody_listens_on_is_replaced() {
    let m = module(&ModuleOptions::default());
    // A module that died without removing its socket: the file stays, nobody listens.
    drop(std::os::unix::net::UnixListener::bind(&m.socket).unwrap());
    assert!(std::fs::symlink_metadata(&m.socket).unwrap().file_type().is_socket());
    runtime().block_on(async {
        m.serve().await;
        serves(&m.socket).await;
    });
}

#[test]
fn a_regular_file_or_a_symlink_at_the_path_is_refused_and_left_alone() {
    let m = module(&ModuleOptions::default());
    runtime().block_on(async {
        std::fs::write(&m.socket, b"precious").unwrap();
        let err = ModuleServer::bind(&m.socket).await.map(|_| ()).unwrap_err();
        assert!(matches!(err, ModuleError::Socket(_)) && err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&m.socket).unwrap(), b"precious", "a file that is not a socket is never removed");
        // A symlink to a stale socket elsewhere is not followed, nor removed.
        let elsewhere = m.dir.path().join("elsewhere.sock");
        drop(std::os::unix::net::UnixListener::bind(&elsewhere).unwrap());
        let link = m.dir.path().join("link.sock");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        assert!(matches!(ModuleServer::bind(&link).await, Err(ModuleError::Socket(_))));
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert!(std::fs::symlink_metadata(&elsewhere).unwrap().file_type().is_socket());
    });
}

#[test]
fn the_socket_file_is_mode_0600_or_0660_with_a_group() {
    let m = module(&ModuleOptions::default());
    runtime().block_on(async {
        m.serve().await;
        let mode = std::fs::metadata(&m.socket).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
        serves(&m.socket).await;
        // With a group (one this process may give files to: its own).
        let gid = std::fs::metadata(m.dir.path()).unwrap().gid();
        let grouped = m.dir.path().join("grouped.sock");
        let access = SocketAccess { group: Some(gid), allowed_uids: vec![] };
        let _listener = module_socket::bind(&grouped, &access).await.unwrap();
        let found = std::fs::metadata(&grouped).unwrap();
        assert_eq!((found.permissions().mode() & 0o7777, found.gid()), (0o660, gid));
    });
}

/// Runs this test binary's [`helper_connects_as_the_user_it_runs_as`] as
/// user `uid` against `socket`; returns what it saw.
fn connect_as(uid: u32, socket: &Path) -> String {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "module_socket::helper_connects_as_the_user_it_runs_as", "--nocapture", "--test-threads=1"])
        .env(HELPER_SOCKET_ENV, socket)
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let seen = stdout.lines().find_map(|l| l.split_once("HELPER: ")).map(|(_, seen)| seen.to_string());
    seen.unwrap_or_else(|| panic!("the helper said nothing: {stdout} {}", String::from_utf8_lossy(&output.stderr)))
}

use std::os::unix::process::CommandExt;

/// Not a test on its own: with [`HELPER_SOCKET_ENV`] set, connects to that
/// socket, asks for a read and prints the reply (or how the connection ended).
#[test]
fn helper_connects_as_the_user_it_runs_as() {
    use std::io::{BufRead, Write};
    let Some(path) = std::env::var_os(HELPER_SOCKET_ENV) else { return };
    let seen = match std::os::unix::net::UnixStream::connect(&path) {
        Err(e) => format!("connect failed: {e}"),
        Ok(mut stream) => {
            stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let _ = stream.write_all(b"{\"id\":1,\"op\":\"read_request\",\"keys\":[\"doc\"]}\n");
            let mut line = String::new();
            match std::io::BufReader::new(stream).read_line(&mut line) {
                Ok(0) => "closed".to_string(),
                Ok(_) => format!("reply {}", line.trim_end()),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => "closed".to_string(),
                Err(e) => format!("read failed: {e}"),
            }
        }
    };
    println!("HELPER: {seen}");
}

#[test]
fn a_peer_whose_uid_is_not_allowed_is_refused_even_if_the_file_mode_lets_it_in() {
    if effective_uid() != 0 {
        println!("skipped: connecting as another user needs root (this runs as uid {})", effective_uid());
        return;
    }
    for allowed in [false, true] {
        let access = SocketAccess { group: None, allowed_uids: if allowed { vec![NOBODY] } else { vec![] } };
        let m = module(&ModuleOptions { access: access.clone(), ..ModuleOptions::default() });
        runtime().block_on(async {
            let listener = module_socket::bind(&m.socket, &access).await.unwrap();
            let serving = m.server.clone();
            tokio::spawn(async move { serving.serve_on(listener).await });
            // Open the file up, so that only the peer check stands in the way.
            std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::set_permissions(&m.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
            let socket = m.socket.clone();
            let seen = tokio::task::spawn_blocking(move || connect_as(NOBODY, &socket)).await.unwrap();
            if allowed {
                assert!(seen.contains("read_proceed"), "an allowed uid is served: {seen}");
                assert_eq!(m.server.peers_refused(), 0);
            } else {
                assert_eq!(seen, "closed", "uid {NOBODY} must be refused");
                assert_eq!(m.server.peers_refused(), 1, "a refused peer is counted");
                assert_eq!(m.server.requests_in_progress(), 0, "it never reached the protocol");
            }
            // The module's own user is served either way.
            serves(&m.socket).await;
        });
    }
}

#[test]
fn a_grant_held_by_a_stopped_server_is_revoked_and_its_late_done_is_refused() {
    let lifetime = Duration::from_millis(200);
    let m = module(&ModuleOptions { grant_lifetime: Some(lifetime), ..ModuleOptions::default() });
    runtime().block_on(async {
        m.serve().await;
        // A server that takes an update grant and then stops (never finishes,
        // never closes its connection).
        let mut stopped = Raw::connect(&m.socket).await;
        stopped.send("{\"id\":1,\"op\":\"update_request\",\"keys\":[\"a\"]}\n").await;
        let granted = stopped.reply().await.unwrap();
        assert!(granted.contains("update_proceed") && granted.contains("a=2@"), "{granted}");
        let taken = instant_now();
        // Another server's update proceeds once the lifetime has passed.
        let other = connect(&m.socket).await;
        let update = bounded(other.update(&keys(&["a"]))).await.unwrap();
        assert!(taken.elapsed() >= lifetime, "revoked early, after {:?}", taken.elapsed());
        assert_eq!(
            DepsHeader::parse(&update.deps).unwrap().deps[0].version,
            4,
            "version 2 (the revoked grant's) was retired by a bump to 3 before the next update's 4"
        );
        let notice = stopped.reply().await.unwrap();
        assert!(notice.contains("\"revoked\"") && notice.contains("\"id\":1"), "the holder is told: {notice}");
        // The stopped server wakes up and completes: refused, and nothing changes.
        stopped.send("{\"id\":1,\"op\":\"update_done\"}\n").await;
        let late = stopped.reply().await.unwrap();
        assert!(late.contains("\"error\"") && late.contains("revoked"), "a stale completion is refused: {late}");
        assert_eq!(m.version("a"), 4);
        let done = other.update_done(update).await.unwrap();
        assert_eq!(DepsHeader::parse(&done).unwrap().deps[0].version, 4);
        let read = other.read(&keys(&["a"])).await.unwrap();
        assert_eq!(DepsHeader::parse(&read.deps).unwrap().deps[0].version, 4);
        other.read_done(read).await.unwrap();
        assert_eq!((m.server.grants_revoked(), m.server.updates()), (1, 2));
        assert_eq!(m.server.requests_in_progress(), 0);
        // Its connection still works for new requests, even under the revoked grant's id.
        stopped.send("{\"id\":1,\"op\":\"read_request\",\"keys\":[\"a\"]}\n").await;
        let again = stopped.reply().await.unwrap();
        assert!(again.contains("read_proceed") && again.contains("a=4@"), "{again}");
    });
}

#[test]
fn a_grant_lifetime_below_the_minimum_is_refused() {
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    let table = Arc::new(VersionTable::create(cluster.fabric(0).as_ref(), 8, Incarnation(1)).unwrap());
    let options = ModuleOptions { grant_lifetime: Some(Duration::from_millis(1)), ..ModuleOptions::default() };
    assert!(matches!(ModuleServer::with_options(table, &options), Err(ModuleError::GrantLifetime(_))));
}

/// Not a test on its own: with [`HELPER_LISTEN_ENV`] set, listens on that
/// socket (a stranger's fake module), says so, and accepts two connections.
#[test]
fn helper_listens_as_the_user_it_runs_as() {
    let Some(path) = std::env::var_os(HELPER_LISTEN_ENV) else { return };
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    println!("HELPER: listening");
    for _ in 0..2 {
        drop(listener.accept().unwrap());
    }
}

#[test]
fn a_client_refuses_a_socket_served_by_a_user_it_does_not_trust() {
    use std::io::BufRead;
    if effective_uid() != 0 {
        println!("skipped: listening as another user needs root (this runs as uid {})", effective_uid());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A directory anyone may create in, as /tmp is.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.path().join("module.sock");
    let stranger = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "module_socket::helper_listens_as_the_user_it_runs_as", "--nocapture", "--test-threads=1"])
        .env(HELPER_LISTEN_ENV, &socket)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stranger = KillOnDrop(stranger);
    let mut said = std::io::BufReader::new(stranger.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("HELPER: listening") {
        line.clear();
        assert!(said.read_line(&mut line).unwrap() > 0, "the helper ended before listening");
    }
    runtime().block_on(async {
        let refused = ModuleClient::connect(&socket).await.map(|_| ()).unwrap_err();
        assert!(matches!(refused, ModuleError::UntrustedModule { uid: NOBODY }), "{refused}");
        // Trusted when named.
        let options = ClientOptions { module_uids: vec![NOBODY], ..ClientOptions::default() };
        assert!(ModuleClient::connect_with(&socket, &options).await.is_ok());
    });
    assert!(stranger.0.wait().unwrap().success());
}

/// A helper process that must not outlive a failed test (it would wait for
/// connections for ever).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
