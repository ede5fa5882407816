//! The application module process's local socket API and its Rust client.
//!
//! Transport: a Unix stream socket; one JSON object per line each way, so a
//! client in any language needs only a socket and a JSON library.
//!
//! Requests (`id` is chosen by the client, unique per connection):
//!
//! ```text
//! {"id":1,"op":"read_request","keys":["doc/7","stock/IBM"]}
//! {"id":1,"op":"read_done"}
//! {"id":2,"op":"update_request","keys":["doc/7"]}
//! {"id":2,"op":"update_done"}
//! ```
//!
//! Replies:
//!
//! ```text
//! {"id":1,"op":"read_proceed","deps":"n=0;i=…;doc/7=5@0,stock/IBM=3@1"}
//! {"id":2,"op":"update_proceed","deps":"n=0;i=…;doc/7=6@0"}   new versions, already visible
//! {"id":1,"op":"done"}
//! {"id":9,"op":"error","error":"…"}
//! ```
//!
//! `read_proceed` and `update_proceed` may come long after their request
//! (Table 1 queues them), and replies to different ids may interleave. The
//! `deps` string is the `X-Tierstack-Deps` header value for the response.
//!
//! An update's versions are bumped when it is granted, before its
//! `update_proceed` is sent, so cached copies stop validating before the new
//! content exists. A connection that closes releases everything it held and
//! abandons what it was waiting for.

