//! HTTP/1.1 plumbing shared by the tiers (application server, proxy): the
//! accept loop with graceful stop, the response body type, and small
//! responses. No tier logic lives here. [`guard`]: the slow-client limits
//! every listener enforces, [`args`] their flags. [`service`]: how every tier process
//! stops (signals, `--stop-on-stdin-eof`, the grace period) and announces
//! that it is ready. [`observe`]: `/metrics`, `/healthz` and `/readyz` for
//! every long-running command.

pub mod args;
pub mod guard;
pub mod observe;
pub mod service;

pub use args::{
    HttpLimitsArgs, BODY_READ_TIMEOUT_DEFAULT, HEADER_READ_TIMEOUT_DEFAULT, MAX_CONNECTIONS_DEFAULT,
    WRITE_TIMEOUT_DEFAULT,
};
pub use guard::RequestBody;
use guard::{ConnState, GuardedIo, PerClient, Registry};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
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

async fn stopped(mut watcher: watch::Receiver<bool>) {
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
        let handler = handler.clone();
        let conn_stop = watcher.clone();
        let held = on_connection.as_ref().map(|hook| hook());
        let open = open_tx.clone();
        let state = Arc::new(ConnState::new());
        let registered = registry.as_ref().map(|registry| registry.enter(state.clone()));
        tokio::spawn(async move {
            let slot = match slot {
                Some(Slot::Held(slot)) => Some(slot),
                Some(Slot::Freeing(slots)) => slots.acquire_owned().await.ok(),
                None => None,
            };
            let _held_while_connected = (held, slot, client_slot, registered);
            let _open = open;
            let on_request = state.clone();
            let body_deadline = options.body_read_timeout.is_some();
            // Without a header timeout or a registry to read it, the end of
            // an answer is not marked (no clock read per request).
            let mark_answers = options.header_read_timeout.is_some() || options.max_connections.is_some();
            let service = service_fn(move |request: Request<Incoming>| {
                let timed = body_deadline && !hyper::body::Body::is_end_stream(request.body());
                let since = on_request.head_arrived(timed);
                let unfinished = timed.then(|| (on_request.clone(), since));
                let mut request = request.map(|body| RequestBody::new(body, unfinished));
                if options.peer_addr {
                    request.extensions_mut().insert(PeerAddr(peer));
                }
                let response = handler(request);
                let on_done = mark_answers.then(|| on_request.clone());
                async move {
                    // The connection waits for its next head once this
                    // response's body is done with (or dropped).
                    let response = response.await.map(|body| AnswerBody { body, waiting: on_done });
                    Ok::<_, Infallible>(response)
                }
            });
            let mut builder = http1::Builder::new();
            builder.keep_alive(true);
            let io = GuardedIo::new(stream, state.clone(), options.body_read_timeout, options.write_timeout);
            let connection = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            // The stop signal and the header-read timer are watched by a task
            // of their own, which wakes this one only when one fires: polled
            // beside the connection, they cost about 400 instructions per
            // request (a select polls every branch on every wake).
            let (close_tx, close_rx) = tokio::sync::oneshot::channel();
            tokio::spawn(watch_for_close(close_tx, conn_stop, state, options.header_read_timeout));
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }
                // (A watcher gone without a word leaves the connection served.)
                Ok(close) = close_rx => match close {
                    Close::Stop => {
                        connection.as_mut().graceful_shutdown();
                        let _ = connection.await;
                    }
                    Close::HeadTimeout => {
                        tracing::debug!("closing a connection that sent no whole request head in time");
                    }
                    Close::Evicted => {
                        tracing::debug!("closing the longest-stalled connection to make room for a new one");
                    }
                },
            }
        });
        let _ = watcher.borrow_and_update();
    }
}

/// A new connection's place under the connection limit.
enum Slot {
    Held(tokio::sync::OwnedSemaphorePermit),
    /// A displaced connection is closing; its slot comes once it has.
    Freeing(Arc<tokio::sync::Semaphore>),
}

/// Returns once the connection has waited `timeout` for a request head
/// (never without a timeout). Sleeps until the earliest moment that could
/// be, and looks again: one timer per connection re-armed when it fires,
/// not a timer per request (hyper's own costs an allocation, a timer-wheel
/// entry and a second read of every head).
async fn head_read_timeout(waiting: &ConnState, timeout: Option<std::time::Duration>) {
    let Some(timeout) = timeout else { return std::future::pending().await };
    let sleep = tokio::time::sleep(timeout);
    tokio::pin!(sleep);
    loop {
        sleep.as_mut().await;
        let now = tokio::time::Instant::now();
        match waiting.waiting_for_head_since() {
            Some(since) if now >= since + timeout => return,
            Some(since) => sleep.as_mut().reset(since + timeout),
            // Answering: the next wait starts later than now.
            None => sleep.as_mut().reset(now + timeout),
        }
    }
}

/// Why a connection's watcher ([`watch_for_close`]) ends it.
enum Close {
    /// The server stops: finish the request in progress, then close.
    Stop,
    /// No whole request head within the header-read timeout: close now.
    HeadTimeout,
    /// The listener is full and this connection stalled longest: close now.
    Evicted,
}

/// Tells its connection (through `close`) when the server stops, the
/// connection has waited the header-read timeout for a head, or the
/// registry displaces it; ends without a word once the connection has ended.
async fn watch_for_close(
    mut close: tokio::sync::oneshot::Sender<Close>,
    stop: watch::Receiver<bool>,
    state: Arc<ConnState>,
    timeout: Option<std::time::Duration>,
) {
    let why = tokio::select! {
        _ = stopped(stop) => Close::Stop,
        _ = head_read_timeout(&state, timeout) => Close::HeadTimeout,
        _ = state.evict.notified() => Close::Evicted,
        _ = close.closed() => return,
    };
    let _ = close.send(why);
}

/// A response body that, once done with, marks its connection as waiting
/// for the next request head.
struct AnswerBody<B> {
    body: B,
    waiting: Option<Arc<ConnState>>,
}

impl<B> AnswerBody<B> {
    fn done(&mut self) {
        if let Some(waiting) = self.waiting.take() {
            waiting.answered();
        }
    }
}

impl<B> Drop for AnswerBody<B> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for AnswerBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
