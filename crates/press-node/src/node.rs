//! The node's request path and receive loop: Fig. 1 at the initial node,
//! the one-hop service at the service node, caching broadcasts, piggy-backed
//! loads, and the fallback when a service node is gone.

use crate::files::{self, split_reply, FileMeta, Refusal, Target, META_BYTES};
use crate::http::{self, Content as Local, NodeBody};
use crate::rings::Arrival;
use crate::transport::{node_id, Link};
use crate::{Mode, NodeConfig, NodeStats, TransportKind};
use bytes::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tierstack_fabric::{Channel, FabricError, PeerState};
use tierstack_origin::{decode_request_path, Caching, PathRefusal, ReadOutcome, Storage};
use tierstack_press::proto::{decode, Body, FileStatus, Message, FILE_BYTES_MAX};
use tierstack_press::{decide, Admit, Breakers, CachingEvent, ClusterView, Decision, Member};
use tokio::sync::oneshot;

/// How long the receive thread waits for a message before it looks at the
/// stop flag again.
const RECV_SLICE: Duration = Duration::from_millis(50);

/// What a forwarded request's reply brings back: the status and the
/// payload (`files::reply_payload`).
type Reply = (FileStatus, Bytes);

/// Files larger than this that a read does not cache are streamed from
/// disk to the client in chunks, never held whole (Fig. 1's `max_size`
/// by default: the files PRESS serves uncached).
pub(crate) const STREAM_BYTES_MIN: u64 = 256 << 10;

/// A checked client request: its decoded path (the cache key) and file.
pub(crate) struct Asked {
    decoded: Vec<u8>,
    key: String,
    target: Target,
}

/// Who a [`Shared::read_local`] reads for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// A client: a large uncached file may be streamed.
    Client,
    /// A peer's forwarded request: the bytes, whole.
    Peer,
    /// Zero's send to a peer: a slab hit stays in the slab.
    PeerFromSlab,
}