use crate::module_core::{CoreError, Grant, Kind, ModuleCore};
use crate::table1::RequestId;
use crate::version_table::{VersionTable, VersionTableError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// Longest request line accepted.
pub const LINE_BYTES_MAX: usize = 64 * 1024;
/// Replies buffered per connection before the module stops reading from it.
const REPLY_QUEUE_MAX: usize = 4096;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub op: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reply {
    pub id: u64,
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deps: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    fn error(id: u64, error: impl ToString) -> Self {
        Reply { id, op: "error".into(), deps: None, error: Some(error.to_string()) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(transparent)]
    Table(#[from] VersionTableError),
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the module closed the connection")]
    Closed,
    #[error("the module refused the request: {0}")]
    Refused(String),
    #[error("bad reply from the module: {0}")]
    BadReply(String),
}

type ConnectionId = u64;

/// Where a request's replies go.
struct Owner {
    connection: ConnectionId,
    client_id: u64,
    kind: Kind,
    keys: Vec<(String, u32)>,
}

struct Shared {
    table: Arc<VersionTable>,
    core: Mutex<ModuleCore>,
    owners: Mutex<HashMap<RequestId, Owner>>,
    connections: Mutex<HashMap<ConnectionId, mpsc::Sender<Reply>>>,
    next_request: AtomicU64,
    /// Statistics: grants, updates.
    grants: AtomicU64,
    updates: AtomicU64,
}

/// How a [`ModuleServer`] behaves; `Default` is the real module.
#[derive(Clone, Debug, Default)]
pub struct ModuleOptions {
    /// TEST ONLY: admit reads while updates are in progress, violating
    /// Table 1 (see `ModuleCore::set_test_only_admit_reads_during_updates`).
    pub test_only_admit_reads_during_updates: bool,
}

/// The module's server: Table 1 queues, the version table, the socket.
pub struct ModuleServer {
    shared: Arc<Shared>,
}

impl ModuleServer {
    pub fn new(table: Arc<VersionTable>) -> Self {
        Self::with_options(table, &ModuleOptions::default())
    }

    pub fn with_options(table: Arc<VersionTable>, options: &ModuleOptions) -> Self {
        let mut core = ModuleCore::new();
        core.set_test_only_admit_reads_during_updates(options.test_only_admit_reads_during_updates);
        Self {
            shared: Arc::new(Shared {
                table,
                core: Mutex::new(core),
                owners: Mutex::new(HashMap::new()),
                connections: Mutex::new(HashMap::new()),
                next_request: AtomicU64::new(1),
                grants: AtomicU64::new(0),
                updates: AtomicU64::new(0),
            }),
        }
    }

    pub fn table(&self) -> &Arc<VersionTable> {
        &self.shared.table
    }

    /// Requests queued or holding access now.
    pub fn requests_in_progress(&self) -> usize {
        self.shared.core.lock().map(|core| core.requests()).unwrap_or(0)
    }

    /// Updates granted so far.
    pub fn updates(&self) -> u64 {
        self.shared.updates.load(Ordering::Relaxed)
    }

    /// Binds the module's socket at `path` (replacing a stale socket file).
    pub fn bind(path: &Path) -> Result<UnixListener, ModuleError> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        Ok(UnixListener::bind(path)?)
    }

    /// Serves the socket at `path` until the task is dropped.
    pub async fn serve(&self, path: &Path) -> Result<(), ModuleError> {
        self.serve_on(Self::bind(path)?).await
    }

    /// Serves an already bound socket until the task is dropped.
    pub async fn serve_on(&self, listener: UnixListener) -> Result<(), ModuleError> {
        let mut next_connection: ConnectionId = 0;
        loop {
            let (stream, _) = listener.accept().await?;
            next_connection += 1;
            let shared = self.shared.clone();
            let connection = next_connection;
            tokio::spawn(async move {
                if let Err(e) = serve_connection(shared, connection, stream).await {
                    tracing::debug!(connection, error = %e, "module connection ended");
                }
            });
        }
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    connection: ConnectionId,
    stream: UnixStream,
) -> Result<(), ModuleError> {
    let (read_half, mut write_half) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Reply>(REPLY_QUEUE_MAX);
    if let Ok(mut connections) = shared.connections.lock() {
        connections.insert(connection, tx.clone());
    }
    let writer = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            let mut line = serde_json::to_vec(&reply).unwrap_or_default();
            line.push(b'\n');
            if write_half.write_all(&line).await.is_err() {
                break;
            }
        }
    });
    // Maps this connection's ids to module-wide request ids.
    let mut ids: HashMap<u64, RequestId> = HashMap::new();
    let mut lines = BufReader::new(read_half);
    let mut line = String::new();
    let result = loop {
        line.clear();
        match (&mut lines).take(LINE_BYTES_MAX as u64 + 1).read_line(&mut line).await {
            Ok(0) => break Ok(()),
            Ok(n) if n > LINE_BYTES_MAX => {
                let _ = tx.send(Reply::error(0, "request line too long")).await;
                break Ok(());
            }
            Ok(_) => {}
            Err(e) => break Err(e.into()),
        }
        let reply = match serde_json::from_str::<Request>(line.trim_end()) {
            Ok(request) => handle(&shared, connection, &mut ids, request),
            Err(e) => Some(Reply::error(0, format!("malformed request: {e}"))),
        };
        if let Some(reply) = reply {
            if tx.send(reply).await.is_err() {
                break Ok(());
            }
        }
    };
    // The client is gone: release or abandon everything it had.
    if let Ok(mut connections) = shared.connections.lock() {
        connections.remove(&connection);
    }
    for request in ids.into_values() {
        let grants =
            shared.core.lock().map_err(|_| ModuleError::Closed).and_then(|mut core| Ok(core.abandon(request)?));
        if let Ok(mut owners) = shared.owners.lock() {
            owners.remove(&request);
        }
        if let Ok(grants) = grants {
            deliver(&shared, grants);
        }
    }
    drop(tx);
    let _ = writer.await;
    result
}

