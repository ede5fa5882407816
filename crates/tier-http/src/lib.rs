//! HTTP plumbing shared by the tiers (application server, proxy): the
//! accept loop with graceful stop, the response body type, and small
//! responses. No tier logic lives here. [`conn`]: one connection, plain
//! HTTP/1.1 or (with a [`Front`]) TLS with ALPN, HTTP/2 and h2c; [`tls`]:
//! the certificate and key, reloadable. [`guard`]: the slow-client limits
//! every listener enforces, [`args`] their flags. [`service`]: how every tier process
//! stops (signals, `--stop-on-stdin-eof`, the grace period) and announces
//! that it is ready. [`observe`]: `/metrics`, `/healthz` and `/readyz` for
//! every long-running command.

pub mod args;
pub mod conn;
pub mod guard;
pub mod observe;
pub mod service;
pub mod tls;

pub use args::{
    FrontArgs, HttpLimitsArgs, BODY_READ_TIMEOUT_DEFAULT, HEADER_READ_TIMEOUT_DEFAULT, MAX_CONNECTIONS_DEFAULT,
    WRITE_TIMEOUT_DEFAULT,
};
use conn::{serve_front, serve_http1, watch_for_close, Conn, Held, Slot};
pub use conn::{Front, Http2Options};
pub use guard::{BodyError, RequestBody};
use guard::{ConnState, GuardedIo, PerClient, Registry};
pub use tls::{TlsError, TlsFiles, TlsServer};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use std::future::Future;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The body every tier answers with.
pub type Body = Full<Bytes>;

/// A response with a plain-text body.
pub fn text(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    response
}

/// Reads a whole request or response body, refusing more than `max_bytes`.
pub async fn collect_limited<B>(body: B, max_bytes: usize) -> Result<Bytes, String>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, max_bytes).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(e.to_string()),
    }
}

/// A stop signal for [`serve`].
#[derive(Clone)]
pub struct Stop(watch::Sender<bool>);

impl Stop {
    pub fn new() -> Self {
        Stop(watch::channel(false).0)
    }

    pub fn stop(&self) {
        let _ = self.0.send(true);
    }

    fn watcher(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

pub(crate) async fn stopped(mut watcher: watch::Receiver<bool>) {
    while !*watcher.borrow() {
        if watcher.changed().await.is_err() {
            return;
        }
    }
}

/// The next connection on `listener`. An accept error (out of descriptors
/// and the like) is logged and retried after a yield, so a server keeps
/// serving. Cancel-safe: race it against a stop signal.
pub async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::task::yield_now().await;
            }
        }
    }
}

/// The client's address, in every request's extensions when
/// [`ServeOptions::peer_addr`] asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// Called when a connection is accepted; what it returns is dropped when
/// the connection ends (e.g. a guard counting open connections).
pub type ConnectionHook = Arc<dyn Fn() -> Box<dyn Send> + Send + Sync>;

/// Serves HTTP/1.1 on `listener` with `handler` until `stop` fires;
/// connections in progress finish their current request (idle ones close)
/// and the future resolves once every connection has ended. Bound the wait
/// with a timeout for a grace period. Responses may carry any body (usually
/// [`Body`]; the proxy streams).
pub async fn serve<H, F, B>(listener: TcpListener, handler: Arc<H>, stop: Stop) -> std::io::Result<()>
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_with_hook(listener, handler, stop, None).await
}

/// As [`serve`], calling `on_connection` for every accepted connection and
/// holding what it returns until the connection ends.
pub async fn serve_with_hook<H, F, B>(
    listener: TcpListener,
    handler: Arc<H>,
    stop: Stop,
    on_connection: Option<ConnectionHook>,
) -> std::io::Result<()>
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_with_options(listener, handler, stop, on_connection, ServeOptions::default()).await
}

/// While full with no connection to displace (all busy in their handlers),
/// how often the accept loop looks again for one that has since stalled.
const EVICTION_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Limits of a listener ([`serve_with_options`]); the default sets none.
/// Every limit that bounds a client is enforced whatever the handler does;
/// see [`guard`] for how and why each is shaped as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServeOptions {
    /// A connection that has not sent a request's whole header this long
    /// after it began waiting for one is closed: slow clients, and (hyper
    /// starts the same clock while a kept-alive connection waits for its
    /// next request) idle keep-alive connections.
    pub header_read_timeout: Option<std::time::Duration>,
    /// A request's body must arrive within this long of its head; a read
    /// still waiting past it fails and the connection is closed.
    pub body_read_timeout: Option<std::time::Duration>,
    /// A response write the client takes no bytes of for this long fails
    /// and the connection is closed (slow readers).
    pub write_timeout: Option<std::time::Duration>,
    /// At most this many connections open at once. When full, a new
    /// connection displaces the one that has waited on its client longest
    /// (for a head, a body, or to take its answer), which is closed; one
    /// whose handler works is never displaced, and if all are working the
    /// new one waits for a slot. Slow clients cannot lock a fresh one out.
    pub max_connections: Option<usize>,
    /// At most this many connections open at once from one IP address; one
    /// more is closed as soon as it is accepted.
    pub max_connections_per_client: Option<usize>,
    /// Put the client's [`PeerAddr`] in every request's extensions. Off
    /// unless asked: the extension map is three allocations per request.
    pub peer_addr: bool,
}

