//! The module's async Rust client: one connection shared by many tasks,
//! replies matched to requests by id, every call deadlined (see the
//! protocol in the parent module's documentation).

use super::{ModuleError, Reply, Request, CALL_TIMEOUT_DEFAULT, REPLY_QUEUE_MAX};
use crate::pages::Page;
use crate::update_plan::VersionsAt;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// The client's calls waiting for replies, and whether the connection ended.
#[derive(Default)]
struct Waiters {
    by_id: HashMap<u64, oneshot::Sender<Reply>>,
    closed: bool,
}

/// An async client of the module, shared by many concurrent tasks over one
/// connection. Replies are matched to requests by id. Every call has a
/// deadline; a call that misses it cancels its request at the module, so a
/// grant that comes later is released rather than held forever.
pub struct ModuleClient {
    requests: mpsc::Sender<Request>,
    waiters: Arc<Mutex<Waiters>>,
    next_id: AtomicU64,
    call_timeout: Duration,
}

/// How a [`ModuleClient`] connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Each call's deadline (see [`ModuleClient::connect_with_timeout`]).
    pub call_timeout: Duration,
    /// Users the module may run as besides this process's own and root.
    pub module_uids: Vec<u32>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { call_timeout: CALL_TIMEOUT_DEFAULT, module_uids: Vec::new() }
    }
}

/// Permission to read (or update) that must be given back with `done`.
#[derive(Debug)]
pub struct Access {
    pub id: u64,
    /// The `X-Tierstack-Deps` value: versions at grant time (for an
    /// update: the versions it produces).
    pub deps: String,
    /// An update whose versions become visible only at its UPDATE_DONE
    /// (the module's `done` mode): until then proxies validate the
    /// previous versions, so a push made before UPDATE_DONE would be refused.
    pub visible_at_done: bool,
}

/// What UPDATE_DONE answered ([`ModuleClient::update_done_with_page`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateDone {
    /// The `X-Tierstack-Deps` value of the versions this update produced.
    pub deps: String,
    /// `None`: no page was given; `Some(Ok)`: published; `Some(Err(why))`: not.
    pub published: Option<Result<(), String>>,
}

impl ModuleClient {
    /// Connects to the module's socket; calls wait at most [`CALL_TIMEOUT_DEFAULT`].
    pub async fn connect(path: &Path) -> Result<ModuleClient, ModuleError> {
        Self::connect_with_timeout(path, CALL_TIMEOUT_DEFAULT).await
    }

    /// Connects to the module's socket; each call (a request and its reply,
    /// including a grant's wait in Table 1's queues) fails with
    /// [`ModuleError::Timeout`] after `call_timeout`.
    pub async fn connect_with_timeout(path: &Path, call_timeout: Duration) -> Result<ModuleClient, ModuleError> {
        Self::connect_with(path, &ClientOptions { call_timeout, ..ClientOptions::default() }).await
    }

