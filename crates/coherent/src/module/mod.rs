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
//! {"id":2,"op":"update_done","page":{"path":"/doc/7","headers":[["content-type","text/plain"]],"body":"…"}}
//! {"id":3,"op":"cancel"}        gives up request 3, granted or not
//! ```
//!
//! `page` (optional) is the update's new page, published for proxies to
//! read one-sidedly ([`crate::pages`]): `path` (the request target it
//! answers), `status` (200, the default), `headers` (end-to-end fields,
//! `[name, value]` each), and the body as `body` (text) or `body_base64`.
//! It is stored under the update's first key, at the versions the update
//! produced. A page that cannot be published (too large, malformed, no
//! area) does not fail the update: `done` says `"published":false` and why.
//!
//! Replies:
//!
//! ```text
//! {"id":1,"op":"read_proceed","deps":"n=0;i=…;doc/7=5@0,stock/IBM=3@1"}
//! {"id":2,"op":"update_proceed","deps":"n=0;i=…;doc/7=6@0"}   new versions, already visible
//! {"id":2,"op":"update_proceed","deps":"…","visible":"done"}  new versions, visible at UPDATE_DONE
//! {"id":1,"op":"done","deps":"…"}   the versions of the grant being given back
//! {"id":2,"op":"done","deps":"…","published":true}   an update_done that brought a page
//! {"id":9,"op":"error","error":"…"}
//! {"id":2,"op":"revoked"}     the grant of 2 was held past the grant lifetime and taken back
//! ```
//!
//! `read_proceed` and `update_proceed` may come long after their request
//! (Table 1 queues them), and replies to different ids may interleave. The
//! `deps` string is the `X-Tierstack-Deps` header value for the response.
//!
//! When an update's versions become visible depends on the module's mode
//! ([`crate::update_plan`], `--versions-at`): at the grant, before its
//! `update_proceed` is sent (`proceed`, the paper's: cached copies stop
//! validating before the new content exists), or at `update_done`, after its
//! page is published and before `done` is sent (`done`: proxies serve the
//! previous version while the update runs; its `update_proceed` says
//! `"visible":"done"`). Grants, version changes and the versions a grant
//! reports are decided together under the module's lock, so `update_done`
//! answers with the versions this update produced, never a later update's.
//!
//! A connection that closes releases everything it held and abandons what it
//! was waiting for; `cancel` does the same for one request (a client whose
//! call timed out). A connection that does not read its replies, so that
//! [`REPLY_QUEUE_MAX`] of them pile up, cannot keep up: the module closes it,
//! which releases what it held; no grant is ever silently dropped.
//!
//! A connection that stays open but stops finishing what it was granted (an
//! application server stopped with SIGSTOP, or hung) would hold its keys for
//! ever. So a grant lives at most the *grant lifetime*
//! ([`ModuleOptions::grant_lifetime`], `--grant-timeout-ms`): then the module
//! revokes it, tells the holder `revoked`, and serves the requests behind
//! it. A revoked update's keys go one version past the one it was granted,
//! retiring it (and, in `done` mode, the previous one, whose data the holder
//! may have changed): whatever its holder still produces or pushes under
//! them never validates as current, and its late `update_done` is refused,
//! so no version ever names two contents. A granted update that is
//! cancelled or whose connection closes is retired the same way. A revoked read's late `read_done` is
//! refused too; its response carries versions the next update retires.
//!
//! Who may connect, and the socket file itself: [`crate::module_socket`].
//! What the module counts (grants, queues, update hold times), for its
//! `/metrics`: [`ModuleServer::stats`].

mod client;
mod stats;

pub use client::{Access, ClientOptions, ModuleClient, UpdateDone};
pub use stats::ModuleStats;

use crate::module_core::{CoreError, Grant, Kind, ModuleCore};
use crate::module_socket::SocketAccess;
use crate::pages::{Page, PageParts};
use crate::table1::RequestId;
use crate::update_plan::{self, Step, VersionsAt};
use crate::version_table::{VersionTable, VersionTableError};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tierstack_base::time::instant_now;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Notify};