/// As [`serve_with_hook`], within `options`' limits.
pub async fn serve_with_options<H, F, B>(
    listener: TcpListener,
    handler: Arc<H>,
    stop: Stop,
    on_connection: Option<ConnectionHook>,
    options: ServeOptions,
) -> std::io::Result<()>
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_with_front(listener, handler, stop, on_connection, options, Front::default()).await
}

/// As [`serve_with_options`], speaking what `front` adds to plain HTTP/1.1
/// (TLS, HTTP/2; see [`conn`]). A TLS handshake or an HTTP/2 preface counts
/// against the same limits as a request head: the connection holds its
/// slot under both caps from the moment it is accepted.
pub async fn serve_with_front<H, F, B>(
    listener: TcpListener,
    handler: Arc<H>,
    stop: Stop,
    on_connection: Option<ConnectionHook>,
    options: ServeOptions,
    front: Front,
) -> std::io::Result<()>
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Plain HTTP/1.1 connections take the path they always took.
    let front = (!front.is_plain()).then(|| Arc::new(front));
    let mut watcher = stop.watcher();
    let slots = options.max_connections.map(|max| Arc::new(tokio::sync::Semaphore::new(max)));
    let registry = options.max_connections.map(|_| Arc::new(Registry::default()));
    let per_client = options.max_connections_per_client.map(PerClient::new);
    // Every connection task holds a sender: once ours is dropped, `recv`
    // returns `None` when the last connection has ended.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => accepted,
            _ = stopped(watcher.clone()) => {
                drop(listener);
                drop(open_tx);
                let _ = open_rx.recv().await;
                return Ok(());
            }
        };
        let client_slot = match &per_client {
            Some(per_client) => match per_client.admit(peer.ip()) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(%peer, "closing a connection beyond the per-client cap");
                    continue;
                }
            },
            None => None,
        };
        let slot = match (&slots, &registry) {
            (Some(slots), Some(registry)) => {
                let waited = async {
                    loop {
                        if let Ok(slot) = slots.clone().try_acquire_owned() {
                            return Slot::Held(slot);
                        }
                        // The displaced connection frees its slot as soon as
                        // its task has dropped it; the new one's task waits
                        // for that, not this loop, so accepting goes on.
                        if registry.evict_longest_stalled() {
                            return Slot::Freeing(slots.clone());
                        }
                        if let Ok(Ok(slot)) = tokio::time::timeout(EVICTION_RETRY, slots.clone().acquire_owned()).await
                        {
                            return Slot::Held(slot);
                        }
                    }
                };
                tokio::select! {
                    slot = waited => Some(slot),
                    _ = stopped(watcher.clone()) => {
                        drop(listener);
                        drop(open_tx);
                        let _ = open_rx.recv().await;
                        return Ok(());
                    }
                }
            }
            _ => None,
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::new(ConnState::new());
        let held = Held {
            _hook: on_connection.as_ref().map(|hook| hook()),
            slot,
            _client: client_slot,
            _registered: registry.as_ref().map(|registry| registry.enter(state.clone())),
            _open: open_tx.clone(),
        };
        let io = GuardedIo::new(stream, state.clone(), options.body_read_timeout, options.write_timeout);
        // The stop signal and the header-read timer are watched by a task
        // of their own, which wakes the connection's only when one fires:
        // polled beside the connection, they cost about 400 instructions
        // per request (a select polls every branch on every wake).
        let (close_tx, close) = tokio::sync::oneshot::channel();
        tokio::spawn(watch_for_close(close_tx, watcher.clone(), state.clone(), options.header_read_timeout));
        let conn = Conn { handler: handler.clone(), state, peer, options, close, held };
        // The plain connection's task is `serve_http1` itself: no outer
        // future to pass every wake through.
        match &front {
            None => drop(tokio::spawn(serve_http1(io, conn))),
            Some(front) => drop(tokio::spawn(serve_front(front.clone(), io, conn))),
        }
        let _ = watcher.borrow_and_update();
    }
}

/// The path every tier answers `200 alive` on (its admin listener).
pub const HEALTHZ_PATH: &str = "/healthz";
/// The path every tier answers readiness on: 200 once it can serve, 503
/// with the failed checks before.
pub const READYZ_PATH: &str = "/readyz";

/// `/healthz`'s answer: the process runs and its listener accepts.
pub fn alive() -> Response<Body> {
    text(StatusCode::OK, "alive\n")
}