/// Applies one request; returns an immediate reply, if any.
fn handle(
    shared: &Arc<Shared>,
    connection: ConnectionId,
    ids: &mut HashMap<u64, RequestId>,
    request: Request,
) -> Option<Reply> {
    let id = request.id;
    let kind = match request.op.as_str() {
        "read_request" => Some(Kind::Read),
        "update_request" => Some(Kind::Update),
        "read_done" | "update_done" => None,
        other => return Some(Reply::error(id, format!("unknown op {other:?}"))),
    };
    match kind {
        Some(kind) => {
            if ids.contains_key(&id) {
                return Some(Reply::error(id, format!("id {id} is already in use on this connection")));
            }
            if request.keys.is_empty() {
                return Some(Reply::error(id, "a request needs at least one key"));
            }
            let keys: Result<Vec<(String, u32)>, VersionTableError> =
                request.keys.iter().map(|k| shared.table.slot_of(k).map(|slot| (k.clone(), slot))).collect();
            let keys = match keys {
                Ok(keys) => keys,
                Err(e) => return Some(Reply::error(id, e)),
            };
            let module_id = shared.next_request.fetch_add(1, Ordering::Relaxed);
            let slots: Vec<u32> = keys.iter().map(|(_, s)| *s).collect();
            if let Ok(mut owners) = shared.owners.lock() {
                owners.insert(module_id, Owner { connection, client_id: id, kind, keys });
            }
            ids.insert(id, module_id);
            let grants = shared
                .core
                .lock()
                .map_err(|_| CoreError::UnknownRequest(module_id))
                .and_then(|mut core| core.request(module_id, kind, &slots));
            match grants {
                Ok(grants) => {
                    deliver(shared, grants);
                    None
                }
                Err(e) => {
                    ids.remove(&id);
                    if let Ok(mut owners) = shared.owners.lock() {
                        owners.remove(&module_id);
                    }
                    Some(Reply::error(id, e))
                }
            }
        }
        None => {
            let Some(module_id) = ids.get(&id).copied() else {
                return Some(Reply::error(id, format!("{} for unknown id {id}", request.op)));
            };
            let owner_kind =
                shared.owners.lock().ok().and_then(|o| o.get(&module_id).map(|o| (o.kind, o.keys.clone())));
            let Some((owner_kind, keys)) = owner_kind else {
                return Some(Reply::error(id, "unknown request"));
            };
            let expected = if owner_kind == Kind::Read { "read_done" } else { "update_done" };
            if request.op != expected {
                return Some(Reply::error(id, format!("{} for a request that needs {expected}", request.op)));
            }
            let grants = shared
                .core
                .lock()
                .map_err(|_| CoreError::UnknownRequest(module_id))
                .and_then(|mut core| core.done(module_id));
            match grants {
                Ok(grants) => {
                    ids.remove(&id);
                    if let Ok(mut owners) = shared.owners.lock() {
                        owners.remove(&module_id);
                    }
                    // The final versions, read before anyone else is granted.
                    let deps = shared.table.header(&keys).map(|h| h.to_string()).ok();
                    deliver(shared, grants);
                    Some(Reply { id, op: "done".into(), deps, error: None })
                }
                Err(e) => Some(Reply::error(id, e)),
            }
        }
    }
}

/// Sends the proceed replies for `grants`; bumps versions for updates first.
fn deliver(shared: &Arc<Shared>, grants: Vec<Grant>) {
    for grant in grants {
        let owner = shared
            .owners
            .lock()
            .ok()
            .and_then(|o| o.get(&grant.id).map(|o| (o.connection, o.client_id, o.keys.clone())));
        let Some((connection, client_id, keys)) = owner else { continue };
        shared.grants.fetch_add(1, Ordering::Relaxed);
        let reply = match grant.kind {
            Kind::Update => {
                shared.updates.fetch_add(1, Ordering::Relaxed);
                let bumped: Result<(), VersionTableError> =
                    grant.slots.iter().try_for_each(|slot| shared.table.bump(*slot).map(|_| ()));
                match bumped.and_then(|()| shared.table.header(&keys)) {
                    Ok(header) => Reply {
                        id: client_id,
                        op: "update_proceed".into(),
                        deps: Some(header.to_string()),
                        error: None,
                    },
                    Err(e) => Reply::error(client_id, e),
                }
            }
            Kind::Read => match shared.table.header(&keys) {
                Ok(header) => {
                    Reply { id: client_id, op: "read_proceed".into(), deps: Some(header.to_string()), error: None }
                }
                Err(e) => Reply::error(client_id, e),
            },
        };
        let sender = shared.connections.lock().ok().and_then(|c| c.get(&connection).cloned());
        if let Some(sender) = sender {
            if sender.try_send(reply).is_err() {
                tracing::warn!(connection, "module reply queue full or closed; dropping the connection's reply");
            }
        }
    }
}

