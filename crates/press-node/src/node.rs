//! The node's request path and receive loop: Fig. 1 at the initial node,
//! the one-hop service at the service node, caching broadcasts, piggy-backed
//! loads, and the fallback when a service node is gone.

use crate::rings::Arrival;
use crate::transport::{node_id, Link};
use crate::{Mode, NodeConfig, NodeStats};
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tierstack_fabric::{Channel, FabricError, PeerState};
use tierstack_origin::{content_type, decode_request_path, synthetic_body, Caching, ReadOutcome, Storage};
use tierstack_press::proto::{decode, Body, FileStatus, Message};
use tierstack_press::{decide, CachingEvent, ClusterView, Decision, Member};
use tierstack_tier_http::text;
use tokio::sync::oneshot;

/// How long the receive thread waits for a message before it looks at the
/// stop flag again.
const RECV_SLICE: Duration = Duration::from_millis(50);

/// What a forwarded request's reply brings back.
type Reply = (FileStatus, Bytes);

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
    /// Zero: the registered cache.
    pub slab: Option<crate::slab::Slab>,
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
            slab_files: self.slab.as_ref().map_or(0, |slab| slab.files() as u64),
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

    /// Sends from a blocking thread (a send may wait for credit or room).
    fn send_detached(self: &Arc<Self>, to: Member, body: Body) {
        let shared = self.clone();
        self.runtime.spawn_blocking(move || {
            let message = Message { load: shared.load_now(), body };
            if let Err(e) = shared.link.send(to, &message) {
                shared.stats.send_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%to, error = %e, "press send failed");
                shared.check_peer(to);
            }
        });
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

    /// Reads `path` through this node's storage (cache, else the emulated
    /// disk) and returns its bytes once the modelled read completes. In
    /// PRESS mode, starting or stopping to cache a file is broadcast.
    async fn read_local(self: &Arc<Self>, path: &str, size: u64, caching: Caching) -> Bytes {
        let outcome = {
            let mut storage = self.storage.lock().unwrap_or_else(PoisonError::into_inner);
            storage.read(self.now_ns(), &path.to_string(), size, caching)
        };
        if let (true, ReadOutcome::Miss { inserted: Some(inserted), .. }) = (self.config.mode.distributes(), &outcome) {
            for (evicted, _) in &inserted.evicted {
                self.view().on_caching(self.me(), evicted, CachingEvent::Stop);
                self.broadcast_caching(evicted, CachingEvent::Stop);
            }
            if inserted.stored {
                self.view().on_caching(self.me(), &path.to_string(), CachingEvent::Start);
                self.broadcast_caching(path, CachingEvent::Start);
            }
        }
        let ready_ns = outcome.ready_ns();
        let body = if size <= 1 << 20 {
            synthetic_body(path, size)
        } else {
            let p = path.to_string();
            self.runtime.spawn_blocking(move || synthetic_body(&p, size)).await.unwrap_or_default()
        };
        // Zero: the registered cache follows the storage's decisions, and
        // holds the bytes the (emulated) disk read brought in.
        if let (Some(slab), ReadOutcome::Miss { inserted: Some(inserted), .. }) = (&self.slab, &outcome) {
            for (evicted, _) in &inserted.evicted {
                slab.evict(evicted);
            }
            if inserted.stored {
                slab.insert(path, &body);
            }
        }
        let now = self.now_ns();
        if ready_ns > now {
            tokio::time::sleep(Duration::from_nanos(ready_ns - now)).await;
        }
        body
    }

    /// Forwards to `service` and waits for its file; `None` if it did not
    /// come (peer gone, send failed, or no reply within the bound).
    async fn forward(self: &Arc<Self>, service: Member, path: &str) -> Option<Reply> {
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).insert(request, tx);
        let shared = self.clone();
        let body = Body::Forward { request, path: path.to_string() };
        let sent = self
            .runtime
            .spawn_blocking(move || {
                let message = Message { load: shared.load_now(), body };
                shared.link.send(service, &message)
            })
            .await;
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
        if reply.is_none() {
            self.check_peer(service);
        }
        reply
    }

    /// A client request at its initial node.
    pub(crate) async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<tierstack_tier_http::Body> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if request.method() != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        }
        let Ok(decoded) = decode_request_path(request.uri().path()) else {
            return text(StatusCode::BAD_REQUEST, "malformed request path\n");
        };
        let Ok(path) = String::from_utf8(decoded.clone()) else { return text(StatusCode::NOT_FOUND, "not found\n") };
        let Some(size) = self.config.files.size_of(&path) else { return text(StatusCode::NOT_FOUND, "not found\n") };
        let decision = match self.config.mode {
            // The hand-off server decided when it accepted the connection.
            Mode::Traditional | Mode::DistribHandoff => None,
            Mode::Press => {
                let mut view = self.view();
                view.set_load(self.me(), self.load_now());
                let outcome = decide(&self.config.policy, &mut view, &path, size);
                self.link.record_branch(outcome.branch);
                Some(outcome.decision)
            }
        };
        let body = match decision {
            None => {
                self.stats.served_local.fetch_add(1, Ordering::Relaxed);
                let caching = if size >= self.config.policy.max_size_bytes { Caching::Bypass } else { Caching::Normal };
                self.read_local(&path, size, caching).await
            }
            Some(Decision::ServeUncached) => {
                self.stats.served_uncached.fetch_add(1, Ordering::Relaxed);
                self.read_local(&path, size, Caching::Bypass).await
            }
            Some(Decision::ServeLocal) => {
                self.stats.served_local.fetch_add(1, Ordering::Relaxed);
                self.read_local(&path, size, Caching::Normal).await
            }
            Some(Decision::Forward(service)) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                match self.forward(service, &path).await {
                    Some((FileStatus::Ok, data)) => {
                        self.stats.replies_relayed.fetch_add(1, Ordering::Relaxed);
                        data
                    }
                    Some((FileStatus::NotFound, _)) => return text(StatusCode::NOT_FOUND, "not found\n"),
                    Some((FileStatus::Failed, _)) | None => {
                        // The service node is gone or failed: serve it here
                        // (no hang, no error for the client).
                        self.stats.forward_fallbacks.fetch_add(1, Ordering::Relaxed);
                        self.read_local(&path, size, Caching::Normal).await
                    }
                }
            }
        };
        let mut response = Response::new(tierstack_tier_http::Body::new(body.clone()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(&decoded)));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        response
    }

    /// A request on a connection the hand-off server decided to serve here,
    /// counted by `role`; never forwarded.
    pub(crate) async fn handle_here<B>(
        self: Arc<Self>,
        request: Request<B>,
        role: Role,
    ) -> Response<tierstack_tier_http::Body> {
        match role {
            Role::HandedOff => self.stats.served_for_peers.fetch_add(1, Ordering::Relaxed),
            Role::Initial => self.stats.requests.fetch_add(1, Ordering::Relaxed),
            Role::Fallback => 0,
        };
        let counted = role == Role::Initial;
        if request.method() != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        }
        let Ok(decoded) = decode_request_path(request.uri().path()) else {
            return text(StatusCode::BAD_REQUEST, "malformed request path\n");
        };
        let Ok(path) = String::from_utf8(decoded.clone()) else { return text(StatusCode::NOT_FOUND, "not found\n") };
        let Some(size) = self.config.files.size_of(&path) else { return text(StatusCode::NOT_FOUND, "not found\n") };
        // Fig. 1 lines 3-5: large files are served and not cached.
        let caching = if size >= self.config.policy.max_size_bytes {
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
        let body = self.read_local(&path, size, caching).await;
        let mut response = Response::new(tierstack_tier_http::Body::new(body.clone()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(&decoded)));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        response
    }

    /// A forwarded request at its service node: served here, never
    /// forwarded again, even if the information that brought it was stale.
    async fn serve_forwarded(self: Arc<Self>, from: Member, request: u64, path: String) {
        let _in_service = LoadGuard::new(&self.load);
        self.stats.served_for_peers.fetch_add(1, Ordering::Relaxed);
        let (status, data) = match self.config.files.size_of(&path) {
            None => (FileStatus::NotFound, Vec::new()),
            Some(size) => {
                // The service node caches what it reads ("becoming part of
                // the server set"); files of max_size or more are never
                // forwarded by a correct initial node, and are not cached.
                let caching = if size >= self.config.policy.max_size_bytes { Caching::Bypass } else { Caching::Normal };
                let body = self.read_local(&path, size, caching).await;
                if self.slab.is_some() {
                    // Zero: written to the peer's ring straight from the
                    // registered cache, pinned for the transfer.
                    let shared = self.clone();
                    let sent = self
                        .runtime
                        .spawn_blocking(move || {
                            let slab = shared.slab.as_ref()?;
                            let pinned = slab.pin(&path)?;
                            let rings = shared.link.rings()?;
                            let message = Message {
                                load: shared.load_now(),
                                body: Body::File { request, status: FileStatus::Ok, data: Vec::new() },
                            };
                            let result = rings.send_from(from, &message, &pinned.slice, shared.link.counters());
                            if let Err(e) = &result {
                                shared.stats.send_failures.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(%from, error = %e, "zero-copy send failed");
                                shared.check_peer(from);
                            }
                            Some(())
                        })
                        .await;
                    if let Ok(Some(())) = sent {
                        return;
                    }
                    // Not in the slab (no room): the copying path.
                    self.stats.zero_copy_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                // Base copies the file into the message at the sender.
                (FileStatus::Ok, body.to_vec())
            }
        };
        self.send_detached(from, Body::File { request, status, data });
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
