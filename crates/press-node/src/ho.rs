//! The hand-off servers at a node: the distributed hand-off server's accept
//! loop (Fig. 1 decided on the request's header block, the client socket
//! passed to the service node) and the receiver of handed-off sockets
//! (distributed hand-off peers, or the dispatcher of the dispatcher
//! hand-off server).

use crate::handoff::{self, read_head, send_fd, Prefixed};
use crate::node::{LoadGuard, Role, Shared};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tierstack_press::{decide, Decision, Member};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long the receive thread waits for a datagram before it looks at the
/// stop flag again; also the bound on a blocked hand-off send.
const SLICE: Duration = Duration::from_millis(50);
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves one HTTP/1.1 connection whose first bytes were already read.
pub(crate) async fn serve_connection<F, Fut>(io: Prefixed, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<crate::http::NodeBody>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let service = hyper::service::service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler(request).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "hand-off connection ended with an error");
    }
}

/// Per peer: a Unix datagram socket connected to its hand-off socket.
pub(crate) struct Outbound {
    dir: PathBuf,
    sockets: Mutex<Vec<Option<Arc<UnixDatagram>>>>,
}

impl Outbound {
    pub(crate) fn new(dir: PathBuf, peers: usize) -> Outbound {
        Outbound { dir, sockets: Mutex::new(vec![None; peers]) }
    }

    fn socket(&self, index: usize) -> std::io::Result<Arc<UnixDatagram>> {
        let mut sockets = self.sockets.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = sockets.get_mut(index).ok_or_else(|| std::io::Error::other("no such node"))?;
        if let Some(s) = slot {
            return Ok(s.clone());
        }
        let socket = UnixDatagram::unbound()?;
        socket.connect(handoff::socket_path(&self.dir, index))?;
        socket.set_write_timeout(Some(SEND_TIMEOUT))?;
        let socket = Arc::new(socket);
        *slot = Some(socket.clone());
        Ok(socket)
    }

    /// Passes `stream` to node `index`, with `payload`; on failure the
    /// cached socket is dropped (a restarted peer binds a new one).
    pub(crate) async fn send(&self, index: usize, stream: &TcpStream, payload: Vec<u8>) -> std::io::Result<()> {
        let socket = self.socket(index)?;
        let fd = stream.as_raw_fd();
        // The stream (and so `fd`) outlives the blocking send: we await it.
        let result = tokio::task::spawn_blocking(move || send_fd(&socket, fd, &payload))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if result.is_err() {
            if let Some(slot) = self.sockets.lock().unwrap_or_else(PoisonError::into_inner).get_mut(index) {
                *slot = None;
            }
        }
        result
    }
}

/// The distributed hand-off server's accept loop: until `stop` turns true.
pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = tierstack_tier_http::accept(&listener) => accepted,
            _ = stop.changed() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move { shared.accepted(stream).await });
    }
}

impl Shared {
    /// A client connection at its initial node: Fig. 1 on its first
    /// request, then served here or handed to the service node.
    async fn accepted(self: Arc<Self>, mut stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let connection = LoadGuard::new(&self.load);
        let head = match read_head(&mut stream).await {
            Ok(head) => head,
            Err(e) => {
                tracing::debug!(error = %e, "no request to hand off");
                return;
            }
        };
        let path = match tierstack_origin::decode_request_path(&head.path).ok().and_then(|p| String::from_utf8(p).ok())
        {
            Some(p) => self.config.root.resolve(p.clone().into_bytes()).await.ok().map(|t| (p, t.meta.size)),
            None => None,
        };
        let decision = path.map(|(path, size)| {
            let mut view = self.view();
            view.set_load(self.me(), self.load_now());
            decide(&self.config.policy, &mut view, &path, size).decision
        });
        if let (Some(Decision::Forward(service)), Some(out)) = (decision, self.handoff_out.as_ref()) {
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
            drop(connection);
            let payload = match handoff::encode(self.me().0, self.load_now(), None, &head.bytes) {
                Ok(payload) => payload,
                Err(e) => {
                    tracing::warn!(error = %e, "hand-off payload");
                    return;
                }
            };
            match out.send(service.index(), &stream, payload).await {
                // Our copy of the descriptor closes here; the service
                // node's copy keeps the connection open.
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(%service, error = %e, "hand-off failed: serving here");
                    self.stats.forward_fallbacks.fetch_add(1, Ordering::Relaxed);
                    self.check_peer(service);
                    // Counted once as forwarded and once as a fallback, as
                    // a PRESS forward that found its service node gone.
                    let _connection = LoadGuard::new(&self.load);
                    let shared = self.clone();
                    serve_connection(Prefixed::new(head.bytes, stream), move |request| {
                        shared.clone().handle_here(request, Role::Fallback)
                    })
                    .await;
                    return;
                }
            }
        }
        let shared = self.clone();
        serve_connection(Prefixed::new(head.bytes, stream), move |request| {
            shared.clone().handle_here(request, Role::Initial)
        })
        .await;
        drop(connection);
    }

    /// The receive thread of handed-off sockets: until the node stops.
    pub(crate) fn handoff_receive_loop(self: Arc<Self>, socket: UnixDatagram) {
        if let Err(e) = socket.set_read_timeout(Some(SLICE)) {
            tracing::warn!(error = %e, "hand-off socket");
            return;
        }
        let replies = UnixDatagram::unbound().ok();
        while !self.stop.load(Ordering::Relaxed) {
            let (payload, fd) = match handoff::recv_fd(&socket) {
                Ok(received) => received,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
                Err(e) => {
                    self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "hand-off receive failed");
                    continue;
                }
            };
            let (Some(handoff), Some(fd)) = (handoff::decode(&payload), fd) else {
                self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            // (The view's lock is released before `note_sender` takes it.)
            let from = self.view().member(usize::from(handoff.from));
            if let Some(from) = from.filter(|&from| from != self.me()) {
                self.note_sender(from, handoff.load);
            }
            let stream = std::net::TcpStream::from(fd);
            if stream.set_nonblocking(true).is_err() {
                self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let done = handoff.reply.map(|path| Done {
                socket: replies.as_ref().and_then(|s| s.try_clone().ok()),
                path,
                me: self.me().0,
            });
            let shared = self.clone();
            self.runtime.spawn(async move {
                let Ok(stream) = TcpStream::from_std(stream) else { return };
                let _connection = LoadGuard::new(&shared.load);
                let _done = done;
                let handler = shared.clone();
                serve_connection(Prefixed::new(handoff.request, stream), move |request| {
                    handler.clone().handle_here(request, Role::HandedOff)
                })
                .await;
            });
        }
    }
}

/// Reports a dispatcher's connection finished when dropped.
struct Done {
    socket: Option<UnixDatagram>,
    path: PathBuf,
    me: u16,
}

impl Drop for Done {
    fn drop(&mut self) {
        if let Some(socket) = &self.socket {
            // Best effort: a dispatcher that is gone needs no report.
            let _ = socket.send_to(&handoff::done_datagram(self.me), &self.path);
        }
    }
}

/// Binds this node's hand-off socket under `dir` (a stale one from an
/// earlier run of the same node is replaced).
pub(crate) fn bind(dir: &Path, me: Member) -> std::io::Result<UnixDatagram> {
    let path = handoff::socket_path(dir, me.index());
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixDatagram::bind(path)
}