/// `/readyz`'s answer from named checks: 200 `ready` if every one passed,
/// else 503 listing each failure on a line of its own.
pub fn readiness(checks: &[(&str, Result<(), String>)]) -> Response<Body> {
    let failures: Vec<String> = checks
        .iter()
        .filter_map(|(name, outcome)| outcome.as_ref().err().map(|why| format!("{name}: {why}\n")))
        .collect();
    if failures.is_empty() {
        text(StatusCode::OK, "ready\n")
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready\n{}", failures.concat()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;

    type Client = hyper::client::conn::http1::SendRequest<Body>;

    /// A client connection to `addr` and the task driving it (it ends when
    /// the server closes the connection).
    async fn connect(addr: std::net::SocketAddr) -> (Client, tokio::task::JoinHandle<hyper::Result<()>>) {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        (sender, tokio::spawn(connection))
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).header("host", "x").body(Body::default()).unwrap()
    }

    /// The header-read timeout counts only while a connection waits for a
    /// head: an answer that takes longer than the timeout is delivered
    /// whole, and the connection is closed once it has then waited the
    /// timeout for the next head.
    #[tokio::test]
    async fn a_slow_answer_is_not_cut_and_the_wait_after_it_is() {
        let timeout = std::time::Duration::from_millis(200);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler = Arc::new(move |_request: Request<RequestBody>| async move {
            tokio::time::sleep(timeout * 3).await;
            text(StatusCode::OK, "slow")
        });
        let stop = Stop::new();
        let options = ServeOptions { header_read_timeout: Some(timeout), ..ServeOptions::default() };
        let server = tokio::spawn(serve_with_options(listener, handler, stop.clone(), None, options));
        let (mut sender, driver) = connect(addr).await;
        let response = sender.send_request(get("/")).await.unwrap();
        assert_eq!(collect_limited(response.into_body(), 1024).await.unwrap(), "slow");
        let answered = tokio::time::Instant::now();
        // The server closes the idle connection: the client's driver ends.
        tokio::time::timeout(std::time::Duration::from_secs(20), driver).await.unwrap().unwrap().unwrap();
        assert!(answered.elapsed() >= timeout * 9 / 10, "closed {:?} after the answer", answered.elapsed());
        stop.stop();
        server.await.unwrap().unwrap();
    }

    /// A stop ends a kept-alive connection (without a header-read timeout
    /// to do it), a request in progress is answered whole first, and the
    /// server returns once its connections have ended.
    #[tokio::test]
    async fn a_stop_closes_kept_alive_connections_after_their_answers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
        let release = Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        let handler = Arc::new(move |request: Request<RequestBody>| {
            let (entered_tx, held) = (entered_tx.clone(), held.clone());
            async move {
                if request.uri().path() == "/held" {
                    let _ = entered_tx.send(());
                    held.notified().await;
                }
                text(StatusCode::OK, "answered")
            }
        });
        let stop = Stop::new();
        let server = tokio::spawn(serve_with_options(listener, handler, stop.clone(), None, ServeOptions::default()));
        // One connection idle after an answer, one with a request in progress.
        let (mut idle, idle_driver) = connect(addr).await;
        let response = idle.send_request(get("/")).await.unwrap();
        assert_eq!(collect_limited(response.into_body(), 1024).await.unwrap(), "answered");
        let (mut busy, busy_driver) = connect(addr).await;
        let in_progress = tokio::spawn(busy.send_request(get("/held")));
        entered.recv().await.unwrap();
        stop.stop();
        let bound = std::time::Duration::from_secs(20);
        tokio::time::timeout(bound, idle_driver).await.expect("the idle connection is closed").unwrap().unwrap();
        release.notify_one();
        let response = in_progress.await.unwrap().unwrap();
        assert_eq!(collect_limited(response.into_body(), 1024).await.unwrap(), "answered");
        tokio::time::timeout(bound, busy_driver).await.expect("the busy one is closed after").unwrap().unwrap();
        tokio::time::timeout(bound, server).await.expect("the server returns").unwrap().unwrap();
    }

    /// The client's address reaches the handler only when asked for.
    #[tokio::test]
    async fn the_peer_address_is_in_the_extensions_only_when_asked() {
        for asked in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let handler = Arc::new(|request: Request<RequestBody>| async move {
                let peer = request.extensions().get::<PeerAddr>().map(|p| p.0.ip().to_string());
                text(StatusCode::OK, peer.unwrap_or_else(|| "none".into()))
            });
            let stop = Stop::new();
            let options = ServeOptions { peer_addr: asked, ..ServeOptions::default() };
            let server = tokio::spawn(serve_with_options(listener, handler, stop.clone(), None, options));
            let (mut sender, driver) = connect(addr).await;
            let response = sender.send_request(get("/")).await.unwrap();
            let body = collect_limited(response.into_body(), 1024).await.unwrap();
            assert_eq!(body, if asked { "127.0.0.1" } else { "none" });
            drop(sender);
            let _ = driver.await;
            stop.stop();
            server.await.unwrap().unwrap();
        }
    }
}