/// Longest request line accepted: room for the largest published page in
/// base64 (`crate::pages::PAGE_BYTES_MAX`), with its fields.
pub const LINE_BYTES_MAX: usize = 2 << 20;
/// Replies queued per connection; a connection whose queue is full is closed.
pub const REPLY_QUEUE_MAX: usize = 4096;
/// How long a [`ModuleClient`] call waits for its reply unless told otherwise.
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// How long a grant may be held unless told otherwise (`--grant-timeout-ms`):
/// far beyond any healthy request's hold, short enough that a stopped
/// holder delays the others seconds, not for ever.
pub const GRANT_LIFETIME_DEFAULT: Duration = Duration::from_secs(10);
/// Shortest grant lifetime accepted: below it, healthy holders would be revoked.
pub const GRANT_LIFETIME_MIN: Duration = Duration::from_millis(10);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub op: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// With `update_done`: the update's new page, to publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<Page>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reply {
    pub id: u64,
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deps: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// On `update_proceed` in `done` mode: `"done"`, the versions become
    /// visible at UPDATE_DONE (absent: already visible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible: Option<String>,
    /// On the `done` of an `update_done` that brought a page: whether it
    /// was published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// Why the page was not published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpublished: Option<String>,
}

impl Reply {
    fn new(id: u64, op: &str, deps: Option<String>) -> Self {
        Reply { id, op: op.into(), deps, error: None, visible: None, published: None, unpublished: None }
    }

    fn error(id: u64, error: impl ToString) -> Self {
        Reply { error: Some(error.to_string()), ..Reply::new(id, "error", None) }
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
    #[error("no reply from the module within {waited_ms} ms")]
    Timeout { waited_ms: u128 },
    #[error("the module's state lock is poisoned")]
    Poisoned,
    #[error("the connection's reply queue is full: it does not read its replies")]
    TooSlow,
    #[error("the grant was revoked: held past the module's grant lifetime")]
    Revoked,
    #[error("the socket is served by uid {uid}, not a user this client trusts to run the module")]
    UntrustedModule { uid: u32 },
    #[error("a module already serves {}", .0.display())]
    AlreadyServed(PathBuf),
    #[error("the module's socket: {0}")]
    Socket(String),
    #[error("grant lifetime {0:?} is below the minimum {GRANT_LIFETIME_MIN:?}")]
    GrantLifetime(Duration),
}

type ConnectionId = u64;

/// Where a request's replies go.
struct Owner {
    connection: ConnectionId,
    client_id: u64,
    kind: Kind,
    keys: Vec<(String, u32)>,
    /// The `deps` of its grant (for an update: the versions it produced),
    /// set when granted.
    granted_deps: Option<String>,
    /// For a granted update: the versions it produces, one per key of `keys`.
    granted_versions: Vec<u64>,
    /// Taken back after the grant lifetime: the core has forgotten it, and
    /// this entry only remains to refuse its late DONE in clear words.
    revoked: bool,
    /// When an update was granted (its hold time ends at UPDATE_DONE).
    granted_at: Option<Instant>,
}

/// A live connection: its reply queue, and how to close it.
struct Connection {
    replies: mpsc::Sender<Reply>,
    close: Arc<Notify>,
}

/// Replies to send once the locks are released: (connection, reply).
type Outbox = Vec<(ConnectionId, Reply)>;

struct Shared {
    table: Arc<VersionTable>,
    versions_at: VersionsAt,
    /// Lock order: `core`, then `owners`.
    core: Mutex<ModuleCore>,
    owners: Mutex<HashMap<RequestId, Owner>>,
    connections: Mutex<HashMap<ConnectionId, Connection>>,
    next_request: AtomicU64,
    /// The origin of the time passed to the core.
    started: Instant,
    counters: stats::Counters,
}

/// How a [`ModuleServer`] behaves; `Default` is the real module.
#[derive(Clone, Debug)]
pub struct ModuleOptions {
    /// TEST ONLY: admit reads while updates are in progress, violating
    /// Table 1 (see `ModuleCore::set_test_only_admit_reads_during_updates`).
    pub test_only_admit_reads_during_updates: bool,
    /// How long a grant may be held before it is revoked (at least
    /// [`GRANT_LIFETIME_MIN`]); `None`: for ever.
    pub grant_lifetime: Option<Duration>,
    /// Who may connect, and the socket file's group.
    pub access: SocketAccess,
    /// When an update's versions become visible ([`crate::update_plan`]).
    pub versions_at: VersionsAt,
}

impl Default for ModuleOptions {
    fn default() -> Self {
        ModuleOptions {
            test_only_admit_reads_during_updates: false,
            grant_lifetime: Some(GRANT_LIFETIME_DEFAULT),
            access: SocketAccess::default(),
            versions_at: VersionsAt::default(),
        }
    }
}

/// The module's server: Table 1 queues, the version table, the socket.
pub struct ModuleServer {
    shared: Arc<Shared>,
    access: SocketAccess,
    grant_lifetime: Option<Duration>,
}

impl ModuleServer {
    /// The real module: [`ModuleOptions::default`].
    pub fn new(table: Arc<VersionTable>) -> Self {
        Self::build(table, ModuleOptions::default())
    }