    /// Connects to the module's socket as `options` say. The module must run
    /// as this process's user, root, or one of `options.module_uids`
    /// (`SO_PEERCRED`): whoever answers on the path hands out the versions
    /// this client's responses carry, so a stranger's socket planted there
    /// is refused.
    pub async fn connect_with(path: &Path, options: &ClientOptions) -> Result<ModuleClient, ModuleError> {
        let call_timeout = options.call_timeout;
        let stream = UnixStream::connect(path).await?;
        let module_uid = stream.peer_cred()?.uid();
        let me = crate::module_socket::effective_uid();
        if module_uid != 0 && module_uid != me && !options.module_uids.contains(&module_uid) {
            return Err(ModuleError::UntrustedModule { uid: module_uid });
        }
        let (read_half, mut write_half) = stream.into_split();
        let (requests, mut outgoing) = mpsc::channel::<Request>(REPLY_QUEUE_MAX);
        let waiters: Arc<Mutex<Waiters>> = Arc::default();
        tokio::spawn(async move {
            while let Some(request) = outgoing.recv().await {
                let mut line = serde_json::to_vec(&request).unwrap_or_default();
                line.push(b'\n');
                if write_half.write_all(&line).await.is_err() {
                    break;
                }
            }
        });
        let reading = waiters.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(read_half).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Reply>(&line) {
                    Ok(reply) => {
                        let waiter = reading.lock().ok().and_then(|mut w| w.by_id.remove(&reply.id));
                        match waiter {
                            Some(waiter) => {
                                let _ = waiter.send(reply);
                            }
                            None if reply.op == "error" => {
                                tracing::warn!(id = reply.id, error = ?reply.error, "module error for a request nobody waits on")
                            }
                            None if reply.op == "revoked" => {
                                tracing::warn!(id = reply.id, "the module revoked a grant held past its lifetime")
                            }
                            // A grant or `done` for a call that gave up (and cancelled).
                            None => {}
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "bad reply line from the module"),
                }
            }
            // Connection gone: waiters see Closed when their senders drop,
            // and later calls fail at once.
            if let Ok(mut w) = reading.lock() {
                w.closed = true;
                w.by_id.clear();
            }
        });
        Ok(ModuleClient { requests, waiters, next_id: AtomicU64::new(1), call_timeout })
    }

    fn forget(&self, id: u64) {
        if let Ok(mut w) = self.waiters.lock() {
            w.by_id.remove(&id);
        }
    }

    async fn call(&self, request: Request) -> Result<Reply, ModuleError> {
        let id = request.id;
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().map_err(|_| ModuleError::Closed)?;
            if waiters.closed {
                return Err(ModuleError::Closed);
            }
            waiters.by_id.insert(id, tx);
        }
        let exchange = async {
            self.requests.send(request).await.map_err(|_| ModuleError::Closed)?;
            rx.await.map_err(|_| ModuleError::Closed)
        };
        let reply = match tokio::time::timeout(self.call_timeout, exchange).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                self.forget(id);
                return Err(e);
            }
            Err(_) => {
                self.forget(id);
                self.cancel(id).await;
                return Err(ModuleError::Timeout { waited_ms: self.call_timeout.as_millis() });
            }
        };
        match reply.op.as_str() {
            "error" => Err(ModuleError::Refused(reply.error.unwrap_or_default())),
            // Crossed with this call (a DONE sent just as the module revoked the grant).
            "revoked" => Err(ModuleError::Revoked),
            _ => Ok(reply),
        }
    }

    /// Gives request `id` up at the module: released if it was granted (or
    /// when it is), harmlessly refused if it already finished. Queued behind
    /// the request itself, so the module never sees it first.
    async fn cancel(&self, id: u64) {
        let cancel = Request { id, op: "cancel".into(), keys: vec![], page: None };
        match tokio::time::timeout(self.call_timeout, self.requests.send(cancel)).await {
            Ok(Ok(())) => {}
            // Connection gone: the module released everything it held.
            Ok(Err(_)) => {}
            Err(_) => tracing::warn!(id, "could not send a cancel to the module in time"),
        }
    }

    async fn acquire(&self, op: &str, expect: &str, keys: &[String]) -> Result<Access, ModuleError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let reply = self.call(Request { id, op: op.into(), keys: keys.to_vec(), page: None }).await?;
        if reply.op != expect {
            return Err(ModuleError::BadReply(format!("expected {expect}, got {}", reply.op)));
        }
        let deps = reply.deps.ok_or_else(|| ModuleError::BadReply("grant without deps".into()))?;
        let visible_at_done = reply.visible.as_deref() == Some(VersionsAt::Done.name());
        Ok(Access { id, deps, visible_at_done })
    }

    /// READ_REQUEST; resolves at READ_PROCEED with the versions to serve.
    pub async fn read(&self, keys: &[String]) -> Result<Access, ModuleError> {
        self.acquire("read_request", "read_proceed", keys).await
    }

    /// READ_DONE.
    pub async fn read_done(&self, access: Access) -> Result<(), ModuleError> {
        self.call(Request { id: access.id, op: "read_done".into(), keys: vec![], page: None }).await.map(|_| ())
    }

    /// UPDATE_REQUEST; resolves at UPDATE_PROCEED (versions already bumped).
    pub async fn update(&self, keys: &[String]) -> Result<Access, ModuleError> {
        self.acquire("update_request", "update_proceed", keys).await
    }

    /// UPDATE_DONE; returns the `X-Tierstack-Deps` value of the versions this
    /// update produced (those of its UPDATE_PROCEED).
    pub async fn update_done(&self, access: Access) -> Result<String, ModuleError> {
        self.update_done_with_page(access, None).await.map(|done| done.deps)
    }

    /// UPDATE_DONE handing the module the update's new `page` to publish
    /// (see the module docs); the update completes whether or not the page
    /// could be published, and the answer says which.
    pub async fn update_done_with_page(&self, access: Access, page: Option<Page>) -> Result<UpdateDone, ModuleError> {
        let brought_page = page.is_some();
        let request = Request { id: access.id, op: "update_done".into(), keys: vec![], page };
        let reply = self.call(request).await?;
        let deps = reply.deps.ok_or_else(|| ModuleError::BadReply("done without deps".into()))?;
        let published = match (brought_page, reply.published) {
            (false, _) => None,
            (true, Some(true)) => Some(Ok(())),
            (true, Some(false)) => Some(Err(reply.unpublished.unwrap_or_default())),
            (true, None) => return Err(ModuleError::BadReply("done without the page's fate".into())),
        };
        Ok(UpdateDone { deps, published })
    }
}