/// At most the first 200 bytes of a client's path, for a log line.
fn shown(key: &str) -> &str {
    let mut end = key.len().min(200);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

/// A 500 for an I/O error on `key`, logged.
fn io_error(key: &str, error: &str) -> Response<NodeBody> {
    tracing::warn!(path = %shown(key), %error, "reading a served file failed");
    http::text(StatusCode::INTERNAL_SERVER_ERROR, "reading the file failed\n")
}

#[derive(Default)]
pub(crate) struct Stats {
    pub requests: AtomicU64,
    pub served_local: AtomicU64,
    pub served_uncached: AtomicU64,
    pub forwarded: AtomicU64,
    pub served_for_peers: AtomicU64,
    pub replies_relayed: AtomicU64,
    pub forward_fallbacks: AtomicU64,
    pub peers_declared_dead: AtomicU64,
    pub bad_messages: AtomicU64,
    pub send_failures: AtomicU64,
    pub zero_copy_fallbacks: AtomicU64,
    pub caching_broadcasts: AtomicU64,
    /// Cached copies dropped because their file changed on disk.
    pub revalidated: AtomicU64,
    /// Responses streamed from disk.
    pub streamed: AtomicU64,
    /// Cached files the slab had no room for (read from disk on each hit).
    pub slab_full: AtomicU64,
    /// Intra-cluster sends made inline from the async task (nothing to wait for).
    pub sends_inline: AtomicU64,
    /// Sends handed to the blocking pool because they would have waited
    /// (for a credit, ring room, a connection) or `--send-inline false`.
    pub sends_blocking: AtomicU64,
}

/// Open client connections plus forwarded requests in service: the load
/// (seed-notes c.7 #3). Dropping the guard gives it back.
pub(crate) struct LoadGuard(Arc<AtomicU32>);

impl LoadGuard {
    pub(crate) fn new(load: &Arc<AtomicU32>) -> LoadGuard {
        load.fetch_add(1, Ordering::Relaxed);
        LoadGuard(load.clone())
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Who a request served by [`Shared::handle_here`] is counted as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A client request accepted here and decided to be served here.
    Initial,
    /// A connection another process accepted and passed here.
    HandedOff,
    /// A hand-off that failed (counted as forwarded and as a fallback).
    Fallback,
}

/// Everything a node's tasks and threads share.
pub(crate) struct Shared {
    pub config: NodeConfig,
    pub link: Link,
    pub view: Mutex<ClusterView<String>>,
    pub storage: Mutex<Storage<String>>,
    pub started: Instant,
    pub load: Arc<AtomicU32>,
    pub pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    pub next_request: AtomicU64,
    pub stats: Stats,
    pub stop: AtomicBool,
    pub runtime: tokio::runtime::Handle,
    /// The memory cache's bytes (registered for Zero), following
    /// `storage`'s inserts and evictions.
    pub slab: crate::slab::Slab,
    /// A circuit breaker per peer (forwards to a failed peer skipped).
    pub breakers: Mutex<Breakers>,
    /// The distributed hand-off server: sockets to the peers' hand-off sockets.
    pub handoff_out: Option<crate::ho::Outbound>,
}

impl Shared {
    pub(crate) fn me(&self) -> Member {
        self.config.me
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn load_now(&self) -> u32 {
        self.load.load(Ordering::Relaxed)
    }

    pub(crate) fn breakers(&self) -> std::sync::MutexGuard<'_, Breakers> {
        self.breakers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn view(&self) -> std::sync::MutexGuard<'_, ClusterView<String>> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn snapshot(&self) -> NodeStats {
        let s = &self.stats;
        let counts = self.storage.lock().unwrap_or_else(PoisonError::into_inner).counts();
        let sent = self.link.counters().snapshot();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NodeStats {
            node: self.me().0,
            transport: self.link.kind().name().to_string(),
            mode: self.config.mode.name().to_string(),
            requests: get(&s.requests),
            served_local: get(&s.served_local),
            served_uncached: get(&s.served_uncached),
            forwarded: get(&s.forwarded),
            served_for_peers: get(&s.served_for_peers),
            replies_relayed: get(&s.replies_relayed),
            forward_fallbacks: get(&s.forward_fallbacks),
            peers_declared_dead: get(&s.peers_declared_dead),
            ring_peer_restarts: self.link.rings().map_or(0, |r| r.restarts()),
            bad_messages: get(&s.bad_messages),
            send_failures: get(&s.send_failures),
            zero_copy_fallbacks: get(&s.zero_copy_fallbacks),
            sends_inline: get(&s.sends_inline),
            sends_blocking: get(&s.sends_blocking),
            slab_files: self.slab.files() as u64,
            revalidated: get(&s.revalidated),
            streamed: get(&s.streamed),
            slab_full: get(&s.slab_full),
            breaker: {
                let c = self.breakers().counts();
                [c.opened, c.skipped, c.probes, c.closed]
            },
            caching_broadcasts: get(&s.caching_broadcasts),
            cache_hits: counts.cache_hits,
            cache_misses: counts.cache_misses,
            disk_reads: counts.disk_reads,
            cache_bytes: counts.cache_bytes,
            cache_objects: counts.cache_objects,
            load: self.load_now(),
            sent_messages: sent.messages,
            sent_bytes: sent.bytes,
            files_in_view: self.view().files() as u64,
            link: self.link.link_stats(),
        }
    }

    /// Sends without waiting: inline if nothing has to wait, else from a
    /// blocking thread (a send may wait for credit or room).
    fn send_detached(self: &Arc<Self>, to: Member, body: Body) {
        let message = Message { load: self.load_now(), body };
        let Some(message) = self.send_inline(to, message) else { return };
        let shared = self.clone();
        self.runtime.spawn_blocking(move || {
            if let Err(e) = shared.link.send(to, &message) {
                shared.send_failed(to, &e);
            }
        });
    }

    /// The fast path of every send: `Link::try_send` from the calling task.
    /// `None` if it was sent (or failed: counted, the peer checked off the
    /// task); the message back if it would wait (counted), for the caller
    /// to send from a blocking thread.
    fn send_inline(self: &Arc<Self>, to: Member, message: Message) -> Option<Message> {
        if !self.config.send_inline {
            self.stats.sends_blocking.fetch_add(1, Ordering::Relaxed);
            return Some(message);
        }
        match self.link.try_send(to, &message) {
            Ok(tierstack_fabric::TrySend::Sent) => {
                self.stats.sends_inline.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(tierstack_fabric::TrySend::WouldBlock) => {
                self.stats.sends_blocking.fetch_add(1, Ordering::Relaxed);
                Some(message)
            }
            Err(e) => {
                // Asking the fabric about the peer may wait (a probe connection).
                let shared = self.clone();
                self.runtime.spawn_blocking(move || shared.send_failed(to, &e));
                None
            }
        }
    }

    fn send_failed(&self, to: Member, error: &crate::transport::LinkError) {
        self.stats.send_failures.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%to, %error, "press send failed");
        self.check_peer(to);
    }

    /// After a failed exchange: a peer whose process certainly ended leaves
    /// the view (its files look uncached, so others take them over).
    pub(crate) fn check_peer(&self, peer: Member) {
        if self.link.fabric().peer_state(node_id(peer)) == PeerState::Gone {
            let mut view = self.view();
            if view.is_alive(peer) {
                view.mark_dead(peer);
                self.stats.peers_declared_dead.fetch_add(1, Ordering::Relaxed);
                if let Some(w) = self.link.window() {
                    w.reset(peer);
                }
                tracing::info!(%peer, "peer gone: its files are served by others");
            }
        }
    }

    /// Broadcasts a caching change to every other live node.
    fn broadcast_caching(self: &Arc<Self>, path: &str, event: CachingEvent) {
        let peers: Vec<Member> = {
            let view = self.view();
            (0..view.nodes()).filter_map(|i| view.member(i)).filter(|&m| m != self.me() && view.is_alive(m)).collect()
        };
        for peer in peers {
            self.stats.caching_broadcasts.fetch_add(1, Ordering::Relaxed);
            self.send_detached(peer, Body::Caching { start: event == CachingEvent::Start, path: path.to_string() });
        }
    }

    /// Checks a client request and looks its file up: the answer to send
    /// instead if it is refused (405, 400, 403 outside the root or not a
    /// regular file, 404, 500) or needs no bytes (HEAD, 304).
    async fn look_up<B>(&self, request: &Request<B>) -> Result<Asked, Response<NodeBody>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return Err(http::method_not_allowed());
        }
        let decoded = match decode_request_path(request.uri().path()) {
            Ok(decoded) => decoded,
            Err(PathRefusal::Traversal) => return Err(http::text(StatusCode::FORBIDDEN, "outside the served root\n")),
            Err(_) => return Err(http::text(StatusCode::BAD_REQUEST, "malformed request path\n")),
        };
        let Ok(key) = String::from_utf8(decoded.clone()) else {
            return Err(http::text(StatusCode::NOT_FOUND, "not found\n"));
        };
        match self.config.root.resolve(decoded.clone()).await {
            // HEAD and a current client copy need no bytes: answered here.
            Ok(target) => match http::without_body(request.method(), request.headers(), &target.meta, &decoded) {
                Some(response) => Err(response),
                None => Ok(Asked { decoded, key, target }),
            },
            Err(Refusal::NotFound) => Err(http::text(StatusCode::NOT_FOUND, "not found\n")),
            Err(Refusal::Forbidden) => Err(http::text(StatusCode::FORBIDDEN, "not a file under the served root\n")),
            Err(Refusal::Io(e)) => {
                tracing::warn!(path = %shown(&key), error = %e, "looking a file up failed");
                Err(http::text(StatusCode::INTERNAL_SERVER_ERROR, "looking the file up failed\n"))
            }
        }
    }

    /// Drops a cached copy of `key` whose validators are not `meta` any
    /// more (the file changed on disk): the read that follows misses and
    /// brings the new bytes in.
    fn revalidate(self: &Arc<Self>, key: &str, meta: FileMeta) {
        let stale = self.slab.get(key).is_some_and(|cached| cached.meta != meta);
        if !stale {
            return;
        }
        self.slab.evict(key);
        let removed = self.storage.lock().unwrap_or_else(PoisonError::into_inner).remove(&key.to_string());
        self.stats.revalidated.fetch_add(1, Ordering::Relaxed);
        if removed && self.config.mode.distributes() {
            self.view().on_caching(self.me(), &key.to_string(), CachingEvent::Stop);
            self.broadcast_caching(key, CachingEvent::Stop);
        }
    }

    /// Reads a file through this node's cache (the slab's bytes, else the
    /// disk, reads on the blocking pool) once the modelled read completes.
    /// In PRESS mode, starting or stopping to cache a file is broadcast. A
    /// file this read does not cache and larger than [`STREAM_BYTES_MIN`]
    /// is streamed from disk to a client ([`Use::Client`]); for Zero's
    /// send a slab hit is left where it is ([`Local::InSlab`]). Returns the
    /// validators of the bytes it gives (the look-up's, unless the file
    /// changed since).
    async fn read_local(
        self: &Arc<Self>,
        asked: &Asked,
        caching: Caching,
        to: Use,
    ) -> Result<(FileMeta, Local), Response<NodeBody>> {
        let (key, meta) = (&asked.key, asked.target.meta);
        self.revalidate(key, meta);
        let outcome = {
            let mut storage = self.storage.lock().unwrap_or_else(PoisonError::into_inner);
            storage.read(self.now_ns(), key, meta.size, caching)
        };
        if let ReadOutcome::Miss { inserted: Some(inserted), .. } = &outcome {
            for (evicted, _) in &inserted.evicted {
                self.slab.evict(evicted);
                if self.config.mode.distributes() {
                    self.view().on_caching(self.me(), evicted, CachingEvent::Stop);
                    self.broadcast_caching(evicted, CachingEvent::Stop);
                }
            }
            if inserted.stored && self.config.mode.distributes() {
                self.view().on_caching(self.me(), key, CachingEvent::Start);
                self.broadcast_caching(key, CachingEvent::Start);
            }
        }
        let cached = self.storage.lock().unwrap_or_else(PoisonError::into_inner).is_cached(key);
        let content = match self.slab.get(key).filter(|hit| hit.meta == meta) {
            Some(_) if to == Use::PeerFromSlab => (meta, Local::InSlab),
            Some(hit) => match hit.body() {
                Ok(bytes) => (meta, Local::Bytes(bytes)),
                Err(e) => return Err(io_error(key, &e.to_string())),
            },
            None if !cached && meta.size > STREAM_BYTES_MIN && to == Use::Client => {
                let (read, file) =
                    files::open_stream(&asked.target.file).await.map_err(|e| io_error(key, &e.to_string()))?;
                self.stats.streamed.fetch_add(1, Ordering::Relaxed);
                (read, Local::Stream(file))
            }
            None => {
                let (read, bytes) =
                    files::read_whole(&asked.target.file).await.map_err(|e| io_error(key, &e.to_string()))?;
                if read.size != meta.size {
                    // Changed since the look-up: the cache accounted the
                    // old size; the next request caches the new file.
                    if self.storage.lock().unwrap_or_else(PoisonError::into_inner).remove(key) {
                        self.slab.evict(key);
                        if self.config.mode.distributes() {
                            self.view().on_caching(self.me(), key, CachingEvent::Stop);
                            self.broadcast_caching(key, CachingEvent::Stop);
                        }
                    }
                } else if cached && !self.slab.insert(key, read, &bytes) {
                    self.stats.slab_full.fetch_add(1, Ordering::Relaxed);
                }
                (read, Local::Bytes(bytes))
            }
        };
        let (ready_ns, now) = (outcome.ready_ns(), self.now_ns());
        if ready_ns > now {
            tokio::time::sleep(Duration::from_nanos(ready_ns - now)).await;
        }
        Ok(content)
    }

    /// Forwards to `service` and waits for its file; `None` if it did not
    /// come (peer gone, send failed, no reply within the bound) or the
    /// peer's breaker is open, so the caller serves it here.
    async fn forward(self: &Arc<Self>, service: Member, path: &str) -> Option<Reply> {
        let admit = self.breakers().admit(service.index(), self.now_ns());
        if admit == Admit::Skip {
            return None;
        }
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).insert(request, tx);
        let message = Message { load: self.load_now(), body: Body::Forward { request, path: path.to_string() } };
        let sent = match self.config.send_inline.then(|| self.link.try_send(service, &message)) {
            Some(Ok(tierstack_fabric::TrySend::Sent)) => {
                self.stats.sends_inline.fetch_add(1, Ordering::Relaxed);
                Ok(Ok(()))
            }
            Some(Err(e)) => Ok(Err(e)),
            Some(Ok(tierstack_fabric::TrySend::WouldBlock)) | None => {
                self.stats.sends_blocking.fetch_add(1, Ordering::Relaxed);
                let shared = self.clone();
                self.runtime.spawn_blocking(move || shared.link.send(service, &message)).await
            }
        };
        let reply = match sent {
            Ok(Ok(())) => tokio::time::timeout(self.config.forward_timeout, rx).await.ok().and_then(Result::ok),
            Ok(Err(e)) => {
                self.stats.send_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%service, error = %e, "forward failed");
                None
            }
            Err(_) => None,
        };
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&request);
        match &reply {
            Some(_) => self.breakers().success(service.index()),
            None => {
                self.breakers().failure(service.index(), self.now_ns());
                self.check_peer(service);
            }
        }
        reply
    }

    /// A client request at its initial node.
    pub(crate) async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<NodeBody> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let asked = match self.look_up(&request).await {
            Ok(asked) => asked,
            Err(response) => return response,
        };
        let size = asked.target.meta.size;
        let decision = match self.config.mode {
            // The hand-off server decided when it accepted the connection.
            Mode::Traditional | Mode::DistribHandoff => None,
            Mode::Press => {
                let mut view = self.view();
                view.set_load(self.me(), self.load_now());
                let outcome = decide(&self.config.policy, &mut view, &asked.key, size);
                self.link.record_branch(outcome.branch);
                Some(outcome.decision)
            }
        };
        let local = match decision {
            None => {
                self.stats.served_local.fetch_add(1, Ordering::Relaxed);
                let caching = if size >= self.config.policy.max_size_bytes { Caching::Bypass } else { Caching::Normal };
                self.read_local(&asked, caching, Use::Client).await
            }
            Some(Decision::ServeUncached) => {
                self.stats.served_uncached.fetch_add(1, Ordering::Relaxed);
                self.read_local(&asked, Caching::Bypass, Use::Client).await
            }
            Some(Decision::ServeLocal) => {
                self.stats.served_local.fetch_add(1, Ordering::Relaxed);
                self.read_local(&asked, Caching::Normal, Use::Client).await
            }
            Some(Decision::Forward(service)) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                match self.forward(service, &asked.key).await {
                    Some((FileStatus::Ok, payload)) => match split_reply(payload) {
                        Some((meta, body)) => {
                            self.stats.replies_relayed.fetch_add(1, Ordering::Relaxed);
                            // The service node's validators go with its bytes.
                            return http::respond(request.headers(), &meta, &asked.decoded, Local::Bytes(body)).await;
                        }
                        None => {
                            self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                            self.stats.forward_fallbacks.fetch_add(1, Ordering::Relaxed);
                            self.read_local(&asked, Caching::Normal, Use::Client).await
                        }
                    },
                    Some((FileStatus::NotFound, _)) => return http::text(StatusCode::NOT_FOUND, "not found\n"),
                    Some((FileStatus::Failed, _)) | None => {
                        // The service node is gone, hung or failed: serve it
                        // here (no hang, no error for the client).
                        self.stats.forward_fallbacks.fetch_add(1, Ordering::Relaxed);
                        self.read_local(&asked, Caching::Normal, Use::Client).await
                    }
                }
            }
        };
        match local {
            Ok((meta, content)) => http::respond(request.headers(), &meta, &asked.decoded, content).await,
            Err(response) => response,
        }
    }

    /// A request on a connection the hand-off server decided to serve here,
    /// counted by `role`; never forwarded.
    pub(crate) async fn handle_here<B>(self: Arc<Self>, request: Request<B>, role: Role) -> Response<NodeBody> {
        match role {
            Role::HandedOff => self.stats.served_for_peers.fetch_add(1, Ordering::Relaxed),
            Role::Initial => self.stats.requests.fetch_add(1, Ordering::Relaxed),
            Role::Fallback => 0,
        };
        let counted = role == Role::Initial;
        let asked = match self.look_up(&request).await {
            Ok(asked) => asked,
            Err(response) => return response,
        };
        // Fig. 1 lines 3-5: large files are served and not cached.
        let caching = if asked.target.meta.size >= self.config.policy.max_size_bytes {
            if counted {
                self.stats.served_uncached.fetch_add(1, Ordering::Relaxed);
            }
            Caching::Bypass
        } else {
            if counted {
                self.stats.served_local.fetch_add(1, Ordering::Relaxed);
            }
            Caching::Normal
        };
        match self.read_local(&asked, caching, Use::Client).await {
            Ok((meta, content)) => http::respond(request.headers(), &meta, &asked.decoded, content).await,
            Err(response) => response,
        }
    }

    /// A forwarded request at its service node: served here, never
    /// forwarded again, even if the information that brought it was stale.
    /// The reply's payload is the file's metadata then its bytes
    /// (`files::reply_payload`), so the initial node answers with this
    /// node's validators.
    async fn serve_forwarded(self: Arc<Self>, from: Member, request: u64, path: String) {
        let _in_service = LoadGuard::new(&self.load);
        self.stats.served_for_peers.fetch_add(1, Ordering::Relaxed);
        let (status, data) = match self.config.root.resolve(path.clone().into_bytes()).await {
            Err(Refusal::NotFound | Refusal::Forbidden) => (FileStatus::NotFound, Vec::new()),
            Err(Refusal::Io(_)) => (FileStatus::Failed, Vec::new()),
            Ok(target) if target.meta.size as usize > FILE_BYTES_MAX - META_BYTES => (FileStatus::Failed, Vec::new()),
            Ok(target) => {
                let meta = target.meta;
                let asked = Asked { decoded: path.clone().into_bytes(), key: path.clone(), target };
                // The service node caches what it reads ("becoming part of
                // the server set"); files of max_size or more are never
                // forwarded by a correct initial node, and are not cached.
                let caching =
                    if meta.size >= self.config.policy.max_size_bytes { Caching::Bypass } else { Caching::Normal };
                let zero = self.link.kind() == TransportKind::Zero && self.link.rings().is_some();
                match self.read_local(&asked, caching, if zero { Use::PeerFromSlab } else { Use::Peer }).await {
                    Ok((_, Local::Stream(_))) | Err(_) => (FileStatus::Failed, Vec::new()),
                    Ok((meta, local)) => {
                        // Zero: written to the peer's ring straight from the
                        // registered cache (a miss's bytes were just put
                        // there), pinned for the transfer.
                        if zero && self.send_from_slab(from, request, &path, meta).await {
                            return;
                        }
                        if zero {
                            // Not in the slab (not cacheable, no room, or
                            // evicted in between): the copying path.
                            self.stats.zero_copy_fallbacks.fetch_add(1, Ordering::Relaxed);
                        }
                        let read = match local {
                            Local::Bytes(body) => Ok((meta, body)),
                            _ => files::read_whole(&asked.target.file).await,
                        };
                        match read {
                            // Base copies the file into the message at the sender.
                            Ok((meta, body)) => (FileStatus::Ok, files::reply_payload(&meta, &body)),
                            Err(_) => (FileStatus::Failed, Vec::new()),
                        }
                    }
                }
            }
        };
        self.send_detached(from, Body::File { request, status, data });
    }

    /// Zero: sends `path`'s slab entry (metadata and bytes, if they are
    /// `meta`'s) to `to`'s ring with no copy at this node; false if the
    /// slab does not hold it (the caller sends a copy). A failed send
    /// counts as sent: the initial node times out and serves it itself.
    async fn send_from_slab(self: &Arc<Self>, to: Member, request: u64, path: &str, meta: FileMeta) -> bool {
        if self.config.send_inline {
            let Some(cached) = self.slab.get(path).filter(|hit| hit.meta == meta) else { return false };
            let Some(rings) = self.link.rings() else { return false };
            let message = Message {
                load: self.load_now(),
                body: Body::File { request, status: FileStatus::Ok, data: Vec::new() },
            };
            match rings.try_send(to, &message, Some(&cached.slice), self.link.counters()) {
                Ok(tierstack_fabric::TrySend::Sent) => {
                    self.stats.sends_inline.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Ok(tierstack_fabric::TrySend::WouldBlock) => {}
                Err(e) => {
                    let shared = self.clone();
                    self.runtime.spawn_blocking(move || shared.send_failed(to, &e));
                    return true;
                }
            }
        }
        self.stats.sends_blocking.fetch_add(1, Ordering::Relaxed);
        let shared = self.clone();
        let path = path.to_string();
        let sent = self
            .runtime
            .spawn_blocking(move || {
                let cached = shared.slab.get(&path).filter(|hit| hit.meta == meta)?;
                let rings = shared.link.rings()?;
                let message = Message {
                    load: shared.load_now(),
                    body: Body::File { request, status: FileStatus::Ok, data: Vec::new() },
                };
                if let Err(e) = rings.send_from(to, &message, &cached.slice, shared.link.counters()) {
                    shared.send_failed(to, &e);
                }
                Some(())
            })
            .await;
        matches!(sent, Ok(Some(())))
    }

    /// The receive thread: takes PRESS messages off the fabric's channel
    /// until the node stops.
    pub(crate) fn receive_loop(self: Arc<Self>) {
        let inbox = self.link.fabric().inbox(Channel::PRESS);
        while !self.stop.load(Ordering::Relaxed) {
            let message = match self.link.receive(inbox, RECV_SLICE) {
                Ok(message) => message,
                Err(FabricError::RecvTimeout { .. }) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "press inbox closed");
                    return;
                }
            };
            let from = match u16::try_from(message.from.0).ok().and_then(|i| self.view().member(usize::from(i))) {
                Some(from) if from != self.me() => from,
                _ => {
                    self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let decoded = match decode(&message.payload) {
                Ok(decoded) => decoded,
                Err(e) => {
                    self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%from, error = %e, "malformed press message");
                    continue;
                }
            };
            self.on_message(from, decoded);
        }
    }

    /// The remote-write versions' poll thread.
    pub(crate) fn poll_loop(self: Arc<Self>) {
        if let Some(rings) = self.link.rings() {
            rings.poll_loop(&self.stop, self.link.counters(), |from, arrival| match arrival {
                Arrival::Message(message) => self.on_message(from, message),
                Arrival::File { load, request, status, data } => {
                    self.note_sender(from, load);
                    self.complete(request, status, data);
                }
            });
        }
    }

    /// A forwarded request's file arrived.
    fn complete(&self, request: u64, status: FileStatus, data: Bytes) {
        if let Some(tx) = self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&request) {
            let _ = tx.send((status, data));
        }
    }

    /// Every message updates its sender's load (piggy-backing); a sender
    /// declared dead that speaks again was restarted.
    pub(crate) fn note_sender(&self, from: Member, load: u32) {
        let mut view = self.view();
        if !view.is_alive(from) {
            view.mark_alive(from);
            if let Some(w) = self.link.window() {
                w.reset(from);
            }
        }
        view.set_load(from, load);
    }

    fn on_message(self: &Arc<Self>, from: Member, message: Message) {
        self.note_sender(from, message.load);
        if let Some(w) = self.link.window() {
            if crate::transport::needs_credit(&message.body) {
                if let Some(credits) = w.consumed(from) {
                    let flow = Message { load: self.load_now(), body: Body::Flow { credits } };
                    if self.link.send(from, &flow).is_err() {
                        self.stats.send_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        match message.body {
            Body::Forward { request, path } => {
                let shared = self.clone();
                self.runtime.spawn(shared.serve_forwarded(from, request, path));
            }
            Body::File { request, status, data } => self.complete(request, status, Bytes::from(data)),
            Body::Caching { start, path } => {
                let event = if start { CachingEvent::Start } else { CachingEvent::Stop };
                self.view().on_caching(from, &path, event);
            }
            Body::Flow { credits } => {
                if let Some(w) = self.link.window() {
                    w.grant(from, credits);
                }
            }
            Body::FileInfo { .. } | Body::BufferMgmt { .. } => {
                // Only the remote-write versions use these.
                self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