    /// A module as `options` say; refuses a grant lifetime below [`GRANT_LIFETIME_MIN`].
    pub fn with_options(table: Arc<VersionTable>, options: &ModuleOptions) -> Result<Self, ModuleError> {
        match options.grant_lifetime {
            Some(lifetime) if lifetime < GRANT_LIFETIME_MIN => Err(ModuleError::GrantLifetime(lifetime)),
            _ => Ok(Self::build(table, options.clone())),
        }
    }

    fn build(table: Arc<VersionTable>, options: ModuleOptions) -> Self {
        let mut core = ModuleCore::new();
        core.set_test_only_admit_reads_during_updates(options.test_only_admit_reads_during_updates);
        core.set_grant_lifetime(options.grant_lifetime);
        Self {
            shared: Arc::new(Shared {
                table,
                versions_at: options.versions_at,
                core: Mutex::new(core),
                owners: Mutex::new(HashMap::new()),
                connections: Mutex::new(HashMap::new()),
                next_request: AtomicU64::new(1),
                started: instant_now(),
                counters: stats::Counters::default(),
            }),
            access: options.access,
            grant_lifetime: options.grant_lifetime,
        }
    }

    pub fn table(&self) -> &Arc<VersionTable> {
        &self.shared.table
    }

    /// When this module's updates become visible.
    pub fn versions_at(&self) -> VersionsAt {
        self.shared.versions_at
    }

    /// Binds the module's socket at `path`, mode 0600, refusing a live
    /// module's socket and anything not a socket (see
    /// [`crate::module_socket::bind`]).
    pub async fn bind(path: &Path) -> Result<UnixListener, ModuleError> {
        crate::module_socket::bind(path, &SocketAccess::default()).await
    }

    /// Serves the socket at `path` (bound with this module's access) until the task is dropped.
    pub async fn serve(&self, path: &Path) -> Result<(), ModuleError> {
        self.serve_on(crate::module_socket::bind(path, &self.access).await?).await
    }

    /// Serves an already bound socket until the task is dropped; revokes
    /// grants that outlive the grant lifetime meanwhile.
    pub async fn serve_on(&self, listener: UnixListener) -> Result<(), ModuleError> {
        tokio::select! {
            result = self.accept_loop(listener) => result,
            () = self.revoke_loop() => Ok(()),
        }
    }