/// An async client of the module, shared by many concurrent tasks over one
/// connection. Replies are matched to requests by id.
pub struct ModuleClient {
    tx: mpsc::Sender<(Request, Option<oneshot::Sender<Reply>>)>,
    next_id: AtomicU64,
}

/// Permission to read (or update) that must be given back with `done`.
#[derive(Debug)]
pub struct Access {
    pub id: u64,
    /// The `X-Tierstack-Deps` value: versions at grant time.
    pub deps: String,
}

impl ModuleClient {
    /// Connects to the module's socket.
    pub async fn connect(path: &Path) -> Result<ModuleClient, ModuleError> {
        let stream = UnixStream::connect(path).await?;
        let (read_half, mut write_half) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<(Request, Option<oneshot::Sender<Reply>>)>(REPLY_QUEUE_MAX);
        let waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>> = Arc::new(Mutex::new(HashMap::new()));
        let writer_waiters = waiters.clone();
        tokio::spawn(async move {
            while let Some((request, waiter)) = rx.recv().await {
                if let Some(waiter) = waiter {
                    if let Ok(mut w) = writer_waiters.lock() {
                        w.insert(request.id, waiter);
                    }
                }
                let mut line = serde_json::to_vec(&request).unwrap_or_default();
                line.push(b'\n');
                if write_half.write_all(&line).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(read_half).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Reply>(&line) {
                    Ok(reply) => {
                        let waiter = waiters.lock().ok().and_then(|mut w| w.remove(&reply.id));
                        match waiter {
                            Some(waiter) => {
                                let _ = waiter.send(reply);
                            }
                            None if reply.op == "error" => {
                                tracing::warn!(id = reply.id, error = ?reply.error, "module error for a request nobody waits on")
                            }
                            None => {}
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "bad reply line from the module"),
                }
            }
            // Connection gone: waiters see Closed when their senders drop.
            if let Ok(mut w) = waiters.lock() {
                w.clear();
            }
        });
        Ok(ModuleClient { tx, next_id: AtomicU64::new(1) })
    }

    async fn call(&self, request: Request) -> Result<Reply, ModuleError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((request, Some(tx))).await.map_err(|_| ModuleError::Closed)?;
        let reply = rx.await.map_err(|_| ModuleError::Closed)?;
        match reply.op.as_str() {
            "error" => Err(ModuleError::Refused(reply.error.unwrap_or_default())),
            _ => Ok(reply),
        }
    }

    async fn acquire(&self, op: &str, expect: &str, keys: &[String]) -> Result<Access, ModuleError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let reply = self.call(Request { id, op: op.into(), keys: keys.to_vec() }).await?;
        if reply.op != expect {
            return Err(ModuleError::BadReply(format!("expected {expect}, got {}", reply.op)));
        }
        let deps = reply.deps.ok_or_else(|| ModuleError::BadReply("grant without deps".into()))?;
        Ok(Access { id, deps })
    }

    /// READ_REQUEST; resolves at READ_PROCEED with the versions to serve.
    pub async fn read(&self, keys: &[String]) -> Result<Access, ModuleError> {
        self.acquire("read_request", "read_proceed", keys).await
    }

    /// READ_DONE.
    pub async fn read_done(&self, access: Access) -> Result<(), ModuleError> {
        self.call(Request { id: access.id, op: "read_done".into(), keys: vec![] }).await.map(|_| ())
    }

    /// UPDATE_REQUEST; resolves at UPDATE_PROCEED (versions already bumped).
    pub async fn update(&self, keys: &[String]) -> Result<Access, ModuleError> {
        self.acquire("update_request", "update_proceed", keys).await
    }

    /// UPDATE_DONE; returns the final `X-Tierstack-Deps` value.
    pub async fn update_done(&self, access: Access) -> Result<String, ModuleError> {
        let reply = self.call(Request { id: access.id, op: "update_done".into(), keys: vec![] }).await?;
        reply.deps.ok_or_else(|| ModuleError::BadReply("done without deps".into()))
    }
}