    /// Checks for expired grants a few times per lifetime, so one is revoked
    /// at most a quarter lifetime late.
    async fn revoke_loop(&self) {
        let Some(lifetime) = self.grant_lifetime else { return std::future::pending().await };
        let mut ticks = tokio::time::interval((lifetime / 4).max(Duration::from_millis(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            revoke_expired(&self.shared);
        }
    }

    async fn accept_loop(&self, listener: UnixListener) -> Result<(), ModuleError> {
        let mut next_connection: ConnectionId = 0;
        loop {
            let (stream, _) = listener.accept().await?;
            let refusal = match stream.peer_cred() {
                Ok(peer) if self.access.allows(peer.uid(), peer.gid()) => None,
                Ok(peer) => Some(format!("uid {} gid {} pid {:?} is not allowed", peer.uid(), peer.gid(), peer.pid())),
                Err(e) => Some(format!("its credentials are unknown: {e}")),
            };
            if let Some(reason) = refusal {
                stats::Counters::bump(&self.shared.counters.peers_refused);
                tracing::warn!(%reason, "module: refused a connection");
                continue;
            }
            next_connection += 1;
            stats::Counters::bump(&self.shared.counters.connections_accepted);
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
    let close = Arc::new(Notify::new());
    if let Ok(mut connections) = shared.connections.lock() {
        connections.insert(connection, Connection { replies: tx.clone(), close: close.clone() });
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
        let mut limited = (&mut lines).take(LINE_BYTES_MAX as u64 + 1);
        let read = tokio::select! {
            biased;
            () = close.notified() => break Err(ModuleError::TooSlow),
            read = limited.read_line(&mut line) => read,
        };
        match read {
            Ok(0) => break Ok(()),
            Ok(n) if n > LINE_BYTES_MAX => {
                let _ = tx.try_send(Reply::error(0, "request line too long"));
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
            if reply.error.is_some() {
                stats::Counters::bump(&shared.counters.refused);
            }
            // The same rule as for grants: a client that lets its replies pile up is closed.
            match tx.try_send(reply) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => break Err(ModuleError::TooSlow),
                Err(mpsc::error::TrySendError::Closed(_)) => break Err(ModuleError::Closed),
            }
        }
    };
    // The client is gone or is being closed: release or abandon everything it had.
    if let Ok(mut connections) = shared.connections.lock() {
        connections.remove(&connection);
    }
    for request in ids.into_values() {
        let abandoned = locked(&shared, |core, owners| match owners.remove(&request) {
            // Revoked: the core has already released it.
            Some(owner) if owner.revoked => Ok(((), Vec::new())),
            owner => {
                if let Some(owner) = owner {
                    retire(&shared, &owner);
                }
                Ok(((), core.abandon(request)?))
            }
        });
        match abandoned {
            Ok(((), outbox)) => send_all(&shared, outbox),
            Err(e) => {
                tracing::warn!(connection, request, error = %e, "could not release a closed connection's request")
            }
        }
    }
    drop(tx);
    if result.is_ok() {
        // Flush what is queued (a last error reply) to a client that reads.
        let _ = writer.await;
    } else {
        // A client that does not read would keep the writer blocked forever.
        writer.abort();
    }
    result
}

/// Runs `step` with the core and the owners locked, then turns the grants it
/// returns into proceed replies before unlocking: an update's versions are
/// bumped and every grant's versions read while no other grant can happen,
/// so each reply (and a later `done`) carries exactly its own grant's
/// versions.
fn locked<T>(
    shared: &Shared,
    step: impl FnOnce(&mut ModuleCore, &mut HashMap<RequestId, Owner>) -> Result<(T, Vec<Grant>), ModuleError>,
) -> Result<(T, Outbox), ModuleError> {
    let mut core = shared.core.lock().map_err(|_| ModuleError::Poisoned)?;
    let mut owners = shared.owners.lock().map_err(|_| ModuleError::Poisoned)?;
    // Grants made in this step are stamped with this time (the lifetime's start).
    core.observe_time(instant_now().saturating_duration_since(shared.started));
    let (value, grants) = step(&mut core, &mut owners)?;
    let mut grants = VecDeque::from(grants);
    let mut outbox = Vec::new();
    while let Some(grant) = grants.pop_front() {
        let Some(owner) = owners.get_mut(&grant.id) else { continue };
        stats::Counters::bump(&shared.counters.grants);
        let (op, deps) = match grant.kind {
            Kind::Update => {
                stats::Counters::bump(&shared.counters.updates);
                owner.granted_at = Some(instant_now());
                ("update_proceed", grant_update(shared, owner))
            }
            Kind::Read => {
                stats::Counters::bump(&shared.counters.reads);
                ("read_proceed", shared.table.header(&owner.keys))
            }
        };
        match deps {
            Ok(deps) => {
                let deps = deps.to_string();
                owner.granted_deps = Some(deps.clone());
                let mut reply = Reply::new(owner.client_id, op, Some(deps));
                if grant.kind == Kind::Update && shared.versions_at == VersionsAt::Done {
                    reply.visible = Some(VersionsAt::Done.name().into());
                }
                outbox.push((owner.connection, reply));
            }
            Err(e) => {
                // Granted but unusable: tell the client and give the keys back at once.
                outbox.push((owner.connection, Reply::error(owner.client_id, e)));
                owners.remove(&grant.id);
                // Not `?`: the replies already in the outbox are grants too.
                match core.abandon(grant.id) {
                    Ok(more) => grants.extend(more),
                    Err(e) => tracing::error!(request = grant.id, error = %e, "could not release an unusable grant"),
                }
            }
        }
    }
    Ok((value, outbox))
}

/// An update's grant ([`update_plan::grant_steps`]): the versions it
/// produces, made visible now in `proceed` mode; returns the header its
/// `update_proceed` carries (the reply itself is the plan's last step, sent
/// once the lock is released).
fn grant_update(shared: &Shared, owner: &mut Owner) -> Result<crate::deps::DepsHeader, VersionTableError> {
    let versions = owner
        .keys
        .iter()
        .map(|(_, slot)| shared.table.version(*slot).map(update_plan::granted_version))
        .collect::<Result<Vec<u64>, _>>()?;
    for step in update_plan::grant_steps(shared.versions_at) {
        match step {
            Step::MakeVisible => make_visible(shared, &owner.keys, &versions)?,
            Step::Publish | Step::Reply => {}
        }
    }
    let header = shared.table.header_at(&owner.keys, &versions);
    owner.granted_versions = versions;
    Ok(header)
}

fn make_visible(shared: &Shared, keys: &[(String, u32)], versions: &[u64]) -> Result<(), VersionTableError> {
    keys.iter().zip(versions).try_for_each(|((_, slot), version)| shared.table.advance_to(*slot, *version))
}

/// A granted update given up before its UPDATE_DONE (revoked, cancelled,
/// its connection closed): its keys go past the version it was granted
/// ([`update_plan::retired_version`]). Nothing for a read or an update not
/// yet granted.
fn retire(shared: &Shared, owner: &Owner) {
    if owner.kind != Kind::Update || owner.granted_deps.is_none() {
        return;
    }
    for ((key, slot), granted) in owner.keys.iter().zip(&owner.granted_versions) {
        if let Err(e) = shared.table.advance_to(*slot, update_plan::retired_version(*granted)) {
            tracing::error!(key, error = %e, "could not retire a given-up update's version");
        }
    }
}

/// UPDATE_DONE's steps before its reply ([`update_plan::done_steps`]):
/// publish the page, if any, at the versions the update produced, then (in
/// `done` mode) make those versions visible. Returns whether the page was
/// published, and why not.
fn complete_update(
    shared: &Shared,
    owner: &Owner,
    mut page: Option<Result<PageParts, String>>,
) -> Result<Option<Result<(), String>>, VersionTableError> {
    let mut published = None;
    for step in update_plan::done_steps(shared.versions_at) {
        match step {
            Step::Publish => {
                published = page.take().map(|page| {
                    let (deps, (_, first)) = match (&owner.granted_deps, owner.keys.first()) {
                        (Some(deps), Some(first)) => (deps, first),
                        _ => return Err("the update has no granted versions".to_string()),
                    };
                    shared.table.publish(*first, deps, &page?).map_err(|e| e.to_string())
                });
            }
            Step::MakeVisible => make_visible(shared, &owner.keys, &owner.granted_versions)?,
            Step::Reply => {}
        }
    }
    match &published {
        Some(Ok(())) => stats::Counters::bump(&shared.counters.pages_published),
        Some(Err(_)) => stats::Counters::bump(&shared.counters.pages_unpublished),
        None => {}
    };
    if let Some(granted_at) = owner.granted_at {
        shared.counters.update_seconds.record(instant_now().saturating_duration_since(granted_at));
    }
    Ok(published)
}

/// Queues `reply` for `connection`. A connection whose queue is full (it does
/// not read its replies) or whose writer has stopped is closed, and closing
/// releases what it held, so the grant is not lost. A connection that is
/// already gone has had (or will have) all its requests abandoned.
fn send(shared: &Shared, connection: ConnectionId, reply: Reply) {
    let target = shared
        .connections
        .lock()
        .ok()
        .and_then(|c| c.get(&connection).map(|connection| (connection.replies.clone(), connection.close.clone())));
    let Some((replies, close)) = target else { return };
    if replies.try_send(reply).is_err() {
        tracing::warn!(connection, "module reply queue full or closed; closing the connection");
        close.notify_one();
    }
}

/// Takes back the grants held past the grant lifetime (see the module docs),
/// bumps a revoked update's keys once more, tells the holders, and sends the
/// grants that follow.
fn revoke_expired(shared: &Shared) {
    let now = instant_now().saturating_duration_since(shared.started);
    let revoked = locked(shared, |core, owners| {
        let revocation = core.revoke_expired(now)?;
        let mut notices = Outbox::new();
        for grant in &revocation.revoked {
            stats::Counters::bump(&shared.counters.revoked);
            if let Some(owner) = owners.get_mut(&grant.id) {
                // Retire the versions the stopped holder may still produce content under.
                retire(shared, owner);
                owner.revoked = true;
                tracing::warn!(
                    connection = owner.connection,
                    id = owner.client_id,
                    kind = ?grant.kind,
                    "module: revoked a grant held past the grant lifetime"
                );
                notices.push((owner.connection, Reply::new(owner.client_id, "revoked", None)));
            }
        }
        Ok((notices, revocation.grants))
    });
    match revoked {
        Ok((notices, outbox)) => {
            send_all(shared, notices);
            send_all(shared, outbox);
        }
        Err(e) => tracing::error!(error = %e, "could not revoke expired grants"),
    }
}

fn send_all(shared: &Shared, outbox: Outbox) {
    for (connection, reply) in outbox {
        send(shared, connection, reply);
    }
}

/// Applies one request; returns an immediate reply, if any.
fn handle(
    shared: &Arc<Shared>,
    connection: ConnectionId,
    ids: &mut HashMap<u64, RequestId>,
    request: Request,
) -> Option<Reply> {
    let id = request.id;
    match request.op.as_str() {
        "read_request" => begin(shared, connection, ids, id, Kind::Read, &request.keys),
        "update_request" => begin(shared, connection, ids, id, Kind::Update, &request.keys),
        "read_done" | "update_done" | "cancel" => finish(shared, ids, request),
        other => Some(Reply::error(id, format!("unknown op {other:?}"))),
    }
}

/// READ_REQUEST or UPDATE_REQUEST: queues it; its grant is sent when it comes.
fn begin(
    shared: &Arc<Shared>,
    connection: ConnectionId,
    ids: &mut HashMap<u64, RequestId>,
    id: u64,
    kind: Kind,
    keys: &[String],
) -> Option<Reply> {
    if ids.contains_key(&id) {
        return Some(Reply::error(id, format!("id {id} is already in use on this connection")));
    }
    if keys.is_empty() {
        return Some(Reply::error(id, "a request needs at least one key"));
    }
    // A key named twice is one key (the first mention's place kept): its
    // version must change once.
    let mut unique: Vec<&String> = Vec::with_capacity(keys.len());
    for key in keys {
        if !unique.contains(&key) {
            unique.push(key);
        }
    }
    let keys: Result<Vec<(String, u32)>, VersionTableError> =
        unique.into_iter().map(|k| shared.table.slot_of(k).map(|slot| (k.clone(), slot))).collect();
    let keys = match keys {
        Ok(keys) => keys,
        Err(e) => return Some(Reply::error(id, e)),
    };
    let module_id = shared.next_request.fetch_add(1, Ordering::Relaxed);
    let slots: Vec<u32> = keys.iter().map(|(_, s)| *s).collect();
    let requested = locked(shared, |core, owners| {
        let owner = Owner {
            connection,
            client_id: id,
            kind,
            keys,
            granted_deps: None,
            granted_versions: Vec::new(),
            revoked: false,
            granted_at: None,
        };
        owners.insert(module_id, owner);
        match core.request(module_id, kind, &slots) {
            Ok(grants) => {
                if !grants.iter().any(|grant| grant.id == module_id) {
                    stats::Counters::bump(&shared.counters.queued);
                }
                Ok(((), grants))
            }
            Err(e) => {
                owners.remove(&module_id);
                Err(e.into())
            }
        }
    });
    match requested {
        Ok(((), outbox)) => {
            ids.insert(id, module_id);
            send_all(shared, outbox);
            None
        }
        Err(e) => Some(Reply::error(id, e)),
    }
}

/// READ_DONE, UPDATE_DONE or CANCEL for a request of this connection.
fn finish(shared: &Arc<Shared>, ids: &mut HashMap<u64, RequestId>, request: Request) -> Option<Reply> {
    let id = request.id;
    let Some(module_id) = ids.get(&id).copied() else {
        return Some(Reply::error(id, format!("{} for unknown id {id}", request.op)));
    };
    let cancel = request.op == "cancel";
    // Checked and decoded before the lock is taken.
    let page = request.page.map(|page| page.into_parts().map_err(|e| e.to_string()));
    let finished = locked(shared, |core, owners| {
        let owner = owners.get(&module_id).ok_or(CoreError::UnknownRequest(module_id))?;
        if owner.revoked {
            owners.remove(&module_id);
            return if cancel { Ok(((None, None), Vec::new())) } else { Err(ModuleError::Revoked) };
        }
        let expected = if owner.kind == Kind::Read { "read_done" } else { "update_done" };
        if !cancel && request.op != expected {
            return Err(ModuleError::Refused(format!("{} for a request that needs {expected}", request.op)));
        }
        if page.is_some() && owner.kind != Kind::Update {
            return Err(ModuleError::Refused("only update_done may bring a page".into()));
        }
        let grantee = owner.granted_deps.is_some();
        let published = match (cancel, owner.kind) {
            (true, _) => {
                retire(shared, owner);
                None
            }
            // A DONE before the grant is refused by the core below; nothing is changed.
            (false, Kind::Update) if grantee => complete_update(shared, owner, page)?,
            (false, _) => None,
        };
        let grants = if cancel { core.abandon(module_id)? } else { core.done(module_id)? };
        let deps = owners.remove(&module_id).and_then(|owner| owner.granted_deps);
        Ok(((deps, published), grants))
    });
    match finished {
        Ok(((deps, published), outbox)) => {
            ids.remove(&id);
            send_all(shared, outbox);
            let mut reply = Reply::new(id, "done", deps);
            if let Some(published) = published {
                reply.published = Some(published.is_ok());
                reply.unpublished = published.err();
            }
            Some(reply)
        }
        // A protocol mistake is reported in its own words.
        Err(ModuleError::Refused(e)) => Some(Reply::error(id, e)),
        // The revoked grant is gone: its id is free again.
        Err(ModuleError::Revoked) => {
            ids.remove(&id);
            Some(Reply::error(id, ModuleError::Revoked))
        }
        Err(e) => Some(Reply::error(id, e)),
    }
}
